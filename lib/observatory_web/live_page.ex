defmodule ObservatoryWeb.LivePage do
  @moduledoc false
  # What the dashboard's page cores (SessionClusterManager, AgentList, AgentDetail)
  # share besides their socket: who is signed in, and the periodic refresh.

  @doc "The operator named by the page's session, or `\"dashboard\"`."
  @spec operator(map()) :: String.t()
  def operator(%{"operator" => name}) when is_binary(name) and name != "", do: name
  def operator(_session), do: "dashboard"

  @doc "Sends `message` to the caller after `:dashboard_refresh_ms` (default 2 s)."
  @spec schedule_refresh(term()) :: reference()
  def schedule_refresh(message) do
    Process.send_after(
      self(),
      message,
      Application.get_env(:observatory, :dashboard_refresh_ms, 2_000)
    )
  end
end
