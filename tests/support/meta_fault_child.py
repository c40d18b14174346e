"""Child processes for cache-meta fault tests (run as a script, killed by the test).

python meta_fault_child.py pin SETTINGS.json KEYHEX
    pins the row, prints PINNED, then sleeps until killed
python meta_fault_child.py write SETTINGS.json TIER STAGE TOKENS_SEED
    publishes one row through the real cache-meta and SIGKILLs itself
    right after publish stage STAGE (1..6, see PublishStage)
python meta_fault_child.py meta SETTINGS.json KIND STAGE
    runs cache-meta (prints READY like ``python -m llamad.cache.meta_proc``)
    and SIGKILLs it right after its mover's first move of KIND reaches
    STAGE (1..4, see MoveStage)
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from llamad import logs
from llamad.cache.client import CacheClient
from llamad.cache.key import FingerprintMode, Namespace, tokens_to_bytes
from llamad.cache.kvc import KvcSpec, SaveReason
from llamad.cache.meta_proc import MetaServer
from llamad.cache.mover import MoveStage
from llamad.cache.moves import MoveJob, MoveKind
from llamad.cache.publish import PublishStage, publish
from llamad.cache.settings import CacheSettings
from llamad.cache.sup import cache_sup_spec
from llamad.cache.tiers import Tier
from llamad.supervisor import run_root

NS = Namespace(fingerprint=b"\x33" * 32, quant=3, ctx_hash=b"\x44" * 32)


def row_spec(seed: int) -> KvcSpec:
    tokens = [(seed * 1_000_003 + i * 7919) % 49_152 for i in range(600)]
    return KvcSpec(NS, tokens_to_bytes(tokens), FingerprintMode.SAFE, SaveReason.FINISH)


def row_payload(seed: int) -> bytes:
    return bytes((i * 13 + seed) % 251 for i in range(30_000))


def main() -> None:
    logs.configure()
    cmd, settings_path, *rest = sys.argv[1:]
    settings = CacheSettings.from_wire(json.loads(Path(settings_path).read_text()))
    cache = CacheClient.from_settings(settings)
    if cmd == "pin":
        ref = cache.checkout(bytes.fromhex(rest[0]))
        print("PINNED" if ref is not None else "MISS", flush=True)
        while True:
            time.sleep(60)
    elif cmd == "write":
        tier_name, stage, seed = rest[0], int(rest[1]), int(rest[2])
        cfg = settings.tier(tier_name)
        assert cfg is not None

        def die(at: PublishStage, key: bytes) -> None:
            if at == stage:
                print(f"DYING {at.name}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

        result = publish(cache, Tier(cfg), row_spec(seed), row_payload(seed), on_stage=die)
        print(f"DONE {result.outcome}", flush=True)
    elif cmd == "meta":
        cache.close()
        kind, at = MoveKind(rest[0]), MoveStage(int(rest[1]))

        def kill(stage: MoveStage, job: MoveJob) -> None:
            if stage is at and job.kind is kind:
                print(f"DYING {kind} {stage.name} {job.key.hex()}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

        server = MetaServer(settings, mover_hook=kill)
        endpoint = server.start()
        server.serve(lambda: print(f"READY {endpoint} {os.getpid()}", flush=True))
    elif cmd == "sup":
        cache.close()
        run_root(cache_sup_spec(settings, intensity=10, period=60))
    else:
        sys.exit(f"unknown command {cmd!r}")


if __name__ == "__main__":
    main()
