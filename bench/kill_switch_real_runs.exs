# Does the kill switch, at its defaults, leave healthy tool-using agents alone and stop
# looping ones? Replays recorded agent runs as the requests an SDK would have sent
# through the proxy, turn by turn — the whole conversation re-sent each time, in the
# Chat Completions shape and in the Anthropic Messages shape — through the kill
# switch's own path: KillSwitch.fingerprint_request/3 on the encoded body (the NIF the
# proxy calls), the agent's window (Observatory.KillSwitch.Windows, the proxy's store)
# at the configured window_size and threshold, and the answer's fingerprint
# (KillSwitch.fingerprint_response/2 on the upstream's answer as it would have come).
#
#   MIX_ENV=prod mix run --no-start bench/kill_switch_real_runs.exs
#   MIX_ENV=prod mix run --no-start bench/kill_switch_real_runs.exs -- \
#     --data DIR --scripted DIR --compare 10:10,6:5 --list
#
# The defaults are the configured ones (config :observatory, :kill_switch); --compare
# lists other window_size:threshold settings replayed in the same run (default
# 10:10,6:5); --list names the clean sessions tripped and the looping ones missed.
#
# A session is one agent with the switch on and an empty window. Request k carries the
# conversation before the session's step k; the answer to it is step k's action (a
# tool call, or text to the user). A session is *tripped* when one of its requests
# exceeds the threshold, i.e. the proxy would have refused it and deactivated the agent.
# After the last step no request is sent: the harness stopped there.
#
# Each session is replayed with both readings of the prompt: the newest user-side input
# (the default: the tool results of a tool turn) and the last user message (the kill
# switch specification's letter, `config :observatory, :kill_switch, prompt:`). Labels:
#
#   * ../shared/datasets/real_runs (--data): τ-bench (gpt-4o, OpenAI function calls; its
#     `respond` steps are the agent's text answers and the simulated user's replies)
#     and InterCode (bash, SQL, Python, CTF; each command replayed as a tool call):
#     `looping` (a run of ≥ 4 identical actions), `clean`, `other` (its README);
#   * bench/real_runs/scripted (--scripted): 88 looping and 88 clean sessions of a
#     scripted agent on a real bash and file editor (its README).
#
# "steps into the loop" is, for a tripped looping session, the number of the loop's
# steps the agent had taken when its request was refused (from `first_run4_start` /
# `loop_start`), median over the tripped sessions.
defmodule Observatory.Bench.KillSwitchRealRuns do
  @moduledoc false

  alias Observatory.JSON
  alias Observatory.KillSwitch
  alias Observatory.KillSwitch.Windows
  alias Observatory.Replay.Input

  @store :kill_switch_real_runs
  @system "You are an agent. Use the tools to complete the task."

  def store, do: @store

  @doc "The sessions of a steps file, in file order: {session_id, [record]}."
  def sessions(path) do
    {order, by_id} =
      path
      |> Input.lines()
      |> Enum.reduce({[], %{}}, fn {_line, text}, {order, by_id} ->
        {:ok, %{"session_id" => id} = record} = JSON.decode(text)
        order = if Map.has_key?(by_id, id), do: order, else: [id | order]
        {order, Map.update(by_id, id, [record], &[record | &1])}
      end)

    for id <- Enum.reverse(order), do: {id, Enum.reverse(Map.fetch!(by_id, id))}
  end

  def read_jsonl(path) do
    for {_line, text} <- Input.lines(path) do
      {:ok, object} = JSON.decode(text)
      object
    end
  end

  @doc """
  The requests an SDK agent would have sent for these steps, with the answer each got:
  `[{request_json, response_json}]`, one per step.
  """
  def exchanges(steps, task, api) do
    start = opening(api, task)

    {exchanges, _conversation} =
      steps
      |> Enum.with_index()
      |> Enum.map_reduce(start, fn {step, k}, conversation ->
        {assistant, answer} = turn(api, step, k)
        request = JSON.encode!(body(api, conversation))
        {{request, JSON.encode!(response(api, assistant))}, conversation ++ [assistant, answer]}
      end)

    exchanges
  end

  defp opening(:chat_completions, task),
    do: [%{"role" => "system", "content" => @system}, %{"role" => "user", "content" => task}]

  defp opening(:messages, task), do: [%{"role" => "user", "content" => task}]

  defp body(:chat_completions, messages), do: %{"model" => "replay", "messages" => messages}

  defp body(:messages, messages),
    do: %{"model" => "replay", "max_tokens" => 1024, "system" => @system, "messages" => messages}

  # τ-bench records the agent's text answers as `respond` steps whose result is the
  # user's reply (the corpus's README).
  defp turn(:chat_completions, %{"tool_call" => "respond"} = step, _k) do
    {%{"role" => "assistant", "content" => text(step["tool_input"]["content"])},
     %{"role" => "user", "content" => text(step["result"])}}
  end

  defp turn(:messages, %{"tool_call" => "respond"} = step, _k) do
    {%{"role" => "assistant", "content" => [text_block(step["tool_input"]["content"])]},
     %{"role" => "user", "content" => text(step["result"])}}
  end

  defp turn(:chat_completions, step, k) do
    id = "call_#{k}"

    call = %{
      "id" => id,
      "type" => "function",
      "function" => %{
        "name" => step["tool_call"],
        "arguments" => JSON.encode!(step["tool_input"])
      }
    }

    {%{"role" => "assistant", "content" => step["response_text"], "tool_calls" => [call]},
     %{"role" => "tool", "tool_call_id" => id, "content" => text(step["result"])}}
  end

  defp turn(:messages, step, k) do
    id = "toolu_#{k}"
    prose = if step["response_text"], do: [text_block(step["response_text"])], else: []

    use = %{
      "type" => "tool_use",
      "id" => id,
      "name" => step["tool_call"],
      "input" => step["tool_input"]
    }

    result = %{
      "type" => "tool_result",
      "tool_use_id" => id,
      "content" => text(step["result"]),
      "is_error" => step["action_status"] == "failure"
    }

    {%{"role" => "assistant", "content" => prose ++ [use]},
     %{"role" => "user", "content" => [result]}}
  end

  defp response(:chat_completions, message) do
    %{
      "id" => "chatcmpl-replay",
      "object" => "chat.completion",
      "choices" => [%{"index" => 0, "message" => message, "finish_reason" => "stop"}]
    }
  end

  defp response(:messages, message) do
    %{"id" => "msg_replay", "type" => "message", "role" => "assistant"}
    |> Map.merge(message)
  end

  defp text(nil), do: ""
  defp text(text) when is_binary(text), do: text
  defp text(other), do: JSON.encode!(other)

  defp text_block(text), do: %{"type" => "text", "text" => text(text)}

  @doc """
  Replays one session's exchanges through a fresh window: the 0-based index of the
  first request whose score exceeds the threshold, or nil.
  """
  def first_trip(exchanges, api, source, {window_size, threshold}) do
    agent = "replay-#{System.unique_integer([:positive])}"

    tripped =
      Enum.find_index(exchanges, fn {request, answer} ->
        {:ok, fp} = KillSwitch.fingerprint_request(request, api, prompt: source)

        {:ok, verdict} =
          Windows.observe_request(
            agent,
            fp.prompt_hash,
            fp.tool_signatures,
            window_size,
            threshold,
            @store
          )

        {:ok, hash} = KillSwitch.fingerprint_response(answer, api)
        if hash, do: Windows.observe_response(agent, hash, @store)
        verdict.exceeded
      end)

    Windows.clear(agent, @store)
    tripped
  end

  @doc "The median of integers, as text: `4`, `4.5`."
  def median([]), do: nil

  def median(values) do
    sorted = Enum.sort(values)
    n = length(sorted)
    mid = div(n, 2)

    if rem(n, 2) == 1,
      do: Integer.to_string(Enum.at(sorted, mid)),
      else: half(Enum.at(sorted, mid - 1) + Enum.at(sorted, mid))
  end

  defp half(sum) when rem(sum, 2) == 0, do: Integer.to_string(div(sum, 2))
  defp half(sum), do: :erlang.float_to_binary(sum / 2, decimals: 1)

  def ratio(_n, 0), do: "–"

  def ratio(n, total),
    do: "#{n} / #{total} (#{:erlang.float_to_binary(100 * n / total, decimals: 1)} %)"
