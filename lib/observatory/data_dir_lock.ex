defmodule Observatory.DataDirLock do
  @moduledoc """
  One gateway per data directory: an exclusive OS lock (`flock`) on
  `<:data_dir>/LOCK` (in a host app with no `:data_dir`, `LOCK` in its Mnesia
  directory), taken before anything else starts and held while the application runs.

  A second gateway on the same directory — another OS process, a node with another
  name, a second application in the same VM — does not get the lock and refuses to
  start with `{:data_dir_locked, dir, holder}` and an error in the log that names the
  directory and the OS process holding it. Two writers on one Mnesia directory
  otherwise both acknowledge writes, and after a restart half of them are gone.

  The kernel releases the lock when the OS process ends, however it ends (`kill -9`
  too): a stale lock file never keeps a gateway from starting.

  In a host app (Observatory's own server off), a second VM on the directory — a
  `mix run` beside `mix phx.server` — is not refused: it finds the lock taken
  (`probe/1`) and runs with Observatory's storage off (`Observatory.Storage.decide/0`).
  """

  use GenServer
  require Logger

  alias Observatory.Native

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc "The lock file of a data directory."
  @spec path(String.t()) :: String.t()
  def path(dir), do: Path.join(dir, "LOCK")

  @doc """
  The directory locked: `:data_dir`, or when a host app configured none, the Mnesia
  directory it set (`Observatory.KillSwitch.Agents.dir/0`, which raises when there
  is neither).
  """
  @spec dir() :: String.t()
  def dir do
    case Application.get_env(:observatory, :data_dir) do
      nil -> Observatory.KillSwitch.Agents.dir()
      data_dir -> Path.expand(data_dir)
    end
  end

  @doc """
  `:free` when no other OS process holds the lock of `dir` (tried and let go at once),
  else `{:locked, who}`, `who` saying which process holds it.
  """
  @spec probe(String.t()) :: :free | {:locked, String.t()}
  def probe(dir) do
    File.mkdir_p!(dir)

    case Native.data_dir_lock(path(dir)) do
      {:ok, lock} ->
        Native.data_dir_unlock(lock)
        :free

      {:error, :locked} ->
        {:locked, "OS process #{holder(dir)}"}

      {:error, _message} ->
        # Not ours to judge here: the lock's own start says what is wrong.
        :free
    end
  end

  @doc "Whether this application holds the lock."
  @spec held?() :: boolean()
  def held? do
    case Process.whereis(__MODULE__) do
      nil -> false
      pid -> GenServer.call(pid, :held?)
    end
  catch
    :exit, _ -> false
  end

  @impl true
  def init(_opts) do
    # terminate/2 releases the lock at once when the application stops.
    Process.flag(:trap_exit, true)
    dir = dir()
    File.mkdir_p!(dir)
    acquire(dir, 5)
  end

  # A restarted lock process may find the lock of its killed predecessor not yet
  # released (the resource goes when the dead process's heap does): try a few times.
  defp acquire(dir, tries) do
    case Native.data_dir_lock(path(dir)) do
      {:ok, lock} ->
        {:ok, %{dir: dir, lock: lock}}

      {:error, :locked} when tries > 1 ->
        Process.sleep(100)
        acquire(dir, tries - 1)

      {:error, :locked} ->
        holder = holder(dir)

        Logger.error(
          "the data directory #{dir} is in use by another Observatory (OS process #{holder} " <>
            "holds #{path(dir)}): stop it, or give this one another :data_dir"
        )

        {:stop, {:data_dir_locked, dir, holder}}

      {:error, message} ->
        {:stop, {:data_dir_lock_failed, path(dir), message}}
    end
  end

  defp holder(dir) do
    case File.read(path(dir)) do
      {:ok, text} -> String.trim(text)
      {:error, _} -> "unknown"
    end
  end

  @impl true
  def handle_call(:held?, _from, state), do: {:reply, true, state}

  @impl true
  def terminate(_reason, %{lock: lock}), do: Native.data_dir_unlock(lock)
end
