defmodule Observatory.TestingTest do
  # Observatory.Testing.reset!/0, the clean state a host's test run (or test) starts
  # from. It clears the whole application's state: not async.
  use ExUnit.Case, async: false

  alias Observatory.{AgentKeys, KillSwitch}
  alias Observatory.Gateway.{Alerts, EntropyTracker, HITL, SchemaInterceptor, StepDetector}
  alias Observatory.Test.HTTP

  defp loop(session, agent) do
    for n <- 1..5 do
      envelope =
        HTTP.envelope(%{
          "meta" => %{"session_id" => session, "agent_id" => agent, "step_id" => "s#{n}"}
        })

      {:ok, _} = SchemaInterceptor.ingest(envelope)
    end
  end

  describe "reset!/0 gives the next test (or run) a clean Observatory" do
    test "agents, keys, switches, pauses, the audit log, blocks, budgets, windows and alerts are gone" do
      n = System.unique_integer([:positive])
      agent = "agent-reset-#{n}"
      session = "sess-reset-#{n}"

      {:ok, %{key: key}} = AgentKeys.issue(agent)
      {:ok, _} = KillSwitch.configure(agent, %{"enabled" => true})
      {:ok, _} = KillSwitch.deactivate(agent, operator: "alice")
      {:ok, _} = HITL.pause(session, operator: "alice", reason: "before the reset")
      loop(session, agent)
      blocked = "sess-reset-blocked-#{n}"
      digest = :crypto.hash(:sha256, "same")
      for _ <- 1..6, do: StepDetector.analyze(blocked, digest, digest)

      # Spending through the proxy, counted against the agent's budget.
      agent_record = KillSwitch.Agents.get(agent)
      :ok = Observatory.Budget.count_request(agent_record, session)
      assert Observatory.Budget.session_usage(session).requests == 1

      assert Alerts.get(session) != nil
      assert Observatory.Gateway.Idempotency.count({:session, session}) == 5
      assert StepDetector.block(blocked) != nil
      assert EntropyTracker.session(session) != nil

      assert Observatory.Testing.reset!() == :ok
      # Keys cached by the tests' HTTP helper belong to the state just cleared.
      HTTP.forget_keys()

      assert KillSwitch.Agents.get(agent) == nil
      assert AgentKeys.authenticate(key) == {:error, :unauthorized}
      refute HITL.paused?(session)
      assert HITL.audit_log() == []
      assert StepDetector.block(blocked) == nil
      assert EntropyTracker.session(session) == nil
      assert Alerts.get(session) == nil
      # A step sent again is scored anew, not answered from memory.
      assert Observatory.Gateway.Idempotency.count({:session, session}) == 0
      assert KillSwitch.Agents.events(agent_id: agent) == []
      assert Observatory.Budget.session_usage(session).requests == 0
    end

    test "the configured seed keys work again, and the gateway serves as before" do
      assert Observatory.Testing.reset!() == :ok
      HTTP.forget_keys()

      assert {:ok, "agent-http"} = AgentKeys.authenticate(HTTP.agent_key())
      assert HTTP.post_json("/api/v1/decision_logs", HTTP.envelope()).status == 200

      # A second reset in a row is fine (a setup that runs before every test).
      assert Observatory.Testing.reset!() == :ok
      assert Observatory.Health.check() |> elem(0) == :ok
    end

    test "with storage off it raises, saying so" do
      Observatory.Storage.put_mode({:off, "a test"})
      on_exit(fn -> Observatory.Storage.put_mode(:on) end)

      assert_raise Observatory.StorageOffError, ~r/storage is off in this VM \(a test\)/, fn ->
        Observatory.Testing.reset!()
      end
    end
  end
end
