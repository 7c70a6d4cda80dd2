"""Checkpoint folder: manifest bookkeeping (pure) and the store on real files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from faulty_disk import FailingWrite, FlakyReads

from ddp_trainer.state.store import (
    FORMAT,
    CheckpointStore,
    Entry,
    UnreadableCheckpoint,
    candidates,
    checkpoint_name,
    parse_manifest,
    record,
    render_manifest,
    step_of,
)
from ddp_trainer.state.writer import AsyncCheckpointWriter, snapshot


def state(step: int) -> dict:
    return {"format": FORMAT, "step": step, "weights": torch.full((64,), float(step))}


def test_names_and_manifest_round_trip() -> None:
    assert checkpoint_name(123) == "step-00000123.pt" and step_of("step-00000123.pt") == 123
    assert step_of("metrics.jsonl") is None
    entries = [Entry("step-00000010.pt", 10, "ab", 5), Entry("step-00000020.pt", 20)]
    assert parse_manifest(render_manifest(reversed(entries))) == entries
    with pytest.raises(ValueError):
        parse_manifest('{"format": 1, "checkpoints": [{"name": "x.pt", "step": 1}]}')


def test_record_keeps_the_newest_and_never_a_newer_one_unless_corrupt() -> None:
    entries = [Entry(checkpoint_name(s), s) for s in (10, 20, 30)]
    kept, removed = record(entries, Entry(checkpoint_name(40), 40), keep=3)
    assert [e.step for e in kept] == [20, 30, 40] and [e.step for e in removed] == [10]
    # Resumed from 20 with 30 there: writing 25 keeps 30 (retention only prunes older ones).
    kept, removed = record(entries, Entry(checkpoint_name(25), 25), keep=2)
    assert [e.step for e in kept] == [20, 25, 30] and [e.step for e in removed] == [10]
    # Resumed from 20 after 30 was verified corrupt (and a torn unlisted 35): both go.
    torn = Entry(checkpoint_name(35), 35)
    kept, removed = record(entries, Entry(checkpoint_name(25), 25), 3, [entries[2], torn])
    assert [e.step for e in kept] == [10, 20, 25] and [e.step for e in removed] == [30, 35]
    # Writing the step of a corrupt checkpoint again replaces it: the new file stays.
    kept, removed = record(entries, Entry(checkpoint_name(30), 30, "new"), 3, [entries[2]])
    assert [e.sha256 for e in kept] == [None, None, "new"] and removed == []


def test_candidates_include_unlisted_files_newest_first() -> None:
    listed = [Entry(checkpoint_name(10), 10)]
    names = [checkpoint_name(10), checkpoint_name(20), "manifest.json", ".step-x.tmp"]
    assert [e.step for e in candidates(listed, names)] == [20, 10]


def test_store_writes_atomically_and_prunes(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    for step in (1, 2, 3):
        store.write(step, state(step))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "manifest.json",
        "step-00000002.pt",
        "step-00000003.pt",
    ]
    entry, loaded = store.latest() or (None, {})
    assert entry is not None and entry.step == 3 and loaded["weights"][0] == 3.0


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path: Path, damage) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    for step in (1, 2):
        store.write(step, state(step))
    newest = tmp_path / checkpoint_name(2)
    data = newest.read_bytes()
    if damage == "truncate":
        newest.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        newest.write_bytes(data[:-20] + bytes(b ^ 0xFF for b in data[-20:]))
    else:
        newest.unlink()
    entry, _ = store.latest() or (None, None)
    assert entry is not None and entry.step == 1


def written(directory: Path, *steps: int, keep: int = 3) -> list[str]:
    store = CheckpointStore(directory, keep=keep)
    for step in steps:
        store.write(step, state(step))
    return sorted(p.name for p in directory.iterdir())


def test_a_newest_checkpoint_unreadable_once_is_read_again(tmp_path: Path) -> None:
    written(tmp_path, 1, 2)
    store = FlakyReads(tmp_path, checkpoint_name(2), failures=1)
    entry, loaded = store.latest() or (None, {})
    assert entry is not None and entry.step == 2 and loaded["weights"][0] == 2.0
    assert store.tries == 2


def test_a_newest_checkpoint_that_stays_unreadable_fails_the_resume_and_keeps_every_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    before = written(tmp_path, 1, 2)
    store = FlakyReads(tmp_path, checkpoint_name(2), failures=99)
    with pytest.raises(UnreadableCheckpoint, match=r"step-00000002\.pt.*Input/output error"):
        store.latest()  # never the older step 1
    assert store.tries == 3  # a try and the two retries
    assert "cannot read" in caplog.text and "step-00000002.pt" in caplog.text
    assert store.corrupt == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_only_a_verified_corrupt_checkpoint_is_deleted_by_the_next_write(tmp_path: Path) -> None:
    written(tmp_path, 1, 2, 3)
    (tmp_path / checkpoint_name(3)).write_bytes(b"bit rot")  # listed: its checksum differs
    (tmp_path / checkpoint_name(2)).rename(tmp_path / "aside")  # listed, missing for now
    store = CheckpointStore(tmp_path, keep=3)
    entry, _ = store.latest() or (None, None)
    assert entry is not None and entry.step == 1
    (tmp_path / "aside").rename(tmp_path / checkpoint_name(2))  # it comes back
    store.write(2, state(2))  # what a resume from step 1 writes next
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "manifest.json",
        checkpoint_name(1),
        checkpoint_name(2),
    ]
    assert [e.step for e in store.entries()] == [1, 2]


def test_a_checkpoint_that_matches_its_manifest_but_does_not_load_is_not_skipped(
    tmp_path: Path,
) -> None:
    store = CheckpointStore(tmp_path)
    store.write(1, state(1))
    store.write(2, {"format": FORMAT + 1})  # written as it is, by a newer trainer
    with pytest.raises(UnreadableCheckpoint, match="matches its manifest entry"):
        store.latest()


def test_without_manifest_files_are_verified_by_loading(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    for step in (1, 2):
        store.write(step, state(step))
    (tmp_path / "manifest.json").write_text("{torn")
    newest = tmp_path / checkpoint_name(2)
    newest.write_bytes(newest.read_bytes()[:100])
    entry, _ = store.latest() or (None, None)
    assert entry is not None and entry.step == 1
    assert CheckpointStore(tmp_path / "absent").latest() is None


def test_temporaries_of_a_killed_writer_are_removed(tmp_path: Path) -> None:
    (tmp_path / ".step-00000005.pt.123.tmp").write_bytes(b"partial")
    store = CheckpointStore(tmp_path)
    store.remove_temporaries()
    assert list(tmp_path.iterdir()) == []


def test_async_writer_writes_a_snapshot_not_the_live_tensors(tmp_path: Path) -> None:
    live = state(7)
    writer = AsyncCheckpointWriter(CheckpointStore(tmp_path))
    writer.submit(7, snapshot(live))
    live["weights"].add_(100.0)  # training goes on while the write runs
    writer.close()
    _, loaded = CheckpointStore(tmp_path).latest() or (None, {})
    assert loaded["weights"][0] == 7.0


def test_a_failed_background_write_is_reported_and_the_next_one_goes_ahead(
    tmp_path: Path,
) -> None:
    failed: list[tuple[int, BaseException]] = []
    writer = AsyncCheckpointWriter(
        FailingWrite(tmp_path, 3), on_failed=lambda s, e: failed.append((s, e))
    )
    writer.submit(3, snapshot(state(3)))
    writer.submit(6, snapshot(state(6)))  # the failure of step 3 is not raised here
    writer.close()
    assert [(step, type(error)) for step, error in failed] == [(3, OSError)]
    assert writer.last is not None and writer.last.step == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", checkpoint_name(6)]


def test_async_writer_reports_each_write_and_survives_a_failing_report(tmp_path: Path) -> None:
    seen = []

    def on_written(entry: Entry, seconds: float) -> None:
        seen.append((entry.step, entry.size, seconds))
        raise RuntimeError("a broken metrics hook")

    writer = AsyncCheckpointWriter(CheckpointStore(tmp_path), on_written=on_written)
    writer.submit(3, snapshot(state(3)))
    writer.submit(6, snapshot(state(6)))  # waits for the first write: it must have gone well
    writer.close()
    assert [(step, size) for step, size, _ in seen] == [
        (3, (tmp_path / "step-00000003.pt").stat().st_size),
        (6, (tmp_path / "step-00000006.pt").stat().st_size),
    ]
    assert all(seconds > 0 for _, _, seconds in seen)
