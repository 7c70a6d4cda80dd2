"""Pure decisions of the test kubelet: no I/O here, every function is unit-tested.

What a pod's processes see (environment, argv, files of volumes, mounts) and what the
kubelet reports about them (phase, conditions, container statuses) are computed from plain
dicts, exactly as the API returns them, and from small records of process states.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Obj = Mapping[str, Any]

SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


class PodConfigError(ValueError):
    """The pod cannot be started as written (Kubernetes: CreateContainerConfigError)."""


# -- $(VAR) expansion ---------------------------------------------------------------------
def expand(text: str, lookup: Callable[[str], str | None]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: ``$$`` escapes, unknown names stay as written."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c != "$" or i + 1 >= n:
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            close = text.find(")", i + 2)
            if close < 0:
                out.append(text[i:])
                break
            name = text[i + 2 : close]
            value = lookup(name)
            out.append(f"$({name})" if value is None else value)
            i = close + 1
        else:
            out.append(c + nxt)
            i += 2
    return "".join(out)


# -- fieldRef -----------------------------------------------------------------------------
_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_ref(pod: Obj, path: str, pod_ip: str, host_ip: str) -> str:
    """The value of a downward-API ``fieldRef.fieldPath`` for ``pod``."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if path in simple:
        return str(simple[path])
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1]) or {}
        return "\n".join(f"{k}={json.dumps(v)}" for k, v in sorted(items.items()))
    m = _SUBSCRIPT.match(path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    raise PodConfigError(f"unsupported fieldRef {path!r}")


_CPU = re.compile(r"^(\d+(?:\.\d+)?)(m?)$")
_MEM_UNITS = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def quantity(value: str) -> float:
    """A Kubernetes resource quantity as a number (cpu in cores, memory in bytes)."""
    m = _CPU.match(value)
    if m:
        return float(m.group(1)) / (1000 if m.group(2) else 1)
    m = re.match(r"^(\d+(?:\.\d+)?)([kMGT]|[KMGT]i)$", value)
    if m and m.group(2) in _MEM_UNITS:
        return float(m.group(1)) * _MEM_UNITS[m.group(2)]
    raise PodConfigError(f"unsupported quantity {value!r}")


def resource_field_ref(container: Obj, ref: Obj, allocatable: Mapping[str, str]) -> str:
    """``resourceFieldRef``: the limit (else the node's allocatable) divided by ``divisor``."""
    res = ref.get("resource", "")
    kind, _, name = res.partition(".")
    value = (container.get("resources", {}).get(kind) or {}).get(name)
    if value is None:
        value = allocatable.get(name, "0")
    divisor = quantity(str(ref.get("divisor", "1")))
    amount = quantity(str(value)) / divisor
    return str(max(1, -int(-amount // 1)) if name == "cpu" else int(amount))


# -- environment and argv -----------------------------------------------------------------
@dataclass(frozen=True)
class PodContext:
    """What the environment of a container may refer to, fetched by the caller."""

    pod: Obj
    pod_ip: str
    host_ip: str
    configmaps: Mapping[str, Obj] = field(default_factory=dict)  # name -> ConfigMap
    secrets: Mapping[str, Obj] = field(default_factory=dict)  # name -> Secret
    allocatable: Mapping[str, str] = field(default_factory=dict)


def _secret_data(secret: Obj) -> dict[str, str]:
    return {
        k: base64.b64decode(v).decode(errors="replace")
        for k, v in (secret.get("data") or {}).items()
    } | dict(secret.get("stringData") or {})


def _configmap_data(cm: Obj) -> dict[str, str]:
    return dict(cm.get("data") or {})


def _key_ref(ctx: PodContext, ref: Obj, kind: str) -> str | None:
    objs = ctx.configmaps if kind == "configMap" else ctx.secrets
    obj = objs.get(ref.get("name", ""))
    optional = bool(ref.get("optional"))
    if obj is None:
        if optional:
            return None
        raise PodConfigError(f'{kind} "{ref.get("name")}" not found')
    data = _configmap_data(obj) if kind == "configMap" else _secret_data(obj)
    if ref["key"] not in data:
        if optional:
            return None
        raise PodConfigError(f'key "{ref["key"]}" not found in {kind} "{ref.get("name")}"')
    return data[ref["key"]]


def container_env(
    container: Obj, ctx: PodContext, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of one container, composed in Kubernetes' order.

    ``base`` (PATH, KUBERNETES_SERVICE_HOST, ...) comes first, as the image and the service
    links do; then ``envFrom`` in order; then ``env`` in order, each value ``$(VAR)``-expanded
    against what is defined before it.
    """
    env: dict[str, str] = dict(base or {})
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        if "configMapRef" in source:
            ref, kind = source["configMapRef"], "configMap"
        elif "secretRef" in source:
            ref, kind = source["secretRef"], "secret"
        else:
            continue
        obj = (ctx.configmaps if kind == "configMap" else ctx.secrets).get(ref.get("name", ""))
        if obj is None:
            if ref.get("optional"):
                continue
            raise PodConfigError(f'{kind} "{ref.get("name")}" not found')
        data = _configmap_data(obj) if kind == "configMap" else _secret_data(obj)
        env.update({prefix + k: v for k, v in data.items()})
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand(str(var.get("value", "")), env.get)
            continue
        src = var["valueFrom"]
        value: str | None
        if "fieldRef" in src:
            value = field_ref(ctx.pod, src["fieldRef"]["fieldPath"], ctx.pod_ip, ctx.host_ip)
        elif "configMapKeyRef" in src:
            value = _key_ref(ctx, src["configMapKeyRef"], "configMap")
        elif "secretKeyRef" in src:
            value = _key_ref(ctx, src["secretKeyRef"], "secret")
        elif "resourceFieldRef" in src:
            value = resource_field_ref(container, src["resourceFieldRef"], ctx.allocatable)
        else:
            raise PodConfigError(f"unsupported valueFrom for {name}: {sorted(src)}")
        if value is not None:
            env[name] = value
    return env


def container_argv(container: Obj, env: Mapping[str, str]) -> list[str]:
    """``command + args`` with ``$(VAR)`` expanded. Images are ignored, so there is no
    entrypoint to fall back to: a container needs a command (or args naming the program)."""
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    if not argv:
        raise PodConfigError(
            f"container {container.get('name')!r} has neither command nor args "
            "(the test kubelet ignores images, so it has no entrypoint to run)"
        )
    return [expand(str(a), env.get) for a in argv]


# -- volumes ------------------------------------------------------------------------------
@dataclass(frozen=True)
class VolumePlan:
    """Where one pod volume lives on the host, and what the kubelet writes into it."""

    name: str
    kind: str  # emptyDir, persistentVolumeClaim, hostPath, files
    host_path: str
    memory: bool = False  # emptyDir medium Memory: a tmpfs
    size_limit: str | None = None
    is_file: bool = False  # hostPath of type File / FileOrCreate
    readonly: bool = False


def _safe(part: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", part) or "_"


def plan_volumes(pod: Obj, state_dir: str) -> list[VolumePlan]:
    """Map each volume of ``pod`` to a directory under the kubelet's ``state_dir``.

    emptyDir and the file-backed kinds (configMap, secret, projected, downwardAPI) live in
    the pod's own directory; a persistentVolumeClaim is one directory per namespace and
    claim, shared by every pod that names it; a hostPath is kept per node under the state
    directory, never at the real host path.
    """
    meta, spec = pod["metadata"], pod.get("spec", {})
    pod_dir = f"{state_dir}/pods/{meta['uid']}/volumes"
    plans = []
    for vol in spec.get("volumes") or []:
        name = vol["name"]
        if "emptyDir" in vol:
            ed = vol["emptyDir"] or {}
            plans.append(
                VolumePlan(
                    name,
                    "emptyDir",
                    f"{pod_dir}/{_safe(name)}",
                    memory=ed.get("medium") == "Memory",
                    # tmpfs takes bytes, not Kubernetes quantities such as 2Gi
                    size_limit=(
                        str(int(quantity(str(ed["sizeLimit"])))) if ed.get("sizeLimit") else None
                    ),
                )
            )
        elif "persistentVolumeClaim" in vol:
            claim = vol["persistentVolumeClaim"]
            plans.append(
                VolumePlan(
                    name,
                    "persistentVolumeClaim",
                    f"{state_dir}/pvc/{_safe(meta['namespace'])}/{_safe(claim['claimName'])}",
                    readonly=bool(claim.get("readOnly")),
                )
            )
        elif "hostPath" in vol:
            hp = vol["hostPath"]
            rel = "/".join(_safe(p) for p in hp["path"].strip("/").split("/") if p)
            plans.append(
                VolumePlan(
                    name,
                    "hostPath",
                    f"{state_dir}/nodes/{_safe(spec.get('nodeName', ''))}/hostpath/{rel}",
                    is_file=hp.get("type") in ("File", "FileOrCreate"),
                )
            )
        elif any(k in vol for k in ("configMap", "secret", "projected", "downwardAPI")):
            plans.append(VolumePlan(name, "files", f"{pod_dir}/{_safe(name)}", readonly=True))
        else:
            kinds = sorted(set(vol) - {"name"})
            raise PodConfigError(f"volume {name!r}: unsupported kind {kinds}")
    return plans


@dataclass(frozen=True)
class FileSpec:
    path: str  # relative to the volume
    data: bytes
    mode: int


def _items(data: Mapping[str, bytes], items: list[Obj] | None, default_mode: int) -> list[FileSpec]:
    if not items:
        return [FileSpec(k, v, default_mode) for k, v in sorted(data.items())]
    out = []
    for item in items:
        if item["key"] not in data:
            raise PodConfigError(f"key {item['key']!r} not found")
        out.append(FileSpec(item["path"], data[item["key"]], item.get("mode", default_mode)))
    return out


def _cm_bytes(cm: Obj) -> dict[str, bytes]:
    out = {k: v.encode() for k, v in (cm.get("data") or {}).items()}
    out.update({k: base64.b64decode(v) for k, v in (cm.get("binaryData") or {}).items()})
    return out


def _secret_bytes(secret: Obj) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def _downward_files(items: list[Obj], ctx: PodContext, default_mode: int) -> list[FileSpec]:
    out = []
    for item in items:
        if "fieldRef" in item:
            value = field_ref(ctx.pod, item["fieldRef"]["fieldPath"], ctx.pod_ip, ctx.host_ip)
        else:
            raise PodConfigError(f"downwardAPI item {item.get('path')!r}: only fieldRef works")
        out.append(FileSpec(item["path"], value.encode(), item.get("mode", default_mode)))
    return out


def volume_files(vol: Obj, ctx: PodContext, tokens: Mapping[str, str]) -> list[FileSpec]:
    """The files of a configMap, secret, downwardAPI or projected volume.

    ``tokens`` maps ``audience|expirationSeconds`` of each serviceAccountToken source to a
    token the caller obtained with the TokenRequest API (see ``token_requests``).
    """
    if "configMap" in vol or "secret" in vol:
        kind = "configMap" if "configMap" in vol else "secret"
        src = vol[kind]
        ref_name = src.get("name") if kind == "configMap" else src.get("secretName")
        objs = ctx.configmaps if kind == "configMap" else ctx.secrets
        obj = objs.get(ref_name or "")
        if obj is None:
            if src.get("optional"):
                return []
            raise PodConfigError(f'{kind} "{ref_name}" not found')
        data = _cm_bytes(obj) if kind == "configMap" else _secret_bytes(obj)
        return _items(data, src.get("items"), src.get("defaultMode", 0o644))
    if "downwardAPI" in vol:
        src = vol["downwardAPI"]
        return _downward_files(src.get("items") or [], ctx, src.get("defaultMode", 0o644))
    src = vol["projected"]
    mode = src.get("defaultMode", 0o644)
    out: list[FileSpec] = []
    for source in src.get("sources") or []:
        if "serviceAccountToken" in source:
            sat = source["serviceAccountToken"]
            out.append(FileSpec(sat["path"], tokens[token_key(sat)].encode(), mode))
        elif "downwardAPI" in source:
            out += _downward_files(source["downwardAPI"].get("items") or [], ctx, mode)
        elif "configMap" in source or "secret" in source:
            kind = "configMap" if "configMap" in source else "secret"
            out += volume_files(
                {
                    kind: {
                        **source[kind],
                        "defaultMode": mode,
                        "secretName": source[kind].get("name"),
                    }
                },
                ctx,
                tokens,
            )
        else:
            raise PodConfigError(f"projected source {sorted(source)} is not supported")
    return out


def token_key(sat: Obj) -> str:
    return f"{sat.get('audience', '')}|{sat.get('expirationSeconds', 3600)}"


def token_requests(pod: Obj) -> list[Obj]:
    """The serviceAccountToken sources of ``pod``'s projected volumes (one per key)."""
    seen: dict[str, Obj] = {}
    for vol in pod.get("spec", {}).get("volumes") or []:
        for source in (vol.get("projected") or {}).get("sources") or []:
            if "serviceAccountToken" in source:
                sat = source["serviceAccountToken"]
                seen.setdefault(token_key(sat), sat)
    return list(seen.values())


def referenced_objects(pod: Obj) -> tuple[set[str], set[str]]:
    """Names of the ConfigMaps and Secrets the pod's volumes and environment refer to."""
    cms: set[str] = set()
    secrets: set[str] = set()
    spec = pod.get("spec", {})
    for vol in spec.get("volumes") or []:
        if "configMap" in vol:
            cms.add(vol["configMap"].get("name", ""))
        if "secret" in vol:
            secrets.add(vol["secret"].get("secretName", ""))
        for source in (vol.get("projected") or {}).get("sources") or []:
            if "configMap" in source:
                cms.add(source["configMap"].get("name", ""))
            if "secret" in source:
                secrets.add(source["secret"].get("name", ""))
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        for source in c.get("envFrom") or []:
            if "configMapRef" in source:
                cms.add(source["configMapRef"].get("name", ""))
            if "secretRef" in source:
                secrets.add(source["secretRef"].get("name", ""))
        for var in c.get("env") or []:
            vf = var.get("valueFrom") or {}
            if "configMapKeyRef" in vf:
                cms.add(vf["configMapKeyRef"].get("name", ""))
            if "secretKeyRef" in vf:
                secrets.add(vf["secretKeyRef"].get("name", ""))
    return cms - {""}, secrets - {""}


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    readonly: bool = False


def container_mounts(
    container: Obj, plans: list[VolumePlan], env: Mapping[str, str]
) -> list[Mount]:
    """Bind mounts for one container, parents before children."""
    by_name = {p.name: p for p in plans}
    mounts = []
    for vm in container.get("volumeMounts") or []:
        plan = by_name.get(vm["name"])
        if plan is None:
            raise PodConfigError(f"volumeMount {vm['name']!r} names no volume")
        sub = vm.get("subPath") or expand(vm.get("subPathExpr", ""), env.get)
        if sub and (sub.startswith("/") or ".." in sub.split("/")):
            raise PodConfigError(f"subPath {sub!r} must be relative and stay inside the volume")
        source = f"{plan.host_path}/{sub}" if sub else plan.host_path
        mounts.append(Mount(source, vm["mountPath"], bool(vm.get("readOnly")) or plan.readonly))
    return sorted(mounts, key=lambda m: m.target.rstrip("/").count("/"))


# -- /etc/hosts and /etc/resolv.conf ------------------------------------------------------
def pod_hostname(pod: Obj) -> str:
    return str(pod.get("spec", {}).get("hostname") or pod["metadata"]["name"])[:63]


def hosts_file(pod: Obj, pod_ip: str, cluster_domain: str) -> str:
    """The pod's /etc/hosts, as the kubelet writes it: the pod's own names to its IP."""
    spec, ns = pod.get("spec", {}), pod["metadata"]["namespace"]
    host = pod_hostname(pod)
    names = [host]
    if spec.get("subdomain"):
        names.insert(0, f"{host}.{spec['subdomain']}.{ns}.svc.{cluster_domain}")
    lines = [
        "# Kubernetes-managed hosts file (ddp-devcluster test kubelet).",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        f"{pod_ip}\t{' '.join(names)}",
    ]
    for alias in spec.get("hostAliases") or []:
        lines.append(f"{alias['ip']}\t{' '.join(alias.get('hostnames') or [])}")
    return "\n".join(lines) + "\n"


def resolv_conf(namespace: str, nameserver: str, cluster_domain: str) -> str:
    return (
        f"nameserver {nameserver}\n"
        f"search {namespace}.svc.{cluster_domain} svc.{cluster_domain} {cluster_domain}\n"
        "options ndots:5\n"
    )


# -- status -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Termination:
    exit_code: int
    started_at: str
    finished_at: str
    reason: str = ""  # default: Completed for 0, Error otherwise

    def as_state(self) -> dict[str, Any]:
        reason = self.reason or ("Completed" if self.exit_code == 0 else "Error")
        return {
            "terminated": {
                "exitCode": self.exit_code,
                "reason": reason,
                "startedAt": self.started_at,
                "finishedAt": self.finished_at,
            }
        }


@dataclass
class ContainerRecord:
    """What the kubelet knows about one container of a pod."""

    name: str
    restart_count: int = 0
    running_since: str | None = None  # set while a process runs
    last: Termination | None = None  # the latest termination
    previous: Termination | None = None  # the one before it
    restart_at: float | None = None  # monotonic time of a pending restart
    config_error: str | None = None

    @property
    def running(self) -> bool:
        return self.running_since is not None


def restarts(policy: str, exit_code: int) -> bool:
    """Whether a container that exited with ``exit_code`` is started again."""
    return policy == "Always" or (policy == "OnFailure" and exit_code != 0)


def backoff_s(restart_count: int, initial_s: float = 0.5, cap_s: float = 10.0) -> float:
    """Crash-loop backoff before restart number ``restart_count + 1`` (doubling, capped)."""
    return float(min(cap_s, initial_s * 2 ** min(restart_count, 16)))


def init_policy(policy: str) -> str:
    """Init containers restart on failure unless the pod's policy is Never."""
    return "Never" if policy == "Never" else "OnFailure"


def init_state(policy: str, inits: list[ContainerRecord]) -> str:
    """``done`` once every init container exited 0 (in order), ``failed`` when one failed
    for good (restartPolicy Never), ``pending`` otherwise."""
    for r in inits:
        if r.last is not None and r.last.exit_code == 0 and not r.running:
            continue
        if (
            r.last is not None
            and not r.running
            and not restarts(init_policy(policy), r.last.exit_code)
        ):
            return "failed"
        return "pending"
    return "done"


def next_init(inits: list[ContainerRecord]) -> ContainerRecord | None:
    """The init container to run or wait for: the first that has not exited 0."""
    for r in inits:
        if r.running or r.last is None or r.last.exit_code != 0:
            return r
    return None


def pod_phase(
    policy: str,
    records: list[ContainerRecord],
    sandbox_ready: bool,
    inits: list[ContainerRecord] | None = None,
) -> str:
    """Pending until init containers are done and a container has started;
    Succeeded/Failed once every container ended for good; Running otherwise (also while a
    container waits to restart). A failed init container fails the pod under Never."""
    state = init_state(policy, inits or [])
    if state == "failed":
        return "Failed"
    if state == "pending" or not sandbox_ready or not any(r.running or r.last for r in records):
        return "Pending"
    if any(r.running or r.last is None for r in records):
        return "Running"
    codes = [r.last.exit_code for r in records if r.last is not None]
    if any(restarts(policy, code) for code in codes):
        return "Running"
    return "Succeeded" if all(code == 0 for code in codes) else "Failed"


def container_status(
    rec: ContainerRecord, image: str, container_id: str, phase: str
) -> dict[str, Any]:
    state: dict[str, Any]
    last_state: dict[str, Any] = {}
    if rec.running:
        state = {"running": {"startedAt": rec.running_since}}
        if rec.last:
            last_state = rec.last.as_state()
    elif rec.last is not None and (rec.restart_at is None or phase in ("Succeeded", "Failed")):
        state = rec.last.as_state()
        if rec.previous:
            last_state = rec.previous.as_state()
    elif rec.last is not None:
        state = {
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off restarting failed container {rec.name}",
            }
        }
        last_state = rec.last.as_state()
    elif rec.config_error:
        state = {"waiting": {"reason": "CreateContainerConfigError", "message": rec.config_error}}
    else:
        state = {"waiting": {"reason": "ContainerCreating"}}
    return {
        "name": rec.name,
        "image": image,
        "imageID": "",
        "containerID": container_id if (rec.running or rec.last) else "",
        "ready": rec.running,
        "started": rec.running,
        "restartCount": rec.restart_count,
        "state": state,
        "lastState": last_state,
    }


def _condition(
    ctype: str, ok: bool, now: str, previous: Mapping[str, Obj], reason: str = ""
) -> dict[str, Any]:
    status = "True" if ok else "False"
    old = previous.get(ctype)
    since = old.get("lastTransitionTime") if old and old.get("status") == status else None
    cond: dict[str, Any] = {
        "type": ctype,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": since or now,
    }
    if reason and not ok:
        cond["reason"] = reason
    return cond


def pod_status(
    pod: Obj,
    records: list[ContainerRecord],
    *,
    sandbox_ready: bool,
    pod_ip: str,
    host_ip: str,
    start_time: str,
    now: str,
    inits: list[ContainerRecord] | None = None,
    uid_prefix: str = "tk",
) -> dict[str, Any]:
    """The ``status`` a kubelet reports for ``pod`` given its container records."""
    spec = pod.get("spec", {})
    policy = spec.get("restartPolicy", "Always")
    inits = inits or []
    phase = pod_phase(policy, records, sandbox_ready, inits)
    initialized = init_state(policy, inits) == "done"
    terminal = phase in ("Succeeded", "Failed")
    images = {
        c["name"]: c.get("image", "")
        for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    }
    old = {c["type"]: c for c in (pod.get("status", {}).get("conditions") or [])}
    all_running = bool(records) and all(r.running for r in records) and not terminal
    not_ready = "PodCompleted" if terminal else "ContainersNotReady"
    ours = [
        _condition("PodReadyToStartContainers", sandbox_ready and not terminal, now, old),
        _condition("Initialized", initialized, now, old, "ContainersNotInitialized"),
        _condition("Ready", all_running, now, old, not_ready),
        _condition("ContainersReady", all_running, now, old, not_ready),
        _condition("PodScheduled", True, now, old),
    ]
    keep = [c for t, c in old.items() if t not in {c["type"] for c in ours}]
    uid = pod["metadata"]["uid"]

    def statuses(recs: list[ContainerRecord]) -> list[dict[str, Any]]:
        return [
            container_status(
                r, images.get(r.name, ""), f"{uid_prefix}://{uid}/{r.name}/{r.restart_count}", phase
            )
            for r in recs
        ]

    status: dict[str, Any] = {
        "phase": phase,
        "conditions": ours + keep,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": start_time,
        "containerStatuses": statuses(records),
        "qosClass": pod.get("status", {}).get("qosClass", "BestEffort"),
    }
    if inits:
        status["initContainerStatuses"] = statuses(inits)
    if sandbox_ready and pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    return status


def records_from_status(pod: Obj, now: str, init: bool = False) -> dict[str, ContainerRecord]:
    """Container records (``init``: of init containers) seeded from the status an earlier
    kubelet wrote: restart counts and terminations carry over; a container that was running
    when that kubelet died is lost (exit code 137, reason ContainerStatusUnknown) and
    restarts per the policy."""
    policy = pod.get("spec", {}).get("restartPolicy", "Always")
    if init:
        policy = init_policy(policy)
    out: dict[str, ContainerRecord] = {}
    key = "initContainerStatuses" if init else "containerStatuses"
    for cs in pod.get("status", {}).get(key) or []:
        rec = ContainerRecord(cs["name"], restart_count=int(cs.get("restartCount", 0)))
        state = cs.get("state") or {}
        if "running" in state:
            started = state["running"].get("startedAt") or now
            rec.last = Termination(137, started, now, "ContainerStatusUnknown")
        elif "terminated" in state:
            t = state["terminated"]
            rec.last = Termination(
                int(t.get("exitCode", 0)),
                t.get("startedAt") or now,
                t.get("finishedAt") or now,
                t.get("reason") or "",
            )
        elif "terminated" in (cs.get("lastState") or {}):
            t = cs["lastState"]["terminated"]
            rec.last = Termination(
                int(t.get("exitCode", 0)), t.get("startedAt") or now, t.get("finishedAt") or now
            )
        if rec.last is not None and restarts(policy, rec.last.exit_code):
            rec.restart_at = 0.0
        out[rec.name] = rec
    return out
