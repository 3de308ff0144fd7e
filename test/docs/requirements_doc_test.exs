defmodule Observatory.RequirementsDocTest do
  # docs/requirements.md maps each requirement of the specifications to the tests that
  # cover it: every FR-9.x and UC-0250 scenario is listed, and every test it names
  # exists (its file, and a describe or test of that name in it).
  use ExUnit.Case, async: true

  @root Path.expand("../..", __DIR__)
  @doc_text File.read!(Path.join(@root, "docs/requirements.md"))

  @doc false
  # [{file, name}] for each "`test/….exs` — "name", "name"" in a row.
  def cited(text) do
    for line <- String.split(text, "\n"),
        [_, file, names] <- Regex.scan(~r/`(test\/[^`]+\.exs)` — ((?:"[^"]+"(?:, )?)+)/u, line),
        [_, name] <- Regex.scan(~r/"([^"]+)"/, names),
        do: {file, name}
  end

  test "every FR-9.x and UC-0250 scenario is listed" do
    for n <- 1..11, do: assert(@doc_text =~ "| FR-9.#{n} |", "FR-9.#{n}")
    for id <- ~w(S1 S2 F1), do: assert(@doc_text =~ "| #{id} |", id)
  end

  test "every test it names exists" do
    cited = cited(@doc_text)
    assert length(cited) > 40

    missing =
      for {file, name} <- cited,
          path = Path.join(@root, file),
          not (File.exists?(path) and
                 File.read!(path) =~ ~r/(describe|test) "#{Regex.escape(escape(name))}"/),
          do: "#{file}: #{name}"

    assert missing == []
  end

  test "a test that does not exist is caught (the check can fail)" do
    assert cited(~s(| x | y | `test/a_test.exs` — "one", "two" |)) ==
             [{"test/a_test.exs", "one"}, {"test/a_test.exs", "two"}]
  end

  # Names as they are written in the source (a quote inside a name is escaped there).
  defp escape(name), do: String.replace(name, "\"", "\\\"")
end
