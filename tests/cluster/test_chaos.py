"""Faults injected into `trainfleet train` on a 2-node sandbox (real sshd, torchrun, DeepSpeed
ZeRO-2 over gloo): for each, the time from the fault to the launcher saying so (read from its
output as it arrives), that no process of the job is left on any node, and that a run with
--max-restarts 1 ends with the same losses as an uninterrupted run (1e-4 relative, fp32, as
tests/cluster/test_train.py's resume test: the same steps from the same checkpoint).

Every run: 12 steps, a checkpoint every 4; each fault is injected once checkpoint-4 is
complete, so the restart resumes from step 4 (or 8)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import train_jobs
from train_jobs import train_job_processes

from session_scope import own_sandbox_name
from trainfleet.localprocs import cmdline
from trainfleet.train.checkpoints import step_of, tree_bytes

pytestmark = train_jobs.PYTESTMARK

STEPS = ["--max-steps", "12", "--save-steps", "4", "--zero", "2", "--precision", "fp32",
         "--seq-len", "64", "--micro-batch-size", "4", "--learning-rate", "1e-3",
         "--seed", "7"]  # fmt: skip
HANG_TIMEOUT_S = 5
SHELL = "/bin/sh"
"""Root's shell on the nodes. This machine's ~/.bashrc runs `pyenv rehash`, which holds a lock
file while it runs; a shell SIGKILLed in that moment leaves the lock behind and every later ssh
session waits 60 s for it (seen here): a property of this machine's shell setup, which the
faults below would otherwise trip over."""


class Train:
    """`trainfleet train` as a user runs it, its output lines timestamped as they arrive."""

    def __init__(self, cluster_file: Path, assets: dict, output: Path, *flags: str) -> None:
        argv = [
            sys.executable, "-m", "trainfleet", "train", "-c", str(cluster_file),
            "--model", str(assets["model"]), "--data", str(assets["data"]),
            "--output", str(output), *STEPS, "--hang-timeout", str(HANG_TIMEOUT_S), *flags,
        ]  # fmt: skip
        self.output = output
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        self.lines: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def when(self, pattern: str, timeout: float = 120) -> float:
        """The arrival time of the first line matching `pattern` (waits for it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for at, line in list(self.lines):
                if re.search(pattern, line):
                    return at
            assert self.proc.poll() is None or self.reader.is_alive(), self.text()
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r} within {timeout} s:\n{self.text()}")

    def wait_for_checkpoint(self, step: int, timeout: float = 180) -> None:
        """Until `latest` names checkpoint-STEP or later (its mark comes first: a fault between
        the two is the unit tests' case, test_train_checkpoints)."""
        deadline = time.monotonic() + timeout
        while step_of(Path(_pointer(self.output) or "none")) < step:
            assert self.proc.poll() is None and time.monotonic() < deadline, self.text()
            time.sleep(0.05)

    def finish(self, timeout: float = 300) -> int:
        code = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=10)
        return code

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


def _pointer(output: Path) -> str | None:
    try:
        return (output / "latest").read_text().strip()
    except FileNotFoundError:
        return None


