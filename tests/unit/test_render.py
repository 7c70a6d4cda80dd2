"""The env contract and pod shape the operator renders (DESIGN.md, 'The contract')."""

from __future__ import annotations

import json

import pytest
from ddpjobs import ddpjob, env_of

from ddp_api.ddpjob import DDPJob
from ddp_operator import render

CFG = render.OperatorConfig(default_image="trainer:test")


def job(**spec: object) -> DDPJob:
    return ddpjob(
        {"nodes": 2, "minNodes": 1, "maxNodes": 4, "nprocPerNode": 2, **spec},
        name="digits",
        namespace="team",
        uid="abc-123",
    )


def users_value_wins(name: str, value: str, **spec: object) -> None:
    """The user's own ``name=value`` in spec.template.env is the pod's one ``name``."""
    own = {"env": [{"name": name, "value": value}]}
    pod = render.render_worker(job(**spec, template=own), 0, 0, CFG)
    names = [e["name"] for e in pod["spec"]["containers"][0]["env"]]
    assert names.count(name) == 1 and env_of(pod)[name] == value


def test_worker_pod_carries_the_env_contract() -> None:
    pod = render.render_worker(job(checkpoint={"volume": {"emptyDir": {}}}), 1, 0, CFG)
    env = env_of(pod)
    assert env["PET_NNODES"] == "1:4"
    assert env["PET_NPROC_PER_NODE"] == "2"
    assert env["PET_RDZV_BACKEND"] == "c10d"
    assert env["PET_RDZV_ENDPOINT"] == "digits-rdzv.team.svc:29400"
    assert env["PET_RDZV_ID"] == "abc-123"
    assert "is_host=false" in str(env["PET_RDZV_CONF"])
    assert env["PET_LOCAL_ADDR"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["DDPJOB_NAME"] == "digits" and env["DDPJOB_NAMESPACE"] == "team"
    assert env["DDPJOB_CHECKPOINT_DIR"] == "/checkpoints"
    cfg = json.loads(str(env["DDP_TRAINER_CONFIG"]))
    assert cfg["checkpointEverySteps"] == 100 and cfg["checkpointKeep"] == 3


def test_a_silent_node_leaves_the_rendezvous_before_a_forming_round_closes() -> None:
    pod = render.render_worker(job(), 0, 0, CFG)
    conf = dict(kv.split("=", 1) for kv in str(env_of(pod)["PET_RDZV_CONF"]).split(","))
    dead_after_s = int(conf["keep_alive_interval"]) * int(conf["keep_alive_max_attempt"])
    assert dead_after_s < int(conf["last_call_timeout"])  # torchrun's defaults: 15 s, not <
    assert conf["is_host"] == "false"


def test_worker_pod_is_restricted_and_has_shm_and_labels() -> None:
    pod = render.render_worker(job(), 0, 0, CFG)
    spec, c = pod["spec"], pod["spec"]["containers"][0]
    assert pod["metadata"]["name"] == "digits-node-0"
    assert pod["metadata"]["labels"][render.LABEL_INDEX] == "0"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "abc-123"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert c["command"] == ["python", "-m", "ddp_trainer.node"]  # torchrun, store-loss proof
    assert c["args"][:2] == ["--module", "ddp_trainer"]
    assert c["image"] == "trainer:test"


def test_user_command_and_overrides_are_merged() -> None:
    pod = render.render_worker(
        job(
            command=["torchrun", "/scripts/train.py"],
            template={
                "nodeSelector": {"pool": "gpu"},
                "env": [{"name": "EXTRA", "value": "1"}],
                "serviceAccountName": "custom",
            },
        ),
        0,
        0,
        CFG,
    )
    c = pod["spec"]["containers"][0]
    assert c["command"] == ["torchrun", "/scripts/train.py"]
    assert "DDP_TRAINER_CONFIG" not in env_of(pod)
    assert env_of(pod)["EXTRA"] == "1"
    assert pod["spec"]["nodeSelector"] == {"pool": "gpu"}
    assert pod["spec"]["serviceAccountName"] == "custom"


def test_rendezvous_service_is_published_before_pods_are_ready() -> None:
    rdzv, workers = render.render_services(job())
    assert rdzv["metadata"]["name"] == "digits-rdzv"
    assert rdzv["spec"]["publishNotReadyAddresses"] is True
    assert rdzv["spec"]["selector"][render.LABEL_ROLE] == render.ROLE_STORE
    # The store's name must resolve while its pod is replaced: a virtual IP, not headless.
    assert rdzv["spec"]["type"] == "ClusterIP" and "clusterIP" not in rdzv["spec"]
    assert workers["spec"]["clusterIP"] == "None"


def test_each_worker_process_gets_its_share_of_the_container_cpus() -> None:
    def threads(**spec: object) -> object:
        return env_of(render.render_worker(job(**spec), 0, 0, CFG)).get("OMP_NUM_THREADS")

    assert threads() is None  # no CPU quantity: torch decides
    assert threads(resources={"limits": {"cpu": 8}}) == "4"  # 2 processes per node
    assert threads(resources={"requests": {"cpu": "3"}}) == "1"
    assert threads(resources={"requests": {"cpu": "500m"}}) == "1"  # never 0
    assert threads(resources={"limits": {"cpu": "6"}, "requests": {"cpu": "2"}}) == "3"
    assert threads(nprocPerNode="auto", resources={"limits": {"cpu": 16}}) is None
    gpu = {"limits": {"cpu": 16, "nvidia.com/gpu": 4}}
    assert threads(nprocPerNode="auto", resources=gpu) == "4"
    users_value_wins("OMP_NUM_THREADS", "7", resources={"limits": {"cpu": 8}})


def test_torchrun_logs_its_rendezvous_unless_the_user_says_otherwise() -> None:
    assert env_of(render.render_worker(job(), 0, 0, CFG))["LOGLEVEL"] == "INFO"
    users_value_wins("LOGLEVEL", "WARNING")


def test_every_worker_line_carries_its_global_rank_unless_the_user_says_otherwise() -> None:
    env = env_of(render.render_worker(job(), 0, 0, CFG))
    assert env["PET_TEE"] == "3" and env["PET_LOG_LINE_PREFIX_TEMPLATE"] == "[rank${rank}]: "
    assert env["PYTHONUNBUFFERED"] == "1"  # torchrun relays the lines without flushing
    users_value_wins("PET_TEE", "0")


def test_torchrun_gives_the_workers_the_pods_grace_period_to_stop() -> None:
    """torchrun passes the pod's SIGTERM to its workers and SIGKILLs them after
    ``PET_SHUTDOWN_TIMEOUT``, its own default 30 s whatever the grace period: a SIGTERM
    checkpoint that took longer was killed before it was complete. It is the grace period now,
    less two seconds for the wrapper's last lines."""

    def stop_and_grace(**spec: object) -> tuple[int, int]:
        pod = render.render_worker(job(**spec), 0, 0, CFG)
        stop = int(str(env_of(pod)["PET_SHUTDOWN_TIMEOUT"]))
        return stop, pod["spec"]["terminationGracePeriodSeconds"]

    assert stop_and_grace() == (58, 60)
    assert stop_and_grace(template={"terminationGracePeriodSeconds": 600}) == (598, 600)
    assert stop_and_grace(template={"terminationGracePeriodSeconds": 2}) == (1, 2)
    per_step = {"faultTolerance": {"mode": "PerStep"}}
    assert stop_and_grace(**per_step) == (73, 75)  # a quorum try more (15 s by default)
    users_value_wins("PET_SHUTDOWN_TIMEOUT", "5")


def test_a_failed_name_lookup_costs_the_pods_2_s_not_10_unless_the_user_says_otherwise() -> None:
    """torch's c10d looks up the name of every TCPStore peer; with a lost machine's DNS server
    still in the DNS Service, glibc's own two 5 s tries a lookup held a PerStep store past the
    groups' 5 s connect timeout (render.common.RESOLVER_OPTIONS; the store's side with real
    torch: tests/trainer/test_trainer_dead_dns.py)."""
    options = "timeout:1 attempts:2"
    assert options == render.RESOLVER_OPTIONS
    for spec in ({}, {"faultTolerance": {"mode": "PerStep"}}, {"command": ["python", "own.py"]}):
        assert env_of(render.render_worker(job(**spec), 0, 0, CFG))["RES_OPTIONS"] == options
    users_value_wins("RES_OPTIONS", "timeout:3")
    store = render.render_store(job(), CFG)["spec"]["containers"][0]
    assert store["env"] == [{"name": "RES_OPTIONS", "value": options}]
    own = {"env": [{"name": "RES_OPTIONS", "value": ""}]}  # the resolver's own defaults
    store = render.render_store(job(template=own), CFG)["spec"]["containers"][0]
    assert store["env"] == [{"name": "RES_OPTIONS", "value": ""}]


def test_the_bundled_trainer_declares_its_metrics_port() -> None:
    def ports(**spec: object) -> dict[str, int]:
        pod = render.render_worker(job(**spec), 0, 0, CFG)
        return {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}

    assert ports() == {"c10d": 29400, "metrics": 9400}  # the trainer's default
    assert ports(trainer={"metricsPort": 9100}) == {"c10d": 29400, "metrics": 9100}
    assert ports(trainer={"metricsPort": 0}) == {"c10d": 29400}  # off: nothing listens
    # The user's own program may serve anything, or nothing: declare no port for it.
    assert ports(command=["torchrun", "/scripts/train.py"]) == {"c10d": 29400}
    store = render.render_store(job(), CFG)["spec"]["containers"][0]
    assert [p["name"] for p in store["ports"]] == ["c10d"]


def machine_spread(**spec: object) -> list[dict[str, object]]:
    """The node pod's topologySpreadConstraints on the machine (kubernetes.io/hostname)."""
    constraints = render.render_worker(job(**spec), 1, 0, CFG)["spec"].get(
        "topologySpreadConstraints", []
    )
    return [c for c in constraints if c["topologyKey"] == "kubernetes.io/hostname"]


@pytest.mark.parametrize(
    ("spread", "unsatisfiable"), [("Required", "DoNotSchedule"), ("Preferred", "ScheduleAnyway")]
)
def test_node_pods_spread_one_per_machine_when_asked(spread: str, unsatisfiable: str) -> None:
    assert machine_spread(spread=spread) == [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": unsatisfiable,
            # this job's node pods only: not its store, not another job's pods
            "labelSelector": {
                "matchLabels": {"ddp.dev/job-name": "digits", "ddp.dev/role": "worker"}
            },
            # a tainted control plane or a lost machine is no empty machine to wait for
            "nodeAffinityPolicy": "Honor",
            "nodeTaintsPolicy": "Honor",
        }
    ]


