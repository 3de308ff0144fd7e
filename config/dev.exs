import Config

# Development defaults: well-known keys so the README's curl examples work. The server
# still binds 127.0.0.1 only. Production reads keys from the environment (runtime.exs).
config :observatory,
  agent_keys: ["dev-agent-key"],
  operator_tokens: %{"dev-operator-token" => "dev-operator"},
  demo: true

config :observatory, ObservatoryWeb.Endpoint, port: 4000
config :logger, level: :info