def _losses(output: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (output / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows}  # a resumed run's later lines win


@pytest.fixture(scope="module")
def reference(assets, tmp_path_factory) -> dict[int, float]:
    """The uninterrupted run's losses."""
    from trainfleet import sandbox

    output = tmp_path_factory.mktemp("reference")
    box = sandbox.up(name=own_sandbox_name("c", "ref"), nodes=2, slots=1, login_shell=SHELL)
    try:
        run = Train(box.cluster_file, assets, output)
        assert run.finish() == 0, run.text()
    finally:
        sandbox.down(box.name)
    losses = _losses(output)
    assert sorted(losses) == list(range(1, 13))
    return losses


def _restarted_to_the_same_losses(run: Train, reference: dict[int, float], cause: str) -> None:
    assert run.finish() == 0, run.text()
    text = run.text()
    assert "restart 1 of 1 after " + cause in text, text
    assert "resuming from checkpoint-" in text
    restarts = [json.loads(x) for x in (run.output / "restarts.jsonl").read_text().splitlines()]
    assert [r["cause"].split(":")[0] for r in restarts] == [cause]
    got = _losses(run.output)
    for step in range(5, 13):
        assert got[step] == pytest.approx(reference[step], rel=1e-4), (step, got, reference)


def test_sigkill_of_every_process_on_a_node(make_sandbox, tmp_path, assets, reference):
    """Everything of the job in gpu-node-2's namespace (its sshd sessions, bootstrap, torchrun,
    rank) killed with SIGKILL, as the OOM killer or a crash would: its connection drops at
    once. Detected within 5 s."""
    box = make_sandbox(nodes=2, slots=1, login_shell=SHELL)
    run = Train(box.cluster_file, assets, tmp_path / "out", "--max-restarts", "1")
    run.wait_for_checkpoint(4)
    netns = box.node(2).netns
    from trainfleet.sandbox.netns import netns_pids

    injected = time.time()
    for pid in netns_pids(netns):
        if not cmdline(pid).startswith("sshd: /usr/sbin/sshd"):  # the node's sshd daemon stays
            os.kill(pid, signal.SIGKILL)
    detected = run.when(r"gpu-node-2 failed") - injected
    print(f"detected after {detected:.1f} s")  # the figure in docs/status.md (-v -s)
    assert detected < 5, detected
    _restarted_to_the_same_losses(run, reference, "rank-crashed")


def test_a_stopped_rank_is_a_hang(make_sandbox, tmp_path, assets, reference):
    """gpu-node-2's rank SIGSTOPped: gloo would wait 30 minutes. Detected by the hang watchdog
    within HANG_TIMEOUT_S + 3 s of the fault (the last step may have ended just before it)."""
    box = make_sandbox(nodes=2, slots=1, login_shell=SHELL)
    run = Train(box.cluster_file, assets, tmp_path / "out", "--max-restarts", "1")
    run.wait_for_checkpoint(4)
    jobs = train_job_processes()
    ranks = [p for p in jobs if "shim.py" in p and "torch.distributed.run" not in p]
    victim = next(int(p.split(":")[0]) for p in ranks if _in_netns(int(p.split(":")[0]), box, 2))
    injected = time.time()
    os.kill(victim, signal.SIGSTOP)
    detected = run.when(r"no rank advanced a step for") - injected
    print(f"detected after {detected:.1f} s")  # the figure in docs/status.md (-v -s)
    assert detected < HANG_TIMEOUT_S + 3, detected
    run.when(r"behind at step \d+: gpu-node-2 rank 1: stopped \(SIGSTOP", timeout=30)
    # Whichever collective the stop caught (DeepSpeed's gradient all_reduce in its data-parallel
    # group, or an all_gather of the save after checkpoint 8): rank 0 entered it.
    run.when(r"stuck in (all_reduce|all_gather\w*|reduce_scatter\w*|broadcast|barrier) #\d+ of"
             r" process group \d+.*: entered by rank 0 \(gpu-node-1\); no record from rank 1"
             r" \(gpu-node-2\)", timeout=30)  # fmt: skip
    _restarted_to_the_same_losses(run, reference, "rank-hung")


def test_the_ssh_connection_to_a_node_killed(make_sandbox, tmp_path, assets, reference):
    box = make_sandbox(nodes=2, slots=1, login_shell=SHELL)
    run = Train(box.cluster_file, assets, tmp_path / "out", "--max-restarts", "1")
    run.wait_for_checkpoint(4)
    ssh = subprocess.run(["pgrep", "-P", str(run.proc.pid), "-f", "ssh .*gpu-node-2"],
                         capture_output=True, text=True, check=False).stdout.split()  # fmt: skip
    assert len(ssh) == 1, ssh
    injected = time.time()
    os.kill(int(ssh[0]), signal.SIGKILL)
    detected = run.when(r"gpu-node-2 failed \(its connection ended") - injected
    print(f"detected after {detected:.1f} s")  # the figure in docs/status.md (-v -s)
    assert detected < 3, detected
    _restarted_to_the_same_losses(run, reference, "rank-crashed")


def test_a_node_link_down_then_back(make_sandbox, tmp_path, assets, reference):
    """gpu-node-2's interface set down: TCP stalls, nothing errs. The hang watchdog sees no
    step (ssh's keepalive would take 15 s). The link comes back once the run is stopped, so
    the restart's preflight finds the node again."""
    box = make_sandbox(nodes=2, slots=1, login_shell=SHELL)
    run = Train(box.cluster_file, assets, tmp_path / "out", "--max-restarts", "1")
    run.wait_for_checkpoint(4)
    node = box.node(2)
    link = ["ip", "-n", node.netns, "link", "set", node.ifname]
    injected = time.time()
    subprocess.run([*link, "down"], check=True)
    try:
        first = run.when(r"no rank advanced a step for|gpu-node-2 failed")
        detected = first - injected
        print(f"detected after {detected:.1f} s")  # the figure in docs/status.md (-v -s)
        assert detected < HANG_TIMEOUT_S + 3, detected
        run.when(r"every rank on every node stopped|restart 1 of 1")
    finally:
        subprocess.run([*link, "up"], check=True)
    _restarted_to_the_same_losses(run, reference, "rank-hung")


def test_ctrl_c_stops_everything_and_the_same_command_resumes(
    make_sandbox, tmp_path, assets, reference
):
    """Ctrl-C is the user's: no restart. Everything stops, exit 130, `latest` is a complete
    checkpoint, and running the command again resumes to the same losses."""
    box = make_sandbox(nodes=2, slots=1, login_shell=SHELL)
    run = Train(box.cluster_file, assets, tmp_path / "out", "--max-restarts", "1")
    run.wait_for_checkpoint(4)
    injected = time.time()
    os.killpg(run.proc.pid, signal.SIGINT)  # the terminal sends it to the foreground group
    detected = run.when(r"interrupted") - injected
    print(f"detected after {detected:.1f} s")  # the figure in docs/status.md (-v -s)
    assert detected < 2, detected
    assert run.finish() == 130, run.text()
    assert "restart" not in run.text()
    latest = (tmp_path / "out" / "latest").read_text().strip()
    assert (tmp_path / "out" / latest / "TRAINFLEET_COMPLETE").exists()
    again = Train(box.cluster_file, assets, tmp_path / "out")
    assert again.finish() == 0, again.text()
    got = _losses(tmp_path / "out")
    for step in range(5, 13):
        assert got[step] == pytest.approx(reference[step], rel=1e-4), (step, got, reference)


def test_the_output_filling_up_at_a_checkpoint(make_sandbox, tmp_path, assets, reference):
    """OUTPUT on a tmpfs; once checkpoint-4 is written, the tmpfs is shrunk to leave half a
    checkpoint free: the save of checkpoint-8 is refused on every rank before anything is
    written (`latest` stays checkpoint-4, complete). The space comes back once the failure is
    reported, and the restart finishes the run."""
    output = tmp_path / "out"
    output.mkdir()
    # Before the sandbox: each node's sshd lives in a mount namespace copied when it starts
    # (`ip netns exec`), and a mount made here later does not reach it (measured: the ranks
    # then stop because OUTPUT is not shared). Resizing later does: it is the same tmpfs.
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(output)], check=True)
    box = make_sandbox(nodes=2, slots=1, login_shell=SHELL)
    try:
        run = Train(box.cluster_file, assets, output, "--max-restarts", "1")
        run.wait_for_checkpoint(4)
        checkpoint = tree_bytes(output / "checkpoint-4")
        fs = os.statvfs(output)
        used = (fs.f_blocks - fs.f_bfree) * fs.f_frsize
        injected = time.time()
        size = f"size={used + checkpoint // 2}"
        subprocess.run(["mount", "-o", f"remount,{size}", str(output)], check=True)
        failed = run.when(r"failed \(exit code")
        print(f"detected after {failed - injected:.1f} s")  # docs/status.md's figure (-v -s)
        # The stop must come from the ranks' refusal, not from the hang detector's timeout (a
        # wall-clock bound here failed CI at 10.04 s beside the other worker's compiles, 4 s
        # alone: the time is docs/status.md's figure, the cause is what this test checks).
        refused = run.when("the next checkpoint needs about")
        before = "\n".join(line for at, line in run.lines if at <= failed)
        assert refused <= failed and "no rank advanced a step" not in before, run.text()
        assert (output / "latest").read_text().strip() == "checkpoint-4"
        assert not (output / "checkpoint-8").exists()
        assert "the next checkpoint needs about" in run.text()
        subprocess.run(["mount", "-o", "remount,size=256m", str(output)], check=True)
        _restarted_to_the_same_losses(run, reference, "disk-low")
    finally:
        subprocess.run(["umount", "-l", str(output)], check=False)


def _in_netns(pid: int, box, index: int) -> bool:
    from trainfleet.sandbox.netns import netns_pids

    return pid in netns_pids(box.node(index).netns)
