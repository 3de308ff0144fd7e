defmodule Observatory.AgentKeys do
  @moduledoc """
  Per-agent credentials (issue 13): every agent key is bound to one agent id, and a
  request made with it acts as that agent and no other.

  Operators issue, rotate and revoke keys (`ObservatoryWeb.API.Agents`, or the
  functions here). Issuing the first key of an agent registers the agent: agents exist
  because an operator gave them a credential, never because a request named them.

      {:ok, %{key: key, key_id: key_id}} = Observatory.AgentKeys.issue("agent-7")
      # `key` is shown this once: only its SHA-256 is stored
      {:ok, "agent-7"} = Observatory.AgentKeys.authenticate(key)
      {:ok, %{key: new_key, revoked: [^key_id]}} = Observatory.AgentKeys.rotate("agent-7")
      :ok = Observatory.AgentKeys.revoke("agent-7", new_key_id)

  ## Storage

  Mnesia, `disc_copies`, next to the agent records (`Observatory.KillSwitch.Agents`
  creates the table): `{:observatory_agent_keys, sha256(key), agent_id, info}` with
  an index on the agent id. The key itself is never stored. An issued key is
  `"oak_"` and 43 characters of 256 random bits, so a plain SHA-256 is enough to keep
  it (a slow password hash protects guessable secrets; these are not). A request's
  key is looked up by its hash — a local ETS read — and is valid while its agent
  exists. Its public `key_id` is the first 16 hex digits of the hash.

  ## Seeded keys (development and tests)

      config :observatory, :seed_agent_keys, %{"agent-1" => "dev-agent-key"}

  At every start each pair's agent is registered if needed and its key's hash
  stored (the config ships one in `:dev` so the README's first step works). A seeded
  key revoked through the API comes back at the next start: remove it from the
  config to revoke it for good. Production configures none.
  """

  require Logger

  alias Observatory.KillSwitch.Agents
  alias Observatory.Storage

  @table :observatory_agent_keys
  @prefix "oak_"
  @max_keys_per_agent 10

  @type key_info :: %{
          key_id: String.t(),
          agent_id: String.t(),
          created_at: DateTime.t(),
          seeded: boolean()
        }

  @doc false
  def table, do: @table

  @doc "How many keys an agent may hold at once."
  def max_keys_per_agent, do: @max_keys_per_agent

  @doc """
  Seeds the configured `:seed_agent_keys`. Called once Mnesia and the tables are up
  (`Observatory.KillSwitch.Supervisor`). Raises on a configuration it cannot honour.
  """
  @spec setup() :: :ok
  def setup do
    check_shared_keys!()

    seeds = Application.get_env(:observatory, :seed_agent_keys, %{})

    unless is_map(seeds) do
      raise ArgumentError,
            "expected :seed_agent_keys to be a map of agent id => key, got: #{inspect(seeds)}"
    end

    Enum.each(seeds, fn {agent_id, key} -> seed!(agent_id, key) end)
  end

  # The shared `:agent_keys` of earlier releases let any agent act as any other.
  defp check_shared_keys! do
    shared = Application.get_env(:observatory, :agent_keys, [])

    cond do
      shared in [[], nil] ->
        :ok

      Application.get_env(:observatory, :insecure_shared_agent_keys, false) ->
        Logger.warning(
          "insecure_shared_agent_keys is on: #{length(List.wrap(shared))} shared agent key(s) " <>
            "let any agent act as any other (X-Agent-Id and meta.agent_id are trusted)"
        )

      true ->
        raise ArgumentError,
              ":agent_keys (OBSERVATORY_AGENT_KEYS) holds shared agent keys, which let any " <>
                "agent act as any other. Issue each agent its own key (POST /api/v1/agents/:id/keys) " <>
                "and remove :agent_keys, or set insecure_shared_agent_keys: true " <>
                "(OBSERVATORY_INSECURE_SHARED_AGENT_KEYS=1) to keep them. See docs/security.md."
    end
  end

  defp seed!(agent_id, key) do
    unless Observatory.KillSwitch.valid_agent_id?(agent_id) and is_binary(key) and key != "" do
      raise ArgumentError,
            "expected :seed_agent_keys entries to be agent id => non-empty key, got: " <>
              inspect(agent_id)
    end

    {:ok, _} = Agents.fetch_or_register(agent_id, limit: false)
    hash = hash(key)

    Storage.transaction("agent key", fn ->
      case :mnesia.read(@table, hash, :write) do
        [] ->
          # Seeded again at this start: no longer revoked.
          :mnesia.delete({Observatory.Cluster.Tombstones.table(), {@table, hash, :revoked}})
          write(hash, agent_id, true)

        [{@table, ^hash, ^agent_id, _}] ->
          :ok

        [{@table, ^hash, other, _}] ->
          :mnesia.abort({:seeded_key_taken, other})
      end
    end)
  end

  ## Authentication

  @doc "The agent a presented key belongs to."
  @spec authenticate(String.t() | nil) :: {:ok, String.t()} | {:error, :unauthorized}
  def authenticate(key) when is_binary(key) and key != "" do
    with [{@table, _hash, agent_id, _info}] <- Observatory.Storage.read(@table, hash(key)),
         true <- Agents.exists?(agent_id) do
      {:ok, agent_id}
    else
      _ -> {:error, :unauthorized}
    end
  end

  def authenticate(_key), do: {:error, :unauthorized}

  ## Operator actions

  @doc """
  Issues a new key for `agent_id`, registering the agent if it is new. Returns the key
  in clear — the only time it is available.

  Errors: `:invalid_agent_id`, `:agent_limit` (`:max_agents` registered),
  `:too_many_keys` (the agent holds #{@max_keys_per_agent} already), `:not_found` (the
  agent was deleted meanwhile), `:no_majority` (a cluster node cut off from the
  majority: `Observatory.Cluster.with_majority/2`).
  """
  @spec issue(String.t(), keyword()) ::
          {:ok,
           %{key: String.t(), key_id: String.t(), agent_id: String.t(), created_at: DateTime.t()}}
          | {:error,
             :invalid_agent_id | :agent_limit | :too_many_keys | :not_found | :no_majority}
  def issue(agent_id, opts \\ []) do
    Observatory.Storage.require!()

    Observatory.Cluster.with_majority("issuing a key for #{inspect(agent_id)}", fn ->
      do_issue(agent_id, opts)
    end)
  end

  defp do_issue(agent_id, opts) do
    with :ok <- valid(agent_id),
         {:ok, _agent} <- Agents.fetch_or_register(agent_id) do
      key = @prefix <> Base.url_encode64(:crypto.strong_rand_bytes(32), padding: false)
      hash = hash(key)

      Storage.transaction("agent key", fn ->
        cond do
          # Deleted since it was registered above: no key for an agent that is gone.
          not Agents.exists_in_transaction?(agent_id) -> {:error, :not_found}
          length(hashes_of(agent_id)) >= @max_keys_per_agent -> {:error, :too_many_keys}
          true -> {:ok, write(hash, agent_id, false)}
        end
      end)
      |> case do
        {:ok, info} ->
          Logger.info(
            "agent key #{info.key_id} issued for #{inspect(agent_id)} by #{Observatory.Operator.describe(opts)}"
          )

          {:ok, Map.put(Map.delete(info, :seeded), :key, key)}

        error ->
          error
      end
    end
  end

  @doc """
  Issues a new key and revokes every other key of the agent, in one transaction.
  Returns the new key and the ids of the revoked ones.
  """
  @spec rotate(String.t(), keyword()) ::
          {:ok, map()} | {:error, :invalid_agent_id | :not_found | :no_majority}
  def rotate(agent_id, opts \\ []) do
    Observatory.Storage.require!()

    Observatory.Cluster.with_majority("rotating the keys of #{inspect(agent_id)}", fn ->
      do_rotate(agent_id, opts)
    end)
  end

  defp do_rotate(agent_id, opts) do
    with :ok <- valid(agent_id),
         %{} <- Agents.get(agent_id) || {:error, :not_found} do
      key = @prefix <> Base.url_encode64(:crypto.strong_rand_bytes(32), padding: false)

      Storage.transaction("agent key", fn ->
        if Agents.exists_in_transaction?(agent_id) do
          old = hashes_of(agent_id)
          Enum.each(old, &delete/1)
          {:ok, write(hash(key), agent_id, false), Enum.map(old, &key_id/1)}
        else
          {:error, :not_found}
        end
      end)
      |> case do
        {:ok, info, revoked} ->
          Logger.info(
            "agent key #{info.key_id} issued for #{inspect(agent_id)} by #{Observatory.Operator.describe(opts)}, " <>
              "revoking #{inspect(revoked)}"
          )

          {:ok, info |> Map.delete(:seeded) |> Map.merge(%{key: key, revoked: revoked})}

        error ->
          error
      end
    end
  end

  @doc "Revokes one key of the agent, by its `key_id`."
  @spec revoke(String.t(), String.t(), keyword()) :: :ok | {:error, :not_found}
  def revoke(agent_id, key_id, opts \\ []) do
    Observatory.Storage.require!()

    Storage.transaction("agent key", fn ->
      case Enum.find(hashes_of(agent_id), &(key_id(&1) == key_id)) do
        nil -> {:error, :not_found}
        hash -> delete(hash)
      end
    end)
    |> tap(fn result ->
      if result == :ok,
        do:
          Logger.info(
            "agent key #{key_id} of #{inspect(agent_id)} revoked by #{Observatory.Operator.describe(opts)}"
          )
    end)
  end

  @doc "Revokes every key of the agent; returns their ids."
  @spec revoke_all(String.t()) :: [String.t()]
  def revoke_all(agent_id) do
    Storage.transaction("agent key", fn ->
      old = hashes_of(agent_id)
      Enum.each(old, &delete/1)
      Enum.map(old, &key_id/1)
    end)
  end

  @doc "The agent's keys (never the keys themselves), oldest first."
  @spec list(String.t()) :: [key_info()]
  def list(agent_id) when is_binary(agent_id) do
    Observatory.Storage.require!()

    @table
    |> :mnesia.dirty_index_read(agent_id, :agent_id)
    |> Enum.map(fn {@table, _hash, _agent, info} -> info end)
    |> Enum.sort_by(&DateTime.to_unix(&1.created_at, :microsecond))
  end

  ## Internals

  defp write(hash, agent_id, seeded) do
    info = %{
      key_id: key_id(hash),
      agent_id: agent_id,
      created_at: DateTime.utc_now() |> DateTime.truncate(:microsecond),
      seeded: seeded
    }

    :ok = :mnesia.write({@table, hash, agent_id, info})
    info
  end

  # A revoked key stays revoked: in a cluster its tombstone outlives any replica
  # that missed the revocation (Observatory.Cluster.Tombstones).
  defp delete(hash) do
    :ok = :mnesia.delete({@table, hash})
    Observatory.Cluster.Tombstones.bury(@table, hash, :revoked)
  end

  defp hashes_of(agent_id) do
    for {@table, hash, ^agent_id, _} <- :mnesia.index_read(@table, agent_id, :agent_id), do: hash
  end

  @doc "The digest a key is stored under (the proxy follows revocations by it)."
  @spec hash(String.t()) :: binary()
  def hash(key), do: :crypto.hash(:sha256, key)

  defp key_id(hash), do: hash |> binary_part(0, 8) |> Base.encode16(case: :lower)

  defp valid(agent_id) do
    if Observatory.KillSwitch.valid_agent_id?(agent_id),
      do: :ok,
      else: {:error, :invalid_agent_id}
  end
end
