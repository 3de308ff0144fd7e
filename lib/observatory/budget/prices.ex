defmodule Observatory.Budget.Prices do
  @moduledoc """
  The price table the proxy costs each answer with: USD per million tokens, per model.

      config :observatory, :budgets,
        prices: %{
          "gpt-4.1" => %{input: 2.00, cached_input: 0.50, output: 8.00},
          "claude-sonnet-4" => %{input: 3.00, cached_input: 0.30, cache_write: 3.75, output: 15.00}
        },
        # other names for a priced model: an Azure deployment, a router's name
        aliases: %{"prod-gpt" => "gpt-4.1"}

  `input` and `output` are required; `cached_input` (tokens read from the provider's
  prompt cache) and `cache_write` (Anthropic's cache creation) default to `input`.

  The table can also come from a JSON file (`prices_file:`, or
  `OBSERVATORY_PRICES_FILE`), `{"gpt-4.1": {"input": 2.0, "output": 8.0}}`, read when
  the configuration changes; its entries and the configured `prices` are merged, the
  configured ones winning.

  **Which entry prices a model.** The model the answer names (else the request's):
  its exact name, or an alias; else a priced name followed only by a date or version
  suffix — `gpt-4.1-2025-04-14`, `claude-sonnet-4-20250514`, `…-latest`,
  `claude-3-5-sonnet@20240620` — so dated snapshots need no entry of their own. Nothing
  else matches: `gpt-4.1-mini` is not `gpt-4.1` (it costs a fifth of it), so it has no
  price until it has its own entry. An unpriced answer's tokens are counted; its cost
  is not (`cost/2` returns nil) and the budget says so.

  `check!/1` runs when the application starts and raises `ArgumentError` naming the
  bad entry: a price that is not a non-negative number, an unknown key, an alias to a
  model the table does not price.
  """

  @price_keys [:input, :output, :cached_input, :cache_write]
  @required [:input, :output]
  @suffix ~r/\A(-\d{4}-\d{2}-\d{2}|-\d{8}|-latest|@[\w.-]+)\z/

  @typedoc "Prices in nano-USD per token (1 USD per million tokens is 1000)."
  @type price :: %{
          input: non_neg_integer(),
          output: non_neg_integer(),
          cached_input: non_neg_integer(),
          cache_write: non_neg_integer()
        }

  @doc "The configured table, checked: model name → prices in nano-USD per token."
  @spec table() :: %{String.t() => price()}
  def table do
    config = config()

    Observatory.DerivedSetting.get({__MODULE__, :table}, config, fn config ->
      # check!/0 refused a bad table at start; one set later prices nothing.
      try do
        build!(config)
      rescue
        ArgumentError -> %{}
      end
    end)
  end

  @doc "Whether any model has a price (a cost limit needs one)."
  @spec any?() :: boolean()
  def any?, do: table() != %{}

  @doc """
  The price of `model`, or nil (see the module doc for how names match).

      # prices: %{"gpt-4.1" => %{input: 2, output: 8}}
      Prices.price("gpt-4.1-2025-04-14").output  #=> 8000 (nano-USD per token)
      Prices.price("gpt-4.1-mini")               #=> nil
  """
  @spec price(String.t() | nil) :: price() | nil
  def price(nil), do: nil

  def price(model) when is_binary(model) do
    table = table()

    Map.get(table, model) ||
      Enum.find_value(table, fn {name, price} ->
        if String.starts_with?(model, name) and
             Regex.match?(
               @suffix,
               binary_part(model, byte_size(name), byte_size(model) - byte_size(name))
             ),
           do: price
      end)
  end

  @doc """
  The cost in nano-USD of `usage` (`Observatory.Budget.Usage`) at `model`'s price, or
  nil when the model has no price.
  """
  @spec cost(String.t() | nil, Observatory.Budget.Usage.t()) :: non_neg_integer() | nil
  def cost(model, usage) do
    case price(model) do
      nil ->
        nil

      p ->
        fresh = max(usage.input - usage.cached - usage.cache_write, 0)

        fresh * p.input + usage.cached * p.cached_input + usage.cache_write * p.cache_write +
          usage.output * p.output
    end
  end

  @doc "Raises `ArgumentError` when the configured table or aliases are not valid."
  @spec check!() :: :ok
  def check! do
    _ = build!(config())
    :ok
  end

  defp config do
    budgets = Observatory.Budget.config()

    {Keyword.get(budgets, :prices, %{}), Keyword.get(budgets, :aliases, %{}),
     Keyword.get(budgets, :prices_file)}
  end

  defp build!({prices, aliases, nil}), do: build!({prices, aliases})

  defp build!({prices, aliases, file}) when is_binary(file) do
    from_file =
      with {:ok, text} <- File.read(file),
           {:ok, %{} = table} <- Observatory.JSON.decode(text) do
        table
      else
        {:error, reason} when is_atom(reason) ->
          raise ArgumentError,
                "config :observatory, :budgets, :prices_file #{file}: #{:file.format_error(reason)}"

        _ ->
          raise ArgumentError,
                "config :observatory, :budgets, :prices_file #{file} must be a JSON object: " <>
                  ~s(model => {"input": usd_per_mtok, "output": usd_per_mtok})
      end

    build!({Map.merge(from_file, prices || %{}), aliases})
  end

  defp build!({_prices, _aliases, file}),
    do:
      raise(
        ArgumentError,
        "expected config :observatory, :budgets, :prices_file to be a path, got: #{inspect(file)}"
      )

  defp build!({prices, aliases}) do
    unless is_map(prices) do
      raise ArgumentError,
            "expected config :observatory, :budgets, :prices to be a map of model name => " <>
              "%{input: usd_per_mtok, output: usd_per_mtok}, got: #{inspect(prices)}"
    end

    unless is_map(aliases) do
      raise ArgumentError,
            "expected config :observatory, :budgets, :aliases to be a map of name => priced model, " <>
              "got: #{inspect(aliases)}"
    end

    table = Map.new(prices, fn {model, entry} -> {model_name!(model), entry!(model, entry)} end)

    aliased =
      Map.new(aliases, fn {name, target} ->
        target = model_name!(target)

        case Map.fetch(table, target) do
          {:ok, price} ->
            {model_name!(name), price}

          :error ->
            raise ArgumentError,
                  "config :observatory, :budgets, :aliases maps #{inspect(name)} to " <>
                    "#{inspect(target)}, a model the price table does not have " <>
                    "(priced: #{table |> Map.keys() |> Enum.sort() |> inspect()})"
        end
      end)

    Map.merge(aliased, table)
  end

  defp model_name!(name) when is_binary(name) and byte_size(name) in 1..256, do: name

  defp model_name!(name) when is_atom(name) and name not in [nil, true, false],
    do: Atom.to_string(name)

  defp model_name!(name),
    do:
      raise(
        ArgumentError,
        "a model name in config :observatory, :budgets must be a string of 1 to 256 bytes, " <>
          "got: #{inspect(name)}"
      )

  defp entry!(model, entry) when is_map(entry) or is_list(entry) do
    entry = Map.new(entry, fn {key, value} -> {key!(model, key), value} end)

    for key <- @required, not Map.has_key?(entry, key) do
      raise ArgumentError,
            "the price of #{inspect(model)} in config :observatory, :budgets, :prices has no " <>
              "#{inspect(key)} (USD per million tokens)"
    end

    for {key, value} <- entry, not (is_number(value) and value >= 0) do
      raise ArgumentError,
            "the #{key} price of #{inspect(model)} in config :observatory, :budgets, :prices " <>
              "must be a number >= 0 (USD per million tokens), got: #{inspect(value)}"
    end

    nano = fn key -> round(Map.get(entry, key, entry.input) * 1000) end

    %{
      input: nano.(:input),
      output: nano.(:output),
      cached_input: nano.(:cached_input),
      cache_write: nano.(:cache_write)
    }
  end

  defp entry!(model, entry),
    do:
      raise(
        ArgumentError,
        "the price of #{inspect(model)} in config :observatory, :budgets, :prices must be a map " <>
          "like %{input: 2.0, output: 8.0}, got: #{inspect(entry)}"
      )

  defp key!(model, key) do
    name = to_string(key)

    case Enum.find(@price_keys, &(Atom.to_string(&1) == name)) do
      nil ->
        raise ArgumentError,
              "unknown key #{inspect(key)} in the price of #{inspect(model)} " <>
                "(config :observatory, :budgets, :prices): use #{inspect(@price_keys)}"

      key ->
        key
    end
  end
end
