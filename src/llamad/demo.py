"""``make run`` for now: the default model, in process, cold then warm.

Loads SmolLM2 through :mod:`llamad.llama_ffi`, renders a fixed chat prompt,
and completes it twice with greedy sampling:

* **cold**: the prompt is prefilled from scratch;
* **warm**: the prompt's KV state, packed after the cold prefill into a
  pre-faulted buffer, is restored into a fresh context instead — what the
  cache will do across requests and restarts.

Both completions must be identical (greedy and token-exact). Timings are
printed for load, prefill, restore and decode. The daemon takes this over in
a later stage.
"""

from __future__ import annotations

import argparse
import sys
import time

from llamad import logs, paths
from llamad.llama_ffi import (
    Context,
    ContextOptions,
    Model,
    Sampler,
    SamplerParams,
    StateBuffer,
    builtin_chat_template,
)

PROMPT = "Explain in two sentences why caching a prompt's KV state makes replies faster."


def _complete(ctx: Context, sampler: Sampler, max_tokens: int) -> tuple[list[int], float]:
    t0 = time.perf_counter()
    tokens = ctx.generate(sampler, max_tokens)
    return tokens, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Cold then warm completion with the default model")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args(argv)
    logs.configure(level="warning")

    path = paths.default_model_path()
    t0 = time.perf_counter()
    model = Model(path)
    load_s = time.perf_counter() - t0
    print(f"model    {path.name}: {model.description}, loaded in {load_s * 1e3:.0f} ms")

    text = builtin_chat_template(
        [{"role": "user", "content": args.prompt}],
        model.chat_template(),
        add_generation_prompt=True,
    )
    prompt = model.tokenize(text, add_special=True, parse_special=True)
    opts = ContextOptions(n_ctx=2048)
    greedy = SamplerParams(greedy=True)
    print(f"prompt   {len(prompt)} tokens: {args.prompt!r}")

    with model.context(opts) as cold:
        t0 = time.perf_counter()
        cold.prefill(prompt)
        prefill_s = time.perf_counter() - t0
        state = StateBuffer(cold.seq_state_size(0))
        nbytes = cold.pack_seq(0, state.memory)
        reply_cold, decode_cold_s = _complete(cold, Sampler(model, greedy), args.max_tokens)

    with model.context(opts) as warm:
        t0 = time.perf_counter()
        warm.unpack_seq(0, state.memory, nbytes)
        # The restored KV has no logits: decode the last prompt token again on
        # top of it (positions stay exact) to get fresh logits to sample from.
        warm.seq_remove(0, len(prompt) - 1)
        warm.prefill(prompt[-1:], start_pos=len(prompt) - 1)
        restore_s = time.perf_counter() - t0
        reply_warm, decode_warm_s = _complete(warm, Sampler(model, greedy), args.max_tokens)

    def report(kind: str, ttft_s: float, reply: list[int], decode_s: float) -> None:
        rate = len(reply) / decode_s if decode_s > 0 else float("inf")
        print(
            f"{kind:<8} time to first token {ttft_s * 1e3:7.1f} ms | "
            f"{len(reply)} tokens at {rate:.0f} tok/s"
        )

    print()
    report("cold", prefill_s, reply_cold, decode_cold_s)
    report("warm", restore_s, reply_warm, decode_warm_s)
    print(f"\nstate    {nbytes / 1e6:.1f} MB for {len(prompt)} tokens")
    print(f"reply    {model.detokenize(reply_cold)!r}")
    state.close()
    model.close()
    if reply_cold != reply_warm:
        print("error: the warm reply differs from the cold one", file=sys.stderr)
        return 1
    print("warm reply is token-identical to the cold one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
