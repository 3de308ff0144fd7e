# The per-request work the graded response adds to the LLM proxy — budgets (checked,
# counted, the answer's usage read and costed), guidance notes (a note spliced into
# the body), the usage of streamed chat completions asked for — each call alone,
# after a warm-up, in this VM:
#
#   OBSERVATORY_PORT=0 OBSERVATORY_DATA_DIR=$(mktemp -d) MIX_ENV=prod mix run bench/graded_request_work.exs
#
# The baseline, in the same run, is work every proxied request already did: the kill
# switch's fingerprint of the same body. The splice is also compared with what it
# replaces, decoding the body and encoding it again (which would also reorder keys
# and re-escape strings).
alias Observatory.{Budget, JSON, KillSwitch}
alias Observatory.KillSwitch.Agents
alias Observatory.Proxy.BodyEdit

Logger.configure(level: :error)
Application.put_env(:observatory, :budgets, prices: %{"gpt-4.1" => %{input: 2.0, output: 8.0}})

{:ok, _} = Agents.fetch_or_register("bench-graded-free")
{:ok, _} = Agents.fetch_or_register("bench-graded-limited")

{:ok, _} =
  Budget.configure("bench-graded-limited", %{
    "session_tokens" => 1_000_000_000,
    "session_cost_usd" => 1_000_000,
    "window_requests" => 1_000_000_000,
    "window_tokens" => 1_000_000_000,
    "window_cost_usd" => 1_000_000
  })

free = KillSwitch.agent("bench-graded-free")
limited = KillSwitch.agent("bench-graded-limited")

# The limited agent's window full: a request and its usage in each of its 60 buckets.
now = System.system_time(:second)

for k <- 0..59 do
  at = now - k * 60
  Observatory.Budget.Store.count_request("bench-graded-limited", "bench-s", 3600, at)

  Observatory.Budget.Store.add_usage(
    "bench-graded-limited",
    "bench-s",
    %{input: 3000, cached: 0, cache_write: 0, output: 120},
    6000,
    3600,
    at
  )
end

# A tool agent's conversation: `turns` calls and results of about 500 bytes each.
conversation = fn turns ->
  messages =
    Enum.flat_map(1..turns, fn k ->
      [
        %{
          "role" => "assistant",
          "content" => nil,
          "tool_calls" => [
            %{
              "id" => "call_#{k}",
              "type" => "function",
              "function" => %{"name" => "read_file", "arguments" => ~s({"path":"src/h_#{k}.py"})}
            }
          ]
        },
        %{
          "role" => "tool",
          "tool_call_id" => "call_#{k}",
          "content" => String.duplicate("x = #{k}\n", 60)
        }
      ]
    end)

  JSON.encode!(%{
    "model" => "gpt-4.1",
    "stream" => true,
    "messages" => [%{"role" => "user", "content" => "Fix the build."} | messages]
  })
end

answer =
  JSON.encode!(%{
    "id" => "chatcmpl-1",
    "object" => "chat.completion",
    "model" => "gpt-4.1",
    "choices" => [
      %{
        "index" => 0,
        "message" => %{"role" => "assistant", "content" => String.duplicate("ok ", 400)}
      }
    ],
    "usage" => %{"prompt_tokens" => 3000, "completion_tokens" => 120}
  })

note =
  "[Observatory] Loop warning: the same call 3 times in a row, its result saying nothing new."

usage = %{"prompt_tokens" => 3000, "completion_tokens" => 120}

measure = fn n, fun ->
  for _ <- 1..div(n, 10), do: fun.()
  {us, _} = :timer.tc(fn -> for _ <- 1..n, do: fun.() end)
  us / n
end

small = conversation.(10)
large = conversation.(200)
IO.puts("bodies: #{byte_size(small)} and #{byte_size(large)} bytes\n")

baseline = measure.(5_000, fn -> KillSwitch.fingerprint_request(small) end)
large_baseline = measure.(300, fn -> KillSwitch.fingerprint_request(large) end)
n = :counters.new(1, [])

rows = [
  {"kill-switch fingerprint, #{div(byte_size(small), 1024)} KiB body (before; the baseline)",
   baseline, baseline},
  {"budget check, no limits", measure.(10_000, fn -> Budget.check(free, "bench-s") end),
   baseline},
  {"budget check, 5 limits, a full window (60 buckets)",
   measure.(2_000, fn -> Budget.check(limited, "bench-s") end), baseline},
  {"request counted",
   measure.(10_000, fn ->
     :counters.add(n, 1, 1)
     Budget.count_request(free, "bench-s-#{rem(:counters.get(n, 1), 100)}")
   end), baseline},
  {"answer's usage read (top-level fields of a 1.2 KiB answer)",
   measure.(10_000, fn -> BodyEdit.top_level_fields(answer, ["model", "usage"]) end), baseline},
  {"usage costed and counted",
   measure.(10_000, fn -> Budget.record(free, "bench-s", :chat_completions, "gpt-4.1", usage) end),
   baseline},
  {"stream_options.include_usage asked for, #{div(byte_size(small), 1024)} KiB body",
   measure.(5_000, fn -> BodyEdit.ensure_stream_usage(small) end), baseline},
  {"guidance note spliced, #{div(byte_size(small), 1024)} KiB body",
   measure.(5_000, fn -> BodyEdit.append_note(small, :chat_completions, note) end), baseline},
  {"  vs. decoded and encoded again, #{div(byte_size(small), 1024)} KiB body",
   measure.(5_000, fn -> small |> JSON.decode() |> elem(1) |> JSON.encode!() end), baseline},
  {"kill-switch fingerprint, #{div(byte_size(large), 1024)} KiB body (baseline)", large_baseline,
   large_baseline},
  {"guidance note spliced, #{div(byte_size(large), 1024)} KiB body",
   measure.(300, fn -> BodyEdit.append_note(large, :chat_completions, note) end), large_baseline},
  {"  vs. decoded and encoded again, #{div(byte_size(large), 1024)} KiB body",
   measure.(300, fn -> large |> JSON.decode() |> elem(1) |> JSON.encode!() end), large_baseline}
]

IO.puts("| work per request | µs | × the fingerprint of the same body |")
IO.puts("|---|---:|---:|")

for {name, us, base} <- rows,
    do: IO.puts("| #{name} | #{Float.round(us, 2)} | #{Float.round(us / base, 2)} |")
