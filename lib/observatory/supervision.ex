defmodule Observatory.Supervision do
  @moduledoc """
  Restarting a killed supervisor without tripping over its orphans.

  When a supervisor is killed (`Process.exit(pid, :kill)`, an operator in a remote
  shell, a bug), its children receive the exit signal but finish on their own time:
  a child that traps exits (a `Registry` partition, a nested supervisor shutting down
  its own workers) still holds its registered name for a moment. The parent restarts
  the supervisor at once, its `init/1` starts the same named children, each start
  fails with `already_started`, the parent retries at once, and a handful of such
  failures in microseconds use up the parent's restart intensity: the failure climbs
  to the application, and a permanent application ends the VM.

  `child_spec/1` wraps a supervisor's child spec so that its start first waits for
  the names its previous instance held (every registered process of its subtree,
  recorded after each start) to be released, for at most `:await_ms` (default 10 s),
  then starts it.

      children = [Observatory.Supervision.child_spec(Observatory.Gateway.Supervisor)]
  """

  @await_ms 10_000

  @doc "Wraps a child spec (module, `{module, arg}` or map) as described above."
  @spec child_spec(Supervisor.child_spec() | module() | {module(), term()}, keyword()) ::
          Supervisor.child_spec()
  def child_spec(spec, opts \\ []) do
    %{id: id, start: start} = spec = Supervisor.child_spec(spec, [])
    await_ms = Keyword.get(opts, :await_ms, @await_ms)
    %{spec | start: {__MODULE__, :start_link, [id, start, await_ms]}}
  end

  @doc false
  def start_link(id, {module, fun, args}, await_ms) do
    # Keyed by the parent too: two supervisors may use the same child id.
    key = {__MODULE__, Process.info(self(), :registered_name), id}
    deadline = System.monotonic_time(:millisecond) + await_ms
    for name <- :persistent_term.get(key, []), do: await_free(name, deadline)

    with {:ok, pid} = ok <- apply(module, fun, args) do
      :persistent_term.put(key, registered_names(pid))
      ok
    end
  end

  @doc "The registered names of supervisor `pid` and of every process in its subtree."
  @spec registered_names(pid()) :: [atom()]
  def registered_names(pid) when is_pid(pid) do
    children =
      try do
        Supervisor.which_children(pid)
      catch
        :exit, _ -> []
      end

    name(pid) ++
      Enum.flat_map(children, fn
        {_, child, :supervisor, _} when is_pid(child) -> registered_names(child)
        {_, child, :worker, _} when is_pid(child) -> name(child)
        _ -> []
      end)
  end

  defp name(pid) do
    case Process.info(pid, :registered_name) do
      {:registered_name, name} when is_atom(name) -> [name]
      _ -> []
    end
  end

  defp await_free(name, deadline) do
    case Process.whereis(name) do
      nil ->
        :ok

      pid when pid == self() ->
        :ok

      pid ->
        ref = Process.monitor(pid)
        timeout = max(deadline - System.monotonic_time(:millisecond), 0)

        receive do
          {:DOWN, ^ref, :process, _, _} -> :ok
        after
          timeout -> Process.demonitor(ref, [:flush])
        end
    end
  end
end
