defmodule Observatory.StartupError do
  @moduledoc """
  Why Observatory did not start, as one line that says what to do.

  A failed start otherwise reaches a person as OTP's nested exit reasons
  (`shutdown: failed to start child: ObservatoryWeb.Supervisor ** (EXIT) …
  {:cannot_listen, "127.0.0.1", 4000, :eaddrinuse}`) and, from a release, a crash
  dump. `message/1` turns each reason we know into a sentence: the port in use, the
  data directory held by another gateway, a lock that cannot be taken, a bad
  setting (the exceptions raised by the start-up checks carry their own sentence).

  When Observatory runs as its own server (`config :observatory,
  halt_on_start_error: true`, set by its own `config/config.exs`: `bin/start`, a
  release) the line is printed on standard error and the VM ends with status 1,
  nothing else. `OBSERVATORY_STARTUP_TRACE=1` keeps OTP's full report instead. A bad
  environment variable is found earlier, by `config/runtime.exs`, which ends the start
  the same way (one `error:` line, status 1) before this module can run. In a
  host application the error is logged as the same line and returned to the host's
  supervisor unchanged.
  """

  require Logger

  @doc "Whether a failed start prints its line and ends the VM (see the module doc)."
  @spec halt?() :: boolean()
  def halt? do
    Application.get_env(:observatory, :halt_on_start_error, false) == true and
      System.get_env("OBSERVATORY_STARTUP_TRACE") in [nil, "", "0", "false"]
  end

  @doc """
  One line for a start-up failure: an exit reason from the supervision tree, or an
  exception raised while starting.
  """
  @spec message(term()) :: String.t()
  def message(%{__exception__: true} = exception), do: Exception.message(exception)

  def message({:cannot_listen, ip, port, :eaddrinuse}) do
    "port #{port} on #{ip} is already in use (another Observatory, or another program): " <>
      "stop it, or start this one on another port, e.g. OBSERVATORY_PORT=#{next_port(port)}"
  end

  def message({:cannot_listen, ip, port, :eacces}) do
    "no permission to listen on #{ip} port #{port} (ports below 1024 need privileges): " <>
      "choose another port with OBSERVATORY_PORT, e.g. OBSERVATORY_PORT=4000"
  end

  def message({:cannot_listen, ip, port, :eaddrnotavail}) do
    "cannot listen on #{ip} port #{port}: #{ip} is not an address of this machine; " <>
      "set OBSERVATORY_IP to one of its addresses (127.0.0.1 is the default)"
  end

  def message({:cannot_listen, ip, port, reason}) do
    "cannot listen on #{ip} port #{port} (#{:inet.format_error(reason)}): " <>
      "check OBSERVATORY_IP and OBSERVATORY_PORT"
  end

  # `holders`: the OS processes the kernel lists for the lock (Observatory.DataDirLock).
  def message({:data_dir_locked, dir, holders}) when is_list(holders) do
    "the data directory #{dir} is locked: #{Observatory.DataDirLock.describe(holders, dir)}; " <>
      "stop it, or give this one its own directory, e.g. OBSERVATORY_DATA_DIR=#{dir}-2"
  end

  # A data directory other users could read (Observatory.DataDir): its own sentence.
  def message({:data_dir_refused, message}) when is_binary(message), do: message

  def message({:data_dir_lock_failed, path, reason}) do
    "cannot lock #{path} (#{reason}): make the data directory writable, or choose another " <>
      "with OBSERVATORY_DATA_DIR"
  end

  # OTP's wrappings, outermost first: the cause is the innermost reason.
  def message({:shutdown, {:failed_to_start_child, _child, reason}}), do: message(reason)
  def message({:failed_to_start_child, _child, reason}), do: message(reason)
  def message({:shutdown, reason}) when reason != :normal, do: message(reason)
  def message({:bad_return, {_mfa, {:EXIT, reason}}}), do: message(reason)
  def message({:EXIT, reason}), do: message(reason)

  def message({%{__exception__: true} = exception, stack}) when is_list(stack),
    do: message(exception)

  def message(other), do: "Observatory could not start: " <> inspect(other, limit: 20)

  @doc """
  Reports a failed start: when `halt?/0`, prints `message(reason)` on standard error
  and ends the VM with status 1; otherwise logs the line and returns `{:error, reason}`
  for the caller to return.
  """
  @spec report(term()) :: {:error, term()}
  def report(reason) do
    line = message(reason)

    if halt?() do
      IO.puts(:stderr, "error: " <> line)
      System.halt(1)
    else
      Logger.error(line)
      {:error, reason}
    end
  end

  defp next_port(port) when is_integer(port) and port > 0 and port < 65_535, do: port + 1
  defp next_port(_port), do: 4001
end
