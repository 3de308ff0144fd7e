"""Tool-calling agents on the real SDKs — openai Chat Completions, openai Responses,
anthropic Messages — pointed at Observatory's proxy.

Run by test/observatory_web/python_sdk_graded_test.exs against a stub upstream that
plays the model:

    sdk_graded.py GATEWAY_URL PLAN_JSON

PLAN_JSON is a list of runs: {"api": "chat" | "responses" | "anthropic", "key": the
agent's own key, "session": its X-Session-Id, "task": the first user message, "turns":
model calls at most, "stream": "always" | "never" | "odd" (odd turns streamed),
"max_retries": the SDK's (its default is 2)}. Each run is the loop every tool-using agent
has: call the model, run the read_file calls it asks for (build.log does not exist;
every other file answers its own text), send the results back with the whole
conversation, again. A run stops at its turn budget or at the first refused request.
Prints, per run, the status of each request and the refused one's error (OpenAI's
`code`, Anthropic's `message`), as JSON.
"""

import json
import sys

import anthropic
import openai

gateway, plan = sys.argv[1], json.loads(sys.argv[2])


def read_file(path):
    if path == "build.log":
        return "error: no such file: build.log"
    n = "".join(ch for ch in path if ch.isdigit()) or "0"
    return f"def handler_{n}(request):\n    return route(request, {n})\n"


def streamed(run, turn):
    return run["stream"] == "always" or (run["stream"] == "odd" and turn % 2 == 1)


TOOL = {
    "name": "read_file",
    "description": "Read a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}


def chat_run(run, seen):
    client = openai.OpenAI(base_url=gateway + "/v1", api_key=run["key"], max_retries=run["max_retries"])
    messages = [{"role": "user", "content": run["task"]}]
    for turn in range(run["turns"]):
        args = dict(
            model="gpt-test",
            messages=messages,
            tools=[{"type": "function", "function": TOOL}],
            extra_headers={"X-Session-Id": run["session"]},
        )
        try:
            if streamed(run, turn):
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
            return
        seen["statuses"].append(200)
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                    for c in calls
                ],
            }
        )
        for c in calls:
            result = read_file(json.loads(c["arguments"]).get("path", ""))
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": result})


def responses_run(run, seen):
    client = openai.OpenAI(base_url=gateway + "/v1", api_key=run["key"], max_retries=run["max_retries"])
    items = [{"role": "user", "content": run["task"]}]
    tool = dict(TOOL, type="function")
    for turn in range(run["turns"]):
        args = dict(model="gpt-test", input=items, tools=[tool], extra_headers={"X-Session-Id": run["session"]})
        try:
            if streamed(run, turn):
                response = None
                for event in client.responses.create(stream=True, **args):
                    if event.type == "response.completed":
                        response = event.response
            else:
                response = client.responses.create(**args)
        except openai.APIStatusError as error:
            seen["statuses"].append(error.status_code)
            seen["error"] = error.body.get("code") if isinstance(error.body, dict) else None
            return
        seen["statuses"].append(200)
        calls = [item for item in response.output if item.type == "function_call"]
        for call in calls:
            items.append(
                {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments}
            )
        for call in calls:
            result = read_file(json.loads(call.arguments).get("path", ""))
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": result})


def anthropic_run(run, seen):
    client = anthropic.Anthropic(base_url=gateway, api_key=run["key"], max_retries=run["max_retries"])
    tool = {"name": TOOL["name"], "description": TOOL["description"], "input_schema": TOOL["parameters"]}
    messages = [{"role": "user", "content": run["task"]}]
    for turn in range(run["turns"]):
        args = dict(
            model="claude-test",
            max_tokens=256,
            messages=messages,
            tools=[tool],
            extra_headers={"X-Session-Id": run["session"]},
        )
        try:
            if streamed(run, turn):
                with client.messages.stream(**args) as stream:
                    answer = stream.get_final_message()
            else:
                answer = client.messages.create(**args)
        except anthropic.APIStatusError as error:
            seen["statuses"].append(error.status_code)
            body = error.body if isinstance(error.body, dict) else {}
            seen["error"] = body.get("error", {}).get("message")
            return
        seen["statuses"].append(200)
        messages.append({"role": "assistant", "content": [b.model_dump() for b in answer.content]})
        results = [
            {
                "type": "tool_result",
                "tool_use_id": b.id,
                "content": read_file(b.input.get("path", "")),
            }
            for b in answer.content
            if b.type == "tool_use"
        ]
        messages.append({"role": "user", "content": results})


RUNNERS = {"chat": chat_run, "responses": responses_run, "anthropic": anthropic_run}

out = []
for run in plan:
    seen = {"statuses": [], "error": None}
    RUNNERS[run["api"]](run, seen)
    out.append(seen)
print(json.dumps(out))
