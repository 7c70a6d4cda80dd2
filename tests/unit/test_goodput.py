"""The incident figures of bench/goodput.py and the per-step kind test, from run-log rows."""

from __future__ import annotations

from ddp_devcluster import goodput


def rows(*pairs: tuple[float, int]) -> list[dict[str, object]]:
    return [{"event": "start", "time": 0.0}] + [
        {"event": "step", "time": t, "step": s} for t, s in pairs
    ]


def test_an_even_run_has_goodput_one_no_redone_steps_and_no_stall() -> None:
    run = rows(*[(float(i), i) for i in range(1, 11)])
    out = goodput.summary(run, [])
    assert out["goodput"] == 1.0
    assert out["steps_redone"] == 0
    assert out["survivor_stall_p50_s"] is None


def test_a_restart_redoes_the_steps_after_its_checkpoint_and_its_stall_is_the_gap() -> None:
    # steps 1..6 a second apart, lost at 6.5 s, resumed from step 4 at 30 s
    run = rows(*[(float(i), i) for i in range(1, 7)], (30.0, 5), (31.0, 6), (32.0, 7))
    out = goodput.summary(run, [6.5])
    assert out["steps_redone"] == 2  # the first 5 and 6
    assert out["survivor_stall_max_s"] == 23.5  # the loss at 6.5 s -> step 5 again at 30 s
    # kept: 1..4 (3 s of gaps), 5 (a stall: one median step), 6 and 7 (1 s each) = 6 s of 31
    assert out["goodput"] == round(6.0 / 31.0, 3)


def test_per_step_survivors_pause_only_for_the_lost_group_s_timeout() -> None:
    steps = [(float(i), i) for i in range(1, 11)] + [(13.0, 11)]
    steps += [(13.0 + i, 11 + i) for i in range(1, 10)]
    out = goodput.summary(rows(*steps), [10.2, 15.5])
    assert out["stalls_s"] == [2.8, 1.0]
    assert out["steps_redone"] == 0
    assert 0.95 <= out["goodput"] <= 1.0


def test_stall_of_an_incident_after_the_last_row_is_zero() -> None:
    assert goodput.stalls(goodput.step_rows(rows((1.0, 1))), [5.0]) == [0.0]


def test_time_held_at_a_hold_point_is_no_stall_and_no_wall_time() -> None:
    # steps a second apart; held after step 5 (at 5.1 s) until 25.1 s; a group lost at 5.5 s
    run = rows(*[(float(i), i) for i in range(1, 6)], *[(21.0 + i, i) for i in range(6, 11)])
    run += [{"event": "hold", "time": 5.1, "step": 5}, {"event": "release", "time": 25.1}]
    assert goodput.held_spans(run) == [(5.1, 25.1)]
    out = goodput.summary(run, [5.5])
    assert out["stalls_s"] == [1.9]  # 5.5 s -> 27.0 s, of which 19.6 s held
    assert out["goodput"] == 1.0
    # without the hold rows the same run stalled for 21.5 s
    assert goodput.summary(run[:-2], [5.5])["stalls_s"] == [21.5]


def test_a_hold_not_yet_released_holds_to_the_end() -> None:
    held = goodput.held_spans([{"event": "hold", "time": 3.0}])
    assert held == [(3.0, float("inf"))]
    assert goodput.stalls(goodput.step_rows(rows((1.0, 1), (2.0, 2))), [2.5], held) == [0.0]


def test_a_window_ends_the_figures_at_until_and_a_step_redone_after_it_is_not_kept() -> None:
    # the restart run above: steps 1..6 a second apart, lost at 6.5 s, step 5 again at 30 s;
    # then even steps to 40 s, which a window ending at 31.5 s leaves out
    run = rows(*[(float(i), i) for i in range(1, 7)], *[(25.0 + s, s) for s in range(5, 16)])
    whole = goodput.summary(run, [6.5])
    assert whole["steps_logged"] == 17 and whole["steps_redone"] == 2
    out = goodput.summary(run, [6.5], until=31.5)
    assert out["steps_logged"] == 8 and out["steps_redone"] == 2  # 1..6, then 5 and 6 again
    assert out["stalls_s"] == [23.5]
    assert out["goodput"] == round(5.0 / 30.5, 3)  # kept 2..4, 5 (one median step), 6
    assert out["goodput"] < whole["goodput"]  # the clean tail no longer dilutes the incident
    # a window that ends before the loss: step 5 (at 5 s) is trained again after it
    early = goodput.summary(run, [], until=5.5)
    assert early["steps_redone"] == 1
    assert early["goodput"] == round(3.0 / 4.5, 3)


def test_the_operator_s_moves_are_read_from_the_job_s_status_from_a_time_on() -> None:
    status = {
        "incidents": [
            {"kind": "Rebalance", "detectedAt": "2026-11-29T17:47:53Z"},
            {"kind": "NodeLost", "detectedAt": "2026-11-29T17:48:20Z"},
            {"kind": "Rebalance", "detectedAt": "2026-11-29T17:48:43Z"},
        ]
    }
    first, second = 1795974473.0, 1795974523.0  # those two times
    assert goodput.moves(status) == [first, second]
    assert goodput.moves(status, since=first + 1) == [second]
    assert goodput.moves({}) == []
