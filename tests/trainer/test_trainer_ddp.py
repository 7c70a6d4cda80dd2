"""Two nodes x two processes train `digits` with DDP over gloo to the accuracy target (one node's
workers forked warm, the other's fresh interpreters under plain torchrun)."""

from __future__ import annotations

import torch
from trainer_harness import Launcher, events, free_port, metrics

from ddp_devcluster.recipes import digits
from ddp_trainer.data.workloads import digits_data
from ddp_trainer.state.store import CheckpointStore, load_for_inference

DIGITS = digits(epochs=10, checkpointEverySteps=50, logEverySteps=20, pgTimeoutS=60, evaluate=True)


def test_two_nodes_reach_accuracy_and_only_rank0_writes(launcher: Launcher) -> None:
    ckpt = launcher.workdir / "ckpt"
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [
        launcher.node(
            name,
            is_host=name == "node0",  # torchrun's default: the first agent hosts the c10d store
            warm=name == "node0",  # node1 is plain torchrun, as a user runs the image
            endpoint=endpoint,
            nnodes="2",
            nproc=2,
            settings=DIGITS,
            checkpoint_dir=ckpt,
            max_restarts=0,
        )
        for name in ("node0", "node1")
    ]
    for node in nodes:
        assert node.wait(240) == 0, launcher.logs()
    # Rank 0's process hosts the workers' store (TORCH_DISABLE_SHARE_RDZV_TCP_STORE, as the
    # operator sets it): the others saw its end before it left, so none read a store gone
    # (a C++ stack trace and a warning on every successful run, before rank 0 waited for them).
    for node in nodes:
        assert "recvValue failed" not in node.output(), node.tail()
        assert "store is gone" not in node.output(), node.tail()

    (end,) = events(ckpt, "end")
    assert end["worldSize"] == 4
    assert end["testAccuracy"] >= 0.95, end
    assert end["step"] == 10 * (1437 // 64)

    # Only global rank 0 wrote into the folder: nothing but its files, all signed rank 0.
    names = sorted(p.name for p in ckpt.iterdir())
    checkpoints = [n for n in names if n.startswith("step-")]
    assert set(names) == {"manifest.json", "metrics.jsonl", "complete.json", *checkpoints}, names
    assert checkpoints == ["step-00000150.pt", "step-00000200.pt", "step-00000220.pt"]
    assert {line["rank"] for line in metrics(ckpt)} == {0}
    store = CheckpointStore(ckpt)
    writers = {store.load(entry)["writer"]["pid"] for entry in store.entries()}
    assert len(writers) == 1
    assert {store.load(e)["writer"]["rank"] for e in store.entries()} == {0}

    # One documented call gives a plain CPU model: no DDP `module.` prefix, same accuracy.
    model = load_for_inference(ckpt)
    assert not any(k.startswith("module.") for k in model.state_dict())
    _, test = digits_data()
    images, labels = test.tensors
    with torch.no_grad():
        accuracy = (model(images).argmax(1) == labels).float().mean().item()
    assert abs(accuracy - end["testAccuracy"]) < 1e-6
