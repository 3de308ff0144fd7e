"""Two agents built on the real SDKs, pointed at Observatory's proxy.

Run by test/observatory_web/python_sdk_test.exs against stub upstreams:

    sdk_agents.py GATEWAY_URL AGENT_KEY AGENT_ID RELEASE_URL

AGENT_KEY is AGENT_ID's own key (issued by an operator); the SDKs send only it.

Each agent makes a plain request, a streamed one, and then loops: it calls the same
tool with the same arguments on every turn, the way a stuck agent does. The stub
upstream holds each stream after its first piece until RELEASE_URL is called, which
this script does only once it has that first piece in hand: a proxy that buffered
whole answers would never deliver it. Prints what it saw as JSON.
"""

import json
import sys
import urllib.request

import anthropic
import openai

gateway, agent_key, agent_id, release_url = sys.argv[1:5]


def release(which):
    request = urllib.request.Request(
        release_url, data=which.encode(), method="POST", headers={"content-type": "text/plain"}
    )
    urllib.request.urlopen(request, timeout=10).read()


def openai_agent():
    client = openai.OpenAI(
        base_url=gateway + "/v1",
        api_key=agent_key,  # the agent's own key: it names the agent
        max_retries=0,
    )
    seen = {}
    plain = client.chat.completions.create(
        model="test-model", messages=[{"role": "user", "content": "Say hello."}]
    )
    seen["plain"] = plain.choices[0].message.content

    pieces = []
    stream = client.chat.completions.create(
        model="test-model", messages=[{"role": "user", "content": "Stream hello."}], stream=True
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
            if len(pieces) == 1:
                release("openai")
    seen["stream"] = pieces

    tools = [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
    ]
    messages = [{"role": "user", "content": "Fix the build."}]
    session = agent_id + "-openai-loop"
    statuses = []
    for _turn in range(7):
        try:
            answer = client.chat.completions.create(
                model="test-model",
                messages=messages,
                tools=tools,
                extra_headers={"X-Session-Id": session},
            )
        except openai.APIStatusError as error:
            statuses.append(error.status_code)
            break
        statuses.append(200)
        message = answer.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": "error: no such file"}
            )
    seen["loop"] = {"session": session, "statuses": statuses}
    return seen


def anthropic_agent():
    client = anthropic.Anthropic(
        base_url=gateway,
        api_key=agent_key,  # sent as x-api-key; the agent's own key names it
        max_retries=0,
    )
    seen = {}
    plain = client.messages.create(
        model="claude-test", max_tokens=100, messages=[{"role": "user", "content": "Say hello."}]
    )
    seen["plain"] = plain.content[0].text

    pieces = []
    with client.messages.stream(
        model="claude-test", max_tokens=100, messages=[{"role": "user", "content": "Stream hello."}]
    ) as stream:
        for text in stream.text_stream:
            pieces.append(text)
            if len(pieces) == 1:
                release("anthropic")
        seen["final"] = stream.get_final_message().content[0].text
    seen["stream"] = pieces

    tools = [
        {
            "name": "read_file",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
        }
    ]
    messages = [{"role": "user", "content": "Fix the build."}]
    session = agent_id + "-anthropic-loop"
    statuses = []
    for _turn in range(7):
        try:
            answer = client.messages.create(
                model="claude-test",
                max_tokens=100,
                messages=messages,
                tools=tools,
                extra_headers={"X-Session-Id": session},
            )
        except anthropic.APIStatusError as error:
            statuses.append(error.status_code)
            break
        statuses.append(200)
        messages.append({"role": "assistant", "content": [b.model_dump() for b in answer.content]})
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": "error: no such file", "is_error": True}
            for b in answer.content
            if b.type == "tool_use"
        ]
        messages.append({"role": "user", "content": results})
    seen["loop"] = {"session": session, "statuses": statuses}
    return seen


print(json.dumps({"openai": openai_agent(), "anthropic": anthropic_agent()}))
