"""Why a run ended, in the one line the restart log keeps (`launch/restarts.cause_of`), and
which causes are not worth a restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainfleet.catalog import FindingId
from trainfleet.launch.restarts import PERMANENT, cause_of, end_cause, record
from trainfleet.launch.result import LaunchResult, RunState
from trainfleet.launch.rootcause import RankError

pytestmark = pytest.mark.unit


def _result(state=RunState.FAILED, **fields) -> LaunchResult:
    base = dict(state=state, exit_code=1, run_dir=Path("r"), seconds=3.0, node_codes={})
    return LaunchResult(**(base | fields))


def _error(text, node="gpu-node-2", rank=1, consequence=False) -> RankError:
    return RankError(time=1.0, node=node, rank=rank, text=text, consequence=consequence)


def test_a_rank_error_is_the_cause_with_its_node_and_rank():
    result = _result(root_cause=_error("RuntimeError: CUDA error: an illegal memory access"),
                     first_failure="gpu-node-2")  # fmt: skip
    assert cause_of(result) == (
        "rank-crashed: gpu-node-2 rank 1: RuntimeError: CUDA error: an illegal memory access"
    )


def test_a_node_that_failed_first_without_words_is_named_not_the_echo_on_the_others():
    """gpu-node-2 was SIGKILLed (its connection dropped); gpu-node-1's rank then printed gloo's
    'Connection closed by peer', a consequence."""
    echo = _error("RuntimeError: Connection closed by peer", node="gpu-node-1", rank=0,
                  consequence=True)  # fmt: skip
    result = _result(root_cause=echo, first_failure="gpu-node-2", node_codes={"gpu-node-2": 255})
    assert cause_of(result) == "rank-crashed: gpu-node-2 failed first (its connection dropped)"


def test_the_free_space_check_is_disk_low_and_a_not_shared_output_is_permanent():
    disk = _error("trainfleet train: /out has 1.2 GiB free: the next checkpoint needs about 2 GiB")
    assert cause_of(_result(root_cause=disk)).startswith("disk-low: gpu-node-2 rank 1:")
    assert not cause_of(_result(root_cause=disk)).startswith(PERMANENT)
    apart = _error(
        "trainfleet train: gpu-node-2 cannot see /out/.cache/x (written on the launch node):"
        " OUTPUT (/out) is not shared storage: put --output on storage every node mounts"
    )
    assert cause_of(_result(root_cause=apart)).startswith(PERMANENT)


def test_the_restart_is_decided_by_the_cause_s_id_not_its_words():
    apart = _error("trainfleet train: OUTPUT (/out) is not shared storage: put --output on ...")
    ended = end_cause(_result(root_cause=apart))
    assert ended.id is FindingId.OUTPUT_NOT_SHARED and ended.id in PERMANENT
    # A script that prints the id's words is a crashed rank like any other.
    echo = end_cause(_result(root_cause=_error("RuntimeError: output-not-shared: no")))
    assert echo.id is FindingId.RANK_CRASHED and echo.id not in PERMANENT
    assert str(echo) == "rank-crashed: gpu-node-2 rank 1: RuntimeError: output-not-shared: no"
    nothing = _result(RunState.FAILED, exit_code=7)
    assert end_cause(nothing).id is None and cause_of(nothing) == "failed (exit code 7)"


def test_a_stalled_rendezvous_names_the_ranks_not_joined():
    result = _result(RunState.STALLED, not_joined={"gpu-node-3": [4, 5]})
    assert cause_of(result) == "rendezvous-timeout: not joined: gpu-node-3 (ranks [4, 5])"


def test_record_appends_one_json_line_per_restart(tmp_path):
    log = tmp_path / "restarts.jsonl"
    record(log, attempt=1, run_id="r1", cause="rank-hung: x")
    entry = record(log, attempt=2, run_id="r2", cause="rank-crashed: y")
    lines = log.read_text().splitlines()
    assert len(lines) == 2 and entry["after_run"] == "r2" and '"attempt": 1' in lines[0]
