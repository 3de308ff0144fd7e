defmodule Observatory do
  @moduledoc """
  Loop detection for fleets of autonomous AI agents: every step an agent sends is
  scored for how repetitive its session is, looping sessions are shown to operators,
  who can pause them, and each agent has a kill switch. See the README and the guides
  (`docs/`) for how to send steps, read the dashboard and tune detection.

  Settings are `config :observatory, …` keys (`docs/configuration.md`);
  `configure/1` changes the ones the ingest reads while the gateway runs.
  """

  @doc """
  Changes settings at run time, as `Logger.configure/1` does for Logger's: each value
  is checked, put in the application environment (as `Application.put_env/3` would
  put it: a keyword setting is replaced whole, unset keys take their defaults), and
  the step after `configure/1` returns uses it.

  Takes the settings every step reads: `:alert_source`, `:pubsub`, `:idempotency`,
  `:loop_verdict`, `:step_detection`, `:session_log_size`,
  `:session_log_max_sessions`, `:session_log_max_envelope_bytes`,
  `:session_log_max_bytes`, the entropy window's `:entropy_window_size`,
  `:entropy_loop_threshold` and `:entropy_warning_threshold`, and
  `:settings_refresh_ms`. A value that is not valid, or a setting it does not take,
  raises an `ArgumentError` that names the key and what it takes, and nothing is
  changed. The `:loop_verdict` normalization keys are applied at once too (the
  verdict's rules are rebuilt); the capacities (`max_sessions` of the verdict and the
  step detector) at the next start.

  `Application.put_env/3` alone still works: the entropy window's three settings apply
  to the next step (they are read on every call), the others within
  `:settings_refresh_ms` (default 1 s), when Observatory next reads its settings. Each
  node of a cluster has its own settings: configure each.

  For example, to raise alerts from the loop verdict and let the step detector warn
  after two stagnant steps:

      Observatory.configure(
        alert_source: :verdict,
        step_detection: [stagnation_warn: 2, stagnation_block: 5]
      )
  """
  @spec configure(keyword()) :: :ok
  defdelegate configure(settings), to: Observatory.IngestSettings
end
