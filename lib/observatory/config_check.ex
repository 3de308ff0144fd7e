defmodule Observatory.ConfigCheck do
  @moduledoc false
  # Start-up checks shared by the `config :observatory, name` keyword lists of the
  # features (budgets, notifications): each raises an `ArgumentError` that names the
  # setting and shows the bad value.

  @doc """
  `config :observatory, name` (`[]` when unset). Raises unless it is a keyword list
  whose keys are all in `allowed`.
  """
  @spec keyword!(atom(), [atom()]) :: keyword()
  def keyword!(name, allowed) do
    config = Application.get_env(:observatory, name) || []

    unless Keyword.keyword?(config) do
      raise ArgumentError,
            "expected config :observatory, #{inspect(name)} to be a keyword list, got: #{inspect(config)}"
    end

    for {key, _} <- config, key not in allowed do
      raise ArgumentError,
            "unknown key #{inspect(key)} in config :observatory, #{inspect(name)} (use #{inspect(allowed)})"
    end

    config
  end

  @doc "Raises unless each of `keys` that `config` sets is a positive integer."
  @spec positive_integers!(keyword(), atom(), [atom()]) :: :ok
  def positive_integers!(config, name, keys) do
    for key <- keys,
        value = config[key],
        not (is_integer(value) and value > 0) do
      raise ArgumentError,
            "expected config :observatory, #{inspect(name)}, #{inspect(key)} to be a positive integer, got: #{inspect(value)}"
    end

    :ok
  end
end
