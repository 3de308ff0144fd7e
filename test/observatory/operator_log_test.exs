defmodule Observatory.OperatorLogTest do
  # An operator action's log line names who acted: the `:operator` given, or that an
  # Elixir call gave none (it used to read "by nil").
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  alias Observatory.{AgentKeys, KillSwitch}

  setup do
    previous = Logger.level()
    Logger.configure(level: :info)
    on_exit(fn -> Logger.configure(level: previous) end)
    %{agent: "agent-op-log-#{System.unique_integer([:positive])}"}
  end

  test "an action without :operator says it came from an Elixir call without one, not nil",
       %{agent: agent} do
    log =
      capture_log([level: :info], fn ->
        {:ok, _} = AgentKeys.issue(agent)
        {:ok, _} = KillSwitch.deactivate(agent)
      end)

    assert log =~ "issued for #{inspect(agent)} by an Elixir call without :operator"
    assert log =~ "#{inspect(agent)} deactivated by an Elixir call without :operator"
    refute log =~ "by nil"
  end

  test "an action with :operator names the operator", %{agent: agent} do
    log =
      capture_log([level: :info], fn ->
        {:ok, _} = AgentKeys.issue(agent, operator: "alice")
        {:ok, _} = KillSwitch.deactivate(agent, operator: "alice")
      end)

    assert log =~ ~s(issued for #{inspect(agent)} by "alice")
    assert log =~ ~s(#{inspect(agent)} deactivated by "alice")
  end
end
