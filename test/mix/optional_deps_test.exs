defmodule Observatory.OptionalDepsTest do
  # mix.exs: Observatory declares what it uses from Phoenix as optional dependencies
  # when it is a dependency of another project, and none as the top-level project
  # (this Hex-less build).
  use ExUnit.Case, async: false

  @phoenix_apps [:phoenix, :phoenix_live_view, :phoenix_html, :phoenix_pubsub, :plug, :telemetry]

  @tag :tmp_dir
  test "as a dependency of a host, Phoenix, Plug and telemetry are optional deps", %{tmp_dir: dir} do
    File.write!(Path.join(dir, "mix.exs"), """
    defmodule ObservatoryOptionalDepsTest.Host.MixProject do
      use Mix.Project
      def project, do: [app: :fake_host, version: "0.1.0"]
    end
    """)

    deps =
      Mix.Project.in_project(:fake_host, dir, fn _ -> Observatory.MixProject.project()[:deps] end)

    assert Enum.map(deps, &elem(&1, 0)) == @phoenix_apps
    assert Enum.all?(deps, fn {_app, _requirement, opts} -> opts[:optional] == true end)

    assert {:phoenix_live_view, "~> 0.20.0 or ~> 1.0", optional: true} in deps
  end

  test "as the top-level project (CI, bin/test), it declares no dependency" do
    assert Mix.Project.get() == Observatory.MixProject
    assert Mix.Project.config()[:deps] == []
  end
end
