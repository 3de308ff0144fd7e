defmodule Observatory.Notifications do
  @moduledoc """
  Alerts for people who are not watching the dashboard: loop alarms, kill-switch trips
  and budget stops go to the configured sinks — a generic JSON webhook, a Slack
  incoming webhook, PagerDuty Events API v2 (`Observatory.Notifications.Sink`).

      config :observatory, :notifications,
        sinks: [
          [name: "oncall", type: :pagerduty, routing_key: System.fetch_env!("PD_ROUTING_KEY")],
          [name: "team", type: :slack, url: System.fetch_env!("SLACK_WEBHOOK_URL"),
           events: [:loop_alarm, :budget]],
          [name: "audit", type: :webhook, url: "https://audit.example.com/observatory",
           secret: System.fetch_env!("AUDIT_HMAC_SECRET")]
        ],
        rate_limit_per_minute: 30,     # per sink; resolutions are never held back
        max_attempts: 5,               # per delivery, retried on 429, 5xx and network errors
        backoff_ms: 1_000,             # doubled after each attempt (Retry-After wins), at most
        max_backoff_ms: 60_000

  Operators add, replace and remove sinks at run time too (`put_sink/2`, `PUT
  /api/v1/notifications/sinks/:name`); those are kept in Mnesia (replicated to every
  node), their secrets sealed at rest. A sink's secrets — its URL (a Slack webhook URL
  is a credential), PagerDuty routing key, signing secret — are never logged and are
  shown back only redacted (`sinks/0`).

  ## What is sent, and when

  | kind | raised by | resolved by | deduplicated per |
  |---|---|---|---|
  | `loop_alarm` | a session's alarm raised (`Observatory.Gateway.Alerts`: the configured alert source calls it a loop) | the alarm cleared (the source no longer calls it a loop, or the session was evicted) | session |
  | `kill_switch` | the kill switch deactivating an agent (`critical`); in `warn` mode, a score over the threshold (`warning`) | the agent's activation; in `warn` mode, a request under the threshold | agent |
  | `budget` | a budget stop (`error`); in `warn` mode, a would-be stop (`warning`) | a reset, or limits raised | session (per-session limits), agent (window limits) |

  Shadow modes send nothing: they only record. An alarm already raised is not sent
  again until it is resolved, however many alerts the session sends (the tracker sends
  an `EntropyAlertEvent` on every LOOP step; the alarm is raised once); a resolution
  goes only to the sinks that got the alarm.
  Each sink gets at most `rate_limit_per_minute` alarms a minute; more are dropped,
  counted (`observatory_notifications_dropped_total`) and logged. Deliveries to one
  sink about one session go in order (a resolution never overtakes its alarm); a
  failed one is retried with exponential backoff; after `max_attempts` it is logged
  and dropped. In a cluster, the node that owns the session (or agent) sends.
  """

  alias Observatory.{AtRest, ConfigCheck}
  alias Observatory.Notifications.{Dispatcher, Sink}
  alias Observatory.Storage

  @sinks :observatory_notification_sinks
  @config_keys [
    :sinks,
    :rate_limit_per_minute,
    :max_attempts,
    :backoff_ms,
    :max_backoff_ms,
    :timeout_ms,
    :max_open
  ]

  ## Sinks

  @doc "Every sink — configured, then added at run time — redacted, with `source`."
  @spec sinks() :: [map()]
  def sinks do
    configured = for sink <- configured_sinks(), do: shown(sink, "config")

    stored =
      for opened <- stored_sinks() do
        case opened do
          {:ok, sink} ->
            shown(sink, "api")

          # Its secrets cannot be opened: listed, so that an operator sets it again.
          {:unreadable, stored} ->
            %{
              name: stored.name,
              type: Atom.to_string(stored.type),
              events: Enum.map(stored.events, &Atom.to_string/1),
              url: nil,
              routing_key: nil,
              secret: nil,
              source: "api",
              unreadable: true
            }
        end
      end

    configured ++ stored
  end

  defp shown(sink, source),
    do: sink |> Sink.redact() |> Map.merge(%{source: source, unreadable: false})

  @doc false
  # Every sink with its secrets, for the dispatcher: `[{source, sink}]`. A run-time
  # sink whose secrets do not open (sealed under another key) sends nothing.
  @spec all_sinks() :: [{String.t(), Sink.t()}]
  def all_sinks do
    configured = for sink <- configured_sinks(), do: {"config", sink}
    stored = for {:ok, sink} <- stored_sinks(), do: {"api", sink}
    configured ++ stored
  end

  # The run-time sinks by name, each `{:ok, sink}` or `{:unreadable, stored}`.
  defp stored_sinks do
    :mnesia.dirty_match_object({@sinks, :_, :_})
    |> Enum.map(fn {@sinks, _name, stored} -> unseal(stored) end)
    |> Enum.sort_by(fn {_, sink} -> sink.name end)
  end

  @doc """
  Adds or replaces a run-time sink named `name` from an operator's `spec` (see
  `Observatory.Notifications.Sink`; `name` comes from the path). A name taken by a
  configured sink is refused. Options: `:operator` (logged).
  """
  @spec put_sink(String.t(), map(), keyword()) ::
          {:ok, map()} | {:error, {:invalid, [map()]} | :configured}
  def put_sink(name, spec, opts \\ []) when is_map(spec) do
    with {:ok, sink} <- validate(Map.put(spec, "name", name)),
         :ok <- not_configured(sink.name) do
      Storage.transaction("notification sinks", fn ->
        :mnesia.write({@sinks, sink.name, seal(sink)})
      end)

      require Logger

      Logger.info(
        "notification sink #{inspect(sink.name)} (#{sink.type}) set by #{Observatory.Operator.describe(opts)}"
      )

      {:ok, shown(sink, "api")}
    end
  end

  @doc "Removes a run-time sink."
  @spec delete_sink(String.t(), keyword()) :: :ok | {:error, :not_found | :configured}
  def delete_sink(name, opts \\ []) do
    cond do
      Enum.any?(configured_sinks(), &(&1.name == name)) ->
        {:error, :configured}

      :mnesia.dirty_read(@sinks, name) == [] ->
        {:error, :not_found}

      true ->
        Storage.transaction("notification sinks", fn -> :mnesia.delete({@sinks, name}) end)
        require Logger

        Logger.info(
          "notification sink #{inspect(name)} removed by #{Observatory.Operator.describe(opts)}"
        )

        :ok
    end
  end

  @doc """
  Sends a test alert to the sink now, once, and returns what happened: `:ok`,
  `{:error, sentence}`. A PagerDuty sink gets a trigger and its resolve.
  """
  @spec test_sink(String.t()) :: :ok | {:error, :not_found | String.t()}
  def test_sink(name) do
    case Enum.find(all_sinks(), fn {_source, sink} -> sink.name == name end) do
      nil ->
        if :mnesia.dirty_read(@sinks, name) == [],
          do: {:error, :not_found},
          else: {:error, "cannot be read (sealed under another key): set it again"}

      {_source, sink} ->
        alert = %{
          kind: hd(sink.events),
          action: :trigger,
          key: "test:#{name}:#{System.unique_integer([:positive])}",
          severity: "info",
          summary: "Test alert from Observatory to the sink #{name}",
          agent_id: nil,
          session_id: nil,
          at: DateTime.utc_now(),
          details: %{test: true}
        }

        with :ok <- outcome(Dispatcher.deliver(sink, alert)),
             do:
               if(sink.type == :pagerduty,
                 do: outcome(Dispatcher.deliver(sink, %{alert | action: :resolve})),
                 else: :ok
               )
    end
  end

  defp outcome(:ok), do: :ok
  defp outcome({:retry, _after, why}), do: {:error, why}
  defp outcome({:error, why}), do: {:error, why}

  defp validate(spec) do
    case Sink.validate(spec) do
      {:ok, sink} -> {:ok, sink}
      {:error, violations} -> {:error, {:invalid, violations}}
    end
  end

  defp not_configured(name),
    do:
      if(Enum.any?(configured_sinks(), &(&1.name == name)), do: {:error, :configured}, else: :ok)

  ## Configuration

  @doc false
  # The configuration as a keyword list (nil or another shape, which check_config!/0
  # refuses at start, reads as none: a bad value set later must not stop the alerts).
  def config do
    case Application.get_env(:observatory, :notifications) do
      config when is_list(config) -> config
      _ -> []
    end
  end

  @doc "The configured sinks, checked (cached per configuration)."
  @spec configured_sinks() :: [Sink.t()]
  def configured_sinks do
    specs = if is_list(config()[:sinks]), do: config()[:sinks], else: []

    Observatory.DerivedSetting.get({__MODULE__, :configured}, specs, fn specs ->
      # check_config!/0 refused bad sinks at start; ones set later send nothing.
      try do
        build!(specs)
      rescue
        ArgumentError -> []
      end
    end)
  end

  @doc """
  Checks `config :observatory, :notifications` and raises `ArgumentError` naming what is
  wrong — an unknown key, a sink without its URL or routing key, a URL to a private
  address, two sinks of one name. Runs when the application starts.
  """
  @spec check_config!() :: :ok
  def check_config! do
    config = ConfigCheck.keyword!(:notifications, @config_keys)
    ConfigCheck.positive_integers!(config, :notifications, @config_keys -- [:sinks])

    _ = build!(Keyword.get(config, :sinks, []))
    :ok
  end

  defp build!(specs) when is_list(specs) do
    sinks =
      specs
      |> Enum.with_index()
      |> Enum.map(fn {spec, index} ->
        case Sink.validate(spec) do
          {:ok, sink} ->
            sink

          {:error, violations} ->
            # The message names the sink and the fields, never a secret's value.
            raise ArgumentError,
                  "config :observatory, :notifications, sinks: sink #{index + 1} " <>
                    "(#{inspect(name_of(spec))}): " <>
                    Enum.map_join(violations, "; ", &"#{&1.path} #{&1.reason}")
        end
      end)

    case sinks |> Enum.frequencies_by(& &1.name) |> Enum.find(fn {_, n} -> n > 1 end) do
      nil ->
        sinks

      {name, _} ->
        raise ArgumentError,
              "config :observatory, :notifications, sinks: two sinks are named #{inspect(name)}"
    end
  end

  defp build!(other),
    do:
      raise(
        ArgumentError,
        "expected config :observatory, :notifications, :sinks to be a list, got a #{type(other)}"
      )

  defp name_of(spec) when is_list(spec) or is_map(spec),
    do: Enum.find_value(spec, fn {k, v} -> if to_string(k) == "name", do: v end)

  defp name_of(_), do: nil

  defp type(value) when is_map(value), do: "map"
  defp type(_), do: "value of another type"

  ## Storage (secrets sealed at rest)

  @doc false
  # The durable tables (cleared by Observatory.Testing.reset!/0).
  def tables, do: [@sinks]

  @doc false
  def create_tables do
    Storage.create_table(@sinks, attributes: [:name, :sink], type: :set)
    [@sinks]
  end

  # A sink's secrets — its URL (a Slack webhook URL is a credential), routing key and
  # signing secret — are stored sealed (Observatory.AtRest), each bound to the sink's
  # name and field: a sealed value copied onto another sink or field does not open.
  @secret_fields [:url, :routing_key, :secret]

  defp seal(sink) do
    Enum.reduce(@secret_fields, sink, fn field, sink ->
      case Map.get(sink, field) do
        plain when is_binary(plain) ->
          Map.put(sink, field, AtRest.seal(plain, aad(sink.name, field)))

        _nil_or_sealed ->
          sink
      end
    end)
  end

  # `{:ok, sink}`, or `{:unreadable, stored}` when a secret was sealed under another
  # key (the `:secret_key_base` changed). Values stored in plain open as they are.
  defp unseal(stored) do
    Enum.reduce_while(@secret_fields, {:ok, stored}, fn field, {:ok, sink} ->
      case Map.get(sink, field) do
        nil ->
          {:cont, {:ok, sink}}

        value ->
          case AtRest.unseal(value, aad(sink.name, field)) do
            {:ok, plain} -> {:cont, {:ok, Map.put(sink, field, plain)}}
            {:error, _} -> {:halt, {:unreadable, stored}}
          end
      end
    end)
  end

  defp aad(name, field), do: "notification_sink:#{name}:#{field}"

  @doc false
  # Sinks an older release stored with their secrets in plain are sealed (at start,
  # once the tables are loaded). Nothing to do once done.
  @spec seal_plain_sinks() :: non_neg_integer()
  def seal_plain_sinks do
    plain =
      for {@sinks, name, stored} <- :mnesia.dirty_match_object({@sinks, :_, :_}),
          Enum.any?(@secret_fields, &is_binary(Map.get(stored, &1))),
          do: {name, stored}

    if plain != [] do
      Storage.transaction("notification sinks", fn ->
        for {name, stored} <- plain, do: :mnesia.write({@sinks, name, seal(stored)})
      end)

      require Logger
      Logger.info("sealed the secrets of #{length(plain)} notification sink(s) stored in plain")
    end

    length(plain)
  end
end
