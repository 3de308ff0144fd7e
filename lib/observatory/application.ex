defmodule Observatory.Application do
  @moduledoc false
  use Application
  require Logger

  @impl true
  def start(_type, _args) do
    Observatory.Metrics.setup()
    ensure_secret_key_base()

    children =
      [
        {Observatory.PubSub, name: Observatory.PubSub},
        Observatory.Gateway.EntropyTracker,
        Observatory.Gateway.HITL,
        Observatory.Gateway.StepDetector,
        Observatory.Gateway.LoopVerdict,
        Observatory.Gateway.CallBreaker,
        Observatory.Gateway.SessionLog,
        Observatory.KillSwitch.Supervisor
      ] ++ web_children()

    # Clustering (issue 14) around them: see Observatory.Cluster.wrap/1.
    children = Observatory.Cluster.wrap(children)
    Supervisor.start_link(children, strategy: :one_for_one, name: Observatory.Supervisor)
  end

  # The HTTP server and the demo fleet run only when configured on: Observatory's own
  # config (config/config.exs) turns the server on; a host app that uses Observatory as
  # a library gets neither unless it asks.
  defp web_children do
    server =
      if ObservatoryWeb.Endpoint.server?(),
        do: [
          {Registry, keys: :unique, name: ObservatoryWeb.Dashboard.EventStream.registry()},
          ObservatoryWeb.AuthThrottle,
          ObservatoryWeb.Endpoint
        ],
        else: []

    demo =
      if Application.get_env(:observatory, :demo, false), do: [Observatory.Demo.Fleet], else: []

    server ++ demo
  end

  # The dashboard signs its session cookies with :secret_key_base. When nothing set it
  # (OBSERVATORY_SECRET_KEY_BASE, config), a random key is made now: sign-ins then
  # last until the next restart. Said only when Observatory's own server runs: a host
  # app does its own sign-in and has no use for the notice.
  defp ensure_secret_key_base do
    unless Application.get_env(:observatory, :secret_key_base) do
      key = :crypto.strong_rand_bytes(48) |> Base.encode64()
      Application.put_env(:observatory, :secret_key_base, key)

      ObservatoryWeb.Endpoint.server?() &&
        Logger.info(
          "no :secret_key_base configured (OBSERVATORY_SECRET_KEY_BASE): generated one; " <>
            "dashboard sign-ins end when the application restarts"
        )
    end
  end
end
