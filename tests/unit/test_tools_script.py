"""scripts/tools.py: the system tools the suite needs are checked before it runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.timeout(30)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "tools.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("llamad_tools_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_a_missing_tool_fails_the_check_and_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tools = _load()
    monkeypatch.setitem(tools.TOOLS, "no-such-tool-llamad", ("no-such-package", "a test"))
    assert tools.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "no-such-tool-llamad is missing" in err
    assert "apt-get install no-such-package" in err


def test_the_tools_the_suite_runs_are_listed_and_present_here() -> None:
    tools = _load()
    assert {"strace", "systemd-analyze"} <= set(tools.TOOLS)
    assert tools.main(["--check"]) == 0, "make setup installs them (scripts/tools.py)"
