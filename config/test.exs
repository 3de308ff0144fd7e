import Config

config :logger, level: :warning

config :observatory,
  agent_keys: ["test-agent-key"],
  operator_tokens: %{"test-operator-token" => "test-operator"},
  demo: false

# Port 0: the OS picks a free port; tests ask ObservatoryWeb.Endpoint.port/0.
config :observatory, ObservatoryWeb.Endpoint, port: 0
