defmodule ObservatoryWeb.HTMLTest do
  use ExUnit.Case, async: true

  alias ObservatoryWeb.HTML

  doctest ObservatoryWeb.HTML

  describe "escape/1" do
    test "replaces the five characters that matter in text and attributes" do
      assert HTML.escape("&<>\"'") == "&amp;&lt;&gt;&quot;&#39;"
    end

    test "a hostile session id becomes inert text" do
      escaped = HTML.escape("<img src=x onerror=alert(1)>")
      assert escaped == "&lt;img src=x onerror=alert(1)&gt;"
      refute escaped =~ "<"
    end

    test "leaves other text, including UTF-8, alone" do
      assert HTML.escape("sess-42 · agent→ü") == "sess-42 · agent→ü"
      assert HTML.escape("") == ""
    end

    test "renders nil, atoms and numbers" do
      assert HTML.escape(nil) == ""
      assert HTML.escape(:loop) == "loop"
      assert HTML.escape(5) == "5"
      assert HTML.escape(0.2) == "0.2"
    end

    test "bidirectional controls cannot reorder displayed text: each shows as a marker" do
      # U+202E RIGHT-TO-LEFT OVERRIDE would show "sess-\u202ELTR" as "sess-RTL".
      assert HTML.escape("sess-\u202ELTR") == "sess-⟨U+202E⟩LTR"

      controls =
        [0x061C, 0x200E, 0x200F] ++ Enum.to_list(0x202A..0x202E) ++ Enum.to_list(0x2066..0x2069)

      for code <- controls do
        marker = "⟨U+" <> String.pad_leading(Integer.to_string(code, 16), 4, "0") <> "⟩"
        assert HTML.escape(<<"a", code::utf8, "<b">>) == "a" <> marker <> "&lt;b"
      end

      escaped = HTML.escape(for code <- controls, into: "", do: <<code::utf8>>)
      refute String.contains?(escaped, Enum.map(controls, &<<&1::utf8>>))
    end

    test "characters near the controls (same UTF-8 lead bytes) are left alone" do
      # U+2019, U+2192, U+0627 ARABIC ALEF, U+2068's neighbour U+2065 (unassigned).
      text = "it’s → \u0627 \u2065"
      assert HTML.escape(text) == text
    end

    test "an attribute value cannot be closed early" do
      value = ~s[" onmouseover="alert(1)]

      assert ~s(<a title="#{HTML.escape(value)}">) ==
               ~s[<a title="&quot; onmouseover=&quot;alert(1)">]
    end
  end

  describe "escape_exact/1 (values sent back to the gateway)" do
    test "keeps bidirectional controls byte for byte, still escapes markup" do
      assert HTML.escape_exact("sess-\u202E<x>\u2066") == "sess-\u202E&lt;x&gt;\u2066"
      assert HTML.escape_exact(nil) == ""
      assert HTML.escape_exact(7) == "7"
    end
  end
end
