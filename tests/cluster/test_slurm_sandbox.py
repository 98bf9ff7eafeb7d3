"""The sandbox's real Slurm (`sandbox up --slurm`): munge, slurmctld and a slurmd per node,
driven here through Slurm's own clients (srun, sbatch, squeue) as a user drives them."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import slurm_jobs
from slurm_jobs import ALLREDUCE, queue_once_completed, run_slurm, salloc_launch

from trainfleet import sandbox
from trainfleet.sandbox.slurm import files_of, slurm_env

pytestmark = slurm_jobs.PYTESTMARK


def _daemons_of(box) -> list[str]:
    """Live (not zombie) munged/slurmctld/slurmd processes started for this sandbox."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and str(box.state_dir) in cmdline:
            found.append(f"{proc.name}: {cmdline}")
    return found


def test_srun_runs_one_task_per_node_with_its_hostname_and_ids(make_sandbox):
    box = make_sandbox(nodes=3, slurm=True)
    said = 'echo "$(hostname) $SLURM_PROCID $SLURM_NODEID $SLURM_JOB_NODELIST"'
    done = run_slurm(box, "srun", "-N3", "--ntasks-per-node=1", "sh", "-c", said)
    assert done.returncode == 0, done.stderr
    lines = sorted(done.stdout.split("\n")[:-1])
    assert lines == [f"gpu-node-{k} {k - 1} {k - 1} gpu-node-[1-3]" for k in (1, 2, 3)], lines
    # Each task sees its node's own /etc/hosts and network namespace.
    done = run_slurm(box, "srun", "-w", "gpu-node-2", "sh", "-c",
                     "getent hosts gpu-node-3; ip -4 -o addr show dev eth0")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert box.node(3).address in done.stdout and box.node(2).address in done.stdout


def test_a_batch_job_runs_and_the_queue_empties_and_down_leaves_nothing(make_sandbox, tmp_path):
    box = make_sandbox(nodes=2, slurm=True)
    out = tmp_path / "job.out"
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nsrun hostname\n")
    done = run_slurm(box, "sbatch", "-N2", "--parsable", f"--output={out}", str(script))
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 60
    while run_slurm(box, "squeue", "-h", "-j", job).stdout.strip() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert queue_once_completed(box) == ""
    assert sorted(out.read_text().split()) == ["gpu-node-1", "gpu-node-2"]
    assert files_of(box.state_dir).munge_key.stat().st_mode & 0o777 == 0o400
    assert _daemons_of(box), "munged, slurmctld and the slurmds run while it is up"

    sandbox.down(box.name)
    assert _daemons_of(box) == [] and not box.state_dir.exists()


def test_inside_an_allocation_the_slurm_backend_needs_no_ssh_and_deepspeed_s_runner_is_refused(
    make_sandbox, tmp_path
):
    """The nodes' sshd stopped, as Slurm clusters block ssh: the Slurm backend (the default)
    needs none, and DeepSpeed's runner is refused before anything starts. (Where ssh gets
    through, the runner works: test_slurm_deepspeed.py.)"""
    box = make_sandbox(nodes=2, slurm=True)
    for node in box.nodes:  # Slurm clusters block ssh to compute nodes: none is used
        os.kill(box.sshd_pid(node.index), signal.SIGKILL)
    code, out = salloc_launch(box, tmp_path)
    assert code == 0, out
    for rank, host in ((0, "gpu-node-1"), (1, "gpu-node-2")):
        assert f"[{host}:{rank}] rank {rank} of 2 on {host} sum 2 job " in out, out
    assert queue_once_completed(box) == ""

    # DeepSpeed's runner needs ssh (pdsh): refused before anything starts, saying which node
    # and which backend needs none.
    code, out = salloc_launch(box, tmp_path, "--backend", "deepspeed")
    assert code == 1, out
    assert (
        "--backend deepspeed starts ranks with pdsh over ssh, and ssh to gpu-node-1 fails"
        " inside this Slurm job"
        in out
        and "use --backend slurm" in out
    ), out
    assert "sum 2" not in out, out
    assert queue_once_completed(box) == ""


def test_a_crashing_rank_in_an_allocation_is_named_and_the_job_ends(make_sandbox, tmp_path):
    box = make_sandbox(nodes=2, slurm=True)
    code, out = salloc_launch(box, tmp_path, env={"PLANT_CRASH": "1"})
    assert code != 0, out
    assert "root cause: gpu-node-2 rank 1" in out and "planted crash on rank 1" in out, out
    assert queue_once_completed(box) == ""


