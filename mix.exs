defmodule Mix.Tasks.Compile.ObservatoryNif do
  @moduledoc """
  Builds the Rust NIF with `cargo build --release` and copies it into `priv/native/`.

  Runs inside `mix compile`. It rebuilds only when a Rust source, a `Cargo.toml` or
  `Cargo.lock` is newer than the library in `priv/`; the old library is deleted before
  the new one is copied, so a running VM never sees a half-written file.
  """
  use Mix.Task.Compiler

  @recursive true
  @crate "observatory_nif"
  @target "priv/native/observatory_nif.so"

  @impl true
  def run(_args) do
    sources = Mix.Utils.extract_files(["native"], [:rs, :toml]) ++ ["Cargo.toml", "Cargo.lock"]

    if Mix.Utils.stale?(Enum.filter(sources, &File.exists?/1), [@target]) do
      build!()
    end

    {:ok, []}
  end

  @impl true
  def clean do
    File.rm(@target)
    :ok
  end

  defp build! do
    cargo =
      System.find_executable("cargo") ||
        Mix.raise(
          "cargo not found on PATH: Observatory's NIF is Rust, and compiling it needs a Rust " <>
            "toolchain (rustup, Rust 1.91 or later; https://rustup.rs) with cargo on PATH. " <>
            "In Observatory's own repository, bin/setup installs it"
        )

    Mix.shell().info("Compiling NIF crate #{@crate} (cargo build --release)")

    {_, status} =
      System.cmd(cargo, ["build", "--release", "--locked", "-p", @crate],
        into: IO.stream(:stdio, :line),
        stderr_to_stdout: true
      )

    status == 0 || Mix.raise("cargo build failed with exit status #{status}")

    File.mkdir_p!(Path.dirname(@target))
    File.rm(@target)
    File.cp!(Path.join(cargo_target_dir(), "release/lib#{@crate}.so"), @target)
  end

  defp cargo_target_dir, do: System.get_env("CARGO_TARGET_DIR", "target")
end

defmodule Observatory.MixProject do
  use Mix.Project

  def project do
    [
      app: :observatory,
      version: "0.1.0",
      elixir: "~> 1.14",
      start_permanent: Mix.env() == :prod,
      compilers: [:observatory_nif | Mix.compilers()],
      elixirc_paths: elixirc_paths(Mix.env()),
      deps: deps(),
      aliases: aliases(),
      # `MIX_ENV=prod mix release`; node name and cookie from RELEASE_NODE,
      # RELEASE_COOKIE and RELEASE_DISTRIBUTION=name (docs/cluster.md).
      # MochiWeb, optional for a host app, is the release's HTTP server.
      releases: [observatory: [include_executables_for: [:unix], applications: [mochiweb: :load]]],
      docs: [main: "readme"]
    ]
  end

  def application do
    [
      mod: {Observatory.Application, []},
      # MochiWeb (Debian's erlang-mochiweb) serves Observatory's own HTTP API and
      # dashboard only: ObservatoryWeb.Endpoint starts it when that server is configured
      # on. A Phoenix host, whose Erlang may have no MochiWeb, never needs it.
      extra_applications: [:logger, :crypto, :inets, mochiweb: :optional],
      # Loaded with Observatory, started by it (Observatory.KillSwitch.Agents.setup/1)
      # once its directory is set and its schema exists.
      included_applications: [:mnesia]
    ]
  end

  # What Observatory uses from Phoenix, as optional dependencies.
  #
  # Observatory builds without Hex (CI, bin/setup, bin/start, bin/test have no Hex and
  # no Phoenix), so as the top-level project it declares no dependency at all, and the
  # LiveView modules (`if Code.ensure_loaded?(Phoenix.LiveView)`) are not compiled.
  #
  # As a dependency of another project (a Phoenix host: its `mix.exs` is on Mix's
  # project stack while this `project/0` runs) it declares them, all `optional: true`:
  # the host fetches none it does not list itself (through Hex or its own path deps),
  # but Mix compiles those it has before Observatory, so the LiveViews and the Plugs
  # (ObservatoryWeb.AgentAPIPlug, LLMProxyPlug, AssetsPlug) exist on the first build
  # and xref knows where Phoenix's modules come from.
  @phoenix_deps [
    {:phoenix, "~> 1.7", optional: true},
    {:phoenix_live_view, "~> 0.20.0 or ~> 1.0", optional: true},
    {:phoenix_html, "~> 3.3 or ~> 4.0", optional: true},
    {:phoenix_pubsub, "~> 2.1", optional: true},
    {:plug, "~> 1.14", optional: true},
    {:telemetry, "~> 0.4 or ~> 1.0", optional: true}
  ]

  # A host built without Hex (vendored deps, an air-gapped build) cannot resolve a Hex
  # requirement, even an optional one it never uses ("Could not find Hex, which is
  # needed to build dependency :phoenix"): there Observatory declares, as optional,
  # only those the host lists itself, from where the host gets them (`path:`, `git:`).
  defp deps do
    case Mix.Project.get() do
      nil ->
        []

      _host ->
        optional_deps(Mix.Project.config()[:deps] || [], host_root(), Code.ensure_loaded?(Hex))
    end
  end

  defp host_root, do: Path.dirname(Mix.Project.project_file())

  @doc false
  # Observatory's optional deps for a host whose deps are `host_deps` (its mix.exs in
  # `root`), built with or without Hex.
  def optional_deps(_host_deps, _root, true = _hex?), do: @phoenix_deps

  def optional_deps(host_deps, root, false = _hex?) do
    for dep <- host_deps,
        app = elem(dep, 0),
        List.keymember?(@phoenix_deps, app, 0),
        opts = elem(dep, tuple_size(dep) - 1),
        is_list(opts) and (opts[:path] || opts[:git]) do
      opts = if opts[:path], do: Keyword.update!(opts, :path, &Path.expand(&1, root)), else: opts
      {app, Keyword.merge(opts, optional: true)}
    end
  end

  defp elixirc_paths(:test), do: ["lib", "test/support"]
  defp elixirc_paths(_), do: ["lib"]

  defp aliases do
    [
      # The test helper names the node before it starts the application: Mnesia ties
      # its schema to the node's name (see test/test_helper.exs).
      test: "test --no-start",
      "rust.fmt": &cargo(["fmt", "--all", "--check"], &1),
      "rust.lint": &cargo(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"], &1),
      "rust.test": &cargo(["test", "--workspace", "--locked"], &1),
      ci: [
        "format --check-formatted",
        "rust.fmt",
        "rust.lint",
        "compile --warnings-as-errors --force",
        "rust.test",
        "test --include property"
      ]
    ]
  end

  defp cargo(args, _mix_args) do
    {_, status} =
      System.cmd("cargo", args, into: IO.stream(:stdio, :line), stderr_to_stdout: true)

    status == 0 || Mix.raise("cargo #{Enum.join(args, " ")} failed (exit #{status})")
  end
end
