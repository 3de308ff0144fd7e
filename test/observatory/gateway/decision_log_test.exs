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
        assert envelope === expected, text
        assert {:ok, nil, ^fields} = DecisionLog.parse(text, envelope: false)
      end
    end
  end

  describe "the envelope term over generated envelopes" do
    # The parse builds the term by the NIF API's own calls; the JSON decoder by
    # rustler's. Over generated envelopes (strings of every length around the 64 bytes
    # a heap binary holds, escaped or not, unicode, long keys, nested arrays and
    # objects, whitespace between tokens) the term must be Observatory.JSON.decode/1's,
    # and no string of it a part of the body (a sub-binary would keep all of the body
    # alive with it).
    @pieces ["", "é", "日本", "😀", "/", "\"", "\\", "\n", "\t", "\u0001"]

    defp string_of(len) do
      piece = Enum.random(@pieces)
      String.duplicate(Enum.random(["x", "a b", "0"]), max(len - byte_size(piece), 0)) <> piece
    end

    defp any_string,
      do: string_of(Enum.random([0, 1, 40, 63, 64, 65, 66, 100, 200, 1000, 5000]))

    defp any_value(0), do: any_string()

    defp any_value(depth) do
      case :rand.uniform(7) do
        1 -> for _ <- 1..:rand.uniform(4), do: any_value(depth - 1)
        2 -> Map.new(1..:rand.uniform(4), fn _ -> {any_string(), any_value(depth - 1)} end)
        3 -> Enum.random([nil, true, false, -7, 2.5, 18_446_744_073_709_551_615])
        _ -> any_string()
      end
    end

    defp generated(n) do
      HTTP.envelope(%{
        "meta" => %{"step_id" => "s#{n}"},
        "cognition" => %{"intent" => "i" <> string_of(Enum.random([64, 65, 300])) <> "!"},
        "action" => %{"tool_input" => any_value(3), "result" => any_value(3)},
        "extra" => any_value(3)
      })
    end

    defp strings(map) when is_map(map),
      do: Enum.flat_map(map, fn {k, v} -> [k | strings(v)] end)

    defp strings(list) when is_list(list), do: Enum.flat_map(list, &strings/1)
    defp strings(s) when is_binary(s), do: [s]
    defp strings(_other), do: []

    test "the term is the decoder's, its strings their own binaries" do
      :rand.seed(:exsss, {42, 1, 1})

      for n <- 1..300 do
        text = Observatory.JSON.encode!(generated(n))
        text = if rem(n, 4) == 0, do: String.replace(text, ~s(":), ~s(" : )), else: text
        assert {:ok, expected} = Observatory.JSON.decode(text)
        assert {:ok, envelope, _fields} = DecisionLog.parse(text)
        assert envelope === expected, text

        for s <- strings(envelope) do
          assert :binary.referenced_byte_size(s) == byte_size(s), inspect(s, printable_limit: 80)
        end
      end
    end
  end

  describe "the body fingerprint and hashes: what the text says, not how it is written" do
    # A canonically written body has its fingerprint hashed from the body's own pieces,
    # one written otherwise from the text written out again: both must give the same
    # answer, bit for bit, as they must for idempotent ingest. Every committed scripted
    # real-run step, as an envelope, three ways.
    @steps Path.expand("../../../bench/real_runs/scripted/steps.jsonl", __DIR__)

    defp envelope_of(step, i) do
      %{
        "meta" => %{
          "step_id" => "s#{i}",
          "session_id" => step["session_id"],
          "agent_id" => step["agent_id"],
          "parent_step_id" => if(rem(i, 3) == 0, do: nil, else: "s#{i - 1}"),
          "timestamp" => "2026-02-22T10:30:00.#{rem(i, 1000)}Z"
        },
        "cognition" => %{
          "intent" => step["intent"],
          "confidence" => Enum.at([0.8, 0.25, rem(i, 97) / 97, 1, 0.0], rem(i, 5)),
          "entropy_score" => rem(i, 13) / 13,
          "reasoning_chain" => ["step #{i}"]
        },
        "action" =>
          Map.merge(
            %{
              "tool_call" => step["tool_call"],
              "status" => step["action_status"],
              "tool_input" => step["tool_input"]
            },
            Map.take(step, ["result"])
          )
      }
    end

    # Canonically; with spaces between the sections; the sections out of order and
    # each one's members in reverse order.
    defp written_three_ways(envelope) do
      json = &Observatory.JSON.encode!/1
      section = &json.(envelope[&1])

      reversed = fn name ->
        members = envelope[name] |> Map.keys() |> Enum.sort(:desc)

        "{" <>
          Enum.map_join(members, ",", &(json.(&1) <> ":" <> json.(envelope[name][&1]))) <> "}"
      end

      [
        json.(envelope),
        ~s({ "action": #{section.("action")}, "cognition": #{section.("cognition")}, "meta": #{section.("meta")} }),
        ~s({"meta":#{reversed.("meta")},"action":#{reversed.("action")},"cognition":#{reversed.("cognition")}})
      ]
    end

    test "a real step's answer is the same whether its body is canonical, spaced or reordered" do
      steps =
        @steps
        |> File.stream!()
        |> Enum.map(fn line -> elem(Observatory.JSON.decode(line), 1) end)

      assert length(steps) > 2_000

      for {step, i} <- Enum.with_index(steps) do
        [canonical | others] = written_three_ways(envelope_of(step, i))
        assert {:ok, nil, fields} = DecisionLog.parse(canonical, envelope: false)

        for other <- others do
          assert {:ok, nil, ^fields} = DecisionLog.parse(other, envelope: false), other
        end
      end
    end

    test "the fingerprint leaves out the timestamp and the entropy score, and nothing else" do
      envelope =
        envelope_of(
          %{
            "intent" => "i",
            "tool_call" => "t",
            "action_status" => "success",
            "tool_input" => %{"a" => 1},
            "result" => "r",
            "session_id" => "s",
            "agent_id" => "a"
          },
          1
        )

      fingerprint = fn envelope ->
        for text <- written_three_ways(envelope), uniq: true do
          {:ok, nil, fields} = DecisionLog.parse(text, envelope: false)
          fields.fingerprint
        end
      end

      [same] = fingerprint.(envelope)

      for {section, key, value} <- [
            {"meta", "timestamp", "2026-02-23T00:00:00Z"},
            {"cognition", "entropy_score", 0.5}
          ] do
        assert fingerprint.(put_in(envelope, [section, key], value)) == [same]
      end

      for {section, key, value} <- [
            {"meta", "parent_step_id", "other"},
            {"cognition", "confidence", 0.75},
            {"cognition", "reasoning_chain", ["another"]},
            {"action", "tool_input", %{"a" => 2}},
            {"action", "result", "R"},
            {"action", "status", "failure"}
          ] do
        assert [other] = fingerprint.(put_in(envelope, [section, key], value))
        assert other != same, "#{section}.#{key}"
      end
    end
  end
end
