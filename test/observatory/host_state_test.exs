defmodule Observatory.HostStateTest do
  # Where a host's Observatory keeps its state, and what it shares with the host: the
  # data directory and a second VM on it (a task beside `mix phx.server`), Mnesia that
  # the host started, and the host's PubSub. Each test starts fresh VMs (:peer) that
  # load none of Observatory's config, as a host's VMs do.
  use ExUnit.Case, async: false

  alias Observatory.Test.{HostPeer, HTTP, Remote}

  @moduletag :distributed

  setup do
    dir = Path.join(System.tmp_dir!(), "observatory-state-#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf!(dir) end)
    %{dir: dir}
  end

  defp peer, do: HostPeer.start()

  defp put_env(node, app \\ :observatory, key, value),
    do: :ok = :erpc.call(node, Application, :put_env, [app, key, value])

  defp start(node), do: :erpc.call(node, Application, :ensure_all_started, [:observatory])

  defp logs, do: Observatory.Test.HostPeer.logs()

  defp await_log(pattern, timeout \\ 5_000) do
    receive do
      {:peer_log, text, _} -> if text =~ pattern, do: text, else: await_log(pattern, timeout)
    after
      timeout -> flunk("no log line matching #{inspect(pattern)}")
    end
  end

  # `fun`'s value once `ok?` holds of it, or its last value after 5 s.
  defp await(fun, ok?, tries \\ 100) do
    value = fun.()

    if ok?.(value) or tries == 0,
      do: ok?.(value),
      else: Process.sleep(50) && await(fun, ok?, tries - 1)
  end

  defp ingest(node, envelope),
    do:
      :erpc.call(node, Remote, :try_call, [
        Observatory.Gateway.SchemaInterceptor,
        :ingest,
        [envelope]
      ])

  defp step(session, n),
    do:
      HTTP.envelope(%{
        "meta" => %{"session_id" => session, "agent_id" => "agent-host", "step_id" => "s#{n}"}
      })

  describe "a task beside a running server: a second VM on the same data directory" do
    test "runs with Observatory's storage off, says why and what to do, and never stops", %{
      dir: dir
    } do
      server = peer()
      put_env(server, :data_dir, dir)
      assert {:ok, _} = start(server)
      assert :erpc.call(server, Observatory.Storage, :mode, []) == :on

      task = peer()
      put_env(task, :data_dir, dir)
      assert {:ok, _} = start(task)

      assert {:off, reason} = :erpc.call(task, Observatory.Storage, :mode, [])
      assert reason =~ "its data directory #{dir} is in use by another VM (OS process "
      warning = await_log("runs with its storage off")
      assert warning =~ "mix phx.server"
      assert warning =~ "OBSERVATORY_STORAGE=off"

      # What needs Observatory says so, with what to do.
      assert {:raised, Observatory.StorageOffError, message} = ingest(task, step("sess-task", 1))
      assert message =~ "Observatory's storage is off in this VM (#{reason})"
      assert message =~ "iex -S mix phx.server"

      assert {:raised, Observatory.StorageOffError, _} =
               :erpc.call(task, Remote, :try_call, [Observatory.AgentKeys, :issue, ["agent-task"]])

      # Reads too (they exited with Mnesia's {:aborted, {:no_exists, _}}, or raised
      # ArgumentError for a store that does not exist here).
      for {module, fun, args} <- [
            {Observatory.KillSwitch, :agent, ["agent-task"]},
            {Observatory.KillSwitch, :agents, []},
            {Observatory.KillSwitch, :events, [[]]},
            {Observatory.KillSwitch, :status, ["agent-task"]},
            {Observatory.Gateway.HITL, :paused?, ["sess-task"]},
            {Observatory.Gateway.HITL, :paused_sessions, []},
            {Observatory.Gateway.HITL, :audit_log, [[]]},
            {Observatory.AgentKeys, :authenticate, ["oak_whatever"]}
          ] do
        assert {:raised, Observatory.StorageOffError, _} =
                 :erpc.call(task, Remote, :try_call, [module, fun, args]),
               "#{inspect(module)}.#{fun}"
      end

      # The task's VM holds nothing: neither the lock nor Mnesia; the server is untouched.
      refute :erpc.call(task, Observatory.DataDirLock, :held?, [])
      assert :erpc.call(task, :mnesia, :system_info, [:is_running]) == :no
      assert {:ok, {:ok, %{entropy_score: 1.0}}} = ingest(server, step("sess-server", 1))
    end

    test "config :observatory, storage: false turns it off without looking at the directory", %{
      dir: dir
    } do
      node = peer()
      put_env(node, :data_dir, dir)
      put_env(node, :storage, false)
      assert {:ok, _} = start(node)

      assert :erpc.call(node, Observatory.Storage, :mode, []) ==
               {:off, "config :observatory, storage: false"}

      refute File.exists?(Path.join(dir, "LOCK"))
      :erpc.call(node, Logger, :flush, [])
      refute Enum.any?(logs(), &(&1 =~ "storage off")), "an explicit switch is not warned about"
    end

    test "Observatory's own server still refuses a directory another gateway uses", %{dir: dir} do
      server = peer()
      put_env(server, :data_dir, dir)
      assert {:ok, _} = start(server)

      second = peer()
      put_env(second, :data_dir, dir)
      put_env(second, ObservatoryWeb.Endpoint, server: true, port: 0)
      assert {:error, reason} = start(second)
      assert inspect(reason) =~ "data_dir_locked"
    end
  end

  describe "Mnesia only in the directory Observatory is given" do
    test "a host that starts :mnesia first: Mnesia moves to that directory; no Mnesia.<node> folder appears",
         %{dir: dir} do
      node = peer()
      cwd = Path.join(dir, "host-app")
      File.mkdir_p!(cwd)
      :ok = :erpc.call(node, File, :cd!, [cwd])
      assert {:ok, [:mnesia]} = :erpc.call(node, Application, :ensure_all_started, [:mnesia])

      put_env(node, :data_dir, Path.join(dir, "data"))
      assert {:ok, _} = start(node)

      expected = Path.join([dir, "data", "mnesia", Atom.to_string(node)])
      assert to_string(:erpc.call(node, :mnesia, :system_info, [:directory])) == expected
      assert File.exists?(Path.join(expected, "schema.DAT"))
      assert File.ls!(cwd) == []
    end

    test "Mnesia the host keeps its own data in, elsewhere: refused, naming both and the setting",
         %{dir: dir} do
      node = peer()
      :ok = :erpc.call(node, File, :cd!, [dir])
      assert {:ok, _} = :erpc.call(node, Application, :ensure_all_started, [:mnesia])
      assert {:atomic, :ok} = :erpc.call(node, :mnesia, :create_table, [:host_cache, []])

      put_env(node, :data_dir, Path.join(dir, "data"))
      assert {:error, reason} = start(node)
      message = inspect(reason)
      assert message =~ "Mnesia runs in #{dir}/Mnesia."
      assert message =~ "set config :mnesia, dir: to one directory for both"
    end
  end

  describe "one PubSub in a host: the host's" do
    test "Observatory starts no bus of its own, and the guides' subscribe example (docs/sending-steps.md) gets alerts through the host's",
         %{dir: dir} do
      node = peer()
      put_env(node, :data_dir, dir)
      put_env(node, :pubsub, {Observatory.PubSub, :host_bus})
      :ok = :erpc.call(node, Remote, :load_fake_host, [:host_bus])
      assert {:ok, started} = :erpc.call(node, Application, :ensure_all_started, [:fake_host])
      assert Enum.take(started, -2) == [:observatory, :fake_host]

      assert :erpc.call(node, Process, :whereis, [Observatory.PubSub]) == nil
      assert :erpc.call(node, Process, :whereis, [:host_bus]) != nil

      :ok =
        :erpc.call(node, Remote, :events_subscribe_and_forward, ["gateway:entropy_alerts", self()])

      assert_receive :subscribed

      for n <- 1..5, do: assert({:ok, {:ok, _}} = ingest(node, step("sess-bus", n)))
      assert_receive {:remote_got, %{event_type: "entropy_alert", session_id: "sess-bus"}}, 5_000
      refute Enum.any?(logs(), &(&1 =~ "no process has that name"))

      # Observatory's own listeners (budgets, notifications) started before the host's
      # bus; they subscribe once it runs.
      for {listener, topics} <- [
            {Observatory.Budget.Server, ["gateway:alerts"]},
            {Observatory.Notifications.Dispatcher, ["gateway:alerts", "gateway:kill_switch"]}
          ] do
        pid = :erpc.call(node, Process, :whereis, [listener])

        assert await(
                 fn -> :erpc.call(node, Registry, :keys, [:host_bus, pid]) end,
                 &(Enum.sort(&1) == topics)
               ),
               inspect(listener)
      end
    end

    test "a name no process has: said once the host has started, with the endpoint's name; steps still answered",
         %{dir: dir} do
      node = peer()
      put_env(node, :data_dir, dir)
      put_env(node, :pubsub, {Observatory.PubSub, :host_buss})

      :ok =
        :erpc.call(node, Remote, :load_fake_host, [
          :host_bus,
          [{FakeHostWeb.Endpoint, [pubsub_server: :host_bus]}]
        ])

      assert {:ok, _} = :erpc.call(node, Application, :ensure_all_started, [:fake_host])

      error = await_log("no process has that name")
      assert error =~ "config :observatory, :pubsub names :host_buss"
      assert error =~ "Name your endpoint's pubsub_server, :host_bus"

      # Ingest answers (its broadcast is dropped and said); a page cannot subscribe.
      assert {:ok, {:ok, %{entropy_score: 1.0}}} = ingest(node, step("sess-nobus", 1))

      assert {:raised, ArgumentError, message} =
               :erpc.call(node, Remote, :try_call, [
                 Observatory.Gateway.Events,
                 :subscribe,
                 ["gateway:topology"]
               ])

      assert message =~ "names :host_buss"

      assert :erpc.call(node, Observatory.Health, :check, []) |> elem(1) |> Map.get("pubsub") ==
               "down"
    end

    test "a module without Phoenix.PubSub's API refuses the start and says why", %{dir: dir} do
      node = peer()
      put_env(node, :data_dir, dir)
      put_env(node, :pubsub, {Enum, MyApp.PubSub})
      assert {:error, reason} = start(node)
      assert inspect(reason) =~ "config :observatory, :pubsub names Enum, which lacks broadcast/3"
    end
  end
end
