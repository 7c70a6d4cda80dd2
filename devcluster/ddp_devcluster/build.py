"""Build the control-plane binaries from the Go module proxy into a version-keyed cache.

Each tool is built from a tiny wrapper module that requires the upstream module at its
pinned version (Kubernetes' staging modules replaced by their published ``v0.X.Y``), so
nothing but the Go toolchain and the module proxy is needed. A finished tool lives in
``$DDP_CACHE/bin/<tool>-<version>/`` and is never rebuilt until its pin changes.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from . import versions
from .paths import cache_dir


@dataclass(frozen=True)
class GoTool:
    """One upstream Go module and the main packages to build from it."""

    name: str
    version: str
    module: str
    binaries: dict[str, str]  # binary name -> main package import path
    ldflags: list[str] = field(default_factory=list)
    staging_replaces: bool = False  # k8s.io/kubernetes needs its staging modules replaced
    # Start from the upstream module's go.sum: some of Kueue's dependencies are served by the
    # proxy but unknown to the checksum database, so their hashes come from upstream's go.sum.
    upstream_sums: bool = False
    tags: list[str] = field(default_factory=list)  # go build -tags
    # `go mod tidy -e`: tidy resolves imports under every build tag, and some that the tags
    # leave out (Prometheus' Nomad discovery) are refused by the module proxy.
    tidy_lenient: bool = False
    # Go files of the wrapper module itself (path -> source), for a tool whose main package we
    # write: CoreDNS with a chosen plugin list. A binary built from one names its package as
    # ``ddp-operator.local/build/<name>/<dir>``.
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def module_version(self) -> str:
        return f"v{self.version}"  # every module here tags its releases v<version>

    @property
    def install_dir(self) -> Path:
        # A tool with sources of our own is keyed by them too: a new CoreDNS plugin rebuilds it.
        key = f"-{_sources_key(self.sources)}" if self.sources else ""
        return cache_dir() / "bin" / f"{self.name}-{self.version}{key}"

    def installed(self) -> bool:
        return all((self.install_dir / b).is_file() for b in self.binaries)


def _sources_key(sources: dict[str, str]) -> str:
    text = "".join(f"{path}\0{src}\0" for path, src in sorted(sources.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _k8s_version_flags(pkg: str, version: str) -> list[str]:
    major, minor, _ = version.split(".")
    return [
        f"-X {pkg}.gitVersion=v{version}",
        f"-X {pkg}.gitMajor={major}",
        f"-X {pkg}.gitMinor={minor}",
        f"-X {pkg}.gitTreeState=clean",
        f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
    ]


def _kubernetes(name: str, *binaries: str) -> GoTool:
    """A build of ``binaries`` of k8s.io/kubernetes at the pinned version, stamped with it."""
    k = versions.KUBERNETES
    return GoTool(
        name=name,
        version=k,
        module="k8s.io/kubernetes",
        binaries={b: f"k8s.io/kubernetes/cmd/{b}" for b in binaries},
        ldflags=_k8s_version_flags("k8s.io/component-base/version", k)
        + _k8s_version_flags("k8s.io/client-go/pkg/version", k),
        staging_replaces=True,
    )


def tools() -> list[GoTool]:
    return [
        GoTool(
            name="etcd",
            version=versions.ETCD,
            module="go.etcd.io/etcd/server/v3",
            binaries={"etcd": "go.etcd.io/etcd/server/v3"},
        ),
        _kubernetes("kubernetes", "kube-apiserver", "kube-controller-manager", "kube-scheduler"),
        GoTool(
            name="kwok",
            version=versions.KWOK,
            module="sigs.k8s.io/kwok",
            binaries={"kwok": "sigs.k8s.io/kwok/cmd/kwok"},
        ),
        GoTool(
            name="helm",
            version=versions.HELM,
            module="helm.sh/helm/v4",
            binaries={"helm": "helm.sh/helm/v4/cmd/helm"},
            ldflags=[f"-X helm.sh/helm/v4/internal/version.version=v{versions.HELM}"],
        ),
        GoTool(
            name="kueue",
            version=versions.KUEUE,
            module="sigs.k8s.io/kueue",
            binaries={"kueue": "sigs.k8s.io/kueue/cmd/kueue"},
            ldflags=[f"-X sigs.k8s.io/kueue/pkg/version.GitVersion=v{versions.KUEUE}"],
            upstream_sums=True,
        ),
        GoTool(
            name="prometheus",
            version=versions.PROMETHEUS,
            module="github.com/prometheus/prometheus",
            binaries={"prometheus": "github.com/prometheus/prometheus/cmd/prometheus"},
            # Without the optional service discoveries (cloud providers, Nomad, ...): the tests
            # scrape static targets, and the build is half as long.
            tags=["remove_all_sd"],
            tidy_lenient=True,
        ),
        # The kind node image: kubelet and kube-proxy (and kubeadm, which kind runs on its
        # nodes) of the plane's version, built apart from the plane so that the plane's
        # binaries stay cached.
        _kubernetes("kubernetes-node", "kubelet", "kube-proxy", "kubeadm"),
        GoTool(
            name="containerd",
            version=versions.CONTAINERD,
            module="github.com/containerd/containerd/v2",
            binaries={
                b: f"github.com/containerd/containerd/v2/cmd/{b}"
                for b in ("containerd", "containerd-shim-runc-v2", "ctr")
            },
            ldflags=[
                f"-X github.com/containerd/containerd/v2/version.Version=v{versions.CONTAINERD}"
            ],
            # Snapshotters and plugins that need cgo or headers this machine lacks.
            tags=["no_btrfs", "no_zfs", "no_devmapper"],
            upstream_sums=True,
        ),
        GoTool(
            name="coredns",
            version=versions.COREDNS,
            module="github.com/coredns/coredns",
            binaries={"coredns": "ddp-operator.local/build/coredns/cmd/coredns"},
            ldflags=[f"-X github.com/coredns/coredns/coremain.GitCommit=v{versions.COREDNS}"],
            sources={"cmd/coredns/main.go": COREDNS_MAIN},
            upstream_sums=True,
        ),
        GoTool(
            name="local-path-provisioner",
            version=versions.LOCAL_PATH_PROVISIONER,
            module="github.com/rancher/local-path-provisioner",
            binaries={"local-path-provisioner": "github.com/rancher/local-path-provisioner"},
            upstream_sums=True,
        ),
        GoTool(
            name="kind",
            version=versions.KIND,
            module="sigs.k8s.io/kind",
            binaries={"kind": "sigs.k8s.io/kind"},
        ),
        GoTool(
            name="cni-plugins",
            version=versions.CNI_PLUGINS,
            module="github.com/containernetworking/plugins",
            binaries={
                p.rsplit("/", 1)[1]: f"github.com/containernetworking/plugins/plugins/{p}"
                for p in ("ipam/host-local", "main/loopback", "main/ptp", "meta/portmap")
            },
            upstream_sums=True,
        ),
        GoTool(
            name="registry",
            version=versions.DISTRIBUTION,
            module="github.com/distribution/distribution/v3",
            binaries={"registry": "github.com/distribution/distribution/v3/cmd/registry"},
            upstream_sums=True,
        ),
    ]


def binary(tool: str, name: str) -> Path:
    """The cached binary ``name`` of the tool named ``tool``; it must have been built."""
    path = next(t for t in tools() if t.name == tool).install_dir / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `make binaries` first")
    return path


# CoreDNS with the plugins a cluster's DNS uses (upstream's main links ~60, with every cloud
# SDK). The directive order is upstream's plugin.cfg order restricted to these plugins: it is
# the order in which a query passes through them.
COREDNS_PLUGINS = [
    "reload",
    "ready",
    "health",
    "prometheus",  # package plugin/metrics; kubeadm's Corefile (the kind cluster) has its line
    "errors",
    "log",
    "loadbalance",
    "cache",
    "kubernetes",
    "loop",
    "forward",
]
COREDNS_PACKAGES = {"prometheus": "metrics"}  # directive -> package, where they differ
COREDNS_MAIN = (
    "package main\n\nimport (\n"
    '\t"github.com/coredns/coredns/core/dnsserver"\n'
    '\t"github.com/coredns/coredns/coremain"\n'
    + "".join(
        f'\t_ "github.com/coredns/coredns/plugin/{COREDNS_PACKAGES.get(p, p)}"\n'
        for p in COREDNS_PLUGINS
    )
    + ")\n\nfunc init() {\n\tdnsserver.Directives = []string{\n"
    + "".join(f'\t\t"{p}",\n' for p in COREDNS_PLUGINS)
    + "\t}\n}\n\nfunc main() { coremain.Run() }\n"
)


def staging_modules(upstream_gomod: str) -> list[str]:
    """The ``k8s.io/<name>`` modules that k8s.io/kubernetes replaces with ./staging paths."""
    return sorted(
        set(re.findall(r"^\s*(k8s\.io/[\w.-]+)\s*=>\s*\./staging/", upstream_gomod, re.M))
    )


def wrapper_gomod(tool: GoTool, staging: list[str], go_version: str) -> str:
    """The go.mod of the wrapper module that builds ``tool``."""
    lines = [
        f"module {local_module(tool)}",
        "",
        f"go {go_version}",
        "",
        f"require {tool.module} {tool.module_version}",
    ]
    if staging:
        minor = tool.version.split(".", 1)[1]  # 1.36.3 -> staging v0.36.3
        lines += ["", "replace ("]
        lines += [f"\t{m} => {m} v0.{minor}" for m in staging]
        lines += [")"]
    return "\n".join(lines) + "\n"


def local_module(tool: GoTool) -> str:
    return f"ddp-operator.local/build/{tool.name}"


def wrapper_tools_go(tool: GoTool) -> str:
    """A build-tagged file importing the main packages, so ``go mod tidy`` resolves them."""
    upstream = {p for p in tool.binaries.values() if not p.startswith(local_module(tool) + "/")}
    imports = "\n".join(f'\t_ "{p}"' for p in sorted(upstream))
    return f"//go:build tools\n\npackage tools\n\nimport (\n{imports}\n)\n"


class BuildProgress:
    """A log line per few seconds: packages compiled, rate, elapsed time."""

    def __init__(self, label: str, total: int, every_s: float = 5.0) -> None:
        self.label, self.total, self.every_s = label, max(total, 1), every_s
        self.done = 0
        self.start = self.last = time.monotonic()

    def tick(self) -> None:
        self.done += 1
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            self.print(now)

    def print(self, now: float | None = None) -> None:
        elapsed = (now or time.monotonic()) - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        pct = min(100.0, 100.0 * self.done / self.total)
        print(
            f"   [{self.label}] {self.done}/{self.total} packages compiled ({pct:4.1f}%), "
            f"{rate:.1f} pkg/s, {elapsed:.0f}s elapsed",
            flush=True,
        )


def _go_env() -> dict[str, str]:
    return {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod -buildvcs=false"}


def _go(args: list[str], cwd: Path, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["go", *args], cwd=cwd, env=_go_env(), text=True, check=False, **kw)  # type: ignore[call-overload]


def _go_version() -> str:
    out = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True, check=True)
    return out.stdout.strip().removeprefix("go")


def _checked(proc: subprocess.CompletedProcess[str], what: str) -> subprocess.CompletedProcess[str]:
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed (exit {proc.returncode}):\n{proc.stderr or ''}")
    return proc


def build(tool: GoTool) -> float:
    """Build ``tool`` into its cache folder; returns seconds taken."""
    t0 = time.monotonic()
    src = cache_dir() / "src" / f"{tool.name}-{tool.version}"
    src.mkdir(parents=True, exist_ok=True)
    _write_module(tool, src)
    tmp = tool.install_dir.with_name(tool.install_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _compile(tool, src, tmp)
    shutil.rmtree(tool.install_dir, ignore_errors=True)
    tmp.rename(tool.install_dir)
    took = time.monotonic() - t0
    print(f">> {tool.name} {tool.version}: built in {took:.0f}s -> {tool.install_dir}", flush=True)
    return took


def _write_module(tool: GoTool, src: Path) -> None:
    """The wrapper module in ``src`` that requires ``tool``'s module, tidied."""
    print(
        f">> {tool.name} {tool.version}: resolving {tool.module}@{tool.module_version}", flush=True
    )
    staging: list[str] = []
    if tool.staging_replaces or tool.upstream_sums:
        dl = _checked(
            _go(
                ["mod", "download", "-json", f"{tool.module}@{tool.module_version}"],
                src,
                capture_output=True,
            ),
            f"go mod download {tool.module}",
        )
        info = json.loads(dl.stdout)
        if tool.staging_replaces:
            staging = staging_modules(Path(info["GoMod"]).read_text())
        if tool.upstream_sums:
            shutil.copyfile(Path(info["Dir"]) / "go.sum", src / "go.sum")
    (src / "go.mod").write_text(wrapper_gomod(tool, staging, _go_version()))
    (src / "tools.go").write_text(wrapper_tools_go(tool))
    for rel, text in tool.sources.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    tidy = ["mod", "tidy", *(["-e"] if tool.tidy_lenient else [])]
    _checked(_go(tidy, src, capture_output=True), f"go mod tidy for {tool.name}")


