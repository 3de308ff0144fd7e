defmodule Observatory.KillSwitch.DurabilityTest do
  # Restarts the application and Mnesia: not async (sync tests run after every async one).
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  alias Observatory.KillSwitch
  alias Observatory.KillSwitch.{Agents, Windows}
  alias Observatory.Test.HTTP

  defp unique(prefix), do: "#{prefix}-#{System.unique_integer([:positive])}"

  # Agents in each state the seed names, with their events.
  defp populate do
    tripped = unique("durable-tripped")
    manual = unique("durable-manual")
    configured = unique("durable-configured")
    reactivated = unique("durable-reactivated")

    {:ok, _} = KillSwitch.configure(tripped, %{enabled: true, window_size: 5, threshold: 1.5})
    fp = %{prompt_hash: 7, tool_signatures: [1], stream: false}
    capture_log(fn -> for _ <- 1..3, do: KillSwitch.check_request(tripped, fp) end)

    {:ok, _} = Agents.fetch_or_register(manual)
    {:ok, _} = KillSwitch.deactivate(manual, operator: "alice", reason: "maintenance")

    {:ok, _} =
      KillSwitch.configure(configured, %{
        enabled: true,
        window_size: 250,
        threshold: 42.5,
        notification_webhook: "https://hooks.example.com/k"
      })

    {:ok, _} = Agents.fetch_or_register(reactivated)
    {:ok, _} = KillSwitch.deactivate(reactivated, operator: "bob")
    {:ok, _} = KillSwitch.activate(reactivated, operator: "bob")

    ids = [tripped, manual, configured, reactivated]

    snapshot =
      for id <- ids, into: %{}, do: {id, {Agents.get(id), KillSwitch.events(agent_id: id)}}

    {tripped, snapshot}
  end

  test "agents, settings and kill switch events survive a restart of the application and of Mnesia" do
    {tripped, snapshot} = populate()
    assert %{active: false, deactivated_by: :kill_switch} = Agents.get(tripped)
    assert [%{event_type: "kill_switch"} | _] = KillSwitch.events(agent_id: tripped)

    :ok = Application.stop(:observatory)
    :stopped = :mnesia.stop()
    {:ok, _} = Application.ensure_all_started(:observatory)

    for {id, {agent, events}} <- snapshot do
      assert Agents.get(id) == agent, id
      assert KillSwitch.events(agent_id: id) == events, id
    end

    # Windows are memory only: the tripped agent's starts empty, its record still says why.
    assert Windows.entries(tripped) == nil

    assert KillSwitch.check_request(tripped, %{prompt_hash: 7, tool_signatures: [], stream: false}) ==
             {:error, {:inactive, Agents.get(tripped)}}

    # The HTTP API is back and serves the durable records.
    body = HTTP.get("/api/v1/agents/#{tripped}", HTTP.operator_headers()).body
    assert %{"status_label" => "Deactivated by Kill Switch"} = body

    assert [%{"event_type" => "kill_switch", "details" => %{"threshold" => 1.5}}] =
             body["events"] |> Enum.take(1)
  end

  test "the tables live in <data_dir>/mnesia/<node> as disc copies" do
    dir = Agents.dir()

    assert dir ==
             Path.expand(
               Path.join([
                 Application.fetch_env!(:observatory, :data_dir),
                 "mnesia",
                 to_string(node())
               ])
             )

    assert to_string(:mnesia.system_info(:directory)) == dir
    assert :mnesia.table_info(:schema, :storage_type) == :disc_copies

    for table <- [:observatory_agents, :observatory_agent_events] do
      assert :mnesia.table_info(table, :storage_type) == :disc_copies
    end

    assert File.exists?(Path.join(dir, "schema.DAT"))
  end

  test "a restart of the kill switch supervisor and of the storage (and of Mnesia) loses nothing" do
    {_tripped, snapshot} = populate()

    for child <- [Observatory.KillSwitch.Supervisor, Observatory.Storage],
        do: :ok = Supervisor.terminate_child(Observatory.Supervisor, child)

    :stopped = :mnesia.stop()

    for child <- [Observatory.Storage, Observatory.KillSwitch.Supervisor],
        do: {:ok, _} = Supervisor.restart_child(Observatory.Supervisor, child)

    for {id, {agent, events}} <- snapshot do
      assert Agents.get(id) == agent
      assert KillSwitch.events(agent_id: id) == events
    end
  end
end