def test_doctor_and_a_batch_script_use_the_allocation_too(make_sandbox, tmp_path):
    """Full doctor (probe, stack phase, gloo all_reduce) inside `salloc`; `trainfleet launch`
    as the whole of an sbatch script, which Slurm runs on the job's first node."""
    box = make_sandbox(nodes=2, slurm=True)
    done = run_slurm(box, "salloc", "-N2", "--quiet", sys.executable, "-m", "trainfleet",
                     "doctor", "--json", timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert sorted(report["nodes"]) == ["gpu-node-1", "gpu-node-2"], report
    assert report["findings"] == [], report["findings"]

    (tmp_path / "allreduce.py").write_text(ALLREDUCE)
    job = tmp_path / "job.sh"
    job.write_text(f"#!/bin/sh\ncd {tmp_path} && exec {sys.executable} -m trainfleet launch"
                   " --run-dir run -- allreduce.py\n")  # fmt: skip
    out = tmp_path / "job.out"
    done = run_slurm(box, "sbatch", "-N2", "--parsable", "--wait", f"--output={out}", str(job),
                     timeout=180)  # fmt: skip
    assert done.returncode == 0, out.read_text()
    assert "rank 1 of 2 on gpu-node-2 sum 2" in out.read_text()


def test_a_hung_rank_in_an_allocation_is_found_with_every_stack(make_sandbox, tmp_path):
    """Rank 1 stops itself (SIGSTOP) at step 20; the hang watchdog dumps both ranks' stacks
    through srun steps (py-spy on each node) and stops the run; nothing stays queued."""
    box = make_sandbox(nodes=2, slurm=True)
    script = Path(__file__).parent / "scripts" / "hang_rank.py"
    run_dir = tmp_path / "run"
    argv = ["salloc", "-N2", "--quiet", sys.executable, "-m", "trainfleet", "launch",
            "--run-dir", str(run_dir), "--hang-timeout", "3", "--", str(script)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=tmp_path,
                          env={**os.environ, **slurm_env(box)})  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "rank-hung: no rank advanced past step 19" in out, out
    stacks = sorted(p.name for p in (run_dir / "stacks").iterdir())
    assert stacks == ["gpu-node-1.rank0.txt", "gpu-node-2.rank1.txt"], out
    assert queue_once_completed(box) == ""


def _from_login_node(box, tmp_path, *args: str, env: dict | None = None, command="launch"):
    """`trainfleet COMMAND --backend slurm --nodes 2 ARGS` on this machine, which plays the
    login node: no allocation, Slurm's clients pointed at the sandbox's slurmctld."""
    argv = [sys.executable, "-m", "trainfleet", command, "--backend", "slurm", "--nodes", "2",
            *args]  # fmt: skip
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        env={**os.environ, **slurm_env(box), **(env or {})},
    )  # fmt: skip


def _rest_of(box, follower: subprocess.Popen, *, timeout: float) -> str:
    """The follower's output to its end. One still running after `timeout` is killed, and the
    test fails with what it printed and what slurmctld says of the jobs (a hang shows where)."""
    try:
        return follower.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        try:
            status = Path(f"/proc/{follower.pid}/status").read_text().splitlines()
        except OSError:  # it ended just now
            status = []
        state = [line for line in status if line.startswith(("State", "Sig"))]
        py_spy = Path(sys.executable).parent / "py-spy"
        stack = subprocess.run([str(py_spy), "dump", "--pid", str(follower.pid)],
                               capture_output=True, text=True, timeout=60).stdout  # fmt: skip
        follower.kill()
        out = follower.communicate()[0]
        jobs = run_slurm(box, "scontrol", "show", "job", "-o").stdout
        pytest.fail(f"the follower did not end within {timeout:g} s:\n{out}\njobs:\n{jobs}\n"
                    f"its /proc status: {state}\nits stack:\n{stack}")  # fmt: skip


def _left_of(script: Path) -> list[str]:
    """Processes still running `script`, on this machine or on a sandbox node (they share
    this machine's process table)."""
    from trainfleet.localprocs import cmdlines

    return [f"{pid}: {c}" for pid, c in cmdlines().items() if str(script) in c]


