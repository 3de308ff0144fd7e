defmodule ObservatoryWeb.Auth do
  @moduledoc """
  Agent keys and operator tokens.

  Agents send `Authorization: Bearer <agent key>` (or `X-Agent-Key: <key>`);
  operators send `Authorization: Bearer <operator token>`. Keys are compared in
  constant time on their SHA-256 digests.

      config :observatory, :agent_keys, ["key-1", "key-2"]
      config :observatory, :operator_tokens, %{"token-of-alice" => "alice"}

  With none configured, every request is refused (there is no open default); in
  `:dev` the config ships development values, and `config/runtime.exs` reads
  `OBSERVATORY_AGENT_KEYS` and `OBSERVATORY_OPERATOR_TOKENS`.
  """

  alias ObservatoryWeb.Conn

  @doc "`{:ok, :agent}` when the request carries a configured agent key."
  @spec agent(Conn.t()) :: {:ok, :agent} | {:error, :unauthorized}
  def agent(conn) do
    keys = Application.get_env(:observatory, :agent_keys, [])
    presented = bearer(conn) || Conn.header(conn, "x-agent-key")

    if presented && Enum.any?(keys, &same?(&1, presented)),
      do: {:ok, :agent},
      else: {:error, :unauthorized}
  end

  @doc "`{:ok, operator_name}` when the request carries a configured operator token."
  @spec operator(Conn.t()) :: {:ok, String.t()} | {:error, :unauthorized}
  def operator(conn), do: operator_for_token(bearer(conn))

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

  @doc "An agent key or an operator token: either may read session state."
  @spec agent_or_operator(Conn.t()) :: {:ok, term()} | {:error, :unauthorized}
  def agent_or_operator(conn) do
    with {:error, _} <- agent(conn), do: operator(conn)
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
