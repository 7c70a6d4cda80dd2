"""Workloads: a model, its training and test data, and a mean-reduced loss.

Built in: `digits` (a small CNN on scikit-learn's bundled handwritten digits), `charlm`
(a small GPT-style byte-level language model on local text) and `synthetic` (an MLP on
random data, for throughput). A plugin `package.module:function` is called with the
TrainerConfig and returns a :class:`Workload` or a tuple
``(model, train_set, test_set_or_None, loss_fn)``.
"""

from __future__ import annotations

import gzip
import importlib
import importlib.util
import math
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import Dataset, TensorDataset, default_collate

from ddp_api.trainer_config import TrainerConfig

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
CountTargets = Callable[[torch.Tensor], int]
IGNORE_INDEX = -100  # targets the loss leaves out (padding): cross_entropy's ignore_index


@dataclass
class Workload:
    """What to train. `loss_fn(outputs, targets)` must return the mean over the batch's loss
    terms. `count_targets(targets)`, when set, says how many terms that mean has (the tokens
    that are not padding, for a language model): the loss is then weighted by terms counted
    across ranks and micro-batches instead of by samples (see :mod:`ddp_trainer.data.weighting`)."""

    model: nn.Module
    train_set: Dataset[Any]
    test_set: Dataset[Any] | None
    loss_fn: LossFn
    count_targets: CountTargets | None = None


def count_not_ignored(targets: torch.Tensor) -> int:
    """Loss terms of a token-level loss: the targets that are not :data:`IGNORE_INDEX`."""
    return int((targets != IGNORE_INDEX).sum())


def fetch_batch(dataset: Dataset[Any], indices: torch.Tensor) -> Any:
    """The samples at `indices`, batched: tensor datasets are indexed in one go."""
    get_batch = getattr(dataset, "get_batch", None)
    if get_batch is not None:
        return get_batch(indices)
    if isinstance(dataset, TensorDataset):
        return tuple(t[indices] for t in dataset.tensors)
    return default_collate([dataset[i] for i in indices.tolist()])


# digits ---------------------------------------------------------------------------------


