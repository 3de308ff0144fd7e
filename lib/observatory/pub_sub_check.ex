defmodule Observatory.PubSubCheck do
  @moduledoc """
  Checks, once the host's application has started, that the PubSub server named in
  `config :observatory, :pubsub` runs, and says what to fix in the log when it does
  not (`Observatory.Gateway.Events.not_running_message/0`).

  A host's `Phoenix.PubSub` is a child of the host's own supervision tree, which
  starts after Observatory (a dependency starts first), so it cannot be checked when
  Observatory starts. This process waits for the applications that depend on
  Observatory to finish starting (at most `:wait_ms`, 60 s), then looks; with no such
  application it looks for `:grace_ms` (5 s). It runs only when the server is not
  Observatory's own, and exits when done.
  """

  use GenServer, restart: :temporary

  alias Observatory.Gateway.Events

  @poll_ms 50

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts)

  @impl true
  def init(opts) do
    now = System.monotonic_time(:millisecond)

    state = %{
      dependents: dependents(),
      deadline: now + Keyword.get(opts, :wait_ms, 60_000),
      grace_until: now + Keyword.get(opts, :grace_ms, 5_000)
    }

    {:ok, state, {:continue, :check}}
  end

  @impl true
  def handle_continue(:check, state), do: check(state)

  @impl true
  def handle_info(:check, state), do: check(state)

  defp check(state) do
    now = System.monotonic_time(:millisecond)
    started = Enum.map(Application.started_applications(), &elem(&1, 0))
    hosts_up? = state.dependents != [] and Enum.all?(state.dependents, &(&1 in started))

    cond do
      Events.running?() ->
        {:stop, :normal, state}

      hosts_up? or now >= state.deadline or (state.dependents == [] and now >= state.grace_until) ->
        Events.log_not_running()
        {:stop, :normal, state}

      true ->
        Process.send_after(self(), :check, @poll_ms)
        {:noreply, state}
    end
  end

  # The applications that list Observatory among theirs: the host.
  defp dependents do
    for {app, _, _} <- Application.loaded_applications(),
        :observatory in (Application.spec(app, :applications) || []),
        do: app
  end
end
