defmodule Observatory.ConfigurationDocTest do
  # docs/configuration.md lists every setting: each OBSERVATORY_* variable that the
  # code, the config files or the scripts read, and each `config :observatory` key the
  # code reads or the config files set.
  use ExUnit.Case, async: true

  @root Path.expand("../..", __DIR__)
  @doc_path Path.join(@root, "docs/configuration.md")

  defp sources(globs), do: Enum.flat_map(globs, &Path.wildcard(Path.join(@root, &1)))

  @doc false
  def env_vars(text),
    do: Regex.scan(~r/\bOBSERVATORY_[A-Z0-9_]*[A-Z0-9]\b/, text) |> List.flatten()

  @doc false
  def keys_read(text) do
    for [_, key] <-
          Regex.scan(~r/(?:get_env|fetch_env!?|put_env)\(\s*:observatory,\s*:([a-z_]+)/, text),
        do: key
  end

  defp doc, do: File.read!(@doc_path)

  test "every OBSERVATORY_* variable read anywhere is in the table" do
    read =
      sources(~w(config/*.exs lib/**/*.ex bin/* rel/*))
      |> Enum.flat_map(&env_vars(File.read!(&1)))
      |> Enum.uniq()

    assert length(read) > 30
    assert Enum.reject(read, &(doc() =~ "`#{&1}`")) == []
  end

  test "every config key the code reads or config/config.exs sets is in the table" do
    from_code = sources(~w(lib/**/*.ex)) |> Enum.flat_map(&keys_read(File.read!(&1)))

    from_config =
      for {key, _} <-
            Config.Reader.read!(Path.join(@root, "config/config.exs"), env: :prod)[:observatory],
          is_atom(key) and Atom.to_string(key) =~ ~r/^[a-z]/,
          do: Atom.to_string(key)

    keys = Enum.uniq(from_code ++ from_config)
    assert length(keys) > 40
    assert Enum.reject(keys, &(doc() =~ "`:#{&1}`")) == []
    assert doc() =~ "`ObservatoryWeb.Endpoint`"
  end

  test "the scanners find what they look for (the checks can fail)" do
    assert env_vars(~s{System.get_env("OBSERVATORY_NEW_THING") OBSERVATORY_}) == [
             "OBSERVATORY_NEW_THING"
           ]

    assert keys_read("Application.get_env(:observatory, :new_key, 1)") == ["new_key"]
    refute doc() =~ "`OBSERVATORY_NEW_THING`"
  end
end
