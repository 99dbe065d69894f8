"""The official `openai` client through a gateway's shutdown.

Usage: openai_drain.py BASE_URL MODEL

Starts a long and a short streaming completion (counting, which the
model continues for thousands of tokens). Once both have text it prints
`streaming` and waits for a line on stdin: the Rust test sends the gateway
SIGTERM, then writes that line. Then it reads both streams to their end
and prints one JSON object: per stream the characters received before the
line and in all, and its finish reason or the error the client raised
(class, code, message). A connection reset shows as `APIConnectionError`.
"""

import json
import sys
import threading

import openai

base, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
prompt = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
out = {}
texts = {"long": "", "short": ""}
started = {name: threading.Event() for name in texts}


def read(name, max_tokens):
    finish = None
    try:
        stream = client.completions.create(
            model=model, prompt=prompt, temperature=0, max_tokens=max_tokens, stream=True,
        )
        for chunk in stream:
            if chunk.choices:
                texts[name] += chunk.choices[0].text or ""
                finish = chunk.choices[0].finish_reason or finish
            if texts[name]:
                started[name].set()
        out[name] = {"finish_reason": finish}
    except openai.APIError as e:
        out[name] = {"error": type(e).__name__, "code": getattr(e, "code", None), "message": str(e)}
    finally:
        started[name].set()


threads = [
    threading.Thread(target=read, args=("long", 4000)),
    threading.Thread(target=read, args=("short", 48)),
]
for t in threads:
    t.start()
for e in started.values():
    e.wait(60)
print("streaming", flush=True)
sys.stdin.readline()
at_signal = {name: len(text) for name, text in texts.items()}
for t in threads:
    t.join(120)
for name in texts:
    out[name]["chars_at_signal"] = at_signal[name]
    out[name]["chars"] = len(texts[name])
print(json.dumps(out), flush=True)
