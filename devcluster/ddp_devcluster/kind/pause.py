"""The pods' sandbox binary, made here: pause.c built static with gcc (no registry can be pulled
from, so kind's node image gets ``registry.k8s.io/pause`` as a one-file image of our own:
:mod:`~ddp_devcluster.kind.nodeimage`), cached by the hash of its source."""

from __future__ import annotations

import hashlib
import subprocess
from importlib import resources
from pathlib import Path

from ..paths import cache_dir


def pause_binary() -> Path:
    """pause.c built static with gcc, cached by the hash of its source."""
    source = resources.files("ddp_devcluster.kind").joinpath("pause.c").read_bytes()
    exe = cache_dir() / "kind" / f"pause-{hashlib.sha256(source).hexdigest()[:12]}.bin"
    if exe.exists():
        return exe
    exe.parent.mkdir(parents=True, exist_ok=True)
    src, tmp = exe.with_suffix(".c"), exe.with_suffix(".tmp")
    src.write_bytes(source)
    subprocess.run(["gcc", "-static", "-O2", "-s", "-o", str(tmp), str(src)], check=True)
    tmp.rename(exe)
    src.unlink()
    return exe
