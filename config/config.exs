import Config

# Every tunable with its default; see the README's configuration table.
config :observatory,
  entropy_window_size: 5,
  entropy_loop_threshold: 0.25,
  entropy_warning_threshold: 0.50,
  entropy_max_sessions: 1_000_000,
  entropy_session_ttl_ms: :timer.minutes(30),
  entropy_sweep_interval_ms: :timer.minutes(1),
  entropy_clock_tick_ms: 1_000,
  pubsub: {Observatory.PubSub, Observatory.PubSub}

config :logger, :console, format: "$time [$level] $message\n"

import_config "#{config_env()}.exs"
