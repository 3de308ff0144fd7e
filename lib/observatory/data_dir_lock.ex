defmodule Observatory.DataDirLock do
  @moduledoc """
  One gateway per data directory: an exclusive OS lock (`flock`) on
  `<:data_dir>/LOCK` (in a host app with no `:data_dir`, `LOCK` in its Mnesia
  directory), taken before anything else starts and held while the application runs.

  A second gateway on the same directory — another OS process, a node with another
  name, a second application in the same VM — does not get the lock and refuses to
  start with `{:data_dir_locked, dir, holders}`, which `Observatory.StartupError` says
  as one line naming the directory and what holds the lock: the OS processes the
  kernel lists for the file (`holders/1`), and whether each is a gateway (an
  exclusive lock) or some other program holding a shared one. Two writers on one Mnesia directory otherwise both
  acknowledge writes, and after a restart half of them are gone. The directory is its
  owner's alone (`Observatory.DataDir`), so another local user cannot open the file
  to lock it.

  The kernel releases the lock when the OS process ends, however it ends (`kill -9`
  too): a stale lock file never keeps a gateway from starting.

  In a host app (Observatory's own server off), a second VM on the directory — a
  `mix run` beside `mix phx.server` — is not refused: it finds the lock taken
  (`probe/1`) and runs with Observatory's storage off (`Observatory.Storage.decide/0`).
  """

  use GenServer
  import Bitwise

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
        {:locked, who(dir)}

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

      # Said to the person starting it by Observatory.StartupError.
      {:error, :locked} ->
        {:stop, {:data_dir_locked, dir, holders(path(dir))}}

      {:error, message} ->
        {:stop, {:data_dir_lock_failed, path(dir), message}}
    end
  end

  @typedoc "An OS process holding a lock on the file: `shared` locks are not a gateway's."
  @type holder :: %{pid: String.t(), kind: :exclusive | :shared, command: String.t() | nil}

  @doc """
  The OS processes holding a lock on `path`, from the kernel's lock table
  (`/proc/locks`, Linux): their PID, command and whether the lock is shared. A
  gateway takes exclusive locks; a shared one is some other program's (a local user's
  `flock -s`). Empty where the kernel does not say.
  """
  @spec holders(String.t()) :: [holder()]
  def holders(path) do
    with {:ok, %File.Stat{inode: inode, major_device: dev}} <- File.stat(path),
         {:ok, table} <- File.read("/proc/locks") do
      id = lock_id(dev, inode)

      for line <- String.split(table, "\n", trim: true),
          # `1: FLOCK  ADVISORY  WRITE 4242 08:01:1234567 0 EOF` (`->` marks a waiter)
          [_, kind, pid, ^id] <-
            [Regex.run(~r/^\d+:\s+(?!->)\S+\s+\S+\s+(READ|WRITE)\s+(\d+)\s+(\S+)/, line)],
          uniq: true do
        %{
          pid: pid,
          kind: if(kind == "WRITE", do: :exclusive, else: :shared),
          command: command(pid)
        }
      end
    else
      _ -> []
    end
  end

  # The kernel's `major:minor:inode` (hex, hex, decimal) of a file on device `dev`.
  defp lock_id(dev, inode) do
    major = (dev >>> 8 &&& 0xFFF) ||| (dev >>> 32 &&& ~~~0xFFF)
    minor = (dev &&& 0xFF) ||| (dev >>> 12 &&& ~~~0xFF)
    hex = &(&1 |> Integer.to_string(16) |> String.downcase() |> String.pad_leading(2, "0"))
    "#{hex.(major)}:#{hex.(minor)}:#{inode}"
  end

  defp command(pid) do
    case File.read("/proc/#{pid}/comm") do
      {:ok, name} -> String.trim(name)
      {:error, _} -> nil
    end
  end

  @doc """
  What holds the lock of `dir`, in words, from `holders/1`'s list: for the one line a
  refused start prints (`Observatory.StartupError`).
  """
  @spec describe([holder()], String.t()) :: String.t()
  def describe([], dir) do
    case File.read(path(dir)) do
      {:ok, text} when text != "" ->
        "another process holds #{path(dir)} (the last gateway to hold it wrote OS " <>
          "process #{String.trim(text)} there, which may be gone)"

      _ ->
        "another process holds #{path(dir)}"
    end
  end

  def describe(holders, dir) do
    Enum.map_join(holders, "; ", fn
      %{kind: :exclusive} = h ->
        "OS process #{h.pid}#{named(h)} holds #{path(dir)} exclusively: another gateway " <>
          "uses this directory"

      %{kind: :shared} = h ->
        "OS process #{h.pid}#{named(h)} holds a shared lock on #{path(dir)}: not a " <>
          "gateway (they lock exclusively) but another program, which a private data " <>
          "directory (chmod 700) keeps out"
    end)
  end

  # Short, for a message that says the rest: which OS processes hold the lock.
  defp who(dir) do
    case holders(path(dir)) do
      # The kernel does not say: the PID the last gateway wrote, if any.
      [] ->
        case File.read(path(dir)) do
          {:ok, text} when text != "" -> "OS process #{String.trim(text)}"
          _ -> "another OS process"
        end

      holders ->
        Enum.map_join(holders, ", ", &"OS process #{&1.pid}#{named(&1)}")
    end
  end

  defp named(%{command: nil}), do: ""
  defp named(%{command: command}), do: " (#{command})"

  @impl true
  def handle_call(:held?, _from, state), do: {:reply, true, state}

  @impl true
  def terminate(_reason, %{lock: lock}), do: Native.data_dir_unlock(lock)
end
