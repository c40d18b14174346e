"""ModelOptions / ContextOptions / SamplerParams refuse bad values, naming the field."""

from __future__ import annotations

import math

import pytest

from llamad.errors import ConfigError
from llamad.llama_ffi import (
    ContextOptions,
    FlashAttn,
    KVType,
    LoadMode,
    ModelOptions,
    PoolingType,
    RopeScaling,
    SamplerParams,
    SplitMode,
    default_threads,
)

pytestmark = pytest.mark.timeout(30)


def test_context_defaults_use_every_core() -> None:
    opts = ContextOptions()
    assert opts.n_threads == default_threads() >= 1
    assert opts.n_threads_batch == default_threads()


def test_enum_fields_accept_names_and_values() -> None:
    opts = ContextOptions(flash_attn="on", type_k="q8_0", pooling="mean")  # type: ignore[arg-type]
    assert opts.flash_attn is FlashAttn.ON
    assert opts.type_k is KVType.Q8_0
    assert opts.pooling is PoolingType.MEAN
    rope = ContextOptions(rope_scaling_type="yarn", rope_freq_base=10_000)  # type: ignore[arg-type]
    assert rope.rope_scaling_type is RopeScaling.YARN
    assert type(rope.rope_freq_base) is float
    mopts = ModelOptions(load_mode="mmap", split_mode=int(SplitMode.NONE))  # type: ignore[arg-type]
    assert mopts.load_mode is LoadMode.MMAP
    assert mopts.split_mode is SplitMode.NONE


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"n_ctx": 0}, "n_ctx"),
        ({"n_batch": 0}, "n_batch"),
        ({"n_batch": 64, "n_ubatch": 128}, "n_ubatch"),
        ({"n_seq_max": 0}, "n_seq_max"),
        ({"n_seq_max": 100_000}, "n_seq_max"),
        ({"n_ctx": 2, "n_seq_max": 4}, "n_ctx"),
        ({"n_threads": 0}, "n_threads"),
        ({"n_threads_batch": -1}, "n_threads_batch"),
        ({"flash_attn": "sometimes"}, "flash_attn"),
        ({"type_k": "q3_weird"}, "type_k"),
        ({"type_v": KVType.Q8_0, "flash_attn": FlashAttn.OFF}, "type_v"),
        ({"n_ctx": 1.5}, "n_ctx"),
        ({"embeddings": "yes"}, "embeddings"),
        ({"swa_full": 1}, "swa_full"),
        ({"rope_scaling_type": "stretchy"}, "rope_scaling_type"),
        ({"rope_freq_base": -1.0}, "rope_freq_base"),
        ({"rope_freq_scale": math.nan}, "rope_freq_scale"),
        ({"yarn_ext_factor": math.inf}, "yarn_ext_factor"),
        ({"yarn_attn_factor": 1e39}, "yarn_attn_factor"),
        ({"yarn_beta_fast": "fast"}, "yarn_beta_fast"),
        ({"yarn_beta_slow": True}, "yarn_beta_slow"),
        ({"yarn_orig_ctx": -1}, "yarn_orig_ctx"),
        ({"yarn_orig_ctx": 2**32}, "yarn_orig_ctx"),
    ],
)
def test_invalid_context_option_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        ContextOptions(**kwargs)  # type: ignore[arg-type]
    assert err.value.message.startswith(f"{field}:")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"n_gpu_layers": -2}, "n_gpu_layers"),
        ({"main_gpu": -1}, "main_gpu"),
        ({"load_mode": "floppy"}, "load_mode"),
        ({"split_mode": 99}, "split_mode"),
        ({"tensor_split": (1.0, math.nan)}, "tensor_split"),
        ({"tensor_split": (1.0,) * 10_000}, "tensor_split"),
        ({"vocab_only": 1}, "vocab_only"),
    ],
)
def test_invalid_model_option_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        ModelOptions(**kwargs)  # type: ignore[arg-type]
    assert err.value.message.startswith(f"{field}:")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": math.inf}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"typical_p": 0.0}, "typical_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"repeat_penalty": 0.0}, "repeat_penalty"),
        ({"frequency_penalty": math.nan}, "frequency_penalty"),
        ({"presence_penalty": math.inf}, "presence_penalty"),
        ({"penalty_last_n": -2}, "penalty_last_n"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**32 - 1}, "seed"),
        ({"logit_bias": {-3: 1.0}}, "logit_bias"),
        ({"logit_bias": {3: math.inf}}, "logit_bias"),
        ({"logit_bias": {3: "x"}}, "logit_bias"),
        ({"grammar_root": ""}, "grammar_root"),
        ({"min_keep": 0}, "min_keep"),
    ],
)
def test_invalid_sampler_param_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        SamplerParams(**kwargs)  # type: ignore[arg-type]
    assert err.value.message.startswith(f"{field}:")


def test_logit_bias_is_frozen_sorted_pairs() -> None:
    params = SamplerParams(logit_bias={7: -math.inf, 3: 2.0})  # type: ignore[arg-type]
    assert params.logit_bias == ((3, 2.0), (7, -math.inf))
    assert hash(params) == hash(SamplerParams(logit_bias=((7, -math.inf), (3, 2.0))))


def test_zero_temperature_means_greedy() -> None:
    assert SamplerParams(temperature=0.0).is_greedy
    assert SamplerParams(greedy=True).is_greedy
    assert not SamplerParams().is_greedy
