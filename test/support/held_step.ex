defmodule Observatory.Test.HeldStep do
  @moduledoc false
  # A dispatcher for Observatory.Telemetry that holds the process scoring one session's
  # step (at its `[:observatory, :entropy, :score]` event: the window has it already)
  # until released: a slow owner, for the cluster tests. Set on a node with
  # `hold/1`, let go with `release/0`; it gives up on its own after 10 s.

  @session {__MODULE__, :session}
  @released {__MODULE__, :released}

  def hold(session_id) do
    :persistent_term.put(@released, false)
    :persistent_term.put(@session, session_id)
    Observatory.Telemetry.put_dispatcher(__MODULE__)
  end

  def release, do: :persistent_term.put(@released, true)

  def execute([:observatory, :entropy, :score], _measurements, %{session_id: session_id}) do
    if session_id == :persistent_term.get(@session, nil), do: wait(2_000)
    :ok
  end

  def execute(_event, _measurements, _metadata), do: :ok

  defp wait(0), do: :ok

  defp wait(tries) do
    unless :persistent_term.get(@released, true) do
      Process.sleep(5)
      wait(tries - 1)
    end
  end
end
