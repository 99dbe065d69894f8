#!/usr/bin/env python3
"""Generate reference fixtures for specmesh from an independent implementation.

The reference implementation is llama.cpp, driven through the PyPI package
llama-cpp-python (CPU build). CI never runs this script: it only reads the JSON
files this script writes and that are committed to the repository.

Produces
--------
1. crates/tokenizer/tests/fixtures/tokenizer_reference.json
     {"model_sha256", "reference", "cases": [...]}
     * kind "raw":  {"name", "kind", "text", "parse_special", "ids"}
         ids = llama.cpp tokenize(text, add_bos=False, special=parse_special)
     * kind "chat": {"name", "kind", "messages", "rendered", "ids"}
         rendered = the GGUF's `tokenizer.chat_template` rendered the way HF
         transformers' apply_chat_template(add_generation_prompt=True) does
         (jinja2 ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
         bos_token/eos_token = token strings of the GGUF's bos/eos ids);
         ids = llama.cpp tokenize(rendered, add_bos=False, special=True)

2. crates/model/tests/fixtures/logits_reference.json
     {"model_sha256", "reference", "n_threads", "teacher_forced": [...], "greedy": [...]}
     * teacher_forced: {"name", "token_ids", "top"}; the whole sequence is
       evaluated in ONE batch (logits_all, n_ctx=2048, n_batch=512); "top"[i]
       holds the 20 highest raw logits after position i, as [token_id, logit]
       pairs sorted by logit descending (logits rounded to 5 decimals).
     * greedy: {"name", "messages", "prompt_ids", "continuation",
       "continuation_text", "top2_margin"}; fresh context per prompt, prompt
       evaluated in one batch, then one token per step; next token = argmax of
       the raw logits (ties -> lowest id; temperature 0 / top_k=1, no
       repetition penalty), at most 64 new tokens, stopping after (and
       including) EOS id or <|im_end|>. top2_margin[i] = logit(top1) -
       logit(top2) at step i (rounded to 4 decimals), so a consumer can tell
       where a near-tie makes divergence legitimate. batch_top1[i] = the
       top-1 token after continuation step i when prompt + continuation are
       evaluated in ONE batch: its agreement with `continuation` (decoded one
       token per forward) is llama.cpp's agreement with itself along its own
       greedy path.

How to run
----------
    VENV=$(tools/reference/setup.sh | tail -n1)
    $VENV/bin/python tools/reference/make_fixtures.py \
        --model ~/.cache/specmesh/models/SmolLM2-135M-Instruct.Q4_1.gguf

Options: --only tokenizer|logits|compare, --out-root DIR (repo root, default: the
repository containing this script), --compare-transformers (if the optional
`transformers` + `tokenizers` packages are importable, print where HF's GGUF
tokenizer conversion disagrees with llama.cpp; informational only; not in
requirements.txt. `--only compare` needs no llama_cpp: it re-reads the
committed tokenizer fixture, so it can run from a separate venv with
transformers==5.24.0 gguf jinja2 numpy; torch is not needed).

The committed fixtures: SmolLM2-135M-Instruct GGUF Q4_1 (sha256
b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53, no --name),
and the Qwen2.5-Coder pair (`specmesh model fetch qwen2.5-coder-0.5b
qwen2.5-coder-1.5b`): the tokenizer fixture from the 0.5B with
`--only tokenizer --name qwen2.5-coder` (both share one tokenizer), the
logits fixtures with `--only logits --name qwen2.5-coder-0.5b` and
`--name qwen2.5-coder-1.5b`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
TOKENIZER_FIXTURE = Path("crates/tokenizer/tests/fixtures/tokenizer_reference.json")
LOGITS_FIXTURE = Path("crates/model/tests/fixtures/logits_reference.json")


def named(path: Path, name: str | None) -> Path:
    """`tokenizer_reference.json` -> `tokenizer_reference_NAME.json`."""
    return path if not name else path.with_name(f"{path.stem}_{name}{path.suffix}")

N_THREADS = 2
N_CTX = 2048
N_BATCH = 512
TOP_K = 20
MAX_NEW_TOKENS = 64

# --------------------------------------------------------------------------
# Tokenizer cases
# --------------------------------------------------------------------------

PY_CODE = '''def fib(n: int) -> int:
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


if __name__ == "__main__":
    print([fib(i) for i in range(10)])
'''

RUST_CODE = '''impl<T: Clone> Stack<T> {
    pub fn push(&mut self, item: T) -> Result<(), Error> {
        if self.items.len() >= self.cap { return Err(Error::Full); }
        self.items.push(item);
        Ok(())
    }
}
'''

JSON_CODE = '''{
  "name": "specmesh",
  "version": "0.1.0",
  "tags": ["llm", "decoding"],
  "ratio": 0.75,
  "nested": {"ok": true, "n": null}
}'''

# (name, text, parse_special)
RAW_CASES: list[tuple[str, str, bool]] = [
    ("empty", "", False),
    ("single_char", "a", False),
    ("ascii_sentence", "The quick brown fox jumps over the lazy dog.", False),
    ("ascii_sentences_punct", "Hello, world! How are you today? I'm fine; thanks (mostly).", False),
    ("leading_space", " hello world", False),
    ("trailing_space", "hello world ", False),
    ("leading_trailing_multi_space", "   padded on both sides   ", False),
    ("space_runs", "a  b   c    d     e", False),
    ("only_spaces", "     ", False),
    ("tabs", "\tindented\twith\t\ttabs\t", False),
    ("mixed_ws", "col1 \t col2\t \tcol3  \n  next", False),
    ("newline_single", "line one\nline two", False),
    ("newline_triple", "para one\n\n\npara two\n", False),
    ("only_newlines", "\n\n\n", False),
    ("crlf", "windows\r\nline endings\r\n\r\nend", False),
    ("space_before_newline", "trailing   \nnext line \n", False),
    ("accents", "café naïve Ångström résumé façade coöperate", False),
    ("german", "Größere Häuser müssen über die Straße gebaut werden.", False),
    ("french", "L'été dernier, nous sommes allés à la plage où il faisait très chaud.", False),
    ("spanish", "¿Dónde está la biblioteca? ¡Mañana será otro día, señor!", False),
    ("chinese", "我们今天去公园散步，天气非常好。", False),
    ("japanese", "こんにちは、カタカナとひらがなと漢字を混ぜた文章です。", False),
    ("korean", "안녕하세요. 오늘 날씨가 정말 좋네요!", False),
    ("emoji", "I love pizza 🍕 and cats 🐱!", False),
    ("emoji_zwj_flags", "family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 skin 👍🏽 heart ❤️", False),
    ("numbers_int", "12345", False),
    ("numbers_float", "pi is 3.14159 and e is 2.71828", False),
    ("numbers_grouped", "1,000,000 people paid $1,234.56 each", False),
    ("dates_times", "2024-01-15T10:30:00Z, 15/01/2024, Jan 15th 2024 at 9:05pm", False),
    ("digits_long_run", "0123456789012345678901234567890", False),
    ("numbers_unicode", "x² + ½ − Ⅻ and ١٢٣ and ３４５", False),
    # whitespace runs directly before a digit: llama.cpp's `smollm` pre-tokenizer
    # (digits isolated first, then the gpt2 regex) keeps "  " as one piece,
    # whereas a plain gpt2 regex would split it into " " + " 5".
    ("digits_after_space_runs", "a  5 b   12 c\t 7 d\n 8 e    99", False),
    ("digits_after_unicode_spaces", "cost:\u00a05, 10\u00a0000 and\u2009 3\u3000 4", False),
    ("numerals_after_space", "page ٣ and ½ cup, chapter Ⅻ, ２ items", False),
    ("code_python", PY_CODE, False),
    ("code_rust", RUST_CODE, False),
    ("code_json", JSON_CODE, False),
    ("url", "Visit https://example.com/path/to/page?query=1&lang=en#section or http://a.b.co:8080/x_y-z.", False),
    ("email_path", "mail me at first.last+tag@example.org; see /usr/local/bin/python3.11", False),
    ("contractions", "don't won't it's we've they're I'm you'd she'll", False),
    ("contractions_upper", "I'LL DON'T IT'S WE'VE THEY'RE", False),
    ("apostrophe_curly", "It’s the dog’s bone — isn’t it?", False),
    ("mixed_scripts", "English, русский, العربية, עברית, हिन्दी, ελληνικά, 中文 mixed.", False),
    ("long_word", "Pneumonoultramicroscopicsilicovolcanoconiosis", False),
    ("very_long_token_run", "abcdefghij" * 20, False),
    ("punct_runs", "Wait... what?!?! ---- *** ### ((( ))) <<>> ~~~", False),
    ("markdown", "# Title\n\n- item **bold** _it_\n- `code`\n\n| a | b |\n|---|---|", False),
    ("special_im_start_parsed", "<|im_start|>user\nHello!<|im_end|>\n", True),
    ("special_im_start_unparsed", "<|im_start|>user\nHello!<|im_end|>\n", False),
    ("special_embedded_parsed", "before<|im_start|>after <|im_end|> tail", True),
    ("special_embedded_unparsed", "before<|im_start|>after <|im_end|> tail", False),
    ("special_endoftext_parsed", "end of doc<|endoftext|>next doc", True),
    ("special_endoftext_unparsed", "end of doc<|endoftext|>next doc", False),
    ("special_partial_parsed", "<|im_start user <|im_end| |im_start|>", True),
    ("special_spaces_parsed", "  <|im_start|>  spaced  <|im_end|>  ", True),
]

# (name, messages)
CHAT_CASES: list[tuple[str, list[dict]]] = [
    ("chat_user_only", [{"role": "user", "content": "What is the capital of France?"}]),
    ("chat_system_user", [
        {"role": "system", "content": "You are a terse assistant. Answer in one word."},
        {"role": "user", "content": "Name a primary color."},
    ]),
    ("chat_multi_turn", [
        {"role": "user", "content": "Hi! Can you help me plan a trip?"},
        {"role": "assistant", "content": "Of course. Where would you like to go, and for how long?"},
        {"role": "user", "content": "Lisbon, for 3 days in May."},
    ]),
    ("chat_unicode", [
        {"role": "user", "content": "Traduis « café crème » en 日本語 et 한국어, s'il te plaît 🙏"},
    ]),
    ("chat_code_newlines", [
        {"role": "system", "content": "You are a helpful coding assistant.\nAlways use Python 3."},
        {"role": "user", "content": "Fix this:\n\n```python\ndef add(a, b):\n\treturn a - b\n```\n\nThanks!"},
    ]),
    ("chat_numbers", [
        {"role": "user", "content": "What is 1234 * 5678? And is 3.14159 > 22/7?"},
    ]),
    ("chat_full_conversation_with_assistant_last_turn_pending", [
        {"role": "system", "content": "You are SmolLM."},
        {"role": "user", "content": "Say hello."},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Now say it in Spanish, with  double  spaces and a trailing space "},
    ]),
]

# --------------------------------------------------------------------------
# Logits cases
# --------------------------------------------------------------------------

TF_PROSE = (
    "The history of the printing press is often told as the story of a single "
    "inventor, but the reality is more complicated. Johannes Gutenberg combined "
    "several existing technologies (the screw press used for wine and olive oil, "
    "oil-based inks, and a hand mould for casting metal type) into a system that "
    "could produce books far faster than scribes. Within fifty years of his first "
    "Bible, printing shops had spread to more than two hundred cities across "
    "Europe, and an estimated twenty million volumes had been printed. The effects "
    "were profound: literacy rose, scientific results could be shared and checked, "
    "and the Reformation used pamphlets to reach ordinary people. Historians still "
    "debate how quickly these changes happened, and whether the press caused them "
    "or merely accelerated trends that had already begun."
)

TF_CODE = '''import json
from dataclasses import dataclass, field


@dataclass
class Inventory:
    """A tiny in-memory inventory keyed by SKU."""

    items: dict[str, int] = field(default_factory=dict)

    def add(self, sku: str, qty: int = 1) -> None:
        if qty <= 0:
            raise ValueError(f"quantity must be positive, got {qty}")
        self.items[sku] = self.items.get(sku, 0) + qty

    def remove(self, sku: str, qty: int = 1) -> bool:
        have = self.items.get(sku, 0)
        if have < qty:
            return False
        self.items[sku] = have - qty
        return True

    def to_json(self) -> str:
        return json.dumps(self.items, sort_keys=True, indent=2)


inv = Inventory()
inv.add("apple", 3)
inv.remove("apple")
print(inv.to_json())
'''

TF_CHAT_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant who explains things simply."},
    {"role": "user", "content": "Why is the sky blue?"},
    {"role": "assistant", "content": (
        "Sunlight contains all colors. When it passes through the air, the tiny "
        "gas molecules scatter short wavelengths (blue and violet) much more than "
        "long ones (red and orange). This is called Rayleigh scattering. Our eyes "
        "are more sensitive to blue than violet, so the scattered light we see "
        "coming from every direction looks blue."
    )},
    {"role": "user", "content": "Then why are sunsets red?"},
    {"role": "assistant", "content": (
        "At sunset the light travels through much more air to reach you. Most of "
        "the blue light is scattered away before it arrives, so the remaining "
        "direct light is dominated by reds and oranges."
    )},
    {"role": "user", "content": "Thanks! Give me a one-line summary."},
]

GREEDY_PROMPTS: list[tuple[str, list[dict]]] = [
    ("capital_france", [{"role": "user", "content": "What is the capital of France?"}]),
    ("haiku_ocean", [{"role": "user", "content": "Write a haiku about the ocean."}]),
    ("python_reverse", [{"role": "user", "content": "Write a Python function that reverses a string."}]),
    ("arithmetic", [{"role": "user", "content": "What is 17 + 25? Answer with just the number."}]),
    ("list_fruits", [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "List three fruits."},
    ]),
    ("explain_gravity", [{"role": "user", "content": "Explain gravity to a five-year-old."}]),
    ("translate_spanish", [{"role": "user", "content": "Translate 'Good morning, how are you?' into Spanish."}]),
    ("multi_turn_name", [
        {"role": "user", "content": "My name is Alice."},
        {"role": "assistant", "content": "Nice to meet you, Alice! How can I help you today?"},
        {"role": "user", "content": "What is my name?"},
    ]),
    ("email_subject", [{"role": "user", "content": "Suggest a subject line for an email asking my team to a meeting on Friday."}]),
    ("json_output", [
        {"role": "system", "content": "Reply only with JSON."},
        {"role": "user", "content": "Give me an object with keys \"city\" and \"country\" for Tokyo."},
    ]),
]


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------

def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def gguf_metadata(path: Path) -> dict:
    """Read chat template and special-token strings straight from the GGUF."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))

    def field(name):
        f = r.fields.get(name)
        if f is None:
            return None
        return f.contents()

    tokens = field("tokenizer.ggml.tokens")
    bos_id = int(field("tokenizer.ggml.bos_token_id"))
    eos_id = int(field("tokenizer.ggml.eos_token_id"))
    return {
        "chat_template": field("tokenizer.chat_template"),
        "pre": field("tokenizer.ggml.pre"),
        "model": field("tokenizer.ggml.model"),
        "add_bos": field("tokenizer.ggml.add_bos_token"),
        "bos_id": bos_id,
        "eos_id": eos_id,
        "bos_token": tokens[bos_id],
        "eos_token": tokens[eos_id],
        "tokens": tokens,
    }


