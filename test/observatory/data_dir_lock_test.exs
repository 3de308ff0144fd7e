defmodule Observatory.DataDirLockTest do
  # Reads and changes the application's :data_dir: not async.
  use ExUnit.Case, async: false

  alias Observatory.{DataDirLock, Native}

  describe "finding 12: an exclusive lock on the data directory" do
    test "the running application holds <data_dir>/LOCK; a second lock on it is refused" do
      dir = DataDirLock.dir()
      assert dir == Path.expand(Application.fetch_env!(:observatory, :data_dir))
      assert DataDirLock.held?()
      assert File.read!(DataDirLock.path(dir)) == "#{System.pid()}\n"
      assert Native.data_dir_lock(DataDirLock.path(dir)) == {:error, :locked}
    end

    test "a lock is released with its resource, and can be taken again" do
      path =
        Path.join(System.tmp_dir!(), "observatory-lock-#{System.unique_integer([:positive])}")

      on_exit(fn -> File.rm(path) end)

      assert {:ok, lock} = Native.data_dir_lock(path)
      assert {:error, :locked} = Native.data_dir_lock(path)
      assert Native.data_dir_unlock(lock)
      refute Native.data_dir_unlock(lock)
      assert {:ok, _again} = Native.data_dir_lock(path)
    end

    test "a host app with no :data_dir locks the Mnesia directory it configured" do
      saved = Application.fetch_env!(:observatory, :data_dir)
      on_exit(fn -> Application.put_env(:observatory, :data_dir, saved) end)
      Application.delete_env(:observatory, :data_dir)

      assert DataDirLock.dir() == Path.expand(to_string(Application.fetch_env!(:mnesia, :dir)))
    end
  end
end
