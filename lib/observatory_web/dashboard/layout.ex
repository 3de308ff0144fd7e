defmodule ObservatoryWeb.Dashboard.Layout do
  @moduledoc """
  The HTML shell of the dashboard's pages and the headers they are sent with.

  Pages load two stylesheets and one script, both served by the app
  (`ObservatoryWeb.Dashboard.Assets`), so the Content-Security-Policy allows no
  inline script or style at all:

      default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; ...

  `page/2` takes the body as iodata that the caller has already escaped
  (`ObservatoryWeb.HTML.escape/1`); the title is escaped here.
  """

  import ObservatoryWeb.HTML, only: [escape: 1]

  alias ObservatoryWeb.Dashboard.Assets

  @csp Enum.join(
         [
           "default-src 'none'",
           "script-src 'self'",
           "style-src 'self'",
           "connect-src 'self'",
           "img-src 'self' data:",
           "form-action 'self'",
           "frame-ancestors 'none'",
           "base-uri 'none'"
         ],
         "; "
       )

  @doc "The headers every dashboard page is sent with."
  @spec headers() :: [{String.t(), String.t()}]
  def headers do
    [{"Content-Security-Policy", @csp}, {"Cache-Control", "no-store"}]
  end

  @doc """
  A whole page.

  ## Options
    * `:csrf_token` — put in `<meta name="csrf-token">` for the page script.
    * `:script` — whether to load the page script, `dashboard.js` (default false).
    * `:body_class` — a class for `<body>`.
    * `:stream` — the page's event stream, in `<body data-stream>` for the page script.
  """
  @spec page(String.t(), iodata(), keyword()) :: iodata()
  def page(title, body, opts \\ []) do
    [
      ~s(<!doctype html><html lang="en"><head><meta charset="utf-8">),
      ~s(<meta name="viewport" content="width=device-width, initial-scale=1">),
      ~s(<link rel="icon" href="data:,">),
      ~s(<title>),
      escape(title),
      ~s(</title><link rel="stylesheet" href="/assets/#{Assets.path("dashboard.css")}">),
      ~s(<link rel="stylesheet" href="/assets/#{Assets.path("manager.css")}">),
      case opts[:csrf_token] do
        nil -> ""
        token -> [~s(<meta name="csrf-token" content="), escape(token), ~s(">)]
      end,
      if(opts[:script],
        do: ~s(<script src="/assets/#{Assets.path("dashboard.js")}" defer></script>),
        else: ""
      ),
      ~s(</head><body class="),
      escape(opts[:body_class] || ""),
      ~s("),
      case opts[:stream] do
        nil -> ""
        path -> [~s( data-stream="), escape(path), ~s(")]
      end,
      ">",
      body,
      "</body></html>"
    ]
  end
end
