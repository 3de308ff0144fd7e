# What the by-hand reads say about the exact label's *clean* sessions (no two identical
# actions in a row), for bench/real_runs.exs: how many of a detector's alarms on them a
# reader found stuck, found fine or has not read, and how many exact-clean sessions the
# stuck sample says are stuck. Kept apart from the script so that tests can load it.
defmodule Observatory.Bench.ExactCleanReads do
  @moduledoc false

  @doc """
  A detector's alarms on exact-clean sessions against the by-hand reads of those alarms
  (`reads`: session id => `"stuck"` / `"fine"` / `"unread"`): how many a reader found
  stuck, found fine, or has not read (held-out sessions are never opened).
  """
  def alarm_reads(clean, reads, detector) do
    alarmed = Enum.filter(clean, & &1.alarms[detector])
    read = fn s -> Map.get(reads, s.id, "unread") end

    %{
      detector: detector,
      clean: length(clean),
      alarmed: length(alarmed),
      read_stuck: Enum.count(alarmed, &(read.(&1) == "stuck")),
      read_fine: Enum.count(alarmed, &(read.(&1) == "fine")),
      not_read: Enum.count(alarmed, &(read.(&1) not in ["stuck", "fine"]))
    }
  end

  # The strata of the stuck sample (bench/real_runs/stuck/sample.py's STRATA): each a
  # random draw of the sessions it keeps, so its share of stuck sessions estimates theirs.
  @strata %{
    "ic-other" => &__MODULE__.ic_other?/1,
    "ic-looping" => &__MODULE__.ic_looping?/1,
    "ic-clean" => &__MODULE__.ic_clean?/1,
    "tau-long" => &__MODULE__.tau_long?/1,
    "tau-short" => &__MODULE__.tau_short?/1
  }

  def ic_other?(s), do: s.source == "intercode" and s.label == "other"
  def ic_looping?(s), do: s.source == "intercode" and s.label == "looping"
  def ic_clean?(s), do: s.source == "intercode" and s.label == "clean" and length(s.steps) >= 3
  def tau_long?(s), do: s.source == "tau-bench" and length(s.steps) >= 15
  def tau_short?(s), do: s.source == "tau-bench" and length(s.steps) < 15

  @doc """
  How many of a source's exact-clean sessions a reader would call stuck, estimated from
  the stuck sample: per stratum, the share of stuck sessions among its exact-clean
  sessions read, times the exact-clean sessions the stratum draws from (with a 95 %
  Wilson interval); exact-clean sessions no stratum draws from (InterCode sessions of
  fewer than 3 steps) cannot be stuck for three steps and count as not stuck. What it
  implies for the exact-clean alarm rate of a detector that catches `recall` of stuck
  sessions (and alarms on no fine one): at least `recall` times the stuck share.
  """
  def stuck_share(clean, labelled, recall) do
    strata =
      for {name, keep?} <- Enum.sort(@strata),
          read = Enum.filter(labelled, &(&1.stratum == name and &1.label == "clean")),
          read != [] do
        n = length(read)
        stuck = Enum.count(read, &(&1.stuck_label == "stuck"))
        population = Enum.count(clean, keep?)
        {low, high} = wilson(stuck, n)

        %{
          stratum: name,
          read: n,
          stuck: stuck,
          population: population,
          estimate: population * stuck / n,
          low: population * low,
          high: population * high
        }
      end

    total = length(clean)
    sum = fn key -> strata |> Enum.map(& &1[key]) |> Enum.sum() end
    # No session read: no estimate (nil, shown "-"), not a share of 0.
    share = fn key -> if total > 0 and strata != [], do: sum.(key) / total end

    %{
      clean: total,
      read: sum.(:read),
      read_stuck: sum.(:stuck),
      strata: Enum.map(strata, & &1.stratum),
      stuck_share: share.(:estimate),
      stuck_share_low: share.(:low),
      stuck_share_high: share.(:high),
      recall: recall,
      implied_alarm_rate: share.(:estimate) && recall * share.(:estimate),
      implied_alarm_rate_low: share.(:low) && recall * share.(:low),
      implied_alarm_rate_high: share.(:high) && recall * share.(:high)
    }
  end

  # The 95 % Wilson score interval of a share of `k` in `n`.
  defp wilson(k, n) do
    z = 1.959964
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * :math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    {max(centre - half, 0.0), min(centre + half, 1.0)}
  end
end
