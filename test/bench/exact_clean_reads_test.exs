# bench/ is not compiled by mix: the exact-clean reads that bench/real_runs.exs reports
# are loaded from there.
Code.require_file("../../bench/exact_clean_reads.exs", __DIR__)

defmodule Observatory.Bench.ExactCleanReadsTest do
  use ExUnit.Case, async: true

  alias Observatory.Bench.ExactCleanReads
  alias Observatory.JSON

  @reads Path.expand("../../bench/real_runs/stuck/exact_clean_reads.jsonl", __DIR__)
  @labels Path.expand("../../bench/real_runs/stuck/labels.jsonl", __DIR__)

  defp session(id, opts) do
    %{
      id: id,
      source: Keyword.get(opts, :source, "intercode"),
      label: Keyword.get(opts, :label, "clean"),
      steps: List.duplicate(%{}, Keyword.get(opts, :steps, 5)),
      alarms: %{verdict: Keyword.get(opts, :alarm)}
    }
  end

  defp jsonl(path) do
    for line <- path |> File.read!() |> String.split("\n", trim: true) do
      {:ok, object} = JSON.decode(line)
      object
    end
  end

  describe "exact-clean alarms split by what a reader found" do
    test "each alarm is read stuck, read fine or not read; a session without a read is not read" do
      clean = [
        session("a", alarm: 3),
        session("b", alarm: 4),
        session("c", alarm: 2),
        session("d", alarm: 5),
        session("e", alarm: nil)
      ]

      reads = %{"a" => "stuck", "b" => "fine", "c" => "unread", "e" => "stuck"}

      assert %{alarmed: 4, read_stuck: 1, read_fine: 1, not_read: 2, clean: 5} =
               ExactCleanReads.alarm_reads(clean, reads, :verdict)
    end

    test "no alarm, nothing to split" do
      assert %{alarmed: 0, read_stuck: 0, read_fine: 0, not_read: 0} =
               ExactCleanReads.alarm_reads([session("a", [])], %{"a" => "stuck"}, :verdict)
    end
  end

  describe "the stuck share of exact-clean sessions, from the sample's strata" do
    test "a stratum's share stands for the sessions it draws from; shorter sessions count as not stuck" do
      # 10 exact-clean sessions of 3 steps or more (the ic-clean stratum draws from
      # them), 2 read, 1 stuck; 10 shorter ones no stratum draws from.
      long = for i <- 1..10, do: session("long#{i}", steps: 4)
      short = for i <- 1..10, do: session("short#{i}", steps: 2)

      labelled = [
        Map.merge(hd(long), %{stratum: "ic-clean", stuck_label: "stuck"}),
        Map.merge(Enum.at(long, 1), %{stratum: "ic-clean", stuck_label: "fine"})
      ]

      e = ExactCleanReads.stuck_share(long ++ short, labelled, 0.85)
      assert %{clean: 20, read: 2, read_stuck: 1, strata: ["ic-clean"]} = e
      # 10 sessions * 1/2 stuck, of 20.
      assert_in_delta e.stuck_share, 0.25, 1.0e-9
      assert_in_delta e.implied_alarm_rate, 0.85 * 0.25, 1.0e-9
      assert e.stuck_share_low < e.stuck_share and e.stuck_share < e.stuck_share_high
      assert e.stuck_share_high <= 0.5
    end

    test "the corpus figure: 11 stuck of 70 read stand for 408 of 1,248 sessions, 95 % Wilson bounds" do
      long = for i <- 1..408, do: session("long#{i}", steps: 3)
      short = for i <- 1..840, do: session("short#{i}", steps: 1)

      labelled =
        for {s, i} <- Enum.with_index(Enum.take(long, 70)),
            do:
              Map.merge(s, %{
                stratum: "ic-clean",
                stuck_label: if(i < 11, do: "stuck", else: "fine")
              })

      e = ExactCleanReads.stuck_share(long ++ short, labelled, 0.85)
      assert_in_delta e.stuck_share, 408 * 11 / 70 / 1248, 1.0e-9
      # Wilson 95 % for 11 of 70: about 9.0 % to 26.0 %.
      assert_in_delta e.stuck_share_low, 408 * 0.0901 / 1248, 0.001
      assert_in_delta e.stuck_share_high, 408 * 0.2597 / 1248, 0.001
    end

    test "without a read exact-clean session there is no estimate" do
      e = ExactCleanReads.stuck_share([session("a", [])], [], 0.85)
      # Not 0.0: with no read there is no share to report ("-" in the table).
      assert %{read: 0, stuck_share: nil, stuck_share_high: nil, strata: []} = e
      assert e.implied_alarm_rate == nil
    end
  end

  describe "the committed reads (bench/real_runs/stuck/exact_clean_reads.jsonl)" do
    test "one line per session, a verdict of stuck, fine or unread with a reason; held-out sessions never read" do
      reads = jsonl(@reads)
      labels = Map.new(jsonl(@labels), &{&1["session_id"], &1})
      ids = Enum.map(reads, & &1["session_id"])
      assert ids == Enum.uniq(ids)

      for read <- reads do
        assert read["read"] in ["stuck", "fine", "unread"], inspect(read)
        assert is_binary(read["reason"]) and read["reason"] != ""
        split = get_in(labels, [read["session_id"], "split"]) || "unsampled"
        assert read["split"] == split, inspect(read)
        if split == "held-out", do: assert(read["read"] == "unread", inspect(read))
      end
    end
  end
end
