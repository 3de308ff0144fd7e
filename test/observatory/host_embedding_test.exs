defmodule Observatory.HostEmbeddingTest do
  # Observatory started the way a host app starts it: on a fresh node (:peer) that
  # loads none of Observatory's config files, with MochiWeb taken out of the code path
  # (asdf, kerl and the official Erlang builds have none).
  use ExUnit.Case, async: false

  @moduletag :distributed

  setup do
    node = Observatory.Test.HostPeer.start()
    true = :erpc.call(node, :code, :del_path, [:mochiweb])
    :non_existing = :erpc.call(node, :code, :which, [:mochiweb_http])

    dir = Path.join(System.tmp_dir!(), "observatory-host-#{System.unique_integer([:positive])}")
    on_exit(fn -> File.rm_rf!(dir) end)
    %{node: node, dir: dir}
  end

  defp logs, do: Observatory.Test.HostPeer.logs()

  describe "in a host app" do
    test "starts with no HTTP server, no MochiWeb, Mnesia in the host's directory, and no notice",
         %{node: node, dir: dir} do
      :ok = :erpc.call(node, Application, :put_env, [:mnesia, :dir, String.to_charlist(dir)])

      assert {:ok, started} = :erpc.call(node, Application, :ensure_all_started, [:observatory])
      refute :mochiweb in started
      assert :erpc.call(node, Process, :whereis, [ObservatoryWeb.Endpoint]) == nil
      assert :erpc.call(node, :mnesia, :system_info, [:directory]) == String.to_charlist(dir)
      assert File.exists?(Path.join(dir, "schema.DAT"))

      # The library works: an envelope is scored.
      envelope = Observatory.Test.HTTP.envelope(%{"meta" => %{"session_id" => "sess-host"}})

      assert {:ok, %{entropy_score: 1.0}} =
               :erpc.call(node, Observatory.Gateway.SchemaInterceptor, :ingest, [envelope])

      :erpc.call(node, Logger, :flush, [])
      refute Enum.any?(logs(), &(&1 =~ "secret_key_base")), inspect(logs())
    end

    test "with neither :data_dir nor config :mnesia, :dir, refuses to start and says which keys",
         %{node: node} do
      assert {:error, reason} = :erpc.call(node, Application, :ensure_all_started, [:observatory])
      message = inspect(reason)
      assert message =~ "set config :observatory, :data_dir (or config :mnesia, :dir)"

      # It says where: outside the release and git, one per environment; prod from the environment.
      assert message =~ "../tmp/observatory/"
      assert message =~ "OBSERVATORY_DATA_DIR"
      refute message =~ "priv/"
    end

    test "with server: true and no :port, the server refuses to start and says so",
         %{node: node, dir: dir} do
      :ok = :erpc.call(node, Application, :put_env, [:observatory, :data_dir, dir])

      :ok =
        :erpc.call(node, Application, :put_env, [
          :observatory,
          ObservatoryWeb.Endpoint,
          [server: true]
        ])

      assert {:error, reason} = :erpc.call(node, Application, :ensure_all_started, [:observatory])

      assert inspect(reason) =~
               "no :port for ObservatoryWeb.Endpoint: config :observatory, ObservatoryWeb.Endpoint, server: true needs port: … (or OBSERVATORY_PORT)"

      # With its own server configured, Observatory says its sign-ins need a key.
      assert Enum.any?(logs(), &(&1 =~ "no OBSERVATORY_SECRET_KEY_BASE set"))
    end
  end

  describe "Observatory's own configuration (bin/start)" do
    test "runs its server, which started MochiWeb" do
      assert ObservatoryWeb.Endpoint.server?()
      assert Process.whereis(ObservatoryWeb.Endpoint)
      assert :mochiweb in Enum.map(Application.started_applications(), &elem(&1, 0))
      # MochiWeb is optional: the application does not require it.
      refute :mochiweb in Application.spec(:observatory, :applications)
    end
  end
end