def test_launch_from_a_login_node_submits_a_job_streams_its_ranks_and_ends_with_it(
    make_sandbox, tmp_path
):
    """`--backend slurm` outside a job: sbatch, the ranks' lines here as they come, the job's
    exit code; a crashing rank named as under salloc. The nodes' sshd is stopped."""
    box = make_sandbox(nodes=2, slurm=True)
    for node in box.nodes:
        os.kill(box.sshd_pid(node.index), signal.SIGKILL)
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    follower = _from_login_node(box, tmp_path, "--run-dir", "ok", "--", str(script))
    out = _rest_of(box, follower, timeout=240)
    assert follower.returncode == 0, out
    job = re.search(r"submitted batch job (\d+)", out)
    assert job, out
    for rank, host in ((0, "gpu-node-1"), (1, "gpu-node-2")):
        assert f"[{host}:{rank}] rank {rank} of 2 on {host} sum 2 job {job[1]}" in out, out
    assert f"job {job[1]}: RUNNING on gpu-node-[1-2]" in out
    assert f"job {job[1]}: COMPLETED" in out
    script_text = (tmp_path / "ok" / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script_text and f"{script}\n" in script_text
    assert (tmp_path / "ok" / "logs" / "gpu-node-2.rank1.log").exists()  # the run's own logs

    follower = _from_login_node(box, tmp_path, "--run-dir", "crash", "--", str(script),
                                env={"PLANT_CRASH": "1"})  # fmt: skip
    out = _rest_of(box, follower, timeout=240)
    assert follower.returncode == 1, out
    assert "root cause: gpu-node-2 rank 1" in out and "planted crash on rank 1" in out, out
    assert re.search(r"job \d+: FAILED", out), out
    assert queue_once_completed(box) == ""
    assert _left_of(script) == []


SLEEPER = """\
import time, torch.distributed as dist
dist.init_process_group("gloo")
print("rank", dist.get_rank(), "sleeping", flush=True)
time.sleep(600)
"""


def test_ctrl_c_on_the_login_node_stops_every_rank_and_the_job(make_sandbox, tmp_path):
    box = make_sandbox(nodes=2, slurm=True)
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    follower = _from_login_node(box, tmp_path, "--", str(script))
    seen = []
    assert follower.stdout is not None
    for line in follower.stdout:
        seen.append(line)
        if sum("sleeping" in s for s in seen) == 2:
            break
    follower.send_signal(signal.SIGINT)
    out = _rest_of(box, follower, timeout=150)
    out = "".join(seen) + out
    assert follower.returncode == 130, out
    assert "Ctrl-C: stopping job" in out and "every rank on every node stopped" in out, out
    assert queue_once_completed(box) == ""
    assert _left_of(script) == []


@pytest.mark.usefixtures("no_train_job_left_behind")
@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("deepspeed", "transformers", "datasets")),
    reason="needs deepspeed, transformers and datasets (`make venv` installs them)",
)
def test_train_with_zero3_is_submitted_from_a_login_node(make_sandbox, tmp_path, assets):
    box = make_sandbox(nodes=2, slurm=True)
    output = tmp_path / "out"
    follower = _from_login_node(
        box, tmp_path, "--model", str(assets["model"]), "--data", str(assets["data"]),
        "--output", str(output), "--zero", "3", "--max-steps", "2", "--precision", "fp32",
        command="train",
    )  # fmt: skip
    out = _rest_of(box, follower, timeout=420)
    assert follower.returncode == 0, out
    assert "plan: 2 ranks, ZeRO-3" in out and "all 2 rank(s) on 2 node(s) finished" in out, out
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    steps = [row["step"] for row in rows if "loss" in row]
    assert steps[-1] == 2, steps
    assert (output / "final" / "config.json").exists()
    assert list((output / "slurm").glob("*/job.sbatch")), "the script stays beside the output"
    assert queue_once_completed(box) == ""


def _job_of(follower, seen: list[str], *, until: str, count: int = 1) -> str:
    """Reads the follower's lines into `seen` until `until` has appeared `count` times; the
    job id it submitted."""
    assert follower.stdout is not None
    for line in follower.stdout:
        seen.append(line)
        if sum(until in s for s in seen) >= count:
            break
    found = re.search(r"submitted batch job (\d+)", "".join(seen))
    assert found, "".join(seen)
    return found[1]


