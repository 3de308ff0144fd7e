defmodule Observatory.Telemetry do
  @moduledoc """
  `:telemetry` events, for host apps that collect metrics through it (Phoenix apps
  do: `Telemetry.Metrics`, LiveDashboard, reporters).

  Observatory does not depend on `:telemetry`: when its module is loaded (a Phoenix
  host has it), `execute/3` calls `:telemetry.execute/3`; otherwise events go nowhere
  and cost one `:persistent_term` read.

  | event | measurements | metadata |
  |---|---|---|
  | `[:observatory, :ingest, :stop]` | `duration` (native time units) | `result` (`:ok`, or the error's kind: `:invalid`, `:conflict` …), `session_id`, `agent_id` (`nil` unless `:ok`), `violations` (count), `replayed` (`true`: a step answered before, given its first answer and not scored again) |
  | `[:observatory, :entropy, :score]` | `score` (0.0–1.0) | `session_id`, `agent_id`, `severity` (`:normal`, `:warning`, `:loop`) |
  | `[:observatory, :alert]` | `entropy_score`, `occurrence_count` | `session_id`, `agent_id`, `source` (`:entropy` or `:verdict`) |
  | `[:observatory, :hitl, :pause]`, `[:observatory, :hitl, :resume]` | `system_time` | `session_id`, `operator`, `reason` |
  | `[:observatory, :kill_switch, :trip]` | `score`, `threshold` | `agent_id`, `window_size`, `window_len` |
  | `[:observatory, :cluster, :heal_stalled]` | `duration_ms` | `node` (the node saying it), `reason` (`:apart`: nodes it reaches still run apart from its Mnesia; `:overdue`: a heal still runs), `nodes`, and `leader`, `latest` (`:apart`) or `kind` (`:overdue`) |

  `:telemetry.execute/3` runs the handlers in the caller's process and detaches a
  handler that raises, so a handler cannot break the gateway.

      :telemetry.attach("log-alerts", [:observatory, :alert], &MyApp.handle/4, nil)
  """

  # An atom: a tuple key costs ~40 ns more a read, and the ingest reads it every step.
  @key __MODULE__.Dispatcher

  @typedoc "A module with `execute/3` (`:telemetry`'s signature), or nil: no events."
  @type dispatcher :: module() | nil

  @doc "Emits an event; see the module doc for the events."
  @spec execute([atom()], map(), map()) :: :ok
  def execute(event, measurements, metadata) do
    case dispatcher() do
      nil -> :ok
      module -> module.execute(event, measurements, metadata)
    end

    :ok
  end

  @doc "Where events go: `:telemetry` when it is loaded, else nil (decided once)."
  @spec dispatcher() :: dispatcher()
  def dispatcher do
    case :persistent_term.get(@key, :unset) do
      :unset ->
        dispatcher = if Code.ensure_loaded?(:telemetry), do: :telemetry
        :persistent_term.put(@key, dispatcher)
        dispatcher

      dispatcher ->
        dispatcher
    end
  end

  @doc false
  # Tests: send events to `module` instead (nil: nowhere); returns the previous one.
  @spec put_dispatcher(dispatcher()) :: dispatcher()
  def put_dispatcher(module) when is_atom(module) do
    previous = dispatcher()
    :persistent_term.put(@key, module)
    previous
  end
end
