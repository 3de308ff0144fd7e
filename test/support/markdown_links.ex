defmodule Observatory.Test.MarkdownLinks do
  @moduledoc false
  # The links of a Markdown text, for the docs tests (links_test, readme_test). Here,
  # compiled before any test runs, rather than in one test file that another calls:
  # an async test could run before the file defining it was loaded.

  # Text outside fenced code blocks and inline code: links there are examples.
  defp prose(text) do
    text
    |> String.split(~r/^(```|~~~).*$/m)
    |> Enum.take_every(2)
    |> Enum.join("\n")
    |> String.replace(~r/`[^`\n]*`/, "")
  end

  @doc "The link targets in a Markdown text's prose (inline, reference and HTML)."
  def links(text) do
    text = prose(text)

    inline =
      for [_, target] <-
            Regex.scan(~r/!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/, text),
          do: target

    reference = for [_, target] <- Regex.scan(~r/^\s*\[[^\]]+\]:\s+(\S+)/m, text), do: target

    html =
      for [_, target] <- Regex.scan(~r/<(?:a|img)\s[^>]*(?:href|src)="([^"]+)"/, text), do: target

    inline ++ reference ++ html
  end
end
