"""torch's JIT build lock (jit-lock-stale): the probe tells a lock a process holds from one a
killed process left, doctor names the stale one on its node, --fix removes only that one.

The locks here are made by torch's own FileBaton (what cpp_extension.load uses for DeepSpeed's
ops), in a child process that holds it, or that is killed while holding it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from doctor_fixtures import (
    expect_one,
    make_survey,
    reparsed,
    sheets_of,
    stub_which,
    window,
    with_id,
)

from trainfleet.doctor import DoctorReport, node_summaries
from trainfleet.doctor.checks import run_checks, software
from trainfleet.doctor.findings import Severity
from trainfleet.doctor.fix import plan_fixes, render_plan
from trainfleet.node import jitlocks

pytestmark = pytest.mark.unit

N1, N2 = "gpu-node-1", "gpu-node-2"
HOLD = """\
import sys, time
from torch.utils.file_baton import FileBaton
baton = FileBaton(sys.argv[1])
assert baton.try_acquire()
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture
def extensions(tmp_path, monkeypatch) -> Path:
    """An empty TORCH_EXTENSIONS_DIR, and no default root with anything in it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    root = tmp_path / "extensions"
    root.mkdir()
    return root


def _hold(lock: Path) -> subprocess.Popen:
    """A process holding `lock` as torch's builder does, until it is killed."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE)
    assert holder.stdout.readline() == b"held\n"
    return holder


