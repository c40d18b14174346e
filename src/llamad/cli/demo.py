"""``make run``: the daemon serves the default model, cold then warm, through the public client.

What it does, as a user would:

1. starts ``python -m llamad.daemon`` with **no configuration file**, so it
   serves the default model (SmolLM2-135M-Instruct) as ``smollm2``. The
   daemon is kept apart from anything else on the machine: a private 0700
   directory under ``/tmp`` holds its runtime directory (the endpoint and the
   actor registry), its state (the disk tier) and its log; the cache gets an
   instance name of its own (``ram`` segments and ``ram_file`` files are named
   by it, and ``ram_file`` keeps its default place under ``/dev/shm``).
   Environment settings (``LLAMAD_RUNTIME_DIR``, ``STATE_DIRECTORY``,
   ``LLAMAD_CACHE__INSTANCE``) do this; a user's ``LLAMAD_*`` settings
   are not passed on, so a daemon of theirs is never reached nor disturbed.
   :class:`llamad.testing.Launcher`, the daemon harness the tests and
   benches use too, starts it, waits for it, stops it and removes it;
2. waits until the front routes the model (it does once the model is ready);
3. sends a chat of ~1,500 tokens (notes about a city, then a question) with
   greedy sampling: **cold**, the whole prompt is prefilled;
4. sends the same chat again the moment the reply ends, as a user would (no
   wait for the cache to save anything): **warm**, an exact hit on the live
   KV the first request left in its sequence, no restore and no decode
   before the first token;
5. restarts the daemon (SIGTERM, start again) and sends the chat a third
   time: **restart**, an exact hit restored from the tier the cache kept the
   row in across the restart (its ``ram`` rows move to ``ram_file`` at a clean
   stop and back into ``ram`` at the start, and ``disk`` keeps a copy);
6. prints each ``cache_hit_kind``, where the prompt's tokens came from, the
   worker's restore and prefill times, the client's time to the first token,
   the speed-ups, and checks that all three replies are identical;
7. stops the daemon with SIGTERM (its shutdown saves run), checks that it
   exited 0 and that no process of its tree is left, and removes the
   directory — also after Ctrl-C or an error.

Exit status 0 when all of that held.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
import uuid
from typing import Final

from llamad import logs
from llamad.cli.render import sources_text
from llamad.client.sync import Client
from llamad.config import DEFAULT_MODEL_ID
from llamad.config.model_schema import DEFAULT_MODEL_PATH
from llamad.errors import LlamadError
from llamad.model.results import Completion, DoneEvent, TokenEvent
from llamad.testing import Launcher

__all__ = ["main", "notes_prompt"]

READY_TIMEOUT_S: Final = 180.0
STOP_TIMEOUT_S: Final = 60.0

_PLACES: Final = ("river", "bridge", "market", "library", "tower", "harbour", "garden", "mill")


def notes_prompt(facts: int) -> list[dict[str, str]]:
    """A chat whose user message is ``facts`` notes about a city and a question
    (about 27 tokens a note with the default model's template)."""
    notes = " ".join(
        f"Note {i + 1}: the {_PLACES[i % len(_PLACES)]} of district {i // 8 + 1} "
        f"was built in {1500 + i * 3} and repaired {i % 5 + 1} times."
        for i in range(facts)
    )
    question = "In one sentence, what do these notes describe?"
    return [{"role": "user", "content": f"Notes about an old city.\n{notes}\n{question}"}]


def _launcher(threads: int | None) -> Launcher:
    """The daemon with no configuration file, over a private directory and a
    cache instance of its own (the ``ram_file`` tier keeps its default place,
    on /dev/shm beside ``ram``, so its moves are links; the demo removes it)."""
    env = {"LLAMAD_LOG_FORMAT": "console"}
    if threads is not None:
        # Overriding a key of the default model defines its table, which
        # then needs its path ("default": the model make setup installed).
        model = DEFAULT_MODEL_ID.upper()
        env[f"LLAMAD_MODELS__{model}__PATH"] = DEFAULT_MODEL_PATH
        env[f"LLAMAD_MODELS__{model}__N_THREADS"] = str(threads)
        env[f"LLAMAD_MODELS__{model}__N_THREADS_BATCH"] = str(threads)
    # A session of its own: Ctrl-C reaches the demo only, which stops the
    # daemon with SIGTERM, the one shutdown path (also if the demo is killed).
    return Launcher(
        prefix="llamad-run-",
        instance=f"run-{uuid.uuid4().hex[:12]}",
        env=env,
        own_session=True,
    )


def _timed(
    client: Client, messages: list[dict[str, str]], max_tokens: int
) -> tuple[Completion, float]:
    """One request through a stream: its Completion and the client's time to the first token."""
    started = time.perf_counter()
    first: float | None = None
    result: Completion | None = None
    for event in client.infer(
        DEFAULT_MODEL_ID, messages=messages, max_tokens=max_tokens, temperature=0.0
    ):
        if isinstance(event, TokenEvent) and first is None:
            first = time.perf_counter() - started
        elif isinstance(event, DoneEvent):
            result = event.result
    assert result is not None
    return result, (first if first is not None else time.perf_counter() - started)


def _line(kind: str, c: Completion, ttft_s: float) -> str:
    s = c.stats
    rate = s.completion_tokens / (s.generation_ms / 1e3) if s.generation_ms else 0.0
    return (
        f"{kind:<8} cache_hit_kind={c.cache_hit_kind.value:<6} restore {s.restore_ms:7.1f} ms"
        f"  prefill {s.prefill_ms:7.1f} ms  first token {ttft_s * 1e3:7.1f} ms"
        f"  | prompt tokens: {sources_text(c.cache_delta.sources)};"
        f" {s.completion_tokens} generated at {rate:.0f} tok/s"
    )


def _same(a: Completion, b: Completion) -> bool:
    return a.reply == b.reply and a.generated == b.generated


def _demo(client: Client, daemon: Launcher, args: argparse.Namespace) -> bool:
    """The cold, warm and after-restart requests and their report; whether
    both later ones were exact hits with the cold one's reply."""
    started = time.monotonic()
    daemon.wait_routed([DEFAULT_MODEL_ID], timeout=READY_TIMEOUT_S)
    info = client.model_info(DEFAULT_MODEL_ID)
    print(
        f"daemon   pid {daemon.pid}, serving {info.model_id} "
        f"(n_ctx {info.n_ctx}) on {daemon.endpoint}, ready in {time.monotonic() - started:.1f} s"
    )
    print(f"model    {info.path}")
    messages = notes_prompt(args.facts)
    prompt = client.apply_chat_template(DEFAULT_MODEL_ID, messages, add_generation_prompt=True)
    print(f"prompt   {len(prompt)} tokens: {args.facts} notes about a city and a question\n")

    cold, cold_ttft = _timed(client, messages, args.max_tokens)
    print(_line("cold", cold, cold_ttft))
    # Sent the moment the reply ended: nothing waits for the cache to save.
    warm, warm_ttft = _timed(client, messages, args.max_tokens)
    print(_line("warm", warm, warm_ttft))
    stopped = daemon.terminate(STOP_TIMEOUT_S)
    if not stopped.clean:
        raise RuntimeError(
            f"the daemon's stop went wrong: exit status {stopped.code}, left {list(stopped.left)}"
        )
    restart_began = time.monotonic()
    daemon.start()
    daemon.wait_routed([DEFAULT_MODEL_ID], timeout=READY_TIMEOUT_S)
    print(
        f"         (daemon stopped with SIGTERM and started again in "
        f"{time.monotonic() - restart_began:.1f} s)"
    )
    again, again_ttft = _timed(client, messages, args.max_tokens)
    print(_line("restart", again, again_ttft))

    def worker_ttft(c: Completion) -> float:
        return c.stats.restore_ms + c.stats.prefill_ms

    cold_ms = worker_ttft(cold)
    print(
        f"\nspeed-up to the first token through the client: "
        f"{cold_ttft / max(warm_ttft, 1e-6):.0f}x warm (live KV), "
        f"{cold_ttft / max(again_ttft, 1e-6):.0f}x after the restart (from "
        f"{_tiers(again)}); in the worker {cold_ms:.0f} ms cold, "
        f"{worker_ttft(warm):.1f} ms warm, {worker_ttft(again):.1f} ms after the restart"
    )
    print(f"reply    {cold.reply.strip()!r}")
    ok = True
    for kind, c in (("warm", warm), ("restart", again)):
        same = _same(c, cold)
        exact = c.cache_hit_kind.value == "exact"
        ok = ok and same and exact
        print(
            f"check    {kind} reply {'identical to' if same else 'DIFFERS from'} the cold one; "
            f"{kind} hit {'exact' if exact else 'NOT exact: ' + c.cache_hit_kind.value}"
        )
    return ok


def _tiers(c: Completion) -> str:
    used = [
        name
        for name, n in c.cache_delta.sources.as_dict().items()
        if n and name not in ("live", "computed")
    ]
    return " and ".join(used) if used else "no tier"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m llamad.cli.demo",
        description="make run: the default model through the daemon, cold then warm",
    )
    ap.add_argument(
        "--facts",
        type=int,
        default=56,
        help="notes in the prompt (~27 tokens each; default 56, ~1,500 tokens)",
    )
    ap.add_argument("--max-tokens", type=int, default=24, help="tokens to generate (default 24)")
    ap.add_argument(
        "--threads", type=int, default=None, help="the model's threads (default: every CPU)"
    )
    args = ap.parse_args(argv)
    logs.configure(level="warning")

    daemon = _launcher(args.threads)
    print(f"llamad   starting the daemon with no configuration (private directory {daemon.base})")
    ok = False
    code = 1
    try:
        daemon.start()
        with Client(daemon.endpoint, connect_timeout=5.0, timeout=600.0) as client:
            ok = _demo(client, daemon, args)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping the daemon", file=sys.stderr)
        code = 130
    except (LlamadError, RuntimeError) as exc:  # DaemonFailed is a RuntimeError
        print(
            f"error: {exc}\n--- daemon log (last lines) ---\n{daemon.log_tail()}", file=sys.stderr
        )
    finally:
        # A second Ctrl-C must not leave the daemon running half stopped.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stopped = daemon.terminate(STOP_TIMEOUT_S)
        if stopped.clean:
            print("daemon   stopped with SIGTERM: exit 0, no llamad process left")
        else:
            ok = False
            print(
                f"error: the daemon's stop went wrong: exit status {stopped.code}, "
                f"processes left {list(stopped.left)}\n{daemon.log_tail()}",
                file=sys.stderr,
            )
        daemon.remove()
    if code == 130:
        return code
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
