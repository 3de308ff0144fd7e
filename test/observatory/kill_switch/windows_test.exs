defmodule Observatory.KillSwitch.WindowsTest do
  # The per-agent windows through the NIF, with hand-made fingerprints.
  use ExUnit.Case, async: true

  alias Observatory.{JSON, KillSwitch}
  alias Observatory.KillSwitch.{Settings, Windows}
  alias Observatory.Test.Upstream

  @p 0x0123456789ABCDEF
  @r 0xFEDCBA9876543210

  setup do
    %{agent: "agent-win-#{System.unique_integer([:positive])}"}
  end

  defp flip(hash, bits), do: Enum.reduce(bits, hash, &Bitwise.bxor(&2, Bitwise.bsl(1, &1)))

  defp observe(agent, prompt, signatures \\ [], size \\ 10, threshold \\ 1000) do
    {:ok, verdict} = Windows.observe_request(agent, prompt, signatures, size, threshold)
    verdict
  end

  describe "Loop Detection Scoring" do
    test "Score calculation", %{agent: agent} do
      observe(agent, @p, [10])
      Windows.observe_response(agent, @r)
      observe(agent, flip(@p, [0]), [])
      Windows.observe_response(agent, flip(@r, [6]))
      observe(agent, Bitwise.bnot(@p) |> Bitwise.band(0xFFFFFFFFFFFFFFFF), [])
      Windows.observe_response(agent, flip(@r, [5]))
      # It answers tool calls: the answer before it was those calls, not compared by
      # its text (R^5 is dropped; R^6 is the latest answer).
      verdict = observe(agent, flip(@p, [0, 1]), [30, 10])

      assert verdict.signals == %{
               similar_prompts: 2,
               similar_responses: 1,
               repeated_tool_calls: 1
             }

      assert verdict.score == 2 * 1.0 + 1 * 2.0 + 1 * 1.5
      assert Windows.status(agent).score == verdict.score
    end

    test "Prompt similarity check", %{agent: agent} do
      for bits <- [[], [1], [1, 2], [1, 2, 3], [1, 2, 3, 4]], do: observe(agent, flip(@p, bits))

      verdict = observe(agent, @p)
      assert verdict.signals.similar_prompts == 3, "distances 0, 1, 2 count; 3 and 4 do not"
      assert verdict.score == 3.0
    end

    test "Response similarity check", %{agent: agent} do
      for {bits, k} <- Enum.with_index([[], [1], [1, 2], [1, 2, 3]]) do
        observe(agent, Bitwise.bsl(k + 1, 40))
        Windows.observe_response(agent, flip(@r, bits))
      end

      # The latest answer is R^{1,2,3}: R^{1,2} and R^{1} are within 2 bits, R is 3 away.
      verdict = observe(agent, 0xFFFF)
      assert verdict.signals.similar_responses == 2
      assert verdict.score == 2 * 2.0
    end

    test "Tool call repetition check", %{agent: agent} do
      signatures = fn calls ->
        {:ok, fp} =
          KillSwitch.fingerprint_request(JSON.encode!(Upstream.request("go", tool_calls: calls)))

        fp.tool_signatures
      end

      # Identical calls (key order does not matter); not calls that differ in a number.
      same = signatures.([{"read_file", %{path: "logs/run-41.txt", line: 1}}])
      assert same == signatures.([{"read_file", %{line: 1, path: "logs/run-41.txt"}}])
      refute same == signatures.([{"read_file", %{path: "logs/run-42.txt", line: 1}}])
      other = signatures.([{"read_file", %{path: "README.md"}}])
      refute other == same

      # Prompts far apart, so that only the tool calls score.
      observe(agent, 1, same)
      observe(agent, Bitwise.bsl(0xFFFF, 16), other)
      observe(agent, Bitwise.bsl(0xFFFF, 32), [])
      verdict = observe(agent, Bitwise.bsl(0xFFFF, 48), same)
      assert verdict.signals.repeated_tool_calls == 1
      assert verdict.score == 1.5
    end
  end

  describe "Kill Switch State Management" do
    test "Sliding window storage", %{agent: agent} do
      assert Windows.entries(agent) == nil
      observe(agent, @p, [3, 1, 3])

      assert Windows.entries(agent) == [
               %{prompt_hash: @p, response_hash: nil, tool_signatures: [1, 3]}
             ]

      observe(agent, nil)
      assert [_, %{prompt_hash: nil}] = Windows.entries(agent)
    end

    test "Window overflow", %{agent: agent} do
      for k <- 1..5, do: observe(agent, Bitwise.bsl(k, 32), [], 3)
      prompts = for e <- Windows.entries(agent), do: Bitwise.bsr(e.prompt_hash, 32)
      assert prompts == [3, 4, 5], "the oldest leave first"
    end
  end

  test "settings out of range are refused by the NIF where Settings refuses them", %{agent: agent} do
    for size <- [-1, 0, 1, 2, 1000, 1001, 5000] do
      nif = Windows.observe_request(agent, 1, [], size, 5)
      elixir = Settings.validate(%{"window_size" => size})
      assert match?({:ok, _}, nif) == match?({:ok, _}, elixir), "window_size #{size}"
      if match?({:error, _}, nif), do: assert(nif == {:error, :invalid_kill_switch_window})
    end

    for threshold <- [-1, 0, 0.0, 1.0e-9, 1, 1.0e12] do
      nif = Windows.observe_request(agent, 1, [], 10, threshold)
      elixir = Settings.validate(%{"threshold" => threshold})
      assert match?({:ok, _}, nif) == match?({:ok, _}, elixir), "threshold #{threshold}"
      if match?({:error, _}, nif), do: assert(nif == {:error, :invalid_kill_switch_threshold})
    end

    assert length(Windows.entries(agent)) == 5, "only the accepted calls were stored"
    assert Windows.resize(agent, 1) == {:error, :invalid_kill_switch_window}
  end

  test "resize trims at once, clear forgets, status reports the fill", %{agent: agent} do
    for _ <- 1..6, do: observe(agent, @p, [1], 6)
    assert %{window_len: 6, window_size: 6, score: 12.5} = Windows.status(agent)
    assert Windows.resize(agent, 2)
    assert %{window_len: 2, window_size: 2, score: 2.5} = Windows.status(agent)
    assert Windows.clear(agent)
    refute Windows.clear(agent)
    assert Windows.status(agent) == nil
    refute Windows.observe_response(agent, @r), "no window, nothing to attach to"
    refute Windows.resize(agent, 5)
  end

  test "a request with many tool calls is scored on a dirty scheduler, alike", %{agent: agent} do
    many = Enum.to_list(1..100)
    observe(agent, @p, many)
    assert observe(agent, @p, Enum.reverse(many)).score == 2.5
  end
end
