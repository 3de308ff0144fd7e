# Bytes per LiveView update: the parts that changed (ObservatoryWeb.LiveParts) against
# the whole page with its stylesheet, which the LiveViews sent as one value before.
#
#   MIX_ENV=test mix run --no-start bench/live_updates.exs   (byte counts: any env)
#
# A fleet of 50 sessions, the manager mounted on Observatory's own socket and fed the
# gateway's events as a LiveView would get them, then one agent looping for six steps,
# two quiet refreshes and a Pause and Inspect. Each row: what changed and its bytes,
# the whole page's bytes, and their ratio. (LiveView adds a few bytes of JSON framing
# per changed part; a real Phoenix host measured the same scenario by hand, see the
# README.)
alias Observatory.Gateway.{Events, SchemaInterceptor}
alias ObservatoryWeb.{LiveParts, SessionClusterManager}
alias ObservatoryWeb.SessionClusterManager.{Socket, View}

dir = Path.join(System.tmp_dir!(), "observatory-bench-live-#{System.pid()}")
Application.put_env(:observatory, ObservatoryWeb.Endpoint, server: false)
Application.put_env(:observatory, :data_dir, dir)
Application.put_env(:observatory, :demo, false)
Application.put_env(:observatory, :dashboard_refresh_ms, :timer.hours(1))
Logger.configure(level: :error)
{:ok, _} = Application.ensure_all_started(:observatory)

envelope = fn sid, n, tool ->
  %{
    "meta" => %{
      "step_id" => "#{sid}-#{n}",
      "session_id" => sid,
      "agent_id" => "agent-#{sid}",
      "timestamp" => "2026-02-22T10:30:00Z"
    },
    "cognition" => %{"intent" => "search", "entropy_score" => 0.9},
    "action" => %{"tool_call" => tool, "status" => "success"}
  }
end

tools = ~w(read_file write_file list_files run_shell grep http_get sql edit)

for s <- 1..50, n <- 1..3 do
  {:ok, _} = SchemaInterceptor.ingest(envelope.("bench-#{s}", n, Enum.at(tools, rem(s + n, 8))))
end

for topic <- SessionClusterManager.topics(), do: :ok = Events.subscribe(topic)
{:ok, socket} = SessionClusterManager.mount(%{}, %{"operator" => "bench"}, Socket.new())

drain = fn drain, socket ->
  receive do
    message ->
      {:noreply, socket} = SessionClusterManager.handle_info(message, socket)
      drain.(drain, socket)
  after
    50 -> socket
  end
end

style = byte_size(LiveParts.style())

measure = fn label, socket, before ->
  now = LiveParts.snapshot(View.parts(socket.assigns))
  whole = style + (now |> Map.values() |> Enum.map(&byte_size/1) |> Enum.sum())
  changed = LiveParts.changed_bytes(before, now)

  names =
    LiveParts.changed(before, now)
    |> Enum.map_join(" ", &String.replace_prefix(to_string(&1), "html_", ""))

  IO.puts(
    String.pad_trailing(label, 22) <>
      String.pad_leading("#{changed}", 8) <>
      String.pad_leading("#{whole}", 9) <>
      String.pad_leading(:erlang.float_to_binary(changed / whole, decimals: 3), 8) <>
      "  " <> if(names == "", do: "(nothing)", else: names)
  )

  {now, changed, whole}
end

socket = drain.(drain, socket)
IO.puts("update                 changed    whole   ratio  parts resent")
before = LiveParts.snapshot(View.parts(socket.assigns))

{socket, before, totals} =
  Enum.reduce(1..6, {socket, before, {0, 0}}, fn n, {socket, before, {c, w}} ->
    {:ok, _} = SchemaInterceptor.ingest(envelope.("bench-loop", n, "read_file"))
    socket = drain.(drain, socket)
    {now, changed, whole} = measure.("loop step #{n}", socket, before)
    {socket, now, {c + changed, w + whole}}
  end)

{changed, whole} = totals

IO.puts(
  "six steps: #{changed} bytes resent against #{whole} (ratio #{:erlang.float_to_binary(changed / whole, decimals: 3)})"
)

{socket, before} =
  Enum.reduce(1..2, {socket, before}, fn n, {socket, before} ->
    {:noreply, socket} =
      SessionClusterManager.handle_info({SessionClusterManager, :refresh}, socket)

    {now, _, _} = measure.("quiet refresh #{n}", socket, before)
    {socket, now}
  end)

{:noreply, socket} =
  SessionClusterManager.handle_event("pause_inspect", %{"session_id" => "bench-loop"}, socket)

socket = drain.(drain, socket)
measure.("pause and inspect", socket, before)

File.rm_rf!(dir)
