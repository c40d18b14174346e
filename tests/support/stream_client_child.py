"""A client process that opens a long stream and waits to be killed.

python stream_client_child.py REGISTRY_ROOT MODEL_ID
    prints STREAMING after the first token event, then blocks reading events
"""

from __future__ import annotations

import sys

from llamad.actors import Registry
from llamad.model.results import TokenEvent
from llamad.model.worker_client import WorkerClient


def main() -> None:
    root, model_id = sys.argv[1:3]
    worker = WorkerClient(model_id, registry=Registry(root))
    # A grammar that never completes: the stream cannot end on its own.
    stream = worker.infer(
        "Sing:", max_tokens=100_000, temperature=0.0, grammar='root ::= "la " root'
    )
    announced = False
    for event in stream:
        if isinstance(event, TokenEvent) and not announced:
            print("STREAMING", flush=True)
            announced = True


if __name__ == "__main__":
    main()
