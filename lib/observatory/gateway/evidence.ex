defmodule Observatory.Gateway.Evidence do
  @moduledoc """
  What an operator needs to tell a real loop from a false alarm, built from the steps
  the gateway keeps (`Observatory.Gateway.SessionLog`): each step as text (its call,
  arguments and result, capped), and an explanation of the loop verdict and of the
  entropy window that names what repeats and says what did and did not change between
  the repeats.

      stored = SessionLog.steps("sess-7")
      Evidence.steps(stored)
      #=> [%{number: 4, call: "pytest tests/test_auth.py -x", result: "…assert 401 == 200…", …}, …]
      Evidence.explain_verdict(LoopVerdict.session("sess-7"), stored)
      #=> %{rule: :repeat, calls: [%{tool: "bash", call: "pytest tests/test_auth.py -x"}],
      #     times: 4, outcome: "the same failure", steps: [4, 5, 6, 7],
      #     arguments: %{kind: :same}, result: %{kind: :numbers, changes: [...]}, …}

  Step numbers are the session's (`SessionLog.steps/1`): the verdict's `evidence` and
  the entropy window name the same steps.

  The explanation is built here, in Elixir, from the verdict's rule and evidence step
  numbers; the verdict itself (`Observatory.Gateway.LoopVerdict`) stays a hash
  comparison in Rust. Nothing here keys on a tool's name or a result's wording: a call
  is its tool and `action.tool_input`, a result is `action.result` read as text, and a
  change is found by comparing those texts — exactly, with whitespace collapsed, with
  digits masked, line by line.

  Runs when a page or an API client asks (never on the ingest path), on at most the
  stored steps (`:session_log_size`, 20) with every text cut to `@compare_bytes`.
  """

  alias Observatory.JSON

  @call_bytes 160
  @arguments_bytes 400
  @result_bytes 600
  @result_lines 8
  @compare_bytes 8_192
  @max_changes 5
  @max_line_bytes 200
  # A number as the comparisons see it: digits, with a decimal part if any.
  @number ~r/\d+(?:\.\d+)*/

  @type change ::
          %{kind: :same}
          | %{kind: :whitespace}
          | %{kind: :numbers, changes: [%{line: String.t(), values: [String.t()]}]}
          | %{kind: :reordered}
          | %{
              kind: :lines,
              changes: [%{step: pos_integer(), added: [String.t()], removed: [String.t()]}]
            }

  @doc """
  A session's evidence, read on this node (the session's owner in a cluster): its
  stored steps as text (`steps/2`, with `opts`), the explanation of its latest loop
  verdict (`explain_verdict/2`) and of its entropy window (`explain_window/2`).
  `window` and `verdict` are the tracker's window and the verdict, when the caller
  has them already.
  """
  @spec for_session(String.t(), keyword()) :: %{
          steps: [map()],
          verdict: map() | nil,
          window: map() | nil
        }
  def for_session(session_id, opts \\ []) do
    # Each step read as text once, for the list and both explanations.
    stored =
      for step <- Observatory.Gateway.SessionLog.steps(session_id),
          do: Map.put(step, :texts, texts(step.envelope))

    window =
      Keyword.get_lazy(opts, :window, fn ->
        Observatory.Gateway.EntropyTracker.window(session_id)
      end)

    verdict =
      Keyword.get_lazy(opts, :verdict, fn ->
        Observatory.Gateway.LoopVerdict.session(session_id)
      end)

    %{
      steps: steps(stored, opts),
      verdict: explain_verdict(verdict, stored),
      window: explain_window(window, stored)
    }
  end

  ## Steps as text

  @doc """
  The stored steps (`SessionLog.steps/1`) as text, oldest first. Arguments and
  results are cut (`truncated: true` says so) unless the step's number is in `:full`.

  ## Options
    * `:full` — step numbers whose arguments and result are given whole.
    * `:result_bytes`, `:arguments_bytes` — the caps (defaults #{@result_bytes} and
      #{@arguments_bytes} bytes, cut on a character boundary).
  """
  @spec steps([map()], keyword()) :: [map()]
  def steps(stored, opts \\ []) do
    full = MapSet.new(Keyword.get(opts, :full, []))
    result_cap = Keyword.get(opts, :result_bytes, @result_bytes)
    arguments_cap = Keyword.get(opts, :arguments_bytes, @arguments_bytes)

    for %{number: number, at: at, envelope: envelope} = step <- stored do
      whole? = MapSet.member?(full, number)
      text = text_of(step)

      {arguments, cut_a} =
        if whole?, do: {text.arguments, false}, else: cap(text.arguments, arguments_cap, 4)

      {result, cut_r} =
        if whole?, do: {text.result, false}, else: cap(text.result, result_cap, @result_lines)

      %{
        number: number,
        at: DateTime.from_unix!(at, :millisecond),
        step_id: get_in(envelope, ["meta", "step_id"]),
        timestamp: get_in(envelope, ["meta", "timestamp"]),
        intent: text.intent,
        tool_call: text.tool,
        status: text.status,
        call: one_line(text.call, @call_bytes),
        arguments: arguments,
        result: result,
        truncated: cut_a or cut_r,
        stored_whole: not Map.get(envelope, "truncated", false)
      }
    end
  end

  # A stored step's texts, read once by `for_session/2`.
  defp text_of(%{texts: texts}), do: texts
  defp text_of(%{envelope: envelope}), do: texts(envelope)

  @doc """
  A step's texts: `tool`, `call` (the command, query or path the call is about: the
  input itself when it is a string, its one string value when it has one, else its
  JSON), `arguments` (the input as JSON), `result` (read as text: a string as it is,
  an object as `key: value` lines, an empty string left out), `intent`, `status`.
  """
  @spec texts(map()) :: %{atom() => String.t()}
  def texts(envelope) do
    action = map_at(envelope, "action")
    tool = string(action["tool_call"])
    input = action["tool_input"]

    %{
      tool: tool,
      call: call_text(tool, input),
      arguments: if(input == nil, do: "", else: json(input)),
      result: result_text(action["result"]),
      intent: string(get_in(envelope, [Access.key("cognition", %{}), "intent"])),
      status: string(action["status"])
    }
  end

  defp map_at(map, key) do
    case map do
      %{^key => value} when is_map(value) -> value
      _ -> %{}
    end
  end

  defp call_text(tool, nil), do: tool
  defp call_text(_tool, input) when is_binary(input), do: input

  defp call_text(tool, input) when is_map(input) do
    case for {_k, v} <- input, is_binary(v), do: v do
      [only] -> only
      _ -> if map_size(input) == 0, do: tool, else: json(input)
    end
  end

  defp call_text(_tool, input), do: json(input)

  @doc false
  def result_text(nil), do: ""
  def result_text(text) when is_binary(text), do: text

  def result_text(map) when is_map(map) do
    map
    |> Enum.sort_by(fn {k, _} -> k end)
    |> Enum.reject(fn {_k, v} -> v == "" or v == nil end)
    |> Enum.map_join("\n", fn
      {k, v} when is_binary(v) ->
        if String.contains?(v, "\n"), do: "#{k}:\n#{v}", else: "#{k}: #{v}"

      {k, v} ->
        "#{k}: #{json(v)}"
    end)
  end

  def result_text(list) when is_list(list) do
    if Enum.all?(list, &is_binary/1), do: Enum.join(list, "\n"), else: json(list)
  end

  def result_text(other), do: json(other)

  defp json(term) do
    case JSON.encode(term) do
      {:ok, text} -> text
      {:error, _} -> inspect(term)
    end
  end

  defp string(value) when is_binary(value), do: value
  defp string(nil), do: ""
  defp string(value), do: json(value)

  # At most `max_bytes` bytes (cut on a character boundary) and `lines` lines, and
  # whether anything was cut. A long output keeps its first two lines and its last
  # ones: commands, tests and compilers end with their verdict (`1 failed`, `error
  # TS2307`, the exception). Sizes in bytes: counting characters (graphemes) of every
  # result cost more than all the rest of an Inspect load.
  defp cap(text, max_bytes, lines) do
    all = String.split(text, "\n")

    # The "…" marks the cut: between head and tail, or at the end.
    {kept, tail_marker} =
      if length(all) > lines and lines > 3,
        do: {Enum.join(Enum.take(all, 2) ++ ["…"] ++ Enum.take(all, -(lines - 3)), "\n"), ""},
        else: {all |> Enum.take(lines) |> Enum.join("\n"), "…"}

    cond do
      byte_size(kept) > max_bytes -> {prefix(kept, max_bytes) <> "…", true}
      kept == text -> {text, false}
      true -> {kept <> tail_marker, true}
    end
  end

  # The longest prefix of at most `max_bytes` bytes that ends on a character boundary.
  defp prefix(text, max_bytes) when byte_size(text) <= max_bytes, do: text

  defp prefix(text, max_bytes) do
    cut = binary_part(text, 0, max_bytes)
    if String.valid?(cut), do: cut, else: prefix(text, max_bytes - 1)
  end

  defp one_line(text, max_bytes) do
    line = text |> String.split("\n", parts: 2) |> hd()
    {kept, cut} = cap(line, max_bytes, 1)
    if cut or line != text, do: String.trim_trailing(kept, "…") <> "…", else: kept
  end

  ## Explanations

  @doc """
  Explains a loop verdict (`LoopVerdict.session/1` or an ingest result's `verdict`)
  from the stored steps: what repeats, how often, with which outcome, and what changed
  between the repeats. nil when the verdict names no step (`rule: :none`) or none of
  its steps is stored.
  """
  @spec explain_verdict(map() | nil, [map()]) :: map() | nil
  def explain_verdict(nil, _stored), do: nil
  def explain_verdict(%{rule: :none}, _stored), do: nil

  def explain_verdict(%{rule: rule, evidence: numbers}, stored) when is_list(numbers) do
    by_number = Map.new(stored, &{&1.number, &1})
    found = for n <- numbers, step = by_number[n], do: {n, text_of(step)}
    missing = for n <- numbers, not Map.has_key?(by_number, n), do: n

    if found == [] do
      nil
    else
      rule
      |> explain_rule(found)
      |> Map.merge(%{rule: rule, steps: numbers, missing: missing})
    end
  end

  def explain_verdict(_verdict, _stored), do: nil

  @doc """
  Explains the entropy window: its most frequent `{intent, tool_call, status}` tuple,
  on which of the window's steps, and whether those steps also share their arguments
  and results (when they do not, the ratio's repetition is only in the names). nil
  without a window.
  """
  @spec explain_window([{String.t(), String.t(), atom()}], [map()]) :: map() | nil
  def explain_window([], _stored), do: nil

  def explain_window(window, stored) do
    # The window is the session's newest steps: number them like the stored steps.
    numbered = window_numbers(window, stored)
    by_number = Map.new(stored, &{&1.number, &1})
    counts = Enum.frequencies(window)
    last_seen = window |> Enum.with_index() |> Map.new()
    {tuple, count} = Enum.max_by(counts, fn {t, c} -> {c, last_seen[t]} end)
    {intent, tool, status} = tuple
    steps = for {n, t} <- numbered, t == tuple, do: n
    found = for n <- steps, step = by_number[n], do: text_of(step)

    %{
      pattern: %{intent: intent, tool_call: tool, action_status: to_string(status)},
      count: count,
      size: length(window),
      window_steps: Enum.map(numbered, &elem(&1, 0)),
      steps: steps,
      arguments: compare(Enum.map(found, & &1.arguments), steps),
      result: compare(Enum.map(found, & &1.result), steps)
    }
  end

  @doc """
  The entropy window's tuples with the step number of each (`{number, tuple}`, oldest
  first): the window holds the session's newest steps, so its last tuple is the newest
  stored step. Numbers count back from the newest stored step (from the window's own
  length when nothing is stored).
  """
  @spec window_numbers([tuple()], [map()]) :: [{pos_integer(), tuple()}]
  def window_numbers(window, stored) do
    newest =
      case List.last(stored) do
        %{number: n} -> n
        nil -> length(window)
      end

    first = newest - length(window) + 1
    window |> Enum.with_index(first) |> Enum.map(fn {t, n} -> {n, t} end)
  end

  # (a) the same call in a row.
  defp explain_rule(:repeat, found) do
    {_, first} = hd(found)
    numbers = Enum.map(found, &elem(&1, 0))
    texts = Enum.map(found, &elem(&1, 1))
    result = compare(Enum.map(texts, & &1.result), numbers)

    %{
      calls: [%{tool: first.tool, call: one_line(first.call, @call_bytes)}],
      times: length(found),
      status: first.status,
      outcome: outcome(result, texts),
      excerpt: excerpt(first.result),
      arguments: compare(Enum.map(texts, & &1.arguments), numbers),
      result: result
    }
  end

  # (b) a block of calls repeated: compared position by position.
  defp explain_rule(:cycle, found) do
    texts = Enum.map(found, &elem(&1, 1))
    period = period(texts)
    positions = found |> Enum.with_index() |> Enum.group_by(fn {_, i} -> rem(i, period) end)

    per_position =
      for p <- 0..(period - 1), group = Enum.map(positions[p] || [], &elem(&1, 0)) do
        numbers = Enum.map(group, &elem(&1, 0))
        ts = Enum.map(group, &elem(&1, 1))

        {numbers, compare(Enum.map(ts, & &1.result), numbers),
         compare(Enum.map(ts, & &1.arguments), numbers)}
      end

    results = Enum.map(per_position, &elem(&1, 1))

    %{
      calls:
        Enum.map(Enum.take(found, period), fn {_, t} ->
          %{tool: t.tool, call: one_line(t.call, @call_bytes), status: t.status}
        end),
      times: div(length(found), period),
      period: period,
      status: texts |> List.last() |> Map.fetch!(:status),
      outcome:
        if(Enum.all?(results, &(&1.kind == :same)),
          do: "the same results each round",
          else: "results that changed only as shown"
        ),
      excerpt:
        texts |> Enum.find(List.last(texts), &failed?/1) |> Map.fetch!(:result) |> excerpt(),
      arguments: merge_changes(Enum.map(per_position, &elem(&1, 2))),
      result: merge_changes(results)
    }
  end

  # (c) different calls, the same failure.
  defp explain_rule(:same_failure, found) do
    numbers = Enum.map(found, &elem(&1, 0))
    texts = Enum.map(found, &elem(&1, 1))
    result = compare(Enum.map(texts, & &1.result), numbers)

    %{
      calls:
        texts
        |> Enum.map(&%{tool: &1.tool, call: one_line(&1.call, @call_bytes)})
        |> Enum.uniq(),
      times: length(found),
      status: hd(texts).status,
      outcome: outcome(result, texts),
      excerpt: excerpt(hd(texts).result),
      arguments: compare(Enum.map(texts, & &1.arguments), numbers),
      result: result
    }
  end

  # (d) the entropy window with repeated (call, outcome) pairs, and anything newer.
  defp explain_rule(_rule, found) do
    numbers = Enum.map(found, &elem(&1, 0))
    texts = Enum.map(found, &elem(&1, 1))
    result = compare(Enum.map(texts, & &1.result), numbers)

    %{
      calls:
        texts
        |> Enum.map(&%{tool: &1.tool, call: one_line(&1.call, @call_bytes)})
        |> Enum.uniq()
        |> Enum.take(@max_changes),
      times: length(found),
      status: List.last(texts).status,
      outcome: outcome(result, texts),
      excerpt: excerpt(List.last(texts).result),
      arguments: compare(Enum.map(texts, & &1.arguments), numbers),
      result: result
    }
  end

  defp failed?(%{status: status}), do: status in ["failure", "error", "timeout"]

  defp outcome(%{kind: kind}, texts) do
    what = if Enum.all?(texts, &failed?/1), do: "failure", else: "result"

    case kind do
      :same -> "the same #{what}"
      :whitespace -> "the same #{what}, apart from whitespace"
      :numbers -> "the same #{what}, apart from numbers"
      :reordered -> "the same #{what} lines, in another order or number"
      :lines -> "#{what}s that differ"
    end
  end

  defp excerpt(""), do: ""
  defp excerpt(text), do: text |> cap(@result_bytes, @result_lines) |> elem(0)

  # The smallest block of calls that repeats (tool and arguments, digits masked).
  defp period(texts) do
    keys = Enum.map(texts, &{&1.tool, mask(collapse(&1.arguments))})
    n = length(keys)

    Enum.find(1..max(n - 1, 1), n, fn p ->
      keys |> Enum.drop(p) |> Enum.zip(keys) |> Enum.all?(fn {a, b} -> a == b end)
    end)
  end

  defp merge_changes(changes) do
    case Enum.reject(changes, &(&1.kind == :same)) do
      [] ->
        %{kind: :same}

      [one] ->
        one

      many ->
        %{
          kind: :lines,
          changes: many |> Enum.flat_map(&Map.get(&1, :changes, [])) |> Enum.take(@max_changes)
        }
    end
  end

  ## What changed between repeats

  @doc """
  What differs among the texts of repeated steps (`numbers` are their step numbers):

    * `%{kind: :same}` — identical;
    * `%{kind: :whitespace}` — identical once whitespace is collapsed;
    * `%{kind: :numbers, changes: [%{line, values}]}` — identical once digits are
      masked: each changing number, on its line (digits shown as `#`), with its value
      at each repeat;
    * `%{kind: :reordered}` — the same lines, in another order or number;
    * `%{kind: :lines, changes: [%{step, added, removed}]}` — lines a repeat has that
      the first had not (`added`) and the other way round.

  At most #{@max_changes} changes, each line at most #{@max_line_bytes} bytes.
  """
  @spec compare([String.t()], [pos_integer()]) :: change()
  def compare(texts, numbers) do
    texts = Enum.map(texts, &clip/1)

    cond do
      length(Enum.uniq(texts)) <= 1 ->
        %{kind: :same}

      length(Enum.uniq(Enum.map(texts, &collapse/1))) == 1 ->
        %{kind: :whitespace}

      length(Enum.uniq(Enum.map(texts, &mask/1))) == 1 ->
        %{kind: :numbers, changes: numbers(texts)}

      length(Enum.uniq(Enum.map(texts, &line_set/1))) == 1 ->
        %{kind: :reordered}

      true ->
        %{kind: :lines, changes: lines(texts, numbers)}
    end
  end

  defp clip(text) when byte_size(text) > @compare_bytes do
    text
    |> binary_part(0, @compare_bytes)
    |> String.chunk(:valid)
    |> Enum.filter(&String.valid?/1)
    |> Enum.join()
  end

  defp clip(text), do: text

  defp collapse(text), do: text |> String.split() |> Enum.join(" ")
  defp mask(text), do: String.replace(text, @number, "#")

  defp line_set(text),
    do: text |> String.split("\n") |> Enum.map(&collapse(mask(&1))) |> MapSet.new()

  # Texts equal once digits are masked: the numbers that change, each shown on its
  # line (from the first repeat, the number as `#`) with its value at every repeat.
  defp numbers(texts) do
    per_text = Enum.map(texts, &Regex.scan(@number, &1, return: :index))
    first = hd(texts)

    per_text
    |> Enum.zip_with(& &1)
    |> Enum.filter(fn spans ->
      spans |> Enum.zip(texts) |> Enum.map(&slice/1) |> Enum.uniq() |> length() > 1
    end)
    |> Enum.take(@max_changes)
    |> Enum.map(fn [[{start, len}] | _] = spans ->
      %{
        line: first |> marked_line(start, len) |> prefix(@max_line_bytes),
        values: spans |> Enum.zip(texts) |> Enum.map(&slice/1)
      }
    end)
  end

  defp slice({[{start, len}], text}), do: binary_part(text, start, len)

  # The line holding bytes start..start+len, those bytes replaced by "#".
  defp marked_line(text, start, len) do
    line_start =
      case :binary.matches(binary_part(text, 0, start), "\n") do
        [] -> 0
        matches -> (matches |> List.last() |> elem(0)) + 1
      end

    rest = binary_part(text, start + len, byte_size(text) - start - len)
    [tail | _] = String.split(rest, "\n", parts: 2)
    binary_part(text, line_start, start - line_start) <> "#" <> tail
  end

  # Lines each repeat added or dropped, against the first repeat.
  defp lines([first | rest], [_ | numbers]) do
    base = MapSet.new(String.split(first, "\n"))

    rest
    |> Enum.zip(numbers)
    |> Enum.map(fn {text, n} ->
      own = MapSet.new(String.split(text, "\n"))

      %{
        step: n,
        added: own |> MapSet.difference(base) |> short_lines(),
        removed: base |> MapSet.difference(own) |> short_lines()
      }
    end)
    |> Enum.reject(&(&1.added == [] and &1.removed == []))
    |> Enum.uniq_by(&{&1.added, &1.removed})
    |> Enum.take(@max_changes)
  end

  defp short_lines(set) do
    set
    |> Enum.reject(&(String.trim(&1) == ""))
    |> Enum.take(3)
    |> Enum.map(&prefix(&1, @max_line_bytes))
  end
end
