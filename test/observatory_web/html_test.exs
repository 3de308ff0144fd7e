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

    test "an attribute value cannot be closed early" do
      value = ~s[" onmouseover="alert(1)]

      assert ~s(<a title="#{HTML.escape(value)}">) ==
               ~s[<a title="&quot; onmouseover=&quot;alert(1)">]
    end
  end
end
