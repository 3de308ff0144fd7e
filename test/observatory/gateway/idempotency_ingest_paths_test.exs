defmodule Observatory.Gateway.IdempotencyIngestPathsTest do
  # Each path of the ingest's idempotency check, as SchemaInterceptor.ingest/2 takes
  # it, with what the three scoring stores hold for the session before and after: a
  # new step is claimed and scored; a replay, a conflict and a step in progress are
  # answered without touching any scoring store; a step whose ingest raised after its
  # claim is released (its retry is a new step). Changes :idempotency and :pubsub:
  # not async.
  use Observatory.TrackerCase, async: false

  alias Observatory.Gateway.{
    DecisionLog,
    Idempotency,
    LoopVerdict,
    SchemaInterceptor,
    StepDetector
  }

  alias Observatory.JSON
  alias Observatory.Test.HTTP

  setup do
    restore_env_on_exit([:idempotency, :pubsub])
    sid = unique_session("sess-paths")
    %{sid: sid, step: step(sid, "step-1")}
  end

  defp step(sid, step_id, result \\ "not found") do
    HTTP.envelope(%{
      "meta" => %{"session_id" => sid, "step_id" => step_id},
      "action" => %{"tool_input" => %{"path" => "a.txt"}, "result" => result}
    })
  end

  # What the three scoring stores hold for the session: a step scored changes it.
  defp scoring_state(sid),
    do: {EntropyTracker.window(sid), LoopVerdict.session(sid), StepDetector.state(sid)}

  # Another process holds the claim of `step`, as a first delivery mid-way through
  # its scoring; returns it (send it :done to let it finish without answering).
  defp hold_claim(step) do
    {:ok, _envelope, fields} = DecisionLog.parse(JSON.encode!(step))
    test = self()

    holder =
      spawn_link(fn ->
        {:new, _ticket} = Idempotency.claim(fields)
        send(test, :claimed)
        receive do: (:done -> :ok)
      end)

    assert_receive :claimed
    holder
  end

  describe "the ingest's idempotency check, path by path" do
    test "new: claimed and scored once; remembered for its retries", %{sid: sid, step: step} do
      assert EntropyTracker.window(sid) == []

      assert {:ok, %{replayed: false, verdict: %{step_number: 1}}} =
               SchemaInterceptor.ingest(step)

      assert length(EntropyTracker.window(sid)) == 1
      assert Idempotency.count({:session, sid}) == 1
    end

    test "replay: the first answer, no scoring store touched", %{sid: sid, step: step} do
      {:ok, first} = SchemaInterceptor.ingest(step)
      before = scoring_state(sid)

      assert {:ok, %{replayed: true} = again} = SchemaInterceptor.ingest(step)
      same = [:entropy_score, :severity, :verdict, :step]
      assert Map.take(again, same) == Map.take(first, same)
      assert scoring_state(sid) == before
    end

    test "conflict: refused, no scoring store touched", %{sid: sid, step: step} do
      {:ok, _} = SchemaInterceptor.ingest(step)
      before = scoring_state(sid)

      assert {:error, {:conflict, %{path: "meta.step_id"}}} =
               SchemaInterceptor.ingest(step(sid, "step-1", "found it"))

      assert scoring_state(sid) == before
    end

    test "in_progress: refused while the first delivery holds the claim, nothing scored",
         %{sid: sid, step: step} do
      holder = hold_claim(step)
      before = scoring_state(sid)

      assert {:error, {:in_progress, %{path: "meta.step_id", reason: reason}}} =
               SchemaInterceptor.ingest(step)

      assert reason =~ "is still being scored"
      assert scoring_state(sid) == before
      assert EntropyTracker.window(sid) == []
      send(holder, :done)
    end

    defmodule RaisingBus do
      # A host's PubSub whose broadcast raises: the ingest raises after its scoring.
      def broadcast(_server, _topic, _message), do: raise("the bus is down")
      def subscribe(_server, _topic), do: :ok
      def unsubscribe(_server, _topic), do: :ok
    end

    test "release on crash: a step whose ingest raised after its claim is not remembered; its retry is new",
         %{sid: sid, step: step} do
      bus = Application.fetch_env(:observatory, :pubsub)
      Observatory.configure(pubsub: {RaisingBus, :raising_bus})
      assert_raise RuntimeError, "the bus is down", fn -> SchemaInterceptor.ingest(step) end
      # Scored, then released: nothing is remembered for it (not even in progress).
      assert length(EntropyTracker.window(sid)) == 1
      assert Idempotency.count({:session, sid}) == 0

      case bus do
        {:ok, value} -> Observatory.configure(pubsub: value)
        :error -> Application.delete_env(:observatory, :pubsub)
      end

      Observatory.IngestSettings.refresh()

      assert {:ok, %{replayed: false}} = SchemaInterceptor.ingest(step)
      assert {:ok, %{replayed: true}} = SchemaInterceptor.ingest(step)
      assert Idempotency.count({:session, sid}) == 1
    end

    test "a caller's own :tracker: its window scored, the step claimed and replayed as any",
         %{sid: sid} do
      tracker = :"paths_tracker_#{System.unique_integer([:positive])}"
      start_supervised!({EntropyTracker, name: tracker})
      step = step(sid, "own-1")

      assert {:ok, %{replayed: false}} = SchemaInterceptor.ingest(step, tracker: tracker)
      assert {:ok, %{replayed: true}} = SchemaInterceptor.ingest(step, tracker: tracker)
      assert length(EntropyTracker.window(sid, tracker: tracker)) == 1
      assert EntropyTracker.window(sid) == []
    end
  end
end
