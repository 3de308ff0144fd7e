defmodule Observatory.DataDir do
  @moduledoc """
  The gateway's data directory (`:data_dir`) is its owner's alone, as PostgreSQL
  keeps its own: Mnesia's tables (agents, key hashes, pauses, the audit log), the
  lock and the webhook key live there.

  At start, before anything is read or written there:

    * a directory that does not exist is created with mode `0700`;
    * a directory that other users can read, write or enter (any of the `o=rwx`
      bits) is refused: the application does not start and says which directory,
      its mode and the command that fixes it (`chmod 700 <dir>`);
    * the OS process's umask becomes `077`, so every file and directory created from
      then on is `0600` / `0700`, and files already there (an older release made
      them `0644`) lose their group and other bits.

  This is for a gateway that owns its directory (`:data_dir` set, the standalone
  server). A host application that configured no `:data_dir` keeps Observatory's
  tables in its own Mnesia directory: its permissions and umask stay the host's.
  """

  import Bitwise
  require Logger

  @doc """
  Prepares `:data_dir` as above. `:ok`, or `{:error, message}` when the directory is
  open to other users or cannot be made. Without `:data_dir`, `:ok` and nothing done.
  """
  @spec prepare() :: :ok | {:error, String.t()}
  def prepare do
    case Application.get_env(:observatory, :data_dir) do
      nil ->
        :ok

      dir when is_binary(dir) and dir != "" ->
        prepare(Path.expand(dir))

      other ->
        {:error,
         "expected config :observatory, :data_dir to be a directory's path (a non-empty " <>
           "string), got: #{inspect(other)}"}
    end
  end

  @doc "Prepares `dir` (see the module docs)."
  @spec prepare(String.t()) :: :ok | {:error, String.t()}
  def prepare(dir) do
    with :ok <- ensure_private(dir) do
      Observatory.Native.umask_owner_only()
      restrict_tree(dir)
      :ok
    end
  end

  defp ensure_private(dir) do
    case File.stat(dir) do
      {:ok, %File.Stat{type: :directory, mode: mode}} when (mode &&& 0o007) != 0 ->
        {:error,
         "the data directory #{dir} is open to other users (mode #{octal(mode)}): it holds " <>
           "the agents' key hashes, the audit log and the webhook key. Make it private " <>
           "with `chmod 700 #{dir}` (Observatory refuses to start otherwise, as PostgreSQL does)"}

      {:ok, %File.Stat{type: :directory}} ->
        :ok

      {:ok, %File.Stat{type: type}} ->
        {:error, "the data directory #{dir} is not a directory (#{type})"}

      {:error, :enoent} ->
        create(dir)

      {:error, reason} ->
        {:error, "cannot read the data directory #{dir}: #{:file.format_error(reason)}"}
    end
  end

  defp create(dir) do
    with :ok <- File.mkdir_p(dir),
         :ok <- File.chmod(dir, 0o700) do
      :ok
    else
      {:error, reason} ->
        {:error, "cannot create the data directory #{dir}: #{:file.format_error(reason)}"}
    end
  end

  # Files and directories an older release left readable by group or others.
  defp restrict_tree(path) do
    case File.lstat(path) do
      {:ok, %File.Stat{type: :directory, mode: mode}} ->
        restrict(path, mode, 0o700)

        case File.ls(path) do
          {:ok, names} -> Enum.each(names, &restrict_tree(Path.join(path, &1)))
          {:error, _} -> :ok
        end

      {:ok, %File.Stat{type: :regular, mode: mode}} ->
        restrict(path, mode, 0o600)

      _ ->
        :ok
    end
  end

  defp restrict(path, mode, owner_only) do
    if (mode &&& 0o077) != 0 do
      case File.chmod(path, mode &&& owner_only) do
        :ok -> :ok
        {:error, reason} -> Logger.warning("cannot make #{path} private: #{inspect(reason)}")
      end
    end
  end

  defp octal(mode), do: "0" <> Integer.to_string(mode &&& 0o7777, 8)
end
