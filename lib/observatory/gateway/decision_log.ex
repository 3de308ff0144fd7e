defmodule Observatory.Gateway.DecisionLog do
  @moduledoc """
  Parses and validates DecisionLog envelopes (design.md §3).

  Validation runs in Rust on the JSON text: every violation is reported at once with
  its field path and reason, sizes are capped, no atom is created from client input,
  and unknown fields are kept. The same pass hashes the step for the step detector:
  `approach` is SHA-256 of `action.tool_call` + canonical `action.tool_input`,
  `outcome` of `action.status` + canonical `action.result` (nil without a result);
  and for the loop verdict, from the same canonical text with per-call ids normalized
  away (`Observatory.Gateway.LoopVerdict`): `verdict_keys`, the call's and the
  outcome's 64-bit hashes and sketches packed in one binary (`t:LoopVerdict.keys/0`,
  opaque: read by the verdict's NIF); and for idempotent ingest (`Observatory.Gateway.Idempotency`): `fingerprint`, 16
  bytes that are the same for two deliveries of one step — the envelope's canonical
  JSON without `meta.timestamp` and `cognition.entropy_score`, SHA-256.

      iex> {:error, violations} = Observatory.Gateway.DecisionLog.parse(~s({"meta": {}}))
      iex> hd(violations)
      %{path: "meta.step_id", reason: "is required"}
  """

  alias Observatory.Gateway.{ActionStatus, LoopVerdict}
  alias Observatory.Native

  @dirty_bytes Observatory.Native.Cost.dirty_bytes()

  @typedoc "A rule broken by a message: the field's dotted path and why."
  @type violation :: %{path: String.t(), reason: String.t()}

  @typedoc "The fields the gateway acts on."
  @type fields :: %{
          step_id: String.t(),
          session_id: String.t(),
          agent_id: String.t(),
          intent: String.t(),
          tool_call: String.t(),
          status: ActionStatus.t(),
          approach: binary(),
          outcome: binary() | nil,
          verdict_keys: LoopVerdict.keys(),
          fingerprint: binary()
        }

  @doc """
  Parses one JSON envelope: the decoded envelope (string keys) and its key fields.

  With `envelope: false` the envelope's term is not built (`{:ok, nil, fields}`): a
  caller that keeps the JSON text and decodes it when something reads it
  (`Observatory.JSON.decode/1` gives the same term) saves about a third of the call.
  """
  @spec parse(binary(), keyword()) :: {:ok, map() | nil, fields()} | {:error, [violation()]}
  def parse(json, opts \\ []) when is_binary(json) do
    json
    |> parse_nif(Keyword.get(opts, :envelope, true))
    |> case do
      {:ok, envelope, {step_id, session_id, agent_id, intent, tool_call, code},
       {approach, outcome, fingerprint}, verdict_keys} ->
        {:ok, envelope,
         %{
           step_id: step_id,
           session_id: session_id,
           agent_id: agent_id,
           intent: intent,
           tool_call: tool_call,
           status: ActionStatus.from_code(code),
           approach: approach,
           outcome: outcome,
           verdict_keys: verdict_keys,
           fingerprint: fingerprint
         }}

      {:error, list} ->
        {:error, Enum.map(list, fn {path, reason} -> %{path: path, reason: reason} end)}
    end
  end

  @doc """
  Validates an envelope given as a map (encoded, then parsed like any message); anything
  else is refused with a violation at `"$"`.
  """
  @spec from_map(term()) :: {:ok, map(), fields()} | {:error, [violation()]}
  def from_map(envelope) do
    with {:ok, json} <- to_json(envelope), do: parse(json)
  end

  @doc """
  The envelope with the gateway's entropy score as its `cognition.entropy_score`
  (a validated envelope's `cognition` is an object); nil keeps the agent's.
  """
  @spec with_score(map(), number() | nil) :: map()
  def with_score(envelope, nil), do: envelope

  def with_score(%{"cognition" => cognition} = envelope, score),
    do: %{envelope | "cognition" => Map.put(cognition, "entropy_score", score)}

  @doc """
  A validated envelope's JSON text decoded, with `score` as its
  `cognition.entropy_score` (`with_score/2`): what a step kept as text reads back as.
  """
  @spec decode(binary(), number() | nil) :: map()
  def decode(json, score) do
    {:ok, envelope} = Observatory.JSON.decode(json)
    with_score(envelope, score)
  end

  @doc """
  An envelope given as a map, as JSON text; anything else, or a map that cannot be
  encoded, is refused with a violation at `"$"`.
  """
  @spec to_json(term()) :: {:ok, binary()} | {:error, [violation()]}
  def to_json(envelope) when is_map(envelope) do
    case Observatory.JSON.encode(envelope) do
      {:ok, json} -> {:ok, json}
      {:error, reason} -> {:error, [%{path: "$", reason: "cannot be encoded as JSON: #{reason}"}]}
    end
  end

  def to_json(other) do
    {:error,
     [
       %{
         path: "$",
         reason:
           "must be an envelope: a map or its JSON text, got: #{inspect(other, limit: 5, printable_limit: 64)}"
       }
     ]}
  end

  # The verdict's normalization rules (nil before LoopVerdict starts: the defaults).
  defp parse_nif(json, envelope?) when byte_size(json) > @dirty_bytes,
    do: Native.decision_log_parse_dirty(json, LoopVerdict.rules(), envelope?)

  defp parse_nif(json, envelope?),
    do: Native.decision_log_parse(json, LoopVerdict.rules(), envelope?)
end
