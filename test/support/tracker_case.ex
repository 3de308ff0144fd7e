defmodule Observatory.TrackerCase do
  @moduledoc false
  # Helpers for tests that drive the EntropyTracker: unique session ids, config that
  # is restored after the test, and subscriptions to the gateway topics.
  use ExUnit.CaseTemplate

  using do
    quote do
      import Observatory.TrackerCase
      alias Observatory.Gateway.EntropyTracker
    end
  end

  setup do
    restore_env_on_exit([
      :entropy_window_size,
      :entropy_loop_threshold,
      :entropy_warning_threshold
    ])

    :ok
  end

  @doc "Puts these `:observatory` settings back as they are now when the test exits."
  def restore_env_on_exit(keys) do
    saved = for key <- keys, do: {key, Application.fetch_env(:observatory, key)}

    on_exit(fn ->
      for {key, value} <- saved do
        case value do
          {:ok, v} -> Application.put_env(:observatory, key, v)
          :error -> Application.delete_env(:observatory, key)
        end
      end

      # The settings snapshot follows at once, not at its next tick.
      Observatory.IngestSettings.refresh()
    end)
  end

  def unique_session(prefix \\ "sess"),
    do: "#{prefix}-#{System.unique_integer([:positive, :monotonic])}"

  def subscribe_gateway_topics do
    :ok = Observatory.Gateway.Events.subscribe("gateway:entropy_alerts")
    :ok = Observatory.Gateway.Events.subscribe("gateway:topology")
  end

  @doc "Records `tuples` in order and returns the last result."
  def record_all(session_id, tuples, opts \\ [agent_id: "agent-test"]) do
    Enum.reduce(tuples, nil, fn tuple, _ ->
      Observatory.Gateway.EntropyTracker.record_and_score(session_id, tuple, opts)
    end)
  end

  def distinct_tuples(n), do: for(i <- 1..n, do: {"intent-#{i}", "tool-#{i}", :success})
end
