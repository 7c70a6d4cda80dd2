"""Which package may import which: the operator, the trainer and the user's client share only
``ddp_api``; ``ddp_api`` imports none of them. Each check imports every module of a package in
a fresh interpreter and reads which of this project's packages came in with it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ddp_devcluster.paths import source_path

PROJECT = ("ddp_api", "ddp_client", "ddp_operator", "ddp_trainer", "ddp_devcluster")

# Imports every module of the package named by argv[1]; prints the project packages loaded.
PROBE = """
import importlib, json, pkgutil, sys
package = importlib.import_module(sys.argv[1])
for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
    if not info.name.endswith("__main__"):
        importlib.import_module(info.name)
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules if m.startswith("ddp_")})))
"""


def imported_with(package: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, package],
        env={"PYTHONPATH": source_path(), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return set(json.loads(out.stdout.splitlines()[-1])) & set(PROJECT)


@pytest.mark.parametrize(
    ("package", "allowed"),
    [
        ("ddp_api", {"ddp_api"}),
        ("ddp_client", {"ddp_api", "ddp_client"}),
        ("ddp_operator", {"ddp_api", "ddp_operator"}),
        ("ddp_trainer", {"ddp_api", "ddp_trainer"}),
    ],
)
def test_a_package_imports_only_itself_and_the_shared_api(package: str, allowed: set[str]) -> None:
    got = imported_with(package)
    assert package in got
    assert got <= allowed, f"{package} imports {sorted(got - allowed)}"
