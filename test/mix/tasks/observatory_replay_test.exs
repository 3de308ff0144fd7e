defmodule Mix.Tasks.Observatory.ReplayTest do
  use Observatory.TrackerCase, async: false

  import ExUnit.CaptureIO

  alias Observatory.Replay.ExampleDataset

  @task Mix.Tasks.Observatory.Replay
  @keys [
    :step_detection,
    :session_log_size,
    :demo,
    :alert_source,
    :loop_verdict,
    ObservatoryWeb.Endpoint
  ]

  setup do
    restore_env_on_exit(@keys)

    dir =
      Path.join(
        System.tmp_dir!(),
        "observatory_replay_task_#{System.unique_integer([:positive])}"
      )

    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf!(dir) end)
    %{dir: dir, prefix: "#{unique_session("task")}-"}
  end

  defp example(dir, prefix, name \\ "steps.jsonl") do
    path = Path.join(dir, name)
    ExampleDataset.write!(path, prefix: prefix)
    path
  end

  defp identical(sid, n) do
    line =
      ~s({"session_id": "#{sid}", "intent": "search", "tool_call": "read_file", "status": "failure", "result": {"error": "enoent"}})

    Enum.map_join(1..n, &(line <> "#{if &1 > 0, do: "\n"}"))
  end

  test "prints a row per session, the bad lines and the summary", %{dir: dir, prefix: prefix} do
    path = example(dir, prefix)
    out = capture_io(fn -> @task.run([path, "--no-progress"]) end)

    assert out =~ "Replayed #{path}"
    assert out =~ "entropy: window 5, LOOP below 0.25, WARNING below 0.5"

    assert out =~
             ~r/#{prefix}recovers-1\s+agent-#{prefix}recovers-1\s+22\s+3\s+5\s+3\s+0.2\s+warn at 4, blocked at 6/

    assert out =~ ~r/#{prefix}healthy-4\s+unknown-agent\s+\d+\s+-\s+-\s+0\s+1.0\s+-/
    assert out =~ ~r/#{prefix}loop-alternating-1\s+\S+\s+\d+\s+\d+\s+-\s+0\s+0.4/
    assert out =~ "Bad lines: 5"
    assert out =~ "#{path}:12  invalid JSON"
    assert out =~ "#{path}:150  intent is required"
    assert out =~ ~r/sessions\s+14\n/
    assert out =~ ~r/steps\s+266\n/
    assert out =~ ~r/sessions with WARNING\s+10\n/
    assert out =~ ~r/sessions with LOOP\s+8\n/
    assert out =~ ~r/alerts \(LOOP steps\)\s+45\n/
  end

  test "--json prints a report Observatory.JSON can read; --flagged drops healthy sessions",
       %{dir: dir, prefix: prefix} do
    path = example(dir, prefix, "steps.jsonl.gz")
    out = capture_io(fn -> @task.run(["--json", "--flagged", path]) end)

    assert {:ok, report} = Observatory.JSON.decode(out)

    assert %{"sessions" => 14, "steps" => 266, "sessions_loop" => 8, "alerts" => 45} =
             report["summary"]

    assert length(report["sessions"]) == 10

    refute Enum.any?(
             report["sessions"],
             &String.starts_with?(&1["session_id"], "#{prefix}healthy")
           )

    assert report["bad_lines"]["count"] == 5
    assert report["sources"] == [path]
  end

  test "reads stdin when no file is given, or for -", %{prefix: prefix} do
    out = capture_io(identical("#{prefix}stdin", 5), fn -> @task.run(["--json"]) end)
    assert {:ok, %{"sources" => ["-"], "sessions" => [s]}} = Observatory.JSON.decode(out)

    assert %{
             "first_warning" => %{"step" => 3},
             "first_loop" => %{"step" => 5},
             "lowest_score" => 0.2
           } = s

    gz = :zlib.gzip(identical("#{prefix}stdin-gz", 5))
    out = capture_io(gz, fn -> @task.run(["-", "--json"]) end)

    assert {:ok, %{"sessions" => [%{"first_loop" => %{"step" => 5}}]}} =
             Observatory.JSON.decode(out)
  end

  test "flags override the window size and thresholds", %{prefix: prefix} do
    args =
      ~w(--json --window-size 3 --loop-threshold 0.4 --warning-threshold 0.6 --stagnation-warn 2 --stagnation-block 3)

    out = capture_io(identical("#{prefix}flags", 4), fn -> @task.run(args) end)
    {:ok, report} = Observatory.JSON.decode(out)

    assert %{
             "window_size" => 3,
             "loop_threshold" => 0.4,
             "warning_threshold" => 0.6,
             "stagnation_warn" => 2
           } = report["settings"]

    assert [%{"first_warning" => %{"step" => 2}, "first_loop" => %{"step" => 3}} = s] =
             report["sessions"]

    assert %{"first_step_warning" => %{"step" => 3}, "first_step_block" => %{"step" => 4}} = s
  end

  test "the same sessions on 1 or 2 workers give the same numbers", %{dir: dir, prefix: prefix} do
    one =
      capture_io(fn ->
        @task.run(["--json", "--workers", "1", example(dir, prefix <> "a", "a.jsonl")])
      end)

    two =
      capture_io(fn ->
        @task.run(["--json", "--workers", "2", example(dir, prefix <> "b", "b.jsonl")])
      end)

    assert Observatory.JSON.decode(one) |> elem(1) |> Map.get("summary") ==
             Observatory.JSON.decode(two) |> elem(1) |> Map.get("summary")
  end

  test "the application runs without its HTTP server and demo fleet" do
    capture_io("", fn -> @task.run(["--json"]) end)
    assert Application.get_env(:observatory, ObservatoryWeb.Endpoint)[:server] == false
    assert Application.get_env(:observatory, :demo) == false
  end

  test "bad options, values and files stop before any step is replayed" do
    assert_raise Mix.Error, ~r/invalid option\(s\): --bogus/, fn -> @task.run(["--bogus"]) end

    assert_raise Mix.Error, ~r/invalid option\(s\): --window-size ten/, fn ->
      @task.run(["--window-size", "ten"])
    end

    assert_raise Mix.Error, ~r/loop_threshold to be a number in 0..1, got: 2.0/, fn ->
      @task.run(["--loop-threshold", "2"])
    end

    assert_raise Mix.Error, ~r/no such file: nope.jsonl/, fn -> @task.run(["nope.jsonl"]) end

    assert_raise Mix.Error, ~r/--workers must be at least 1/, fn ->
      capture_io("", fn -> @task.run(["--workers", "0"]) end)
    end
  end

  test "a corrupt gzip file: the report is printed, then the task fails", %{
    dir: dir,
    prefix: prefix
  } do
    path = Path.join(dir, "cut.jsonl.gz")
    gz = :zlib.gzip(identical("#{prefix}cut", 2000))
    File.write!(path, binary_part(gz, 0, byte_size(gz) - 20))

    out =
      capture_io(fn ->
        assert_raise Mix.Error, ~r/1 source\(s\) could not be read to the end/, fn ->
          @task.run([path])
        end
      end)

    assert out =~ "Input errors"
    assert out =~ "#{path}: gzip: unexpected end of input"
  end

  test "--progress draws a progress line on stderr", %{prefix: prefix} do
    err =
      capture_io(:stderr, fn ->
        capture_io(identical("#{prefix}progress", 5), fn -> @task.run(["--progress"]) end)
      end)

    # A small input is done before the first redraw (every 200 ms): only the clearing.
    assert err =~ "\r"
  end

  describe "issue 11: the loop verdict's flags" do
    test "--alert-source verdict and verdict thresholds; the report names the rule, reason and evidence",
         %{prefix: prefix} do
      sid = "#{prefix}verdict"
      args = ~w(--json --alert-source verdict --repeat-loop 4)
      out = capture_io(identical(sid, 5), fn -> @task.run(args) end)
      {:ok, report} = Observatory.JSON.decode(out)

      assert %{"alert_source" => "verdict", "verdict" => %{"repeat_loop" => 4}} =
               report["settings"]

      assert [s] = report["sessions"]

      assert %{
               "first_verdict_loop" => %{"step" => 4},
               "verdict_rule" => "repeat",
               "verdict_reason" =>
                 "the same call 4 times in a row, its result saying nothing new",
               "verdict_evidence" => [1, 2, 3, 4]
             } = s

      assert %{"alert_source" => "verdict", "sessions_alarmed" => 1, "alarms" => 2} =
               report["summary"]

      text = capture_io(identical("#{sid}-text", 5), fn -> @task.run(args -- ["--json"]) end)
      assert text =~ "alert source: verdict"
      assert text =~ "verdict: repeat suspect 2 loop 4"

      assert text =~
               "#{sid}-text  step 4  repeat: the same call 4 times in a row, its result saying nothing new [1, 2, 3, 4]"

      assert text =~ ~r/alarmed \(verdict\)\s+1\n/
    end

    test "without the flags the alert source is the configured one (entropy)", %{prefix: prefix} do
      out = capture_io(identical("#{prefix}entropy", 5), fn -> @task.run(["--json"]) end)
      {:ok, report} = Observatory.JSON.decode(out)

      assert %{"alert_source" => "entropy", "sessions_alarmed" => 1, "alarms" => 1} =
               report["summary"]
    end

    test "--extra-volatile-keys makes a per-call token an id, so the repeat shows", %{
      prefix: prefix
    } do
      lines = fn sid ->
        Enum.map_join(1..3, "\n", fn n ->
          ~s({"session_id": "#{sid}", "intent": "wait", "tool_call": "queue", "status": "success", "result": {"state": "queued", "job_token": "tok-#{n * 7}"}})
        end)
      end

      run = fn sid, args ->
        out = capture_io(lines.(sid), fn -> @task.run(["--json" | args]) end)
        {:ok, %{"sessions" => [s]}} = Observatory.JSON.decode(out)
        s
      end

      # The token moves: a short successful answer whose number changed is progress.
      assert %{"first_verdict_loop" => nil} = run.("#{prefix}token-a", [])

      assert %{"first_verdict_loop" => %{"step" => 3}} =
               run.("#{prefix}token-b", ~w(--extra-volatile-keys job_token,run_id))

      assert "job_token" in Application.get_env(:observatory, :loop_verdict)[:extra_volatile_keys]
      Observatory.Gateway.LoopVerdict.reload_rules()
    end

    test "bad verdict flags stop before any step is replayed" do
      assert_raise Mix.Error, ~r/--alert-source must be entropy or verdict, got: both/, fn ->
        @task.run(["--alert-source", "both"])
      end

      assert_raise Mix.Error, ~r/--failure-loop must be an integer or never, got: x/, fn ->
        @task.run(["--failure-loop", "x"])
      end

      assert_raise Mix.Error,
                   ~r/each suspect threshold must be >= 2 and <= its loop threshold/,
                   fn ->
                     @task.run(~w(--repeat-suspect 5 --repeat-loop 3))
                   end

      assert_raise Mix.Error, ~r/expected history to be a positive integer, got: 0/, fn ->
        @task.run(~w(--history 0))
      end
    end

    # A fresh VM in the dev environment, where the application logs at info level while it
    # starts (Mnesia's schema in a new data directory): those lines must not reach stdout.
    # The dev build is made first: on a project that was never compiled, Mix itself
    # compiles (and says so on stdout) before it can find the task.
    @tag timeout: 300_000
    test "--json: stdout is the JSON report alone, logs go to stderr (a fresh VM)", %{dir: dir} do
      path = Path.join(dir, "steps.jsonl")
      err = Path.join(dir, "stderr.txt")
      File.write!(path, identical("json-purity", 3))

      {out, status} =
        System.cmd(
          "sh",
          [
            "-c",
            ~s(mix compile >/dev/null 2>&1; exec mix observatory.replay --json "$1" 2>"$2"),
            "sh",
            path,
            err
          ],
          env: [{"MIX_ENV", "dev"}, {"OBSERVATORY_DATA_DIR", Path.join(dir, "data")}]
        )

      assert status == 0, File.read!(err)
      assert {:ok, %{"summary" => %{"sessions" => 1}}} = Observatory.JSON.decode(out)
      assert File.read!(err) =~ "[info] created the Mnesia schema"
    end
  end
end
