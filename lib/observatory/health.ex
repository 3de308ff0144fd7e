defmodule Observatory.Health do
  @moduledoc """
  Whether each part the gateway needs is up, for `GET /healthz` and for a host app's
  own health check.

  | check | up when |
  |---|---|
  | `data_dir_lock` | this application holds the data directory's lock |
  | `mnesia` | Mnesia runs and the agent, pause and block tables can be read |
  | `pubsub` | the event bus named in `config :observatory, :pubsub` runs (Observatory's own, or the host's) |
  | `tracker` | the entropy tracker runs and its store answers |
  | `gateway` | HITL, the step detector, the loop verdict, the call breaker and the session log run |
  | `kill_switch` | the kill switch's window store runs |
  | `endpoint` | the HTTP listener runs (when the server is configured on) |
  | `cluster` | clustering is off, or this node's Mnesia runs with a majority of the cluster's nodes (`"degraded"` otherwise: see `Observatory.Cluster.status/0`) |

      Observatory.Health.check()
      #=> {:ok, %{"mnesia" => "ok", "tracker" => "ok", ...}}
      #   or {:error, %{"mnesia" => "down", ...}} when any check fails
  """

  alias Observatory.Gateway

  @tables [:observatory_agents, :observatory_hitl_pauses, :observatory_step_blocks]
  @gateway [
    Gateway.HITL,
    Gateway.StepDetector,
    Gateway.LoopVerdict,
    Gateway.CallBreaker,
    Gateway.SessionLog
  ]

  @doc """
  Every check, `"ok"` or `"down"`; `:ok` only when all are ok.

  No check waits behind request work: none calls a NIF on a dirty scheduler (where a
  large step's parse runs) or a process that handles requests.
  """
  @spec check() :: {:ok | :error, %{String.t() => String.t()}}
  def check do
    checks =
      for {name, up?} <- checks(), into: %{} do
        {name, if(safely(up?), do: "ok", else: "down")}
      end

    checks =
      if Observatory.Cluster.enabled?(),
        do: Map.put(checks, "cluster", if(majority?(), do: "ok", else: "degraded")),
        else: checks

    if Enum.all?(checks, fn {_, status} -> status == "ok" end),
      do: {:ok, checks},
      else: {:error, checks}
  end

  @doc """
  The cluster as `/healthz` shows it: `%{}` when clustering is off, else
  `%{cluster: %{...}}` with the members, the nodes this node's Mnesia runs with, the
  unreachable ones, whether it has a majority, what it refuses without one, and the
  latest heal (`Observatory.Cluster.status/0`).
  """
  @spec cluster() :: map()
  def cluster do
    if Observatory.Cluster.enabled?() do
      status = Observatory.Cluster.status()

      %{
        cluster:
          status
          |> Map.take([
            :members,
            :running,
            :unreachable,
            :inconsistent,
            :majority,
            :refused,
            :healing
          ])
          |> Map.put(:node, node())
          |> Map.put(:last_heal, heal_summary(status.last_heal))
      }
    else
      %{}
    end
  end

  defp heal_summary(nil), do: nil

  defp heal_summary(report) do
    report
    |> Map.take([:at, :winner, :losers, :duration_ms, :changed, :notes])
    |> Map.update(:at, nil, &DateTime.to_iso8601/1)
  end

  defp majority? do
    safely(&Observatory.Cluster.majority?/0)
  end

  defp checks do
    [
      {"data_dir_lock", &Observatory.DataDirLock.held?/0},
      {"mnesia", fn -> Observatory.Storage.available?(@tables) end},
      {"pubsub", &pubsub?/0},
      {"tracker", fn -> is_integer(Gateway.EntropyTracker.session_count()) end},
      {"gateway", fn -> Enum.all?(@gateway, &alive?/1) end},
      {"kill_switch", fn -> alive?(Observatory.KillSwitch.Windows) end}
    ] ++ endpoint()
  end

  defp endpoint do
    if ObservatoryWeb.Endpoint.server?(),
      do: [{"endpoint", fn -> alive?(ObservatoryWeb.Endpoint) end}],
      else: []
  end

  defp pubsub?, do: Observatory.Gateway.Events.running?()

  defp alive?(name) do
    case Process.whereis(name) do
      nil -> false
      pid -> Process.alive?(pid)
    end
  end

  defp safely(fun) do
    fun.() == true
  rescue
    _ -> false
  catch
    :exit, _ -> false
  end
end
