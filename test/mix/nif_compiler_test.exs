defmodule Observatory.NifCompilerTest do
  # The NIF's compiler as a host app meets it: on a machine without cargo, the error
  # says what to install. (It said "run bin/setup first", a script of Observatory's
  # own repository that a host app's developer does not run.)
  use ExUnit.Case, async: false

  @tag :tmp_dir
  test "without cargo on PATH: what to install, not Observatory's own setup script", %{
    tmp_dir: dir
  } do
    File.mkdir_p!(Path.join(dir, "native"))
    File.write!(Path.join(dir, "native/lib.rs"), "")
    path = System.get_env("PATH")

    try do
      System.put_env("PATH", dir)

      error =
        File.cd!(dir, fn ->
          assert_raise Mix.Error, fn -> Mix.Tasks.Compile.ObservatoryNif.run([]) end
        end)

      assert error.message =~ "cargo not found on PATH"
      assert error.message =~ "Rust toolchain (rustup, Rust 1.91 or later"
    after
      System.put_env("PATH", path)
    end

    refute File.exists?(Path.join(dir, "priv/native/observatory_nif.so"))
  end
end
