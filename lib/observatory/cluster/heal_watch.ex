defmodule Observatory.Cluster.HealWatch do
  @moduledoc """
  Notices a heal that does not come: nodes this node reaches whose Mnesia still runs
  apart from its own longer than `heal_timeout_ms` (a heal holds writes at most that
  long, so a partition it can heal is healed well within it).

  `Observatory.Cluster.Monitor` feeds it what each look at the cluster saw (`see/4`)
  and logs one warning per stall (`:stalled`), and one line when it ends (`:ended`):
  a stall that lasts is said once, not at every poll. A partition still under way
  (nodes this node cannot reach) is not a stall: only nodes reached are counted.
  """

  @typedoc "Since when `apart` have run apart (monotonic ms), and whether it was said."
  @type t :: %{since: integer(), apart: [node()], warned: boolean()} | nil

  @doc """
  The watch after a look that found `apart` (the reached nodes whose Mnesia runs
  apart from this node's; `[]`: whole; `:unknown`: this node's Mnesia does not run,
  the watch is kept) at monotonic time `now`, and what to say:
  `{:stalled, ms}` once a stall has lasted `timeout` ms, `{:ended, ms}` when a stall
  that was said is over, else `nil`.
  """
  @spec see(t(), [node()] | :unknown, integer(), pos_integer()) ::
          {t(), nil | {:stalled, non_neg_integer()} | {:ended, non_neg_integer()}}
  # `:unknown`: this node's Mnesia does not run, so which nodes run apart from it
  # cannot be told. Not the end of a stall: the watch is kept as it is.
  def see(watch, :unknown, _now, _timeout), do: {watch, nil}
  def see(nil, [], _now, _timeout), do: {nil, nil}
  def see(%{warned: true} = watch, [], now, _timeout), do: {nil, {:ended, now - watch.since}}
  def see(_watch, [], _now, _timeout), do: {nil, nil}

  def see(nil, apart, now, timeout),
    do: see(%{since: now, apart: [], warned: false}, apart, now, timeout)

  def see(watch, apart, now, timeout) do
    watch = %{watch | apart: Enum.sort(apart)}
    waited = now - watch.since

    if not watch.warned and waited >= timeout,
      do: {%{watch | warned: true}, {:stalled, waited}},
      else: {watch, nil}
  end
end
