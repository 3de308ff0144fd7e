defmodule Observatory.KillSwitch.Notifier do
  @moduledoc """
  Alert notifications: when the kill switch stops an agent, the event is POSTed as
  JSON to the agent's `notification_webhook`, or else to the global one:

      config :observatory, :kill_switch, notification_webhook: "https://hooks.example.com/observatory"

  Delivery runs in a task under the kill switch supervisor, once, with a 5 s timeout;
  a failure is logged and never affects the proxy. The event itself is already
  recorded and broadcast on `"gateway:kill_switch"` whether or not a webhook is set.
  """

  require Logger

  alias Observatory.JSON

  @doc "The webhook the agent's alerts go to, or nil."
  @spec webhook(map()) :: String.t() | nil
  def webhook(agent) do
    agent[:notification_webhook] ||
      Application.get_env(:observatory, :kill_switch, []) |> Keyword.get(:notification_webhook)
  end

  @doc "Whether alerts for the agent go anywhere (the dashboard asks before enabling)."
  @spec configured?(map()) :: boolean()
  def configured?(agent), do: webhook(agent) != nil

  @doc "Sends `payload` to the agent's webhook in the background; `:ok` when there is none."
  @spec notify(map(), map()) :: :ok
  def notify(agent, payload) do
    case webhook(agent) do
      nil ->
        :ok

      url ->
        {:ok, _} =
          Task.Supervisor.start_child(Observatory.KillSwitch.TaskSupervisor, fn ->
            deliver(url, payload)
          end)

        :ok
    end
  end

  defp deliver(url, payload) do
    request = {String.to_charlist(url), [], ~c"application/json", JSON.encode!(payload)}

    case :httpc.request(:post, request, [timeout: 5_000, connect_timeout: 5_000], []) do
      {:ok, {{_, status, _}, _, _}} when status in 200..299 ->
        :ok

      other ->
        Logger.warning("kill switch notification to #{url} failed: #{inspect(other)}")
    end
  end
end
