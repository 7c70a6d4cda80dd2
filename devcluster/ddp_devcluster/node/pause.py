"""The pods' sandbox image, made here: pause.c built static, packed as a docker-archive.

No registry can be pulled from, so ``registry.k8s.io/pause`` is replaced by a one-file image
of our own (:data:`configs.PAUSE_IMAGE`), cached under ``$DDP_CACHE/node/`` by the hash of
its source.
"""

from __future__ import annotations

import hashlib
import subprocess
from importlib import resources
from pathlib import Path

from ..archive import docker_archive, tar_members
from ..paths import cache_dir
from .configs import PAUSE_IMAGE


def pause_binary() -> Path:
    """pause.c built static with gcc, cached by the hash of its source."""
    source = resources.files("ddp_devcluster.node").joinpath("pause.c").read_bytes()
    exe = cache_dir() / "node" / f"pause-{hashlib.sha256(source).hexdigest()[:12]}.bin"
    if exe.exists():
        return exe
    exe.parent.mkdir(parents=True, exist_ok=True)
    src, tmp = exe.with_suffix(".c"), exe.with_suffix(".tmp")
    src.write_bytes(source)
    subprocess.run(["gcc", "-static", "-O2", "-s", "-o", str(tmp), str(src)], check=True)
    tmp.rename(exe)
    src.unlink()
    return exe


def pause_archive() -> Path:
    """The cached archive, built with gcc on first use."""
    source = resources.files("ddp_devcluster.node").joinpath("pause.c").read_bytes()
    key = hashlib.sha256(source + PAUSE_IMAGE.encode()).hexdigest()[:12]
    out = cache_dir() / "node" / f"pause-{key}.tar"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    layer = tar_members({"pause": (pause_binary().read_bytes(), 0o755)})
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(docker_archive([PAUSE_IMAGE], layer, ["/pause"], user="65535:65535"))
    tmp.rename(out)
    return out
