"""Agents on the real SDKs against the proxy's transport: sessions, sizes, the
Responses API, upstream headers, enforcement.

Run by test/observatory_web/python_sdk_proxy_test.exs against stub upstreams that
pick their answer by the request's model name:

    sdk_proxy.py GATEWAY_URL AGENT_KEY AGENT_ID CONTROL_URL

CONTROL_URL takes "deactivate" / "activate" (the test then deactivates or activates
AGENT_ID as an operator would). Prints what the agents saw as JSON.
"""

import datetime
import json
import sys
import time
import urllib.request
import uuid

import anthropic
import openai

gateway, agent_key, agent_id, control_url = sys.argv[1:5]

gpt = openai.OpenAI(base_url=gateway + "/v1", api_key=agent_key, max_retries=0)
claude = anthropic.Anthropic(base_url=gateway, api_key=agent_key, max_retries=0)

CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": "read_file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]
CLAUDE_TOOLS = [
    {"name": "read_file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
]


def control(command):
    request = urllib.request.Request(
        control_url, data=command.encode(), method="POST", headers={"content-type": "text/plain"}
    )
    urllib.request.urlopen(request, timeout=10).read()


def now_system_prompt():
    # What many agents do: the current time and a request id in the system prompt.
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat()
    return f"You fix builds. Current time: {stamp}. Request {uuid.uuid4()}. Attempt {time.monotonic_ns()}."


def timestamped_sessions():
    """A healthy tool loop whose system prompt changes on every request."""
    messages = [{"role": "user", "content": "Fix the build."}]
    sessions = []
    for _turn in range(5):
        raw = gpt.chat.completions.with_raw_response.create(
            model="progress",
            messages=[{"role": "system", "content": now_system_prompt()}] + messages,
            tools=CHAT_TOOLS,
        )
        sessions.append(raw.headers.get("x-observatory-session-id"))
        message = raw.parse().choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": f"contents of {call.id}"})

    claude_sessions = []
    claude_messages = [{"role": "user", "content": "Fix the build."}]
    for _turn in range(5):
        raw = claude.messages.with_raw_response.create(
            model="progress",
            max_tokens=100,
            system=now_system_prompt(),
            messages=claude_messages,
            tools=CLAUDE_TOOLS,
        )
        claude_sessions.append(raw.headers.get("x-observatory-session-id"))
        answer = raw.parse()
        claude_messages.append({"role": "assistant", "content": [b.model_dump() for b in answer.content]})
        claude_messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": b.id, "content": f"contents of {b.id}"}
                    for b in answer.content
                    if b.type == "tool_use"
                ],
            }
        )
    return {"openai": sessions, "anthropic": claude_sessions}


def big_conversation():
    """Tool results of 150 KB each: past 2 MiB of conversation by the 15th turn."""
    messages = [{"role": "user", "content": "Summarize every log."}]
    statuses = []
    for turn in range(16):
        try:
            answer = gpt.chat.completions.create(model="big", messages=messages, tools=CHAT_TOOLS)
        except openai.APIStatusError as error:
            statuses.append(error.status_code)
            break
        statuses.append(200)
        message = answer.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            log = "".join(f"turn {turn} line {k}: all tests passed\n" for k in range(5_000))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": log[:150_000]})
    return {"statuses": statuses, "bytes": len(json.dumps(messages))}


def responses_loop(stream):
    """An agent on the Responses API that calls the same tool with the same arguments."""
    session = f"{agent_id}-responses-{'stream' if stream else 'plain'}"
    items = [{"role": "user", "content": "Fix the build."}]
    statuses = []
    for _turn in range(6):
        try:
            if stream:
                calls = []
                with gpt.responses.stream(
                    model="loop",
                    input=items,
                    tools=RESPONSES_TOOLS,
                    extra_headers={"X-Session-Id": session},
                ) as events:
                    for event in events:
                        if event.type == "response.output_item.done" and event.item.type == "function_call":
                            calls.append(event.item)
                    events.get_final_response()
            else:
                response = gpt.responses.create(
                    model="loop", input=items, tools=RESPONSES_TOOLS, extra_headers={"X-Session-Id": session}
                )
                calls = [item for item in response.output if item.type == "function_call"]
        except openai.APIStatusError as error:
            statuses.append(error.status_code)
            break
        statuses.append(200)
        for call in calls:
            items.append(
                {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments}
            )
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": "error: no such file"})
    return {"session": session, "statuses": statuses}


def rate_limited():
    seen = {}
    try:
        gpt.chat.completions.create(model="rate-limited", messages=[{"role": "user", "content": "hi"}])
    except openai.RateLimitError as error:
        seen["openai"] = {
            "status": error.status_code,
            "request_id": error.request_id,
            "retry_after": error.response.headers.get("retry-after"),
            "remaining": error.response.headers.get("x-ratelimit-remaining-requests"),
            "session": error.response.headers.get("x-observatory-session-id"),
        }
    try:
        claude.messages.create(model="rate-limited", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    except anthropic.RateLimitError as error:
        seen["anthropic"] = {
            "status": error.status_code,
            "request_id": error.request_id,
            "retry_after": error.response.headers.get("retry-after"),
            "remaining": error.response.headers.get("anthropic-ratelimit-requests-remaining"),
        }
    return seen


def blocked_session():
    """The same call with the same result, turn after turn: the step detector blocks it."""
    session = f"{agent_id}-blocked"
    messages = [{"role": "user", "content": "Fix the build."}]
    statuses, message_text = [], None
    for _turn in range(10):
        try:
            answer = gpt.chat.completions.create(
                model="loop", messages=messages, tools=CHAT_TOOLS, extra_headers={"X-Session-Id": session}
            )
        except openai.PermissionDeniedError as error:
            statuses.append(error.status_code)
            message_text = error.message
            break
        statuses.append(200)
        message = answer.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "error: no such file"})
    return {"session": session, "statuses": statuses, "message": message_text}


def deactivated_streams():
    """A stream open when an operator deactivates the agent ends at once, with an error."""
    seen = {}

    def run(name, open_stream, texts_of):
        pieces, started = [], time.monotonic()
        try:
            for text in texts_of(open_stream()):
                pieces.append(text)
                if len(pieces) == 1:
                    started = time.monotonic()
                    control("deactivate")
            seen[name] = {"pieces": pieces, "error": None}
        except (openai.APIError, anthropic.APIError) as error:
            seen[name] = {
                "pieces": pieces,
                "error": type(error).__name__,
                "message": str(error),
                "seconds_after_deactivation": round(time.monotonic() - started, 3),
            }
        control("activate")

    def chat_texts(stream):
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                yield chunk.choices[0].delta.content

    run(
        "openai",
        lambda: gpt.chat.completions.create(model="held", stream=True, messages=[{"role": "user", "content": "hi"}]),
        chat_texts,
    )

    def response_texts(stream):
        for event in stream:
            if event.type == "response.output_text.delta":
                yield event.delta

    run("responses", lambda: gpt.responses.create(model="held", stream=True, input="hi"), response_texts)

    def claude_texts(stream):
        with stream as events:
            yield from events.text_stream

    run(
        "anthropic",
        lambda: claude.messages.stream(model="held", max_tokens=10, messages=[{"role": "user", "content": "hi"}]),
        claude_texts,
    )
    return seen


print(
    json.dumps(
        {
            "timestamped": timestamped_sessions(),
            "big": big_conversation(),
            "responses_plain": responses_loop(stream=False),
            "responses_stream": responses_loop(stream=True),
            "rate_limited": rate_limited(),
            "blocked": blocked_session(),
            "deactivated": deactivated_streams(),
        }
    )
)
