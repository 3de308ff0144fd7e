# `mix test` runs with --no-start (mix.exs). Mnesia's schema belongs to the node that
# created it and Mnesia stops working if the node is renamed while it runs, so the node
# gets its distribution name (which the distributed tests need) before the application
# starts Mnesia.
unless Node.alive?() do
  {_, 0} = System.cmd("epmd", ["-daemon"])
  {:ok, _} = :net_kernel.start([:"observatory_test_#{System.pid()}@127.0.0.1", :longnames])
end

# Then what `mix app.start` does: Logger restarts with the test configuration, and the
# application starts.
Logger.App.stop()
{:ok, _} = Application.ensure_all_started(:observatory)

# Fail at once if the NIF did not load: every test below depends on it.
try do
  Observatory.Native.live_stores()
rescue
  error ->
    IO.puts(:stderr, "Observatory's NIF did not load: #{Exception.message(error)}")
    System.halt(1)
end

# :python — the proxy driven by the real openai / anthropic SDKs, from the venv that
# bin/setup makes with OBSERVATORY_PYTHON_TESTS=1 (bin/test includes them).
ExUnit.start(exclude: [:property, :browser, :python])

# The test run's Mnesia directory (config/test.exs) goes when the suite ends.
# The application first: it would start a stopped Mnesia again (Observatory.Storage).
ExUnit.after_suite(fn _ ->
  :ok = Application.stop(:observatory)
  :stopped = :mnesia.stop()
  File.rm_rf!(Application.fetch_env!(:observatory, :data_dir))
end)
