defmodule Observatory.Test.Upstream do
  @moduledoc false
  # A real OpenAI-compatible upstream for proxy tests: MochiWeb on 127.0.0.1, port 0,
  # linked to the test process. `handler` gets each request's body (and, at arity 2,
  # its headers; at arity 3, also `%{method, path}`) and returns
  # `{status, content_type, body}` (or `{status, content_type, extra_headers, body}`),
  # or `{:chunked, status, content_type, fun}` (or `…, extra_headers, fun}`) to answer
  # in pieces: `fun` gets MochiWeb's response and writes with `write_chunk/2` (a write
  # to a closed connection exits it). Every request is also sent to the test process, once answered, as
  # `{:upstream_request, body, authorization_header}`.

  alias Observatory.JSON

  def start(handler) do
    test = self()

    loop = fn req ->
      body =
        case :mochiweb_request.recv_body(64 * 1024 * 1024, req) do
          :undefined -> ""
          data -> IO.iodata_to_binary(data)
        end

      auth =
        case :mochiweb_request.get_header_value(~c"authorization", req) do
          :undefined -> nil
          value -> to_string(value)
        end

      reply =
        cond do
          is_function(handler, 3) -> handler.(body, headers(req), request_line(req))
          is_function(handler, 2) -> handler.(body, headers(req))
          true -> handler.(body)
        end

      case reply do
        {:chunked, status, type, fun} ->
          resp = :mochiweb_request.respond({status, [{"Content-Type", type}], :chunked}, req)
          fun.(resp)
          write_chunk(resp, "")

        {:chunked, status, type, extra, fun} ->
          resp =
            :mochiweb_request.respond({status, [{"Content-Type", type} | extra], :chunked}, req)

          fun.(resp)
          write_chunk(resp, "")

        {status, type, reply} ->
          :mochiweb_request.respond({status, [{"Content-Type", type}], reply}, req)

        {status, type, extra, reply} ->
          :mochiweb_request.respond({status, [{"Content-Type", type} | extra], reply}, req)
      end

      # After answering, so that the test may end as soon as it hears of the request.
      send(test, {:upstream_request, body, auth})
    end

    name = :"upstream_#{System.unique_integer([:positive])}"
    {:ok, pid} = :mochiweb_http.start_link(name: name, ip: {127, 0, 0, 1}, port: 0, loop: loop)
    port = :mochiweb_socket_server.get(pid, :port)
    %{pid: pid, port: port, url: "http://127.0.0.1:#{port}/v1"}
  end

  defp request_line(req) do
    %{
      method: req |> then(&:mochiweb_request.get(:method, &1)) |> to_string(),
      path: req |> then(&:mochiweb_request.get(:raw_path, &1)) |> to_string()
    }
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

  @doc """
  A Responses API answer: a message with `text` (none when "") and `function_call`
  items `{name, arguments}`.
  """
  def response(text, calls \\ []) do
    JSON.encode!(response_object(text, calls, "completed"))
  end

  defp response_object(text, calls, status) do
    message =
      if text == "",
        do: [],
        else: [
          %{
            type: "message",
            id: "msg_test",
            status: "completed",
            role: "assistant",
            content: [%{type: "output_text", text: text, annotations: []}]
          }
        ]

    function_calls =
      for {{name, args}, k} <- Enum.with_index(calls) do
        %{
          type: "function_call",
          id: "fc_#{k}",
          call_id: "call_#{System.unique_integer([:positive])}",
          name: name,
          arguments: JSON.encode!(args),
          status: "completed"
        }
      end

    %{
      id: "resp_test",
      object: "response",
      created_at: 1_700_000_000,
      status: status,
      model: "test-model",
      output: message ++ function_calls,
      parallel_tool_calls: true,
      tool_choice: "auto",
      tools: [],
      usage: %{
        input_tokens: 1,
        output_tokens: 1,
        total_tokens: 2,
        input_tokens_details: %{cached_tokens: 0},
        output_tokens_details: %{reasoning_tokens: 0}
      }
    }
  end

  @doc """
  The server-sent events of a streamed Responses API answer whose text is `pieces`,
  as `{start, deltas, stop}` (the way the API sends them: created, the message item
  and its part, the text deltas, then their ends and `response.completed`).
  """
  def response_events(pieces) do
    seq = :counters.new(1, [])

    event = fn data ->
      :counters.add(seq, 1, 1)
      data = Map.put(data, :sequence_number, :counters.get(seq, 1))
      "event: #{data.type}\ndata: #{JSON.encode!(data)}\n\n"
    end

    text = Enum.join(pieces)
    created = response_object("", [], "in_progress")

    item = %{
      type: "message",
      id: "msg_test",
      status: "in_progress",
      role: "assistant",
      content: []
    }

    part = %{type: "output_text", text: "", annotations: []}

    start = [
      event.(%{type: "response.created", response: created}),
      event.(%{type: "response.in_progress", response: created}),
      event.(%{type: "response.output_item.added", output_index: 0, item: item}),
      event.(%{
        type: "response.content_part.added",
        item_id: "msg_test",
        output_index: 0,
        content_index: 0,
        part: part
      })
    ]

    deltas =
      for piece <- pieces,
          do:
            event.(%{
              type: "response.output_text.delta",
              item_id: "msg_test",
              output_index: 0,
              content_index: 0,
              delta: piece,
              logprobs: []
            })

    done_part = %{part | text: text}
    done_item = %{item | status: "completed", content: [done_part]}

    stop = [
      event.(%{
        type: "response.output_text.done",
        item_id: "msg_test",
        output_index: 0,
        content_index: 0,
        text: text,
        logprobs: []
      }),
      event.(%{
        type: "response.content_part.done",
        item_id: "msg_test",
        output_index: 0,
        content_index: 0,
        part: done_part
      }),
      event.(%{type: "response.output_item.done", output_index: 0, item: done_item}),
      event.(%{type: "response.completed", response: response_object(text, [], "completed")})
    ]

    {start, deltas, stop}
  end

  @doc "The server-sent events of a streamed Responses API answer that calls one function."
  def response_call_events(name, args) do
    seq = :counters.new(1, [])

    event = fn data ->
      :counters.add(seq, 1, 1)
      data = Map.put(data, :sequence_number, :counters.get(seq, 1))
      "event: #{data.type}\ndata: #{JSON.encode!(data)}\n\n"
    end

    arguments = JSON.encode!(args)
    call_id = "call_#{System.unique_integer([:positive])}"

    item = %{
      type: "function_call",
      id: "fc_0",
      call_id: call_id,
      name: name,
      arguments: "",
      status: "in_progress"
    }

    done = %{item | arguments: arguments, status: "completed"}
    created = response_object("", [], "in_progress")
    completed = %{response_object("", [], "completed") | output: [done]}

    [
      event.(%{type: "response.created", response: created}),
      event.(%{type: "response.in_progress", response: created}),
      event.(%{type: "response.output_item.added", output_index: 0, item: item}),
      event.(%{
        type: "response.function_call_arguments.delta",
        item_id: "fc_0",
        output_index: 0,
        delta: arguments
      }),
      event.(%{
        type: "response.function_call_arguments.done",
        item_id: "fc_0",
        output_index: 0,
        arguments: arguments
      }),
      event.(%{type: "response.output_item.done", output_index: 0, item: done}),
      event.(%{type: "response.completed", response: completed})
    ]
  end
end
