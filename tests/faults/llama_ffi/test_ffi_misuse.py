"""Every misuse the binding can detect raises a typed error instead of aborting.

The scenarios run in a child process (ffi_misuse_child.py), several per
process to keep the suite fast. Had a check been missing, llama.cpp's abort
kills the child between a scenario's START and RESULT lines: that scenario
is recorded as crashed (with the exit status and stderr) and a fresh child
carries on with the rest, so an abort can never take pytest down and never
hides the outcome of another scenario.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.model]

CHILD = Path(__file__).resolve().parents[2] / "support" / "ffi_misuse_child.py"

EXPECTED = {
    "sample_before_any_decode": "NoLogits",
    "sample_row_without_logits": "NoLogits",
    "logits_before_decode": "NoLogits",
    "sample_after_clear": "NoLogits",
    "generate_without_prefill": "NoLogits",
    "decode_after_context_close": "Closed",
    "pack_after_context_close": "Closed",
    "seq_op_after_context_close": "Closed",
    "sample_with_closed_sampler": "Closed",
    "tokenize_after_model_close": "Closed",
    "context_on_closed_model": "Closed",
    "close_while_another_thread_decodes": "Closed",
    "batch_larger_than_n_batch": "BatchTooLarge",
    "empty_batch": "BadRequest",
    "token_id_at_n_vocab_in_batch": "InvalidToken",
    "negative_token_in_batch": "InvalidToken",
    "detokenize_out_of_range": "InvalidToken",
    "token_piece_out_of_range": "InvalidToken",
    "logit_bias_out_of_range": "InvalidToken",
    "seq_id_out_of_range_in_batch": "InvalidSequence",
    "seq_id_out_of_range_in_seq_remove": "InvalidSequence",
    "seq_id_out_of_range_in_seq_copy": "InvalidSequence",
    "seq_id_out_of_range_in_pack": "InvalidSequence",
    "position_past_n_ctx": "ContextOverflow",
    "prefill_past_n_ctx": "ContextOverflow",
    "kv_cells_exhausted": "ContextOverflow",
    "positions_not_contiguous": "DecodeError",
    "not_a_gguf_model": "NotGGUF",
    "truncated_gguf_tensor_data": "TruncatedGGUF",
    "truncated_gguf_header": "TruncatedGGUF",
    "adapter_not_gguf": "NotGGUF",
    "adapter_is_a_model": "AdapterError",
    "adapter_general_type_not_string": "AdapterError",
    "invalid_grammar": "GrammarError",
    "grammar_nothing_allowed": "GrammarError",
    "unpack_garbage_state": "StateError",
    "unpack_other_stream_layout": "StateError",
    "partial_seq_copy_across_streams": "Unsupported",
    "vocab_only_context": "Unsupported",
    "mean_pooling_layout": "ConfigError",
    "embed_without_pooling": "EmbeddingsUnavailable",
}


def _run_all(work: Path) -> dict[str, dict[str, Any]]:
    """Outcome of every scenario; restarts the child after each crash."""
    env = {**os.environ, "LLAMAD_LLAMA_LOG": "off"}
    pending = sorted(EXPECTED)
    outcomes: dict[str, dict[str, Any]] = {}
    while pending:
        proc = subprocess.run(
            [sys.executable, str(CHILD), str(work), *pending],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            check=False,
        )
        started: str | None = None
        for line in proc.stdout.splitlines():
            if line.startswith("START "):
                started = line.split(" ", 1)[1]
            elif line.startswith("RESULT "):
                _, name, payload = line.split(" ", 2)
                outcomes[name] = json.loads(payload)
                started = None
        if started is not None:
            outcomes[started] = {
                "crashed": proc.returncode,
                "stderr": proc.stderr[-4000:],
            }
        elif proc.returncode != 0:
            pytest.fail(f"misuse child failed outside a scenario:\n{proc.stderr[-4000:]}")
        pending = [name for name in pending if name not in outcomes]
    return outcomes


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return _run_all(tmp_path_factory.mktemp("misuse"))


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("scenario", "expected"), sorted(EXPECTED.items()))
def test_misuse_raises_typed_error_and_the_process_survives(
    outcomes: dict[str, dict[str, Any]], scenario: str, expected: str
) -> None:
    outcome = outcomes[scenario]
    assert "crashed" not in outcome, (
        f"{scenario} killed the process (exit {outcome.get('crashed')}):\n{outcome.get('stderr')}"
    )
    assert outcome["caught"] == expected
