# What the ingest's small per-step reads and writes cost alone (docs/ingest-cost.md,
# the glue's section): the kill switch's read and what an agent's record costs to
# copy, Mnesia's where-to-read check, a setting's read, and an ETS slot rewritten
# (a lookup of one field, then an insert, as the session log does) under each
# table option, with one caller and with two at once.
#
#   MIX_ENV=prod mix run bench/glue_reads_cost.exs
#
# ns per call: the wall time of a loop of 300,000 calls, three rounds.
alias Observatory.KillSwitch.Agents

Logger.configure(level: :error)
for a <- 0..49, do: {:ok, _} = Agents.fetch_or_register("agent-#{a}")

defmodule GlueReadsCost do
  def loop(0, _fun), do: :ok

  def loop(n, fun) do
    fun.(n)
    loop(n - 1, fun)
  end

  def ns(fun, n) do
    loop(1_000, fun)
    started = :erlang.monotonic_time(:nanosecond)
    loop(n, fun)
    div(:erlang.monotonic_time(:nanosecond) - started, n)
  end
end

n = 300_000
agents = :observatory_agents
[{_, _, record}] = :ets.lookup(agents, "agent-7")
load = :os.cmd(~c"cut -d' ' -f1 /proc/loadavg 2>/dev/null") |> to_string() |> String.trim()
IO.puts("1-min load average at the start: #{load}")
IO.puts("an agent's record: #{:erts_debug.size(record)} words\n")

reads = [
  {"KillSwitch.active?/1 (a registered agent)", fn _ -> Agents.active?("agent-7") end},
  {":ets.lookup of the agent's row (copies the record)",
   fn _ -> :ets.lookup(agents, "agent-7") end},
  {":ets.lookup of a missing key", fn _ -> :ets.lookup(agents, "agent-none") end},
  {":ets.select of the flag alone (a match specification)",
   fn _ -> :ets.select(agents, [{{agents, "agent-7", %{active: :"$1"}}, [], [:"$1"]}]) end},
  {"Mnesia's where_to_read of the table",
   fn _ -> :ets.lookup_element(:mnesia_gvar, {agents, :where_to_read}, 2) end},
  {"Application.get_env/3", fn _ -> Application.get_env(:observatory, :session_log_size, 20) end},
  {"the application controller's table, read directly",
   fn _ -> :ets.lookup(:ac_tab, {:env, :observatory, :session_log_size}) end}
]

IO.puts("| read | ns per call, three rounds |\n|---|---:|")

for {name, fun} <- reads do
  IO.puts("| #{name} | #{Enum.map_join(1..3, " / ", fn _ -> GlueReadsCost.ns(fun, n) end)} |")
end

# 1,000 sessions × 20 slots of a 600-byte text, rewritten slot by slot.
json = String.duplicate("x", 600)
sessions = List.to_tuple(for i <- 0..999, do: "glue-#{i}")
slot = fn n, base -> {elem(sessions, rem(n + base, 1000)), rem(div(n, 1000), 20)} end

options = [
  {"read_concurrency + write_concurrency (before)",
   [:public, :set, read_concurrency: true, write_concurrency: true]},
  {"write_concurrency: :auto (now)", [:public, :set, write_concurrency: :auto]},
  {"write_concurrency: true", [:public, :set, write_concurrency: true]},
  {"no option (one lock)", [:public, :set]}
]

IO.puts(
  "\n| table | 1 caller: ns per rewrite | 2 callers: ns per rewrite (wall / both's rewrites) |"
)

IO.puts("|---|---:|---:|")

for {name, opts} <- options do
  table = :ets.new(:glue_reads_cost, opts)
  for i <- 1..20_000, do: :ets.insert(table, {slot.(i, 0), i, {:json, json, 0.5}, 600, i, 0})

  rewrite = fn base ->
    fn n ->
      key = slot.(n, base)
      :ets.lookup_element(table, key, 4)
      :ets.insert(table, {key, n, {:json, json, 0.5}, 600, n, 0})
    end
  end

  one = Enum.map_join(1..3, " / ", fn _ -> GlueReadsCost.ns(rewrite.(0), n) end)

  two =
    Enum.map_join(1..3, " / ", fn _ ->
      started = :erlang.monotonic_time(:nanosecond)

      [0, 500]
      |> Enum.map(fn base -> Task.async(fn -> GlueReadsCost.loop(n, rewrite.(base)) end) end)
      |> Enum.each(&Task.await(&1, :infinity))

      div(:erlang.monotonic_time(:nanosecond) - started, 2 * n)
    end)

  IO.puts("| #{name} | #{one} | #{two} |")
  :ets.delete(table)
end
