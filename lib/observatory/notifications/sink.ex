defmodule Observatory.Notifications.Sink do
  @moduledoc """
  One place alerts go, and what each kind of place is sent.

  | `type` | required | optional | what is POSTed |
  |---|---|---|---|
  | `webhook` | `url` | `secret` (signs the body: `X-Observatory-Signature: sha256=<HMAC-SHA256 hex>`) | the alert as JSON (below) |
  | `slack` | `url` (an incoming webhook) | | `{"text": …}`, Slack's mrkdwn with `&`, `<` and `>` escaped |
  | `pagerduty` | `routing_key` (an Events API v2 integration key) | `url` (default `https://events.pagerduty.com/v2/enqueue`) | an Events API v2 `trigger` on an alarm, `resolve` on its recovery, `dedup_key` per session (per agent for the kill switch) |

  Every sink also takes `events` — the kinds it wants, any of `loop_alarm`,
  `kill_switch`, `budget` (all by default) — and `name` (1–64 of `a-z 0-9 _ -`).

  URLs follow the webhook rules (`Observatory.KillSwitch.WebhookURL`): `http://` or
  `https://`, no `user:pass@`, no loopback, private or link-local host unless
  `webhook_allow_private_networks` is set; checked when the sink is configured and
  again before each delivery. `url`, `routing_key` and `secret` are secrets: never
  logged, shown back only redacted (`redact/1`).

  The text for people — the Slack message, the webhook's `summary`, PagerDuty's
  `summary` — shows each bidirectional formatting character of an agent's strings as a
  marker (`⟨U+202E⟩`, `Observatory.Bidi`), so an id cannot display reversed and read as
  another's; the fields a program matches on (`agent_id`, `session_id`, `dedup_key`,
  `details`, PagerDuty's `component` and `custom_details`) keep the exact bytes.

  The generic webhook's JSON:

      {"source": "observatory", "kind": "loop_alarm", "action": "trigger",
       "dedup_key": "observatory:loop:sess-1", "severity": "error",
       "summary": "Loop alarm: session sess-1 of agent agent-7: the same call 3 times …",
       "agent_id": "agent-7", "session_id": "sess-1", "at": "2026-…Z", "details": {…}}
  """

  alias Observatory.{Bidi, JSON}
  alias Observatory.KillSwitch.WebhookURL

  @types %{"webhook" => :webhook, "slack" => :slack, "pagerduty" => :pagerduty}
  @kinds %{"loop_alarm" => :loop_alarm, "kill_switch" => :kill_switch, "budget" => :budget}
  @pagerduty_url "https://events.pagerduty.com/v2/enqueue"
  @max_secret_bytes 2048
  @keys ~w(name type url routing_key secret events)

  @type kind :: :loop_alarm | :kill_switch | :budget
  @type t :: %{
          name: String.t(),
          type: :webhook | :slack | :pagerduty,
          url: String.t(),
          routing_key: String.t() | nil,
          secret: String.t() | nil,
          events: [kind()]
        }

  @typedoc "What happened, for every sink to word in its own way."
  @type alert :: %{
          kind: kind(),
          action: :trigger | :resolve,
          key: String.t(),
          severity: String.t(),
          summary: String.t(),
          agent_id: String.t() | nil,
          session_id: String.t() | nil,
          at: DateTime.t(),
          details: map()
        }

  @doc "Every kind of alert."
  def kinds, do: Map.values(@kinds)

  @doc """
  Checks a sink as configured or sent by an operator (string or atom keys); returns
  the sink or every violation, each `%{path, reason}`.
  """
  @spec validate(map() | keyword()) ::
          {:ok, t()} | {:error, [%{path: String.t(), reason: String.t()}]}
  def validate(spec) when is_list(spec) or is_map(spec) do
    spec = Map.new(spec, fn {k, v} -> {to_string(k), v} end)

    unknown =
      for key <- Map.keys(spec),
          key not in @keys,
          do: %{path: key, reason: "is not a sink setting (use #{Enum.join(@keys, ", ")})"}

    {fields, violations} =
      Enum.reduce(["name", "type", "events"], {%{}, unknown}, fn key, acc ->
        field(acc, key, check(key, spec[key]))
      end)

    {fields, violations} =
      case fields[:type] do
        :pagerduty ->
          acc =
            field(
              {fields, violations},
              "routing_key",
              secret("routing_key", spec["routing_key"], true)
            )

          field(acc, "url", url(spec["url"] || @pagerduty_url))

        type when type in [:webhook, :slack] ->
          acc = field({fields, violations}, "url", url(spec["url"]))

          if type == :webhook,
            do: field(acc, "secret", secret("secret", spec["secret"], false)),
            else: acc

        nil ->
          {fields, violations}
      end

    case violations do
      [] -> {:ok, Map.merge(%{routing_key: nil, secret: nil}, fields)}
      _ -> {:error, Enum.sort_by(violations, & &1.path)}
    end
  end

  def validate(other),
    do: {:error, [%{path: "$", reason: "must be an object, got: #{inspect(other)}"}]}

  defp field({fields, violations}, key, {:ok, value}),
    do: {Map.put(fields, String.to_existing_atom(key), value), violations}

  defp field({fields, violations}, key, {:error, reason}),
    do: {fields, [%{path: key, reason: reason} | violations]}

  defp check("name", name) when is_binary(name) do
    if Regex.match?(~r/\A[a-z0-9_-]{1,64}\z/, name),
      do: {:ok, name},
      else: {:error, "must be 1 to 64 of a-z, 0-9, _ and -, got: #{inspect(name)}"}
  end

  defp check("name", name) when is_atom(name) and name not in [nil, true, false],
    do: check("name", Atom.to_string(name))

  defp check("name", other), do: {:error, "must be a string, got: #{inspect(other)}"}

  defp check("type", type) when is_atom(type) and type not in [nil, true, false],
    do: check("type", Atom.to_string(type))

  defp check("type", type) do
    case Map.fetch(@types, type) do
      {:ok, type} -> {:ok, type}
      :error -> {:error, "must be webhook, slack or pagerduty, got: #{inspect(type)}"}
    end
  end

  defp check("events", nil), do: {:ok, kinds()}

  defp check("events", events) when is_list(events) and events != [] do
    kinds = for e <- events, do: Map.get(@kinds, to_string(e))

    if Enum.all?(kinds),
      do: {:ok, Enum.uniq(kinds)},
      else: {:error, "must list some of loop_alarm, kill_switch, budget, got: #{inspect(events)}"}
  end

  defp check("events", other),
    do: {:error, "must list some of loop_alarm, kill_switch, budget, got: #{inspect(other)}"}

  defp url(url) when is_binary(url) and byte_size(url) <= @max_secret_bytes,
    do: WebhookURL.check(url)

  defp url(nil), do: {:error, "is required"}

  defp url(_other),
    do: {:error, "must be an http:// or https:// URL of at most #{@max_secret_bytes} bytes"}

  defp secret(_key, nil, false), do: {:ok, nil}
  defp secret(_key, nil, true), do: {:error, "is required"}

  defp secret(_key, value, _required)
       when is_binary(value) and byte_size(value) in 1..@max_secret_bytes,
       do: {:ok, value}

  defp secret(_key, _value, _required),
    do: {:error, "must be a string of 1 to #{@max_secret_bytes} bytes"}

  @doc """
  The sink as it may be shown: its secrets redacted (a URL keeps its origin and last
  four characters, a key or secret only whether it is set).
  """
  @spec redact(t()) :: map()
  def redact(sink) do
    %{
      name: sink.name,
      type: Atom.to_string(sink.type),
      events: Enum.map(sink.events, &Atom.to_string/1),
      url: WebhookURL.redact(sink.url),
      routing_key: if(sink.routing_key, do: "set"),
      secret: if(sink.secret, do: "set")
    }
  end

  @doc "The request for `alert` at this sink: `{url, headers, body}`."
  @spec request(t(), alert()) :: {String.t(), [{String.t(), String.t()}], binary()}
  def request(%{type: :webhook} = sink, alert) do
    body =
      JSON.encode_lossy!(%{
        source: "observatory",
        kind: alert.kind,
        action: alert.action,
        dedup_key: dedup_key(alert),
        severity: alert.severity,
        summary: text(alert),
        agent_id: alert.agent_id,
        session_id: alert.session_id,
        at: DateTime.to_iso8601(alert.at),
        details: alert.details
      })

    headers =
      case sink.secret do
        nil -> []
        secret -> [{"x-observatory-signature", "sha256=" <> hmac(secret, body)}]
      end

    {sink.url, headers, body}
  end

  def request(%{type: :slack} = sink, alert) do
    icon =
      case {alert.action, alert.severity} do
        {:resolve, _} -> ":white_check_mark:"
        {_, "critical"} -> ":octagonal_sign:"
        {_, "warning"} -> ":warning:"
        _ -> ":rotating_light:"
      end

    {sink.url, [], JSON.encode_lossy!(%{text: "#{icon} #{slack_escape(text(alert))}"})}
  end

  def request(%{type: :pagerduty} = sink, %{action: :resolve} = alert) do
    body = %{routing_key: sink.routing_key, event_action: "resolve", dedup_key: dedup_key(alert)}
    {sink.url, [], JSON.encode_lossy!(body)}
  end

  def request(%{type: :pagerduty} = sink, alert) do
    body = %{
      routing_key: sink.routing_key,
      event_action: "trigger",
      dedup_key: dedup_key(alert),
      payload: %{
        summary: truncate(text(alert), 1024),
        source: "observatory@#{node()}",
        severity: alert.severity,
        component: alert.agent_id,
        group: "observatory",
        class: Atom.to_string(alert.kind),
        timestamp: DateTime.to_iso8601(alert.at),
        custom_details:
          Map.merge(alert.details, %{session_id: alert.session_id, agent_id: alert.agent_id})
      }
    }

    {sink.url, [], JSON.encode_lossy!(body)}
  end

  @doc """
  The alert's deduplication key as sinks see it: `observatory:` and the alert's key
  (`loop:<session>`, `kill_switch:<agent>`, `budget:session:<session>`,
  `budget:agent:<agent>`); a digest of it when that would exceed PagerDuty's 255
  characters.
  """
  @spec dedup_key(alert()) :: String.t()
  def dedup_key(%{key: key}) do
    full = "observatory:" <> key

    if byte_size(full) <= 255,
      do: full,
      else: "observatory:" <> Base.encode16(:crypto.hash(:sha256, key), case: :lower)
  end

  # The alert's text for people: the summary names agents' ids, intents, tools and
  # reasons, so a bidirectional control in one shows as a marker (an id holding U+202E
  # must not display reversed, as another's). The fields a program matches on
  # (agent_id, session_id, dedup_key, details, PagerDuty's component) keep the bytes.
  defp text(alert), do: Bidi.mark(alert.summary)

  # Slack's mrkdwn: &, < and > are the only characters to escape; with them escaped an
  # agent's session id cannot ping a channel (<!channel>) or forge a link.
  defp slack_escape(text),
    do:
      text
      |> String.replace("&", "&amp;")
      |> String.replace("<", "&lt;")
      |> String.replace(">", "&gt;")

  defp hmac(secret, body),
    do: :crypto.mac(:hmac, :sha256, secret, body) |> Base.encode16(case: :lower)

  defp truncate(text, max) when byte_size(text) <= max, do: text
  defp truncate(text, max), do: String.slice(text, 0, max - 1) <> "…"
end
