defmodule Observatory.Proxy.GuidanceTest do
  use ExUnit.Case, async: true

  alias Observatory.Gateway.DecisionLog
  alias Observatory.Proxy.Guidance
  alias Observatory.Test.HTTP

  # The note is recorded with the agent's events: the call it names must not hold on
  # to the step's whole JSON text, which a long intent of the parsed envelope does (a
  # sub-binary of it).
  test "the call a note names is its own copy, not a part of the step's text" do
    intent = "read_file " <> String.duplicate("x", 200)
    text = Observatory.JSON.encode!(HTTP.envelope(%{"cognition" => %{"intent" => intent}}))
    {:ok, envelope, _fields} = DecisionLog.parse(text)
    assert :binary.referenced_byte_size(envelope["cognition"]["intent"]) == byte_size(text)

    result = %{envelope: envelope, step: %{action: :warn, guidance: "You repeat a call."}}
    assert %{repeats: ^intent} = note = Guidance.note([result], nil)
    assert :binary.referenced_byte_size(note.repeats) == byte_size(intent)
  end
end
