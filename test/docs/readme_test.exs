defmodule Observatory.DocsReadmeTest do
  # The README is one screen and a map: short, every guide reachable from it, and no
  # internal ids in the text a user reads (the requirements map is where they belong).
  use ExUnit.Case, async: true

  @root Path.expand("../..", __DIR__)
  @readme Path.join(@root, "README.md")
  @index Path.join(@root, "docs/README.md")

  defp guides, do: Path.wildcard(Path.join(@root, "docs/*.md"))

  defp linked(file) do
    for target <- Observatory.Test.MarkdownLinks.links(File.read!(file)),
        not String.starts_with?(target, ["http:", "https:", "#"]),
        do: target |> String.split("#") |> hd() |> Path.expand(Path.dirname(file))
  end

  describe "the README is one screen and a map" do
    test "at most 200 lines" do
      lines = @readme |> File.read!() |> String.split("\n", trim: true) |> length()
      assert lines <= 200, "README.md has #{lines} lines"
    end

    test "says how to start, stop, send a step and choose the alert source" do
      readme = File.read!(@readme)

      for needle <-
            ["bin/start", "bin/test", "Ctrl-C", "/api/v1/decision_logs"] ++
              ["OBSERVATORY_ALERT_SOURCE=verdict", "dev-operator-token"] do
        assert readme =~ needle, "README.md does not mention #{needle}"
      end
    end

    test "every guide in docs/ is linked from the README or the guides' index" do
      reachable = MapSet.new(linked(@readme) ++ linked(@index))
      unlinked = for g <- guides(), g not in reachable, g != @index, do: Path.basename(g)
      assert unlinked == []
    end
  end

  describe "user-facing text cites no internal ids" do
    @internal ~r/\b(FR-\d|FRD-\d|ADR-\d|UC-\d|seed 00\d|[Ii]ssues? \d)/

    test "README.md and the guides, the requirements map aside" do
      offenders =
        for file <- [@readme | guides()],
            Path.basename(file) != "requirements.md",
            {line, n} <- file |> File.read!() |> String.split("\n") |> Enum.with_index(1),
            Regex.match?(@internal, line),
            do: "#{Path.relative_to(file, @root)}:#{n}: #{line}"

      assert offenders == []
    end

    test "the pattern catches what it is meant to" do
      assert Regex.match?(@internal, "as FR-9.8 requires")
      assert Regex.match?(@internal, "issue 11 added")
      refute Regex.match?(@internal, "a tissue 3 times")
    end
  end
end
