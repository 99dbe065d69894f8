"""Structured outputs and logprobs through the official `openai` package.

Usage: openai_structured.py BASE_URL MODEL

Runs the scenarios of tests/tests/structured_outputs.rs with the real
client and prints one JSON object of what it saw: `parse` with a pydantic
model (speculation on and off), a JSON object streamed, logprobs on chat
(on and off) and the legacy completions shape, and the refusals of bad and
hostile schemas. Exits non-zero when the client raises where it should not.
"""

import json
import sys
import urllib.request
from typing import Literal

import openai
import pydantic

base, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
out = {}


class Trip(pydantic.BaseModel):
    city: str
    days: int
    mode: Literal["train", "plane", "car"]


asks = [
    "Plan a trip: where, how many days, and how to travel? Answer in JSON.",
    "I want to visit Rome for a week by train. Give the plan as JSON.",
    "Describe a weekend getaway as JSON.",
    "Suggest a long holiday by plane, in JSON.",
]
parsed = []
for ask in asks:
    row = {}
    for spec in ["auto", "off"]:
        r = client.chat.completions.parse(
            model=model,
            messages=[{"role": "user", "content": ask}],
            response_format=Trip,
            temperature=0,
            max_tokens=80,
            extra_body={"speculation": spec},
        )
        c = r.choices[0]
        row[spec] = {
            "text": c.message.content,
            "parsed": c.message.parsed.model_dump() if c.message.parsed else None,
            "finish_reason": c.finish_reason,
            "specmesh": (r.model_extra or {}).get("specmesh"),
        }
    parsed.append(row)
out["parsed"] = parsed

text, finish = "", None
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Give a JSON object describing a cat."}],
    response_format={"type": "json_object"},
    temperature=0,
    max_tokens=60,
    stream=True,
)
for chunk in stream:
    if chunk.choices:
        text += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
out["json_object"] = {"text": text, "finish_reason": finish}

logprobs = {}
for spec in ["auto", "off"]:
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Name three colors of the rainbow."}],
        temperature=0,
        max_tokens=24,
        logprobs=True,
        top_logprobs=3,
        extra_body={"speculation": spec},
    )
    c = r.choices[0]
    logprobs[spec] = {
        "text": c.message.content,
        "content": [t.model_dump() for t in c.logprobs.content],
    }
out["logprobs"] = logprobs

tokens = []
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Name three colors of the rainbow."}],
    temperature=0,
    max_tokens=24,
    logprobs=True,
    top_logprobs=2,
    stream=True,
)
for chunk in stream:
    if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
        tokens += [t.model_dump() for t in chunk.choices[0].logprobs.content]
out["logprobs_stream"] = tokens

r = client.completions.create(model=model, prompt="def fibonacci(n):", temperature=0, max_tokens=12, logprobs=2)
out["completion_logprobs"] = {"text": r.choices[0].text, "logprobs": r.choices[0].logprobs.model_dump()}

refusals = {}
bad = {
    "unknown_type": {"type": "object", "properties": {"a": {"type": "strnig"}}},
    "not_satisfiable": {"type": "integer", "minimum": 5, "maximum": 1},
    "huge": {"enum": ["x" * 64] * 4000},
}
for name, schema in bad.items():
    try:
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema}},
            max_tokens=8,
        )
        refusals[name] = None
    except openai.BadRequestError as e:
        refusals[name] = {"status": e.status_code, "param": e.param, "message": e.message}
# SmolLM2's chat template declares no tools: offering them is refused.
try:
    client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
        max_tokens=8,
    )
    refusals["tools"] = None
except openai.BadRequestError as e:
    refusals["tools"] = {"status": e.status_code, "param": e.param, "message": e.message}
out["refusals"] = refusals

# What benchmark clients read: the model's length, token counts, and the
# acceptance in vLLM's per-request shape.
m = client.models.list().data[0]
out["model"] = {"root": m.model_extra.get("root"), "max_model_len": m.model_extra.get("max_model_len")}


def post(path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


tok = post("/tokenize", {"model": model, "prompt": "Hello world, hello mesh."})
out["tokenize"] = tok
out["detokenize"] = post("/detokenize", {"model": model, "tokens": tok["tokens"]})
out["tokenize_chat"] = post("/tokenize", {"model": model, "messages": [{"role": "user", "content": "hi"}]})
metrics = None
stream = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Count from one to ten in words."}],
    temperature=0, max_tokens=40, stream=True, stream_options={"include_usage": True},
)
for chunk in stream:
    if chunk.usage is not None:
        metrics = (chunk.model_extra or {}).get("metrics")
out["stream_metrics"] = metrics

print(json.dumps(out))
