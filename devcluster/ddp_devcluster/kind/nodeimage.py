"""The kind node image, assembled from the cached binaries; tagged by a hash of its inputs and
built only when that tag is missing from podman storage."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
import subprocess
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from .. import versions
from ..archive import docker_archive, tar_dir, tar_members
from ..build import binary, flocked, tools
from ..containers import podman, podman_checked, podman_env
from ..paths import cache_dir
from .pause import pause_binary

FILES = Path(__file__).parent / "files"
REPO = "localhost/ddp-kind-node"
PRELOAD_LABEL = "dev.ddp.preload"  # a node image's label: the key of its preload
BASE_REPO = "localhost/ddp-kind-base"
PYTHON_BASE = "docker.io/library/python:3.11-slim-bookworm"
# The sandbox image of kind's containerd config; kubeadm 1.36 lists the same (both are tags of
# our static pause binary).
PAUSE_REF = "registry.k8s.io/pause:3.10.2"
# The ReadWriteMany class: local-path-provisioner's shared-filesystem mode over SHARED_PATH,
# which cluster.py bind-mounts from one host folder into every node, so a volume's files are
# the same on every machine (what NFS, CephFS, Filestore or EFS give a real cluster).
SHARED_CLASS = "ddp-shared"
SHARED_PATH = "/ddp-shared"
# The trainer image's dependency layers, unpacked once on this host and mounted read-only into
# every node there (cluster.py): the node image's containerd has them as overlayfs snapshots
# whose folders are links to PRELOAD_PATH, so that kubelet's pull of the trainer image finds
# their chain IDs and fetches and unpacks only the code layers.
PRELOAD_PATH = "/ddp-preload"
PRELOAD_REPO = "ddp.local/preload/trainer-deps"
Log = Callable[[str], None]


def kind_module() -> Path:
    """kind's Go module in the module cache (``go install`` of kind put it there).

    Its images/base/files (entrypoint, containerd config, kubelet units, /kind/bin scripts) and
    its default storage manifest are kind's own runtime files, which a kind node image must
    contain; they are read from there at build time, not copied into this repository."""
    gomodcache = subprocess.run(
        ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True
    ).stdout.strip()
    path = Path(gomodcache) / f"sigs.k8s.io/kind@v{versions.KIND}"
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is missing: run `make binaries` (it builds kind)")
    return path


# --- pure decisions -------------------------------------------------------------------------


def containerd_config(kind_config: str) -> str:
    """kind's containerd config.toml, changed for this machine and the host registry."""
    fuse = r'\[proxy_plugins\]\n(#.*\n)?\[proxy_plugins\."fuse-overlayfs"\]\n(  .*\n)+'
    out = re.sub(fuse, "", kind_config)  # no fuse-overlayfs here (it is for rootless)
    # The sandbox lacks CAP_SYS_RESOURCE: without this every pod sandbox fails with
    # "can't get final child's PID from pipe: EOF" (oom_score_adj -998 is refused).
    out = out.replace("restrict_oom_score_adj = false", "restrict_oom_score_adj = true")
    out = re.sub(r'sandbox_image = ".*"', f'sandbox_image = "{PAUSE_REF}"', out)
    if "restrict_oom_score_adj = true" not in out or "fuse-overlayfs" in out:
        raise ValueError("kind's containerd config.toml changed shape: update containerd_config")
    return (
        out
        + "\n# registries: per-host config (localhost:5001 is the host registry, see hosts.toml)\n"
        + '[plugins."io.containerd.grpc.v1.cri".registry]\n'
        + '  config_path = "/etc/containerd/certs.d"\n'
    )


def storage_manifest(const_storage_go: str) -> tuple[str, dict[str, str]]:
    """kind's default-storage.yaml from its const_storage.go, and its two image refs."""
    refs = dict(re.findall(r'const (storage\w+Image) = "([^"]+)"', const_storage_go))
    body = re.search(r"const defaultStorageManifest = `(.*?\n)`$", const_storage_go, re.S | re.M)
    if len(refs) != 2 or body is None:
        raise ValueError("kind's const_storage.go changed shape: update storage_manifest")
    text = re.sub(r"` \+ (storage\w+Image) \+ `", lambda m: refs[m.group(1)], body.group(1))
    return text.lstrip("\n"), {
        "provisioner": refs["storageProvisionerImage"],
        "helper": refs["storageHelperImage"],
    }