def make_renderer(meta: dict):
    """Render like transformers' apply_chat_template (its _compile_jinja_template)."""
    from jinja2.exceptions import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    tmpl = env.from_string(meta["chat_template"])

    def render(messages: list[dict]) -> str:
        return tmpl.render(messages=messages, add_generation_prompt=True,
                           bos_token=meta["bos_token"], eos_token=meta["eos_token"])

    return render


def write_json(path: Path, header: dict, lists: dict[str, list]) -> None:
    """Pretty-but-compact JSON: header keys one per line, one case per line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    parts = ["{"]
    items = [f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in header.items()]
    for k, cases in lists.items():
        body = ",\n".join("    " + json.dumps(c, ensure_ascii=False, separators=(",", ":"))
                          for c in cases)
        items.append(f"  {json.dumps(k)}: [\n{body}\n  ]")
    parts.append(",\n".join(items))
    parts.append("}\n")
    text = "\n".join(parts)
    json.loads(text)  # sanity
    path.write_text(text, encoding="utf-8")


def llama_version() -> str:
    try:
        import llama_cpp
    except ImportError:
        return "(llama_cpp not installed)"
    return llama_cpp.__version__


# --------------------------------------------------------------------------
# Fixture builders
# --------------------------------------------------------------------------

def build_tokenizer_fixture(model: Path, sha: str, meta: dict, out: Path) -> list[dict]:
    from llama_cpp import Llama

    llm = Llama(model_path=str(model), vocab_only=True, verbose=False)
    render = make_renderer(meta)
    cases: list[dict] = []
    problems = []

    names = set()
    for name, text, ps in RAW_CASES:
        assert name not in names, name
        names.add(name)
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=ps)
        ids = [int(i) for i in ids]
        back = llm.detokenize(ids, special=True).decode("utf-8", errors="replace")
        if back != text:
            problems.append(f"raw {name}: round trip mismatch {back!r} != {text!r}")
        cases.append({"name": name, "kind": "raw", "text": text, "parse_special": ps, "ids": ids})

    for name, messages in CHAT_CASES:
        assert name not in names, name
        names.add(name)
        rendered = render(messages)
        ids = [int(i) for i in llm.tokenize(rendered.encode("utf-8"), add_bos=False, special=True)]
        back = llm.detokenize(ids, special=True).decode("utf-8", errors="replace")
        if back != rendered:
            problems.append(f"chat {name}: round trip mismatch")
        cases.append({"name": name, "kind": "chat", "messages": messages,
                      "rendered": rendered, "ids": ids})

    header = {
        "model_sha256": sha,
        "reference": f"llama.cpp via llama-cpp-python {llama_version()}",
        "notes": ("raw: ids = llama.cpp tokenize(text, add_bos=False, special=parse_special); "
                  "chat: rendered = GGUF tokenizer.chat_template rendered as HF "
                  "apply_chat_template(add_generation_prompt=True); "
                  "ids = tokenize(rendered, add_bos=False, special=True)"),
    }
    write_json(out, header, {"cases": cases})
    n_raw = sum(c["kind"] == "raw" for c in cases)
    print(f"[tokenizer] wrote {out} : {n_raw} raw + {len(cases) - n_raw} chat cases, "
          f"{sum(len(c['ids']) for c in cases)} ids, {out.stat().st_size} bytes")
    for p in problems:
        print("[tokenizer] WARNING", p)
    del llm
    return cases


def top_k_row(row: np.ndarray, k: int = TOP_K) -> list[list]:
    row = np.asarray(row, dtype=np.float32)
    # stable sort on (-logit, id): ties broken by lowest id
    idx = np.lexsort((np.arange(row.shape[0]), -row))[:k]
    return [[int(i), round(float(row[i]), 5)] for i in idx]


def build_logits_fixture(model: Path, sha: str, meta: dict, out: Path) -> None:
    from llama_cpp import Llama

    render = make_renderer(meta)
    llm = Llama(model_path=str(model), logits_all=True, n_ctx=N_CTX, n_batch=N_BATCH,
                n_ubatch=N_BATCH, n_threads=N_THREADS, n_threads_batch=N_THREADS,
                verbose=False)
    n_vocab = llm.n_vocab()

    # --- teacher forced ------------------------------------------------------
    tf_inputs = [
        ("prose_printing_press", llm.tokenize(TF_PROSE.encode(), add_bos=False, special=False)),
        ("code_python_inventory", llm.tokenize(TF_CODE.encode(), add_bos=False, special=False)),
        ("chat_sky_blue", llm.tokenize(render(TF_CHAT_MESSAGES).encode(), add_bos=False, special=True)),
    ]
    teacher_forced = []
    for name, ids in tf_inputs:
        ids = [int(i) for i in ids]
        assert len(ids) <= N_BATCH, (name, len(ids))
        llm.reset()
        t0 = time.time()
        llm.eval(ids)  # one batch (len <= n_batch)
        scores = np.array(llm.scores[: len(ids)], dtype=np.float32)
        assert scores.shape == (len(ids), n_vocab)
        assert np.isfinite(scores).all()
        top = [top_k_row(scores[i]) for i in range(len(ids))]
        # The same text one token per forward: llama.cpp's multi-token and
        # one-token paths round differently, and how often their top-1
        # tokens differ is the floor for any comparison with llama.cpp.
        llm.reset()
        for t in ids:
            llm.eval([t])
        one = np.array(llm.scores[: len(ids)], dtype=np.float32)
        top_one = [top_k_row(one[i]) for i in range(len(ids))]
        same = int((scores.argmax(1) == one.argmax(1)).sum())
        teacher_forced.append({"name": name, "token_ids": ids, "top": top,
                               "top_one_token": top_one})
        print(f"[logits] teacher_forced {name}: {len(ids)} tokens, batch and one-token "
              f"top-1 agree at {same}/{len(ids)} ({time.time() - t0:.1f}s)")

    # --- greedy --------------------------------------------------------------
    im_end = llm.tokenize(b"<|im_end|>", add_bos=False, special=True)
    assert len(im_end) == 1, im_end
    stop_ids = {int(meta["eos_id"]), int(im_end[0]), int(llm.token_eos())}
    greedy = []
    for name, messages in GREEDY_PROMPTS:
        rendered = render(messages)
        prompt = [int(i) for i in llm.tokenize(rendered.encode(), add_bos=False, special=True)]
        llm.reset()
        t0 = time.time()
        llm.eval(prompt)
        cont, margins = [], []
        for _ in range(MAX_NEW_TOKENS):
            row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            top2 = top_k_row(row, 2)
            nxt = top2[0][0]
            cont.append(nxt)
            margins.append(round(float(row[top2[0][0]] - row[top2[1][0]]), 4))
            if nxt in stop_ids:
                break
            llm.eval([nxt])
        text = llm.detokenize(cont, special=True).decode("utf-8", errors="replace")
        # The same path through the multi-token path: prompt + continuation
        # (all but its last token) in one batch.
        llm.reset()
        full = prompt + cont[:-1]
        assert len(full) <= N_BATCH, (name, len(full))
        llm.eval(full)
        scores = np.array(llm.scores[: len(full)], dtype=np.float32)
        batch_top1 = [top_k_row(scores[len(prompt) - 1 + i], 1)[0][0] for i in range(len(cont))]
        greedy.append({"name": name, "messages": messages, "prompt_ids": prompt,
                       "continuation": cont, "continuation_text": text,
                       "top2_margin": margins, "batch_top1": batch_top1})
        print(f"[logits] greedy {name}: prompt {len(prompt)} -> {len(cont)} new "
              f"(min margin {min(margins):.4f}, {time.time() - t0:.1f}s): {text[:70]!r}")

    header = {
        "model_sha256": sha,
        "reference": f"llama.cpp via llama-cpp-python {llama_version()}",
        "n_threads": N_THREADS,
        "notes": (f"teacher_forced: whole sequence evaluated in one batch (n_ctx={N_CTX}, "
                  f"n_batch={N_BATCH}), top[i] = top-{TOP_K} raw logits [id, logit] after "
                  "token i, sorted desc; top_one_token[i] = the same from evaluating the "
                  "text one token per forward. greedy: argmax decoding, fresh context per prompt, "
                  f"<= {MAX_NEW_TOKENS} new tokens, stops after EOS/<|im_end|> (included); "
                  "top2_margin[i] = logit gap between best and second-best token at step i; "
                  "batch_top1[i] = top-1 after step i with prompt + continuation in one batch."),
        "stop_ids": sorted(stop_ids),
    }
    write_json(out, header, {"teacher_forced": teacher_forced, "greedy": greedy})
    print(f"[logits] wrote {out} : {len(teacher_forced)} teacher-forced "
          f"({sum(len(t['token_ids']) for t in teacher_forced)} positions), "
          f"{len(greedy)} greedy, {out.stat().st_size} bytes")


# --------------------------------------------------------------------------
# Optional: compare with HF transformers' GGUF tokenizer conversion
# --------------------------------------------------------------------------

def compare_transformers(model: Path, cases: list[dict]) -> None:
    import importlib.machinery
    import importlib.util
    import types

    if importlib.util.find_spec("torch") is None:
        # transformers' GGUF reader does `import torch` at module level and its
        # GGUF config loader refuses to run without torch, but the tokenizer path
        # (return_tensors=False) never uses torch: a placeholder module is enough.
        stub = types.ModuleType("torch")
        stub.__spec__ = importlib.machinery.ModuleSpec("torch", None)
        stub.__getattr__ = lambda name: object()  # type: ignore[attr-defined]
        sys.modules["torch"] = stub
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
        from transformers import AutoTokenizer
    except Exception as e:  # optional dependency
        print(f"[compare] transformers not available ({e}); skipping")
        return
    gguf_utils.is_torch_available = lambda: True
    tok = AutoTokenizer.from_pretrained(str(model.parent), gguf_file=model.name)
    n_diff = 0
    for c in cases:
        text = c["text"] if c["kind"] == "raw" else c["rendered"]
        if c["kind"] == "raw" and not c["parse_special"]:
            # HF always matches added/special tokens in text; only compare if none present
            if any(t in text for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")):
                continue
        hf = tok.encode(text, add_special_tokens=False)
        if hf != c["ids"]:
            n_diff += 1
            print(f"[compare] DIFF {c['name']}: text={text[:60]!r}\n"
                  f"    llama.cpp={c['ids'][:40]}\n    hf       ={hf[:40]}")
    print(f"[compare] {n_diff} of {len(cases)} cases differ")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--out-root", type=Path, default=REPO_ROOT)
    ap.add_argument("--only", choices=["tokenizer", "logits", "compare"])
    ap.add_argument("--compare-transformers", action="store_true")
    ap.add_argument("--name", help="fixture suffix: writes tokenizer_reference_NAME.json and "
                    "logits_reference_NAME.json (default: the SmolLM2 fixtures' names)")
    args = ap.parse_args()

    model = args.model.expanduser().resolve()
    sha = sha256_file(model)
    meta = gguf_metadata(model)
    print(f"model {model}\n  sha256 {sha}\n  tokenizer {meta['model']} pre={meta['pre']} "
          f"add_bos={meta['add_bos']} bos={meta['bos_id']}:{meta['bos_token']!r} "
          f"eos={meta['eos_id']}:{meta['eos_token']!r} vocab={len(meta['tokens'])}\n"
          f"  llama-cpp-python {llama_version()}")

    cases = None
    if args.only in (None, "tokenizer"):
        cases = build_tokenizer_fixture(model, sha, meta,
                                        args.out_root / named(TOKENIZER_FIXTURE, args.name))
    if args.compare_transformers or args.only == "compare":
        if cases is None:
            cases = json.loads((args.out_root / named(TOKENIZER_FIXTURE, args.name)).read_text())["cases"]
        compare_transformers(model, cases)
    if args.only in (None, "logits"):
        build_logits_fixture(model, sha, meta, args.out_root / named(LOGITS_FIXTURE, args.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
