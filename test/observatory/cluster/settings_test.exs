defmodule Observatory.Cluster.SettingsTest do
  # Every cluster setting has an environment variable; crash dumps go to the data
  # directory; a node that cannot load its tables says why and what to do; the
  # tombstone table stays bounded. Environment variables are global: not async.
  use ExUnit.Case, async: false

  alias Observatory.Cluster.{Store, Tombstones}

  @timings %{
    "OBSERVATORY_CLUSTER_POLL_MS" => :poll_ms,
    "OBSERVATORY_CLUSTER_RPC_TIMEOUT_MS" => :rpc_timeout_ms,
    "OBSERVATORY_CLUSTER_JOIN_TIMEOUT_MS" => :join_timeout_ms,
    "OBSERVATORY_CLUSTER_HEARTBEAT_MS" => :heartbeat_ms,
    "OBSERVATORY_CLUSTER_MEMBER_TIMEOUT_MS" => :member_timeout_ms,
    "OBSERVATORY_CLUSTER_WRITE_TIMEOUT_MS" => :write_timeout_ms,
    "OBSERVATORY_CLUSTER_HEAL_TIMEOUT_MS" => :heal_timeout_ms,
    "OBSERVATORY_CLUSTER_LOAD_TIMEOUT_MS" => :load_timeout_ms,
    "OBSERVATORY_CLUSTER_VERIFY_MS" => :verify_ms
  }

  defp with_env(vars, fun) do
    for {k, v} <- vars, do: System.put_env(k, v)

    try do
      fun.()
    after
      for {k, _} <- vars, do: System.delete_env(k)
    end
  end

  defp runtime_cluster do
    "config/runtime.exs" |> Config.Reader.read!(env: :prod) |> get_in([:observatory, :cluster])
  end

  describe "every cluster setting has an environment variable" do
    test "each timing, the members, the DNS name, basename and resolvers are read from the environment" do
      timings =
        for {{env, _key}, i} <- Enum.with_index(@timings), into: %{}, do: {env, "#{1000 + i}"}

      vars =
        Map.merge(timings, %{
          "OBSERVATORY_CLUSTER_NODES" => "obs@10.0.0.1,obs@10.0.0.2",
          "OBSERVATORY_CLUSTER_DNS" => "observatory.internal",
          "OBSERVATORY_CLUSTER_BASENAME" => "obs",
          "OBSERVATORY_CLUSTER_DNS_NAMESERVERS" => "10.0.0.2:5353,10.0.0.3"
        })

      cluster = with_env(vars, &runtime_cluster/0)

      for {env, key} <- @timings, do: assert(cluster[key] == String.to_integer(timings[env]))
      assert cluster[:nodes] == [:"obs@10.0.0.1", :"obs@10.0.0.2"]
      assert cluster[:dns] == "observatory.internal"
      assert cluster[:dns_basename] == "obs"
      assert cluster[:dns_nameservers] == [{{10, 0, 0, 2}, 5353}, {{10, 0, 0, 3}, 53}]
    end

    test "a value that is not a positive number of milliseconds is refused at start, naming the variable" do
      for bad <- ["0", "-5", "3s", ""] do
        error =
          assert_raise RuntimeError, fn ->
            with_env(%{"OBSERVATORY_CLUSTER_MEMBER_TIMEOUT_MS" => bad}, &runtime_cluster/0)
          end

        assert error.message =~ "OBSERVATORY_CLUSTER_MEMBER_TIMEOUT_MS must be a positive number"
      end

      assert_raise RuntimeError, ~r/is not <ip>\[:port\]/, fn ->
        with_env(%{"OBSERVATORY_CLUSTER_DNS_NAMESERVERS" => "ns.example"}, &runtime_cluster/0)
      end
    end

    test "unset, nothing is configured (the defaults of Observatory.Cluster apply)" do
      assert runtime_cluster() == nil
      assert Observatory.Cluster.setting(:member_timeout_ms) == 3_000
      assert Observatory.Cluster.setting(:poll_ms) == 2_000
    end
  end

  describe "crash dumps go to the data directory" do
    test "the release's environment script points ERL_CRASH_DUMP into OBSERVATORY_DATA_DIR, unless it is set" do
      dir = Path.join(System.tmp_dir!(), "obs-crash-#{System.unique_integer([:positive])}")
      on_exit(fn -> File.rm_rf!(dir) end)
      # The umask a shell usually has (the test VM's own is 077).
      script = "umask 022; . rel/env.sh.eex; echo \"$ERL_CRASH_DUMP\""

      {out, 0} =
        System.cmd("sh", ["-c", script],
          env: [{"OBSERVATORY_DATA_DIR", dir}, {"ERL_CRASH_DUMP", nil}]
        )

      assert String.trim(out) == Path.join(dir, "erl_crash.dump")
      assert File.dir?(dir)
      # Made private, or the gateway would refuse the directory it was just given.
      assert Bitwise.band(File.stat!(dir).mode, 0o777) == 0o700

      {out, 0} =
        System.cmd("sh", ["-c", script],
          env: [{"OBSERVATORY_DATA_DIR", dir}, {"ERL_CRASH_DUMP", "/elsewhere/dump"}]
        )

      assert String.trim(out) == "/elsewhere/dump"
    end

    test "bin/start and bin/cluster set it to the data directory" do
      assert File.read!("bin/start") =~
               ~s(ERL_CRASH_DUMP=${ERL_CRASH_DUMP:-$data_dir/erl_crash.dump})

      assert File.read!("bin/cluster") =~ ~s(ERL_CRASH_DUMP=$dir/erl_crash.dump)
    end

    test "bin/start makes a new data directory private, as the gateway requires" do
      dir = Path.join(System.tmp_dir!(), "obs-start-#{System.unique_integer([:positive])}")
      on_exit(fn -> File.rm_rf!(dir) end)
      [mkdir] = Regex.run(~r/^\(umask 077 && mkdir -p "\$data_dir"\)$/m, File.read!("bin/start"))
      {_, 0} = System.cmd("bash", ["-c", "umask 022; data_dir=$1; " <> mkdir, "_", dir])
      assert Bitwise.band(File.stat!(dir).mode, 0o777) == 0o700
    end
  end

  describe "a node that cannot load its tables says why and what to do" do
    test "the error names the tables, where their copies are, and the way out" do
      # Waits :load_timeout_ms (30 s by default) before it gives up.
      Application.put_env(:observatory, :cluster, load_timeout_ms: 300)
      on_exit(fn -> Application.delete_env(:observatory, :cluster) end)

      error =
        assert_raise RuntimeError, fn ->
          Store.await_tables([:observatory_no_such_table])
        end

      assert error.message =~
               "Mnesia tables [:observatory_no_such_table] did not load on #{node()}"

      assert error.message =~ "start a node that has one"
      assert error.message =~ "move #{:mnesia.system_info(:directory)} aside"
    end

    test "tables that load are waited for and nothing is said" do
      assert Store.await_tables([:observatory_agents, :observatory_hitl_pauses]) == :ok
    end
  end

  describe "tombstones stay bounded" do
    test "prune/1 deletes the oldest beyond the cap and keeps the newest" do
      table = Tombstones.table()
      keys = for i <- 1..5, do: {:observatory_prune_test, "k#{i}", :revoked}
      for {key, i} <- Enum.with_index(keys), do: :ok = :mnesia.dirty_write({table, key, i})
      on_exit(fn -> for key <- keys, do: :mnesia.dirty_delete(table, key) end)

      # Clustering is off here: nothing else writes tombstones.
      assert :mnesia.table_info(table, :size) == 5
      assert Tombstones.prune(3) == 2
      refute Tombstones.buried?(:observatory_prune_test, "k1", :revoked)
      refute Tombstones.buried?(:observatory_prune_test, "k2", :revoked)
      assert Tombstones.buried?(:observatory_prune_test, "k5", :revoked)
      assert Tombstones.any_buried?(:observatory_prune_test, "k3")
      assert Tombstones.prune(3) == 0
    end
  end
end
