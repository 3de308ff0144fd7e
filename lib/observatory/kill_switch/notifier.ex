defmodule Observatory.KillSwitch.Notifier do
  @moduledoc """
  Alert notifications: when the kill switch stops an agent, the event is POSTed as
  JSON to the agent's `notification_webhook`, or else to the global one:

      config :observatory, :kill_switch, notification_webhook: "https://hooks.example.com/observatory"

  Delivery runs in a task under the kill switch supervisor, once, with a 5 s timeout;
  a failure is logged and never affects the proxy. Redirects are not followed (a
  `3xx` is a failure), and the URL is checked again just before the POST
  (`Observatory.Webhook.post/4`): no user information, no loopback, private or
  link-local address unless `webhook_allow_private_networks` is set. (The
  notification sinks, `Observatory.Notifications`, add Slack, PagerDuty, retries and
  rate limits for every agent.) The event itself is already
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
    if agent[:notification_webhook_unreadable] do
      Logger.warning(
        "agent #{inspect(agent[:id])}'s webhook URL was sealed under another key " <>
          "(the secret_key_base changed) and cannot be read: set it again; " <>
          "this alert goes to the global webhook, if any"
      )
    end

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

  @doc false
  # Runs in the task; returns what happened (the tests read it).
  def deliver(url, payload) do
    case Observatory.Webhook.post(url, JSON.encode!(payload)) do
      {:ok, status, _headers} when status in 200..299 ->
        :ok

      {:error, {:refused, reason}} ->
        Logger.warning("kill switch notification not sent: the webhook #{reason}")
        {:error, :refused}

      other ->
        Logger.warning("kill switch notification failed: #{inspect(other)}")
        {:error, :failed}
    end
  end
end
