defmodule Observatory.Proxy.SessionIdTest do
  use ExUnit.Case, async: true

  alias Observatory.Proxy.SessionId

  defp chat(system, messages),
    do: %{"messages" => [%{"role" => "system", "content" => system} | messages]}

  defp user(text), do: %{"role" => "user", "content" => text}

  describe "issue 19 item 3: what names a derived session" do
    test "the start stays the same on every turn of one conversation" do
      first = chat("s", [user("task")])
      later = update_in(first["messages"], &(&1 ++ [%{"role" => "assistant", "content" => "ok"}]))
      assert SessionId.start(first) == SessionId.start(later)
      assert SessionId.derive("a", first) == SessionId.derive("a", later)
    end

    test "timestamps, UUIDs and numbers in the system prompt do not matter; the task does" do
      a =
        chat("Now 2025-01-01T10:00:00Z, request 4f7d6c1e-8a2b-4c3d-9e0f-123456789abc, run 7.", [
          user("task")
        ])

      b =
        chat(
          "Now 2026-12-31T23:59:59.123Z, request 0a1b2c3d-4e5f-4a6b-8c7d-0e1f2a3b4c5d, run 8.",
          [user("task")]
        )

      assert SessionId.derive("a", a) == SessionId.derive("a", b)

      refute SessionId.derive("a", a) ==
               SessionId.derive("a", chat("Another role.", [user("task")]))

      # The first user message is taken as sent: task 12 and task 13 are two runs.
      refute SessionId.derive("a", chat("s", [user("task 12")])) ==
               SessionId.derive("a", chat("s", [user("task 13")]))
    end

    test "Anthropic's system blocks, developer messages and the Responses API's instructions are the system prompt" do
      blocks = fn ts ->
        %{
          "system" => [
            %{
              "type" => "text",
              "text" => "Time: #{ts}",
              "cache_control" => %{"type" => "ephemeral"}
            }
          ],
          "messages" => [user("task")]
        }
      end

      assert SessionId.derive("a", blocks.("2025-01-01T00:00:00Z")) ==
               SessionId.derive("a", blocks.("2025-06-01T12:00:00Z"))

      developer = fn n ->
        %{"messages" => [%{"role" => "developer", "content" => "attempt #{n}"}, user("task")]}
      end

      assert SessionId.derive("a", developer.(1)) == SessionId.derive("a", developer.(2))

      responses = fn n -> %{"instructions" => "Request #{n}.", "input" => "task"} end
      assert SessionId.derive("a", responses.(1)) == SessionId.derive("a", responses.(2))

      items = %{
        "instructions" => "Request 3.",
        "input" => [
          user("task"),
          %{"type" => "function_call", "call_id" => "c", "name" => "x", "arguments" => "{}"}
        ]
      }

      assert SessionId.derive("a", items) == SessionId.derive("a", responses.(9))
    end

    test "two agents never share an id; odd bodies still get one" do
      body = chat("s", [user("task")])
      refute SessionId.derive("a", body) == SessionId.derive("b", body)

      for odd <- [
            %{},
            %{"messages" => "x"},
            %{"messages" => [1, nil, %{"role" => 5}]},
            %{"input" => 7}
          ] do
        assert "proxy-" <> hex = SessionId.derive("a", odd)
        assert hex =~ ~r/^[0-9a-f]{32}$/
      end
    end

    test "keyed: another key gives another id" do
      body = chat("s", [user("task")])
      refute SessionId.derive("a", body, "one key") == SessionId.derive("a", body, "another key")
      assert SessionId.derive("a", body, "one key") == SessionId.derive("a", body, "one key")
    end
  end
end