def with_shared_class(manifest: str, default_class: str = "standard") -> str:
    """kind's storage manifest with a second, ReadWriteMany class: the provisioner's
    ``storageClassConfigs`` keep kind's node-local paths for ``default_class`` and give
    SHARED_CLASS the shared-filesystem path (no node affinity; any access mode)."""
    block = re.search(r"  config.json: \|-\n((?:    .*\n)+)", manifest)
    if block is None or "nodePathMap" not in block.group(1):
        raise ValueError("kind's storage manifest changed shape: update with_shared_class")
    node_local = json.loads(textwrap.dedent(block.group(1)))
    config = {
        "storageClassConfigs": {
            default_class: node_local,
            SHARED_CLASS: {"sharedFileSystemPath": SHARED_PATH},
        }
    }
    body = textwrap.indent(json.dumps(config, indent=2), "    ")
    out = manifest.replace(block.group(0), f"  config.json: |-\n{body}\n")
    shared = (
        "---\n"
        "apiVersion: storage.k8s.io/v1\n"
        "kind: StorageClass\n"
        "metadata:\n"
        f"  name: {SHARED_CLASS}\n"
        "provisioner: rancher.io/local-path\n"
        "volumeBindingMode: Immediate\n"
        "reclaimPolicy: Delete\n"
    )
    return out.rstrip("\n") + "\n\n" + shared


def control_plane_images(kubeadm_list: list[str]) -> dict[str, str]:
    """kubeadm's image refs (``kubeadm config images list``) by the component each one runs."""
    out = {}
    for ref in kubeadm_list:
        name = ref.rsplit("/", 1)[1].split(":", 1)[0]
        out[name] = ref
    expected = {
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kube-proxy",
        "coredns",
        "pause",
        "etcd",
    }
    if set(out) != expected:
        raise ValueError(f"kubeadm lists {sorted(out)}, expected {sorted(expected)}")
    return out


def input_key(parts: dict[str, bytes]) -> str:
    """The hash that tags an image: every input's name and content."""
    h = hashlib.sha256()
    for name in sorted(parts):
        h.update(name.encode() + b"\0" + hashlib.sha256(parts[name]).digest())
    return h.hexdigest()[:12]


def dependency_layers(history: list[dict[str, Any]]) -> int:
    """How many of an image's layers are its dependencies: those up to the last one a RUN step
    made (the trainer's Dockerfile installs everything, then COPYs the code last), from the
    image's history (OCI config ``history``: ``created_by``, ``empty_layer``)."""
    made = [h.get("created_by", "") for h in history if not h.get("empty_layer")]
    runs = [i for i, by in enumerate(made) if "#(nop)" not in by]
    if not runs:
        raise ValueError("no layer of the image was made by a RUN step")
    return runs[-1] + 1


def chain_id(diff_ids: list[str]) -> str:
    """The chain ID of a stack of layers (the OCI image spec's ChainID), which containerd names
    an unpacked layer's snapshot by."""
    out = diff_ids[0]
    for d in diff_ids[1:]:
        out = "sha256:" + hashlib.sha256(f"{out} {d}".encode()).hexdigest()
    return out


def dependency_image(
    manifest: dict[str, Any], config: dict[str, Any], count: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The manifest and config of an image of the first ``count`` layers of another (no
    entrypoint, no environment): the trainer's dependencies, for the node image to unpack."""
    history, made = [], 0
    for h in config["history"]:
        if made == count:
            break
        history.append(h)
        made += 0 if h.get("empty_layer") else 1
    cfg = {
        "architecture": config["architecture"],
        "os": config["os"],
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": config["rootfs"]["diff_ids"][:count]},
        "history": history,
    }
    man = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {},  # the caller fills in the config's descriptor
        "layers": manifest["layers"][:count],
    }
    return man, cfg


# --- I/O ------------------------------------------------------------------------------------


def _image_exists(ref: str) -> bool:
    return podman("image", "exists", ref).returncode == 0


def _buildah(context: Path, containerfile: Path, ref: str, log_file: Path, *args: str) -> None:
    with log_file.open("w") as log:
        proc = subprocess.run(
            ["nice", "-n", "10", "buildah", "build", "--pull=never", "--runtime", "runc",
             "-f", str(containerfile), "-t", ref, *args, str(context)],
            env=podman_env(), stdout=log, stderr=subprocess.STDOUT, check=False,
        )  # fmt: skip
    if proc.returncode != 0:
        tail = log_file.read_text()[-3000:]
        raise RuntimeError(f"buildah build of {ref} failed (log {log_file}):\n{tail}")


