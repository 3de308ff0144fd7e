defmodule ObservatoryWeb.SessionClusterManager.Socket do
  @moduledoc """
  The smallest LiveView-shaped socket: `assigns` and whether a live connection
  stands behind it.

  `ObservatoryWeb.SessionClusterManager` (and the agents pages,
  `ObservatoryWeb.AgentList` and `ObservatoryWeb.AgentDetail`) are written against
  `socket.assigns` and the two functions here, so the same `mount/3`, `handle_info/2`
  and `handle_event/3` run under two hosts:

    * Observatory's own page server (`ObservatoryWeb.Dashboard.EventStream`) and the
      ExUnit tests pass a `%Socket{}`;
    * `ObservatoryWeb.SessionClusterManagerLive`, `ObservatoryWeb.AgentListLive` and
      `ObservatoryWeb.AgentDetailLive` pass a `Phoenix.LiveView.Socket`, and `assign/3`
      and `connected?/1` defer to `Phoenix.Component.assign/3` and
      `Phoenix.LiveView.connected?/1` so LiveView's change tracking keeps working.

  Phoenix is not a dependency, so those two calls go through `apply/3`: the module
  compiles, without warnings, whether Phoenix is there or not.

      socket = Socket.new(connected?: true)
      socket = Socket.assign(socket, :operator, "alice")
      socket.assigns.operator  #=> "alice"
  """

  defstruct assigns: %{}, connected?: false

  @type t :: %__MODULE__{assigns: map(), connected?: boolean()}

  @doc "A socket with empty assigns; `connected?: true` for a live page."
  @spec new(keyword()) :: t()
  def new(opts \\ []) do
    %__MODULE__{connected?: Keyword.get(opts, :connected?, false)}
  end

  @doc "Puts `value` under `key` in the socket's assigns."
  @spec assign(socket, atom(), term()) :: socket when socket: var
  def assign(%__MODULE__{assigns: assigns} = socket, key, value) when is_atom(key) do
    %{socket | assigns: Map.put(assigns, key, value)}
  end

  def assign(%{__struct__: Phoenix.LiveView.Socket} = socket, key, value) when is_atom(key) do
    apply(Phoenix.Component, :assign, [socket, key, value])
  end

  @doc "Whether a live connection (an event stream, a LiveView websocket) is behind it."
  @spec connected?(term()) :: boolean()
  def connected?(%__MODULE__{connected?: connected?}), do: connected?

  def connected?(%{__struct__: Phoenix.LiveView.Socket} = socket) do
    apply(Phoenix.LiveView, :connected?, [socket])
  end
end
