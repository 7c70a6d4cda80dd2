"""The pods' sandbox image, made here: pause.c built static, packed as a docker-archive.

No registry can be pulled from, so ``registry.k8s.io/pause`` is replaced by a one-file image
of our own (:data:`configs.PAUSE_IMAGE`), cached under ``$DDP_CACHE/node/`` by the hash of
its source.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from importlib import resources
from pathlib import Path

from ..paths import cache_dir
from .configs import PAUSE_IMAGE


def _tar(members: dict[str, tuple[bytes, int]]) -> bytes:
    """A reproducible tar: fixed owners and times, members in the given order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (data, mode) in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def docker_archive(ref: str, binary: bytes, entrypoint: str) -> bytes:
    """A docker-archive (what ``docker save`` writes) of one layer holding ``binary``."""
    layer = _tar({entrypoint.lstrip("/"): (binary, 0o755)})
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": [entrypoint], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        },
        sort_keys=True,
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": [ref], "Layers": ["layer/layer.tar"]}]
    return _tar(
        {
            config_name: (config, 0o644),
            "layer/layer.tar": (layer, 0o644),
            "manifest.json": (json.dumps(manifest).encode(), 0o644),
        }
    )


def pause_archive() -> Path:
    """The cached archive, built with gcc on first use."""
    source = resources.files("ddp_devcluster.node").joinpath("pause.c").read_bytes()
    key = hashlib.sha256(source + PAUSE_IMAGE.encode()).hexdigest()[:12]
    out = cache_dir() / "node" / f"pause-{key}.tar"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    src, exe = out.with_suffix(".c"), out.with_suffix(".bin")
    src.write_bytes(source)
    subprocess.run(["gcc", "-static", "-O2", "-s", "-o", str(exe), str(src)], check=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(docker_archive(PAUSE_IMAGE, exe.read_bytes(), "/pause"))
    tmp.rename(out)
    src.unlink()
    exe.unlink()
    return out
