defmodule Observatory.Test.ConnAdapter do
  @moduledoc false
  # A request-building ObservatoryWeb.Conn.Adapter: what a host's endpoint does for
  # ObservatoryWeb.AgentAPIPlug and LLMProxyPlug (ObservatoryWeb.Conn.PlugAdapter),
  # without Plug, which cannot be installed here. `request/4` builds a request, runs
  # it through a mount (ObservatoryWeb.Mount) in a process of its own, as a server's
  # connection process would, and returns what was answered. Each chunk of a chunked
  # answer is also sent to the caller as it goes out (`{:chunk, data}`), so a test can
  # act while a stream is open (to `:notify`, default the caller); `chunks_taken: n`
  # makes the client hang up after n.

  @behaviour ObservatoryWeb.Conn.Adapter

  alias ObservatoryWeb.Mount

  @key {__MODULE__, :request}

  @doc """
  Runs one request through `mount`. Options: `:headers` (lowercase names), `:body`,
  `:remote_ip` (default "127.0.0.1"), `:chunks_taken`, `:notify`. Returns `:pass` when the mount
  lets the request through, else `%{status, headers, body, chunked, chunks,
  close_after, client_gone}` (`headers` a map; `body` the whole body, chunks joined).
  """
  def request(%Mount{} = mount, method, path, opts \\ []) do
    caller = self()
    ref = make_ref()

    {pid, monitor} =
      spawn_monitor(fn ->
        {path, query} =
          case String.split(path, "?", parts: 2) do
            [path, query] -> {path, query}
            [path] -> {path, ""}
          end

        segments = String.split(path, "/", trim: true)

        Process.put(@key, %{
          request: %{
            method: method,
            path_segments: segments,
            query_string: query,
            headers: Keyword.get(opts, :headers, []),
            remote_ip: Keyword.get(opts, :remote_ip, "127.0.0.1")
          },
          body: Keyword.get(opts, :body, ""),
          notify: Keyword.get(opts, :notify, caller),
          chunks_taken: Keyword.get(opts, :chunks_taken, :infinity),
          response: %{
            status: nil,
            headers: %{},
            body: [],
            chunked: false,
            chunks: [],
            close_after: false,
            client_gone: false
          }
        })

        result =
          case Mount.match(mount, segments) do
            :pass ->
              :pass

            {:ok, rest} ->
              Mount.serve(mount, __MODULE__, @key, rest)
              response = Process.get(@key).response
              body = IO.iodata_to_binary(response.body)
              %{response | body: body, chunks: Enum.reverse(response.chunks)}
          end

        send(caller, {ref, result})
      end)

    receive do
      {^ref, result} ->
        Process.demonitor(monitor, [:flush])
        result

      {:DOWN, ^monitor, :process, ^pid, reason} ->
        raise "the request's process exited: #{inspect(reason)}"
    after
      15_000 -> raise "no answer in 15 s"
    end
  end

  defp update(fun), do: Process.put(@key, fun.(Process.get(@key)))
  defp update_response(fun), do: update(&%{&1 | response: fun.(&1.response)})

  defp headers_map(headers),
    do: Map.new(headers, fn {name, value} -> {ObservatoryWeb.Conn.downcase(name), value} end)

  @impl true
  def request(@key), do: Process.get(@key).request

  @impl true
  def read_body(@key, max) do
    body = Process.get(@key).body
    if byte_size(body) > max, do: {:error, :too_large}, else: {:ok, body}
  end

  @impl true
  def discard_body(@key, _max), do: :ok

  @impl true
  def send_resp(@key, status, headers, body) do
    update_response(&%{&1 | status: status, headers: headers_map(headers), body: body})
    :ok
  end

  @impl true
  def send_chunked(@key, status, headers) do
    update_response(&%{&1 | status: status, headers: headers_map(headers), chunked: true})
    @key
  end

  @impl true
  def chunk(@key, data) do
    state = Process.get(@key)

    if state.chunks_taken != :infinity and length(state.response.chunks) >= state.chunks_taken do
      {:error, :closed}
    else
      data = IO.iodata_to_binary(data)
      update_response(&%{&1 | body: [&1.body, data], chunks: [data | &1.chunks]})
      send(state.notify, {:chunk, data})
      :ok
    end
  end

  @impl true
  def end_chunked(@key), do: :ok

  @impl true
  def client_socket(@key), do: nil

  @impl true
  def close_after(@key) do
    update_response(&%{&1 | close_after: true})
    :ok
  end

  @impl true
  def client_gone(@key) do
    update_response(&%{&1 | client_gone: true})
    :ok
  end

  @impl true
  def cookie(@key, name) do
    with {_, header} <- List.keyfind(Process.get(@key).request.headers, "cookie", 0),
         [_, value] <- Regex.run(~r/(?:^|;\s*)#{Regex.escape(name)}=([^;]*)/, header) do
      value
    else
      _ -> nil
    end
  end
end
