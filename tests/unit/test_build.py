"""The pinned Go tools' builds. Two processes that build the same tools (`make up` builds on
two sides) share the work through a real flock per tool: a tool another process builds is
skipped, then waited for, and built here only when that process died without building it. The
Go compile itself is replaced by writing the binaries (what is decided here is who builds what,
not how)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_devcluster import build
from ddp_devcluster.paths import source_path

# Holds tool a's lock as a build of it would; once told (the file "go", made when b is built
# there), writes a's binary ("finish") or dies without it ("die"); untold for 10 s, exits 2.
OTHER = """
import sys, time
from pathlib import Path
from ddp_devcluster.build import flocked
cache, how = Path(sys.argv[1]), sys.argv[2]
with flocked(cache / "bin" / ".a-1.0.lock", None) as held:
    assert held
    print("held", flush=True)
    deadline = time.monotonic() + 10
    while not (cache / "go").exists():  # never, were a waited for before b is built
        if time.monotonic() > deadline:
            raise SystemExit(2)
        time.sleep(0.01)
    if how == "die":
        raise SystemExit(1)
    (cache / "bin" / "a-1.0").mkdir(parents=True)
    (cache / "bin" / "a-1.0" / "a").write_text("built by the other process")
"""


def tool(name: str) -> build.GoTool:
    return build.GoTool(name=name, version="1.0", module=f"example.com/{name}",
                        binaries={name: f"example.com/{name}/cmd/{name}"})  # fmt: skip


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DDP_CACHE", str(tmp_path))
    monkeypatch.setattr(build, "tools", lambda: [tool("a"), tool("b")])
    monkeypatch.setattr(build.shutil, "which", lambda _: "/usr/bin/go")
    return tmp_path


def other_builder(cache: Path, how: str) -> subprocess.Popen[str]:
    env = {**os.environ, "DDP_CACHE": str(cache),
           "PYTHONPATH": source_path()}  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", OTHER, str(cache), how], env=env,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.parametrize("how", ["finish", "die"])
def test_a_tool_another_process_builds_is_skipped_then_waited_for(
    cache: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    built: list[str] = []

    def fake_build(t: build.GoTool) -> float:
        built.append(t.name)
        t.install_dir.mkdir(parents=True)
        (t.install_dir / t.name).write_text("built here")
        (cache / "go").touch()  # the other process goes on once b is built here
        return 1.0

    monkeypatch.setattr(build, "build", fake_build)
    other = other_builder(cache, how)
    timings = build.ensure_all(only=("a", "b"))
    assert other.wait(timeout=30) == (0 if how == "finish" else 1)
    if how == "finish":  # b built here while a was the other's; a then found built
        assert built == ["b"] and list(timings) == ["b"]
        assert (cache / "bin" / "a-1.0" / "a").read_text() == "built by the other process"
    else:  # the other died holding a's lock: a is built here after b
        assert built == ["b", "a"] and list(timings) == ["b", "a"]
        assert (cache / "bin" / "a-1.0" / "a").read_text() == "built here"


def test_one_go_build_names_each_binary_as_its_tool_does() -> None:
    """`go build -o DIR/` names a binary after its package; the few tools whose binary is
    called otherwise (etcd's main package is .../server/v3) are renamed, and no two binaries
    of a tool land on one file."""
    assert build.output_name("go.etcd.io/etcd/server/v3") == "server"
    assert build.output_name("sigs.k8s.io/kind") == "kind"
    assert (
        build.output_name("github.com/rancher/local-path-provisioner") == "local-path-provisioner"
    )
    for t in build.tools():
        names = [build.output_name(p) for p in t.binaries.values()]
        assert len(set(names)) == len(names), t.name
        renamed = {build.output_name(p) for b, p in t.binaries.items() if build.output_name(p) != b}
        assert not renamed & set(t.binaries), t.name  # a rename would overwrite another binary
