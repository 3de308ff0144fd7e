defmodule Observatory.Testing do
  @moduledoc """
  Clean Observatory state for your app's tests, the way Ecto's sandbox gives each
  test a clean database.

  Observatory keeps state on disk (agents, their keys and events, pauses, the HITL
  audit log, step-detector blocks, budgets spent, notification sinks) and in memory
  (entropy windows, verdicts, alerts, kill-switch windows, step streaks, the steps
  already answered). Without a reset, a test run starts with what the last one left:
  a kill switch still on, a session still paused, a budget still spent, a step
  answered from memory.

      # test/test_helper.exs — every run starts from nothing
      ExUnit.start()
      Observatory.Testing.reset!()

      # a test module that changes Observatory's state
      use MyAppWeb.ConnCase, async: false
      setup do: Observatory.Testing.reset!()

  The state is one per VM, not one per test process: tests that reset it, or that
  depend on what others do not change, run with `async: false`. Tests that only add
  their own agents and sessions (unique ids) can stay async and share one reset per
  run. Give the test environment a data directory of its own
  (`config :observatory, data_dir: …` in `config/test.exs`), apart from dev's.
  """

  alias Observatory.Gateway
  alias Observatory.KillSwitch

  # Restarted in this order after the tables are cleared; each starts empty (the
  # kill switch supervisor seeds the configured keys again).
  @in_memory [
    Observatory.Gateway.Supervisor,
    Observatory.KillSwitch.Supervisor,
    ObservatoryWeb.SnapshotCache,
    ObservatoryWeb.AuthThrottle
  ]

  @doc """
  Forgets everything: every agent, key, event, pause, audit entry and block, every
  budget's spending and notification sink, every session's windows, verdicts and
  alerts, every kill-switch window. Configured seed
  keys (`:seed_agent_keys`) are seeded again. Raises `Observatory.StorageOffError` in
  a VM that runs with Observatory's storage off.
  """
  @spec reset!() :: :ok
  def reset! do
    Observatory.Storage.require!()

    for id <- Enum.reverse(@in_memory) do
      :ok = Supervisor.terminate_child(Observatory.Supervisor, id)
    end

    for table <- durable_tables(), do: {:atomic, :ok} = :mnesia.clear_table(table)

    # The answered steps outlive a restart of their process on purpose: forget them
    # all (every one is older than a window of -1 ms).
    Gateway.Idempotency.sweep(-1)

    for id <- @in_memory do
      {:ok, _} = Supervisor.restart_child(Observatory.Supervisor, id)
    end

    :ok
  end

  # Every table of state (not the proxy's session-id secret: it only keys the ids).
  defp durable_tables do
    KillSwitch.Agents.tables() ++
      Gateway.HITL.tables() ++
      Gateway.StepDetector.tables() ++
      Observatory.Budget.Store.tables() ++
      Observatory.Notifications.tables() ++ [Observatory.Cluster.Tombstones.table()]
  end
end