def _files_of(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def ensure_base(log: Log) -> str:
    """The base image (Debian + systemd + kind's base files), built when its tag is missing."""
    kind_files = kind_module() / "images" / "base" / "files"
    parts = {f"kind-base/{k}": v for k, v in _files_of(kind_files).items()}
    parts["base.Containerfile"] = (FILES / "base.Containerfile").read_bytes()
    ref = f"{BASE_REPO}:{input_key(parts)}"
    if _image_exists(ref):
        return ref
    work = cache_dir() / "kind" / "base-context"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(kind_files, work / "kind-base")
    t0 = time.monotonic()
    log(f"building {ref} (apt-get: systemd, iptables, runc, ...)")
    _buildah(work, FILES / "base.Containerfile", ref, cache_dir() / "kind" / "base-build.log")
    log(f"{ref} built in {time.monotonic() - t0:.0f}s")
    shutil.rmtree(work, ignore_errors=True)
    return ref


def _rootfs(base: str) -> Path:
    """kube-proxy's and the storage helper's root filesystems, made in the base image."""
    out = cache_dir() / "kind" / f"rootfs-{base.rsplit(':', 1)[1]}"
    if (out / "helper" / "bin" / "busybox").is_file():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    podman("run", "--rm", "--pull=never", "--network=none", "--entrypoint", "/bin/bash",
           "-v", f"{FILES / 'rootfs.sh'}:/rootfs.sh:ro,z", "-v", f"{tmp}:/out:z", base,
           "/rootfs.sh", check=True)  # fmt: skip
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def helper_image() -> str:
    """The busybox image every node holds (local-path-provisioner's helper), for test pods
    that need a shell, httpd and wget without a pull."""
    go = (kind_module() / "pkg/build/nodeimage/const_storage.go").read_text()
    return storage_manifest(go)[1]["helper"]


def helper_rootfs() -> Path:
    """The busybox root filesystem (for small test images); the base image must exist."""
    return _rootfs(ensure_base(lambda m: None)) / "helper"


def _single_binary_layer(binary_path: Path, at: str) -> bytes:
    return tar_members({at.lstrip("/"): (binary_path.read_bytes(), 0o755)})


def _kubectl() -> Path:
    from ..plane import kubectl_path

    return Path(kubectl_path())


def trainer_dependencies(log: Log) -> tuple[str, list[str]]:
    """The trainer image (built when it is missing) and the diff IDs of its dependency layers
    (:func:`dependency_layers`), which a change to its code leaves as they are."""
    from .. import images
    from ..containers import image_id

    ref = images.default_refs()["trainer"]
    if image_id(ref) is None:
        images.ensure_images(("trainer",), log)
    info = json.loads(podman("image", "inspect", ref, check=True).stdout)[0]
    return ref, list(info["RootFS"]["Layers"][: dependency_layers(info["History"])])


def preload_key(base: str, trainer_deps: list[str], containerd_config_text: str) -> str:
    """The preload's key: what its unpacked snapshots and containerd root depend on (the base
    image the import runs in, containerd's build and config, the dependency layers' chain ID),
    not the other binaries of the node image, so it can be made while those still build."""
    parts: dict[str, bytes] = {"base": base.encode()}
    parts["trainer-deps"] = chain_id(trainer_deps).encode()
    parts["containerd"] = str(
        next(t for t in tools() if t.name == "containerd").install_dir
    ).encode()
    parts["containerd-config.toml"] = containerd_config_text.encode()
    parts["import-images.sh"] = (FILES / "import-images.sh").read_bytes()
    return input_key(parts)


def preload_dir(key: str) -> Path:
    """The host folder of the trainer dependencies unpacked under ``key``, which every node of
    a cluster on a node image made with them mounts read-only at PRELOAD_PATH; beside it
    ``<key>.root``, the containerd root that knows them, which the node image starts from."""
    return cache_dir() / "kind" / "preload" / key


def preload_root(folder: Path) -> Path:
    """The containerd root beside preload ``folder`` (:func:`preload_dir`)."""
    return folder.with_name(folder.name + ".root")


class NodeImage(NamedTuple):
    ref: str
    preload: Path  # its nodes mount it at PRELOAD_PATH


def node_ref(base: str, preload: str) -> str:
    """The node image's tag: the Kubernetes version and a hash of every input, the preload of
    the trainer's dependency layers included (by its key, not by the trainer's code)."""
    kind = kind_module()
    parts: dict[str, bytes] = {"base": base.encode(), "preload": preload.encode()}
    parts.update({f"files/{k}": v for k, v in _files_of(FILES).items()})
    parts["nodeimage.py"] = Path(__file__).read_bytes()
    parts["const_storage.go"] = (kind / "pkg/build/nodeimage/const_storage.go").read_bytes()
    parts["config.toml"] = (kind / "images/base/files/etc/containerd/config.toml").read_bytes()
    # The binaries are keyed by their cache folders, which their pins (and CoreDNS' plugin
    # list) name; kubectl by its path, which names the lock's hash.
    for t in tools():
        parts[f"bin/{t.name}"] = str(t.install_dir).encode()
    parts["kubectl"] = str(_kubectl()).encode()
    parts["pause"] = pause_binary().read_bytes()
    return f"{REPO}:v{versions.KUBERNETES}-{input_key(parts)}"


def _write_images(dst: Path, rootfs: Path, storage_refs: dict[str, str]) -> None:
    kubeadm = binary("kubernetes-node", "kubeadm")
    listed = subprocess.run(
        [str(kubeadm), "config", "images", "list", f"--kubernetes-version=v{versions.KUBERNETES}"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    refs = control_plane_images(listed)
    single = {
        "kube-apiserver": binary("kubernetes", "kube-apiserver"),
        "kube-controller-manager": binary("kubernetes", "kube-controller-manager"),
        "kube-scheduler": binary("kubernetes", "kube-scheduler"),
        "etcd": binary("etcd", "etcd"),
    }
    archives: dict[str, tuple[list[str], bytes, list[str]]] = {}
    for name, path in single.items():
        # kubeadm's static pod manifests call the binary by name, through PATH
        at = f"/usr/local/bin/{name}"
        archives[name] = ([refs[name]], _single_binary_layer(path, at), [at])
    pause_refs = sorted({refs["pause"], PAUSE_REF})
    archives["pause"] = (pause_refs, _single_binary_layer(pause_binary(), "/pause"), ["/pause"])
    archives["coredns"] = (
        [refs["coredns"]],
        _single_binary_layer(binary("coredns", "coredns"), "/coredns"),
        ["/coredns"],
    )
    kp = rootfs / "kube-proxy"
    (kp / "usr/local/bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(binary("kubernetes-node", "kube-proxy"), kp / "usr/local/bin/kube-proxy")
    archives["kube-proxy"] = ([refs["kube-proxy"]], tar_dir(kp), ["/usr/local/bin/kube-proxy"])
    lpp = binary("local-path-provisioner", "local-path-provisioner")
    archives["local-path-provisioner"] = (
        [storage_refs["provisioner"]],
        _single_binary_layer(lpp, "/usr/local/bin/local-path-provisioner"),
        ["/usr/local/bin/local-path-provisioner"],
    )
    archives["local-path-helper"] = (
        [storage_refs["helper"]],
        tar_dir(rootfs / "helper"),
        ["/bin/sh"],
    )
    dst.mkdir(parents=True)
    for name, (tags, layer, entrypoint) in archives.items():
        (dst / f"{name}.tar").write_bytes(docker_archive(tags, layer, entrypoint, compress=True))


def _containerd_config_text() -> str:
    return containerd_config(
        (kind_module() / "images/base/files/etc/containerd/config.toml").read_text()
    )


def ensure_preload(log: Log = print) -> tuple[str, Path]:
    """The trainer's dependency layers unpacked by the node image's containerd (the slowest
    part of a node image, about two minutes cold): needs only the trainer image, the base
    image and containerd, so `make up` makes it while the other binaries still build. Returns
    the base image's ref and the preload's folder; builds what is missing."""
    base = ensure_base(log)
    trainer, deps = trainer_dependencies(log)
    config = _containerd_config_text()
    folder = preload_dir(preload_key(base, deps, config))
    with _preloads_held():
        if not (folder.is_dir() and preload_root(folder).is_dir()):
            _make_preload(base, trainer, len(deps), config, folder, log)
    return base, folder


def _preloads_held() -> contextlib.AbstractContextManager[bool]:
    """The lock of the preload folders: one process makes a preload or removes old ones."""
    lock = cache_dir() / "kind" / ".preload.lock"
    return flocked(lock, "another process makes or removes a preload; waiting")


def _make_preload(base: str, trainer: str, count: int, config: str, folder: Path, log: Log) -> None:
    root, ctx = preload_root(folder), folder.with_name(folder.name + ".ctx")
    shutil.rmtree(ctx, ignore_errors=True)
    (ctx / "images").mkdir(parents=True)
    (ctx / "containerd-config.toml").write_text(config)
    _containerd_root(ctx, base, trainer, count, folder, log)
    shutil.rmtree(root, ignore_errors=True)
    (ctx / "containerd").rename(root)
    shutil.rmtree(ctx)


def ensure_node_image(log: Log = print) -> NodeImage:
    """The node image and its preload folder; builds the base, the preload and the node image
    only when missing (about a minute for the node image; seconds when all exist)."""
    base, preload = ensure_preload(log)
    ref = node_ref(base, preload.name)
    if _image_exists(ref):
        return NodeImage(ref, preload)
    t0 = time.monotonic()
    log(f"building {ref}")
    kind = kind_module()
    ctx = cache_dir() / "kind" / "node-context"
    shutil.rmtree(ctx, ignore_errors=True)
    (ctx / "bin" / "cni").mkdir(parents=True)
    for name in ("containerd", "containerd-shim-runc-v2", "ctr"):
        shutil.copy2(binary("containerd", name), ctx / "bin")
    for name in ("kubeadm", "kubelet"):
        shutil.copy2(binary("kubernetes-node", name), ctx / "bin")
    shutil.copy2(_kubectl(), ctx / "bin" / "kubectl")
    for name in next(t for t in tools() if t.name == "cni-plugins").binaries:
        shutil.copy2(binary("cni-plugins", name), ctx / "bin" / "cni")
    (ctx / "containerd-config.toml").write_text(_containerd_config_text())
    storage, storage_refs = storage_manifest(
        (kind / "pkg/build/nodeimage/const_storage.go").read_text()
    )
    (ctx / "kind" / "manifests").mkdir(parents=True)
    (ctx / "kind" / "manifests" / "default-storage.yaml").write_text(with_shared_class(storage))
    shutil.copy2(FILES / "default-cni.yaml", ctx / "kind" / "manifests")
    (ctx / "kind" / "bin").mkdir()
    shutil.copy2(FILES / "kindnet-lite.sh", ctx / "kind" / "bin")
    (ctx / "kind" / "version").write_text(f"v{versions.KUBERNETES}\n")
    shutil.copy2(FILES / "kindnet-lite.service", ctx)
    (ctx / "certs.d" / "localhost:5001").mkdir(parents=True)
    shutil.copy2(FILES / "hosts.toml", ctx / "certs.d" / "localhost:5001")
    _write_images(ctx / "images", _rootfs(base), storage_refs)
    log(f"image archives written in {time.monotonic() - t0:.0f}s")
    shutil.copytree(preload_root(preload), ctx / "containerd", symlinks=True)
    _import_images(ctx, base, preload)
    _buildah(
        ctx,
        FILES / "node.Containerfile",
        ref,
        cache_dir() / "kind" / "node-build.log",
        "--build-arg",
        f"BASE={base}",
        "--label",
        f"{PRELOAD_LABEL}={preload.name}",
    )
    shutil.rmtree(ctx, ignore_errors=True)
    log(f"{ref} built in {time.monotonic() - t0:.0f}s")
    _remove_older(REPO, keep=ref, log=log)
    return NodeImage(ref, preload)


def _dependency_layout(saved: Path, layout: Path, count: int) -> list[str]:
    """An OCI layout of the first ``count`` layers of the image in OCI folder ``saved`` (its
    blobs linked, not copied), named PRELOAD_REPO:<its chain ID>; returns the layers' digests."""
    blobs = saved / "blobs" / "sha256"

    def blob(digest: str) -> dict[str, Any]:
        return dict(json.loads((blobs / digest.removeprefix("sha256:")).read_bytes()))

    index = json.loads((saved / "index.json").read_text())
    manifest = blob(index["manifests"][0]["digest"])
    man, cfg = dependency_image(manifest, blob(manifest["config"]["digest"]), count)
    out = layout / "blobs" / "sha256"
    out.mkdir(parents=True)

    def put(data: bytes, media_type: str) -> dict[str, Any]:
        digest = hashlib.sha256(data).hexdigest()
        (out / digest).write_bytes(data)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}

    man["config"] = put(json.dumps(cfg).encode(), "application/vnd.oci.image.config.v1+json")
    for layer in man["layers"]:
        name = layer["digest"].removeprefix("sha256:")
        (out / name).hardlink_to(blobs / name)
    desc = put(json.dumps(man).encode(), man["mediaType"])
    desc["annotations"] = {
        "org.opencontainers.image.ref.name": f"{PRELOAD_REPO}:"
        + chain_id(cfg["rootfs"]["diff_ids"]).removeprefix("sha256:")[:12]
    }
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [desc]}))
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    return [str(layer["digest"]) for layer in man["layers"]]


