defmodule Observatory.DataDirTest do
  # Reads the application's data directory and starts gateways on :peer nodes.
  use ExUnit.Case, async: false

  import Bitwise

  alias Observatory.{DataDir, DataDirLock}
  alias Observatory.Test.Remote

  defp tmp_dir(mode) do
    dir =
      Path.join(System.tmp_dir!(), "observatory-datadir-#{System.unique_integer([:positive])}")

    File.mkdir_p!(dir)
    File.chmod!(dir, mode)
    on_exit(fn -> File.rm_rf(dir) end)
    dir
  end

  defp mode(path), do: File.stat!(path).mode &&& 0o777

  describe "finding 8: the data directory is its owner's alone" do
    test "the running gateway's directory is 0700, its files 0600" do
      dir = DataDirLock.dir()
      assert mode(dir) == 0o700
      assert mode(DataDirLock.path(dir)) == 0o600

      files = Path.wildcard(Path.join(dir, "**/*"), match_dot: true)
      assert Enum.any?(files, &String.ends_with?(&1, ".DAT")), "Mnesia's tables are there"

      for path <- files do
        expected = if File.dir?(path), do: 0o700, else: 0o600
        assert mode(path) == expected, "#{path} is #{Integer.to_string(mode(path), 8)}"
      end
    end

    test "a directory other users can read is refused with the command that fixes it" do
      dir = tmp_dir(0o755)
      assert {:error, message} = DataDir.prepare(dir)
      assert message =~ "#{dir} is open to other users (mode 0755)"
      assert message =~ "chmod 700 #{dir}"
      assert mode(dir) == 0o755, "refused, not changed behind the operator's back"

      File.chmod!(dir, 0o750)
      assert DataDir.prepare(dir) == :ok
    end

    test "a new directory is made 0700; files an older release left 0644 become 0600" do
      parent = tmp_dir(0o700)
      dir = Path.join(parent, "new/data")
      assert DataDir.prepare(dir) == :ok
      assert mode(dir) == 0o700

      old = Path.join(dir, "mnesia/old.DAT")
      File.mkdir_p!(Path.dirname(old))
      File.chmod!(Path.dirname(old), 0o755)
      File.write!(old, "x")
      File.chmod!(old, 0o644)
      assert DataDir.prepare(dir) == :ok
      assert mode(old) == 0o600
      assert mode(Path.dirname(old)) == 0o700
    end
  end

  describe "finding 8: what holds the LOCK file is named" do
    test "a shared lock held by another program is named with its PID and command" do
      dir = tmp_dir(0o700)
      lock = DataDirLock.path(dir)
      File.write!(lock, "4242424\n")
      holder = hold_shared_lock(lock)

      assert [%{kind: :shared, pid: pid, command: "flock"}] = await_holders(lock)
      assert pid == holder
    end

    @tag :distributed
    test "a gateway refused by it says which process holds the lock, not a stale PID" do
      dir = tmp_dir(0o700)
      lock = DataDirLock.path(dir)
      File.write!(lock, "4242424\n")
      holder = hold_shared_lock(lock)
      [_] = await_holders(lock)

      # A gateway (its own server on): a host app's VM would run with storage off.
      assert {:error, reason} =
               start_peer_app([{:data_dir, dir}, {ObservatoryWeb.Endpoint, server: true, port: 0}])

      text = inspect(reason)
      assert text =~ ":data_dir_locked"
      assert text =~ ~s(pid: "#{holder}")
      assert text =~ "kind: :shared"
      refute text =~ "4242424"
    end

    @tag :distributed
    test "a gateway refuses to start on a world-readable directory, saying why" do
      dir = tmp_dir(0o755)
      assert {:error, reason} = start_peer_app(data_dir: dir)
      assert inspect(reason) =~ "chmod 700 #{dir}"
      refute File.exists?(DataDirLock.path(dir)), "nothing was written there"
    end
  end

  # `flock -s` holding a shared lock from another OS process; returns its PID (`-o`:
  # only flock itself holds it, not the command it waits for).
  defp hold_shared_lock(path) do
    port =
      Port.open({:spawn_executable, System.find_executable("flock")}, [
        :binary,
        args: ["-s", "-o", path, "sleep", "30"]
      ])

    {:os_pid, os_pid} = Port.info(port, :os_pid)
    on_exit(fn -> System.cmd("kill", [Integer.to_string(os_pid)]) end)
    Integer.to_string(os_pid)
  end

  defp await_holders(path, tries \\ 100) do
    case DataDirLock.holders(path) do
      [] when tries > 0 ->
        Process.sleep(10)
        await_holders(path, tries - 1)

      holders ->
        holders
    end
  end

  defp start_peer_app(env) do
    {:ok, peer, node} =
      :peer.start_link(%{
        name: :"datadir_#{System.unique_integer([:positive])}",
        host: ~c"127.0.0.1",
        longnames: true,
        args: Enum.flat_map(:code.get_path(), &[~c"-pa", &1])
      })

    on_exit(fn ->
      try do
        :peer.stop(peer)
      catch
        :exit, _ -> :ok
      end
    end)

    base =
      Application.get_all_env(:observatory)
      |> Keyword.put(:demo, false)
      |> Keyword.put(ObservatoryWeb.Endpoint, server: false)

    :erpc.call(node, Remote, :start_app, [Keyword.merge(base, env), :temporary], 30_000)
  end
end
