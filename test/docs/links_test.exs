defmodule Observatory.DocsLinksTest do
  # Every link in README.md and docs/*.md resolves: a relative link names a file
  # that exists, a #fragment names a heading of the file it points into (GitHub's
  # anchors), and an http(s) link is a well-formed URL (checked without the network).
  use ExUnit.Case, async: true

  @root Path.expand("../..", __DIR__)

  defp documents do
    [Path.join(@root, "README.md") | Path.wildcard(Path.join(@root, "docs/*.md"))]
  end

  defp links(text), do: Observatory.Test.MarkdownLinks.links(text)

  @doc "The anchors GitHub gives a Markdown file's headings, duplicates numbered."
  def anchors(text) do
    text
    |> prose_with_headings()
    |> Enum.map(&slug/1)
    |> Enum.map_reduce(%{}, fn slug, seen ->
      n = Map.get(seen, slug, 0)
      {if(n == 0, do: slug, else: "#{slug}-#{n}"), Map.put(seen, slug, n + 1)}
    end)
    |> elem(0)
  end

  defp prose_with_headings(text) do
    text
    |> String.split(~r/^(```|~~~).*$/m)
    |> Enum.take_every(2)
    |> Enum.flat_map(fn part ->
      for [_, heading] <- Regex.scan(~r/^\#{1,6}\s+(.+?)\s*#*\s*$/m, part), do: heading
    end)
  end

  @doc "GitHub's anchor of a heading."
  def slug(heading) do
    heading
    |> String.replace(~r/!?\[([^\]]*)\]\([^)]*\)/, "\\1")
    |> String.downcase()
    |> String.replace(~r/[^\p{L}\p{N}\s_-]/u, "")
    |> String.replace(" ", "-")
  end

  defp check(file, target) do
    cond do
      target =~ ~r/^https?:/ ->
        uri = URI.parse(target)

        if uri.host in [nil, ""] or target =~ ~r/\s/,
          do: ["#{target}: not a well-formed URL"],
          else: []

      target =~ ~r/^(mailto|tel):/ ->
        []

      target =~ ~r/^[a-z][a-z0-9+.-]*:/ ->
        ["#{target}: an unknown scheme"]

      true ->
        [path | fragment] = String.split(target, "#", parts: 2)
        dest = if path == "", do: file, else: Path.expand(URI.decode(path), Path.dirname(file))

        cond do
          not File.exists?(dest) ->
            ["#{target}: #{Path.relative_to(dest, @root)} does not exist"]

          fragment != [] and Path.extname(dest) == ".md" ->
            [anchor] = fragment

            if anchor in anchors(File.read!(dest)),
              do: [],
              else: ["#{target}: no heading ##{anchor} in #{Path.relative_to(dest, @root)}"]

          true ->
            []
        end
    end
  end

  describe "the docs' links" do
    test "every link in README.md and docs/*.md resolves" do
      broken =
        for file <- documents(),
            target <- links(File.read!(file)),
            problem <- check(file, target),
            do: "#{Path.relative_to(file, @root)}: #{problem}"

      assert broken == []
    end

    test "there are links to check (the scan finds them)" do
      assert length(links(File.read!(Path.join(@root, "README.md")))) > 10
    end
  end

  describe "the checker" do
    test "GitHub's anchors: lower case, punctuation dropped, spaces as hyphens, duplicates numbered" do
      assert slug("Kill switch — How it scores") == "kill-switch--how-it-scores"

      assert slug("`:alert_source` — which signal raises the alarm") ==
               "alert_source--which-signal-raises-the-alarm"

      assert slug("Two-layer loop detection (step detector and circuit breaker)") ==
               "two-layer-loop-detection-step-detector-and-circuit-breaker"

      assert anchors("# A\n## How it scores\n```\n# not a heading\n```\n### How it scores\n") ==
               ["a", "how-it-scores", "how-it-scores-1"]
    end

    test "a missing file, a missing anchor, a malformed URL are reported; code is not scanned" do
      file = Path.join(@root, "README.md")
      assert [_] = check(file, "docs/no-such-file.md")
      assert [_] = check(file, "#no-such-heading")
      assert [_] = check(file, "https://")
      assert check(file, "https://example.com/a?b=c") == []
      assert links("see `[x](nowhere.md)` and\n```\n[y](nowhere.md)\n```\n[z](a.md)") == ["a.md"]
    end
  end
end