def _import_images(ctx: Path, base: str, preload: Path | None, layers: Sequence[str] = ()) -> None:
    """import-images.sh in a privileged container of the base image (overlayfs needs a real
    filesystem and mounts, which a buildah RUN step has not), on the containerd root
    ``ctx/containerd``: the archives of ``ctx/images`` imported, and the OCI layout
    ``ctx/layout`` of ``layers`` unpacked when there is one; ``preload`` mounted where the
    root's snapshots link to, when they do."""
    mounts = ["-v", f"{preload}:{PRELOAD_PATH}:ro"] if preload else []
    if (ctx / "layout").is_dir():
        mounts += ["-v", f"{ctx / 'layout'}:/layout:ro,z"]
    proc = podman(
        "run", "--rm", "--privileged", "--network=none", "--pull=never",
        "-e", f"LAYERS={' '.join(layers)}",
        "-v", f"{binary('containerd', 'containerd')}:/usr/local/bin/containerd:ro",
        "-v", f"{binary('containerd', 'ctr')}:/usr/local/bin/ctr:ro",
        "-v", f"{ctx / 'containerd-config.toml'}:/etc/containerd/config.toml:ro",
        "-v", f"{FILES / 'import-images.sh'}:/import-images.sh:ro,z",
        "-v", f"{ctx / 'images'}:/images:ro,z", *mounts,
        "-v", f"{ctx / 'containerd'}:/var/lib/containerd:z",
        "--entrypoint", "/bin/bash", base, "/import-images.sh",
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"import-images.sh failed:\n{(proc.stdout + proc.stderr)[-3000:]}")


