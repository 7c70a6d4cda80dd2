"""Docker-archives (what ``docker save`` writes) of one layer, made without a registry or a
daemon: containerd's ``ctr images import`` and ``kind load image-archive`` read them."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info


def tar_members(members: dict[str, tuple[bytes, int]]) -> bytes:
    """A reproducible tar: fixed owners and times, members in the given order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (data, mode) in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(_clean(info), io.BytesIO(data))
    return buf.getvalue()


def tar_dir(root: Path) -> bytes:
    """A reproducible tar of a directory tree (symlinks kept), owned by root, times zeroed."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            rel = os.path.relpath(dirpath, root)
            if rel != ".":
                tar.addfile(_clean(tar.gettarinfo(dirpath, rel)))
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                info = _clean(tar.gettarinfo(path, os.path.normpath(os.path.join(rel, name))))
                if info.isreg():
                    with open(path, "rb") as fh:
                        tar.addfile(info, fh)
                else:
                    tar.addfile(info)
    return buf.getvalue()


def docker_archive(
    refs: list[str],
    layer: bytes,
    entrypoint: list[str],
    env: list[str] | None = None,
    user: str | None = None,
    compress: bool = False,
) -> bytes:
    """A docker-archive of the single uncompressed ``layer``, tagged with every ref in ``refs``.

    ``compress`` stores the layer gzipped (level 1): a third smaller, for images kept in a
    node image."""
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    if compress:
        layer = gzip.compress(layer, compresslevel=1, mtime=0)
    config: dict[str, object] = {"Entrypoint": entrypoint, "Env": env or [PATH_ENV]}
    if user:
        config["User"] = user
    blob = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        },
        sort_keys=True,
    ).encode()
    config_name = hashlib.sha256(blob).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": refs, "Layers": ["layer/layer.tar"]}]
    return tar_members(
        {
            config_name: (blob, 0o644),
            "layer/layer.tar": (layer, 0o644),
            "manifest.json": (json.dumps(manifest).encode(), 0o644),
        }
    )
