defmodule Observatory.Replay.Record do
  @moduledoc """
  The two line formats `Observatory.Replay` accepts, and how a flat step record
  becomes a DecisionLog envelope.

  A line whose JSON object has a `meta` object is a full envelope (design.md §3) and
  goes to the gateway as it is. Any other object is a flat step record:

  | flat field | envelope field | if absent |
  |---|---|---|
  | `session_id` | `meta.session_id` | rejected: required |
  | `agent_id` | `meta.agent_id` | `"unknown-agent"` (also when `null`) |
  | `step_id` | `meta.step_id` | `"<session_id>-<n>"`, n = the step's number in its session |
  | `timestamp` | `meta.timestamp` | the time the replay started |
  | `intent` | `cognition.intent` | rejected: required |
  | `tool_call` | `action.tool_call` | rejected: required |
  | `action_status` (or `status`) | `action.status` | rejected: required |
  | `tool_input` | `action.tool_input` | left out |
  | `result` | `action.result` | left out (the step detector skips the step) |
  | `prompt_text`, `response_text` | `cognition.prompt_text`, `cognition.response_text` | left out |

  Other fields of a flat record are dropped. Each field's JSON is copied from the line
  as it is (in Rust, `observatory_core::replay`: nothing is decoded and re-encoded), so
  whatever the record holds, the gateway validates it like any envelope; a violation
  is reported under the flat field's name (`intent is required`, not
  `cognition.intent is required`).

      iex> alias Observatory.Replay.Record
      iex> line = ~s({"session_id": "s1", "intent": "search", "tool_call": "grep", "status": "failure"})
      iex> {:flat, "s1", head, tail} = Record.read(line, "2026-02-22T10:30:00Z")
      iex> Observatory.JSON.decode(Record.envelope_json(head, tail, 3))
      {:ok,
       %{
         "meta" => %{"step_id" => "s1-3", "session_id" => "s1", "agent_id" => "unknown-agent",
                     "timestamp" => "2026-02-22T10:30:00Z"},
         "cognition" => %{"intent" => "search"},
         "action" => %{"tool_call" => "grep", "status" => "failure"}
       }}
      iex> Record.read(~s({"meta": {"session_id": "s2"}}), "2026-02-22T10:30:00Z")
      {:envelope, "s2"}
      iex> Record.read("[1]", "2026-02-22T10:30:00Z")
      {:error, "not a JSON object"}
  """

  alias Observatory.Native

  @default_agent "unknown-agent"
  @dirty_bytes Observatory.Native.Cost.dirty_bytes()

  @flat_paths %{
    "meta.session_id" => "session_id",
    "meta.agent_id" => "agent_id",
    "meta.step_id" => "step_id",
    "meta.timestamp" => "timestamp",
    "cognition.intent" => "intent",
    "cognition.prompt_text" => "prompt_text",
    "cognition.response_text" => "response_text",
    "action.tool_call" => "tool_call",
    "action.status" => "action_status",
    "action.tool_input" => "tool_input",
    "action.result" => "result"
  }

  @typedoc """
  What a line is: an envelope (with its `meta.session_id` if that is a string); a
  flat record as envelope text, whole (`tail` nil: the record had a `step_id`) or in
  two parts around the step number (see `envelope_json/3`); or why it is neither.
  """
  @type line ::
          {:envelope, String.t() | nil}
          | {:flat, String.t() | nil, binary(), binary() | nil}
          | {:error, String.t()}

  @doc "The agent_id a flat record without one is replayed as."
  def default_agent_id, do: @default_agent

  @doc """
  Reads one line. `timestamp` is the `meta.timestamp` of a flat record that has none.
  """
  @spec read(binary(), String.t()) :: line()
  def read(line, timestamp) when is_binary(line) and byte_size(line) > @dirty_bytes,
    do: Native.replay_read_line_dirty(line, @default_agent, timestamp)

  def read(line, timestamp) when is_binary(line),
    do: Native.replay_read_line(line, @default_agent, timestamp)

  @doc """
  The envelope JSON of a flat record that is step `n` of its session: its step_id is
  `"<session_id>-<n>"` unless the record has its own.
  """
  @spec envelope_json(binary(), binary() | nil, pos_integer()) :: binary()
  def envelope_json(head, nil, _n), do: head
  def envelope_json(head, tail, n), do: head <> Integer.to_string(n) <> tail

  @doc "The flat record's name for an envelope path in a violation."
  @spec flat_path(String.t()) :: String.t()
  def flat_path(path), do: Map.get(@flat_paths, path, path)
end
