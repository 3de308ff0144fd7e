defmodule Observatory.Replay.WouldTrip do
  @moduledoc """
  What the kill switch and the budgets would have done to recorded proxy traffic: the
  `mix observatory.replay` report's shadow run.

  Every recorded LLM request (`Observatory.Replay.ProxyRequest`), in input order, is
  fingerprinted and scored in a kill-switch window of its agent (a store of the
  replay's own: the gateway's windows are not touched) and checked against the budget
  limits, as the proxy would check it: per session and per agent within a rolling
  window of `window_seconds` (by the requests' `timestamp`s; without timestamps every
  request falls in one window). Its answer's text goes into the window, its usage is
  counted and costed at the configured prices.

  Each mechanism is judged alone, in `enforce` mode: the first request its agent's
  score exceeds the threshold at is where the kill switch would have stopped the agent,
  and that request and every later one of the agent would have been refused; the first
  request of a session (or of an agent's window) past a budget limit is where the
  budget would have stopped it, and that request and the later ones of the session
  (of the agent) would have been refused. What those requests cost is what the stop
  would have saved.
  """

  alias Observatory.{Budget, JSON, KillSwitch}
  alias Observatory.Budget.{Prices, Usage}
  alias Observatory.KillSwitch.Windows

  @windows Observatory.Replay.Windows

  @doc """
  A new run. `kill_switch`: `%{window_size, threshold}`; `budget`: limits as
  `Observatory.Budget.Settings` has them. Starts the replay's window store (linked).
  """
  @spec new(map(), map()) :: map()
  def new(kill_switch, budget) do
    unless Process.whereis(@windows), do: {:ok, _} = Windows.start_link(name: @windows)

    %{
      kill_switch: kill_switch,
      budget: budget,
      requests: 0,
      spent: zero(),
      agents: %{},
      sessions: %{},
      windows: %{},
      trips: %{},
      stops: %{}
    }
  end

  @doc "Stops the replay's window store."
  @spec stop(map()) :: :ok
  def stop(_state) do
    case Process.whereis(@windows) do
      nil -> :ok
      pid -> GenServer.stop(pid)
    end
  end

  @doc "Observes one recorded exchange (from `ProxyRequest.read/1`) at `line` of `source`."
  @spec observe(map(), map(), String.t(), pos_integer()) :: map()
  def observe(state, exchange, source, line) do
    agent = exchange.agent_id

    where = %{
      source: source,
      line: line,
      at: exchange.timestamp && DateTime.to_iso8601(exchange.timestamp)
    }

    agent_n = Map.get(state.agents, agent, 0) + 1
    state = %{state | requests: state.requests + 1, agents: Map.put(state.agents, agent, agent_n)}

    state = kill_switch(state, exchange, where, agent_n)
    state = budget(state, exchange, where)
    cost = cost(exchange)
    spend(state, exchange, cost)
  end

  ## The kill switch: the agent's window

  defp kill_switch(state, exchange, where, agent_n) do
    %{window_size: size, threshold: threshold} = state.kill_switch
    agent = exchange.agent_id

    state =
      case fingerprint(exchange) do
        {:ok, fp} ->
          {:ok, verdict} =
            Windows.observe_request(
              agent,
              fp.prompt_hash,
              fp.tool_signatures,
              size,
              threshold,
              @windows
            )

          if verdict.exceeded and not Map.has_key?(state.trips, agent) do
            trip =
              Map.merge(where, %{
                agent_id: agent,
                request: agent_n,
                score: verdict.score,
                signals: verdict.signals,
                saved: zero()
              })

            %{state | trips: Map.put(state.trips, agent, trip)}
          else
            state
          end

        :error ->
          state
      end

    case response_hash(exchange) do
      nil -> :ok
      hash -> Windows.observe_response(agent, hash, @windows)
    end

    state
  end

  defp fingerprint(%{api: api, request: request}) do
    body = JSON.encode!(request)

    case KillSwitch.fingerprint_request(body, api) do
      {:ok, fp} -> {:ok, fp}
      {:error, _} -> :error
    end
  end

  defp response_hash(%{response: %{} = response, api: api}) do
    body = JSON.encode!(response)

    case KillSwitch.fingerprint_response(body, api) do
      {:ok, hash} -> hash
      {:error, _} -> nil
    end
  end

  defp response_hash(%{response_text: text}) when is_binary(text) and text != "",
    do: KillSwitch.fingerprint(text)

  defp response_hash(_exchange), do: nil

  ## Budgets: the session's spend, the agent's window

  defp budget(state, exchange, where) do
    %{agent_id: agent, session_id: session} = exchange
    b = state.budget
    spent = Map.get(state.sessions, session, zero())
    window = window_spent(state, agent, exchange.timestamp)

    used = %{
      session_requests: spent.requests,
      session_tokens: spent.tokens,
      session_cost_usd: spent.cost,
      window_requests: window.requests,
      window_tokens: window.tokens,
      window_cost_usd: window.cost
    }

    Enum.reduce(Budget.Settings.limits(), state, fn limit, state ->
      max = b[limit]

      scope =
        if String.starts_with?(Atom.to_string(limit), "session"),
          do: {:session, session},
          else: {:window, agent}

      if max != nil and over?(limit, used[limit], max) and not Map.has_key?(state.stops, scope) do
        stop =
          Map.merge(where, %{
            scope: elem(scope, 0),
            agent_id: agent,
            session_id: if(elem(scope, 0) == :session, do: session),
            limit: limit,
            used: shown(limit, used[limit]),
            max: max,
            saved: zero()
          })

        %{state | stops: Map.put(state.stops, scope, stop)}
      else
        state
      end
    end)
  end

  defp over?(limit, used, max) when limit in [:session_cost_usd, :window_cost_usd],
    do: used >= round(max * 1.0e9)

  defp over?(_limit, used, max), do: used >= max

  defp shown(limit, used) when limit in [:session_cost_usd, :window_cost_usd], do: used / 1.0e9
  defp shown(_limit, used), do: used

  # The agent's requests within the window before `at` (all of them without a time).
  defp window_spent(state, agent, at) do
    cutoff = at && DateTime.to_unix(at, :millisecond) - state.budget.window_seconds * 1000

    state.windows
    |> Map.get(agent, [])
    |> Enum.filter(fn {ms, _} -> cutoff == nil or ms == nil or ms > cutoff end)
    |> Enum.reduce(zero(), fn {_, s}, acc -> add(acc, s) end)
  end

  ## What each request cost, and who would have saved it

  defp cost(exchange) do
    raw = exchange.usage || (exchange.response && exchange.response["usage"])
    model = (exchange.response && exchange.response["model"]) || exchange.request["model"]

    case Usage.read(exchange.api, raw) do
      nil ->
        %{requests: 1, tokens: 0, cost: 0}

      usage ->
        %{requests: 1, tokens: Usage.tokens(usage), cost: Prices.cost(model, usage) || 0}
    end
  end

  defp spend(state, exchange, cost) do
    %{agent_id: agent, session_id: session} = exchange
    at = exchange.timestamp && DateTime.to_unix(exchange.timestamp, :millisecond)

    trips =
      case state.trips do
        %{^agent => trip} -> Map.put(state.trips, agent, %{trip | saved: add(trip.saved, cost)})
        trips -> trips
      end

    stops =
      Enum.reduce([{:session, session}, {:window, agent}], state.stops, fn scope, stops ->
        case stops do
          %{^scope => stop} -> Map.put(stops, scope, %{stop | saved: add(stop.saved, cost)})
          stops -> stops
        end
      end)

    window = prune(Map.get(state.windows, agent, []), at, state.budget.window_seconds)

    %{
      state
      | spent: add(state.spent, cost),
        sessions: Map.update(state.sessions, session, cost, &add(&1, cost)),
        windows: Map.put(state.windows, agent, [{at, cost} | window]),
        trips: trips,
        stops: stops
    }
  end

  # Entries older than the window are no longer needed (kept all without times).
  defp prune(entries, nil, _seconds), do: entries

  defp prune(entries, at, seconds),
    do: Enum.filter(entries, fn {ms, _} -> ms == nil or ms > at - seconds * 1000 end)

  defp zero, do: %{requests: 0, tokens: 0, cost: 0}

  defp add(a, b),
    do: %{requests: a.requests + b.requests, tokens: a.tokens + b.tokens, cost: a.cost + b.cost}

  ## The report

  @doc "The report's `would_trip` section."
  @spec report(map()) :: map()
  def report(state) do
    trips =
      state.trips |> Map.values() |> Enum.sort_by(&{&1.source, &1.line}) |> Enum.map(&money/1)

    stops =
      state.stops |> Map.values() |> Enum.sort_by(&{&1.source, &1.line}) |> Enum.map(&money/1)

    saved = fn list ->
      list
      |> Enum.map(& &1.saved)
      |> Enum.reduce(%{requests: 0, tokens: 0, cost_usd: 0.0}, fn s, acc ->
        %{
          requests: acc.requests + s.requests,
          tokens: acc.tokens + s.tokens,
          cost_usd: acc.cost_usd + s.cost_usd
        }
      end)
    end

    %{
      requests: state.requests,
      agents: map_size(state.agents),
      spent: usd(state.spent),
      kill_switch:
        Map.merge(state.kill_switch, %{
          agents_stopped: length(trips),
          trips: trips,
          saved: saved.(trips)
        }),
      budgets: %{
        limits: Map.take(state.budget, [:window_seconds | Budget.Settings.limits()]),
        stops: stops,
        saved: saved.(stops)
      }
    }
  end

  defp money(entry), do: %{entry | saved: usd(entry.saved)}

  defp usd(spent),
    do: %{requests: spent.requests, tokens: spent.tokens, cost_usd: spent.cost / 1.0e9}
end