class DigitsCNN(nn.Module):
    """Two 3x3 convolutions and two linear layers for 8x8 grey images, 10 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.head = nn.Sequential(
            nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Dropout(0.25), nn.Linear(128, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """Pixels (N, 8, 8) and labels of scikit-learn's bundled digits.

    The bundled CSV is read directly: importing scikit-learn costs seconds per process.
    """
    spec = importlib.util.find_spec("sklearn")
    locations = spec.submodule_search_locations if spec else None
    path = Path(locations[0]) / "datasets" / "data" / "digits.csv.gz" if locations else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits

        digits = load_digits()
        return digits.images, digits.target
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[Any, Any]:
    """(train, test) indices with each class split in the same proportion, fixed by seed."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        cut = round(len(members) * test_fraction)
        test.append(members[:cut])
        train.append(members[cut:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def digits_data() -> tuple[TensorDataset, TensorDataset]:
    """scikit-learn's 1797 digits, split 80/20 (stratified, fixed), pixels scaled to [0, 1]."""
    images, labels = _digits_arrays()
    train, test = stratified_split(labels, 0.2, seed=0)

    def tensors(index: np.ndarray) -> TensorDataset:
        pixels = torch.tensor(images[index], dtype=torch.float32).unsqueeze(1) / 16.0
        return TensorDataset(pixels, torch.tensor(labels[index], dtype=torch.long))

    return tensors(train), tensors(test)


# charlm ---------------------------------------------------------------------------------


def stdlib_sources() -> list[Path]:
    """The standard library's top-level `*.py` files, in a fixed order."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def read_corpus(corpus: str | None, max_bytes: int) -> bytes:
    """Up to `max_bytes` of text: a file, a folder's `*.py`/`*.txt` files, or the stdlib."""
    if corpus is None:
        files = stdlib_sources()
    else:
        root = Path(corpus)
        if root.is_file():
            files = [root]
        elif root.is_dir():
            files = sorted([*root.rglob("*.py"), *root.rglob("*.txt")])
        else:
            raise FileNotFoundError(f"corpus: no such file or folder {corpus!r}")
    chunks: list[bytes] = []
    size = 0
    for path in files:
        data = path.read_bytes()
        chunks.append(data[: max_bytes - size])
        size += len(chunks[-1])
        if size >= max_bytes:
            break
    if size == 0:
        raise ValueError(f"corpus: no text found in {corpus or 'the standard library'}")
    return b"".join(chunks)


class ByteBlocks(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Non-overlapping blocks of bytes: input block i and the same block shifted by one."""

    def __init__(self, data: torch.Tensor, block_size: int):
        self.data = data
        self.block_size = block_size

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.block_size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = self.get_batch(torch.tensor([index]))
        return inputs[0], targets[0]

    def get_batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        offsets = indices.unsqueeze(1) * self.block_size + torch.arange(self.block_size + 1)
        window = self.data[offsets].long()
        return window[:, :-1], window[:, 1:]


def charlm_data(config: TrainerConfig) -> tuple[ByteBlocks, ByteBlocks]:
    """The corpus as byte blocks; the last 5% of it is the test split."""
    raw = read_corpus(config.corpus, config.corpus_max_bytes)
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    split = int(len(data) * 0.95)
    return ByteBlocks(data[:split], config.block_size), ByteBlocks(data[split:], config.block_size)


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, n_embd: int, n_head: int, dropout: float):
        super().__init__()
        self.n_head = n_head
        self.dropout = dropout
        self.ln1 = nn.LayerNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd)
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, width = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(width, dim=2)
        shape = (batch, time, self.n_head, width // self.n_head)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        x = x + self.drop(self.proj(attended.transpose(1, 2).reshape(batch, time, width)))
        return x + self.drop(self.mlp(self.ln2(x)))


class CharGPT(nn.Module):
    """A small GPT over bytes (vocabulary 256), optionally with activation checkpointing."""

    def __init__(
        self,
        block_size: int,
        n_layer: int,
        n_head: int,
        n_embd: int,
        dropout: float = 0.0,
        activation_checkpointing: bool = False,
    ):
        super().__init__()
        self.block_size = block_size
        self.activation_checkpointing = activation_checkpointing
        self.token = nn.Embedding(256, n_embd)
        self.position = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, 256, bias=False)
        for name, parameter in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(parameter, std=0.02 / math.sqrt(2 * n_layer))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.token(idx) + self.position(positions))
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if recompute else block(x)
        return self.head(self.ln(x))

    @torch.no_grad()
    def generate(self, prompt: bytes, new_bytes: int, temperature: float = 0.8) -> bytes:
        """Continue `prompt` by sampling `new_bytes` bytes."""
        idx = torch.tensor([list(prompt) or [10]], dtype=torch.long)
        for _ in range(new_bytes):
            logits = self(idx[:, -self.block_size :])[:, -1] / temperature
            idx = torch.cat([idx, torch.multinomial(F.softmax(logits, dim=-1), 1)], dim=1)
        return bytes(idx[0].tolist())


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean over the targets that are not padding (:data:`IGNORE_INDEX`)."""
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX
    )


# synthetic ------------------------------------------------------------------------------

SYNTHETIC_CLASSES = 10


def synthetic_data(config: TrainerConfig) -> tuple[TensorDataset, TensorDataset]:
    """Gaussian inputs labelled by a fixed random linear map (learnable, deterministic)."""
    generator = torch.Generator().manual_seed(1234)
    count = config.synthetic_samples + config.synthetic_samples // 8
    x = torch.randn(count, config.synthetic_dim, generator=generator)
    labels = (x @ torch.randn(config.synthetic_dim, SYNTHETIC_CLASSES, generator=generator)).argmax(
        1
    )
    cut = config.synthetic_samples
    return TensorDataset(x[:cut], labels[:cut]), TensorDataset(x[cut:], labels[cut:])


def synthetic_model(config: TrainerConfig) -> nn.Module:
    hidden = config.synthetic_hidden
    return nn.Sequential(
        nn.Linear(config.synthetic_dim, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, SYNTHETIC_CLASSES),
    )


# dispatch -------------------------------------------------------------------------------


def _plugin(config: TrainerConfig) -> Workload:
    module_name, function_name = config.workload.split(":")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"workload: cannot load plugin {config.workload!r}: {error}") from error
    result = function(config)
    if isinstance(result, Workload):
        return result
    if isinstance(result, Sequence) and len(result) == 4:
        return Workload(*result)
    raise TypeError(
        f"workload: plugin {config.workload!r} must return a Workload or "
        "(model, train_set, test_set, loss_fn)"
    )


def build_model(config: TrainerConfig) -> nn.Module:
    """The workload's freshly initialized model (seeded), without loading any data."""
    torch.manual_seed(config.seed)
    if config.workload == "digits":
        return DigitsCNN()
    if config.workload == "charlm":
        return CharGPT(
            config.block_size,
            config.n_layer,
            config.n_head,
            config.n_embd,
            config.dropout,
            config.activation_checkpointing,
        )
    if config.workload == "synthetic":
        return synthetic_model(config)
    return _plugin(config).model


def build_workload(config: TrainerConfig) -> Workload:
    """Model, datasets and loss of the configured workload."""
    if config.is_plugin:
        torch.manual_seed(config.seed)
        return _plugin(config)
    model = build_model(config)
    if config.workload == "digits":
        train, test = digits_data()
        return Workload(model, train, test, F.cross_entropy)
    if config.workload == "charlm":
        train_blocks, test_blocks = charlm_data(config)
        return Workload(model, train_blocks, test_blocks, token_cross_entropy, count_not_ignored)
    train, test = synthetic_data(config)
    return Workload(model, train, test, F.cross_entropy)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    dataset: Dataset[Any],
    loss_fn: LossFn,
    batch_size: int,
    max_batches: int,
    device: torch.device,
    count_targets: CountTargets | None = None,
) -> dict[str, float]:
    """Mean loss on `dataset` over its loss terms (samples, or what `count_targets` counts: a
    padded batch's tokens weigh what they hold, not one sample each), and accuracy when the model
    outputs class scores."""
    was_training = model.training
    model.eval()
    total = len(dataset)  # type: ignore[arg-type]
    loss_sum, terms, correct, seen = 0.0, 0, 0, 0
    classifying = True
    for batch_index, start in enumerate(range(0, total, batch_size)):
        if batch_index >= max_batches:
            break
        indices = torch.arange(start, min(start + batch_size, total))
        inputs, targets = fetch_batch(dataset, indices)
        inputs, targets = inputs.to(device), targets.to(device)
        outputs = model(inputs)
        batch_terms = len(indices) if count_targets is None else int(count_targets(targets))
        if batch_terms:  # a batch of padding alone has no mean loss (NaN) and weighs nothing
            loss_sum += float(loss_fn(outputs, targets)) * batch_terms
            terms += batch_terms
        classifying = classifying and outputs.dim() == 2 and targets.dim() == 1
        if classifying:
            correct += int((outputs.argmax(1) == targets).sum())
        seen += len(indices)
    model.train(was_training)
    result = {"testLoss": loss_sum / max(terms, 1), "testSamples": float(seen)}
    if classifying and seen:
        result["testAccuracy"] = correct / seen
    return result
