defmodule Observatory.Proxy.SessionId do
  @moduledoc """
  The session of a proxied request that names none (no `X-Session-Id`): an id derived
  from the agent and the start of its conversation, the same on every turn of one
  run, that nobody else can compute.

      SessionId.derive("agent-7", %{"messages" => [%{"role" => "user", "content" => "fix the build"}]})
      #=> "proxy-3f9c…" (32 hex digits)

  **What it reads.** The system prompt — Anthropic's `system`, the Responses API's
  `instructions`, the `system` and `developer` messages before the first user message
  — and the first user message (for the Responses API, a string `input` is that
  message). The system prompt is normalized first, as the kill switch normalizes
  prompts (ISO timestamps, UUIDs and numbers masked, whitespace runs folded), so that
  an agent that writes the current time or a request id into its system prompt keeps
  one session; the first user message — the task, re-sent verbatim on every turn —
  is taken as it is.

  **Keyed.** The id is an HMAC-SHA-256 of the agent id and that start under a server
  secret of 256 random bits, made on first use and kept in Mnesia (`disc_copies`,
  replicated to every node of a cluster, like the agent records): ids survive a
  restart and are the same on every node, and an agent that knows another's agent id
  and prompts still cannot compute that agent's session id — so it cannot write into
  the session first and have the victim's proxied steps refused. Sessions of two
  agents never share an id.
  """

  alias Observatory.KillSwitch

  @table :observatory_proxy_secrets
  @key :session_id_key
  @digest_bytes 16

  @doc false
  # Called by Observatory.Storage before anything reads it; returns the tables.
  def create_tables do
    Observatory.Storage.create_table(@table, attributes: [:name, :secret], type: :set)
    [@table]
  end

  @doc """
  The session id of a request `body` (a decoded JSON object) of `agent_id`, keyed
  with the server secret — or with `key`: a replay of recorded requests, which runs
  without the gateway's secret, keys its ids with a fixed one so that they are the
  same from run to run (`Observatory.Replay.ProxyRequest`).
  """
  @spec derive(String.t(), map(), binary() | nil) :: String.t()
  def derive(agent_id, body, key \\ nil) when is_binary(agent_id) and is_map(body) do
    data = :erlang.term_to_binary({agent_id, start(body)}, [:deterministic])
    digest = :crypto.mac(:hmac, :sha256, key || secret(), data)
    "proxy-" <> Base.encode16(binary_part(digest, 0, @digest_bytes), case: :lower)
  end

  @doc """
  The part of a request that names its session: the normalized system prompt and
  the first user message. The same on every turn of one conversation.
  """
  @spec start(map()) :: term()
  def start(body) do
    {leading, first_user} = opening(items(body))

    {
      normalized(Map.get(body, "system")),
      normalized(Map.get(body, "instructions")),
      for(item <- leading, system?(item), do: normalized(item)),
      first_user
    }
  end

  defp items(%{"messages" => messages}) when is_list(messages), do: messages

  defp items(%{"input" => input}) when is_binary(input),
    do: [%{"role" => "user", "content" => input}]

  defp items(%{"input" => input}) when is_list(input), do: input
  defp items(_body), do: []

  # The items before the first user message, and that message (nil when none).
  defp opening(items) do
    case Enum.split_while(items, &(not user?(&1))) do
      {leading, [first | _]} -> {leading, first}
      {leading, []} -> {leading, nil}
    end
  end

  defp user?(%{"role" => "user"}), do: true
  defp user?(_), do: false

  defp system?(%{"role" => role}) when role in ["system", "developer"], do: true
  defp system?(_), do: false

  # Every string in the value normalized (text blocks, cache_control and all).
  defp normalized(text) when is_binary(text), do: KillSwitch.normalize(text)
  defp normalized(list) when is_list(list), do: Enum.map(list, &normalized/1)

  defp normalized(map) when is_map(map),
    do: map |> Enum.map(fn {k, v} -> {k, normalized(v)} end) |> Enum.sort()

  defp normalized(other), do: other

  @doc """
  The server secret the ids are keyed with, made on first use (in a transaction, so
  two nodes starting at once agree on one).
  """
  @spec secret() :: binary()
  def secret do
    case :mnesia.dirty_read(@table, @key) do
      [{@table, @key, secret}] -> secret
      [] -> create_secret()
    end
  end

  defp create_secret do
    Observatory.Storage.transaction("proxy session secret", fn ->
      case :mnesia.read(@table, @key, :write) do
        [{@table, @key, secret}] ->
          secret

        [] ->
          secret = :crypto.strong_rand_bytes(32)
          :ok = :mnesia.write({@table, @key, secret})
          secret
      end
    end)
  end
end
