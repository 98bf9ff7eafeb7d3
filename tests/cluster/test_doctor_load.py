"""doctor where nodes or this machine are slow: a node whose login waits is named `slow-node`
with its seconds (not `ssh-unreachable`), and on a machine kept busy by two CPU-bound
processes, doctor on 64 nodes (--quick) and 32 (full) reports no error at all: its probes are
waited for while they start and say they are alive (`doctor/pace.py`).

The nodes' login shell is root's own here (bash, which sources this machine's ~/.bashrc for
every ssh command: on the CI image a pyenv init, about 0.3 s of CPU per login)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainfleet.sandbox.faults import SLOW_LOGIN_S

pytestmark = pytest.mark.cluster


def _doctor(cluster_file: Path, *flags: str) -> tuple[dict, int]:
    proc = subprocess.run(
        [sys.executable, "-m", "trainfleet", "doctor", "-c", str(cluster_file), "--json", *flags],
        capture_output=True,
        text=True,
        timeout=600,
    )
    return json.loads(proc.stdout), proc.returncode


def _errors(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["severity"] == "error"]


def test_a_node_whose_login_waits_is_a_slow_node_warning_with_its_seconds(make_sandbox):
    box = make_sandbox(nodes=3, faults=["slow-login@3"])
    report, code = _doctor(box.cluster_file, "--quick")
    assert code == 0 and _errors(report) == [], report["findings"]
    (slow,) = [f for f in report["findings"] if f["id"] == "slow-node"]
    assert slow["severity"] == "warning" and slow["nodes"] == ["gpu-node-3"], slow
    started = float(slow["evidence"][0].split("started after ")[1].split(" s")[0])
    assert SLOW_LOGIN_S <= started < SLOW_LOGIN_S + 10, slow
    assert report["nodes"]["gpu-node-3"]["reachable"] is True  # its facts came, late


@pytest.fixture
def two_cpu_hogs():
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield
    for hog in hogs:
        hog.kill()
        hog.wait()


@pytest.mark.serial  # it loads this machine on purpose: alone, as the bench case
def test_doctor_on_a_busy_machine_reports_no_false_errors(make_sandbox, two_cpu_hogs):
    """Before the pace, 64 nodes with root's bash got 60+ `ssh-unreachable` ("the probe did
    not finish in 31 s") from doctor --quick on this machine, idle or not."""
    report, code = _doctor(make_sandbox(nodes=64).cluster_file, "--quick")
    assert code == 0 and _errors(report) == [], _errors(report)[:3]
    assert all(n["reachable"] for n in report["nodes"].values())
    report, code = _doctor(make_sandbox(nodes=32).cluster_file)
    assert code == 0 and _errors(report) == [], _errors(report)[:3]
    assert "collective" in report["phases"]  # the all_reduce across the 32 ran, and passed
