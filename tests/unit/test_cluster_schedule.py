"""The cluster tier's split of test files over xdist workers (tests/cluster_schedule.py)."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

import cluster_schedule
from cluster_schedule import DEEPSPEED_RUNNER_FILES, SECONDS, UNMEASURED_S, bins

pytestmark = pytest.mark.unit


def test_the_examples_in_its_docstring_hold():
    assert doctest.testmod(cluster_schedule).failed == 0


def test_every_cluster_test_file_is_measured_and_the_runner_files_exist():
    files = {p.name for p in (Path(__file__).parents[1] / "cluster").glob("test_*.py")}
    assert set(SECONDS) == files
    assert set(DEEPSPEED_RUNNER_FILES) <= files


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_the_runner_files_share_a_worker_and_two_workers_get_the_measured_times_evenly(workers):
    placed = bins(sorted(SECONDS), workers)
    assert sorted(placed) == sorted(SECONDS)
    assert len({placed[f] for f in DEEPSPEED_RUNNER_FILES}) == 1
    load = [0] * workers
    for name, worker in placed.items():
        load[worker] += SECONDS[name]
    if workers == 2:  # the times measured on 2026-11-25 (and test_doctor_load's) split evenly
        assert sorted(load) == [828, 828]


def test_a_file_not_yet_measured_counts_as_a_minute():
    assert UNMEASURED_S == 60
    for measured, first in ((59, "test_new.py"), (61, "test_x.py")):  # longest first
        assert bins(["test_new.py", "test_x.py"], 2, {"test_x.py": measured})[first] == 0
