defmodule Observatory.Proxy.Guidance do
  @moduledoc """
  Tells the model, in the request it is about to read, that its agent is going round
  in a loop: a short note appended to the newest tool result, where the model reads
  the result of the call it repeated (seed 002: "append guidance to the tool result,
  the LLM sees it alongside the real result").

  A proxied request carries the results of the agent's previous tool calls; they
  become steps (`Observatory.Proxy.Steps`) before the request goes upstream. When
  those steps make

    * the step detector warn (the same call and result 3 times in a row, or 5 new
      calls that all got a result seen before),
    * the loop verdict say `suspect` or `loop` (`Observatory.Gateway.LoopVerdict`), or
    * the kill switch, in `warn` mode, score the request over its threshold,

  the request goes upstream with a note naming what repeats:

      [Observatory] Loop warning: the same call 3 times in a row, its result saying
      nothing new: read_file {"path":"build.log"}. Repeating it will not change the
      result: change your approach, or stop and summarize what is blocking you.

  The note is appended in the API's shape (`Observatory.Proxy.BodyEdit.append_note/3`):
  after a blank line in a string result, as one more text block in a block list. The
  rest of the request goes upstream byte for byte as the agent sent it, and the agent
  never sees the note in its own history: its next request carries the result as it
  was, which is what the kill switch fingerprints and the steps are read from. A
  request whose tail answers no tool call gets no note; a retry of a request gets the
  note the request got.

  Every note is recorded as a `"guidance_injected"` agent event (session, source, what
  repeats, the note) and broadcast on `"gateway:kill_switch"`.

  ## Setting

  Per agent, durable: on, off, or the default (`PUT /api/v1/agents/:id/guidance`,
  Agent Detail). The default is off; turn it on for every agent that has no setting of
  its own with

      config :observatory, :guidance, enabled: true     # or OBSERVATORY_GUIDANCE=on
  """

  alias Observatory.Gateway.Events
  alias Observatory.{KillSwitch, Metrics}
  alias Observatory.KillSwitch.Agents
  alias Observatory.Proxy.BodyEdit

  # Bytes of the repeated call quoted in a note.
  @max_call_bytes 300
  @advice "Repeating it will not change the result: change your approach, or stop and " <>
            "summarize what is blocking you."

  @type note :: %{
          text: String.t(),
          source: String.t(),
          repeats: String.t() | nil,
          why: String.t()
        }

  @doc "Whether notes are on for `agent` (its own setting, else the configured default)."
  @spec enabled?(map() | nil) :: boolean()
  def enabled?(%{guidance: setting}) when is_boolean(setting), do: setting
  def enabled?(_agent), do: default()

  @doc "The configured default (`config :observatory, :guidance, enabled:`), false unless set."
  @spec default() :: boolean()
  def default,
    do:
      List.wrap(Application.get_env(:observatory, :guidance)) |> Keyword.get(:enabled, false) ==
        true

  @doc """
  Sets an agent's notes on (`true`), off (`false`) or back to the default (`nil`); the
  agent must be registered. Options: `:operator` (in the `"settings_changed"` event).
  """
  @spec configure(String.t(), boolean() | nil, keyword()) ::
          {:ok, Agents.agent()} | {:error, :not_found | :invalid | :no_majority}
  def configure(agent_id, setting, opts \\ [])

  def configure(agent_id, setting, opts) when setting in [true, false, nil] do
    Observatory.Cluster.with_majority("changing the guidance notes of #{inspect(agent_id)}", fn ->
      with {:ok, _before, agent, event} <-
             Agents.configure_section(agent_id, :guidance, setting, %{operator: opts[:operator]}) do
        Events.broadcast(KillSwitch.topic(), KillSwitch.event_json(event))
        {:ok, agent}
      end
    end)
  end

  def configure(_agent_id, _setting, _opts), do: {:error, :invalid}

  @doc "Raises `ArgumentError` unless `config :observatory, :guidance` is `[enabled: boolean]`."
  @spec check_config!() :: :ok
  def check_config! do
    case Application.get_env(:observatory, :guidance) || [] do
      config when is_list(config) ->
        for {key, value} <- config do
          unless key == :enabled and is_boolean(value) do
            raise ArgumentError,
                  "config :observatory, :guidance takes enabled: true | false, got: " <>
                    inspect({key, value})
          end
        end

        :ok

      other ->
        raise ArgumentError,
              "expected config :observatory, :guidance to be a keyword list, got: #{inspect(other)}"
    end
  end

  @doc """
  The note a request should carry, from the ingest results of its steps (newest last)
  and the kill switch's verdict, or nil when nothing repeats.
  """
  @spec note([map()], map() | nil) :: note() | nil
  def note(results, kill_switch_verdict) do
    newest_first = Enum.reverse(results)

    cond do
      step = Enum.find(newest_first, &match?(%{step: %{action: :warn}}, &1)) ->
        repeats = call(step)
        text = step.step.guidance <> if(repeats, do: " Repeated call: #{repeats}", else: "")
        build("step_detector", text, repeats, step.step.guidance)

      verdict = Enum.find(newest_first, &match?(%{verdict: %{verdict: :loop}}, &1)) ->
        from_verdict(verdict)

      verdict = Enum.find(newest_first, &match?(%{verdict: %{verdict: :suspect}}, &1)) ->
        from_verdict(verdict)

      match?(%{would_trip: :warn}, kill_switch_verdict) ->
        repeats = List.first(newest_first) && call(List.first(newest_first))

        why =
          "your recent requests repeat each other (a loop score of " <>
            "#{kill_switch_verdict.score})"

        text = "Loop warning: " <> why <> if(repeats, do: ": #{repeats}. ", else: ". ") <> @advice
        build("kill_switch", text, repeats, why)

      true ->
        nil
    end
  end

  defp from_verdict(result) do
    reason = result.verdict.reason
    repeats = call(result)
    text = "Loop warning: " <> reason <> if(repeats, do: ": #{repeats}. ", else: ". ") <> @advice
    build("loop_verdict", text, repeats, reason)
  end

  @doc """
  The body to send upstream for a request: with the note appended when one is due
  and the agent has notes on. (A retry of a request reads its steps' first answers —
  the gateway answers a step it has seen with its first answer — so it gets the note
  the request got.) Records the note. Returns `{body, note | nil}`.
  """
  @spec apply(binary(), BodyEdit.api(), map(), map()) :: {binary(), note() | nil}
  def apply(body, api, request, note) do
    %{agent: agent, session_id: session_id} = request
    note = if enabled?(agent), do: note

    with %{} <- note,
         {:ok, edited} <- BodyEdit.append_note(body, api, note.text) do
      record(agent.id, session_id, note)
      {edited, note}
    else
      _ -> {body, nil}
    end
  end

  defp record(agent_id, session_id, note) do
    Metrics.inc(:guidance_notes)

    details = %{
      session_id: session_id,
      source: note.source,
      repeats: note.repeats,
      why: note.why,
      note: note.text
    }

    case Agents.record_event(agent_id, "guidance_injected", details) do
      {:ok, event} -> Events.broadcast(KillSwitch.topic(), KillSwitch.event_json(event))
      {:error, :not_found} -> :ok
    end
  end

  defp build(source, text, repeats, why),
    do: %{text: "[Observatory] " <> text, source: source, repeats: repeats, why: why}

  # The step's call, as its intent says it (`read_file {"path":"a"}`), cut short.
  defp call(%{envelope: %{"cognition" => %{"intent" => intent}}}) when is_binary(intent),
    do: truncate(intent)

  defp call(_result), do: nil

  defp truncate(text) when byte_size(text) <= @max_call_bytes, do: text

  defp truncate(text) do
    cut =
      text
      |> binary_part(0, @max_call_bytes)
      |> String.chunk(:valid)
      |> Enum.filter(&String.valid?/1)

    IO.iodata_to_binary(cut) <> "…"
  end
end
