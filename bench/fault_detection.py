"""Faults injected into one training job, run by `trainfleet train` and by DeepSpeed's runner.

    sudo .venv/bin/python bench/fault_detection.py [--faults kill-node,...] [--cap 120]
                                                   [--hang-timeout 10] [--json FILE]

The job: the built-in demo's tiny Llama, ZeRO-2 over gloo, 2 sandbox nodes x 1 rank, 24 steps,
a checkpoint every 8. Both runners start the same rank program (`trainfleet.train.worker`):
`trainfleet train --hang-timeout H`, and `deepspeed --hostfile ... --module
trainfleet.train.worker` set up by hand as the seeds do (hostfile, .deepspeed_env, pdsh's ssh
options). Once checkpoint-8 is complete the fault is injected on gpu-node-2 (or the runner, for
Ctrl-C), and three times are taken from the injection, capped at --cap seconds:

- reported: the runner's first line that says so. trainfleet: its finding ("gpu-node-2 failed
  ...", "no rank advanced a step for ...", "interrupted"). The deepspeed runner: the first line
  that looks like an error (Traceback, an exit code, "Error", "killed"); the line is printed so
  you can judge it.
- collective: the runner's first line that names the collective the job is stuck in.
  trainfleet: its hang report's `stuck in OP #SEQ ...` (from the ranks' Flight Recorder); the
  deepspeed runner: any line naming a collective op (all_reduce, all_gather, reduce_scatter,
  broadcast, barrier);
- exited: the runner's command returned;
- clean: no job process (rank, torchrun, DeepSpeed's launch.py, bootstrap) is left on any node
  (a leftover holds GPUs and port 29500: seed 000); polled every 0.5 s up to the cap, and the
  count left at the cap is shown when they were not all gone.

No restarts are asked for: this is about noticing. Every sandbox node shares this machine's 2
cores; the times are this machine's, the comparison is the point.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from trainfleet import sandbox
from trainfleet.localprocs import cmdline
from trainfleet.node.bootstrap import descendants
from trainfleet.sandbox.netns import netns_pids
from trainfleet.train import demo_assets
from trainfleet.train.checkpoints import tree_bytes
from trainfleet.train.config import TrainConfig
from trainfleet.train.data import prepare_cache

DEEPSPEED = Path(sys.executable).parent / "deepspeed"
JOB = dict(max_steps=24, save_steps=8, zero=2, precision="fp32", seq_len=64,
           micro_batch_size=4, learning_rate=1e-3, seed=7)  # fmt: skip
TRAINFLEET_REPORT = r"gpu-node-\d failed|no rank advanced a step for|interrupted"
DEEPSPEED_REPORT = r"Traceback|[Ee]rror|exit ?code|return code|[Kk]illed|[Ii]nterrupt"
TRAINFLEET_COLLECTIVE = r"stuck in \w+ #\d+"
DEEPSPEED_COLLECTIVE = r"(?i)all_?reduce|all_?gather|reduce_?scatter|broadcast|barrier"
JOB_PROCESS = ("trainfleet.train.worker", "trainfleet-bootstrap", "deepspeed.launcher.launch")
SHELL = "/bin/sh"  # root's shell on the nodes: not this machine's ~/.bashrc (see test_chaos)


class Job:
    """A runner's command, its output lines timestamped as they arrive."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv, cwd=cwd, env={**os.environ, **env}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        self.lines: list[tuple[float, str]] = []
        self.exited_at: float | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))
        self.proc.wait()
        self.exited_at = time.time()

    def first(self, pattern: str, after: float) -> tuple[float, str] | None:
        hits = ((at, x) for at, x in list(self.lines) if at >= after and re.search(pattern, x))
        return next(hits, None)

    def stop(self) -> None:
        """As a user would: Ctrl-C, then kill."""
        for sig, wait in ((signal.SIGINT, 30), (signal.SIGKILL, 10)):
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, sig)
                try:
                    self.proc.wait(timeout=wait)
                except subprocess.TimeoutExpired:
                    pass

    def text(self) -> str:
        return "\n".join(x for _, x in self.lines)


def job_processes(box) -> list[int]:
    pids = []
    for node in box.nodes:
        for pid in netns_pids(node.netns):
            if any(mark in cmdline(pid) for mark in JOB_PROCESS):
                pids.append(pid)
    return pids


# The faults: each takes (sandbox, job) and returns a function that undoes it, or None.


def kill_node(box, job):
    """Every process in gpu-node-2's namespace but its sshd daemon: SIGKILL (OOM, crash)."""
    for pid in netns_pids(box.node(2).netns):
        if not cmdline(pid).startswith("sshd: /usr/sbin/sshd"):
            os.kill(pid, signal.SIGKILL)


