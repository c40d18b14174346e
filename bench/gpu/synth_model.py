"""A random-weight stand-in for the default model, for machines it cannot reach.

The device machine (bench/gpu/README.md) takes at most 64 MiB per call and
cannot download, while SmolLM2-135M-Instruct Q4_1 is 98 MB. The restore path
depends on the model's shape (layers, KV heads, head size: the bytes a row
holds per token), not on its weights, so this writes a GGUF of the same
architecture, metadata and vocabulary with random f16 weights.

    python synth_model.py template REAL.gguf DIR   # here: vocab-only GGUF + tensor shapes
    python synth_model.py build DIR OUT.gguf       # there: the full random model

Needs llama.cpp's gguf-py (from the pinned source tree) on PYTHONPATH, and numpy.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gguf
import numpy as np

SKIP = {
    "GGUF.version",
    "GGUF.tensor_count",
    "GGUF.kv_count",
    "general.architecture",
    "general.file_type",
}


def template(real: str, out_dir: str) -> None:
    r = gguf.GGUFReader(real)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(out / "vocab.gguf"), arch=arch)
    for key, field in r.fields.items():
        if key in SKIP:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), vtype, sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    shapes = [{"name": t.name, "shape": [int(x) for x in t.shape]} for t in r.tensors]
    (out / "tensors.json").write_text(json.dumps({"arch": arch, "tensors": shapes}))


def build(in_dir: str, out_path: str) -> None:
    src = Path(in_dir)
    meta = json.loads((src / "tensors.json").read_text())
    r = gguf.GGUFReader(str(src / "vocab.gguf"))
    w = gguf.GGUFWriter(out_path, arch=meta["arch"])
    for key, field in r.fields.items():
        if key in SKIP:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), vtype, sub_type=sub)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    rng = np.random.default_rng(0)
    for t in meta["tensors"]:
        shape = tuple(reversed(t["shape"]))  # GGUF lists ne0 first; numpy wants rows first
        if len(shape) == 1:
            w.add_tensor(t["name"], np.ones(shape, dtype=np.float32))
        else:
            w.add_tensor(
                t["name"], (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)
            )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    {"template": template, "build": build}[sys.argv[1]](*sys.argv[2:])
