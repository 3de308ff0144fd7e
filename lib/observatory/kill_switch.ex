defmodule Observatory.KillSwitch do
  @moduledoc """
  The per-agent kill switch (seed 003): stops an agent whose LLM requests go round in
  a loop.

  Agents reach their LLM through Observatory's OpenAI-compatible proxy
  (`POST /v1/chat/completions`, see `ObservatoryWeb.API.ChatCompletions`). For an
  agent with the switch enabled, each request is fingerprinted — the SimHash of its
  newest user-side input (the tool results of a tool turn, else the last user text),
  normalized so numbers, timestamps and ids do not matter, and the signatures of the
  tool calls it answers (identical calls share one) — and enters the agent's window of
  its last `window_size` requests; the text of the model's answer is fingerprinted into
  the same entry. Each request is scored against the window:

      score = similar_prompts × 1.0 + similar_responses × 2.0 + repeated_tool_calls × 1.5

  (fingerprints fewer than 3 bits apart are similar). When the score exceeds the
  agent's `threshold` the agent is deactivated (`active: false`,
  `deactivated_by: :kill_switch`), a `"kill_switch"` event with the score and its
  parts is recorded and broadcast on `"gateway:kill_switch"`, and this request and
  every later one get the standard inactive-agent response — the one a manually
  deactivated agent gets. An operator re-activates it, which clears its window.

  ## Usage

      alias Observatory.KillSwitch

      {:ok, _agent} = KillSwitch.configure("agent-7", %{"enabled" => true, "threshold" => 8})

      {:ok, request} = KillSwitch.fingerprint_request(body)
      case KillSwitch.check_request("agent-7", request) do
        {:ok, verdict} -> forward(body)                  # verdict.score, verdict.signals
        {:error, {:inactive, agent}} -> inactive(agent)  # stopped now or earlier
      end
      KillSwitch.observe_response("agent-7", upstream_body)

      KillSwitch.activate("agent-7", operator: "alice")
      KillSwitch.deactivate("agent-7", operator: "alice", reason: "maintenance")

  ## Modes

  An enabled switch has a `mode` (`Observatory.KillSwitch.Settings`): `enforce` (the
  default) stops the agent as described; `warn` records a `"kill_switch_would_trip"`
  event, alerts (the agent's webhook, the notification sinks) and lets the proxy warn
  the model (`Observatory.Proxy.Guidance`), but refuses nothing; `shadow` only
  records the event. Either records once per run of requests over the threshold, and
  broadcasts `"kill_switch_recovered"` when a request scores under it again.

  The switch is off by default: with it off an agent has no window and nothing is
  ever blocked. Agents and events are durable (`Observatory.KillSwitch.Agents`,
  Mnesia); windows are in memory (`Observatory.KillSwitch.Windows`, a Rust store).

  ## Trade-offs

    * The verdict is taken when a request arrives, before it is forwarded: the request
      that crosses the threshold is not sent upstream. Its answer's fingerprint is
      what the next request's `similar_responses` compares against.
    * Concurrent requests of one agent share its window; a response is attached to
      the agent's latest request, which under concurrency may be a sibling's.
  """

  require Logger

  alias Observatory.KillSwitch.{Agents, Notifier, Settings, Windows}
  alias Observatory.{Gateway.Events, Metrics, Native, Storage}

  @dirty_bytes Observatory.Native.Cost.dirty_bytes()
  @max_agent_id_bytes 256
  @prompt_sources [:newest_input, :last_user_message]

  @typedoc "A proxied LLM API whose bodies the kill switch reads."
  @type api :: :chat_completions | :messages | :responses

  @type fingerprint :: %{
          prompt_hash: non_neg_integer() | nil,
          tool_signatures: [non_neg_integer()],
          stream: boolean()
        }

  @doc "The topic of agent events: kill switch trips, (de)activations, settings changes."
  @spec topic() :: String.t()
  def topic, do: "gateway:kill_switch"

  ## Fingerprints

  @doc """
  The prompt normalization the fingerprints use: ISO timestamps → `<TS>`, UUIDs →
  `<ID>`, numbers → `<NUM>`, whitespace runs → one space.

      iex> Observatory.KillSwitch.normalize("order #12345  at 2024-01-15T10:30:00Z\\r\\n")
      "order #<NUM> at <TS>"
  """
  @spec normalize(String.t()) :: String.t()
  def normalize(text) when is_binary(text) and byte_size(text) > @dirty_bytes,
    do: Native.kill_switch_normalize_dirty(text)

  def normalize(text) when is_binary(text), do: Native.kill_switch_normalize(text)

  @doc "The 64-bit SimHash of the normalized text."
  @spec fingerprint(String.t()) :: non_neg_integer()
  def fingerprint(text) when is_binary(text) and byte_size(text) > @dirty_bytes,
    do: Native.kill_switch_fingerprint_dirty(text)

  def fingerprint(text) when is_binary(text), do: Native.kill_switch_fingerprint(text)

  @doc """
  The number of bits in which two fingerprints differ.

      iex> Observatory.KillSwitch.hamming(0b1011, 0b0001)
      2
  """
  @spec hamming(non_neg_integer(), non_neg_integer()) :: 0..64
  def hamming(a, b) when is_integer(a) and is_integer(b) do
    for(<<(bit::1 <- <<Bitwise.bxor(a, b)::64>>)>>, do: bit) |> Enum.sum()
  end

  @doc """
  Reads a request body: the fingerprint of its prompt (`nil` when it has no text), the
  signatures of the tool calls its newest input answers, and whether it asks for
  streaming. `api` is `:chat_completions` (OpenAI, the default), `:messages`
  (Anthropic) or `:responses` (the OpenAI Responses API, `Observatory.Proxy.Responses`).

  The prompt is the newest input from the user's side: for a turn that answers tool
  calls, the tool results (OpenAI `role: "tool"` messages, Anthropic `tool_result`
  blocks, Responses `function_call_output` items); otherwise the last user text. In a tool loop the last message with role
  `user` is the original task, the same on every turn; read literally, every request
  of a healthy agent would be a "similar prompt".

  ## Options
    * `:prompt` — `:newest_input` (the default) or `:last_user_message`, the text of
      the last user message on every turn (the kill switch specification's letter).
      Defaults to the `:kill_switch` `:prompt` setting (`prompt_source/0`).
  """
  @spec fingerprint_request(binary(), api(), keyword()) ::
          {:ok, fingerprint()} | {:error, {:invalid_json, String.t()} | :not_an_object}
  def fingerprint_request(body, api \\ :chat_completions, opts \\ []) when is_binary(body) do
    dirty? = byte_size(body) > @dirty_bytes
    source = Keyword.get_lazy(opts, :prompt, &prompt_source/0)

    unless source in @prompt_sources do
      raise ArgumentError,
            "expected :prompt to be one of #{inspect(@prompt_sources)}, got: #{inspect(source)}"
    end

    result =
      case api do
        :chat_completions when dirty? ->
          Native.kill_switch_request_fingerprint_dirty(body, source)

        :chat_completions ->
          Native.kill_switch_request_fingerprint(body, source)

        :messages when dirty? ->
          Native.kill_switch_anthropic_request_fingerprint_dirty(body, source)

        :messages ->
          Native.kill_switch_anthropic_request_fingerprint(body, source)

        :responses when dirty? ->
          Native.responses_request_fingerprint_dirty(body, source)

        :responses ->
          Native.responses_request_fingerprint(body, source)
      end

    case result do
      {:ok, prompt, signatures, stream} ->
        {:ok, %{prompt_hash: prompt, tool_signatures: signatures, stream: stream}}

      {:error, _} = error ->
        error
    end
  end

  @doc """
  How requests' prompts are read: `config :observatory, :kill_switch, prompt:`
  (`OBSERVATORY_KILL_SWITCH_PROMPT`), `:newest_input` unless set. The value is checked
  when the application starts (`check_config!/0`); one set to anything else later
  reads as `:newest_input`.
  """
  @spec prompt_source() :: :newest_input | :last_user_message
  def prompt_source do
    case configured_prompt_source() do
      source when source in @prompt_sources -> source
      _other -> :newest_input
    end
  end

  @doc """
  Raises `ArgumentError` when the `:kill_switch` `:prompt` or `:mode` setting is not a
  known one.
  """
  @spec check_config!() :: :ok
  def check_config! do
    config =
      Observatory.ConfigCheck.keyword!(:kill_switch, [
        :window_size,
        :threshold,
        :prompt,
        :max_agents,
        :notification_webhook,
        :webhook_allow_private_networks,
        :mode,
        :max_events_per_agent
      ])

    mode = Keyword.get(config, :mode, :enforce)

    unless mode in [:enforce, :warn, :shadow] do
      raise ArgumentError,
            "expected config :observatory, :kill_switch, :mode to be :enforce, :warn or :shadow, " <>
              "got: #{inspect(mode)}"
    end

    case configured_prompt_source() do
      source when source in @prompt_sources ->
        :ok

      other ->
        raise ArgumentError,
              "expected config :observatory, :kill_switch, :prompt to be one of " <>
                "#{inspect(@prompt_sources)}, got: #{inspect(other)}"
    end
  end

  defp configured_prompt_source,
    do: Keyword.get(Application.get_env(:observatory, :kill_switch, []), :prompt, :newest_input)

  @doc """
  Reads a response body: `{:ok, fingerprint | nil}` (nil when it has no text — a
  chat completion's first choice, an Anthropic message's text blocks, a response's
  `output_text` parts), or an error when it is not JSON or not a completion (a
  message, a response with an `output` array).
  """
  @spec fingerprint_response(binary(), api()) ::
          {:ok, non_neg_integer() | nil}
          | {:error, {:invalid_json, String.t()} | :not_a_completion}
  def fingerprint_response(body, api \\ :chat_completions) when is_binary(body) do
    dirty? = byte_size(body) > @dirty_bytes

    case api do
      :chat_completions when dirty? -> Native.kill_switch_response_fingerprint_dirty(body)
      :chat_completions -> Native.kill_switch_response_fingerprint(body)
      :messages when dirty? -> Native.kill_switch_anthropic_response_fingerprint_dirty(body)
      :messages -> Native.kill_switch_anthropic_response_fingerprint(body)
      :responses when dirty? -> Native.responses_response_fingerprint_dirty(body)
      :responses -> Native.responses_response_fingerprint(body)
    end
  end

  ## The request path

  @doc """
  Admits or refuses one request of `agent_id`, a registered agent: a request never
  registers one (operators do, by issuing its key: `Observatory.AgentKeys`).

  Returns `{:ok, verdict}` when the request may go upstream — `verdict` is `nil` when
  the switch is off, else `%{score, exceeded: false, signals, window_len}` — and
  `{:error, {:inactive, agent}}` when the agent is inactive, including when this very
  request made the score exceed the threshold; `{:error, :unknown_agent}` when no
  such agent is registered.
  """
  @spec check_request(String.t(), fingerprint()) ::
          {:ok, Windows.verdict() | nil}
          | {:error, {:inactive, Agents.agent()} | :unknown_agent | :invalid_agent_id}
  def check_request(agent_id, %{prompt_hash: prompt, tool_signatures: signatures}) do
    with :ok <- validate_agent_id(agent_id),
         {:ok, agent} <- registered(agent_id),
         :ok <- ensure_active(agent) do
      case agent.kill_switch do
        %{enabled: false} ->
          {:ok, nil}

        %{window_size: size, threshold: threshold} = settings ->
          {:ok, verdict} = Windows.observe_request(agent_id, prompt, signatures, size, threshold)

          case {verdict.exceeded, Map.get(settings, :mode, :enforce)} do
            {true, :enforce} -> trip(agent, verdict, prompt)
            {true, mode} -> would_trip(agent, mode, verdict, prompt)
            {false, _mode} -> recovered(agent, verdict)
          end
      end
    end
  end

  @doc """
  Hashes the model's answer into the agent's window ("Response hash capture"). Takes
  the response body or its fingerprint; does nothing when the switch is off or the
  answer has no text.
  """
  @spec observe_response(String.t(), binary() | non_neg_integer() | nil) :: :ok
  def observe_response(agent_id, response) when is_binary(response) do
    case fingerprint_response(response) do
      {:ok, hash} -> observe_response(agent_id, hash)
      {:error, _} -> :ok
    end
  end

  def observe_response(_agent_id, nil), do: :ok

  def observe_response(agent_id, hash) when is_integer(hash) do
    Windows.observe_response(agent_id, hash)
    :ok
  end

  @doc "Whether the agent is active; an unknown agent is not refused here (`check_request/2` does)."
  @spec active?(String.t()) :: boolean()
  def active?(agent_id), do: Agents.active?(agent_id)

  @doc "Whether `id` can name an agent: 1–256 bytes of UTF-8 without control characters."
  @spec valid_agent_id?(term()) :: boolean()
  def valid_agent_id?(id) when is_binary(id) and byte_size(id) in 1..@max_agent_id_bytes,
    do: String.valid?(id) and not String.match?(id, ~r/[[:cntrl:]]/u)

  def valid_agent_id?(_), do: false

  ## Operator actions

  @doc """
  Changes an agent's settings (see `Observatory.KillSwitch.Settings` for keys and
  ranges), registering the agent if it is new. Turning the switch on or off starts
  the window over; a new `window_size` applies at once.

  Options: `:operator` (recorded in the `"settings_changed"` event).

  In a cluster, `{:error, :no_majority}` on a node cut off from the majority
  (`Observatory.Cluster.with_majority/2`); so for `activate/2`.
  """
  @spec configure(String.t(), map(), keyword()) ::
          {:ok, Agents.agent()}
          | {:error,
             {:invalid, [Settings.violation()]} | :agent_limit | :invalid_agent_id | :no_majority}
  def configure(agent_id, params, opts \\ []) do
    Observatory.Storage.require!()

    Observatory.Cluster.with_majority("changing the settings of #{inspect(agent_id)}", fn ->
      do_configure(agent_id, params, opts)
    end)
  end

  defp do_configure(agent_id, params, opts) do
    with :ok <- validate_agent_id(agent_id),
         {:ok, changes} <- validate(params),
         {:ok, before, agent, event} <-
           Agents.configure(agent_id, changes, %{operator: opts[:operator]}) do
      cond do
        before.kill_switch.enabled != agent.kill_switch.enabled -> Windows.clear(agent_id)
        before.kill_switch.window_size != agent.kill_switch.window_size -> resize(agent)
        true -> :ok
      end

      broadcast(event)
      {:ok, agent}
    end
  end

  @doc """
  Activates an inactive agent: `active: true`, `deactivated_by: nil`, and its window
  is cleared so the loop that stopped it is not held against it.

  Options: `:operator`, `:reason` (recorded in the `"activation"` event).
  """
  @spec activate(String.t(), keyword()) ::
          {:ok, Agents.agent()} | {:error, :not_found | :already_active | :no_majority}
  def activate(agent_id, opts \\ []) do
    Observatory.Storage.require!()

    Observatory.Cluster.with_majority("activating #{inspect(agent_id)}", fn ->
      do_activate(agent_id, opts)
    end)
  end

  defp do_activate(agent_id, opts) do
    with {:ok, agent, event} <- Agents.activate(agent_id, audit(opts)) do
      Windows.clear(agent_id)

      Logger.info(
        "agent #{inspect(agent_id)} activated by #{Observatory.Operator.describe(opts)}"
      )

      broadcast(event)
      {:ok, agent}
    end
  end

  @doc """
  Deactivates an agent by hand (`deactivated_by: :manual`): its requests get the
  inactive-agent response until it is activated.

  Options: `:operator`, `:reason`.
  """
  @spec deactivate(String.t(), keyword()) ::
          {:ok, Agents.agent()} | {:error, :not_found | :already_inactive}
  def deactivate(agent_id, opts \\ []) do
    Observatory.Storage.require!()

    with {:ok, agent, event} <- Agents.deactivate(agent_id, :manual, audit(opts)) do
      Logger.info(
        "agent #{inspect(agent_id)} deactivated by #{Observatory.Operator.describe(opts)}"
      )

      broadcast(event)
      {:ok, agent}
    end
  end

  @doc """
  Deletes an agent: its record, its events and its keys (revoked at once), its
  window, and what its budget counted. It can be registered again by issuing it a new
  key.

  Options: `:operator` (logged and in the broadcast `"agent_deleted"` event).
  """
  @spec delete(String.t(), keyword()) :: {:ok, [String.t()]} | {:error, :not_found}
  def delete(agent_id, opts \\ []) do
    Observatory.Storage.require!()

    with {:ok, revoked} <- Agents.delete(agent_id) do
      Windows.clear(agent_id)
      Observatory.Budget.Store.delete_agent(agent_id)

      Logger.info(
        "agent #{inspect(agent_id)} deleted by #{Observatory.Operator.describe(opts)}, " <>
          "revoking keys #{inspect(revoked)}"
      )

      Events.broadcast(topic(), %{
        id: "deleted-#{System.unique_integer([:positive, :monotonic])}",
        agent_id: agent_id,
        event_type: "agent_deleted",
        at: DateTime.to_iso8601(DateTime.utc_now()),
        details: %{operator: opts[:operator], revoked_keys: revoked}
      })

      {:ok, revoked}
    end
  end

  ## Reads

  @doc "The agent's record, or nil."
  @spec agent(String.t()) :: Agents.agent() | nil
  def agent(agent_id), do: Storage.reading(fn -> Agents.get(agent_id) end)

  @doc "Every agent, sorted by id."
  @spec agents() :: [Agents.agent()]
  def agents, do: Storage.reading(&Agents.list/0)

  @doc "Events newest first; options `:agent_id`, `:limit` (default 50)."
  @spec events(keyword()) :: [Agents.event()]
  def events(opts \\ []), do: Storage.reading(fn -> Agents.events(opts) end)

  @doc "The agent's current score and window fill, or nil when it has no window."
  @spec status(String.t()) :: map() | nil
  def status(agent_id), do: Storage.reading(fn -> Windows.status(agent_id) end)

  @doc "The agent's window entries, oldest first, or nil."
  @spec window(String.t()) :: [Windows.entry()] | nil
  def window(agent_id), do: Storage.reading(fn -> Windows.entries(agent_id) end)

  @doc "Whether the agent's alerts go anywhere (its webhook or the global one)."
  @spec notifications_configured?(map()) :: boolean()
  defdelegate notifications_configured?(agent), to: Notifier, as: :configured?

  @doc "An event as JSON-ready data (times as ISO 8601, atoms as strings)."
  @spec event_json(Agents.event()) :: map()
  def event_json(event) do
    %{
      id: event.id,
      agent_id: event.agent_id,
      event_type: event.event_type,
      at: DateTime.to_iso8601(event.at),
      details: event.details
    }
  end

  ## Internals

  defp trip(agent, verdict, prompt) do
    details = trip_details(agent, verdict, prompt)

    case Agents.deactivate(agent.id, :kill_switch, details) do
      {:ok, agent, event} ->
        Metrics.inc(:kill_switch_trips)

        Observatory.Telemetry.execute(
          [:observatory, :kill_switch, :trip],
          %{score: verdict.score, threshold: agent.kill_switch.threshold},
          %{
            agent_id: agent.id,
            window_size: agent.kill_switch.window_size,
            window_len: verdict.window_len
          }
        )

        Logger.warning(
          "kill switch deactivated agent #{inspect(agent.id)}: score #{verdict.score} > " <>
            "threshold #{agent.kill_switch.threshold} (#{inspect(verdict.signals)})"
        )

        broadcast(event)
        Notifier.notify(agent, event_json(event))
        {:error, {:inactive, agent}}

      {:error, :already_inactive} ->
        # A concurrent request or an operator got there first.
        {:error, {:inactive, Agents.get(agent.id)}}
    end
  end

  # Shadow and warn modes: the agent is not stopped; the first request of a run over
  # the threshold records it (and, in warn mode, alerts like a trip does). The verdict
  # says so (`would_trip: mode`) for the proxy to warn the model.
  defp would_trip(agent, mode, verdict, prompt) do
    if Windows.start_would_trip(agent.id) do
      details = Map.put(trip_details(agent, verdict, prompt), :mode, Atom.to_string(mode))

      case Agents.record_event(agent.id, "kill_switch_would_trip", details) do
        {:ok, event} ->
          Metrics.inc(:kill_switch_would_trips)

          Logger.warning(
            "kill switch (#{mode} mode) would have deactivated agent #{inspect(agent.id)}: " <>
              "score #{verdict.score} > threshold #{agent.kill_switch.threshold}"
          )

          broadcast(event)
          if mode == :warn, do: Notifier.notify(agent, event_json(event))

        {:error, :not_found} ->
          :ok
      end
    end

    {:ok, Map.put(verdict, :would_trip, mode)}
  end

  # The end of a run over the threshold in shadow or warn mode: announced (not recorded),
  # so that an incident opened for it can be resolved.
  defp recovered(agent, verdict) do
    if Windows.end_would_trip(agent.id) do
      Events.broadcast(topic(), %{
        id: "recovered-#{System.unique_integer([:positive, :monotonic])}",
        agent_id: agent.id,
        event_type: "kill_switch_recovered",
        at: DateTime.to_iso8601(DateTime.utc_now()),
        details: %{score: verdict.score, threshold: agent.kill_switch.threshold}
      })
    end

    {:ok, verdict}
  end

  defp trip_details(agent, verdict, prompt) do
    %{
      score: verdict.score,
      threshold: agent.kill_switch.threshold,
      window_size: agent.kill_switch.window_size,
      window_len: verdict.window_len,
      similar_prompts: verdict.signals.similar_prompts,
      similar_responses: verdict.signals.similar_responses,
      repeated_tool_calls: verdict.signals.repeated_tool_calls,
      prompt_hash: prompt && hex(prompt)
    }
  end

  defp registered(agent_id) do
    case Agents.get(agent_id) do
      nil -> {:error, :unknown_agent}
      agent -> {:ok, agent}
    end
  end

  defp ensure_active(%{active: true}), do: :ok
  defp ensure_active(agent), do: {:error, {:inactive, agent}}

  defp validate(params) do
    case Settings.validate(params) do
      {:ok, changes} -> {:ok, changes}
      {:error, violations} -> {:error, {:invalid, violations}}
    end
  end

  defp validate_agent_id(id),
    do: if(valid_agent_id?(id), do: :ok, else: {:error, :invalid_agent_id})

  defp resize(%{id: id, kill_switch: %{window_size: size}}) do
    Windows.resize(id, size)
    :ok
  end

  defp audit(opts), do: %{operator: opts[:operator], reason: opts[:reason]}

  defp broadcast(event), do: Events.broadcast(topic(), event_json(event))

  defp hex(hash), do: hash |> Integer.to_string(16) |> String.pad_leading(16, "0")
end
