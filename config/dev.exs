import Config

# Development defaults: well-known keys so the README's curl examples work. The server
# still binds 127.0.0.1 only. Production reads operator tokens from the environment
# (runtime.exs) and issues agent keys through the operator API.
config :observatory,
  # Seeded at every start, bound to agent-1 (stored as a hash; see Observatory.AgentKeys).
  seed_agent_keys: %{"agent-1" => "dev-agent-key"},
  operator_tokens: %{"dev-operator-token" => "dev-operator"},
  # Signs the dashboard's session cookies. Development only: production reads
  # OBSERVATORY_SECRET_KEY_BASE (runtime.exs) or generates one at boot.
  secret_key_base: "dev-only-secret-key-base-0123456789abcdefghijklmnopqrstuvwxyz",
  demo: true

config :observatory, ObservatoryWeb.Endpoint, port: 4000
config :logger, level: :info