end

alias Observatory.Bench.KillSwitchRealRuns, as: Bench

Logger.configure(level: :error)

argv = with ["--" | rest] <- System.argv(), do: rest

{opts, _args} =
  OptionParser.parse!(argv,
    strict: [data: :string, scripted: :string, compare: :string, list: :boolean]
  )

parse_settings = fn text ->
  [window, threshold] = String.split(text, ":")
  {String.to_integer(window), elem(Float.parse(threshold), 0)}
end

config = Application.get_env(:observatory, :kill_switch, [])
defaults = {config[:window_size], config[:threshold] / 1}

compared =
  opts
  |> Keyword.get(:compare, "10:10,6:5")
  |> String.split(",", trim: true)
  |> Enum.map(parse_settings)
  |> Enum.reject(&(&1 == defaults))

data = Keyword.get(opts, :data, "../shared/datasets/real_runs")
scripted = Keyword.get(opts, :scripted, "bench/real_runs/scripted")
started = System.monotonic_time(:millisecond)
# Without the application (--no-start) nothing has made the table the stores live in.
:ok = Observatory.NativeStores.setup()
{:ok, _} = Observatory.KillSwitch.Windows.start_link(name: Bench.store(), max_agents: 100_000)

# {corpus, session_id, label, loop_start, steps, task}
dev_info =
  for s <- Bench.read_jsonl(Path.join(data, "sessions.jsonl")), into: %{} do
    {s["session_id"], s}
  end

