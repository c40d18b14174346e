"""LoRA adapters: load, scale, unload, list (SPEC L10).

How adapters enter the cache namespace is the model layer's, tested in
``tests/integration/model``.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from llamad.llama_ffi import AdapterError, Closed, Context, LoraAdapter, Model
from lora_gguf import write_lora

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]

MakeCtx = Callable[..., Context]


@pytest.fixture(scope="module")
def adapter_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("lora")
    return write_lora(root / "a.gguf", seed=1), write_lora(root / "b.gguf", seed=2)


def _logits(ctx: Context, tokens: Sequence[int]) -> array[float]:
    ctx.clear()
    ctx.prefill(list(tokens))
    return ctx.logits()


@pytest.fixture
def prompt(model: Model) -> list[int]:
    return model.tokenize("The adapter under test changes what comes next:")


def test_scale_one_changes_logits_and_scale_zero_restores_them_exactly(
    model: Model, make_ctx: MakeCtx, adapter_files: tuple[Path, Path], prompt: list[int]
) -> None:
    ctx = make_ctx()
    base = _logits(ctx, prompt)
    adapter = model.load_adapter(adapter_files[0])
    try:
        ctx.set_adapter(adapter, 1.0)
        with_lora = _logits(ctx, prompt)
        assert max(abs(x - y) for x, y in zip(base, with_lora, strict=True)) > 1e-2
        ctx.set_adapter(adapter, 0.0)
        assert _logits(ctx, prompt) == base
        assert ctx.adapters == ((adapter, 0.0),)
    finally:
        adapter.unload()


def test_removing_or_unloading_restores_base_logits_exactly(
    model: Model, make_ctx: MakeCtx, adapter_files: tuple[Path, Path], prompt: list[int]
) -> None:
    ctx = make_ctx()
    base = _logits(ctx, prompt)
    adapter = model.load_adapter(adapter_files[0])
    ctx.set_adapter(adapter, 1.0)
    assert ctx.remove_adapter(adapter)
    assert not ctx.remove_adapter(adapter)
    assert _logits(ctx, prompt) == base

    ctx.set_adapter(adapter, 0.7)
    assert adapter in model.adapters
    adapter.unload()
    assert adapter.closed
    assert adapter not in model.adapters
    assert ctx.adapters == ()
    assert _logits(ctx, prompt) == base
    adapter.unload()  # idempotent
    with pytest.raises(Closed):
        ctx.set_adapter(adapter, 1.0)


def test_adapters_list_with_their_scales(
    model: Model, make_ctx: MakeCtx, adapter_files: tuple[Path, Path]
) -> None:
    ctx = make_ctx()
    a, b = (model.load_adapter(p) for p in adapter_files)
    try:
        ctx.set_adapter(a, 0.5)
        ctx.set_adapter(b, 1.5)
        ctx.set_adapter(a, 0.25)
        assert ctx.adapters == ((a, 0.25), (b, 1.5))
        assert set(model.adapters) >= {a, b}
        assert a.metadata["adapter.type"] == "lora"
        assert a.sha256 == hashlib.sha256(adapter_files[0].read_bytes()).digest()
    finally:
        a.unload()
        b.unload()


def test_adapter_keeps_the_model_alive_until_unloaded(
    model_path: Path, adapter_files: tuple[Path, Path]
) -> None:
    m = Model(model_path)
    adapter = m.load_adapter(adapter_files[0])
    m.close()
    assert not m.native_handle.freed
    adapter.unload()
    assert m.native_handle.freed


@pytest.mark.parametrize(
    "kwargs",
    [
        {"arch": "gpt2"},
        {"targets": [("blk.99.attn_q.weight", 576, 576)]},
        {"targets": [("blk.0.attn_q.weight", 100, 576)]},
        {"general_type": "model"},
    ],
    ids=["other-arch", "unknown-tensor", "wrong-shape", "not-an-adapter"],
)
def test_unusable_adapter_raises_adapter_error(
    model: Model, tmp_path: Path, kwargs: dict[str, object]
) -> None:
    path = write_lora(tmp_path / "bad.gguf", seed=3, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(AdapterError):
        model.load_adapter(path)


def test_adapter_is_tied_to_its_model(
    model: Model, model_path: Path, adapter_files: tuple[Path, Path]
) -> None:
    with Model(model_path) as other, other.context() as ctx:
        adapter = model.load_adapter(adapter_files[0])
        try:
            with pytest.raises(AdapterError):
                ctx.set_adapter(adapter)
        finally:
            adapter.unload()


def test_loaded_adapter_type_is_lora_adapter(
    model: Model, adapter_files: tuple[Path, Path]
) -> None:
    adapter = model.load_adapter(adapter_files[1])
    assert isinstance(adapter, LoraAdapter)
    adapter.unload()
