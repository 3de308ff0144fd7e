defmodule Observatory.Proxy.ConversationTest do
  use ExUnit.Case, async: true

  alias Observatory.Proxy.Conversation

  doctest Conversation

  describe "review finding: the calls read from one turn are capped" do
    test "a turn of 1,000 tool calls gives its first 128" do
      calls = for i <- 1..1000, do: %{"id" => "c#{i}", "function" => %{"name" => "a"}}
      body = %{"messages" => [%{"role" => "assistant", "tool_calls" => calls}]}
      turn = Conversation.last_turn(:openai, body)
      assert length(turn.calls) == 128
      assert hd(turn.calls).id == "c1"
    end
  end

  describe "issue 15: the previous assistant turn's tool calls and their results" do
    test "OpenAI: parallel calls, unparsable arguments, a call still unanswered" do
      body = %{
        "messages" => [
          %{"role" => "user", "content" => [%{"type" => "text", "text" => "go"}]},
          %{
            "role" => "assistant",
            "content" => "Looking at both.",
            "tool_calls" => [
              %{"id" => "a", "function" => %{"name" => "ls", "arguments" => "{\"dir\": \"/\"}"}},
              %{"id" => "b", "function" => %{"name" => "run", "arguments" => "not json"}},
              %{"id" => "c", "function" => %{"name" => "cat", "arguments" => "{}"}}
            ]
          },
          %{"role" => "tool", "tool_call_id" => "a", "content" => "etc usr"},
          %{
            "role" => "tool",
            "tool_call_id" => "b",
            "content" => [%{"type" => "text", "text" => "exit 1"}]
          }
        ]
      }

      assert %{position: 1, text: "Looking at both.", calls: [a, b, c]} =
               Conversation.last_turn(:openai, body)

      assert a == %{
               id: "a",
               name: "ls",
               input: %{"dir" => "/"},
               result: "etc usr",
               status: "success"
             }

      assert %{input: "not json", result: "exit 1", status: "success"} = b
      assert %{result: nil, status: "pending"} = c
    end

    test "Anthropic: tool_use blocks, tool_result blocks, is_error is a failure" do
      body = %{
        "system" => "You fix builds.",
        "messages" => [
          %{"role" => "user", "content" => "fix it"},
          %{
            "role" => "assistant",
            "content" => [
              %{
                "type" => "tool_use",
                "id" => "t1",
                "name" => "make",
                "input" => %{"target" => "all"}
              },
              %{"type" => "tool_use", "id" => "t2", "name" => "ls", "input" => %{}}
            ]
          },
          %{
            "role" => "user",
            "content" => [
              %{
                "type" => "tool_result",
                "tool_use_id" => "t1",
                "content" => "error 2",
                "is_error" => true
              },
              %{
                "type" => "tool_result",
                "tool_use_id" => "t2",
                "content" => [%{"type" => "text", "text" => "Makefile"}]
              }
            ]
          }
        ]
      }

      assert %{position: 1, text: nil, calls: [make, ls]} =
               Conversation.last_turn(:anthropic, body)

      assert make == %{
               id: "t1",
               name: "make",
               input: %{"target" => "all"},
               result: "error 2",
               status: "failure"
             }

      assert %{result: "Makefile", status: "success"} = ls
    end

    test "no steps: no assistant turn, a text-only answer, or not a conversation" do
      assert Conversation.last_turn(:openai, %{
               "messages" => [%{"role" => "user", "content" => "hi"}]
             }) == nil

      answered = %{
        "messages" => [
          %{"role" => "user", "content" => "hi"},
          %{"role" => "assistant", "content" => "hello"}
        ]
      }

      assert Conversation.last_turn(:openai, answered) == nil
      assert Conversation.last_turn(:anthropic, answered) == nil

      for body <- [%{}, %{"messages" => "x"}, %{"messages" => [1, nil, "s"]}] do
        assert Conversation.last_turn(:openai, body) == nil
        assert Conversation.last_turn(:anthropic, body) == nil
      end
    end
  end
end
