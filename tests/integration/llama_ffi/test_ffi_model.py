"""Model: load options, progress, introspection, metadata, lifetime (SPEC L2, L11)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamad.gateway.gguf_meta import read_gguf_meta
from llamad.llama_ffi import (
    Closed,
    ContextOptions,
    LoadCancelled,
    LoadMode,
    Model,
    ModelOptions,
    Unsupported,
)

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]


def test_introspection_matches_the_gguf_metadata(model: Model, model_path: Path) -> None:
    meta = model.metadata
    assert meta["general.architecture"] == "llama"
    assert model.n_vocab == int(meta["llama.vocab_size"]) == 49152
    assert model.n_embd == int(meta["llama.embedding_length"])
    assert model.n_layer == int(meta["llama.block_count"])
    assert model.n_ctx_train == int(meta["llama.context_length"])
    assert model.n_head == int(meta["llama.attention.head_count"])
    assert model.n_head_kv == int(meta["llama.attention.head_count_kv"])
    assert model.ftype_name.startswith("Q4_1")
    assert 0 < model.size < model_path.stat().st_size
    assert model.n_params > 100_000_000
    assert "llama" in model.description


def test_the_gateways_python_gguf_reader_agrees_with_llama_cpp(
    model: Model, model_path: Path
) -> None:
    """Ollama's /api/show reads the header in Python (the gateway loads no libllama)."""
    read = read_gguf_meta(model_path)
    assert read.parameter_count == model.n_params
    assert read.family == model.metadata["general.architecture"]
    assert model.ftype_name.startswith(read.quantization_level)
    strings = {k: v for k, v in read.values.items() if isinstance(v, str)}
    assert strings and all(model.metadata[k] == v for k, v in strings.items())
    numbers = {
        k: v
        for k, v in read.values.items()
        if isinstance(v, int) and not isinstance(v, bool) and k in model.metadata
    }
    assert numbers and all(int(model.metadata[k]) == v for k, v in numbers.items())


def test_chat_template_is_the_gguf_template(model: Model) -> None:
    template = model.chat_template()
    assert template is not None
    assert template == model.metadata["tokenizer.chat_template"]
    assert "<|im_start|>" in template
    assert model.chat_template("no-such-named-template") is None


def test_bos_eos_eog_flags_match_the_vocabulary(model: Model) -> None:
    meta = model.metadata
    assert model.bos == int(meta["tokenizer.ggml.bos_token_id"])
    assert model.eos == int(meta["tokenizer.ggml.eos_token_id"])
    assert model.eos is not None and model.is_eog(model.eos)
    assert model.eos in model.eog_tokens
    assert model.bos is not None and not model.is_eog(model.bos)
    plain = model.tokenize("Hello")[0]
    assert not model.is_eog(plain)
    assert not model.is_control(plain)
    assert model.is_control(model.eos)
    assert model.add_bos == (meta.get("tokenizer.ggml.add_bos_token") == "true")


def test_progress_callback_reports_rising_fractions_up_to_one(model_path: Path) -> None:
    seen: list[float] = []
    with Model(model_path, ModelOptions(load_mode=LoadMode.MMAP), progress=seen.append):
        pass
    assert seen, "progress was never reported"
    assert seen == sorted(seen)
    assert seen[-1] == pytest.approx(1.0)


def test_progress_callback_returning_false_cancels_the_load(model_path: Path) -> None:
    with pytest.raises(LoadCancelled):
        Model(model_path, progress=lambda _: False)


def test_progress_callback_exception_propagates_to_the_loader(model_path: Path) -> None:
    class Boom(Exception):
        pass

    def explode(_: float) -> bool:
        raise Boom

    with pytest.raises(Boom):
        Model(model_path, progress=explode)


def test_vocab_only_model_tokenizes_like_the_full_model(model: Model, model_path: Path) -> None:
    text = "Vocab-only models still tokenize: ñ, 漢字, 🦙."
    with Model(model_path, ModelOptions(vocab_only=True)) as vocab:
        assert vocab.tokenize(text) == model.tokenize(text)
        assert vocab.n_head == 0
        with pytest.raises(Unsupported):
            vocab.context(ContextOptions(n_ctx=256))


def test_closing_a_model_with_a_live_context_defers_the_free(model_path: Path) -> None:
    m = Model(model_path)
    ctx = m.context(ContextOptions(n_ctx=256))
    m.close()
    assert m.closed
    assert not m.native_handle.freed
    ctx.prefill([1, 2, 3])
    ctx.close()
    assert m.native_handle.freed


def test_model_calls_after_close_raise_closed(model_path: Path) -> None:
    m = Model(model_path, ModelOptions(vocab_only=True))
    m.close()
    with pytest.raises(Closed):
        m.tokenize("x")
    with pytest.raises(Closed):
        _ = m.metadata
    with pytest.raises(Closed):
        m.context()
