defmodule Observatory.Gateway.DecisionLogTest do
  use ExUnit.Case, async: true

  alias Observatory.Gateway.{ActionStatus, DecisionLog}
  alias Observatory.Test.HTTP

  doctest DecisionLog
  doctest ActionStatus

  test "a valid envelope gives the decoded envelope and its key fields" do
    envelope =
      HTTP.envelope(%{"extra" => %{"kept" => [1, 2]}, "action" => %{"tool_input" => %{"b" => 1}}})

    assert {:ok, decoded, fields} = DecisionLog.from_map(envelope)
    assert decoded == envelope, "unknown fields are kept"

    assert %{session_id: "sess-http", agent_id: "agent-http", intent: "search"} = fields
    assert fields.status == :failure
  end

  test "every violation is listed with its path and reason" do
    assert {:error, violations} =
             DecisionLog.from_map(%{
               "meta" => %{"session_id" => 42},
               "cognition" => %{"intent" => ""},
               "action" => %{"tool_call" => "t", "status" => "exploded"}
             })

    paths = Enum.map(violations, & &1.path)

    assert paths == [
             "meta.step_id",
             "meta.session_id",
             "meta.agent_id",
             "meta.timestamp",
             "cognition.intent",
             "action.status"
           ]

    assert Enum.all?(violations, &(is_binary(&1.reason) and &1.reason != ""))
  end

  test "the status set is the same list in Rust and Elixir, in the same order" do
    assert Observatory.Native.action_statuses() == Enum.map(ActionStatus.all(), &Atom.to_string/1)
  end

  test "client strings never become atoms" do
    tag = "#{System.unique_integer([:positive])}"
    names = for i <- 1..50, do: "novel_#{tag}_#{i}"

    for name <- names do
      envelope = HTTP.envelope(%{name => %{name => name}, "action" => %{"status" => name}})
      DecisionLog.parse(Observatory.JSON.encode!(envelope))
      DecisionLog.parse(~s({"#{name}": 1}))
    end

    for name <- names do
      assert_raise ArgumentError, fn -> String.to_existing_atom(name) end
    end
  end

  test "malformed JSON, invalid UTF-8 and deep nesting are violations of $" do
    for body <- ["{", <<"{\"a\": \"", 0xFF, "\"}">>, String.duplicate("[", 10_000)] do
      assert {:error, [%{path: "$", reason: "invalid JSON" <> _}]} = DecisionLog.parse(body)
    end
  end

  test "a large envelope (dirty scheduler path) is validated like a small one" do
    blob = String.duplicate("x", 200_000)
    envelope = HTTP.envelope(%{"action" => %{"result" => %{"output" => blob}}})
    assert {:ok, decoded, _} = DecisionLog.from_map(envelope)
    assert decoded["action"]["result"]["output"] == blob
  end

  test "maps JSON cannot express are reported, not raised" do
    assert {:error, [%{path: "$", reason: "cannot be encoded as JSON" <> _}]} =
             DecisionLog.from_map(%{"meta" => {:tuple}})
  end

  describe "the envelope term is Observatory.JSON.decode/1's term of the same text" do
    # The parse reads a borrowed tree, the JSON decoder a serde_json Value: the same text
    # must give the same term, with and without the envelope term asked for.
    test "escapes, unicode, numbers of every kind, duplicate keys, large objects" do
      base = Observatory.JSON.encode!(HTTP.envelope(%{}))
      "{" <> rest = base

      extras = [
        ~s("s":"a\\"b\\\\c\\n\\u00e9\\ud83d\\ude00\\/ é 日本"),
        ~s("n":[0,-0,1.0,-0.0,1e20,2.5e-8,18446744073709551615,18446744073709551616,-9223372036854775808,0.1]),
        ~s("d":{"k":1,"k":2,"\\u006b":3}),
        ~s("big":{#{Enum.map_join(1..40, ",", &~s("k#{&1}":#{&1}))}}),
        ~s("e":{},"l":[[],[{}]],"t":true,"f":false,"z":null)
      ]

      for extra <- extras do
        text = "{" <> extra <> "," <> rest
        assert {:ok, expected} = Observatory.JSON.decode(text)
        assert {:ok, envelope, fields} = DecisionLog.parse(text)
        assert envelope == expected, text
        assert {:ok, nil, ^fields} = DecisionLog.parse(text, envelope: false)
      end
    end
  end
end
