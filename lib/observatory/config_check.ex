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
    # A key set to nil is set: it replaces the default (`Keyword.merge/2`,
    # `Keyword.get/3`). (A `value = config[key]` filter here skipped nil and false.)
    for {key, value} <- config,
        key in keys,
        not (is_integer(value) and value > 0) do
      raise ArgumentError,
            "expected config :observatory, #{inspect(name)}, #{inspect(key)} to be a positive integer, got: #{inspect(value)}"
    end

    :ok
  end

  @doc """
  Checks the settings a host sets most (see `docs/phoenix.md`) at start: a value of
  the wrong kind raises an `ArgumentError` that names it, instead of a crash deep in a
  process later (or, worse, being taken for the default without a word).
  """
  @spec settings!() :: :ok
  def settings! do
    boolean!(:storage)
    operator_tokens!()
    positive_integer!(:max_body_bytes)
    positive_integer!(:dashboard_refresh_ms)

    throttle = keyword!(:auth_throttle, [:max_failures, :window_s, :lockout_s, :max_clients])
    positive_integers!(throttle, :auth_throttle, Keyword.keys(throttle))

    keyword!(:loop_verdict, Keyword.keys(Observatory.Gateway.LoopVerdict.defaults()))
    :ok
  end

  defp boolean!(key) do
    case Application.get_env(:observatory, key) do
      value when value in [nil, true, false] ->
        :ok

      value ->
        raise ArgumentError,
              "expected config :observatory, #{inspect(key)} to be true or false, got: #{inspect(value)}"
    end
  end

  defp positive_integer!(key) do
    case Application.get_env(:observatory, key) do
      nil ->
        :ok

      value when is_integer(value) and value > 0 ->
        :ok

      value ->
        raise ArgumentError,
              "expected config :observatory, #{inspect(key)} to be a positive integer, got: #{inspect(value)}"
    end
  end

  defp operator_tokens! do
    tokens = Application.get_env(:observatory, :operator_tokens) || %{}

    valid? =
      is_map(tokens) and
        Enum.all?(tokens, fn {token, name} -> non_empty?(token) and non_empty?(name) end)

    unless valid? do
      raise ArgumentError,
            "expected config :observatory, :operator_tokens to be a map of token => operator name " <>
              "(non-empty strings), e.g. %{\"<a long random token>\" => \"ops\"}, " <>
              "got: #{inspect(redact(tokens))}"
    end

    :ok
  end

  defp non_empty?(value), do: is_binary(value) and value != ""

  # A token is a secret: never in a log line.
  defp redact(tokens) when is_map(tokens),
    do: Map.new(tokens, fn {token, name} -> {redact_one(token), name} end)

  defp redact(tokens) when is_list(tokens), do: Enum.map(tokens, &redact_one/1)
  defp redact(other), do: redact_one(other)

  defp redact_one(value) when is_binary(value) and value != "", do: "<redacted>"
  defp redact_one(value), do: value
end
