"""The llamad cache on its own: no model, no llama.cpp (SPEC C11).

Starts ``cache_sup`` (a supervisor with the cache-meta process) over private
``ram``, ``ram_file`` and ``disk`` tiers, saves a fake KV state into each
tier through the writer pool (the crash-safe publish protocol), resolves a
longer prompt to its longest saved prefix in one round trip, loads the bytes
into a reusable buffer as a model worker would before
``llama_state_seq_set_data``, and prints the counters.

    python examples/cache_standalone.py [--tokens 2048] [--bytes-per-token 23040]

Everything it creates lives under a temporary directory and a private
shared-memory namespace, and is removed at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

from llamad import logs
from llamad.cache.client import CacheClient
from llamad.cache.counters import Counters
from llamad.cache.key import (
    FingerprintMode,
    Namespace,
    ctx_params_hash,
    quant_byte,
    tokens_to_bytes,
)
from llamad.cache.kvc import KvcSpec, SaveReason
from llamad.cache.ram_purge import purge_ram
from llamad.cache.settings import CacheSettings
from llamad.cache.sup import cache_sup_spec
from llamad.cache.tier_kind import TierKind
from llamad.cache.writer import WriterPool
from llamad.supervisor.supervisor_proc import Supervisor

MIB = 1 << 20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the llamad cache without a model.")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--bytes-per-token", type=int, default=23_040)
    args = parser.parse_args(argv)
    # Keep the output to what the demo shows (children inherit the level).
    os.environ.setdefault("LLAMAD_LOG_LEVEL", "warning")
    logs.configure()

    base = Path(tempfile.mkdtemp(prefix="llamad-cache-demo-", dir="/tmp"))
    instance = f"demo{os.getpid()}"
    settings = CacheSettings.defaults(
        state_dir=base / "state",
        runtime_dir=base / "run",
        instance=instance,
        ram_quota=512 * MIB,
        ram_file_quota=512 * MIB,
        disk_quota=1024 * MIB,
        ram_file_root=Path("/dev/shm") / f"llamad-demo-{instance}",
        registry_root=base / "reg",
        save_permits=2,  # at most two saves at once, across every process of this cache
    )
    (base / "run").mkdir(parents=True)
    purge_ram(settings)  # what the daemon does at start: ram rows die with their daemon
    try:
        with Supervisor(cache_sup_spec(settings)):
            run_demo(settings, args.tokens, args.bytes_per_token)
    finally:
        purge_ram(settings)
        shutil.rmtree(Path("/dev/shm") / f"llamad-demo-{instance}", ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
    return 0


def run_demo(settings: CacheSettings, n_tokens: int, bytes_per_token: int) -> None:
    # A namespace as a model worker would derive it from its GGUF and context.
    namespace = Namespace(
        fingerprint=hashlib.sha256(b"a model that does not exist").digest(),
        quant=quant_byte("q4_1"),
        # KV types as ggml_type numbers (1: f16), flash attention off (0).
        ctx_hash=ctx_params_hash(n_ctx=8192, type_k=1, type_v=1, flash_attn=0),
    )
    # cache-meta created the counters and the writer permits when it started.
    counters = Counters.attach(settings.counters_path)
    pool = WriterPool.from_settings(settings, client_name="demo-writer", counters=counters)
    cache = CacheClient.from_settings(settings, counters=counters, client_name="demo-worker")
    try:
        payload = os.urandom(n_tokens * bytes_per_token)  # stands in for llama_state_seq bytes
        prompt = [(i * 7919) % 49_152 for i in range(n_tokens + 500)]
        saved_len = {
            TierKind.RAM: n_tokens // 4,
            TierKind.RAM_FILE: n_tokens // 2,
            TierKind.DISK: n_tokens,
        }

        print(f"saving {len(payload) / 1e6:.1f} MB into each tier ...")
        for tier, length in saved_len.items():
            spec = KvcSpec(
                namespace,
                tokens_to_bytes(prompt[:length]),
                FingerprintMode.SAFE,
                SaveReason.COLD,
                context_size=8192,
            )
            started = time.perf_counter()
            future = pool.save_async(spec, tier, payload)
            if future is None:
                raise SystemExit("save dropped: no writer permit")
            result = future.result(60)
            took = (time.perf_counter() - started) * 1e3
            outcome = result.outcome.value
            print(f"  {tier.value:8s} {length:5d} tokens -> {outcome} in {took:.1f} ms")

        buffer = bytearray(len(payload) + (1 << 16))
        buffer[::4096] = b"\x01" * len(range(0, len(buffer), 4096))  # pre-fault it once
        started = time.perf_counter()
        found = cache.resolve(namespace, prompt)
        if found.row is None:
            raise SystemExit("the saved prefix was not found")
        with cache.pinned(found.row):
            n = cache.load_into(found.row, buffer)
        took = (time.perf_counter() - started) * 1e3
        if n is None or bytes(buffer[:n]) != payload:
            raise SystemExit("the restored bytes differ from the saved ones")
        print(
            f"resolved a {len(prompt)}-token prompt: {found.kind} hit on "
            f"{found.use_tokens} tokens from {found.row.tier.value}; "
            f"lookup + load {n / 1e6:.1f} MB in {took:.1f} ms"
        )

        print("counters:")
        for name, value in sorted(cache.counters().items()):
            print(f"  {name:24s} {value}")
    finally:
        cache.close()
        pool.close()
        counters.close()


if __name__ == "__main__":
    raise SystemExit(main())
