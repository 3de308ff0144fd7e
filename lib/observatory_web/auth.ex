defmodule ObservatoryWeb.Auth do
  @moduledoc """
  Who a request is: an agent (by its agent key) or an operator (by an operator token),
  both sent as `Authorization: Bearer …` (an agent may send `X-Agent-Key` or
  `X-Api-Key` instead — the latter is where the Anthropic SDK puts its `api_key`).

  Every agent key is bound to one agent id (`Observatory.AgentKeys`): `agent/1`
  answers that id, and the handlers let the request act as that agent only —
  `acts_as?/2` for a named agent, `session_access/2` for a session. Operator tokens
  are compared in constant time on their SHA-256 digests.

      config :observatory, :operator_tokens, %{"token-of-alice" => "alice"}
      config :observatory, :seed_agent_keys, %{"agent-1" => "dev-agent-key"}  # dev/test

  With none configured, every request is refused (there is no open default); in
  `:dev` the config ships development values, and `config/runtime.exs` reads
  `OBSERVATORY_OPERATOR_TOKENS`.

  A credential that is presented and valid for nobody counts against the client in
  `ObservatoryWeb.AuthThrottle`, once however often it is retried; a locked-out
  client's wrong credentials are answered `429`, and its valid ones are accepted.

  The shared `:agent_keys` of earlier releases are honoured only with
  `insecure_shared_agent_keys: true`: such a key authenticates as `:any_agent`, which
  may act as any agent (the application refuses to start with shared keys otherwise).
  """

  alias Observatory.AgentKeys
  alias Observatory.Gateway.SessionOwners
  alias ObservatoryWeb.{AuthThrottle, Conn}

  @typedoc "An authenticated agent: its id, or `:any_agent` for an insecure shared key."
  @type agent :: String.t() | :any_agent

  @doc "`{:ok, agent}` when the request carries a valid agent key."
  @spec agent(Conn.t()) :: {:ok, agent()} | {:error, :unauthorized}
  def agent(conn), do: conn |> agent_key() |> agent_for_key() |> count_failure(conn)

  @doc "The agent a key authenticates as."
  @spec agent_for_key(String.t() | nil) :: {:ok, agent()} | {:error, :unauthorized}
  def agent_for_key(nil), do: {:error, :unauthorized}

  def agent_for_key(key) do
    with {:error, :unauthorized} <- AgentKeys.authenticate(key) do
      if shared_key?(key), do: {:ok, :any_agent}, else: {:error, :unauthorized}
    end
  end

  @doc "`{:ok, operator_name}` when the request carries a configured operator token."
  @spec operator(Conn.t()) :: {:ok, String.t()} | {:error, :unauthorized}
  def operator(conn), do: conn |> bearer() |> operator_for_token() |> count_failure(conn)

  @doc "Dashboard sign-in: the operator a token typed into the form belongs to."
  @spec sign_in(Conn.t(), String.t() | nil) :: {:ok, String.t()} | {:error, :unauthorized}
  def sign_in(conn, token), do: token |> operator_for_token() |> count_failure(conn, token)

  @doc "The operator a token belongs to."
  @spec operator_for_token(String.t() | nil) :: {:ok, String.t()} | {:error, :unauthorized}
  def operator_for_token(nil), do: {:error, :unauthorized}

  def operator_for_token(token) do
    Application.get_env(:observatory, :operator_tokens, %{})
    |> Enum.find(fn {known, _name} -> same?(known, token) end)
    |> case do
      {_, name} -> {:ok, name}
      nil -> {:error, :unauthorized}
    end
  end

  @doc "An agent key or an operator token: `{:ok, {:agent, agent}}` or `{:ok, {:operator, name}}`."
  @spec agent_or_operator(Conn.t()) ::
          {:ok, {:agent, agent()} | {:operator, String.t()}} | {:error, :unauthorized}
  def agent_or_operator(conn) do
    with {:error, :unauthorized} <- conn |> agent_key() |> agent_for_key() |> tagged(:agent),
         {:error, :unauthorized} <- conn |> bearer() |> operator_for_token() |> tagged(:operator) do
      count_failure({:error, :unauthorized}, conn)
    end
  end

  defp tagged({:ok, who}, role), do: {:ok, {role, who}}
  defp tagged(error, _role), do: error

  @doc "Whether the request presents a credential (a bearer token or an agent key header)."
  @spec credential?(Conn.t()) :: boolean()
  def credential?(conn), do: agent_key(conn) != nil

  @doc """
  Whether the request's credential is valid for someone: an agent key or an operator
  token, whatever the route wants.
  """
  @spec valid_credential?(Conn.t()) :: boolean()
  def valid_credential?(conn), do: known?(agent_key(conn)) or known?(bearer(conn))

  defp known?(nil), do: false

  defp known?(credential),
    do:
      match?({:ok, _}, agent_for_key(credential)) or
        match?({:ok, _}, operator_for_token(credential))

  # A wrong credential counts against the client. Not a guess: no credential at all,
  # or one that is valid for another role (an agent key on an operator route).
  defp count_failure(result, conn), do: count_failure(result, conn, agent_key(conn))

  defp count_failure({:error, :unauthorized} = error, conn, presented)
       when is_binary(presented) and presented != "" do
    unless known?(presented), do: AuthThrottle.failure(conn.remote_ip, presented)
    error
  end

  defp count_failure(result, _conn, _presented), do: result

  @doc "The agent key a request presents (`Authorization: Bearer`, `X-Agent-Key` or `X-Api-Key`), or nil."
  @spec presented_key(Conn.t()) :: String.t() | nil
  def presented_key(conn), do: agent_key(conn)

  defp agent_key(conn),
    do: bearer(conn) || Conn.header(conn, "x-agent-key") || Conn.header(conn, "x-api-key")

  @typedoc "An error for a proxied API to render in its own shape."
  @type proxy_error :: {pos_integer(), type :: String.t(), code :: String.t(), String.t()}

  @doc """
  The agent a proxied LLM request acts as, for every proxied API: the key's agent.
  `X-Agent-Id` may be left out and, if sent, must name that agent (`403
  agent_id_mismatch`). Only an insecure shared key takes `X-Agent-Id` on trust (and
  then needs it). Errors are `{status, type, code, message}`.
  """
  @spec proxy_agent(Conn.t()) :: {:ok, String.t()} | {:error, proxy_error()}
  def proxy_agent(conn) do
    case agent(conn) do
      {:ok, agent} ->
        named_agent(agent, Conn.header(conn, "x-agent-id"))

      {:error, :unauthorized} ->
        {:error, {401, "invalid_request_error", "invalid_api_key", "send a valid agent key"}}
    end
  end

  defp named_agent(:any_agent, nil),
    do: {:error, {400, "invalid_request_error", "missing_agent_id", "send an X-Agent-Id header"}}

  defp named_agent(:any_agent, id) do
    if Observatory.KillSwitch.valid_agent_id?(id),
      do: {:ok, id},
      else:
        {:error,
         {400, "invalid_request_error", "invalid_agent_id",
          "X-Agent-Id must be 1 to 256 bytes of UTF-8 without control characters"}}
  end

  defp named_agent(agent, nil), do: {:ok, agent}
  defp named_agent(agent, agent), do: {:ok, agent}

  defp named_agent(_agent, _other),
    do:
      {:error,
       {403, "invalid_request_error", "agent_id_mismatch",
        "X-Agent-Id names another agent than the one this key belongs to"}}

  @doc "Whether an authenticated agent may act as `agent_id`: only as itself."
  @spec acts_as?(agent(), String.t()) :: boolean()
  def acts_as?(:any_agent, _agent_id), do: true
  def acts_as?(agent, agent_id), do: agent == agent_id

  @doc """
  Whether an authenticated agent may read or add to a session: `{:error, :forbidden}`
  when another agent owns the session (`Observatory.Gateway.SessionOwners`, read on
  the session's node), `{:error, :owner_unavailable}` when that node does not answer
  in a cluster — never allowed for want of an answer.
  """
  @spec session_access(agent(), String.t()) :: :ok | {:error, :forbidden | :owner_unavailable}
  def session_access(:any_agent, _session_id), do: :ok

  def session_access(agent, session_id) do
    case session_owner(session_id) do
      {:ok, owner} when owner in [nil, agent] -> :ok
      {:ok, _other} -> {:error, :forbidden}
      {:error, :owner_unavailable} = error -> error
    end
  end

  @doc "The agent that owns a session (nil for none), read on the session's node."
  @spec session_owner(String.t()) :: {:ok, String.t() | nil} | {:error, :owner_unavailable}
  def session_owner(session_id),
    do: Observatory.Cluster.call_owner(session_id, SessionOwners, :owner, [session_id])

  defp shared_key?(key) do
    Application.get_env(:observatory, :insecure_shared_agent_keys, false) and
      Enum.any?(Application.get_env(:observatory, :agent_keys, []), &same?(&1, key))
  end

  defp bearer(conn) do
    case Conn.header(conn, "authorization") do
      "Bearer " <> token -> String.trim(token)
      "bearer " <> token -> String.trim(token)
      _ -> nil
    end
  end

  defp same?(known, presented) when is_binary(known) and is_binary(presented) do
    :crypto.hash_equals(:crypto.hash(:sha256, known), :crypto.hash(:sha256, presented))
  end

  defp same?(_, _), do: false
end
