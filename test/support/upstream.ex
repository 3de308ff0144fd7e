defmodule Observatory.Test.Upstream do
  @moduledoc false
  # A real OpenAI-compatible upstream for proxy tests: MochiWeb on 127.0.0.1, port 0,
  # linked to the test process. `handler` gets each request's body and returns
  # `{status, content_type, body}`, or `{:chunked, status, content_type, fun}` to answer
  # in pieces: `fun` gets MochiWeb's response and writes with `write_chunk/2` (a write
  # to a closed connection exits it). Every request is also sent to the test process, once answered, as
  # `{:upstream_request, body, authorization_header}`.

  alias Observatory.JSON

  def start(handler) do
    test = self()

    loop = fn req ->
      body = :mochiweb_request.recv_body(req) |> IO.iodata_to_binary()

      auth =
        case :mochiweb_request.get_header_value(~c"authorization", req) do
          :undefined -> nil
          value -> to_string(value)
        end

      reply =
        if is_function(handler, 2),
          do: handler.(body, headers(req)),
          else: handler.(body)

      case reply do
        {:chunked, status, type, fun} ->
          resp = :mochiweb_request.respond({status, [{"Content-Type", type}], :chunked}, req)
          fun.(resp)
          write_chunk(resp, "")

        {status, type, reply} ->
          :mochiweb_request.respond({status, [{"Content-Type", type}], reply}, req)
      end

      # After answering, so that the test may end as soon as it hears of the request.
      send(test, {:upstream_request, body, auth})
    end

    name = :"upstream_#{System.unique_integer([:positive])}"
    {:ok, pid} = :mochiweb_http.start_link(name: name, ip: {127, 0, 0, 1}, port: 0, loop: loop)
    port = :mochiweb_socket_server.get(pid, :port)
    %{pid: pid, port: port, url: "http://127.0.0.1:#{port}/v1"}
  end

  defp headers(req) do
    for {name, value} <- :mochiweb_headers.to_list(:mochiweb_request.get(:headers, req)),
        into: %{},
        do: {name |> to_string() |> String.downcase(), to_string(value)}
  end

  @doc "An Anthropic message answering with `text` (and `tool_use` blocks `{name, input}` or `{id, name, input}`)."
  def message(text, tool_uses \\ []) do
    blocks =
      if(text == "", do: [], else: [%{type: "text", text: text}]) ++
        for tool_use <- tool_uses do
          {id, name, input} =
            case tool_use do
              {name, input} -> {"toolu_#{System.unique_integer([:positive])}", name, input}
              {id, name, input} -> {id, name, input}
            end

          %{type: "tool_use", id: id, name: name, input: input}
        end

    JSON.encode!(%{
      id: "msg_test",
      type: "message",
      role: "assistant",
      model: "test-model",
      content: blocks,
      stop_reason: if(tool_uses == [], do: "end_turn", else: "tool_use"),
      usage: %{input_tokens: 1, output_tokens: 1}
    })
  end

  @doc "The server-sent events of a streamed Anthropic message whose text is `pieces`."
  def message_events(pieces) do
    start = [
      message_start(),
      event("content_block_start", %{index: 0, content_block: %{type: "text", text: ""}})
    ]

    deltas =
      for piece <- pieces,
          do: event("content_block_delta", %{index: 0, delta: %{type: "text_delta", text: piece}})

    stop = [
      event("content_block_stop", %{index: 0}),
      event("message_delta", %{delta: %{stop_reason: "end_turn"}, usage: %{output_tokens: 2}}),
      event("message_stop", %{})
    ]

    {start, deltas, stop}
  end

  # One server-sent event of the Messages API.
  defp event(type, data),
    do: "event: #{type}\ndata: #{JSON.encode!(Map.put(data, :type, type))}\n\n"

  defp message_start do
    event("message_start", %{
      message: %{
        id: "msg_test",
        type: "message",
        role: "assistant",
        model: "test-model",
        content: [],
        stop_reason: nil,
        usage: %{input_tokens: 1, output_tokens: 0}
      }
    })
  end

  @doc """
  A chat completion whose answer is one tool call, `name(args)`, with the call `id`.
  """
  def tool_call_completion(id, name, args) do
    JSON.encode!(%{
      id: "chatcmpl-test",
      object: "chat.completion",
      created: 1_700_000_000,
      model: "test-model",
      choices: [
        %{
          index: 0,
          finish_reason: "tool_calls",
          message: %{
            role: "assistant",
            content: nil,
            tool_calls: [
              %{id: id, type: "function", function: %{name: name, arguments: JSON.encode!(args)}}
            ]
          }
        }
      ]
    })
  end

  @doc """
  The server-sent events of the same answer streamed, as the API sends it: the call's
  id and name first, its arguments in two pieces, then `finish_reason` and `[DONE]`.
  """
  def tool_call_chunks(id, name, args) do
    arguments = JSON.encode!(args)
    half = div(byte_size(arguments), 2)

    chunk = fn delta, finish ->
      "data: " <>
        JSON.encode!(%{
          id: "chatcmpl-test",
          object: "chat.completion.chunk",
          created: 1_700_000_000,
          model: "test-model",
          choices: [%{index: 0, delta: delta, finish_reason: finish}]
        }) <> "\n\n"
    end

    call = fn function -> %{tool_calls: [Map.merge(%{index: 0}, function)]} end

    [
      chunk.(
        Map.merge(
          %{role: "assistant", content: nil},
          call.(%{id: id, type: "function", function: %{name: name, arguments: ""}})
        ),
        nil
      ),
      chunk.(call.(%{function: %{arguments: binary_part(arguments, 0, half)}}), nil),
      chunk.(
        call.(%{function: %{arguments: binary_part(arguments, half, byte_size(arguments) - half)}}),
        nil
      ),
      chunk.(%{}, "tool_calls"),
      "data: [DONE]\n\n"
    ]
  end

  @doc """
  The server-sent events of a streamed Anthropic message that says `text` and then
  calls `name(input)` with the block id `id`: the input arrives as two pieces of JSON.
  """
  def tool_use_events(text, id, name, input) do
    json = JSON.encode!(input)
    half = div(byte_size(json), 2)
    piece = fn json -> %{index: 1, delta: %{type: "input_json_delta", partial_json: json}} end

    [
      message_start(),
      event("content_block_start", %{index: 0, content_block: %{type: "text", text: ""}}),
      event("content_block_delta", %{index: 0, delta: %{type: "text_delta", text: text}}),
      event("content_block_stop", %{index: 0}),
      event("content_block_start", %{
        index: 1,
        content_block: %{type: "tool_use", id: id, name: name, input: %{}}
      }),
      event("content_block_delta", piece.(binary_part(json, 0, half))),
      event("content_block_delta", piece.(binary_part(json, half, byte_size(json) - half))),
      event("content_block_stop", %{index: 1}),
      event("message_delta", %{delta: %{stop_reason: "tool_use"}, usage: %{output_tokens: 9}}),
      event("message_stop", %{})
    ]
  end

  @doc "Writes one piece of a chunked answer; `:closed` when the proxy hung up."
  def write_chunk(resp, data) do
    :mochiweb_response.write_chunk(data, resp)
    :ok
  catch
    :exit, _ -> :closed
  end

  @doc "An upstream that answers every request with the same completion."
  def answering(content), do: start(fn _ -> {200, "application/json", completion(content)} end)

  def completion(content) do
    JSON.encode!(%{
      id: "chatcmpl-test",
      object: "chat.completion",
      model: "test-model",
      choices: [
        %{index: 0, message: %{role: "assistant", content: content}, finish_reason: "stop"}
      ]
    })
  end

  @doc "One server-sent event of a streamed chat completion carrying `text`."
  def chunk_event(text) do
    chunk = %{
      id: "chatcmpl-test",
      object: "chat.completion.chunk",
      model: "test-model",
      choices: [%{index: 0, delta: %{content: text}, finish_reason: nil}]
    }

    "data: " <> JSON.encode!(chunk) <> "\n\n"
  end

  @doc "An upstream that streams `pieces` as chat-completion chunks, then `[DONE]`."
  def streaming(pieces) do
    start(fn _ ->
      {:chunked, 200, "text/event-stream",
       fn resp ->
         for piece <- pieces, do: write_chunk(resp, chunk_event(piece))
         write_chunk(resp, "data: [DONE]\n\n")
       end}
    end)
  end

  @doc "A loopback URL where nothing listens."
  def closed_url do
    {:ok, socket} = :gen_tcp.listen(0, ip: {127, 0, 0, 1})
    {:ok, port} = :inet.port(socket)
    :ok = :gen_tcp.close(socket)
    "http://127.0.0.1:#{port}/v1"
  end

  @doc "A chat-completions request body whose last user message is `prompt`."
  def request(prompt, opts \\ []) do
    history = Keyword.get(opts, :history, [])
    tool_calls = Keyword.get(opts, :tool_calls, [])

    turn =
      if tool_calls == [],
        do: [],
        else: [
          %{role: "assistant", content: nil, tool_calls: for(c <- tool_calls, do: tool_call(c))},
          %{role: "tool", tool_call_id: "call_1", content: "error: timeout"}
        ]

    %{model: "test-model", messages: history ++ [%{role: "user", content: prompt}] ++ turn}
  end

  defp tool_call({name, args}) do
    %{
      id: "call_#{System.unique_integer([:positive])}",
      type: "function",
      function: %{name: name, arguments: JSON.encode!(args)}
    }
  end
end
