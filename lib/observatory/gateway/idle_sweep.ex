defmodule Observatory.Gateway.IdleSweep do
  @moduledoc false
  # The idle-session policy shared by every per-session store (session log, step
  # detector): how long a session may stay idle, and when to look again.

  @doc "`:entropy_session_ttl_ms`, default 30 minutes."
  def ttl_ms, do: Application.get_env(:observatory, :entropy_session_ttl_ms, :timer.minutes(30))

  @doc "Sends `:sweep` to the caller after `:entropy_sweep_interval_ms` (default 1 minute)."
  def schedule do
    interval = Application.get_env(:observatory, :entropy_sweep_interval_ms, :timer.minutes(1))
    Process.send_after(self(), :sweep, interval)
  end
end