def test_preferred_is_the_default_and_none_adds_no_constraint() -> None:
    assert machine_spread()[0]["whenUnsatisfiable"] == "ScheduleAnyway"
    pod = render.render_worker(job(spread="None"), 0, 0, CFG)
    assert "topologySpreadConstraints" not in pod["spec"]


def test_the_users_own_constraints_are_kept_and_their_hostname_one_wins() -> None:
    zone = {"maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone"}
    own = {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "x"}
    pod = render.render_worker(
        job(spread="Required", template={"topologySpreadConstraints": [zone]}), 0, 0, CFG
    )
    got = pod["spec"]["topologySpreadConstraints"]
    assert got[0] == zone and got[1]["whenUnsatisfiable"] == "DoNotSchedule" and len(got) == 2
    assert machine_spread(spread="Required", template={"topologySpreadConstraints": [own]}) == [own]
    pod = render.render_worker(
        job(spread="None", template={"topologySpreadConstraints": [zone]}), 0, 0, CFG
    )
    assert pod["spec"]["topologySpreadConstraints"] == [zone]


def test_the_store_pod_is_not_spread() -> None:
    zone = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone"}
    store = render.render_store(
        job(spread="Required", template={"topologySpreadConstraints": [zone]}), CFG
    )
    assert "topologySpreadConstraints" not in store["spec"]


def test_the_store_is_ready_once_it_listens() -> None:
    # Not before: a store that keeps crashing is one restarted and not ready since
    # (ServerFailing), which a moment's run between crashes must not clear.
    store = render.render_store(job(), CFG)["spec"]["containers"][0]
    assert store["readinessProbe"] == {
        "tcpSocket": {"port": 29400},
        "initialDelaySeconds": 5,  # it imports torch first: a refused probe is a Warning event
        "periodSeconds": 2,
    }
