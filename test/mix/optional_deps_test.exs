defmodule Observatory.OptionalDepsTest do
  # mix.exs: Observatory declares what it uses from Phoenix as optional dependencies
  # when it is a dependency of another project, and none as the top-level project
  # (this Hex-less build).
  use ExUnit.Case, async: false

  @phoenix_apps [:phoenix, :phoenix_live_view, :phoenix_html, :phoenix_pubsub, :plug, :telemetry]

  test "as a dependency of a host built with Hex, Phoenix, Plug and telemetry are optional deps" do
    deps = Observatory.MixProject.optional_deps([], "/host", true)

    assert Enum.map(deps, &elem(&1, 0)) == @phoenix_apps
    assert Enum.all?(deps, fn {_app, _requirement, opts} -> opts[:optional] == true end)

    assert {:phoenix_live_view, "~> 0.20.0 or ~> 1.0", optional: true} in deps
  end

  # Before: a Hex-less host (this build has no Hex) could not compile Observatory at
  # all: "Could not find Hex, which is needed to build dependency :phoenix".
  @tag :tmp_dir
  test "as a dependency of a host built without Hex, only the optional deps the host lists, from where it gets them",
       %{tmp_dir: dir} do
    File.write!(Path.join(dir, "mix.exs"), """
    defmodule ObservatoryOptionalDepsTest.Host.MixProject do
      use Mix.Project
      def project do
        [app: :fake_host, version: "0.1.0",
         deps: [{:telemetry, path: "vendor/telemetry"},
                {:plug, "~> 1.14", git: "https://example.invalid/plug.git"},
                {:phoenix, "~> 1.7"},
                {:jason, path: "vendor/jason"}]]
      end
    end
    """)

    deps =
      Mix.Project.in_project(:fake_host, dir, fn _ -> Observatory.MixProject.project()[:deps] end)

    assert deps == [
             {:telemetry, path: Path.join(dir, "vendor/telemetry"), optional: true},
             {:plug, git: "https://example.invalid/plug.git", optional: true}
           ]
  end

  test "as the top-level project (CI, bin/test), it declares no dependency" do
    assert Mix.Project.get() == Observatory.MixProject
    assert Mix.Project.config()[:deps] == []
  end
end