def output_name(pkg: str) -> str:
    """The file `go build -o DIR/` writes main package ``pkg`` to: its last path element, or
    the one before a major version suffix (``go.etcd.io/etcd/server/v3`` -> ``server``)."""
    parts = pkg.split("/")
    if len(parts) > 1 and re.fullmatch(r"v[0-9]+", parts[-1]):
        return parts[-2]
    return parts[-1]


def _compile(tool: GoTool, src: Path, out: Path) -> None:
    """One ``go build`` of ``tool``'s binaries into ``out``, counting packages as they go."""
    pkgs = list(tool.binaries.values())
    tags = ["-tags", ",".join(tool.tags)] if tool.tags else []
    deps = _checked(_go(["list", *tags, "-deps", *pkgs], src, capture_output=True), "go list -deps")
    progress = BuildProgress(tool.name, len(deps.stdout.split()))
    print(
        f">> {tool.name} {tool.version}: compiling {len(pkgs)} binaries "
        f"({progress.total} packages; cached packages are skipped)",
        flush=True,
    )
    ldflags = " ".join(["-s", "-w", *tool.ldflags])
    # No DWARF from the compiler either (the linker's -w drops it from the binary anyway): a
    # cold build of the registry took 64 s instead of 72 s here, 11% less CPU.
    gcflags = ["-gcflags", "all=-dwarf=false"]
    # One `go build` for all of a tool's binaries, into a folder: it links one while it still
    # compiles another (Kubernetes' three, cold: 216 s against 224 s one after another).
    command = ["go", "build", "-v", "-trimpath", *tags, *gcflags, "-ldflags", ldflags]
    proc = subprocess.Popen(
        [*command, "-o", f"{out}/", *pkgs], cwd=src, env=_go_env(), stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    errors = []
    for line in proc.stderr:
        if line.startswith(("#", " ", "\t")) or ":" in line:
            errors.append(line)
        else:
            progress.tick()
    if proc.wait() != 0:
        raise SystemExit(f"go build of {tool.name} failed:\n{''.join(errors)}")
    for binary, pkg in tool.binaries.items():
        if output_name(pkg) != binary:
            (out / output_name(pkg)).rename(out / binary)
    progress.print()


# What the kind cluster of `make up` and `make demo` runs (its node image's Kubernetes, etcd,
# containerd, CNI plugins, CoreDNS and local-path-provisioner; kind, the registry and Helm on
# this machine): they build these only, not kwok, Kueue and Prometheus (the tests' tools).
KIND_TOOLS = (
    "etcd", "kubernetes", "helm", "kubernetes-node", "containerd", "coredns",
    "local-path-provisioner", "kind", "cni-plugins", "registry",
)  # fmt: skip
SETS = {"all": None, "kind": KIND_TOOLS}


def ensure_all(force: bool = False, only: tuple[str, ...] | None = None) -> dict[str, float]:
    """Build every tool (or those named in ``only``) that is not cached yet; returns seconds
    per tool built."""
    timings: dict[str, float] = {}
    wanted = [t for t in tools() if only is None or t.name in only]
    missing = [t for t in wanted if force or not t.installed()]
    if not shutil.which("go") and missing:
        raise SystemExit(
            "Go is needed to build " + ", ".join(t.name for t in missing) + ": install Go >= 1.26"
        )
    later = []
    for t in wanted:
        if t not in missing:
            print(f">> {t.name} {t.version}: cached in {t.install_dir}", flush=True)
            continue
        with _building(t, wait=False) as held:
            if held:
                _build_unless_built(t, force, timings)
                continue
        # `make up` and `make demo` build on two sides (kind-binaries, kind-preload)
        print(f">> {t.name} {t.version}: another process builds it; on to the next", flush=True)
        later.append(t)
    for t in later:
        with _building(t, wait=True):
            _build_unless_built(t, False, timings)  # built unless the other process failed
    return timings


def _build_unless_built(t: GoTool, force: bool, timings: dict[str, float]) -> None:
    """With ``t``'s lock held: build it (``force``, or not installed), timed in ``timings``, or
    say that another process built it meanwhile."""
    if force or not t.installed():
        timings[t.name] = build(t)
    else:
        print(f">> {t.name} {t.version}: built by another process", flush=True)


@contextmanager
def flocked(lock: Path, waiting: str | None) -> Iterator[bool]:
    """Holds the flock of file ``lock`` (let go if its holder is killed) and yields True.
    When another process holds it: with ``waiting``, prints that and waits for it; without,
    yields False at once, holding nothing."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is None:
                yield False
                return
            print(f">> {waiting}", flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        yield True


def _building(tool: GoTool, wait: bool) -> contextlib.AbstractContextManager[bool]:
    """``tool``'s build lock: two processes never build one tool at once; the second either
    waits for the first and then finds it built, or goes on to another tool."""
    lock = cache_dir() / "bin" / f".{tool.name}-{tool.version}.lock"
    waiting = f"{tool.name} {tool.version}: another process builds it; waiting"
    return flocked(lock, waiting if wait else None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ddp-devcluster build", description=__doc__)
    ap.add_argument("--force", action="store_true", help="rebuild even when cached")
    ap.add_argument("--for", dest="what", choices=sorted(SETS), default="all",
                    help="all tools (the tests), or only what the kind cluster runs")  # fmt: skip
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    timings = ensure_all(force=args.force, only=SETS[args.what])
    if timings:
        total = time.monotonic() - t0
        print(f">> built {', '.join(timings)} in {total:.0f}s", flush=True)
        record = cache_dir() / "bin" / "build-times.json"
        old = json.loads(record.read_text()) if record.exists() else {}
        for name, secs in timings.items():
            tool = next(t for t in tools() if t.name == name)
            old[f"{name}-{tool.version}"] = round(secs, 1)
        record.write_text(json.dumps(old, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