@contextlib.contextmanager
def _requeued_jobs_start_at_once(box):
    """Slurm holds a requeued job 120 s before it may start again (Reason=BeginTime); while
    this runs, such a job's start time is moved to 5 s from now, as `scontrol update` lets
    its user (at once, the new start could meet the last one's ends still on the nodes)."""
    stop = threading.Event()
    moved = set()

    def release() -> None:
        while not stop.wait(0.5):
            for line in run_slurm(box, "scontrol", "show", "job", "-o").stdout.splitlines():
                held = re.search(r"JobId=(\d+) .*Reason=BeginTime .*Restarts=(\d+)", line)
                start = held.groups() if held else None
                if start and start not in moved:  # once: now+5 moves on
                    moved.add(start)
                    run_slurm(box, "scontrol", "update", f"JobId={start[0]}", "StartTime=now+5")

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def test_a_requeue_job_checkpoints_on_the_time_limit_signal_and_resumes_after_a_preemption(
    make_sandbox, tmp_path
):
    """`--requeue`: Slurm's signal before the time limit (`--signal=B:USR1`, sent here with
    `scancel --batch --signal=USR1`, as Slurm sends it) reaches every rank through trainfleet,
    the ranks save and exit, trainfleet requeues the job, and its next start resumes with
    TRAINFLEET_RESTART=1. Then a preemption (`scontrol requeue`: SIGTERM, no warning): the
    next start resumes from the script's last own checkpoint."""
    box = make_sandbox(nodes=2, slurm=True)
    script = Path(__file__).parent / "scripts" / "requeue_job.py"
    stack = contextlib.ExitStack()
    stack.enter_context(_requeued_jobs_start_at_once(box))
    follower = _from_login_node(box, tmp_path, "--requeue", "--run-dir", "rq", "--",
                                str(script), env={"CKPT": str(tmp_path / "ckpt")})  # fmt: skip
    seen: list[str] = []
    job = _job_of(follower, seen, until=" running\n", count=2)
    signalled = run_slurm(box, "scancel", "--batch", "--signal=USR1", job)
    assert signalled.returncode == 0, signalled.stderr
    _job_of(follower, seen, until="(restart 1)", count=2)
    saved = re.search(r"rank 0 saved step (\d+) on SIGUSR1", "".join(seen))
    assert saved, "".join(seen)
    resumed_at = int(saved[1])
    time.sleep(2)  # the second start runs on: preempt it
    preempted = run_slurm(box, "scontrol", "requeue", job)
    assert preempted.returncode == 0, preempted.stderr
    out = _rest_of(box, follower, timeout=300)
    stack.close()
    out = "".join(seen) + out
    assert follower.returncode == 0, out
    assert f"job {job}: PENDING (BeginTime: may start at " in out, out
    assert "got SIGUSR1: passed on to the ranks on gpu-node-1, gpu-node-2" in out, out
    assert f"requeuing Slurm job {job}" in out, out
    assert f"rank 1 resumed at step {resumed_at} (restart 1)" in out, out
    again = re.search(r"rank 1 resumed at step (\d+) \(restart 2\)", out)
    assert again and int(again[1]) >= resumed_at, out
    assert f"job {job}: Slurm requeued it: start 3 follows" in out, out
    assert re.search(rf"job {job}: COMPLETED", out), out
    log = [
        json.loads(line)
        for line in (tmp_path / "rq" / "restarts.jsonl").read_text().split("\n")
        if line
    ]
    assert [(e["attempt"], e["cause"]) for e in log] == [
        (1, f"Slurm started job {job} again"), (2, f"Slurm started job {job} again")
    ]  # fmt: skip
    assert (tmp_path / "rq.requeue-2" / "logs" / "gpu-node-2.rank1.log").exists()
    assert queue_once_completed(box) == ""
    assert _left_of(script) == []


