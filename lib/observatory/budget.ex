defmodule Observatory.Budget do
  @moduledoc """
  What proxied agents spend, and limits on it: every request, every answer's input and
  output tokens (from its `usage`, streamed answers included: `Observatory.Budget.Usage`)
  and its cost at the configured prices (`Observatory.Budget.Prices`), counted per
  session and per agent (`Observatory.Budget.Store`).

  Each agent has durable limits (`Observatory.Budget.Settings`, on the agent's record
  like its kill-switch settings): requests, tokens and cost per session and within a
  rolling window. Before a proxied request goes upstream, `check/2` compares what was
  spent with the limits (`count_request/2` counts the request once it goes). Past one, in `enforce` mode the request is refused
  (`budget_exhausted`); in `warn` mode it goes through and the stop is alerted; in
  `shadow` mode it goes through and the stop is only recorded. A stop is recorded
  (a `"budget_exhausted"` or `"budget_would_exhaust"` agent event) and broadcast on
  `"gateway:kill_switch"` (the topic of agent events) once, when the scope goes past
  its limit, not on every refused request; when the scope is back under its limits
  (an operator raised them or reset the spend) a `"budget_recovered"` event is
  broadcast. The request that crosses a token or cost limit is served (its tokens are
  known only once it is answered): the next one is refused.

      config :observatory, :budgets,
        prices: %{"gpt-4.1" => %{input: 2.0, output: 8.0}},
        defaults: [session_tokens: 2_000_000, window_cost_usd: 50.0, window_seconds: 3600]

      {:ok, _agent} = Observatory.Budget.configure("agent-7", %{"session_cost_usd" => 5.0})
      Observatory.Budget.session_usage("sess-1")
      #=> %{requests: 12, input_tokens: 48_210, output_tokens: 2_004, tokens: 50_214,
      #     cost_usd: 0.112452, unpriced_answers: 0, since_loop: %{…} | nil, …}
      Observatory.Budget.reset("agent-7", session_id: "sess-1", operator: "alice")

  **Since the loop began.** The first loop alarm of a session (its alarm raised in
  `Observatory.Gateway.Alerts`, the gateway's list of alarmed sessions) marks what it
  had spent by then; `session_usage/1` reports the spend since.
  """

  require Logger

  alias Observatory.Budget.{Prices, Settings, Store, Usage}
  alias Observatory.ConfigCheck
  alias Observatory.Gateway.Events
  alias Observatory.KillSwitch
  alias Observatory.KillSwitch.Agents

  @config_keys [
    :prices,
    :prices_file,
    :aliases,
    :defaults,
    :stream_usage,
    :session_ttl_ms,
    :max_sessions,
    :sweep_interval_ms
  ]

  @type breach :: %{
          scope: :session | :window,
          limit: atom(),
          used: number(),
          max: number()
        }

  ## The request path

  @doc """
  Checks one request of `agent` (an agent record) in `session_id` against its budget.
  Returns `:ok`, `{:ok, breaches}` when limits are past but the mode lets it through
  (`warn`, `shadow`), or `{:refuse, breaches}` (`enforce`). A scope newly past a limit
  is recorded and broadcast; one back under its limits is broadcast as recovered.
  """
  @spec check(map(), String.t()) :: :ok | {:ok, [breach()]} | {:refuse, [breach()]}
  def check(agent, session_id) do
    budget = agent.budget
    breaches = breaches(agent.id, session_id, budget, now_s())
    stopped(agent, session_id, breaches)

    case {breaches, budget.mode} do
      {[], _} ->
        :ok

      {_, :enforce} ->
        Observatory.Metrics.inc(:budget_refusals)
        {:refuse, breaches}

      {_, _mode} ->
        {:ok, breaches}
    end
  end

  @doc "Counts one request sent upstream for `agent` in `session_id`."
  @spec count_request(map(), String.t()) :: :ok
  def count_request(agent, session_id),
    do: Store.count_request(agent.id, session_id, agent.budget.window_seconds, now_s())

  @doc """
  Counts an answer's `usage` (the API's raw object, or nil when it had none) for the
  request admitted earlier, costed at `model`'s price.
  """
  @spec record(
          map(),
          String.t(),
          :chat_completions | :responses | :messages,
          String.t() | nil,
          map() | nil
        ) ::
          :ok
  def record(_agent, _session_id, _api, _model, nil), do: :ok

  def record(agent, session_id, api, model, raw_usage) do
    case Usage.read(api, raw_usage) do
      nil ->
        :ok

      usage ->
        cost = Prices.cost(model, usage)
        if cost == nil and Prices.any?(), do: Observatory.Budget.Server.unpriced(model)
        Store.add_usage(agent.id, session_id, usage, cost, agent.budget.window_seconds, now_s())
    end
  end

  @doc """
  Marks the session's loop as begun now, unless it began before (see "Since the loop
  began" above); nothing for a session with no spend counted.
  """
  @spec loop_began(String.t()) :: :ok
  def loop_began(session_id) do
    meta = Store.session_meta(session_id)
    if meta != nil and meta.loop_at == nil, do: Store.mark_loop(session_id, DateTime.utc_now())
    :ok
  end

  @doc """
  The message of a refusal: what was spent against which limit, and what an operator
  does about it.
  """
  @spec refusal_message([breach()], String.t(), String.t()) :: String.t()
  def refusal_message([breach | _], agent_id, session_id) do
    where =
      case breach.scope do
        :session -> "session #{session_id}"
        :window -> "agent #{agent_id} (within its rolling window)"
      end

    "budget_exhausted: #{where} has used #{amount(breach.limit, breach.used)} of its " <>
      "#{amount(breach.limit, breach.max)} (#{breach.limit}); the request was not sent. " <>
      "An operator raises the limit (PUT /api/v1/agents/:id/budget) or resets what was " <>
      "spent (POST /api/v1/agents/:id/budget/reset)."
  end

  defp amount(limit, n) when limit in [:session_cost_usd, :window_cost_usd],
    do: "$" <> :erlang.float_to_binary(n / 1, decimals: 4)

  defp amount(limit, n) when limit in [:session_tokens, :window_tokens], do: "#{n} tokens"
  defp amount(_limit, n), do: "#{n} requests"

  @doc "Whether the proxy asks a streamed chat completion for its usage (`:stream_usage`, default true)."
  @spec stream_usage?() :: boolean()
  def stream_usage?, do: Keyword.get(config(), :stream_usage, true) == true

  ## Operator actions

  @doc """
  Changes an agent's budget (see `Observatory.Budget.Settings`); the agent must be
  registered. Options: `:operator` (in the `"settings_changed"` event). In a cluster,
  `{:error, :no_majority}` on a node cut off from the majority (so for `reset/2`).
  """
  @spec configure(String.t(), map(), keyword()) ::
          {:ok, Agents.agent()}
          | {:error, {:invalid, [Settings.violation()]} | :not_found | :no_majority}
  def configure(agent_id, params, opts \\ []) do
    # Raising a limit lowers safety: refused on a node cut off from its cluster's majority.
    Observatory.Cluster.with_majority("changing the budget of #{inspect(agent_id)}", fn ->
      do_configure(agent_id, params, opts)
    end)
  end

  defp do_configure(agent_id, params, opts) do
    with {:ok, changes} <- validate(params),
         {:ok, _before, agent, event} <-
           Agents.configure_section(agent_id, :budget, changes, %{operator: opts[:operator]}) do
      Events.broadcast(KillSwitch.topic(), KillSwitch.event_json(event))
      {:ok, agent}
    end
  end

  @doc """
  Forgets what was spent: the session's (`session_id: id`, which must be the agent's),
  else the agent's rolling window. Records a `"budget_reset"` event with what had been
  spent, and broadcasts `"budget_recovered"` when the scope was past a limit.
  Options: `:session_id`, `:operator`.
  """
  @spec reset(String.t(), keyword()) ::
          {:ok, map()} | {:error, :not_found | :not_this_agent | :no_majority}
  def reset(agent_id, opts \\ []) do
    Observatory.Cluster.with_majority("resetting the budget of #{inspect(agent_id)}", fn ->
      do_reset(agent_id, opts)
    end)
  end

  defp do_reset(agent_id, opts) do
    with %{} = agent <- Agents.get(agent_id) || {:error, :not_found},
         {:ok, scope, spent} <- reset_scope(agent, Keyword.get(opts, :session_id)) do
      details = %{operator: opts[:operator], scope: scope_json(scope), spent: spent}
      {:ok, event} = Agents.record_event(agent_id, "budget_reset", details)
      Events.broadcast(KillSwitch.topic(), KillSwitch.event_json(event))
      if Store.clear_mark(scope), do: recovered(agent_id, scope)
      {:ok, details}
    end
  end

  defp reset_scope(agent, nil) do
    spent = window_json(agent)
    Store.reset_window(agent.id)
    {:ok, {:window, agent.id}, spent}
  end

  defp reset_scope(agent, session_id) do
    case Store.session_meta(session_id) do
      %{agent_id: other} when other != agent.id ->
        {:error, :not_this_agent}

      _ours_or_never_counted ->
        spent = spend_json(Store.session(session_id))
        Store.reset_session(session_id)
        {:ok, {:session, session_id}, spent}
    end
  end

  ## Reads

  @doc """
  What a session has spent: requests, tokens, cost (USD; nil when nothing was
  priced), the answers no price covered, and `since_loop` — what it spent since its
  first loop alarm (nil before one) — with `loop_at`.
  """
  @spec session_usage(String.t()) :: map()
  def session_usage(session_id) do
    spent = Store.session(session_id)
    meta = Store.session_meta(session_id)

    since =
      case meta do
        %{loop_at: %DateTime{} = at, loop_spent: before} ->
          diff = Map.new(spent, fn {k, v} -> {k, max(v - Map.get(before, k, 0), 0)} end)
          spend_json(diff) |> Map.put(:loop_at, DateTime.to_iso8601(at))

        _ ->
          nil
      end

    spend_json(spent)
    |> Map.merge(%{
      session_id: session_id,
      agent_id: meta && meta.agent_id,
      since_loop: since,
      exhausted: Store.mark({:session, session_id}) != nil
    })
  end

  @doc """
  What an agent has spent: in total, within its rolling window, and its most recently
  active sessions (`:sessions`, default 20), each as `session_usage/1` reports it.
  """
  @spec agent_usage(map(), keyword()) :: map()
  def agent_usage(agent, opts \\ []) do
    sessions =
      for {id, _meta} <- Store.agent_sessions(agent.id, Keyword.get(opts, :sessions, 20)),
          do: session_usage(id)

    %{
      total: spend_json(Store.agent(agent.id)),
      window: window_json(agent) |> Map.put(:exhausted, Store.mark({:window, agent.id}) != nil),
      sessions: sessions
    }
  end

  @doc "A budget's settings as JSON-ready data (modes and limits; costs in USD)."
  @spec settings_json(Settings.t()) :: map()
  def settings_json(budget), do: Map.update!(budget, :mode, &Atom.to_string/1)

  ## Configuration

  @doc """
  Checks `config :observatory, :budgets` (its keys, the price table, the default
  limits); raises `ArgumentError` naming what is wrong. Runs when the application starts.
  """
  @spec check_config!() :: :ok
  def check_config! do
    budgets = ConfigCheck.keyword!(:budgets, @config_keys)

    ConfigCheck.positive_integers!(budgets, :budgets, [
      :session_ttl_ms,
      :max_sessions,
      :sweep_interval_ms
    ])

    unless budgets[:stream_usage] in [nil, true, false] do
      raise ArgumentError,
            "expected config :observatory, :budgets, :stream_usage to be a boolean, got: #{inspect(budgets[:stream_usage])}"
    end

    Prices.check!()
    Settings.check_config!()
  end

  @doc false
  # As a keyword list; anything else (check_config!/0 refuses it at start) reads as none.
  def config do
    case Application.get_env(:observatory, :budgets) do
      config when is_list(config) -> config
      _ -> []
    end
  end

  ## Internals

  defp validate(params) do
    case Settings.validate(params) do
      {:ok, changes} -> {:ok, changes}
      {:error, violations} -> {:error, {:invalid, violations}}
    end
  end

  # Every limit the request would go past, session ones first.
  defp breaches(agent_id, session_id, budget, now) do
    session_limits =
      for l <- [:session_requests, :session_tokens, :session_cost_usd], budget[l] != nil, do: l

    window_limits =
      for l <- [:window_requests, :window_tokens, :window_cost_usd], budget[l] != nil, do: l

    session =
      if session_limits == [] do
        []
      else
        spent = Store.session(session_id)

        used = %{
          session_requests: spent.requests,
          session_tokens: spent.input + spent.output,
          session_cost_usd: spent.cost
        }

        for limit <- session_limits,
            breach = breach(:session, limit, used[limit], budget[limit]),
            do: breach
      end

    window =
      if window_limits == [] do
        []
      else
        fields = Enum.map(window_limits, &window_field/1)
        spent = Store.window(agent_id, budget.window_seconds, now, fields)

        for limit <- window_limits,
            breach = breach(:window, limit, spent[window_field(limit)], budget[limit]),
            do: breach
      end

    session ++ window
  end

  defp window_field(:window_requests), do: :requests
  defp window_field(:window_tokens), do: :tokens
  defp window_field(:window_cost_usd), do: :cost

  defp breach(scope, limit, used, max) when limit in [:session_cost_usd, :window_cost_usd] do
    if used >= round(max * 1.0e9),
      do: %{scope: scope, limit: limit, used: used / 1.0e9, max: max}
  end

  defp breach(scope, limit, used, max) do
    if used >= max, do: %{scope: scope, limit: limit, used: used, max: max}
  end

  # Each scope past a limit is marked, recorded and broadcast once; a scope back under
  # its limits loses its mark and is broadcast as recovered.
  defp stopped(agent, session_id, breaches) do
    for scope <- [{:session, session_id}, {:window, agent.id}] do
      case Enum.filter(breaches, &(&1.scope == elem(scope, 0))) do
        [] ->
          if Store.mark(scope) != nil and Store.clear_mark(scope), do: recovered(agent.id, scope)

        scoped ->
          mode = agent.budget.mode

          if Store.mark(scope) == nil and
               Store.put_mark(scope, %{at: DateTime.utc_now(), mode: mode, session_id: session_id}) do
            stop(agent, session_id, scope, scoped, mode)
          end
      end
    end
  end

  defp stop(agent, session_id, scope, breaches, mode) do
    type = if mode == :enforce, do: "budget_exhausted", else: "budget_would_exhaust"

    details = %{
      mode: Atom.to_string(mode),
      session_id: session_id,
      scope: scope_json(scope),
      limits: for(b <- breaches, do: %{limit: Atom.to_string(b.limit), used: b.used, max: b.max}),
      message: refusal_message(breaches, agent.id, session_id)
    }

    Logger.warning(
      "budget: #{type} agent=#{inspect(agent.id)} session=#{inspect(session_id)} " <>
        "mode=#{mode} #{Enum.map_join(breaches, ", ", &"#{&1.limit} #{&1.used}/#{&1.max}")}"
    )

    case Agents.record_event(agent.id, type, details) do
      {:ok, event} -> Events.broadcast(KillSwitch.topic(), KillSwitch.event_json(event))
      {:error, :not_found} -> :ok
    end
  end

  defp recovered(agent_id, scope) do
    Events.broadcast(KillSwitch.topic(), %{
      id: "budget-recovered-#{System.unique_integer([:positive, :monotonic])}",
      agent_id: agent_id,
      event_type: "budget_recovered",
      at: DateTime.to_iso8601(DateTime.utc_now()),
      details: %{scope: scope_json(scope)}
    })
  end

  defp scope_json({:session, id}), do: %{kind: "session", session_id: id}
  defp scope_json({:window, _agent_id}), do: %{kind: "window"}

  defp window_json(agent) do
    spent = Store.window(agent.id, agent.budget.window_seconds, now_s())

    %{
      window_seconds: agent.budget.window_seconds,
      requests: spent.requests,
      tokens: spent.tokens,
      cost_usd: usd(spent.cost)
    }
  end

  defp spend_json(spent) do
    %{
      requests: spent.requests,
      input_tokens: spent.input,
      cached_input_tokens: spent.cached,
      cache_write_tokens: spent.cache_write,
      output_tokens: spent.output,
      tokens: spent.input + spent.output,
      cost_usd: usd(spent.cost),
      unpriced_answers: spent.unpriced
    }
  end

  defp usd(nano), do: nano / 1.0e9

  defp now_s, do: System.system_time(:second)
end
