defmodule ObservatoryWeb.HTML do
  @moduledoc ~S"""
  HTML escaping for every page and panel Observatory renders.

  Session ids, agent ids, intents and tool names come from agents, so none of them
  is trusted. Every value a template interpolates goes through `escape/1`, which
  replaces the five characters that matter in text and in quoted attribute values:

      iex> ObservatoryWeb.HTML.escape(~s[<img src=x onerror="alert('1')">&])
      "&lt;img src=x onerror=&quot;alert(&#39;1&#39;)&quot;&gt;&amp;"

  Templates are plain iodata built by functions, and values are always put inside
  double-quoted attributes or between tags, never in `<script>` or `style`, where
  entity escaping would not be enough.

  Bidirectional formatting characters (U+202A–U+202E, U+2066–U+2069, U+200E, U+200F,
  U+061C) are shown as a visible marker instead of being obeyed: otherwise an id
  holding U+202E RIGHT-TO-LEFT OVERRIDE would display reversed and could pass for
  another session's (the "Trojan Source" trick; `Observatory.Bidi`, which the
  notifications use too). Attribute values that go back to the
  gateway (`phx-value-*`, `data-session-id`, form values) keep the exact text
  (`escape_exact/1`); they are never displayed.

      iex> ObservatoryWeb.HTML.escape("sess-\u202Eabc")
      "sess-⟨U+202E⟩abc"
  """

  @doc """
  The status line of a dashboard page: `notice` is `nil` or `{kind, text}` (escaped).

      iex> ObservatoryWeb.HTML.notice("scm-notice", {:info, "Paused <now>"}) |> IO.iodata_to_binary()
      ~s(<div id="scm-notice" class="notice notice-info" role="status">Paused &lt;now&gt;</div>)
  """
  @spec notice(String.t(), nil | {atom() | String.t(), String.t()}) :: iodata()
  def notice(id, nil), do: [~s(<div id="), id, ~s(" class="notice" role="status"></div>)]

  def notice(id, {kind, text}) do
    [
      ~s(<div id="),
      id,
      ~s(" class="notice notice-),
      escape(kind),
      ~s(" role="status">),
      escape(text),
      "</div>"
    ]
  end

  @doc """
  The attributes of a link between Observatory's pages: what LiveView's
  `<.link navigate={…}>` renders. In the LiveView pages a click changes page over the
  open socket, without a reload (the pages share one `live_session`); on the built-in
  server's pages it is a plain link.

      iex> ObservatoryWeb.HTML.navigate()
      ~s( data-phx-link="redirect" data-phx-link-state="push")
  """
  @spec navigate() :: String.t()
  def navigate, do: ~s( data-phx-link="redirect" data-phx-link-state="push")

  @doc """
  What an agent or session spent through the proxy (`Observatory.Budget`'s usage:
  `requests`, `tokens`, `cost_usd`), the same words on every page; no cost when
  nothing was priced.

      iex> ObservatoryWeb.HTML.spend(%{requests: 1, tokens: 12_400, cost_usd: 0.0312}) |> IO.iodata_to_binary()
      "1 request · 12,400 tokens · $0.0312"
  """
  @spec spend(%{requests: integer(), tokens: integer(), cost_usd: number()}) :: iodata()
  def spend(%{requests: requests, tokens: tokens, cost_usd: cost}) do
    [
      delimit(requests),
      if(requests == 1, do: " request", else: " requests"),
      " · ",
      delimit(tokens),
      " tokens",
      if(cost > 0, do: [" · $", :erlang.float_to_binary(cost / 1, decimals: 4)], else: "")
    ]
  end

  @doc """
  An integer with thousands separated by commas.

      iex> ObservatoryWeb.HTML.delimit(1234567)
      "1,234,567"
  """
  @spec delimit(integer()) :: String.t()
  def delimit(n) when is_integer(n) do
    n
    |> Integer.to_string()
    |> String.reverse()
    |> String.replace(~r/(\d{3})(?=\d)/, "\\1,")
    |> String.reverse()
  end

  @doc """
  Escapes `&`, `<`, `>`, `"` and `'`, and shows each bidirectional formatting
  character as a marker (`⟨U+202E⟩`). Accepts a string, an atom, a number or `nil`
  (rendered as the empty string).
  """
  @spec escape(String.t() | atom() | number() | nil) :: String.t()
  def escape(value), do: value |> escape_exact() |> Observatory.Bidi.mark()

  @doc ~S"""
  Escapes `&`, `<`, `>`, `"` and `'` and keeps every other character: for the
  attribute values that go back to the gateway (`phx-value-*`, `data-session-id`, a
  form field's `value`), which must name the exact session or agent. Never for
  text that is displayed.

      iex> ObservatoryWeb.HTML.escape_exact("sess-\u202E<abc>")
      "sess-\u202E&lt;abc&gt;"
  """
  @spec escape_exact(String.t() | atom() | number() | nil) :: String.t()
  def escape_exact(nil), do: ""
  def escape_exact(value) when is_binary(value), do: escape_binary(value, "")
  def escape_exact(value) when is_atom(value), do: value |> Atom.to_string() |> escape_exact()
  def escape_exact(value) when is_integer(value), do: Integer.to_string(value)
  def escape_exact(value) when is_float(value), do: Float.to_string(value)

  defp escape_binary(<<>>, acc), do: acc
  defp escape_binary(<<"&", rest::binary>>, acc), do: escape_binary(rest, acc <> "&amp;")
  defp escape_binary(<<"<", rest::binary>>, acc), do: escape_binary(rest, acc <> "&lt;")
  defp escape_binary(<<">", rest::binary>>, acc), do: escape_binary(rest, acc <> "&gt;")
  defp escape_binary(<<"\"", rest::binary>>, acc), do: escape_binary(rest, acc <> "&quot;")
  defp escape_binary(<<"'", rest::binary>>, acc), do: escape_binary(rest, acc <> "&#39;")

  defp escape_binary(<<first, rest::binary>>, acc) do
    # Copy the longest run without a special character in one step (the first byte is
    # plain: the clauses above took every special character).
    n = plain_prefix(rest, 0)
    <<plain::binary-size(n), rest::binary>> = rest
    escape_binary(rest, <<acc::binary, first, plain::binary>>)
  end

  defp plain_prefix(<<c, _::binary>>, n) when c in ~c[&<>"'], do: n
  defp plain_prefix(<<_, rest::binary>>, n), do: plain_prefix(rest, n + 1)
  defp plain_prefix(<<>>, n), do: n
end
