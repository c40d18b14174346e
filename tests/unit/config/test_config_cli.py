"""`llamad config check` and `llamad config example`; the shipped example and the
reference agree with the schema."""

from __future__ import annotations

import io
import re
import tomllib
from pathlib import Path
from typing import Any

import msgspec
import pytest

from config_helpers import Workspace, write_config
from llamad.actors.curve import write_keypair
from llamad.cli.config import check, example
from llamad.config.keys import Key, Section, Tables, fields_of
from llamad.config.reference import (
    BEGIN,
    DOC_PATH,
    END,
    EXAMPLE_PATH,
    reference_markdown,
    sections,
)
from llamad.config.schema import LlamadConfig

pytestmark = pytest.mark.timeout(60)


def _check(path: Path | None, env: dict[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = check(path, env=env, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def test_check_accepts_a_good_file_and_summarises_it(ws: Workspace) -> None:
    path = write_config(ws.dir, ws.data({("models", "smol", "keep_alive"): "10m"}))
    env = {**ws.env, "LLAMAD_DAEMON__LOG_LEVEL": "debug"}
    status, out, err = _check(path, env)
    assert (status, err) == (0, "")
    assert out.startswith(f"configuration ok: {path}\n")
    assert "environment overrides: LLAMAD_DAEMON__LOG_LEVEL" in out
    assert f"endpoint     ipc://{ws.env['LLAMAD_RUNTIME_DIR']}/llamad.sock" in out
    assert f"model smol: {ws.tiny} (n_ctx 1024" in out
    assert "keep_alive 10m" in out


def test_check_lists_every_problem_and_fails(ws: Workspace) -> None:
    data = ws.data({("models", "smol", "n_ctx"): 0, ("daemon", "log_levle"): "info"})
    status, out, err = _check(write_config(ws.dir, data), ws.env)
    assert status == 1
    assert out == ""
    assert "2 problems" in err
    assert "models.smol.n_ctx: expected an integer >= 1, got 0" in err
    assert "daemon.log_levle: unknown key (did you mean 'log_level'?)" in err


def test_check_of_a_missing_file_fails(ws: Workspace) -> None:
    status, _, err = _check(ws.dir / "absent.toml", ws.env)
    assert status == 1
    assert "absent.toml does not exist" in err


def test_the_example_passes_check(ws: Workspace) -> None:
    path = ws.dir / "example.toml"
    path.write_text(example())
    status, out, err = _check(path, ws.env)
    assert (status, err) == (0, "")
    assert "model smollm2:" in out
    assert "n_seq_max 4" in out  # a key the example sets


def test_the_shipped_example_is_the_generated_one() -> None:
    assert EXAMPLE_PATH.read_text() == example(), (
        "packaging/llamad.example.toml is stale: python -m llamad.config.reference --write"
    )


def test_the_docs_reference_is_the_generated_one() -> None:
    doc = DOC_PATH.read_text()
    generated = doc[doc.index(BEGIN) + len(BEGIN) : doc.index(END)]
    assert generated.strip() == reference_markdown().strip(), (
        "docs/internals/config.md is stale: python -m llamad.config.reference --write"
    )


def _schema_keys(cls: type[msgspec.Struct], path: tuple[str, ...]) -> set[tuple[str, ...]]:
    keys: set[tuple[str, ...]] = set()
    for f in fields_of(cls):
        assert f.struct is not None or isinstance(f.marker, Key)
        if isinstance(f.marker, Key):
            keys.add((*path, f.name))
        elif isinstance(f.marker, Section):
            assert f.struct is not None
            keys |= _schema_keys(f.struct, (*path, f.name))
        elif isinstance(f.marker, Tables):
            assert f.struct is not None
            name = f.marker.example_name or "smollm2"
            keys |= _schema_keys(f.struct, (*path, f.name, name))
    return keys


def _leaf_keys(table: dict[str, Any], path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    keys: set[tuple[str, ...]] = set()
    for name, value in table.items():
        if isinstance(value, dict):
            keys |= _leaf_keys(value, (*path, name))
        else:
            keys.add((*path, name))
    return keys


def test_the_example_uncommented_sets_every_key_to_a_valid_value(ws: Workspace) -> None:
    # Every commented default of the example, made live, is a valid config that
    # names every key of the schema: the example shows all of them, and none of
    # the defaults it shows is refused.
    live = re.sub(r"(?m)^# (\[|[a-z0-9_]+ = )", r"\1", example())
    doc = tomllib.loads(live)
    assert _leaf_keys(doc) == _schema_keys(LlamadConfig, ())
    server_key, server_pub = write_keypair(ws.dir, "server")
    clients = ws.dir / "clients"
    clients.mkdir()
    client_key, _ = write_keypair(clients, "alice")
    env = {
        **ws.env,
        # The example's sample directories and key files do not exist here.
        "LLAMAD_SECURITY__MODEL_DIRS": str([str(ws.models_dir), str(Path(ws.tiny).parent)]),
        "LLAMAD_MODELS__SMOLLM2__PATH": str(ws.tiny),
        "LLAMAD_SECURITY__CURVE_SECRET_KEY": str(server_key),
        "LLAMAD_SECURITY__CURVE_CLIENT_KEYS": str([str(clients)]),
        "LLAMAD_CLIENT__CURVE_SECRET_KEY": str(client_key),
        "LLAMAD_CLIENT__CURVE_SERVER_KEY": str(server_pub),
    }
    status, _, err = _check(write_config(ws.dir, live), env)
    assert (status, err) == (0, "")


def test_every_key_is_in_the_reference() -> None:
    reference = reference_markdown()
    for table in sections():
        assert f"### `[{'.'.join(table.path)}]`" in reference
        for f in fields_of(table.struct):
            if isinstance(f.marker, Key):
                assert f.marker.doc, f"{table.path}.{f.name} has no meaning"
                assert f"| `{f.name}` |" in reference
