defmodule Observatory.KillSwitch.PromptSourceTest do
  # What a request's prompt is for the kill switch, as configured. Changes the
  # :kill_switch settings: not async.
  use ExUnit.Case, async: false

  alias Observatory.KillSwitch
  alias Observatory.Test.ToolConversation

  setup do
    saved = Application.get_env(:observatory, :kill_switch)
    on_exit(fn -> Application.put_env(:observatory, :kill_switch, saved) end)
    %{saved: saved}
  end

  describe "issue 19: Extract user message — the spec's letter is one setting away" do
    test "the default is the newest user-side input", %{saved: saved} do
      assert KillSwitch.prompt_source() == :newest_input
      Application.put_env(:observatory, :kill_switch, Keyword.delete(saved, :prompt))
      assert KillSwitch.prompt_source() == :newest_input
      assert KillSwitch.check_config!() == :ok
    end

    test "prompt: :last_user_message reads the task on every turn", %{saved: saved} do
      Application.put_env(
        :observatory,
        :kill_switch,
        Keyword.put(saved, :prompt, :last_user_message)
      )

      assert KillSwitch.prompt_source() == :last_user_message
      assert KillSwitch.check_config!() == :ok
      task = KillSwitch.fingerprint("Find where the handlers are registered.")

      for api <- [:chat_completions, :messages] do
        turns = for k <- 1..4, do: {"grep", %{"pattern" => "handler_#{k}"}, "h#{k}.py"}
        body = ToolConversation.json(api, "Find where the handlers are registered.", turns)
        assert {:ok, %{prompt_hash: ^task}} = KillSwitch.fingerprint_request(body, api)
      end
    end

    test "an unknown setting stops the start with the value shown; read as the default meanwhile",
         %{saved: saved} do
      Application.put_env(:observatory, :kill_switch, Keyword.put(saved, :prompt, :task))

      assert_raise ArgumentError,
                   ~r/:prompt to be one of \[:newest_input, :last_user_message\], got: :task/,
                   fn -> KillSwitch.check_config!() end

      assert KillSwitch.prompt_source() == :newest_input
    end
  end
end
