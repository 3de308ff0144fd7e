defmodule Observatory.Application do
  @moduledoc false
  use Application

  @impl true
  def start(_type, _args) do
    Observatory.Metrics.setup()

    children =
      [
        {Observatory.PubSub, name: Observatory.PubSub},
        Observatory.Gateway.EntropyTracker,
        Observatory.Gateway.HITL,
        Observatory.Gateway.StepDetector,
        Observatory.Gateway.CallBreaker,
        Observatory.Gateway.SessionLog,
        Observatory.KillSwitch.Supervisor
      ] ++ web_children()

    Supervisor.start_link(children, strategy: :one_for_one, name: Observatory.Supervisor)
  end

  # The HTTP server and the demo fleet are on unless configured off (a host app that
  # only wants the library sets `config :observatory, ObservatoryWeb.Endpoint, server: false`).
  defp web_children do
    endpoint = Application.get_env(:observatory, ObservatoryWeb.Endpoint, [])
    server = if Keyword.get(endpoint, :server, true), do: [ObservatoryWeb.Endpoint], else: []

    demo =
      if Application.get_env(:observatory, :demo, false), do: [Observatory.Demo.Fleet], else: []

    server ++ demo
  end
end
