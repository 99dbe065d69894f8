"""Tool calling through the official `openai` package.

Usage: openai_tools.py BASE_URL [MODEL]

Runs the scenarios of tests/tests/tool_calls.rs with the real client and
prints one JSON object of what it saw: a forced call (`required`), speculation
on and off; the same call streamed and joined by the SDK's own stream
helper; a named call; `parallel_tool_calls: false`; the round trip (call →
tool result → answer), streamed and not; and an `auto` turn. Exits non-zero
when the client raises where it should not.
"""

import json
import sys

import openai

base = sys.argv[1]
client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
# The served id (the model may have been named by its catalog name).
model = client.models.list().data[0].id
out = {}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The local time in a time zone.",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string"}},
                "required": ["zone"],
            },
        },
    },
]
ASK = [{"role": "user", "content": "What is the weather like in Paris right now, in celsius?"}]


def calls_of(message):
    return [
        {"id": c.id, "type": c.type, "name": c.function.name, "arguments": c.function.arguments}
        for c in (message.tool_calls or [])
    ]


def ask(messages, speculation="auto", **kw):
    r = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=TOOLS,
        temperature=0,
        max_tokens=80,
        extra_body={"speculation": speculation},
        **kw,
    )
    c = r.choices[0]
    extra = r.model_extra or {}
    return {
        "finish_reason": c.finish_reason,
        "content": c.message.content,
        "calls": calls_of(c.message),
        "specmesh": extra.get("specmesh"),
    }


# A forced call, speculation on and off.
out["required"] = {s: ask(ASK, s, tool_choice="required") for s in ["auto", "off"]}

# The same, streamed: the SDK's stream helper joins the deltas.
with client.chat.completions.stream(
    model=model,
    messages=ASK,
    tools=TOOLS,
    tool_choice="required",
    temperature=0,
    max_tokens=80,
) as stream:
    for _ in stream:
        pass
    final = stream.get_final_completion()
out["required_stream"] = {
    "finish_reason": final.choices[0].finish_reason,
    "calls": calls_of(final.choices[0].message),
}

# A named tool, and one call only.
out["named"] = ask(
    [{"role": "user", "content": "What time is it in Tokyo?"}],
    tool_choice={"type": "function", "function": {"name": "get_time"}},
)
out["single"] = ask(
    [{"role": "user", "content": "Weather in Paris and in Rome, in celsius?"}],
    tool_choice="required",
    parallel_tool_calls=False,
)

# The round trip: the call, its result, the answer (streamed and not).
first = out["required"]["auto"]
history = ASK + [
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in first["calls"]
        ],
    }
] + [
    {"role": "tool", "tool_call_id": c["id"], "content": json.dumps({"temperature": 21, "sky": "sunny"})}
    for c in first["calls"]
]
out["answer"] = ask(history)
pieces = []
finish = None
for chunk in client.chat.completions.create(
    model=model, messages=history, tools=TOOLS, temperature=0, max_tokens=80, stream=True
):
    for choice in chunk.choices:
        if choice.delta.content:
            pieces.append(choice.delta.content)
        if choice.delta.tool_calls:
            pieces.append("<call>")
        finish = choice.finish_reason or finish
out["answer_stream"] = {"content": "".join(pieces), "finish_reason": finish}

# `auto`: the model chooses; whatever it calls is an offered tool.
out["auto"] = ask(ASK)
out["none"] = ask(ASK, tool_choice="none")

# Refusals.
try:
    client.chat.completions.create(
        model=model,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_stock"}},
    )
    out["unknown_tool"] = None
except openai.BadRequestError as e:
    out["unknown_tool"] = {"status": e.status_code, "param": e.param, "message": e.message}

print(json.dumps(out))
