defmodule Observatory.StartupErrorTest do
  # Start-up errors a person can act on: the port in use, the data directory held by
  # another gateway, missing secrets. Each case starts a fresh VM (an OS process, as
  # bin/start and a release do) and reads what it prints. Not async: reads the
  # application environment it hands to the VMs.
  use ExUnit.Case, async: false

  alias Observatory.StartupError

  @moduletag timeout: 120_000

  # Starts Observatory in a new VM with the test configuration over `env`, as its own
  # server (its log at :warning and above); returns {output, exit status}. The VM prints
  # "started" and stops when the start succeeds.
  defp start_vm(env, os_env \\ []) do
    dir = Path.join(System.tmp_dir!(), "obs-start-#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf(dir) end)

    config =
      Application.get_all_env(:observatory)
      |> Keyword.merge(data_dir: Path.join(dir, "data"), demo: false, halt_on_start_error: true)
      |> Keyword.put(ObservatoryWeb.Endpoint, server: true, ip: {127, 0, 0, 1}, port: 0)
      |> Keyword.merge(env)

    config_file = Path.join(dir, "config.bin")
    File.write!(config_file, :erlang.term_to_binary(config))

    script = """
    Logger.configure(level: :warning)
    Application.load(:observatory)
    for {k, v} <- :erlang.binary_to_term(File.read!(#{inspect(config_file)})),
        do: Application.put_env(:observatory, k, v)
    case Application.ensure_all_started(:observatory) do
      {:ok, _} -> IO.puts("started"); System.halt(0)
      other -> IO.puts("returned: " <> inspect(other)); System.halt(2)
    end
    """

    paths = Enum.flat_map(:code.get_path(), &["-pa", to_string(&1)])
    os_env = [{"OBSERVATORY_STARTUP_TRACE", nil} | os_env]
    System.cmd("elixir", paths ++ ["-e", script], stderr_to_stdout: true, env: os_env)
  end

  defp lines(output), do: String.split(output, "\n", trim: true)

  describe "the port is in use" do
    test "one line names the port and OBSERVATORY_PORT; exit status 1, no crash report" do
      {:ok, socket} = :gen_tcp.listen(0, ip: {127, 0, 0, 1})
      {:ok, port} = :inet.port(socket)

      {output, status} = start_vm([{ObservatoryWeb.Endpoint, server: true, port: port}])
      :gen_tcp.close(socket)

      assert status == 1

      assert lines(output) == [
               "error: port #{port} on 127.0.0.1 is already in use (another Observatory, " <>
                 "or another program): stop it, or start this one on another port, " <>
                 "e.g. OBSERVATORY_PORT=#{port + 1}"
             ]
    end

    test "OBSERVATORY_STARTUP_TRACE=1 keeps OTP's full reason" do
      {:ok, socket} = :gen_tcp.listen(0, ip: {127, 0, 0, 1})
      {:ok, port} = :inet.port(socket)

      {output, status} =
        start_vm([{ObservatoryWeb.Endpoint, server: true, port: port}], [
          {"OBSERVATORY_STARTUP_TRACE", "1"}
        ])

      :gen_tcp.close(socket)
      assert status == 2
      assert output =~ "port #{port} on 127.0.0.1 is already in use"
      assert output =~ ~s(returned: {:error, {:observatory,)
      assert output =~ ~s({:cannot_listen, "127.0.0.1", #{port}, :eaddrinuse})
    end
  end

  describe "the data directory is locked" do
    test "one line names the directory, the OS process holding it and OBSERVATORY_DATA_DIR" do
      # This test VM's own gateway holds its data directory.
      dir = Observatory.DataDirLock.dir()
      {output, status} = start_vm(data_dir: dir)

      assert status == 1
      assert [line] = lines(output)
      assert line =~ "error: the data directory #{dir} is locked: OS process #{System.pid()} "
      assert line =~ "holds #{dir}/LOCK exclusively: another gateway uses this directory"
      assert String.ends_with?(line, "e.g. OBSERVATORY_DATA_DIR=#{dir}-2")
    end
  end

  describe "missing secrets" do
    test "no operator token and no secret_key_base: it starts, and says once each what to set" do
      {output, 0} = start_vm(operator_tokens: %{}, secret_key_base: nil)
      [token_warning] = Enum.filter(lines(output), &(&1 =~ "no operator token configured"))
      assert token_warning =~ "set OBSERVATORY_OPERATOR_TOKENS=<name>:<token>"
      [key_warning] = Enum.filter(lines(output), &(&1 =~ "no OBSERVATORY_SECRET_KEY_BASE set"))
      assert key_warning =~ "OBSERVATORY_SECRET_KEY_BASE=$(openssl rand -base64 48)"
      assert List.last(lines(output)) == "started"
    end

    test "with both set, neither is said" do
      {output, 0} = start_vm([])
      assert lines(output) == ["started"]
    end
  end

  describe "a bad setting" do
    test "the check's own message is the one line" do
      {output, status} = start_vm(alert_source: :nonsense)
      assert status == 1
      assert [line] = lines(output)
      assert line =~ ~r/^error: .*alert_source/
    end

    test "every other setting the application checks at start: its one line, status 1" do
      for {key, value, named} <- [
            {:budgets, [nope: 1], ":budgets"},
            {:notifications, [max_per_minute: 0], ":notifications"},
            {:guidance, [enabled: :maybe], ":guidance"},
            {:agent_keys, ["shared"], ":agent_keys"},
            {:storage, "no", ":storage"},
            {:auth_throttle, 5, ":auth_throttle"},
            {:kill_switch, %{threshold: 5}, ":kill_switch"},
            {:data_dir, 42, ":data_dir"}
          ] do
        {output, status} = start_vm([{key, value}])
        assert {1, [line]} = {status, lines(output)}, "#{key}: #{output}"
        assert line =~ ~r/^error: .*#{Regex.escape(named)}/
      end
    end
  end

  # The environment variables config/runtime.exs reads, each with a value it refuses
  # and a value it takes. bin/start runs `mix run`, which reads that file before the
  # application loads.
  @env_settings [
                  {"OBSERVATORY_OPERATOR_TOKENS", "alice", "alice:t1"},
                  {"OBSERVATORY_PORT", "http", "4750"},
                  {"OBSERVATORY_IP", "localhost", "127.0.0.1"},
                  {"OBSERVATORY_ALERT_SOURCE", "verdit", "verdict"},
                  {"OBSERVATORY_LLM_TIMEOUT_MS", "-1", "1000"},
                  {"OBSERVATORY_LLM_MAX_STREAM_MS", "1h", "1000"},
                  {"OBSERVATORY_LLM_MAX_REQUEST_BYTES", "32MB", "1000"},
                  {"OBSERVATORY_KILL_SWITCH_PROMPT", "last", "newest_input"},
                  {"OBSERVATORY_KILL_SWITCH_MODE", "block", "warn"},
                  {"OBSERVATORY_GUIDANCE", "maybe", "off"},
                  {"OBSERVATORY_SECRET_KEY_BASE", "short", String.duplicate("k", 32)},
                  {"OBSERVATORY_CLUSTER_DNS_NAMESERVERS", "10.0.0.2:dns", "10.0.0.2:53"}
                ] ++
                  for(
                    # One loop checks all nine cluster timings: its first and last.
                    name <- ~w(POLL VERIFY),
                    do: {"OBSERVATORY_CLUSTER_#{name}_MS", "0", "1000"}
                  )

  # `mix run` as bin/start runs it (without starting the application: the test's own
  # gateway holds the data directory), with `env` over this environment.
  defp mix_run(env) do
    System.cmd(
      "mix",
      ["run", "--no-compile", "--no-deps-check", "--no-start", "-e", ~s[IO.puts("read")]],
      stderr_to_stdout: true,
      env: [{"MIX_ENV", "test"}, {"OBSERVATORY_STARTUP_TRACE", nil} | env]
    )
  end

  describe "a bad environment variable under bin/start (mix run)" do
    test "OBSERVATORY_ALERT_SOURCE=verdit: the documented line alone, no stack trace, status 1" do
      assert mix_run([{"OBSERVATORY_ALERT_SOURCE", "verdit"}]) ==
               {~s(error: OBSERVATORY_ALERT_SOURCE must be "entropy" or "verdict", got: "verdit"\n),
                1}
    end

    test "every variable config/runtime.exs checks: one line naming it, status 1" do
      @env_settings
      |> Task.async_stream(fn {var, bad, _good} -> {var, mix_run([{var, bad}])} end,
        max_concurrency: 2,
        timeout: 60_000
      )
      |> Enum.each(fn {:ok, {var, {output, status}}} ->
        assert {status, [line]} = {status, lines(output)}, "#{var}: #{output}"
        assert status == 1, "#{var}: #{output}"
        assert String.starts_with?(line, "error: #{var}"), "#{var}: #{output}"
      end)
    end

    test "good values of every variable are taken: the run goes on" do
      assert mix_run(for {var, _bad, good} <- @env_settings, do: {var, good}) == {"read\n", 0}
    end

    test "OBSERVATORY_STARTUP_TRACE=1 keeps the exception and its stack trace" do
      {output, status} =
        mix_run([{"OBSERVATORY_ALERT_SOURCE", "verdit"}, {"OBSERVATORY_STARTUP_TRACE", "1"}])

      assert status == 1

      assert output =~
               ~s[** (RuntimeError) OBSERVATORY_ALERT_SOURCE must be "entropy" or "verdict"]

      assert output =~ "Config.Reader.read!"
    end
  end

  describe "StartupError.message/1" do
    test "unwraps OTP's nesting down to the cause" do
      reason =
        {:shutdown,
         {:failed_to_start_child, ObservatoryWeb.Supervisor,
          {:shutdown,
           {:failed_to_start_child, ObservatoryWeb.Endpoint,
            {:cannot_listen, "127.0.0.1", 4000, :eaddrinuse}}}}}

      assert StartupError.message(reason) =~ "port 4000 on 127.0.0.1 is already in use"
      assert StartupError.message(reason) =~ "OBSERVATORY_PORT=4001"
    end

    test "a privileged port, an address not of this machine, a lock that cannot be taken" do
      assert StartupError.message({:cannot_listen, "127.0.0.1", 80, :eacces}) =~
               "ports below 1024 need privileges"

      assert StartupError.message({:cannot_listen, "10.9.9.9", 4000, :eaddrnotavail}) =~
               "set OBSERVATORY_IP"

      assert StartupError.message({:data_dir_lock_failed, "/ro/LOCK", "read-only"}) =~
               "OBSERVATORY_DATA_DIR"
    end

    test "an exception says its own message; anything else is shown, not hidden" do
      assert StartupError.message(%ArgumentError{message: "bad :budgets"}) == "bad :budgets"

      assert StartupError.message(
               {:bad_return, {{M, :start, []}, {:EXIT, {%RuntimeError{message: "x"}, []}}}}
             ) ==
               "x"

      assert StartupError.message(:surprise) == "Observatory could not start: :surprise"
    end
  end
end
