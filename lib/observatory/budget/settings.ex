defmodule Observatory.Budget.Settings do
  @moduledoc """
  An agent's budget: its limits and what happens past them, as an operator sends them
  (`PUT /api/v1/agents/:id/budget`) or as the defaults for new agents are configured
  (`config :observatory, :budgets, defaults: [...]`).

  | key | type | meaning |
  |---|---|---|
  | `mode` | `"enforce"`, `"warn"` or `"shadow"` | past a limit: refuse the next request (`enforce`); let it through and alert (`warn`); let it through and only record that it would have been refused (`shadow`) |
  | `session_requests` | integer ≥ 0 or null | requests per session |
  | `session_tokens` | integer ≥ 0 or null | input + output tokens per session |
  | `session_cost_usd` | number ≥ 0 or null | cost per session (needs a price table) |
  | `window_seconds` | integer, #{60}..#{30 * 86_400} | the rolling window of the `window_*` limits |
  | `window_requests` | integer ≥ 0 or null | the agent's requests within the window, all sessions |
  | `window_tokens` | integer ≥ 0 or null | the agent's tokens within the window |
  | `window_cost_usd` | number ≥ 0 or null | the agent's cost within the window (needs a price table) |

  `null` is no limit. Every key is optional (a partial update); an unknown key is
  refused, and so is a cost limit while no model has a price
  (`Observatory.Budget.Prices`): it could never be enforced.

      iex> Observatory.Budget.Settings.validate(%{"session_tokens" => 200_000, "mode" => "shadow"})
      {:ok, %{session_tokens: 200_000, mode: :shadow}}
      iex> Observatory.Budget.Settings.validate(%{"session_tokens" => -1})
      {:error, [%{path: "session_tokens", reason: "must be an integer >= 0 or null, got: -1"}]}
  """

  alias Observatory.Budget.Prices

  @modes %{"enforce" => :enforce, "warn" => :warn, "shadow" => :shadow}
  @counts [:session_requests, :session_tokens, :window_requests, :window_tokens]
  @costs [:session_cost_usd, :window_cost_usd]
  @window_seconds 60..(30 * 86_400)
  @fields Map.new([:mode, :window_seconds] ++ @counts ++ @costs, &{Atom.to_string(&1), &1})

  @type mode :: :enforce | :warn | :shadow
  @type t :: %{
          mode: mode(),
          session_requests: non_neg_integer() | nil,
          session_tokens: non_neg_integer() | nil,
          session_cost_usd: number() | nil,
          window_seconds: pos_integer(),
          window_requests: non_neg_integer() | nil,
          window_tokens: non_neg_integer() | nil,
          window_cost_usd: number() | nil
        }
  @type violation :: %{path: String.t(), reason: String.t()}

  @doc "The limit keys: session ones, then window ones."
  @spec limits() :: [atom()]
  def limits,
    do: [
      :session_requests,
      :session_tokens,
      :session_cost_usd,
      :window_requests,
      :window_tokens,
      :window_cost_usd
    ]

  @doc "A budget with no limit, in enforce mode, over a one-hour window."
  @spec unlimited() :: t()
  def unlimited do
    %{
      mode: :enforce,
      session_requests: nil,
      session_tokens: nil,
      session_cost_usd: nil,
      window_seconds: 3600,
      window_requests: nil,
      window_tokens: nil,
      window_cost_usd: nil
    }
  end

  @doc "The defaults for new agents: `config :observatory, :budgets, :defaults` over `unlimited/0`."
  @spec defaults() :: t()
  def defaults do
    case validate(configured_defaults()) do
      {:ok, changes} -> Map.merge(unlimited(), changes)
      {:error, _} -> unlimited()
    end
  end

  @doc "Raises `ArgumentError` naming every bad value of the configured defaults."
  @spec check_config!() :: :ok
  def check_config! do
    case validate(configured_defaults()) do
      {:ok, _} ->
        :ok

      {:error, violations} ->
        raise ArgumentError,
              "config :observatory, :budgets, :defaults: " <>
                Enum.map_join(violations, "; ", &"#{&1.path} #{&1.reason}")
    end
  end

  defp configured_defaults do
    case Keyword.get(Observatory.Budget.config(), :defaults, []) do
      list when is_list(list) -> Map.new(list)
      map when is_map(map) -> map
      other -> %{"defaults" => other}
    end
  end

  @doc "Checks `params`; returns the changes with atom keys, or every violation."
  @spec validate(map()) :: {:ok, map()} | {:error, [violation()]}
  def validate(params),
    do: Observatory.Settings.validate(params, @fields, "is not a budget setting", &check/2)

  defp check(:mode, mode) when is_atom(mode) and mode != nil,
    do: check(:mode, Atom.to_string(mode))

  defp check(:mode, mode) do
    case Map.fetch(@modes, mode) do
      {:ok, mode} -> {:ok, mode}
      :error -> {:error, "must be enforce, warn or shadow, got: #{inspect(mode)}"}
    end
  end

  defp check(:window_seconds, n) when is_integer(n) and n in @window_seconds, do: {:ok, n}

  defp check(:window_seconds, n),
    do:
      {:error,
       "must be an integer from #{@window_seconds.first} to #{@window_seconds.last}, got: #{inspect(n)}"}

  defp check(field, nil) when field in @counts or field in @costs, do: {:ok, nil}
  defp check(field, n) when field in @counts and is_integer(n) and n >= 0, do: {:ok, n}

  defp check(field, n) when field in @counts,
    do: {:error, "must be an integer >= 0 or null, got: #{inspect(n)}"}

  defp check(field, n) when field in @costs and is_number(n) and n >= 0 do
    if Prices.any?(),
      do: {:ok, n},
      else:
        {:error,
         "needs prices: no model has one (config :observatory, :budgets, :prices), so a cost " <>
           "limit could never be enforced"}
  end

  defp check(field, n) when field in @costs,
    do: {:error, "must be a number >= 0 (USD) or null, got: #{inspect(n)}"}
end
