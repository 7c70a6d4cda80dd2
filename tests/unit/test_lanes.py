"""`make test`'s two lanes cover every test path once, with the real-kubelet tiers in order."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ddp_devcluster import lanes


def test_the_repository_tests_are_all_in_exactly_one_lane(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(Path(__file__).parents[2])  # as `make test` runs it
    paths = [str(Path("tests") / Path(p).name) for p in lanes.test_paths(Path("tests"))]
    split = lanes.split(paths)
    ran = [p for p in split["nodes"] + split["procs"] if p in paths]
    assert sorted(ran) == sorted(paths) and len(ran) == len(set(ran))
    # one kind cluster, in this order, then two control-plane modules (after the cluster is gone)
    assert split["nodes"][:2] == ["tests/cluster", "tests/e2e"]
    moved = split["nodes"][2:]
    assert moved and all(p.startswith("tests/controlplane/test_") for p in moved)
    assert "tests/controlplane" in split["procs"] and "tests/trainer" in split["procs"]
    assert [p for p in split["procs"] if p.startswith("--")] == [f"--ignore={p}" for p in moved]


def test_a_new_test_folder_goes_to_procs_and_a_missing_node_tier_is_an_error(
    tmp_path: Path,
) -> None:
    for d in ("cluster", "e2e", "node", "unit", "brand_new", "fixtures_only"):
        (tmp_path / d).mkdir()
    for d in ("cluster", "e2e", "node", "unit", "brand_new"):
        (tmp_path / d / "test_x.py").write_text("")
    (tmp_path / "test_demo.py").write_text("")
    (tmp_path / "conftest.py").write_text("")
    found = lanes.test_paths(tmp_path)
    assert [Path(p).name for p in found] == [
        "brand_new",
        "cluster",
        "e2e",
        "node",
        "test_demo.py",
        "unit",
    ]
    nodes = [str(tmp_path / n) for n in ("cluster", "e2e", "node", "test_demo.py")]
    split = lanes.split(found, nodes)
    assert split["procs"] == [str(tmp_path / "brand_new"), str(tmp_path / "unit")]
    with pytest.raises(SystemExit, match="gone"):
        lanes.split(found, [*nodes, str(tmp_path / "gone")])
    # A module of a folder: in nodes, and ignored by procs, which keeps the rest of its folder.
    module = str(tmp_path / "unit" / "test_x.py")
    split = lanes.split(found, [*nodes, module])
    assert split["nodes"][-1] == module
    assert split["procs"] == [
        str(tmp_path / "brand_new"),
        str(tmp_path / "unit"),
        f"--ignore={module}",
    ]
    with pytest.raises(SystemExit, match="test_gone"):
        lanes.split(found, [*nodes, str(tmp_path / "unit" / "test_gone.py")])


def test_a_failing_lane_fails_the_run_and_both_lanes_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "test_good.py").write_text("def test_ok():\n    assert True\n")
    (tmp_path / "test_bad.py").write_text("def test_no():\n    assert 1 == 2\n")
    rc = lanes.run_lanes(
        {"good": [str(tmp_path / "test_good.py")], "bad": [str(tmp_path / "test_bad.py")]}
    )
    out = capsys.readouterr().out
    assert rc == 1
    assert "[good] " in out and "1 passed" in out and "[bad] " in out and "1 failed" in out
    assert "lane good: passed in" in out
    assert "lane bad: FAILED (pytest exit 1) in" in out
    # the failing test is named again after both verdicts, where a log's tail shows it
    tail = out[out.index("lane bad: FAILED") :]
    assert "lane bad failed on:\n  FAILED " in tail and "test_bad.py::test_no" in tail
    assert "lane good failed on" not in tail
    kept = Path(out.split("temporary files and logs are kept under ")[1].split()[0])
    assert kept.is_dir()
    assert "test_bad.py::test_no FAILED" in (kept / "bad.log").read_text()
    assert "1 passed" in (kept / "good.log").read_text()
    shutil.rmtree(kept)
