"""Tool-calling agents on the real SDKs, pointed at Observatory's proxy.

Run by test/observatory_web/python_sdk_test.exs against a stub upstream that plays
the model:

    sdk_tool_agents.py GATEWAY_URL PLAN_JSON

PLAN_JSON is a list of runs: {"api": "openai" | "anthropic", "key": the agent's own
key, "session": its X-Session-Id, "task": the first user message, "turns": how many
model calls at most, "tools": "files" | "broken"}. Each run is the loop every
tool-using agent has: call the model (streamed on odd turns, plain on even ones), run
the tools it asks for, send their results back with the whole conversation, again.
The "files" tool answers each file with its own text (the texts differ only in their
numbers); the "broken" tool answers every call with the same error. A run stops at
its turn budget or at the first refused request. Prints, per run, the status of each
request and the refused one's error code, as JSON.
"""

import json
import sys

import anthropic
import openai

gateway, plan = sys.argv[1], json.loads(sys.argv[2])


def run_tool(kind, name, arguments):
    path = arguments.get("path", "")
    if kind == "broken":
        return "error: no such file: " + path
    n = "".join(ch for ch in path if ch.isdigit()) or "0"
    return f"def handler_{n}(request):\n    return route(request, {n})\n"


def openai_run(run):
    client = openai.OpenAI(base_url=gateway + "/v1", api_key=run["key"], max_retries=0)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
    ]
    messages = [{"role": "user", "content": run["task"]}]
    seen = {"statuses": [], "error": None}
    for turn in range(run["turns"]):
        args = dict(
            model="test-model",
            messages=messages,
            tools=tools,
            extra_headers={"X-Session-Id": run["session"]},
        )
        try:
            if turn % 2:
                calls = {}
                for chunk in client.chat.completions.create(stream=True, **args):
                    for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                        call = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
                        call["id"] = delta.id or call["id"]
                        if delta.function:
                            call["name"] += delta.function.name or ""
                            call["arguments"] += delta.function.arguments or ""
                calls = [calls[i] for i in sorted(calls)]
            else:
                message = client.chat.completions.create(**args).choices[0].message
                calls = [
                    {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                    for c in message.tool_calls or []
                ]
        except openai.APIStatusError as error:
            seen["statuses"].append(error.status_code)
            seen["error"] = error.body.get("code") if isinstance(error.body, dict) else None
            break
        seen["statuses"].append(200)
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["arguments"]},
                    }
                    for c in calls
                ],
            }
        )
        for c in calls:
            result = run_tool(run["tools"], c["name"], json.loads(c["arguments"]))
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": result})
    return seen


def anthropic_run(run):
    client = anthropic.Anthropic(base_url=gateway, api_key=run["key"], max_retries=0)
    tools = [
        {
            "name": "read_file",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
        }
    ]
    messages = [{"role": "user", "content": run["task"]}]
    seen = {"statuses": [], "error": None}
    for turn in range(run["turns"]):
        args = dict(
            model="claude-test",
            max_tokens=256,
            messages=messages,
            tools=tools,
            extra_headers={"X-Session-Id": run["session"]},
        )
        try:
            if turn % 2:
                with client.messages.stream(**args) as stream:
                    answer = stream.get_final_message()
            else:
                answer = client.messages.create(**args)
        except anthropic.APIStatusError as error:
            seen["statuses"].append(error.status_code)
            seen["error"] = error.body.get("error", {}).get("message") if isinstance(error.body, dict) else None
            break
        seen["statuses"].append(200)
        messages.append({"role": "assistant", "content": [b.model_dump() for b in answer.content]})
        results = [
            {
                "type": "tool_result",
                "tool_use_id": b.id,
                "content": run_tool(run["tools"], b.name, b.input),
                "is_error": run["tools"] == "broken",
            }
            for b in answer.content
            if b.type == "tool_use"
        ]
        messages.append({"role": "user", "content": results})
    return seen


print(json.dumps([openai_run(r) if r["api"] == "openai" else anthropic_run(r) for r in plan]))
