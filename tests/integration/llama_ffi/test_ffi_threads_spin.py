"""The binding bounds libgomp's barrier spin before libgomp loads (SPEC M14).

Each case runs in a fresh interpreter: libgomp reads GOMP_SPINCOUNT once, when
it is loaded, and this test process loaded it long ago.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llamad.llama_ffi.spin import DEFAULT_SPINCOUNT, SpinSetting, bound_openmp_spin

pytestmark = [pytest.mark.timeout(120)]

_SPIN_ENV = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "LLAMAD_GOMP_SPINCOUNT")

_PROBE = """
import json, os
maps = lambda: open("/proc/self/maps").read()
pre_loaded = "libgomp" in maps()
{prelude}
from llamad.llama_ffi import native
from llamad.llama_ffi.spin import spin_setting
print(json.dumps({{
    "pre_loaded": pre_loaded,
    "post_loaded": "libgomp" in maps(),
    "setting": spin_setting().value,
    "spincount": os.environ.get("GOMP_SPINCOUNT"),
    "policy": os.environ.get("OMP_WAIT_POLICY"),
}}))
"""


def _probe(extra_env: dict[str, str], prelude: str = "") -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k not in _SPIN_ENV}
    env.update(extra_env)
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(prelude=prelude)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_the_binding_bounds_the_spin_before_libgomp_loads() -> None:
    seen = _probe({})
    assert seen["pre_loaded"] is False
    assert seen["post_loaded"] is True  # the pinned CPU build links libgomp
    assert seen["setting"] == SpinSetting.BOUNDED.value
    assert seen["spincount"] == str(DEFAULT_SPINCOUNT)


@pytest.mark.parametrize("operator_env", [{"GOMP_SPINCOUNT": "123"}, {"OMP_WAIT_POLICY": "active"}])
def test_an_operator_spin_policy_is_left_alone(operator_env: dict[str, str]) -> None:
    seen = _probe(operator_env)
    assert seen["setting"] == SpinSetting.OPERATOR.value
    assert seen["spincount"] == operator_env.get("GOMP_SPINCOUNT")
    assert seen["policy"] == operator_env.get("OMP_WAIT_POLICY")


def test_a_child_of_a_llamad_process_keeps_the_bound_as_llamad_s() -> None:
    # This test process loaded the binding: its environment carries the bound.
    assert os.environ.get("GOMP_SPINCOUNT") == str(DEFAULT_SPINCOUNT)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY",)}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(prelude="")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["setting"] == SpinSetting.BOUNDED.value
    assert seen["spincount"] == str(DEFAULT_SPINCOUNT)


def test_an_operator_value_equal_to_ours_is_still_the_operator_s() -> None:
    seen = _probe({"GOMP_SPINCOUNT": str(DEFAULT_SPINCOUNT)})
    assert seen["setting"] == SpinSetting.OPERATOR.value


def test_libgomp_loaded_before_the_binding_is_reported_not_bounded() -> None:
    seen = _probe({}, prelude='import ctypes; ctypes.CDLL("libgomp.so.1")')
    assert seen["pre_loaded"] is False
    assert seen["setting"] == SpinSetting.TOO_LATE.value
    assert seen["spincount"] is None  # setting it now would only mislead children


def test_bound_openmp_spin_on_a_given_environment(tmp_path: Path) -> None:
    clean = tmp_path / "maps"
    clean.write_text("7f00-7f01 r-xp 0 0:0 0 /usr/lib/libc.so.6\n")
    env: dict[str, str] = {}
    assert bound_openmp_spin(env, spincount=42, maps=clean) is SpinSetting.BOUNDED
    assert env == {"GOMP_SPINCOUNT": "42", "LLAMAD_GOMP_SPINCOUNT": "42"}
    assert bound_openmp_spin(env, spincount=42, maps=clean) is SpinSetting.BOUNDED  # inherited

    loaded = tmp_path / "maps-gomp"
    loaded.write_text("7f00-7f01 r-xp 0 0:0 0 /usr/lib/libgomp.so.1\n")
    env = {}
    assert bound_openmp_spin(env, maps=loaded) is SpinSetting.TOO_LATE
    assert env == {}

    env = {"OMP_WAIT_POLICY": "passive"}
    assert bound_openmp_spin(env, maps=clean) is SpinSetting.OPERATOR
    assert env == {"OMP_WAIT_POLICY": "passive"}
