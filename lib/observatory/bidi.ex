defmodule Observatory.Bidi do
  @moduledoc ~S"""
  Bidirectional formatting characters in text a person reads: each shown as a visible
  marker instead of being obeyed.

  Session ids, agent ids, intents and tool names come from agents. One holding U+202E
  RIGHT-TO-LEFT OVERRIDE would display reversed and could pass for another session's
  (the "Trojan Source" trick), on the dashboard as in a Slack message or an e-mail.
  Everything Observatory writes for people — the dashboard's text
  (`ObservatoryWeb.HTML.escape/1`), the text of a notification
  (`Observatory.Notifications.Sink`) — goes through `mark/1`; values a program reads
  back (ids in JSON, the dashboard's button values) keep the exact bytes.

      iex> Observatory.Bidi.mark("sess-\u202Eabc")
      "sess-⟨U+202E⟩abc"
  """

  @controls [0x061C, 0x200E, 0x200F] ++
              Enum.to_list(0x202A..0x202E) ++ Enum.to_list(0x2066..0x2069)
  @patterns for code <- @controls, do: <<code::utf8>>

  @doc "The code points shown as markers: U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069."
  @spec controls() :: [char()]
  def controls, do: @controls

  @doc ~S"""
  `text` with each bidirectional formatting character replaced by its marker
  (`⟨U+202E⟩`); every other character is kept.

      iex> Observatory.Bidi.mark("a\u2066b\u200Fc")
      "a⟨U+2066⟩b⟨U+200F⟩c"
  """
  @spec mark(String.t()) :: String.t()
  def mark(text) when is_binary(text), do: String.replace(text, @patterns, &marker/1)

  defp marker(<<code::utf8>>),
    do: "⟨U+" <> String.pad_leading(Integer.to_string(code, 16), 4, "0") <> "⟩"
end
