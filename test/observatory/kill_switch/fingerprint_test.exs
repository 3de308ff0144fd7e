defmodule Observatory.KillSwitch.FingerprintTest do
  # Fingerprints through the NIF: SimHash, normalization and what is read from a body.
  use ExUnit.Case, async: true

  alias Observatory.{JSON, KillSwitch}
  alias Observatory.Test.{ToolConversation, Upstream}

  doctest Observatory.KillSwitch

  defp distance(a, b),
    do: KillSwitch.hamming(KillSwitch.fingerprint(a), KillSwitch.fingerprint(b))

  describe "SimHash Algorithm" do
    test "Similar texts produce similar hashes" do
      pairs = [
        {"Check the status of order #12345 placed on 2024-01-15T10:30:00Z.",
         "Check the status of order #98765 placed on 2025-03-02T08:05:59.123+02:00."},
        {"Attempt 3 of 5 failed with HTTP 503. Retry build 4821 (request 550e8400-e29b-41d4-a716-446655440000).",
         "Attempt 4 of 5 failed with HTTP 502. Retry build 4822 (request 6fa459ea-ee8a-3ca4-894e-db77e160355e)."},
        {log(1), log(987)}
      ]

      for {a, b} <- pairs do
        assert distance(a, b) < 3,
               "#{distance(a, b)} bits between #{inspect(a)} and #{inspect(b)}"
      end
    end

    test "Different texts produce different hashes" do
      texts = [
        "What's the weather in Paris today?",
        "Write a Python function that parses a CSV file and returns a list of dictionaries.",
        "Summarize this article about renewable energy in three bullet points.",
        "Check the status of order #12345 placed on 2024-01-15T10:30:00Z.",
        "Draft a polite email to the landlord about the leaking kitchen sink.",
        log(1)
      ]

      for a <- texts, b <- texts, a < b do
        assert distance(a, b) > 5,
               "only #{distance(a, b)} bits between #{inspect(a)} and #{inspect(b)}"
      end
    end

    test "fingerprints are 64-bit and stable; hamming counts differing bits" do
      assert KillSwitch.fingerprint("") == 0
      hash = KillSwitch.fingerprint("What's the weather in Paris today?")
      assert hash == 0x5B5B302CBD7910EA, "the core's golden value"
      assert KillSwitch.hamming(hash, hash) == 0
      assert KillSwitch.hamming(0, 0xFFFFFFFFFFFFFFFF) == 64
    end

    test "a text over 64 KiB is fingerprinted on a dirty scheduler, with the same result" do
      big = String.duplicate("The agent retried step 7. ", 4_000)
      assert byte_size(big) > 64 * 1024
      assert KillSwitch.fingerprint(big) == Observatory.Native.kill_switch_fingerprint(big)
      assert KillSwitch.normalize(big) == Observatory.Native.kill_switch_normalize(big)
    end
  end

  describe "Prompt Normalization" do
    test "Normalize numbers" do
      assert KillSwitch.normalize("order #12345") == "order #<NUM>"

      assert KillSwitch.normalize("balance 1,024.50 USD, attempt 3") ==
               "balance <NUM> USD, attempt <NUM>"
    end

    test "Normalize timestamps" do
      assert KillSwitch.normalize("placed on 2024-01-15T10:30:00Z") == "placed on <TS>"
      assert KillSwitch.normalize("at 2024-03-02T08:05:59.123+02:00.") == "at <TS>."
    end

    test "Normalize UUIDs" do
      assert KillSwitch.normalize("request 550e8400-e29b-41d4-a716-446655440000 failed") ==
               "request <ID> failed"

      assert KillSwitch.normalize("16FD2706-8BAF-433B-82EB-8C7FADA847DA") == "<ID>"
    end

    test "Normalize whitespace" do
      assert KillSwitch.normalize("  retry   the\r\ndeployment\t\tnow \n\n") ==
               "retry the deployment now"

      assert distance("retry   the\r\ndeployment", "retry the\ndeployment") == 0
    end

    test "Extract user message" do
      conversation = fn first, last ->
        JSON.encode!(%{
          model: "m",
          messages: [
            %{role: "system", content: "You are a deployment bot."},
            %{role: "user", content: first},
            %{role: "assistant", content: "Working on it."},
            %{role: "user", content: last},
            %{role: "assistant", content: "Still failing."}
          ]
        })
      end

      {:ok, a} =
        KillSwitch.fingerprint_request(conversation.("Deploy build 1", "Retry the deploy"))

      {:ok, b} =
        KillSwitch.fingerprint_request(conversation.("Something else", "Retry the deploy"))

      {:ok, c} = KillSwitch.fingerprint_request(conversation.("Deploy build 1", "Roll back now"))

      assert a.prompt_hash == KillSwitch.fingerprint("Retry the deploy")
      assert a.prompt_hash == b.prompt_hash, "earlier messages do not count"
      assert a.prompt_hash != c.prompt_hash, "the last user message does"
    end
  end

  describe "issue 19: Extract user message, in a tool loop — the newest user-side input" do
    # An SDK agent's conversation after `turns` tool turns, each a different search.
    defp tool_loop(api, turns) do
      ToolConversation.json(
        api,
        "Find where the handlers are registered.",
        for(
          k <- 1..turns//1,
          do:
            {"grep", %{"pattern" => "def handler_#{k}"}, "src/h#{k}.py:#{k}: def handler_#{k}():"}
        )
      )
    end

    test "a turn that answers tool calls reads their results, in both APIs" do
      for api <- [:chat_completions, :messages] do
        {:ok, fp} = KillSwitch.fingerprint_request(tool_loop(api, 3), api)
        assert fp.prompt_hash == KillSwitch.fingerprint("src/h3.py:3: def handler_3():"), "#{api}"

        {:ok, first} = KillSwitch.fingerprint_request(tool_loop(api, 0), api)

        assert first.prompt_hash ==
                 KillSwitch.fingerprint("Find where the handlers are registered.")

        assert first.tool_signatures == []
      end
    end

    test "tool-call signatures compare identical calls, not calls that differ in a number" do
      for api <- [:chat_completions, :messages] do
        signatures =
          for turns <- 1..3 do
            {:ok, fp} = KillSwitch.fingerprint_request(tool_loop(api, turns), api)
            fp.tool_signatures
          end

        assert [[_], [_], [_]] = signatures
        assert Enum.uniq(signatures) == signatures, "grep handler_1, _2, _3 are three calls"
      end

      {:ok, openai} = KillSwitch.fingerprint_request(tool_loop(:chat_completions, 2))
      {:ok, anthropic} = KillSwitch.fingerprint_request(tool_loop(:messages, 2), :messages)
      assert openai.tool_signatures == anthropic.tool_signatures
    end

    test "the spec's letter is one option away: the task on every turn" do
      task = KillSwitch.fingerprint("Find where the handlers are registered.")

      for api <- [:chat_completions, :messages], turns <- [1, 5] do
        {:ok, fp} =
          KillSwitch.fingerprint_request(tool_loop(api, turns), api, prompt: :last_user_message)

        assert fp.prompt_hash == task
      end

      assert_raise ArgumentError, ~r/got: :task/, fn ->
        KillSwitch.fingerprint_request(tool_loop(:messages, 2), :messages, prompt: :task)
      end
    end
  end

  describe "request and response bodies" do
    test "tool calls of the current turn and the stream flag are read" do
      body = Upstream.request("Fix it", tool_calls: [{"deploy", %{build: 4821}}])
      {:ok, fp} = KillSwitch.fingerprint_request(JSON.encode!(body))
      assert [signature] = fp.tool_signatures
      assert is_integer(signature)
      assert fp.stream == false

      {:ok, streamed} = KillSwitch.fingerprint_request(~s({"stream": true, "messages": []}))
      assert %{prompt_hash: nil, tool_signatures: [], stream: true} = streamed
    end

    test "bad bodies are refused with a reason" do
      assert {:error, {:invalid_json, "invalid JSON: " <> _}} =
               KillSwitch.fingerprint_request("{")

      assert {:error, :not_an_object} = KillSwitch.fingerprint_request("[1]")
      assert {:error, {:invalid_json, _}} = KillSwitch.fingerprint_response("<html>")
      assert {:error, :not_a_completion} = KillSwitch.fingerprint_response(~s({"ok": 1}))
      assert {:ok, nil} = KillSwitch.fingerprint_response(~s({"choices": []}))

      assert {:ok, hash} = KillSwitch.fingerprint_response(Upstream.completion("Deploy 7 failed"))
      assert hash == KillSwitch.fingerprint("Deploy 9 failed")
    end

    test "a body over 64 KiB is read on a dirty scheduler, with the same result" do
      history =
        for i <- 1..600, do: %{role: "user", content: "step #{i}: " <> String.duplicate("x", 100)}

      body = JSON.encode!(Upstream.request("Fix it", history: history))
      assert byte_size(body) > 64 * 1024

      assert KillSwitch.fingerprint_request(body) ==
               (case Observatory.Native.kill_switch_request_fingerprint(body, :newest_input) do
                  {:ok, p, s, stream} ->
                    {:ok, %{prompt_hash: p, tool_signatures: s, stream: stream}}
                end)
    end
  end

  defp log(seed) do
    for k <- 0..40, into: "" do
      "[2024-05-#{pad(rem(seed + k, 28) + 1)}T#{pad(rem(seed * 7 + k, 24))}:00:07Z] worker #{seed * 1000 + k} processed batch in #{rem(k, 5)}.#{rem(seed, 9)} s\n"
    end <> "Find the slowest worker."
  end

  defp pad(n), do: String.pad_leading(Integer.to_string(n), 2, "0")
end
