defmodule Observatory.Test.TelemetryRecorder do
  @moduledoc false
  # A dispatcher for Observatory.Telemetry with :telemetry's execute/3: sends each
  # event to the process registered as :observatory_telemetry_test.
  def execute(event, measurements, metadata) do
    case Process.whereis(:observatory_telemetry_test) do
      nil -> :ok
      pid -> send(pid, {:telemetry, event, measurements, metadata})
    end

    :ok
  end
end
