defmodule Observatory.Replay.WouldTripTest do
  # Graded response, item 4: `mix observatory.replay` runs recorded proxy logs through
  # the kill switch and the budgets and reports what would have tripped, when, and
  # what it would have saved. Replays share the gateway's state: not async.
  use Observatory.TrackerCase, async: false
  @moduletag :capture_log

  import ExUnit.CaptureIO

  alias Observatory.Replay
  alias Observatory.Test.ProxyLog

  @prices %{"gpt-4.1" => %{input: 2.0, output: 8.0}}

  setup do
    restore_env_on_exit([
      :budgets,
      :step_detection,
      :session_log_size,
      :demo,
      :alert_source,
      :loop_verdict,
      ObservatoryWeb.Endpoint
    ])

    Application.put_env(:observatory, :budgets, prices: @prices)
    dir = Path.join(System.tmp_dir!(), "would_trip_#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf!(dir) end)
    # Sessions live on in the gateway between replays: each test has its own.
    path = Path.join(dir, "proxy.jsonl")
    File.write!(path, Enum.join(ProxyLog.example(unique_session("wt") <> "-"), "\n") <> "\n")
    %{path: path, dir: dir}
  end

  describe "replay of a recorded proxy log: what the kill switch and budgets would have done" do
    test "the looping agent would have been stopped at its fifth request; the healthy one never",
         %{path: path} do
      report = Replay.run([path], budget: [session_tokens: 20_000])
      w = report.would_trip

      assert %{requests: 24, agents: 2} = w
      assert %{window_size: 5, threshold: 5.5, agents_stopped: 1, trips: [trip]} = w.kill_switch
      # Requests 2..4 answer the same call alike: 0, 2.5, 5.0; the fifth scores 7.5.
      assert %{
               agent_id: _,
               request: 5,
               score: 7.5,
               line: 5,
               at: "2026-02-22T10:04:00Z"
             } = trip

      # Requests 5..12 of the agent would have been refused: 8 requests, each 50 output
      # tokens and 1000 + 400 n input.
      input = Enum.sum(for n <- 5..12, do: 1_000 + 400 * n)
      assert trip.saved.requests == 8
      assert trip.saved.tokens == input + 8 * 50
      assert_in_delta trip.saved.cost_usd, (input * 2.0 + 400 * 8.0) / 1.0e6, 1.0e-9

      # 20,000 tokens per session: each session passes it at its ninth request
      # (1,450 + 1,850 + … + 4,250 = 22,800 >= 20,000 after eight).
      assert [
               %{
                 scope: :session,
                 session_id: _,
                 limit: :session_tokens,
                 used: 22_800,
                 max: 20_000,
                 line: 9
               } = stop,
               %{session_id: _, line: 21}
             ] = w.budgets.stops

      assert stop.saved.requests == 4
    end

    test "rolling windows follow the requests' timestamps", %{path: path} do
      # One request a minute: 2 before a request within its 180 s, never 3.
      report = Replay.run([path], budget: [window_requests: 2, window_seconds: 180])

      assert [
               %{scope: :window, line: 3, used: 2, at: "2026-02-22T10:02:00Z"},
               %{scope: :window, line: 15}
             ] = report.would_trip.budgets.stops

      report = Replay.run([path], budget: [window_requests: 3, window_seconds: 180])
      assert report.would_trip.budgets.stops == []
    end

    test "mix observatory.replay prints the would-trips and their savings; bad flags are refused",
         %{path: path, dir: dir} do
      prices = Path.join(dir, "prices.json")
      File.write!(prices, ~s({"gpt-4.1": {"input": 2.0, "output": 8.0}}))

      out =
        capture_io(fn ->
          Mix.Tasks.Observatory.Replay.run([
            path,
            "--no-progress",
            "--budget-session-tokens",
            "20000",
            "--prices",
            prices
          ])
        end)

      assert out =~ "Kill switch and budgets on 24 recorded LLM requests of 2 agent(s)"
      assert out =~ "kill switch (window 5, threshold 5.5): 1 agent(s) would have been stopped"

      assert out =~
               "agent-looping  at its request 5 (#{path}:5, 2026-02-22T10:04:00Z)  score 7.5  would have saved 8 requests, 35,600 tokens, $0.0736"

      assert out =~
               ~r/session \S*sess-looping of \S*agent-looping: session_tokens 22800 of 20000 at #{Regex.escape(path)}:9/

      assert out =~ "budgets (session_tokens 20000): 2 stop(s)"

      json =
        capture_io(fn ->
          Mix.Tasks.Observatory.Replay.run([path, "--json", "--kill-switch-threshold", "100"])
        end)

      {:ok, report} = Observatory.JSON.decode(json)
      assert report["would_trip"]["kill_switch"]["agents_stopped"] == 0

      assert_raise Mix.Error,
                   ~r/--budget-session-tokens must be an integer >= 0 or null, got: -1/,
                   fn ->
                     Mix.Tasks.Observatory.Replay.run([path, "--budget-session-tokens", "-1"])
                   end

      assert_raise Mix.Error, ~r/--kill-switch-window must be 2 to 1000, got: 1/, fn ->
        Mix.Tasks.Observatory.Replay.run([path, "--kill-switch-window", "1"])
      end

      File.write!(prices, ~s({"gpt-4.1": {"input": -2.0, "output": 8.0}}))

      assert_raise Mix.Error, ~r/the input price of "gpt-4.1" .* must be a number >= 0/, fn ->
        Mix.Tasks.Observatory.Replay.run([path, "--prices", prices])
      end
    end
  end
end
