defmodule Observatory.KillSwitch.Agents do
  @moduledoc """
  Durable agent records and their events, in Mnesia with disc copies (seed 003,
  "Deactivation Reason Tracking" and "Record kill switch event").

  An agent record:

      %{
        id: "agent-7",
        active: true,
        deactivated_by: nil,            # :kill_switch | :manual | nil
        deactivated_at: nil,            # DateTime | nil
        reactivated_from: nil,          # the deactivated_at an activation undid
        kill_switch: %{enabled: false, window_size: 5, threshold: 5.5, mode: :enforce},
        notification_webhook: nil,      # URL | nil (stored sealed: Observatory.AtRest)
        notification_webhook_unreadable: false, # sealed under another key: enter it again
        guidance: nil,                  # true | false | nil (the configured default)
        budget: %{mode: :enforce, session_tokens: nil, …},  # Observatory.Budget.Settings
        created_at: ~U[...], updated_at: ~U[...]
      }

  Events are `%{id, agent_id, event_type, at, details}` with `event_type` one of
  `"kill_switch"` (the switch stopped the agent; details carry the score, the
  threshold, the window and the three signal counts), `"kill_switch_would_trip"` (in
  `shadow` or `warn` mode: it would have), `"manual_deactivation"`, `"activation"`,
  `"settings_changed"` (details carry the operator), `"guidance_injected"` (a note was
  appended to a proxied request), `"budget_exhausted"`, `"budget_would_exhaust"` and
  `"budget_reset"`. An agent keeps its newest `:max_events_per_agent` events (10,000).

  ## Storage

  Two tables, `:observatory_agents` (a set keyed by agent id) and
  `:observatory_agent_events` (an ordered set keyed by `{agent_id, at_us, unique}`,
  so one agent's events are one range), both `disc_copies`: reads are local ETS
  lookups, every write is a transaction logged to disk. Writes here are rare (first
  use of an agent, operator actions, a tripped switch), so each is a
  `sync_transaction` followed by `:mnesia.sync_log/0`: when a call returns, the change
  is on disk.

  Records are stored as maps and merged over the defaults when read, so a field added
  in a later release needs no table transform.

  `setup/1` runs before anything reads the tables (the kill switch supervisor calls it
  in `init/1`). It starts Mnesia in `dir/0` (the host's `config :mnesia, dir:`, or
  `<:data_dir>/mnesia/<node>`), creating the schema on first start — one directory per
  node name, because a Mnesia schema belongs to the node that created it. If Mnesia is
  already running (a host application started it), its directory is used and a
  RAM-only schema is turned into a disc one.
  """

  require Logger

  alias Observatory.AtRest
  alias Observatory.Cluster.Tombstones
  alias Observatory.KillSwitch.{Settings, WebhookURL}
  alias Observatory.Storage

  @agents :observatory_agents
  @events :observatory_agent_events
  @keys Observatory.AgentKeys.table()
  # Signed-out dashboard sessions (ObservatoryWeb.Dashboard.Session): sid → expiry.
  @revoked_sessions :observatory_revoked_sessions
  # Agent events trimmed to :max_events_per_agent once in this many recorded events.
  @trim_every 64
  @tables [@agents, @events, @keys, @revoked_sessions]

  @type deactivated_by :: :kill_switch | :manual | nil
  @type agent :: %{
          id: String.t(),
          active: boolean(),
          deactivated_by: deactivated_by(),
          deactivated_at: DateTime.t() | nil,
          reactivated_from: DateTime.t() | nil,
          kill_switch: %{
            enabled: boolean(),
            window_size: pos_integer(),
            threshold: float(),
            mode: :enforce | :warn | :shadow
          },
          notification_webhook: String.t() | nil,
          notification_webhook_unreadable: boolean(),
          guidance: boolean() | nil,
          budget: Observatory.Budget.Settings.t(),
          created_at: DateTime.t(),
          updated_at: DateTime.t()
        }
  @type event :: %{
          id: String.t(),
          agent_id: String.t(),
          event_type: String.t(),
          at: DateTime.t(),
          details: map()
        }

  ## Setup

  @doc """
  Starts Mnesia if needed and creates the tables if missing; waits until they are
  loaded. Raises when Mnesia cannot be started or the tables cannot be loaded.

  ## Options
    * `:dir` — Mnesia's directory, default `dir/0`.
    * `:timeout` — how long to wait for the tables, default the cluster's
      `:load_timeout_ms` (30 s).
  """
  @spec setup(keyword()) :: :ok
  def setup(opts \\ []) do
    dir = Keyword.get_lazy(opts, :dir, &dir/0)

    cond do
      :mnesia.system_info(:is_running) in [:yes, :starting] -> adopt_running(dir)
      # In a cluster a new node joins it, a restarted one starts on its own copy.
      Observatory.Cluster.Store.start(dir) != :local -> :ok
      true -> start(dir)
    end

    create_table(@agents, attributes: [:id, :agent], type: :set)
    create_table(@events, attributes: [:key, :event], type: :ordered_set)
    # Agent keys (`Observatory.AgentKeys`): hash → agent, indexed by agent.
    create_table(@keys, attributes: [:hash, :agent_id, :info], type: :set, index: [:agent_id])
    create_table(@revoked_sessions, attributes: [:sid, :expires], type: :set)

    case opts[:timeout] do
      # Says which tables wait, where their copies are, and what to do.
      nil -> Observatory.Cluster.Store.await_tables(@tables)
      timeout -> :ok = :mnesia.wait_for_tables(@tables, timeout)
    end

    seal_plain_webhooks()
  end

  # Webhook URLs written in plain by an older release: sealed, and the copies in
  # "settings_changed" events redacted. Nothing to do once done.
  defp seal_plain_webhooks do
    agents =
      :mnesia.dirty_select(@agents, [
        {{@agents, :"$1", :"$2"}, [{:is_binary, {:map_get, :notification_webhook, :"$2"}}],
         [:"$1"]}
      ])

    events =
      :mnesia.dirty_select(@events, [{{@events, :"$1", :"$2"}, [], [{{:"$1", :"$2"}}]}])
      |> Enum.filter(fn {_key, event} ->
        is_binary(get_in(event, [:details, :changes, :notification_webhook]))
      end)

    if agents != [] or events != [] do
      Storage.transaction("agent store", fn ->
        for id <- agents, agent = read(id), do: write(agent)

        for {key, event} <- events do
          event =
            update_in(event, [:details, :changes, :notification_webhook], &WebhookURL.redact/1)

          :mnesia.write({@events, key, event})
        end
      end)

      Logger.info(
        "sealed #{length(agents)} webhook URL(s) stored in plain by an older release, " <>
          "redacted #{length(events)} in events"
      )
    end

    :ok
  end

  @doc """
  Mnesia's directory for this node: the host app's `config :mnesia, dir:` when it set
  one (Mnesia is one per node: its tables go there), else `<:data_dir>/mnesia/<node>`.
  Raises when neither is configured: no directory is shared by chance.
  """
  @spec dir() :: String.t()
  def dir do
    case {Application.get_env(:mnesia, :dir), Application.get_env(:observatory, :data_dir)} do
      {nil, nil} ->
        raise ArgumentError, """
        Observatory keeps its state on disk (agents, keys, pauses, blocks) and has no \
        directory for it: set config :observatory, :data_dir (or config :mnesia, :dir). \
        Somewhere outside your release and your git tree, one per environment, e.g.

            # config/dev.exs and config/test.exs (phx.new's .gitignore has /tmp/)
            config :observatory, data_dir: Path.expand("../tmp/observatory/\#{config_env()}", __DIR__)

            # config/runtime.exs, in prod: a directory that outlives deploys
            config :observatory, data_dir: System.fetch_env!("OBSERVATORY_DATA_DIR")
        """

      {nil, data_dir} ->
        Path.expand(Path.join([data_dir, "mnesia", Atom.to_string(node())]))

      {mnesia_dir, _data_dir} ->
        Path.expand(to_string(mnesia_dir))
    end
  end

  defp start(dir) do
    File.mkdir_p!(dir)
    _ = Application.load(:mnesia)
    Application.put_env(:mnesia, :dir, String.to_charlist(dir))

    case :mnesia.create_schema([node()]) do
      :ok -> Logger.info("created the Mnesia schema in #{dir}")
      {:error, {_, {:already_exists, _}}} -> :ok
      {:error, reason} -> raise "cannot create the Mnesia schema in #{dir}: #{inspect(reason)}"
    end

    case Application.ensure_all_started(:mnesia) do
      {:ok, _} -> :ok
      {:error, reason} -> raise "cannot start Mnesia in #{dir}: #{inspect(reason)}"
    end
  end

  # Mnesia started before Observatory (a host that lists :mnesia in its
  # extra_applications starts it first, in Mnesia's default directory, its schema in
  # RAM). Observatory keeps its tables only in the directory it was given:
  #   - Mnesia runs there: the schema is put on disc;
  #   - it runs elsewhere with nothing in it yet (a RAM schema, no table): it is started
  #     again in the given directory, so no `Mnesia.<node>` folder appears;
  #   - it runs elsewhere with tables or a schema on disc (the host's data): refused, with
  #     the setting that makes both one directory.
  defp adopt_running(dir) do
    running = Path.expand(to_string(:mnesia.system_info(:directory)))

    cond do
      running == dir ->
        disc_schema!()

      :mnesia.table_info(:schema, :storage_type) == :ram_copies and
          :mnesia.system_info(:tables) == [:schema] ->
        Logger.info("Mnesia was started in #{running} with nothing in it; starting it in #{dir}")
        :stopped = :mnesia.stop()
        start(dir)

      true ->
        raise "Mnesia runs in #{running} (started before Observatory, with data of its own), " <>
                "not in #{dir}, the directory Observatory was given: set config :mnesia, dir: " <>
                "to one directory for both (Observatory then keeps its tables there)"
    end
  end

  defp disc_schema! do
    if :mnesia.table_info(:schema, :storage_type) == :ram_copies do
      case :mnesia.change_table_copy_type(:schema, node(), :disc_copies) do
        {:atomic, :ok} -> :ok
        {:aborted, reason} -> raise "cannot keep the Mnesia schema on disc: #{inspect(reason)}"
      end
    end
  end

  # disc_copies on every node of the cluster (one node when clustering is off).
  defp create_table(name, opts), do: Observatory.Cluster.Store.ensure_table(name, opts)

  @doc false
  # The agents table (the proxy follows deactivations in it: Observatory.Proxy.OpenRequests).
  def table, do: @agents

  @doc false
  # Every table of agents, their events and keys, and signed-out dashboard sessions.
  def tables, do: @tables

  ## Reads (local, no transaction)

  @doc "The agent, or nil."
  @spec get(String.t()) :: agent() | nil
  def get(id) when is_binary(id) do
    case :mnesia.dirty_read(@agents, id) do
      [{@agents, ^id, stored}] -> upgrade(id, stored)
      [] -> nil
    end
  end

  @doc """
  Whether the agent may act: false once deactivated, true when active or not
  registered. One local read and no record built: ingest asks on every step.
  """
  @spec active?(String.t()) :: boolean()
  def active?(id) when is_binary(id) do
    case Storage.read(@agents, id) do
      [{@agents, ^id, stored}] -> Map.get(stored, :active, true)
      [] -> true
    end
  end

  @doc "Whether the agent is registered (one local read, no record built)."
  @spec exists?(String.t()) :: boolean()
  def exists?(id) when is_binary(id), do: :mnesia.dirty_read(@agents, id) != []

  @doc "Every agent, sorted by id."
  @spec list() :: [agent()]
  def list do
    @agents
    |> :mnesia.dirty_select([{{@agents, :"$1", :"$2"}, [], [{{:"$1", :"$2"}}]}])
    |> Enum.map(fn {id, stored} -> upgrade(id, stored) end)
    |> Enum.sort_by(& &1.id)
  end

  @doc "How many agents are registered."
  @spec count() :: non_neg_integer()
  def count, do: :mnesia.table_info(@agents, :size)

  @doc """
  Events newest first. Options: `:agent_id` (one agent's only), `:limit` (default 50).
  """
  @spec events(keyword()) :: [event()]
  def events(opts \\ []) do
    limit = Keyword.get(opts, :limit, 50)

    pattern =
      case Keyword.get(opts, :agent_id) do
        nil -> {@events, :_, :"$1"}
        id -> {@events, {id, :_, :_}, :"$1"}
      end

    @events
    |> :mnesia.dirty_select([{pattern, [], [:"$1"]}])
    |> Enum.sort_by(&{DateTime.to_unix(&1.at, :microsecond), &1.id}, :desc)
    |> Enum.take(limit)
  end

  ## Writes (transactions, synced to disk)

  @doc """
  The agent, registered with the default settings if it is new. Refuses a new agent
  when `max_agents` are registered already, unless `limit: false` (configured seeds).

  Only operator actions register agents (issuing a key, configuring the switch);
  requests never do (issue 13).
  """
  @spec fetch_or_register(String.t(), keyword()) :: {:ok, agent()} | {:error, :agent_limit}
  def fetch_or_register(id, opts \\ []) when is_binary(id) do
    case get(id) do
      nil ->
        Storage.transaction("agent store", fn ->
          read_or_create(id, Keyword.get(opts, :limit, true))
        end)

      agent ->
        {:ok, agent}
    end
  end

  @doc """
  Inside a Mnesia transaction: whether the agent exists, read-locking its record so a
  concurrent `delete/1` is ordered before or after the caller's writes.
  """
  @spec exists_in_transaction?(String.t()) :: boolean()
  def exists_in_transaction?(id), do: :mnesia.read(@agents, id, :read) != []

  @doc """
  Deletes the agent, its events and its keys in one transaction. Returns the ids of
  the revoked keys.
  """
  @spec delete(String.t()) :: {:ok, [String.t()]} | {:error, :not_found}
  def delete(id) when is_binary(id) do
    Storage.transaction("agent store", fn ->
      case read(id) do
        nil ->
          {:error, :not_found}

        agent ->
          :mnesia.delete({@agents, id})
          # In a cluster, a replica that missed the deletion must not bring it back.
          Tombstones.bury(@agents, id, agent.created_at)

          for {@events, key, _} <- :mnesia.match_object({@events, {id, :_, :_}, :_}),
              do: :mnesia.delete({@events, key})

          keys = :mnesia.index_read(@keys, id, :agent_id)

          for {@keys, hash, ^id, _} <- keys do
            :mnesia.delete({@keys, hash})
            Tombstones.bury(@keys, hash, :revoked)
          end

          {:ok, for({@keys, _, ^id, info} <- keys, do: info.key_id)}
      end
    end)
  end

  @doc """
  Applies validated settings (see `Observatory.KillSwitch.Settings`), registering the
  agent first if it is new; records a `"settings_changed"` event.
  Returns the agent before and after, and the event.
  """
  @spec configure(String.t(), Settings.changes(), map()) ::
          {:ok, before :: agent(), after_ :: agent(), event()} | {:error, :agent_limit}
  def configure(id, changes, details \\ %{}) do
    Storage.transaction("agent store", fn ->
      with {:ok, before} <- read_or_create(id, true) do
        {ks, top} = Map.split(changes, [:enabled, :window_size, :threshold, :mode])
        now = now()

        updated =
          before
          |> Map.merge(Map.take(top, [:notification_webhook]))
          |> Map.update!(:kill_switch, &Map.merge(&1, ks))
          |> Map.put(:updated_at, now)

        write(updated)
        # The event keeps what changed, a webhook URL only redacted: it is a secret.
        logged =
          if Map.has_key?(changes, :notification_webhook),
            do: Map.update!(changes, :notification_webhook, &WebhookURL.redact/1),
            else: changes

        event = write_event(id, "settings_changed", Map.put(details, :changes, logged), now)
        {:ok, before, updated, event}
      end
    end)
  end

  @doc """
  Applies validated changes to one section of the agent's settings — `:budget` (merged,
  see `Observatory.Budget.Settings`) or `:guidance` (`true`, `false` or `nil`) — and
  records a `"settings_changed"` event. The agent must exist. Returns the agent before
  and after, and the event.
  """
  @spec configure_section(String.t(), :budget | :guidance, term(), map()) ::
          {:ok, agent(), agent(), event()} | {:error, :not_found}
  def configure_section(id, section, changes, details \\ %{})
      when section in [:budget, :guidance] do
    Storage.transaction("agent store", fn ->
      case read(id) do
        nil ->
          {:error, :not_found}

        before ->
          now = now()

          value =
            case section do
              :budget -> Map.merge(before.budget, changes)
              :guidance -> changes
            end

          updated = before |> Map.put(section, value) |> Map.put(:updated_at, now)
          write(updated)

          event =
            write_event(
              id,
              "settings_changed",
              Map.put(details, :changes, %{section => changes}),
              now
            )

          {:ok, before, updated, event}
      end
    end)
  end

  @doc """
  Records an event of a registered agent (a guidance note, a budget stop, a would-trip):
  one transaction, not waited on to reach the disk, so the proxy's request is not held
  by it. Returns `{:ok, event}`, or `{:error, :not_found}` when the agent is gone.
  Every #{@trim_every}th event of a node trims the agent's oldest beyond
  `:max_events_per_agent`.
  """
  @spec record_event(String.t(), String.t(), map()) :: {:ok, event()} | {:error, :not_found}
  def record_event(id, type, details) when is_binary(id) and is_binary(type) do
    result =
      :mnesia.transaction(fn ->
        if :mnesia.read(@agents, id, :read) == [],
          do: {:error, :not_found},
          else: {:ok, write_event(id, type, details, now())}
      end)

    case result do
      {:atomic, {:ok, _} = ok} ->
        maybe_trim(id)
        ok

      {:atomic, error} ->
        error

      {:aborted, reason} ->
        raise "agent event transaction aborted: #{inspect(reason)}"
    end
  end

  defp maybe_trim(id) do
    counter = :persistent_term.get({__MODULE__, :trim_counter}, nil) || trim_counter()

    if :atomics.add_get(counter, 1, 1) |> rem(@trim_every) == 0 do
      max =
        Keyword.get(
          Application.get_env(:observatory, :kill_switch, []),
          :max_events_per_agent,
          10_000
        )

      keys =
        :mnesia.dirty_select(@events, [{{@events, {id, :_, :_}, :_}, [], [{:element, 2, :"$_"}]}])

      excess = length(keys) - max

      if excess > 0 do
        old = keys |> Enum.sort() |> Enum.take(excess)
        :mnesia.transaction(fn -> for key <- old, do: :mnesia.delete({@events, key}) end)
      end
    end

    :ok
  end

  defp trim_counter do
    counter = :atomics.new(1, [])
    :persistent_term.put({__MODULE__, :trim_counter}, counter)
    counter
  end

  @doc """
  Sets `active: false` and `deactivated_by`, and records the event in the same
  transaction: `"kill_switch"` for `:kill_switch`, `"manual_deactivation"` for
  `:manual`. An agent that is already inactive is left as it is.
  """
  @spec deactivate(String.t(), :kill_switch | :manual, map()) ::
          {:ok, agent(), event()} | {:error, :not_found | :already_inactive}
  def deactivate(id, by, details \\ %{}) when by in [:kill_switch, :manual] do
    type = if by == :kill_switch, do: "kill_switch", else: "manual_deactivation"

    Storage.transaction("agent store", fn ->
      case read(id) do
        nil ->
          {:error, :not_found}

        %{active: false} ->
          {:error, :already_inactive}

        agent ->
          now = now()

          agent = %{
            agent
            | active: false,
              deactivated_by: by,
              deactivated_at: now,
              updated_at: now
          }

          write(agent)
          {:ok, agent, write_event(id, type, details, now)}
      end
    end)
  end

  @doc """
  Sets `active: true` and clears `deactivated_by`; records an `"activation"` event
  with the reason it had been deactivated for.
  """
  @spec activate(String.t(), map()) ::
          {:ok, agent(), event()} | {:error, :not_found | :already_active}
  def activate(id, details \\ %{}) do
    Storage.transaction("agent store", fn ->
      case read(id) do
        nil ->
          {:error, :not_found}

        %{active: true} ->
          {:error, :already_active}

        agent ->
          now = now()
          details = Map.put(details, :previously_deactivated_by, agent.deactivated_by)

          # Which deactivation this activation undid: a cluster that reconciles two
          # versions of the agent keeps it active only over that very deactivation.
          agent = %{
            agent
            | active: true,
              deactivated_by: nil,
              deactivated_at: nil,
              reactivated_from: agent.deactivated_at,
              updated_at: now
          }

          write(agent)
          {:ok, agent, write_event(id, "activation", details, now)}
      end
    end)
  end

  ## Internals

  defp read_or_create(id, limit?) do
    case read(id) do
      nil ->
        if limit? and count() >= max_agents() do
          {:error, :agent_limit}
        else
          agent = new(id, now())
          write(agent)
          {:ok, agent}
        end

      agent ->
        {:ok, agent}
    end
  end

  defp read(id) do
    case :mnesia.read(@agents, id, :write) do
      [{@agents, ^id, stored}] -> upgrade(id, stored)
      [] -> nil
    end
  end

  # The webhook URL is stored sealed (Observatory.AtRest), bound to the agent's id.
  defp write(agent) do
    stored =
      agent
      |> Map.delete(:notification_webhook_unreadable)
      |> Map.update!(:notification_webhook, fn
        nil -> nil
        url -> AtRest.seal(url, webhook_aad(agent.id))
      end)

    :mnesia.write({@agents, agent.id, stored})
  end

  defp webhook_aad(id), do: "notification_webhook:" <> id

  defp write_event(agent_id, type, details, at) do
    at_us = DateTime.to_unix(at, :microsecond)
    unique = System.unique_integer([:positive, :monotonic])

    event = %{
      id: "#{at_us}-#{unique}",
      agent_id: agent_id,
      event_type: type,
      at: at,
      details: details
    }

    :mnesia.write({@events, {agent_id, at_us, unique}, event})
    event
  end

  defp new(id, now) do
    config = Application.get_env(:observatory, :kill_switch, [])

    %{
      id: id,
      active: true,
      deactivated_by: nil,
      deactivated_at: nil,
      kill_switch: %{
        enabled: false,
        window_size: Keyword.get(config, :window_size, 5),
        threshold: Keyword.get(config, :threshold, 5.5) / 1,
        mode: Keyword.get(config, :mode, :enforce)
      },
      notification_webhook: nil,
      notification_webhook_unreadable: false,
      guidance: nil,
      budget: Observatory.Budget.Settings.defaults(),
      reactivated_from: nil,
      created_at: now,
      updated_at: now
    }
  end

  # Records written by an older release lack newer fields: fill them with defaults.
  # A webhook URL sealed under another key (the secret_key_base changed) cannot be
  # read: the agent has none until an operator enters it again, and says so.
  defp upgrade(id, stored) do
    defaults = new(id, Map.get(stored, :created_at, now()))

    {webhook, unreadable?} =
      case Map.get(stored, :notification_webhook) do
        nil ->
          {nil, false}

        value ->
          case AtRest.unseal(value, webhook_aad(id)) do
            {:ok, url} -> {url, false}
            {:error, _} -> {nil, true}
          end
      end

    defaults
    |> Map.merge(stored)
    |> Map.put(:kill_switch, Map.merge(defaults.kill_switch, Map.get(stored, :kill_switch, %{})))
    |> Map.put(:budget, Map.merge(defaults.budget, Map.get(stored, :budget, %{})))
    |> Map.put(:notification_webhook, webhook)
    |> Map.put(:notification_webhook_unreadable, unreadable?)
  end

  defp max_agents do
    Application.get_env(:observatory, :kill_switch, []) |> Keyword.get(:max_agents, 10_000)
  end

  defp now, do: DateTime.utc_now() |> DateTime.truncate(:microsecond)
end
