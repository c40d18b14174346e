"""Runs inside llama-cpp-python's own venv (imports nothing of llamad): one Llama, one cache.

    <peer venv>/bin/python lcpp_child.py '{"model": ..., "n_ctx": ..., "threads": ...,
                                            "cache": "ram" | "disk", "cache_dir": ...}'

Reads one JSON request a line on stdin, answers one JSON line on stdout:

- ``{"op": "complete", "tokens": [...], "n": N, "forget": bool}``: a greedy
  streamed completion of the token ids; ``forget`` first resets the context's
  live tokens (``Llama.reset``), so the prompt can only come from the cache,
  as after another user's request took the context. Answers the first token's
  time (ms, from the call), every token's arrival (``perf_counter``), and how
  many prompt tokens were reused (the longest prefix shared with the context
  when the first token was sampled, as llama-cpp-python's own eval skips them).
- ``{"op": "quit"}``.

Times are taken in this process: llama-cpp-python is a library, so its
"client" is the caller in the same process, with no IPC hop.
"""

from __future__ import annotations

import json
import sys
import time


def _prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _reusable(llm: object, tokens: list[int]) -> int:
    """Prompt tokens llama-cpp-python will not evaluate: the longer of the live
    context's shared prefix and the best cache entry's (its own lookup, made
    the same way just before the call); the last prompt token is always
    evaluated again."""
    live = _prefix(list(llm.input_ids[: llm.n_tokens]), tokens)  # type: ignore[attr-defined]
    cached = 0
    cache = llm.cache  # type: ignore[attr-defined]
    key = cache._find_longest_prefix_key(tuple(tokens)) if cache is not None else None
    if key is not None:
        cached = _prefix(list(key), tokens)
    return min(max(live, cached), len(tokens) - 1)


def main() -> int:
    import llama_cpp  # type: ignore[import-not-found]  # noqa: PLC0415

    cfg = json.loads(sys.argv[1])
    llm = llama_cpp.Llama(
        model_path=cfg["model"],
        n_ctx=cfg["n_ctx"],
        n_threads=cfg["threads"],
        n_threads_batch=cfg["threads"],
        n_batch=cfg.get("n_batch", 2048),
        n_ubatch=cfg.get("n_ubatch", 512),
        verbose=False,
    )
    # A state here is ~0.3-0.8 GB (KV plus the logits llama-cpp-python keeps): the
    # default 2 GiB held fewer than one round's three prompts and trimmed the one
    # asked for next. A round's three fit in these.
    if cfg["cache"] == "ram":
        llm.set_cache(llama_cpp.LlamaRAMCache(capacity_bytes=4 << 30))
    else:
        llm.set_cache(llama_cpp.LlamaDiskCache(cache_dir=cfg["cache_dir"], capacity_bytes=8 << 30))
    print(json.dumps({"ready": True, "version": llama_cpp.__version__}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "quit":
            break
        tokens = req["tokens"]
        if req.get("forget"):
            llm.reset()
        reused = _reusable(llm, tokens)
        arrivals: list[float] = []
        started = time.perf_counter()
        for _chunk in llm.create_completion(
            tokens, max_tokens=req["n"], temperature=0.0, stream=True
        ):
            arrivals.append(time.perf_counter())
        ttft = ((arrivals[0] if arrivals else time.perf_counter()) - started) * 1e3
        print(json.dumps({"ttft_ms": ttft, "arrivals": arrivals, "reused": reused}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