def stop_rank(box, job):
    """gpu-node-2's rank SIGSTOPped: a hang (gloo waits 30 minutes, NCCL 10)."""
    workers = [p for p in netns_pids(box.node(2).netns) if "trainfleet.train.worker" in cmdline(p)]
    leaf = [p for p in workers if not set(descendants(p)) & set(workers)]
    os.kill(leaf[0], signal.SIGSTOP)
    return lambda: os.kill(leaf[0], signal.SIGCONT)


def kill_ssh(box, job):
    """The launch node's ssh connection to gpu-node-2 killed."""
    host = box.node(2).hostname
    ssh = [p for p in descendants(job.proc.pid) if re.match(rf"ssh .*\b{host}\b", cmdline(p))]
    for pid in ssh:
        os.kill(pid, signal.SIGKILL)


def link_down(box, job):
    """gpu-node-2's interface set down: TCP stalls, nothing errs."""
    node = box.node(2)
    link = ["ip", "-n", node.netns, "link", "set", node.ifname]
    subprocess.run([*link, "down"], check=True)
    return lambda: subprocess.run([*link, "up"], check=True)


def fill_output(box, job, output: Path):
    """OUTPUT (a tmpfs) shrunk to leave half a checkpoint free before checkpoint-16."""
    checkpoint = tree_bytes(output / "checkpoint-8")
    fs = os.statvfs(output)
    used = (fs.f_blocks - fs.f_bfree) * fs.f_frsize
    size = f"size={used + checkpoint // 2}"
    subprocess.run(["mount", "-o", f"remount,{size}", str(output)], check=True)
    return lambda: subprocess.run(["mount", "-o", "remount,size=256m", str(output)], check=True)


def ctrl_c(box, job):
    """SIGINT to the runner's process group, as the terminal sends it."""
    os.killpg(job.proc.pid, signal.SIGINT)


FAULTS: dict[str, Callable] = {
    "kill-node": kill_node,
    "stop-rank": stop_rank,
    "kill-ssh": kill_ssh,
    "link-down": link_down,
    "output-full": fill_output,
    "ctrl-c": ctrl_c,
}


def _trainfleet(box, assets: dict, output: Path, hang_timeout: float) -> Job:
    argv = [
        sys.executable, "-m", "trainfleet", "train", "-c", str(box.cluster_file),
        "--model", str(assets["model"]), "--data", str(assets["data"]), "--output", str(output),
        "--max-steps", str(JOB["max_steps"]), "--save-steps", str(JOB["save_steps"]),
        "--zero", str(JOB["zero"]), "--precision", JOB["precision"], "--seq-len",
        str(JOB["seq_len"]), "--micro-batch-size", str(JOB["micro_batch_size"]),
        "--learning-rate", str(JOB["learning_rate"]), "--seed", str(JOB["seed"]),
        "--hang-timeout", str(hang_timeout), "--no-export",
    ]  # fmt: skip
    return Job(argv, output.parent, {})


def _deepspeed(box, assets: dict, output: Path) -> Job:
    """The seeds' way: a hostfile, .deepspeed_env, pdsh with the right ssh options."""
    config = TrainConfig(model=str(assets["model"]), data=str(assets["data"]), output=str(output),
                         export=False, **JOB)  # fmt: skip
    cache = prepare_cache(config, output / ".cache", out=io.StringIO())
    spec = {"config": config.to_json(), "cache": str(cache)}
    encoded = base64.b64encode(json.dumps(spec).encode()).decode()
    cwd = output.parent
    (cwd / ".deepspeed_env").write_text("GLOO_SOCKET_IFNAME=eth0\nDS_ACCELERATOR=cpu\n")
    argv = [str(DEEPSPEED), "--no_ssh_check", "--hostfile", str(box.hostfile),
            "--master_addr", box.nodes[0].address, "--master_port", "29500",
            "--no_local_rank", "--module", "trainfleet.train.worker", encoded]  # fmt: skip
    env = {"DS_ACCELERATOR": "cpu", "PDSH_SSH_ARGS_APPEND": f"-F {box.ssh_config}"}
    return Job(argv, cwd, env)