dev =
  for {id, steps} <- Bench.sessions(Path.join(data, "steps.jsonl.gz")) do
    info = Map.fetch!(dev_info, id)
    {info["source"], id, info["label"], info["first_run4_start"], steps, "Task #{info["task"]}"}
  end

scripted_sessions =
  if File.regular?(Path.join(scripted, "steps.jsonl")) do
    info =
      for s <- Bench.read_jsonl(Path.join(scripted, "sessions.jsonl")), into: %{} do
        {s["session_id"], s}
      end

    for {id, steps} <- Bench.sessions(Path.join(scripted, "steps.jsonl")) do
      s = Map.fetch!(info, id)
      {"scripted", id, s["label"], s["loop_start"], steps, "Task #{s["scenario"]}"}
    end
  else
    IO.puts(:stderr, "no scripted runs in #{scripted}")
    []
  end

sessions = dev ++ scripted_sessions
apis = [:chat_completions, :messages]
sources = [:newest_input, :last_user_message]

# The replays: at the defaults, both shapes and both readings; each compared setting
# with the default reading. %{session_id => %{{api, source, settings} => first trip}}
replays =
  for(api <- apis, source <- sources, do: {api, source, defaults}) ++
    for settings <- compared, api <- apis, do: {api, :newest_input, settings}

trips =
  sessions
  |> Task.async_stream(
    fn {_corpus, id, _label, _start, steps, task} ->
      exchanges = Map.new(apis, &{&1, Bench.exchanges(steps, task, &1)})

      {id,
       Map.new(replays, fn {api, source, settings} = replay ->
         {replay, Bench.first_trip(exchanges[api], api, source, settings)}
       end)}
    end,
    timeout: :infinity,
    ordered: false
  )
  |> Map.new(fn {:ok, result} -> result end)