@pytest.mark.usefixtures("no_train_job_left_behind")
@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("deepspeed", "transformers", "datasets")),
    reason="needs deepspeed, transformers and datasets (`make venv` installs them)",
)
def test_train_under_requeue_saves_on_the_time_limit_signal_and_resumes_from_it(
    make_sandbox, tmp_path, assets
):
    """No periodic checkpoint (--save-steps 100): the one the requeued job resumes from is the
    one the ranks saved on SIGUSR1, all after the same step."""
    box = make_sandbox(nodes=2, slurm=True)
    output = tmp_path / "out"
    stack = contextlib.ExitStack()
    stack.enter_context(_requeued_jobs_start_at_once(box))
    follower = _from_login_node(
        box, tmp_path, "--requeue", "--model", str(assets["model"]), "--data",
        str(assets["data"]), "--output", str(output), "--zero", "3", "--max-steps", "12",
        "--save-steps", "100", "--precision", "fp32", "--no-export", command="train",
    )  # fmt: skip
    seen: list[str] = []
    job = _job_of(follower, seen, until="step 2/12")
    signalled = run_slurm(box, "scancel", "--batch", "--signal=USR1", job)
    assert signalled.returncode == 0, signalled.stderr
    out = _rest_of(box, follower, timeout=420)
    stack.close()
    out = "".join(seen) + out
    assert follower.returncode == 0, out
    stopped = re.search(r"stopped after step (\d+) of 12 on SIGUSR1: checkpoint saved", out)
    assert stopped, out
    assert f"requeuing Slurm job {job}" in out and f"resuming from checkpoint-{stopped[1]}" in out
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    steps = [row["step"] for row in rows if "loss" in row]
    assert steps == list(range(1, 13)), steps  # each step once: none lost, none repeated
    assert queue_once_completed(box) == ""


def test_doctor_names_slurm_s_own_failures_inside_a_job(make_sandbox, tmp_path):
    """In one 2-node allocation: SLURM_EXPORT_ENV=NONE is a warning and trainfleet's own steps
    still work (they ask for --export=ALL); trainfleet started by `srun` as two tasks is an
    error (each would start the whole launch); a node whose slurmd stops answering is named as
    Slurm's, with `--exclude` in its fix."""
    box = make_sandbox(nodes=2, slurm=True)
    tf = [sys.executable, "-m", "trainfleet"]
    done = run_slurm(box, "salloc", "-N2", "--quiet", "env", "SLURM_EXPORT_ENV=NONE", *tf,
                     "doctor", "--quick", "--json", timeout=180)  # fmt: skip
    report = json.loads(done.stdout)
    assert [(f["id"], f["severity"]) for f in report["findings"]] == [
        ("slurm-export-none", "warning")
    ], report["findings"]
    assert done.returncode == 0, done.stderr

    done = run_slurm(box, "salloc", "-N2", "--quiet", "srun", "--ntasks-per-node=1", *tf,
                     "doctor", "--quick", timeout=180)  # fmt: skip
    assert done.returncode != 0, done.stdout
    assert done.stdout.count("ERROR   slurm-task-layout") == 2, done.stdout
    assert "task 1 of the 2 of step" in done.stdout

    slurmd = int((files_of(box.state_dir).root / "run" / "slurmd.gpu-node-2.pid").read_text())
    stopped = f"kill -STOP {slurmd}; {shlex.join(tf)} doctor --quick --json; kill -CONT {slurmd}"
    done = run_slurm(box, "salloc", "-N2", "--quiet", "sh", "-c", stopped, timeout=240)
    report = json.loads(done.stdout)
    unreachable = [f for f in report["findings"] if f["id"] == "slurm-node-unreachable"]
    assert len(unreachable) == 1 and unreachable[0]["nodes"] == ["gpu-node-2"], report
    assert "--sbatch-arg=--exclude=gpu-node-2" in unreachable[0]["fix"]
    assert not [f for f in report["findings"] if f["id"].startswith("ssh")], report


def test_commtest_measures_the_job_s_nodes_through_srun(make_sandbox):
    box = make_sandbox(nodes=2, slurm=True)
    for node in box.nodes:
        os.kill(box.sshd_pid(node.index), signal.SIGKILL)
    done = run_slurm(box, "salloc", "-N2", "--quiet", sys.executable, "-m", "trainfleet",
                     "commtest", "--ops", "all_reduce", "--max-bytes", "1M", "--time-budget", "5",
                     "--json", timeout=180)  # fmt: skip
    report = json.loads(done.stdout)  # its verdict on 1 MiB against the link is not asked
    assert report["world_size"] == 2 and report["complete"], report
    assert {r["op"] for r in report["results"]} == {"all_reduce"}, report["results"]
    assert all(r["wrong"] == 0 for r in report["results"]), report["results"]
    assert sorted(report["links"]) == [
        "raw TCP gpu-node-1 -> gpu-node-2", "raw TCP gpu-node-2 -> gpu-node-1"
    ]  # fmt: skip
