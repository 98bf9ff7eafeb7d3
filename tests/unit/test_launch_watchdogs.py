"""The launch's watchdogs (launch/watchdogs.py) on their own: the join watchdog's verdict and
words, and a hang whose lowest rank never beat (its report's step is null in status.json)."""

from __future__ import annotations

import asyncio

import pytest

from trainfleet.launch import watchdogs
from trainfleet.launch.progress import Progress
from trainfleet.launch.runfacts import Joins
from trainfleet.status.hang import Hang

pytestmark = pytest.mark.unit


def test_the_join_watchdog_names_the_ranks_that_did_not_join_once_its_timeout_ran_out():
    said: list[str] = []
    joins = Joins(world_size=3)
    for rank in range(3):
        joins.mark("started", rank, now=1.0)
    joins.mark("entered", 0, now=2.0)
    joins.mark("joined", 0, now=2.5)
    check = dict(started_at=0.0, timeout=60.0, note=said.append)
    assert watchdogs.not_joined(joins, now=61.0, **check) is None and said == []
    assert watchdogs.not_joined(joins, now=62.5, **check) == {1, 2}
    assert said == [
        "not every rank joined the rendezvous within 60 s: stopping every rank on every node"
    ]


def test_a_hang_whose_lowest_rank_never_beat_reports_step_null_and_no_stack(tmp_path):
    progress = Progress(run_id="r1", ranks={"n1": range(0, 1), "n2": range(1, 2)}, started_at=0)
    progress.beat(0, {"step": 4, "pid": 10}, now=5.0)
    said: list[str] = []
    hang = watchdogs.hung(progress, all_exited=False, startup_timeout=None, hang_timeout=10.0,
                          note=said.append, now=20.0)  # fmt: skip
    assert hang == Hang(stuck_s=15.0, detected_at=20.0, phase="training")
    dumps = {"n1": '@@rank 0 pid 10\nState:\tS\nThread 1 (idle): "MainThread"\n    f (x.py:1)\n'}
    dumped = watchdogs.dump_stacks(
        progress, hang, run_dir=tmp_path, dump=lambda pids: dumps, note=said.append
    )
    hang = asyncio.run(dumped)
    assert hang.to_json()["step"] is None and hang.report.stacks == str(tmp_path / "stacks")
    assert [(b.node, b.rank, b.where) for b in hang.behind] == [
        ("n2", 1, "no stack (no pid in its heartbeats)")
    ]
    assert said[1] == "behind at step None: n2 rank 1: no stack (no pid in its heartbeats)"
    assert (tmp_path / "stacks" / "n1.rank0.txt").exists()
