defmodule Observatory.ConfigCheckTest do
  # The settings a host sets most are checked at start: a value of the wrong kind
  # stops the start with a line that names it, where before it crashed a process
  # (auth_throttle, kill_switch, data_dir), or was taken silently and failed later
  # or never (storage, operator_tokens, max_body_bytes, dashboard_refresh_ms,
  # loop_verdict). Not async: sets the application environment.
  use ExUnit.Case, async: false

  alias Observatory.ConfigCheck

  # Runs `fun` with `key` set to `value`, the previous value put back after.
  defp with_env(key, value, fun) do
    previous = Application.fetch_env(:observatory, key)
    Application.put_env(:observatory, key, value)

    try do
      fun.()
    after
      case previous do
        {:ok, old} -> Application.put_env(:observatory, key, old)
        :error -> Application.delete_env(:observatory, key)
      end

      # Had the settings snapshot's keeper read it meanwhile: back at once.
      Observatory.IngestSettings.refresh()
    end
  end

  defp refused(key, value) do
    with_env(key, value, fn ->
      error = assert_raise ArgumentError, &ConfigCheck.settings!/0
      error.message
    end)
  end

  describe "a host's settings of the wrong kind stop the start, naming the setting" do
    test "storage: only true or false (\"no\" was taken as on)" do
      assert refused(:storage, "no") =~
               "expected config :observatory, :storage to be true or false, got: \"no\""
    end

    test "operator_tokens: a map of token => name; the tokens are not shown" do
      assert refused(:operator_tokens, ["secret-token"]) =~
               ~r/:operator_tokens to be a map of token => operator name.*got: \["<redacted>"\]/

      message = refused(:operator_tokens, %{"secret-token" => :alice})
      assert message =~ ~s(got: %{"<redacted>" => :alice})
      refute message =~ "secret-token"
    end

    test "max_body_bytes and dashboard_refresh_ms: positive integers" do
      assert refused(:max_body_bytes, "1MB") =~
               ~s(:max_body_bytes to be a positive integer, got: "1MB")

      assert refused(:dashboard_refresh_ms, 0) =~
               ":dashboard_refresh_ms to be a positive integer, got: 0"
    end

    test "auth_throttle: a keyword list of known keys, each a positive integer" do
      assert refused(:auth_throttle, 5) =~ ":auth_throttle to be a keyword list, got: 5"
      assert refused(:auth_throttle, max_failure: 3) =~ "unknown key :max_failure"

      assert refused(:auth_throttle, window_s: 0) =~
               ":auth_throttle, :window_s to be a positive integer"
    end

    test "a key set to nil is refused, not skipped (it replaced the default: auth_throttle max_failures: nil never locked anyone out)" do
      assert refused(:auth_throttle, max_failures: nil) =~
               ":auth_throttle, :max_failures to be a positive integer, got: nil"

      message =
        with_env(:budgets, [sweep_interval_ms: nil], fn ->
          assert_raise(ArgumentError, &Observatory.Budget.check_config!/0).message
        end)

      assert message =~ ":budgets, :sweep_interval_ms to be a positive integer, got: nil"
    end

    test "loop_verdict: a keyword list of its settings (:on was ignored without a word)" do
      assert refused(:loop_verdict, :on) =~ ":loop_verdict to be a keyword list, got: :on"
      assert refused(:loop_verdict, repeat_lop: 3) =~ "unknown key :repeat_lop"
    end

    test "kill_switch: a keyword list of its settings (a map crashed its supervisor)" do
      message =
        with_env(:kill_switch, %{threshold: 5}, fn ->
          assert_raise(ArgumentError, &Observatory.KillSwitch.check_config!/0).message
        end)

      assert message =~ ":kill_switch to be a keyword list, got: %{threshold: 5}"
    end

    test "data_dir: a non-empty path (42 crashed in IO.chardata_to_string, \"\" meant the current directory)" do
      for value <- [42, ""] do
        assert {:error, message} = with_env(:data_dir, value, &Observatory.DataDir.prepare/0)
        assert message =~ "expected config :observatory, :data_dir to be a directory's path"
      end
    end
  end

  describe "good settings pass" do
    test "the documented shapes, and each unset" do
      for {key, value} <- [
            storage: false,
            operator_tokens: %{"t" => "ops"},
            max_body_bytes: 2_000_000,
            dashboard_refresh_ms: 500,
            auth_throttle: [max_failures: 3, window_s: 10],
            loop_verdict: [repeat_loop: 4]
          ] do
        assert with_env(key, value, &ConfigCheck.settings!/0) == :ok
        assert with_env(key, nil, &ConfigCheck.settings!/0) == :ok
      end

      assert with_env(
               :kill_switch,
               [threshold: 8, mode: :warn],
               &Observatory.KillSwitch.check_config!/0
             ) == :ok
    end
  end
end