def run_one(fault: str, runner: str, assets: dict, cap: float, hang_timeout: float) -> dict:
    name = f"fd{os.getpid() % 1000:03d}{list(FAULTS).index(fault)}{runner[0]}"
    root = Path(tempfile.mkdtemp(prefix="trainfleet-bench-"))
    output = root / "out"
    output.mkdir()
    if fault == "output-full":  # before the sandbox: its sshds copy the mount table at start
        mount = ["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(output)]
        subprocess.run(mount, check=True)
    box = sandbox.up(name=name, nodes=2, slots=1, login_shell=SHELL)
    undo = None
    try:
        job = (_trainfleet(box, assets, output, hang_timeout) if runner == "trainfleet"
               else _deepspeed(box, assets, output))  # fmt: skip
        marker = output / "checkpoint-8" / "TRAINFLEET_COMPLETE"
        deadline = time.monotonic() + 300
        while not marker.exists():
            if job.proc.poll() is not None or time.monotonic() > deadline:
                job.stop()
                raise SystemExit(f"{runner} never wrote checkpoint-8:\n{job.text()[-3000:]}")
            time.sleep(0.05)
        injected = time.time()
        inject = FAULTS[fault]
        undo = inject(box, job, output) if fault == "output-full" else inject(box, job)
        pattern = TRAINFLEET_REPORT if runner == "trainfleet" else DEEPSPEED_REPORT
        while job.exited_at is None and time.time() < injected + cap:
            time.sleep(0.1)
        while job_processes(box) and time.time() < injected + cap:
            time.sleep(0.5)
        clean_at = time.time()
        left = len(job_processes(box))
        reported = job.first(pattern, injected)
        collective = job.first(
            TRAINFLEET_COLLECTIVE if runner == "trainfleet" else DEEPSPEED_COLLECTIVE, injected
        )
        row = {
            "fault": fault,
            "runner": runner,
            "reported_s": _within(reported and reported[0], injected, cap),
            "reported_line": reported[1][:160] if reported else None,
            "collective_s": _within(collective and collective[0], injected, cap),
            "collective_line": collective[1][:240] if collective else None,
            "exited_s": _within(job.exited_at, injected, cap),
            "exit_code": job.proc.returncode,
            "clean_s": None if left else _within(clean_at, injected, cap + 1),
            "left_at_cap": left,
        }
        job.stop()
        return row
    finally:
        if undo:
            with contextlib.suppress(ProcessLookupError):  # a stopped rank the runner killed
                undo()
        sandbox.down(name)
        if fault == "output-full":
            subprocess.run(["umount", "-l", str(output)], check=False)


def _within(at: float | None, injected: float, cap: float) -> float | None:
    """Seconds from the fault to `at`, None when never or after the cap."""
    return round(at - injected, 1) if at and at < injected + cap else None


def _cell(seconds: float | None) -> str:
    return f"{seconds:.1f} s" if seconds is not None else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--faults", default=",".join(FAULTS), help="comma-separated: " + ", ".join(FAULTS)
    )
    parser.add_argument("--cap", type=float, default=120.0)
    parser.add_argument(
        "--hang-timeout", type=float, default=10.0, help="trainfleet's (train's default: 300 s)"
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    faults = args.faults.split(",")
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        parser.error(f"unknown fault(s) {', '.join(unknown)}; choose from {', '.join(FAULTS)}")
    root = Path(tempfile.mkdtemp(prefix="trainfleet-bench-assets-"))
    demo_assets.write_tokenizer(root / "model")
    demo_assets.write_model(root / "model", tokenizer_dir=root / "model", seed=0)
    data = demo_assets.write_dataset(root / "data.jsonl", n=400)
    assets = {"model": root / "model", "data": data}
    print(
        f"2 sandbox nodes on 2 shared cores; cap {args.cap:.0f} s; trainfleet --hang-timeout"
        f" {args.hang_timeout:g} s; seconds from the fault, - where not within the cap\n"
    )
    head = (f"{'fault':<12} {'runner':<10} {'reported':>9} {'collective':>10} {'exited':>9}"
            f" {'clean':>13}  line")  # fmt: skip
    print(head + "\n" + "-" * len(head), flush=True)
    rows = []
    for fault in faults:
        for runner in ("trainfleet", "deepspeed"):
            row = run_one(fault, runner, assets, args.cap, args.hang_timeout)
            rows.append(row)
            clean = (
                _cell(row["clean_s"]) if not row["left_at_cap"] else f"{row['left_at_cap']} left"
            )
            print(
                f"{fault:<12} {runner:<10} {_cell(row['reported_s']):>9}"
                f" {_cell(row['collective_s']):>10} {_cell(row['exited_s']):>9} {clean:>13}"
                f"  {row['reported_line'] or '-'}",
                flush=True,
            )
            if row["collective_line"]:
                print(f"{'':<24}collective: {row['collective_line']}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
