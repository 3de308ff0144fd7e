defmodule Observatory.Gateway.SessionLogTest do
  # Changes the global session log caps: not async.
  use Observatory.TrackerCase, async: false

  import ExUnit.CaptureLog

  alias Observatory.Gateway.SessionLog

  setup do
    restore_env_on_exit([
      :session_log_size,
      :session_log_max_sessions,
      :session_log_max_envelope_bytes,
      :session_log_max_bytes
    ])
  end

  defp envelope(sid, text), do: %{"meta" => %{"session_id" => sid}, "text" => text}

  # The trim runs in the session log's process: wait until it has handled it.
  defp settle, do: :sys.get_state(SessionLog)

  # A session's text of `n` bytes of content, and the bytes the log holds beyond
  # what it held when asked (its pending trims settled first).
  defp sized_text(sid),
    do: fn n -> ~s({"meta":{"session_id":"#{sid}"},"n":"#{String.duplicate("x", n)}"}) end

  # Whether the VM's binary memory falls below `limit` within about a second.
  defp binary_memory_drops_below(limit, tries \\ 100) do
    cond do
      :erlang.memory(:binary) < limit ->
        true

      tries == 0 ->
        false

      true ->
        Process.sleep(10)
        binary_memory_drops_below(limit, tries - 1)
    end
  end

  defp bytes_held_from_now do
    settle()
    before = SessionLog.stats().bytes
    fn -> SessionLog.stats().bytes - before end
  end

  describe "finding 5: the session log keeps a bounded number of sessions and bytes" do
    test "past :session_log_max_sessions the least recently seen sessions go" do
      Observatory.configure(session_log_max_sessions: 100)
      prefix = unique_session("cap")

      log =
        capture_log(fn ->
          for i <- 1..250, do: SessionLog.put("#{prefix}-#{i}", envelope("#{prefix}-#{i}", "x"))
          settle()
        end)

      assert log =~ "session log over its caps"

      assert SessionLog.stats().sessions <= 100
      assert SessionLog.count("#{prefix}-250") == 1, "the newest is kept"
      assert SessionLog.count("#{prefix}-1") == 0, "the oldest went"
    end

    test "an envelope over :session_log_max_envelope_bytes is kept as a stub, not whole" do
      Observatory.configure(session_log_max_envelope_bytes: 4_096)
      sid = unique_session("big")
      before = SessionLog.stats().bytes

      SessionLog.put(sid, envelope(sid, String.duplicate("a", 900 * 1024)))

      assert [%{"truncated" => true, "bytes" => bytes, "meta" => %{"session_id" => ^sid}}] =
               SessionLog.recent(sid)

      assert bytes > 900 * 1024
      assert SessionLog.stats().bytes - before < 4_096
      assert SessionLog.count(sid) == 1

      SessionLog.put(sid, envelope(sid, "small"))
      assert [_, %{"text" => "small"}] = SessionLog.recent(sid)
    end

    test "past :session_log_max_bytes the least recently seen sessions go" do
      # A cap of its own, not one above what the shared log held when the test began:
      # sessions seen earlier go first, so with ~1 MB left by other tests the trims
      # (each to 90 % of the cap) dropped only theirs and kept session 1. Here 300 kB
      # of sessions seen earlier stand for them. Not async: no test writes meanwhile.
      prefix = unique_session("bytes")
      text = String.duplicate("b", 10_000)
      earlier = for i <- 1..30, do: "#{prefix}-earlier-#{i}"
      for sid <- earlier, do: SessionLog.put(sid, envelope(sid, text))
      Observatory.configure(session_log_max_bytes: 200_000)

      capture_log(fn ->
        for i <- 1..60, do: SessionLog.put("#{prefix}-#{i}", envelope("#{prefix}-#{i}", text))
        settle()
      end)

      assert SessionLog.stats().bytes <= 200_000
      assert SessionLog.count("#{prefix}-60") == 1
      assert SessionLog.count("#{prefix}-1") == 0
      assert Enum.all?(earlier, &(SessionLog.count(&1) == 0))
    end
  end

  describe "issue 18: steps keep their number and receive time" do
    test "put/3 stores the step's number; steps/1 and step/2 give it back with the time" do
      sid = unique_session("numbered")
      before = System.system_time(:millisecond)
      SessionLog.put(sid, envelope(sid, "a"), 7)
      SessionLog.put(sid, envelope(sid, "b"), 8)
      # No number: the log's own count.
      SessionLog.put(sid, envelope(sid, "c"))

      assert [%{number: 7, at: at}, %{number: 8}, %{number: 3, envelope: %{"text" => "c"}}] =
               SessionLog.steps(sid)

      assert at >= before
      assert %{number: 8, envelope: %{"text" => "b"}} = SessionLog.step(sid, 8)
      assert SessionLog.step(sid, 99) == nil
      assert SessionLog.last_at(sid) >= at
      assert SessionLog.last_at(unique_session("nobody")) == nil
    end

    test "a text put with the time its step arrived is kept at that time, not the put's" do
      # A store of its own: no other session of its shard is later (a time earlier
      # than the shard's latest is raised to it).
      store = Observatory.Native.session_log_new()
      json = ~s({"meta":{"session_id":"arrived"},"n":1})
      arrived = System.monotonic_time(:millisecond) - 60_000
      caps = {20, 1_000_000}

      assert Observatory.Native.session_log_put_json(
               store,
               "arrived",
               json,
               0.5,
               1,
               caps,
               arrived
             ) ==
               {:new_session, 1}

      [{1, at, :json, ^json, 0.5}] = Observatory.Native.session_log_steps(store, "arrived", 20)
      # Its system time: the monotonic time plus the VM's offset (each in ms).
      expected = arrived + System.time_offset(:millisecond)
      assert at in (expected - 1)..(expected + 1)

      # No time given: the put reads the clock.
      before = System.system_time(:millisecond)
      Observatory.Native.session_log_put_json(store, "now", json, 0.5, 1, caps, nil)
      [{1, now_at, :json, _, _}] = Observatory.Native.session_log_steps(store, "now", 20)
      assert now_at >= before
    end
  end

  describe "the byte count through a session's first steps, a full ring and a ring resized" do
    # A session's first steps take slots not yet written (no replaced size to read),
    # later ones replace the oldest; a ring whose size changed at run time can send
    # an early step to a slot already written, whose size must still come off.
    test "the bytes kept are the sizes of the envelopes the slots hold, exactly" do
      sid = unique_session("ring")
      text = sized_text(sid)
      held = bytes_held_from_now()

      Observatory.configure(session_log_size: 2)
      SessionLog.put_json(sid, text.(10), nil)
      assert held.() == byte_size(text.(10))
      SessionLog.put_json(sid, text.(200), nil)
      assert held.() == byte_size(text.(10)) + byte_size(text.(200))

      # Step 3 of a ring of 3 goes to slot 0, which step 2 wrote.
      Observatory.configure(session_log_size: 3)
      SessionLog.put_json(sid, text.(30), nil)
      assert held.() == byte_size(text.(10)) + byte_size(text.(30))
      assert [%{"n" => one}, %{"n" => three}] = SessionLog.recent(sid)
      assert {byte_size(one), byte_size(three)} == {10, 30}

      # Past the ring's size: each step replaces the oldest.
      for n <- 40..45, do: SessionLog.put_json(sid, text.(n), nil)
      assert held.() == Enum.sum(for n <- 43..45, do: byte_size(text.(n)))
      assert SessionLog.count(sid) == 9
    end
  end

  describe "the session log under concurrent writers" do
    test "writers of one session each get their own step number and the byte count stays exact" do
      sid = unique_session("concurrent")
      json = ~s({"meta":{"session_id":"#{sid}"},"text":"#{String.duplicate("x", 100)}"})
      before = SessionLog.stats().bytes

      1..4
      |> Enum.map(fn _ ->
        Task.async(fn -> for _ <- 1..50, do: SessionLog.put_json(sid, json, nil) end)
      end)
      |> Enum.each(&Task.await/1)

      steps = SessionLog.steps(sid)
      size = Application.get_env(:observatory, :session_log_size, 20)

      assert SessionLog.count(sid) == 200
      assert length(steps) == size
      assert steps |> Enum.map(& &1.number) |> Enum.uniq() |> length() == size
      assert SessionLog.stats().bytes - before == size * byte_size(json)
    end
  end

  describe "the ring's size cap: a smaller ring frees what falls off it" do
    test "after :session_log_size shrinks, a session's next step frees its slots past the ring" do
      sid = unique_session("shrink")
      text = sized_text(sid)
      held = bytes_held_from_now()

      Observatory.configure(session_log_size: 5)
      for n <- 1..5, do: SessionLog.put_json(sid, text.(n), nil)
      assert length(SessionLog.steps(sid)) == 5

      # Step 6 of a ring of 2 goes to slot 0 (step 5's); slot 1 keeps step 1; slots
      # 2..4 (steps 2..4) are outside the ring: no reader sees them, and they are freed.
      Observatory.configure(session_log_size: 2)
      SessionLog.put_json(sid, text.(6), nil)
      assert [%{"n" => one}, %{"n" => six}] = SessionLog.recent(sid)
      assert {byte_size(one), byte_size(six)} == {1, 6}
      assert held.() == byte_size(text.(1)) + byte_size(text.(6))

      # Grown again, the freed slots stay empty until steps reach them.
      Observatory.configure(session_log_size: 5)
      assert length(SessionLog.steps(sid)) == 2
      assert SessionLog.count(sid) == 6
    end
  end

  describe "trim and idle sweep run in bounded chunks" do
    test "a trim of many sessions past :session_log_max_sessions drops them all, chunk by chunk" do
      settle()
      Observatory.configure(session_log_max_sessions: 100)
      prefix = unique_session("many")

      capture_log(fn ->
        for i <- 1..1_000, do: SessionLog.put_json("#{prefix}-#{i}", ~s({"n":#{i}}), nil)
        settle()
      end)

      # Each trim goes down to 90 % of the cap: several hundred sessions each time,
      # more than one call of the store drops.
      assert SessionLog.stats().sessions <= 100
      assert SessionLog.count("#{prefix}-1000") == 1
      assert SessionLog.count("#{prefix}-1") == 0
    end

    test "the idle sweep drops every session idle past :entropy_session_ttl_ms and frees its bytes" do
      restore_env_on_exit([:entropy_session_ttl_ms])
      prefix = unique_session("idle")
      for i <- 1..600, do: SessionLog.put_json("#{prefix}-#{i}", ~s({"n":#{i}}), nil)
      assert SessionLog.stats().sessions >= 600

      # A negative idle time puts the cutoff in the future: every session is idle.
      Application.put_env(:observatory, :entropy_session_ttl_ms, -60_000)
      send(SessionLog, :sweep)
      settle()

      assert SessionLog.stats() == %{sessions: 0, bytes: 0}
      assert SessionLog.count("#{prefix}-600") == 0
      assert SessionLog.steps("#{prefix}-1") == []
    end

    test "a session seen within :entropy_session_ttl_ms stays through a sweep" do
      sid = unique_session("busy")
      SessionLog.put_json(sid, ~s({"n":1}), nil)
      send(SessionLog, :sweep)
      settle()
      assert SessionLog.count(sid) == 1
    end
  end

  describe "a crash of the log's process" do
    test "restarts it with an empty log that takes steps again" do
      sid = unique_session("restart")
      SessionLog.put_json(sid, ~s({"n":1}), nil)
      assert SessionLog.count(sid) == 1

      old = Process.whereis(SessionLog)
      {:dictionary, dict} = Process.info(old, :dictionary)
      [supervisor | _] = dict[:"$ancestors"]
      ref = Process.monitor(old)
      Process.exit(old, :kill)
      assert_receive {:DOWN, ^ref, :process, ^old, :killed}
      # The supervisor has handled the exit (and restarted the log) once it answers.
      :sys.get_state(supervisor)
      assert is_pid(Process.whereis(SessionLog)) and Process.whereis(SessionLog) != old

      assert SessionLog.count(sid) == 0
      assert SessionLog.steps(sid) == []
      assert SessionLog.stats() == %{sessions: 0, bytes: 0}

      SessionLog.put_json(sid, ~s({"n":2}), nil)
      assert [%{number: 1, envelope: %{"n" => 2}}] = SessionLog.steps(sid)
    end
  end

  describe "the gateway's score kept beside the text" do
    test "an integer or a float score reads back as given; nil keeps the agent's" do
      sid = unique_session("score")
      json = ~s({"meta":{"session_id":"#{sid}"},"cognition":{"entropy_score":0.25}})
      SessionLog.put_json(sid, json, 1, 1)
      SessionLog.put_json(sid, json, 0.5, 2)
      SessionLog.put_json(sid, json, nil, 3)

      assert [1, 0.5, 0.25] ==
               for(%{envelope: e} <- SessionLog.steps(sid), do: e["cognition"]["entropy_score"])

      assert_raise ArgumentError, fn -> SessionLog.put_json(sid, json, :high, 4) end
    end
  end

  describe "a text is kept as the log's own copy, counted at its size" do
    test "a long text reads back after the process that wrote it has gone, and a part of a larger one too" do
      sid = unique_session("held")

      long = fn n ->
        ~s({"meta":{"session_id":"#{sid}"},"cognition":{},"n":#{n},"pad":"#{String.duplicate("p", 2_000)}"})
      end

      before = SessionLog.stats().bytes

      # Written by a process that ends: the log holds the binary, not the writer.
      task = Task.async(fn -> SessionLog.put_json(sid, long.(1), nil, 1) end)
      :ok = Task.await(task)
      :erlang.garbage_collect()

      # A line of a larger body, as an NDJSON batch gives it.
      body = long.(2) <> "\n" <> String.duplicate("x", 100_000)
      SessionLog.put_json(sid, binary_part(body, 0, byte_size(long.(2))), 0.5, 2)

      assert [%{"n" => 1, "pad" => pad}, %{"n" => 2, "cognition" => %{"entropy_score" => 0.5}}] =
               SessionLog.recent(sid)

      assert byte_size(pad) == 2_000
      assert SessionLog.stats().bytes - before == byte_size(long.(1)) + byte_size(long.(2))
    end

    test "a window into a large binary keeps only its own bytes: the large one is freed with its writer" do
      sid = unique_session("window")
      text = ~s({"meta":{"session_id":"#{sid}"},"pad":"#{String.duplicate("w", 3_000)}"})
      held = bytes_held_from_now()
      :erlang.garbage_collect()
      binary_before = :erlang.memory(:binary)

      # A writer whose text is a part of a 32 MB binary (an NDJSON batch's line) and
      # which then ends: had the log kept the large binary, it would stay allocated.
      {pid, ref} =
        spawn_monitor(fn ->
          body = text <> "\n" <> :binary.copy("x", 32 * 1024 * 1024)
          line = binary_part(body, 0, byte_size(text))
          assert :binary.referenced_byte_size(line) > 32 * 1024 * 1024
          :ok = SessionLog.put_json(sid, line, nil, 1)
        end)

      assert_receive {:DOWN, ^ref, :process, ^pid, :normal}, 10_000
      # The VM frees an ended process's binaries after its monitors are told: the
      # large one goes within moments, unless something still holds it.
      assert binary_memory_drops_below(binary_before + 8 * 1024 * 1024)
      assert held.() == byte_size(text)

      # What a reader is given is the text alone, not a window into anything larger.
      store = Observatory.NativeStores.get(SessionLog)

      assert [{1, _at, :json, data, nil}] =
               Observatory.Native.session_log_steps(store, sid, SessionLog.size())

      assert data == text
      assert :binary.referenced_byte_size(data) == byte_size(text)
      assert [%{"pad" => pad}] = SessionLog.recent(sid)
      assert byte_size(pad) == 3_000
    end
  end
end