def _containerd_root(
    ctx: Path, base: str, trainer: str, count: int, preload: Path, log: Log
) -> None:
    """containerd's root with the trainer's first ``count`` layers unpacked, in
    ``ctx/containerd`` (:func:`_import_images`), then the unpacked snapshots moved to
    ``preload`` and linked from where they were to PRELOAD_PATH, where every node mounts
    ``preload``."""
    t0 = time.monotonic()
    saved, layout, root = ctx / "trainer", ctx / "layout", ctx / "containerd"
    podman_checked("save", "--uncompressed", "--format", "oci-dir", "-o", str(saved), trainer)
    layers = _dependency_layout(saved, layout, count)
    log(f"{trainer}: its {count} dependency layers saved in {time.monotonic() - t0:.0f}s")
    root.mkdir()
    _import_images(ctx, base, None, layers)
    shutil.rmtree(saved)
    shutil.rmtree(layout)
    blobs = root / "io.containerd.content.v1.content" / "blobs" / "sha256"
    for digest in layers:  # removed from containerd's index; its collector may not have run
        (blobs / digest.removeprefix("sha256:")).unlink(missing_ok=True)
    snapshots = root / "io.containerd.snapshotter.v1.overlayfs" / "snapshots"
    tmp = preload.with_name(preload.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for snap in sorted(snapshots.iterdir()):
        snap.rename(tmp / snap.name)
        snap.symlink_to(f"{PRELOAD_PATH}/{snap.name}")
    shutil.rmtree(preload, ignore_errors=True)
    tmp.rename(preload)
    log(f"{trainer}'s dependencies unpacked into {preload} in {time.monotonic() - t0:.0f}s")


def _remove_older(repo: str, keep: str, log: Log) -> None:
    """Removes this repository's other node images (1 GB each) and the preload folders no node
    image names (4 GB each); an image a cluster runs on stays, and so does its preload."""
    tags = podman("images", "--format", "{{.Repository}}:{{.Tag}}", repo).stdout.split()
    for tag in tags:
        if tag != keep and tag.startswith(repo + ":") and podman("rmi", tag).returncode == 0:
            log(f"removed the older node image {tag}")
    label = '{{index .Labels "' + PRELOAD_LABEL + '"}} {{.Tag}}'
    # by label; an image made before the label named its preload folder by its own tag
    named = set(podman("images", "--format", label, repo).stdout.split())
    folders = cache_dir() / "kind" / "preload"
    with _preloads_held():  # not one that another process is making
        for folder in sorted(folders.iterdir()) if folders.is_dir() else []:
            if folder.name.removesuffix(".root").removesuffix(".ctx") not in named:
                shutil.rmtree(folder)
                log(f"removed {folder}")
