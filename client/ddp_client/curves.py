"""The loss and learning-rate curves of a job's run log (``metrics.jsonl``), and their
picture (``kubectl ddp plot``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Curves:
    """Training loss and learning rate by optimizer step, from the ``step`` lines of
    ``metrics.jsonl``."""

    loss: list[tuple[int, float]]
    lr: list[tuple[int, float]]

    @property
    def empty(self) -> bool:
        return not self.loss and not self.lr


def curves(rows: Iterable[Mapping[str, Any]]) -> Curves:
    """The loss and learning-rate curves of metrics.jsonl's ``step`` lines, by step. A run
    resumed from a checkpoint logs the steps after that checkpoint again: the last line of a
    step wins."""
    loss: dict[int, float] = {}
    lr: dict[int, float] = {}
    for row in rows:
        if row.get("event") != "step" or row.get("step") is None:
            continue
        step = int(row["step"])
        if row.get("loss") is not None:
            loss[step] = float(row["loss"])
        if row.get("lr") is not None:
            lr[step] = float(row["lr"])
    return Curves(loss=sorted(loss.items()), lr=sorted(lr.items()))


@dataclass(frozen=True)
class Plot:
    """What :meth:`DDPClient.plot` drew: the curves and the number of lines on the figure."""

    path: Path
    curves: Curves
    lines: int


def draw_curves(found: Curves, path: str | Path, title: str = "") -> Plot:
    """The loss (above) and the learning rate (below) by optimizer step, as a PNG (or what
    ``path``'s suffix names); a curve without points is left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (label, points)
        for label, points in (("training loss", found.loss), ("learning rate", found.lr))
        if points
    ]
    if not panels:
        raise ValueError("no curve has points to draw")
    fig, axes = plt.subplots(len(panels), 1, sharex=True, figsize=(7, 2.4 * len(panels) + 0.6))
    axes_list = list(axes) if len(panels) > 1 else [axes]
    for ax, (label, points) in zip(axes_list, panels, strict=True):
        ax.plot([s for s, _ in points], [v for _, v in points])
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes_list[-1].set_xlabel("optimizer step")
    if title:
        axes_list[0].set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    lines = sum(len(ax.get_lines()) for ax in axes_list)
    plt.close(fig)
    return Plot(path=Path(path), curves=found, lines=lines)
