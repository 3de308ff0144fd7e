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
  pubsub: {Observatory.PubSub, Observatory.PubSub},
  # The session log's caps (Observatory.Gateway.SessionLog): sessions, bytes per
  # envelope kept whole, envelope bytes in all.
  session_log_max_sessions: 100_000,
  session_log_max_envelope_bytes: 16_384,
  session_log_max_bytes: 268_435_456,
  # Who raises EntropyAlertEvents and topology states: :entropy (FRD-009) or :verdict.
  alert_source: :entropy,
  # The loop verdict's settings (thresholds read per step, normalization at start) are
  # its defaults, Observatory.Gateway.LoopVerdict.defaults/0; set only the ones you
  # change, e.g. `loop_verdict: [repeat_loop: 4]`: every step copies this list out of
  # the application environment to see whether it changed.
  # Durable state (Mnesia: agents and kill switch events) lives in <data_dir>/mnesia/<node>.
  data_dir: "data/#{config_env()}",
  # The OpenAI-compatible API the chat-completions proxy forwards to (base URL).
  llm_upstream: nil,
  llm_upstream_api_key: nil,
  # PEM file of the CAs an HTTPS upstream's certificate is checked against (nil: the system's).
  llm_upstream_cacertfile: nil,
  # What the official SDKs wait (600 s): a whole non-streamed call, or each silence of
  # a stream. A stream lasts at most llm_max_stream_ms.
  llm_timeout_ms: 600_000,
  llm_connect_timeout_ms: 5_000,
  llm_max_stream_ms: 1_800_000,
  # Agent keys are issued per agent (Observatory.AgentKeys); these seed fixed ones at
  # start (dev/test). Shared keys (:agent_keys) let any agent act as any other: the
  # application refuses them unless insecure_shared_agent_keys is true.
  seed_agent_keys: %{},
  agent_keys: [],
  insecure_shared_agent_keys: false,
  # Distinct wrong credentials per client (TCP address, an IPv6 /64) before its wrong
  # ones get 429 + Retry-After; valid credentials are always accepted.
  auth_throttle: [max_failures: 10, window_s: 60, lockout_s: 60, max_clients: 10_000],
  # Session ownership (Observatory.Gateway.SessionOwners): sessions an agent owns at
  # most (past it, its own least recently used one is given up), and how long an idle
  # session stays its owner's.
  max_sessions_per_agent: 10_000,
  session_owner_ttl_ms: :timer.hours(24),
  # The Anthropic Messages API the /v1/messages proxy forwards to (base URL, as the SDK takes it).
  anthropic_upstream: nil,
  anthropic_upstream_api_key: nil,
  # Caps of the proxy: a request body (a whole conversation), an upstream answer's bytes
  # (streamed or not), one server-sent event, upstream calls in flight.
  llm_max_request_bytes: 32 * 1024 * 1024,
  # Request bodies the proxy holds at once while it reads and takes them apart.
  llm_max_request_bytes_in_flight: 256 * 1024 * 1024,
  llm_max_response_bytes: 8 * 1024 * 1024,
  llm_max_event_bytes: 4 * 1024 * 1024,
  llm_max_concurrent: 256,
  # Steps answered recently (Observatory.Gateway.Idempotency): a step delivered again
  # within the window gets its first answer and is not counted twice.
  idempotency: [
    enabled: true,
    window_ms: :timer.minutes(10),
    max_steps_per_session: 1_000,
    max_steps_per_agent: 10_000,
    max_steps: 100_000
  ],
  # Defaults for agents registered from now on; each agent's own settings are durable.
  # threshold = (window_size - 1) × 1.0 + 1.5: similar prompts in the whole window and
  # one repeated call can never exceed it; the same call answered alike (2.5 each)
  # does on its fourth repeat.
  kill_switch: [
    window_size: 5,
    threshold: 5.5,
    # A request's prompt: :newest_input (the tool results of a tool turn, else the last
    # user text) or :last_user_message (the spec's letter: the task, in a tool loop).
    prompt: :newest_input,
    max_agents: 10_000,
    notification_webhook: nil,
    # Webhooks may not point at loopback/private/link-local addresses unless true.
    webhook_allow_private_networks: false,
    # A score over the threshold: :enforce (deactivate), :warn (record, alert, warn the
    # model) or :shadow (record only). For agents registered from now on.
    mode: :enforce,
    # Events kept per agent (the oldest go first).
    max_events_per_agent: 10_000
  ],
  # Guidance notes appended to the newest tool result of a looping proxied session
  # (docs/guidance.md): the default for agents without a setting of their own.
  guidance: [enabled: false],
  # What proxied agents spend (docs/budgets.md): USD per million tokens per model, and
  # the limits of agents registered from now on (nil: no limit).
  budgets: [
    prices: %{},
    aliases: %{},
    defaults: [
      mode: :enforce,
      session_requests: nil,
      session_tokens: nil,
      session_cost_usd: nil,
      window_seconds: 3600,
      window_requests: nil,
      window_tokens: nil,
      window_cost_usd: nil
    ],
    # Ask a streamed chat completion for its usage (stream_options.include_usage).
    stream_usage: true,
    session_ttl_ms: :timer.hours(24 * 7),
    max_sessions: 100_000
  ]

# Observatory's own HTTP API and dashboard (bin/start): on, loopback, port 4000. Code
# defaults are off and no port, so a host app, which does not load this file, gets
# no second server unless it configures one.
config :observatory, ObservatoryWeb.Endpoint, server: true, ip: {127, 0, 0, 1}, port: 4000

# As its own server, a failed start prints one line that says what to do and ends the
# VM (Observatory.StartupError; OBSERVATORY_STARTUP_TRACE=1 for OTP's full report). A
# host app, which does not load this file, gets the error back instead.
config :observatory, halt_on_start_error: true

config :logger, :console, format: "$time [$level] $message\n"

import_config "#{config_env()}.exs"
