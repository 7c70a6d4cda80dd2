"""`make test`'s two lanes cover every test path once, with the real-kubelet tiers in order."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_devcluster import lanes


def test_the_repository_tests_are_all_in_exactly_one_lane() -> None:
    paths = lanes.test_paths(Path(__file__).parents[1])
    split = lanes.split([str(Path("tests") / Path(p).name) for p in paths])
    ran = split["nodes"] + split["procs"]
    assert sorted(ran) == sorted(str(Path("tests") / Path(p).name) for p in paths)
    assert len(ran) == len(set(ran))
    assert split["nodes"][0] == "tests/cluster"  # kind first: deleted before the real node
    assert "tests/controlplane" in split["procs"] and "tests/trainer" in split["procs"]


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
