defmodule Observatory.ResilienceTest do
  # Each test runs the whole application on its own :peer node (a second BEAM OS
  # process), started :permanent as a release starts it: a crash that ends that VM
  # fails the test and leaves this one running.
  use ExUnit.Case, async: false

  alias Observatory.Test.Remote

  @moduletag :distributed
  @moduletag timeout: 120_000

  defp start_peer(env \\ [], type \\ :permanent) do
    {:ok, peer, node} =
      :peer.start_link(%{
        name: :"resilience_#{System.unique_integer([:positive])}",
        host: ~c"127.0.0.1",
        longnames: true,
        args: Enum.flat_map(:code.get_path(), &[~c"-pa", &1])
      })

    base =
      Application.get_all_env(:observatory)
      |> Keyword.put(:data_dir, tmp_dir())
      |> Keyword.put(:demo, false)
      |> Keyword.put(ObservatoryWeb.Endpoint, server: true, port: 0)

    on_exit(fn ->
      try do
        :peer.stop(peer)
      catch
        :exit, _ -> :ok
      end
    end)

    {peer, node, :erpc.call(node, Remote, :start_app, [Keyword.merge(base, env), type])}
  end

  defp tmp_dir do
    dir =
      Path.join(System.tmp_dir!(), "observatory-resilience-#{System.unique_integer([:positive])}")

    on_exit(fn -> File.rm_rf(dir) end)
    dir
  end

  defp call(node, m, f, a), do: :erpc.call(node, m, f, a, 10_000)

  # /healthz answers 200 within `ms` (restarts take a moment).
  defp await_restarted(node, name, old_pid, ms \\ 10_000) do
    case call(node, Process, :whereis, [name]) do
      pid when is_pid(pid) and pid != old_pid ->
        pid

      _ when ms > 0 ->
        Process.sleep(50)
        await_restarted(node, name, old_pid, ms - 50)

      other ->
        flunk("#{name} not restarted: #{inspect(other)}")
    end
  end

  defp await_healthy(node, ms \\ 10_000) do
    case call(node, Remote, :get, ["/healthz"]) do
      {200, body} ->
        body

      {status, body} when ms > 0 ->
        Process.sleep(50)
        if ms <= 50, do: flunk("/healthz still #{status}: #{inspect(body)}")
        await_healthy(node, ms - 50)
    end
  end

  describe "finding 10: no single crash or crash burst takes the VM down" do
    for {label, name} <- [
          {"the kill switch supervisor", Observatory.KillSwitch.Supervisor},
          {"the Observatory.PubSub registry", Observatory.PubSub},
          {"the dashboard's pages registry", ObservatoryWeb.Dashboard.Pages},
          {"the entropy tracker", Observatory.Gateway.EntropyTracker}
        ] do
      test "#{label} killed 5 times in a second: the app is still up and serving" do
        {_peer, node, {:ok, _}} = start_peer()
        await_healthy(node)

        killed = call(node, Remote, :kill_repeatedly, [unquote(name), 5])
        assert length(killed) == 5

        # Back, a new process, the application running, every check ok.
        assert call(node, Remote, :await_new, [unquote(name), killed, 5_000]) |> is_pid()
        assert call(node, Remote, :running?, [])
        body = await_healthy(node)
        assert Enum.all?(body["checks"], fn {_, status} -> status == "ok" end), inspect(body)

        # And it works: a DecisionLog goes through the tracker, PubSub and the stores.
        assert {:ok, _, :normal} =
                 call(node, Observatory.Gateway.EntropyTracker, :record_and_score, [
                   "after-burst",
                   {"i", "t", :success},
                   [agent_id: "agent-burst"]
                 ])
      end
    end
  end

  describe "finding 11: /healthz reports each dependency, and Mnesia comes back" do
    test "with Mnesia down /healthz answers 503 naming it; back up, 200" do
      {_peer, node, {:ok, _}} = start_peer()

      assert %{"status" => "ok", "checks" => %{"mnesia" => "ok", "tracker" => "ok"}} =
               await_healthy(node)

      # Keep it down: stop the process that restarts it, then Mnesia.
      :ok =
        call(node, Supervisor, :terminate_child, [Observatory.Supervisor, Observatory.Storage])

      :stopped = call(node, :mnesia, :stop, [])

      assert {503, %{"status" => "degraded", "checks" => checks}} =
               call(node, Remote, :get, ["/healthz"])

      assert checks["mnesia"] == "down"
      assert checks["tracker"] == "ok"

      {:ok, _} =
        call(node, Supervisor, :restart_child, [Observatory.Supervisor, Observatory.Storage])

      assert %{"checks" => %{"mnesia" => "ok"}} = await_healthy(node)
    end

    test "the tracker down: 503 naming it" do
      {_peer, node, {:ok, _}} = start_peer()
      await_healthy(node)
      sup = Observatory.Gateway.Supervisor
      :ok = call(node, Supervisor, :terminate_child, [sup, Observatory.Gateway.EntropyTracker])

      assert {503, %{"checks" => %{"tracker" => "down", "mnesia" => "ok"}}} =
               call(node, Remote, :get, ["/healthz"])
    end

    test ":mnesia_sup killed: Mnesia is started again, and nothing durable is lost" do
      {_peer, node, {:ok, _}} = start_peer()
      await_healthy(node)
      {:ok, _} = call(node, Observatory.Gateway.HITL, :pause, ["s-mnesia", [operator: "op"]])

      mnesia_sup = call(node, Process, :whereis, [:mnesia_sup])
      true = call(node, Process, :exit, [mnesia_sup, :kill])
      # The kill is asynchronous: until Mnesia is running under a new supervisor, a
      # /healthz answer may still be the old Mnesia's, about to stop.
      await_restarted(node, :mnesia_sup, mnesia_sup)

      assert %{"checks" => %{"mnesia" => "ok"}} = await_healthy(node)
      assert call(node, :mnesia, :system_info, [:is_running]) == :yes
      assert call(node, Observatory.Gateway.HITL, :paused?, ["s-mnesia"])
      assert {:ok, _} = call(node, Observatory.KillSwitch.Agents, :fetch_or_register, ["a-1"])
    end
  end

  describe "finding 12: an exclusive lock on the data directory" do
    test "a second gateway on the same data directory refuses to start, with a clear error" do
      dir = tmp_dir()
      {_peer, first, {:ok, _}} = start_peer(data_dir: dir)
      await_healthy(first)
      {:ok, _} = call(first, Observatory.Gateway.HITL, :pause, ["s-lock", [operator: "op"]])

      {_peer, second, result} = start_peer([data_dir: dir], :temporary)

      assert {:error,
              {:observatory,
               {{:shutdown, {:failed_to_start_child, Observatory.DataDirLock, reason}}, _}}} =
               result

      expanded = Path.expand(dir)
      assert {:data_dir_locked, ^expanded, [holder]} = reason
      # The kernel's record of the lock: the first gateway's OS process, exclusively.
      assert %{pid: pid, kind: :exclusive, command: "beam.smp"} = holder
      assert pid == call(first, System, :pid, [])
      refute call(second, Remote, :running?, [])

      # The first one is unaffected.
      assert call(first, Observatory.Gateway.HITL, :paused?, ["s-lock"])
      await_healthy(first)
    end

    test "the lock goes with the gateway: a new one on the directory starts" do
      dir = tmp_dir()
      {peer, _first, {:ok, _}} = start_peer(data_dir: dir)
      :peer.stop(peer)

      {_peer, second, result} = start_peer(data_dir: dir)
      assert {:ok, _} = result
      await_healthy(second)
    end
  end

  describe "finding 6: idle connections do not lock everyone out" do
    # A raw HTTP/1.0 GET on a new connection: the status line, or the error.
    defp raw_get(port, path, timeout \\ 5_000) do
      with {:ok, socket} <-
             :gen_tcp.connect(~c"127.0.0.1", port, [:binary, active: false], timeout),
           :ok <- :gen_tcp.send(socket, "GET #{path} HTTP/1.0\r\nHost: x\r\n\r\n"),
           {:ok, data} <- :gen_tcp.recv(socket, 0, timeout) do
        :gen_tcp.close(socket)
        data |> String.split("\r\n", parts: 2) |> hd()
      end
    end

    defp open_idle(port, n) do
      for _ <- 1..n do
        {:ok, socket} = :gen_tcp.connect(~c"127.0.0.1", port, [:binary, active: false], 5_000)
        socket
      end
    end

    test "2,100 idle connections: /healthz and /login still answer" do
      {_peer, node, {:ok, _}} = start_peer()
      port = call(node, ObservatoryWeb.Endpoint, :port, [])
      sockets = open_idle(port, 2_100)

      # The server took them (MochiWeb's old cap, 2048, is behind us).
      assert wait_until(fn -> call(node, ObservatoryWeb.Endpoint, :connections, []) >= 2_100 end)

      assert raw_get(port, "/healthz") =~ ~r"^HTTP/1.. 200 "
      assert raw_get(port, "/login") =~ ~r"^HTTP/1.. 200 "
      Enum.each(sockets, &:gen_tcp.close/1)
    end

    test "a connection that sends nothing, or headers too slowly, is closed after idle_timeout_ms" do
      endpoint = [server: true, port: 0, idle_timeout_ms: 300]
      {_peer, node, {:ok, _}} = start_peer([{ObservatoryWeb.Endpoint, endpoint}])
      port = call(node, ObservatoryWeb.Endpoint, :port, [])

      [silent, slow] = open_idle(port, 2)
      :ok = :gen_tcp.send(slow, "GET /healthz HTTP/1.1\r\nHost: x\r\n")

      assert {:error, :closed} = :gen_tcp.recv(silent, 0, 3_000)
      assert {:error, :closed} = :gen_tcp.recv(slow, 0, 3_000)
      assert wait_until(fn -> call(node, ObservatoryWeb.Endpoint, :connections, []) == 0 end)

      # A kept-alive connection gets the same time between requests, and a request
      # is answered as usual.
      {:ok, kept} = :gen_tcp.connect(~c"127.0.0.1", port, [:binary, active: false])
      :ok = :gen_tcp.send(kept, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
      assert {:ok, "HTTP/1.1 200 OK" <> _} = :gen_tcp.recv(kept, 0, 3_000)
      assert {:error, :closed} = :gen_tcp.recv(kept, 0, 3_000)
      assert raw_get(port, "/healthz") =~ ~r"^HTTP/1.. 200 "
    end

    test "max_connections caps the open connections" do
      {_peer, node, {:ok, _}} =
        start_peer([
          {ObservatoryWeb.Endpoint, [server: true, port: 0, max_connections: 50, acceptors: 10]}
        ])

      port = call(node, ObservatoryWeb.Endpoint, :port, [])
      sockets = open_idle(port, 80)
      Process.sleep(300)
      assert call(node, ObservatoryWeb.Endpoint, :connections, []) == 50
      Enum.each(sockets, &:gen_tcp.close/1)
    end
  end

  describe "slowloris in the body phase: a body that never arrives is cut off" do
    @login_head "POST /login HTTP/1.1\r\nHost: x\r\n" <>
                  "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\n"

    test "a request whose body never arrives is closed after idle_timeout_ms" do
      endpoint = [server: true, port: 0, idle_timeout_ms: 300]
      {_peer, node, {:ok, _}} = start_peer([{ObservatoryWeb.Endpoint, endpoint}])
      port = call(node, ObservatoryWeb.Endpoint, :port, [])

      {:ok, socket} = :gen_tcp.connect(~c"127.0.0.1", port, [:binary, active: false], 5_000)
      :ok = :gen_tcp.send(socket, @login_head)

      # MochiWeb alone would wait 300 s for the body.
      assert {:error, :closed} = :gen_tcp.recv(socket, 0, 5_000)
      assert wait_until(fn -> call(node, ObservatoryWeb.Endpoint, :connections, []) == 0 end)
    end

    test "a slow but complete body within idle_timeout_ms is read and answered" do
      endpoint = [server: true, port: 0, idle_timeout_ms: 2_000]
      {_peer, node, {:ok, _}} = start_peer([{ObservatoryWeb.Endpoint, endpoint}])
      port = call(node, ObservatoryWeb.Endpoint, :port, [])

      {:ok, socket} = :gen_tcp.connect(~c"127.0.0.1", port, [:binary, active: false], 5_000)
      :ok = :gen_tcp.send(socket, @login_head)
      body = "token=" <> String.duplicate("x", 94)

      for piece <- [binary_part(body, 0, 50), binary_part(body, 50, 50)] do
        Process.sleep(200)
        :ok = :gen_tcp.send(socket, piece)
      end

      # Read, then refused for its missing CSRF token: an answer, not a closed socket.
      assert {:ok, "HTTP/1.1 403 " <> _} = :gen_tcp.recv(socket, 0, 5_000)

      # The deadline was lifted after the body: the connection is kept alive as usual.
      :ok = :gen_tcp.send(socket, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
      assert {:ok, data} = recv_until(socket, "HTTP/1.1 200 ")
      assert data =~ "HTTP/1.1 200 "
    end
  end

  # Data from `socket` until it contains `text`.
  defp recv_until(socket, text, acc \\ "") do
    if acc =~ text do
      {:ok, acc}
    else
      with {:ok, data} <- :gen_tcp.recv(socket, 0, 5_000),
           do: recv_until(socket, text, acc <> data)
    end
  end

  defp wait_until(fun, ms \\ 10_000) do
    cond do
      fun.() -> true
      ms <= 0 -> false
      true -> Process.sleep(50) && wait_until(fun, ms - 50)
    end
  end
end
