"""The system tools the test suite needs besides Python and a C toolchain.

``make setup`` runs ``tools.py --install``: a missing tool is installed from
the Debian packages where this process may (root, ``apt-get``), else named
with the command that installs it. ``.ci/run`` runs ``tools.py --check``
first, so a CI run fails at once instead of running a suite that cannot
test what these tools check (tests/support/tools.py makes the tests that use
them fail, not skip, when one is missing).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

#: command -> the Debian package that provides it, and what needs it.
TOOLS: dict[str, tuple[str, str]] = {
    "strace": ("strace", "the unit's syscall filter against the daemon's real syscalls"),
    "systemd-analyze": ("systemd", "the shipped unit's verification and syscall sets"),
    "redis-server": ("redis-server", "the shared remote KV tier's tests (a real Redis 7)"),
}


def missing() -> list[str]:
    return [cmd for cmd in TOOLS if shutil.which(cmd) is None]


def _install(commands: list[str]) -> bool:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return False
    packages = sorted({TOOLS[c][0] for c in commands})
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
    ):
        done = subprocess.run(argv, env=env, check=False, stdout=subprocess.DEVNULL)
        if done.returncode == 0 and argv[1] == "install":
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 when a tool is missing")
    mode.add_argument("--install", action="store_true", help="install what is missing, if allowed")
    args = parser.parse_args(argv)
    gone = missing()
    if gone and args.install:
        _install(gone)
        gone = missing()
    for cmd in gone:
        package, why = TOOLS[cmd]
        print(
            f"tools: {cmd} is missing (needed for {why}); install it with "
            f"`apt-get install {package}` (or your system's {package} package)",
            file=sys.stderr,
        )
    return 1 if gone and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
