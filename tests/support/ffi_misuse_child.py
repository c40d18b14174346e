"""Child process for the misuse tests: run scenarios, report what each raised.

Usage: ``python ffi_misuse_child.py WORKDIR SCENARIO...``. For each scenario
it prints ``START <name>``, runs it, then prints
``RESULT <name> {"caught": <class name or null>, "code": <error code>}``.
A scenario that makes llama.cpp abort kills the process between START and
RESULT, which the parent reports as that scenario's failure.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

from llamad import paths
from llamad.errors import LlamadError
from llamad.llama_ffi import (
    Batch,
    Context,
    ContextOptions,
    Model,
    ModelOptions,
    PoolingType,
    Sampler,
    SamplerParams,
)

SCENARIOS: dict[str, Callable[[Path], object]] = {}


def scenario(fn: Callable[[Path], object]) -> Callable[[Path], object]:
    SCENARIOS[fn.__name__] = fn
    return fn


def model() -> Model:
    return Model(paths.default_model_path())


def ctx(m: Model | None = None, **kwargs: object) -> Context:
    opts = {"n_ctx": 512, "n_batch": 64, "n_ubatch": 64, "n_threads": 1, "n_threads_batch": 1}
    opts.update(kwargs)
    return (m or model()).context(ContextOptions(**opts))  # type: ignore[arg-type]


def greedy(m: Model, **kwargs: object) -> Sampler:
    return Sampler(m, SamplerParams(greedy=True, **kwargs))  # type: ignore[arg-type]


# -- sampling without logits ------------------------------------------------------


@scenario
def sample_before_any_decode(_: Path) -> object:
    m = model()
    return ctx(m).sample(greedy(m))


@scenario
def sample_row_without_logits(_: Path) -> object:
    m = model()
    c = ctx(m)
    b = Batch(8)
    b.add_tokens([10, 11, 12], 0, 0)  # only row 2 asks for logits
    c.decode(b)
    return c.sample(greedy(m), 0)


@scenario
def logits_before_decode(_: Path) -> object:
    return ctx().logits()


@scenario
def sample_after_clear(_: Path) -> object:
    m = model()
    c = ctx(m)
    c.prefill([10, 11, 12])
    c.clear()
    return c.sample(greedy(m))


@scenario
def generate_without_prefill(_: Path) -> object:
    m = model()
    return ctx(m).generate(greedy(m), 4)


# -- use after free -----------------------------------------------------------------


@scenario
def decode_after_context_close(_: Path) -> object:
    c = ctx()
    c.close()
    b = Batch(4)
    b.add(10, 0, 0, logits=True)
    return c.decode(b)


@scenario
def pack_after_context_close(_: Path) -> object:
    c = ctx()
    c.prefill([10, 11])
    c.close()
    return c.pack_seq(0, bytearray(1 << 20))


@scenario
def seq_op_after_context_close(_: Path) -> object:
    c = ctx()
    c.close()
    return c.seq_remove(0)


@scenario
def sample_with_closed_sampler(_: Path) -> object:
    m = model()
    c = ctx(m)
    c.prefill([10, 11])
    s = greedy(m)
    s.close()
    return c.sample(s)


@scenario
def tokenize_after_model_close(_: Path) -> object:
    m = model()
    m.close()
    return m.tokenize("hello")


@scenario
def context_on_closed_model(_: Path) -> object:
    m = model()
    m.close()
    return ctx(m)


@scenario
def close_while_another_thread_decodes(_: Path) -> object:
    c = ctx(n_batch=256, n_ubatch=256)
    started = threading.Event()
    failure: list[BaseException] = []

    def decode_until_closed() -> None:
        b = Batch(256)
        try:
            while True:
                b.clear()
                b.add_tokens([(i % 1000) + 100 for i in range(200)], 0, 0)
                started.set()
                c.decode(b)
                c.seq_remove(0)
        except BaseException as exc:
            failure.append(exc)

    worker = threading.Thread(target=decode_until_closed)
    worker.start()
    started.wait(60)
    c.close()  # waits for the in-flight decode, then frees
    worker.join(60)
    raise failure[0]


# -- batches ----------------------------------------------------------------------------


@scenario
def batch_larger_than_n_batch(_: Path) -> object:
    c = ctx(n_batch=32, n_ubatch=32)
    b = Batch(64)
    b.add_tokens(list(range(100, 140)), 0, 0)
    return c.decode(b)


@scenario
def empty_batch(_: Path) -> object:
    return ctx().decode(Batch(4))


@scenario
def token_id_at_n_vocab_in_batch(_: Path) -> object:
    m = model()
    b = Batch(4)
    b.add_tokens([10, m.n_vocab], 0, 0)
    return ctx(m).decode(b)


@scenario
def negative_token_in_batch(_: Path) -> object:
    b = Batch(4)
    b.add(-5, 0, 0, logits=True)
    return ctx().decode(b)


@scenario
def detokenize_out_of_range(_: Path) -> object:
    m = model()
    return m.detokenize([10, m.n_vocab + 7])


@scenario
def token_piece_out_of_range(_: Path) -> object:
    return model().token_piece(-1)


@scenario
def logit_bias_out_of_range(_: Path) -> object:
    m = model()
    return greedy(m, logit_bias={m.n_vocab: -1.0})


@scenario
def seq_id_out_of_range_in_batch(_: Path) -> object:
    b = Batch(4)
    b.add(10, 0, 1, logits=True)  # the context has one sequence
    return ctx().decode(b)


@scenario
def seq_id_out_of_range_in_seq_remove(_: Path) -> object:
    return ctx(n_seq_max=2).seq_remove(2)


@scenario
def seq_id_out_of_range_in_seq_copy(_: Path) -> object:
    return ctx().seq_copy(0, 5)


@scenario
def seq_id_out_of_range_in_pack(_: Path) -> object:
    return ctx().pack_seq(3, bytearray(1 << 20))


# -- running past the context ----------------------------------------------------------


@scenario
def position_past_n_ctx(_: Path) -> object:
    c = ctx()
    b = Batch(4)
    b.add(10, c.n_ctx_seq, 0, logits=True)
    return c.decode(b)


@scenario
def prefill_past_n_ctx(_: Path) -> object:
    c = ctx()
    return c.prefill([(i % 1000) + 100 for i in range(c.n_ctx_seq + 1)])


@scenario
def kv_cells_exhausted(_: Path) -> object:
    c = ctx(n_ctx=256, n_seq_max=2, kv_unified=True, n_batch=256, n_ubatch=256)
    c.prefill([(i % 1000) + 100 for i in range(200)], seq_id=0)
    return c.prefill([(i % 1000) + 100 for i in range(100)], seq_id=1)


@scenario
def positions_not_contiguous(_: Path) -> object:
    c = ctx()
    c.prefill([10, 11, 12])
    b = Batch(4)
    b.add(13, 10, 0, logits=True)
    return c.decode(b)


# -- files ---------------------------------------------------------------------------------


@scenario
def not_a_gguf_model(work: Path) -> object:
    path = work / "model.gguf"
    path.write_bytes(b"\x7fELF" + bytes(4096))
    return Model(path)


@scenario
def truncated_gguf_tensor_data(work: Path) -> object:
    src = paths.default_model_path()
    path = work / "half.gguf"
    with open(src, "rb") as fin, open(path, "wb") as fout:
        shutil.copyfileobj(fin, fout, src.stat().st_size // 2)
        fout.truncate(src.stat().st_size // 2)
    return Model(path)


@scenario
def truncated_gguf_header(work: Path) -> object:
    path = work / "head.gguf"
    with open(paths.default_model_path(), "rb") as fin:
        path.write_bytes(fin.read(4096))
    return Model(path)


@scenario
def adapter_not_gguf(work: Path) -> object:
    path = work / "adapter.gguf"
    path.write_bytes(b"not an adapter at all")
    return model().load_adapter(path)


@scenario
def adapter_is_a_model(_: Path) -> object:
    return model().load_adapter(paths.default_model_path())


@scenario
def adapter_general_type_not_string(work: Path) -> object:
    path = work / "typed.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_uint32("general.type", 7)  # llama.cpp reads it as a string and asserts
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", 4.0)
    w.add_tensor("blk.0.attn_q.weight.lora_a", np.zeros((4, 576), dtype=np.float32))
    w.add_tensor("blk.0.attn_q.weight.lora_b", np.zeros((576, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model().load_adapter(path)


# -- grammar, state, layouts -----------------------------------------------------------


@scenario
def invalid_grammar(_: Path) -> object:
    return greedy(model(), grammar="root ::= [0-9")


@scenario
def grammar_nothing_allowed(_: Path) -> object:
    m = model()
    digit_led = {t: float("-inf") for t in range(m.n_vocab) if m.token_piece(t)[:1].isdigit()}
    c = ctx(m)
    c.prefill(m.tokenize("Numbers:"))
    return c.sample(greedy(m, grammar="root ::= [0-9]+", logit_bias=digit_led))


@scenario
def unpack_garbage_state(_: Path) -> object:
    return ctx().unpack_seq(0, bytes(range(256)) * 64)


@scenario
def unpack_other_stream_layout(_: Path) -> object:
    m = model()
    single = ctx(m)
    single.prefill([10, 11, 12])
    state = bytearray(single.seq_state_size(0))
    single.pack_seq(0, state)
    return ctx(m, n_seq_max=4).unpack_seq(1, state)


@scenario
def partial_seq_copy_across_streams(_: Path) -> object:
    c = ctx(n_seq_max=2)
    c.prefill([10, 11, 12])
    return c.seq_copy(0, 1, 1, 2)


@scenario
def vocab_only_context(_: Path) -> object:
    vocab = Model(paths.default_model_path(), ModelOptions(vocab_only=True))
    return ctx(vocab)


@scenario
def mean_pooling_layout(_: Path) -> object:
    return ctx(embeddings=True, pooling=PoolingType.MEAN, n_seq_max=3)


@scenario
def embed_without_pooling(_: Path) -> object:
    return ctx(embeddings=True, pooling=PoolingType.NONE).embed([[10, 11]])


def run_one(name: str, work: Path) -> None:
    print(f"START {name}", flush=True)
    try:
        SCENARIOS[name](work)
    except LlamadError as exc:
        report = {"caught": type(exc).__name__, "code": exc.code}
    except BaseException as exc:
        traceback.print_exc()
        report = {"caught": f"unexpected {type(exc).__name__}", "code": None}
    else:
        report = {"caught": None, "code": None}
    print(f"RESULT {name} {json.dumps(report)}", flush=True)


def main() -> int:
    work = Path(sys.argv[1])
    for name in sys.argv[2:]:
        scenario_dir = work / name
        scenario_dir.mkdir(parents=True, exist_ok=True)
        run_one(name, scenario_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