requests = sessions |> Enum.map(fn {_, _, _, _, steps, _} -> length(steps) end) |> Enum.sum()
seconds = (System.monotonic_time(:millisecond) - started) / 1000
{window, threshold} = defaults

IO.puts(
  "#{length(sessions)} sessions, #{requests} requests each replayed #{length(replays)} times " <>
    "(#{length(replays) * requests} in all) in #{Float.round(seconds, 1)} s\n"
)

groups =
  for corpus <- ["tau-bench", "intercode", "scripted"], label <- ["clean", "looping", "other"] do
    {corpus, label, for({^corpus, _, ^label, _, _, _} = s <- sessions, do: s)}
  end
  |> Enum.reject(fn {_, _, members} -> members == [] end)

all = fn label -> for {_, _, ^label, _, _, _} = s <- sessions, do: s end

# "tripped n / N (p %) | steps into the loop" for one replay over some sessions.
cell = fn members, label, replay ->
  tripped = for {_, id, _, start, _, _} <- members, k = trips[id][replay], do: {k, start}
  delays = for {k, start} <- tripped, is_integer(start), do: k - start
  delay = if label == "looping", do: Bench.median(delays) || "–", else: ""
  {Bench.ratio(length(tripped), length(members)), delay}
end

shape = fn api -> if api == :messages, do: "Anthropic Messages", else: "Chat Completions" end

IO.puts("""
### At the defaults: window_size #{window}, threshold #{threshold}

| sessions | request shape | tripped, newest user-side input (default) | steps into the loop | tripped, last user message (the spec's letter) | steps into the loop |
|---|---|---:|---:|---:|---:|\
""")

rows =
  Enum.map(groups, fn {corpus, label, members} -> {"#{corpus} #{label}", label, members} end) ++
    [{"**all clean**", "clean", all.("clean")}, {"**all looping**", "looping", all.("looping")}]

for {title, label, members} <- rows, api <- apis do
  cells =
    for source <- sources do
      {ratio, delay} = cell.(members, label, {api, source, defaults})
      "#{ratio} | #{delay}"
    end

  IO.puts("| #{title} | #{shape.(api)} | #{Enum.join(cells, " | ")} |")
end

# Both shapes carry the same conversation: they must trip the same sessions.
for source <- sources,
    {_, id, _, _, _, _} <- sessions,
    trips[id][{:chat_completions, source, defaults}] != trips[id][{:messages, source, defaults}] do
  IO.puts(:stderr, "#{id}: the two shapes differ with #{source}")
end

IO.puts("""

### Other settings, same run (newest user-side input; both shapes trip the same sessions)

| window_size, threshold | all clean | all looping | InterCode looping | scripted looping | steps into the loop |
|---|---:|---:|---:|---:|---:|\
""")

for settings <- [defaults | compared] do
  replay = {:chat_completions, :newest_input, settings}
  {clean, _} = cell.(all.("clean"), "clean", replay)
  {looping, delay} = cell.(all.("looping"), "looping", replay)

  {intercode, _} =
    cell.(for({"intercode", _, "looping", _, _, _} = s <- sessions, do: s), "looping", replay)

  {script, _} =
    cell.(for({"scripted", _, "looping", _, _, _} = s <- sessions, do: s), "looping", replay)

  {w, t} = settings
  mark = if settings == defaults, do: " (default)", else: ""
  IO.puts("| #{w}, #{t}#{mark} | #{clean} | #{looping} | #{intercode} | #{script} | #{delay} |")
end

if opts[:list] do
  IO.puts("")

  for {corpus, id, label, start, steps, _} <- sessions,
      label in ["clean", "looping"],
      tripped <- [trips[id][{:chat_completions, :newest_input, defaults}]],
      label == "clean" == (tripped != nil) do
    what =
      if label == "clean",
        do: "tripped at request #{tripped}",
        else: "missed (loop from step #{start})"

    IO.puts("#{corpus} #{label} #{id}: #{what}, #{length(steps)} steps")
  end
end
