"""A harness written against the gateway's contract alone, with the standard library (run inside a sandbox).

It does what harnesses do: OpenAI Chat Completions with tools, streamed and not, then Anthropic
Messages, each call carrying the conversation so far (the replies as the gateway gave them), then
it writes the task's answer itself and exits 0. argv[1]: the word to write into /app/answer.txt.
"""

import json
import os
import sys
import urllib.request

BASE, KEY = os.environ["T1_GATEWAY_URL"], os.environ["OPENAI_API_KEY"]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def post(path, body, headers):
    req = urllib.request.Request(
        BASE + path, json.dumps(body).encode(), {"content-type": "application/json", **headers}
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        return resp.read().decode()


def openai(messages, stream):
    raw = post("/v1/chat/completions", {"model": os.environ["T1_MODEL"], "messages": messages, "tools": TOOLS,
                                        "max_tokens": 12, "temperature": 0.7, "stream": stream,
                                        "stream_options": {"include_usage": True}},
               {"authorization": "Bearer " + KEY})
    if not stream:
        return json.loads(raw)["choices"][0]["message"]
    msg = {"role": "assistant", "content": "", "tool_calls": []}
    for line in raw.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for choice in chunk["choices"]:
            delta = choice["delta"]
            msg["content"] += delta.get("content") or ""
            msg["tool_calls"] += [{k: v for k, v in t.items() if k != "index"} for t in delta.get("tool_calls", [])]
    if not msg["tool_calls"]:
        del msg["tool_calls"]
    return msg


with open(os.environ["T1_INSTRUCTION_FILE"]) as f:
    instruction = f.read()
messages = [{"role": "system", "content": "You are a test harness."}, {"role": "user", "content": instruction}]
for i, stream in enumerate((False, True, True)):
    messages.append(openai(messages, stream))
    messages.append({"role": "user", "content": f"observation {i}"})
# The same conversation in Anthropic's form continues the same segment.
blocks = []
for m in messages[1:]:
    blocks.append({"role": m["role"], "content": [{"type": "text", "text": m["content"]}]})
tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
          "input_schema": t["function"]["parameters"]} for t in TOOLS]
answer = json.loads(post("/v1/messages", {"model": "t1", "system": messages[0]["content"], "messages": blocks,
                                          "tools": tools, "max_tokens": 12}, {"x-api-key": KEY}))
assert answer["type"] == "message" and answer["content"], answer
with open("/app/answer.txt", "w") as f:
    f.write(sys.argv[1] + "\n")
print("harness done:", len(messages) // 2, "calls")
