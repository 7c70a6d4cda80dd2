"""What the Dockerfiles install, read from the Dockerfiles themselves (for the packaging tests)."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OPERATOR = REPO / "Dockerfile"
TRAINER = REPO / "trainer_image" / "Dockerfile"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def instructions(dockerfile: Path) -> list[Instruction]:
    """The instructions, with continuation lines joined and comments dropped."""
    out: list[Instruction] = []
    pending = ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, args = line.partition(" ")
        out.append(Instruction(keyword.upper(), args.strip()))
    return out


def final_stage(dockerfile: Path) -> list[Instruction]:
    """The instructions after the last FROM: what the shipped image is made of."""
    ins = instructions(dockerfile)
    last = max(i for i, x in enumerate(ins) if x.keyword == "FROM")
    return ins[last + 1 :]


def arg_default(dockerfile: Path, name: str) -> str:
    for x in instructions(dockerfile):
        m = re.fullmatch(rf"{name}=(\S+)", x.args) if x.keyword == "ARG" else None
        if m:
            return m.group(1)
    raise KeyError(f"{dockerfile}: no ARG {name}=...")


def locks(dockerfile: Path) -> list[Path]:
    """The requirement files the Dockerfile copies in (from any stage)."""
    found = []
    for x in instructions(dockerfile):
        if x.keyword == "COPY" and "--from=" not in x.args:
            found += [REPO / s for s in x.args.split()[:-1] if s.startswith("requirements/")]
    return found


def copy_sources(dockerfile: Path, root: Path, dest_prefix: str) -> Path:
    """Recreates under ``root`` what the final stage COPYs from the context below ``dest_prefix``
    (``/opt/app``), and returns the directory that stands for ``dest_prefix``."""
    app = root / dest_prefix.strip("/")
    for x in final_stage(dockerfile):
        if x.keyword != "COPY" or "--from=" in x.args:
            continue
        *sources, dest = x.args.split()
        if not dest.startswith(dest_prefix):
            continue
        target = root / dest.strip("/")
        for src in sources:
            path = REPO / src
            if path.is_dir():
                shutil.copytree(path, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target / path.name)
    return app
