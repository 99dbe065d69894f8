"""The official `openai` package against specmesh's HTTP front.

Usage: openai_client.py BASE_URL MODEL

Runs each scenario of tests/tests/http_openai.rs with the real client and
prints one JSON object of what it saw; the Rust test compares it with the
gRPC API's answers and the verifier's KV. Exits non-zero when the client
raises where it should not.
"""

import json
import sys

import openai

base, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
out = {}

out["models"] = [m.id for m in client.models.list().data]

ask = [{"role": "user", "content": "Name three colors of the rainbow."}]
r = client.chat.completions.create(model=model, messages=ask, temperature=0, max_tokens=32)
out["chat"] = {
    "text": r.choices[0].message.content,
    "finish_reason": r.choices[0].finish_reason,
    "usage": r.usage.model_dump(),
    "object": r.object,
}

text, usage, finish = "", None, None
stream = client.chat.completions.create(
    model=model, messages=ask, temperature=0, max_tokens=32, stream=True,
    stream_options={"include_usage": True},
)
for chunk in stream:
    if chunk.choices:
        text += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    if chunk.usage is not None:
        usage = chunk.usage.model_dump()
out["stream"] = {"text": text, "usage": usage, "finish_reason": finish}

r = client.completions.create(model=model, prompt="def fibonacci(n):", temperature=0, max_tokens=24)
out["completion"] = {"text": r.choices[0].text, "finish_reason": r.choices[0].finish_reason}

# A stop string taken from the greedy answer: the answer ends before it.
words = out["chat"]["text"].split()
stop = " ".join(words[2:4]) if len(words) >= 4 else out["chat"]["text"][-4:]
r = client.chat.completions.create(model=model, messages=ask, temperature=0, max_tokens=32, stop=[stop])
out["stop"] = {"stop": stop, "text": r.choices[0].message.content, "finish_reason": r.choices[0].finish_reason}

sampled = []
for _ in range(2):
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Write a sentence about cats."}],
        temperature=0.9, seed=42, max_tokens=24,
    )
    sampled.append(r.choices[0].message.content)
out["seeded"] = sampled

errors = {}
for name, kwargs in {
    "n": {"model": model, "messages": ask, "n": 2},
    "role": {"model": model, "messages": [{"role": "function", "name": "f", "content": "x"}]},
    "model": {"model": "gpt-4o", "messages": ask},
    "context": {"model": model, "messages": ask, "max_tokens": 1_000_000},
}.items():
    try:
        client.chat.completions.create(**kwargs)
        errors[name] = None
    except openai.APIStatusError as e:
        errors[name] = {"status": e.status_code, "body": e.body}
out["errors"] = errors

r = client.chat.completions.create(
    model=model, messages=ask, temperature=0, max_tokens=32,
    prediction={"type": "content", "content": out["chat"]["text"]},
)
out["prediction"] = {"text": r.choices[0].message.content, "usage": r.usage.model_dump()}

# A long stream the client walks away from after three chunks.
stream = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Count from one to one thousand in words."}],
    temperature=0, max_tokens=2000, stream=True,
)
seen = 0
for chunk in stream:
    seen += 1
    if seen == 3:
        break
stream.close()
out["cancelled_after_chunks"] = seen

print(json.dumps(out))
