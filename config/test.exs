import Config

config :logger, level: :warning

config :observatory,
  seed_agent_keys: %{"agent-http" => "test-agent-key"},
  operator_tokens: %{"test-operator-token" => "test-operator"},
  secret_key_base: "test-only-secret-key-base-0123456789abcdefghijklmnopqrstuvwxyz",
  demo: false,
  # Tests send wrong credentials on purpose, all from 127.0.0.1; the throttle's own
  # tests set their limits.
  auth_throttle: [max_failures: 10_000],
  # Tests read a failed start's reason (Observatory.StartupError halts only when true).
  halt_on_start_error: false

# Port 0: the OS picks a free port; tests ask ObservatoryWeb.Endpoint.port/0.
config :observatory, ObservatoryWeb.Endpoint, port: 0

# A fresh Mnesia directory per test run (removed when the suite ends). Named for the
# OS pid and the start time: a run that did not end (killed, crashed) leaves its
# directory behind, and a later run given the same pid must not start on it (a
# stale Mnesia of the same node name, or a directory it refuses as not private).
config :observatory,
  data_dir: Path.join(System.tmp_dir!(), "observatory-test-#{System.pid()}-#{System.os_time()}")

# The tests' webhook receivers listen on loopback (Observatory.KillSwitch.WebhookURL).
config :observatory, :kill_switch, webhook_allow_private_networks: true
