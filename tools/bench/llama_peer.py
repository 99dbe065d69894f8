"""llama.cpp as a benchmark peer for `specmesh bench --peer`.

Reads one JSON request per line on stdin and answers one JSON line on stdout:

  {"prompt_tokens": [..], "max_new_tokens": 128, "eos": [2], "mode": "plain" | "lookup"}
  -> {"tokens": [..], "wall_seconds", "ttft_seconds", "decode_seconds", "verify_steps"}

The prompt arrives as token ids (the gateway's own chat-templated encoding) so
both systems decode exactly the same input; decoding is greedy. "lookup" is
llama-cpp-python's prompt-lookup speculative decoding. `verify_steps` counts
the target forwards after the prompt, so tokens / steps is its τ.
"""

import argparse
import json
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--num-pred-tokens", type=int, default=10)
    args = ap.parse_args()

    import llama_cpp
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    def load(draft):
        return Llama(
            model_path=args.model,
            n_ctx=args.ctx,
            n_threads=args.threads,
            n_threads_batch=args.threads,
            draft_model=draft,
            # A draft model needs logits at every position; llama-cpp-python
            # sizes its logits buffer from this flag alone, so without it a
            # prompt over n_batch (512) tokens overflows the buffer.
            logits_all=draft is not None,
            verbose=False,
        )

    # Two instances: a draft model forces logits for every position, which
    # would slow plain decoding down if they shared one.
    models = {
        "plain": load(None),
        "lookup": load(LlamaPromptLookupDecoding(num_pred_tokens=args.num_pred_tokens)),
    }
    forwards = {"n": 0}
    for llm in models.values():
        inner = llm.eval

        def counted(tokens, _inner=inner):
            forwards["n"] += 1
            return _inner(tokens)

        llm.eval = counted

    print(json.dumps({"ready": True, "llama_cpp": llama_cpp.__version__}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            answer = generate(models[req["mode"]], req, forwards)
        except Exception as e:  # one bad request must not kill the run
            answer = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer), flush=True)


def generate(llm, req, forwards):
    """Greedy decoding of one request, timed."""
    eos = set(req.get("eos", [])) | {llm.token_eos()}
    tokens = []
    t0 = time.perf_counter()
    first = last = None
    # No prompt-prefix reuse between requests: the gateway (without a
    # session id) prefills every prompt in full, so the peer does too.
    llm.reset()
    forwards["n"] = 0
    prefill_forwards = 0
    for tok in llm.generate(
        req["prompt_tokens"], top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
        repeat_penalty=1.0, reset=True,
    ):
        now = time.perf_counter()
        if first is None:
            first = now
            prefill_forwards = forwards["n"]
        last = now
        if tok in eos:  # like the gateway: EOS ends, it is not output
            break
        tokens.append(tok)
        if len(tokens) >= req["max_new_tokens"]:
            break
    wall = time.perf_counter() - t0
    return {
        "tokens": tokens,
        "wall_seconds": wall,
        "ttft_seconds": (first or t0) - t0,
        "decode_seconds": (last or t0) - (first or t0),
        "verify_steps": max(forwards["n"] - prefill_forwards, 0) + (1 if tokens else 0),
    }


if __name__ == "__main__":
    main()