def _age(lock: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(lock, (then, then))


def test_a_held_lock_is_busy_and_a_killed_holders_lock_is_stale(extensions):
    lock = extensions / "fused_adam" / "lock"
    holder = _hold(lock)
    try:
        _age(lock, 600)
        [found] = jitlocks.jit_locks(str(extensions))
        assert found["path"] == str(lock) and found["busy_pids"] == [holder.pid]
        assert jitlocks.stale_jit_locks(str(extensions)) == []
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert lock.exists()  # what a killed build leaves
    [found] = jitlocks.jit_locks(str(extensions))
    assert found["busy_pids"] == [] and found["age_s"] >= 600
    assert [s["path"] for s in jitlocks.stale_jit_locks(str(extensions))] == [str(lock)]


def test_a_young_lock_and_a_build_under_way_are_not_stale(extensions):
    young = extensions / "cpu_adam" / "lock"
    young.parent.mkdir()
    young.touch()
    building = extensions / "deepspeed_shm_comm" / "lock"
    building.parent.mkdir()
    building.touch()
    _age(building, 600)
    # ninja and the compilers work in the build directory while the builder waits for them.
    compiler = subprocess.Popen(["sleep", "60"], cwd=building.parent)
    try:
        locks = {lock["path"]: lock for lock in jitlocks.jit_locks(str(extensions))}
        assert locks[str(building)]["busy_pids"] == [compiler.pid]
        assert locks[str(young)]["busy_pids"] == [] and locks[str(young)]["age_s"] < 60
        assert jitlocks.stale_jit_locks(str(extensions)) == []
    finally:
        compiler.kill()
        compiler.wait()


def test_the_default_root_is_searched_with_its_python_and_cuda_level(extensions, tmp_path):
    lock = tmp_path / "cache" / "torch_extensions" / "py311_cu121" / "fused_adam" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    _age(lock, 120)
    assert [s["path"] for s in jitlocks.stale_jit_locks()] == [str(lock)]


def test_remove_takes_only_stale_locks_and_nothing_else(extensions, tmp_path):
    stale = extensions / "fused_adam" / "lock"
    stale.parent.mkdir()
    stale.touch()
    _age(stale, 600)
    held = extensions / "cpu_adam" / "lock"
    holder = _hold(held)
    _age(held, 600)
    other = tmp_path / "precious" / "lock"  # named like a lock, not under a JIT root
    other.parent.mkdir()
    other.touch()
    _age(other, 600)
    try:
        outcome = jitlocks.remove_stale_jit_locks(
            [str(stale), str(held), str(other)], str(extensions)
        )
    finally:
        holder.kill()
        holder.wait()
    assert outcome[str(stale)] == "removed" and not stale.exists()
    assert outcome[str(held)].startswith("kept") and held.exists()
    assert outcome[str(other)].startswith("kept") and other.exists()


# ----------------------------------------------------------------------------- doctor, --fix


@pytest.fixture
def survey(tmp_path, monkeypatch):
    stub_which(monkeypatch)
    return make_survey(tmp_path, node_env={N2: {"TORCH_EXTENSIONS_DIR": "/scratch/ext"}})


def _lock(path: str, age_s: float, busy: list[int] | None = None) -> dict:
    return {"path": path, "age_s": age_s, "busy_pids": busy or []}


def test_doctor_names_the_stale_lock_on_its_node_and_its_fix(survey):
    sheets = sheets_of(survey)
    sheets[N2]["jit_locks"] = [_lock("/scratch/ext/fused_adam/lock", 1800.0)]
    sheets[N1]["jit_locks"] = [_lock("/root/.cache/torch_extensions/py311_cpu/x/lock", 5)]
    survey = reparsed(survey, sheets)
    expect_one(
        software.check_jit_locks(survey),
        "jit-lock-stale",
        Severity.ERROR,
        (N2,),
        evidence=["/scratch/ext/fused_adam/lock", "30 min old", "wait for it forever"],
        fix=["trainfleet doctor --fix", "rm /scratch/ext/fused_adam/lock"],
    )


def test_one_lock_on_shared_storage_is_one_finding_naming_every_node(survey):
    sheets = sheets_of(survey)
    shared = "/home/u/.cache/torch_extensions/py311_cu121/fused_adam/lock"
    sheets[N1]["jit_locks"] = [_lock(shared, 600.0)]
    sheets[N2]["jit_locks"] = [_lock(shared, 600.0)]
    started, finished = window()
    survey = reparsed(survey, sheets)
    expect_one(
        run_checks(survey, started=started, finished=finished),
        "jit-lock-stale",
        Severity.ERROR,
        (N1, N2),
        evidence=[shared],
    )


def test_a_lock_held_on_another_node_sharing_the_path_is_not_stale(survey):
    sheets = sheets_of(survey)
    shared = "/home/u/.cache/torch_extensions/py311_cu121/fused_adam/lock"
    sheets[N1]["jit_locks"] = [_lock(shared, 600.0, busy=[4242])]
    sheets[N2]["jit_locks"] = [_lock(shared, 600.0)]
    survey = reparsed(survey, sheets)
    assert software.check_jit_locks(survey) == []


@pytest.mark.parametrize(
    "report",
    [
        "not a list",
        [["/a/lock", 600]],
        [_lock("/a/lock\n@cert-authority * ssh-ed25519 AAAA", 600.0)],
        [_lock("relative/lock", 600.0)],
        [_lock("/etc/passwd", 600.0)],
        [{"path": "/a/lock", "age_s": "old", "busy_pids": []}],
    ],
)
def test_a_malformed_report_is_not_a_finding_and_not_a_fix(survey, report):
    sheets = sheets_of(survey)
    sheets[N2]["jit_locks"] = report
    survey = reparsed(survey, sheets)
    assert software.check_jit_locks(survey) == []
    assert software.stale_jit_locks(survey) == []


def test_fix_plans_the_removal_on_the_node_with_its_extensions_dir(survey):
    sheets = sheets_of(survey)
    path = "/scratch/ext/fused_adam/lock"
    sheets[N2]["jit_locks"] = [_lock(path, 1800.0)]
    started, finished = window()
    survey = reparsed(survey, sheets)
    report = DoctorReport(
        findings=run_checks(survey, started=started, finished=finished),
        nodes=node_summaries(survey),
        survey=survey,
    )
    assert with_id(report.findings, "jit-lock-stale")
    plan = plan_fixes(report)
    [fix] = plan.jit_locks
    assert (fix.node, fix.paths, fix.extensions_dir) == (N2, [path], "/scratch/ext")
    assert not [line for line in plan.not_done if line.startswith("jit-lock-stale")]
    assert plan.to_json()["jit_locks"] == {N2: [path]}
    text = render_plan(plan)
    assert f"remove torch's stale JIT build lock(s) on {N2}:" in text and path in text
