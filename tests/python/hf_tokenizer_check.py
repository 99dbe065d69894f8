"""The tokenizer `specmesh model export-tokenizer` wrote, loaded by
`transformers` as any client loads one.

Usage: hf_tokenizer_check.py DIR < cases.json

Reads a JSON list of texts on stdin and prints, per text, the ids
`AutoTokenizer` gives and the text it decodes them back to, and the chat
template's rendering of one user message.
"""

import json
import sys

from transformers import AutoTokenizer

tok = AutoTokenizer.from_pretrained(sys.argv[1])
texts = json.load(sys.stdin)
out = {
    "encoded": [{"ids": tok(t)["input_ids"], "decoded": tok.decode(tok(t)["input_ids"])} for t in texts],
    "chat": tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True),
    "class": type(tok).__name__,
}
print(json.dumps(out))
