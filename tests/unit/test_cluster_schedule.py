"""The cluster tier's split of test files over xdist workers (tests/cluster_schedule.py)."""

from __future__ import annotations

import doctest
import itertools
import json
from pathlib import Path

import pytest

import cluster_schedule
from cluster_schedule import (
    DEEPSPEED_RUNNER_FILES,
    UNMEASURED_S,
    bins,
    file_seconds,
    record,
    recorded_seconds,
)

pytestmark = pytest.mark.unit

CLUSTER_FILES = {p.name for p in (Path(__file__).parents[1] / "cluster").glob("test_*.py")}

MEASURED_2026_11_25 = {
    "test_setup.py": 387,
    "test_chaos.py": 316,
    "test_launch.py": 315,
    "test_train.py": 201,
    "test_migration.py": 143,
    "test_third_party.py": 122,
    "test_doctor.py": 87,
    "test_doctor_load.py": 30,
    "test_commtest.py": 28,
    "test_sandbox_exec.py": 17,
    "test_sandbox_faults.py": 10,
}
"""A recorded tier as input: two workers split it 828/828 with the runner files together."""


def _loads(placed: dict[str, int], seconds: dict[str, int], workers: int) -> list[int]:
    load = [0] * workers
    for name, worker in placed.items():
        load[worker] += seconds.get(name, UNMEASURED_S)
    return load


def test_the_examples_in_its_docstring_hold():
    assert doctest.testmod(cluster_schedule).failed == 0


def test_every_cluster_test_file_is_recorded_and_the_runner_files_exist():
    assert set(recorded_seconds()) == CLUSTER_FILES
    assert set(DEEPSPEED_RUNNER_FILES) <= CLUSTER_FILES


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_the_runner_files_share_a_worker_and_the_rest_go_longest_first_to_the_least_loaded(
    workers,
):
    placed = bins(sorted(MEASURED_2026_11_25), workers, MEASURED_2026_11_25)
    assert sorted(placed) == sorted(MEASURED_2026_11_25)
    assert len({placed[f] for f in DEEPSPEED_RUNNER_FILES if f in placed}) == 1
    if workers == 2:
        assert sorted(_loads(placed, MEASURED_2026_11_25, 2)) == [828, 828]


def test_two_workers_split_the_recorded_times_within_lpts_bound_of_the_best_split():
    seconds = recorded_seconds()
    placed = bins(sorted(CLUSTER_FILES), 2, seconds)
    runner = sum(seconds[f] for f in DEEPSPEED_RUNNER_FILES)
    rest = [seconds[f] for f in sorted(CLUSTER_FILES) if f not in DEEPSPEED_RUNNER_FILES]
    total = runner + sum(rest)
    best = min(
        max(side, total - side)
        for picks in itertools.product((0, 1), repeat=len(rest))
        for side in [runner + sum(s for s, p in zip(rest, picks, strict=True) if p)]
    )
    assert max(_loads(placed, seconds, 2)) <= best * 7 / 6  # Graham's bound for two workers


def test_a_file_not_yet_measured_counts_as_a_minute():
    assert UNMEASURED_S == 60
    for measured, first in ((59, "test_new.py"), (61, "test_x.py")):  # longest first
        assert bins(["test_new.py", "test_x.py"], 2, {"test_x.py": measured})[first] == 0


def test_recording_replaces_what_ran_keeps_the_rest_and_drops_files_that_are_gone(tmp_path):
    path = tmp_path / "durations.json"
    assert recorded_seconds(path) == {}
    path.write_text(json.dumps({"seconds": {"test_a.py": 10, "test_b.py": 20, "test_gone.py": 5}}))
    measured = file_seconds(
        [("tests/cluster/test_a.py::t[x]", 30.4), ("tests/cluster/test_a.py::t[x]", 1.0)]
    )
    record(measured, existing={"test_a.py", "test_b.py"}, path=path)
    assert recorded_seconds(path) == {"test_a.py": 31, "test_b.py": 20}
