"""The sandbox's real Slurm (`sandbox up --slurm`): munge, slurmctld and a slurmd per node,
driven here through Slurm's own clients (srun, sbatch, squeue) as a user drives them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainfleet import sandbox
from trainfleet.errors import SandboxError
from trainfleet.sandbox.slurm import files_of, require_slurm, slurm_env


def _without_slurm() -> str:
    try:
        require_slurm()
    except SandboxError as exc:
        return str(exc)
    return ""


pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(bool(_without_slurm()), reason=_without_slurm() or "Slurm is there"),
]


def _slurm(box, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **slurm_env(box)},
    )


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
    done = _slurm(box, "srun", "-N3", "--ntasks-per-node=1", "sh", "-c",
                  'echo "$(hostname) $SLURM_PROCID $SLURM_NODEID $SLURM_JOB_NODELIST"')  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = sorted(done.stdout.split("\n")[:-1])
    assert lines == [f"gpu-node-{k} {k - 1} {k - 1} gpu-node-[1-3]" for k in (1, 2, 3)], lines
    # Each task sees its node's own /etc/hosts and network namespace.
    done = _slurm(box, "srun", "-w", "gpu-node-2", "sh", "-c",
                  "getent hosts gpu-node-3; ip -4 -o addr show dev eth0")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert box.node(3).address in done.stdout and box.node(2).address in done.stdout


def test_a_batch_job_runs_and_the_queue_empties_and_down_leaves_nothing(make_sandbox, tmp_path):
    box = make_sandbox(nodes=2, slurm=True)
    out = tmp_path / "job.out"
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nsrun hostname\n")
    done = _slurm(box, "sbatch", "-N2", "--parsable", f"--output={out}", str(script))
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 60
    while _slurm(box, "squeue", "-h", "-j", job).stdout.strip() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _slurm(box, "squeue", "-h").stdout == ""
    assert sorted(out.read_text().split()) == ["gpu-node-1", "gpu-node-2"]
    assert files_of(box.state_dir).munge_key.stat().st_mode & 0o777 == 0o400
    assert _daemons_of(box), "munged, slurmctld and the slurmds run while it is up"

    sandbox.down(box.name)
    assert _daemons_of(box) == [] and not box.state_dir.exists()


ALLREDUCE = """\
import os, socket, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print("rank", dist.get_rank(), "of", dist.get_world_size(), "on", socket.gethostname(),
      "sum", int(t.item()), "job", os.environ.get("SLURM_JOB_ID"), flush=True)
if os.environ.get("PLANT_CRASH") == str(dist.get_rank()):
    raise SystemExit("planted crash on rank %d" % dist.get_rank())
"""


def _salloc_launch(box, tmp_path, *args: str, env: dict | None = None):
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    argv = ["salloc", "-N2", "--quiet", sys.executable, "-m", "trainfleet", "launch",
            "--run-dir", str(tmp_path / "run"), *args, "--", str(script)]  # fmt: skip
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=240, cwd=tmp_path,
        env={**os.environ, **slurm_env(box), **(env or {})},
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def test_launch_inside_an_allocation_reaches_the_nodes_through_srun_with_sshd_stopped(
    make_sandbox, tmp_path
):
    box = make_sandbox(nodes=2, slurm=True)
    for node in box.nodes:  # Slurm clusters block ssh to compute nodes: none is used
        os.kill(box.sshd_pid(node.index), signal.SIGKILL)
    code, out = _salloc_launch(box, tmp_path)
    assert code == 0, out
    for rank, host in ((0, "gpu-node-1"), (1, "gpu-node-2")):
        assert f"[{host}:{rank}] rank {rank} of 2 on {host} sum 2 job " in out, out
    assert _slurm(box, "squeue", "-h").stdout == ""


def test_a_crashing_rank_in_an_allocation_is_named_and_the_job_ends(make_sandbox, tmp_path):
    box = make_sandbox(nodes=2, slurm=True)
    code, out = _salloc_launch(box, tmp_path, env={"PLANT_CRASH": "1"})
    assert code != 0, out
    assert "root cause: gpu-node-2 rank 1" in out and "planted crash on rank 1" in out, out
    assert _slurm(box, "squeue", "-h").stdout == ""


def test_doctor_and_a_batch_script_use_the_allocation_too(make_sandbox, tmp_path):
    """Full doctor (probe, stack phase, gloo all_reduce) inside `salloc`; `trainfleet launch`
    as the whole of an sbatch script, which Slurm runs on the job's first node."""
    box = make_sandbox(nodes=2, slurm=True)
    done = _slurm(box, "salloc", "-N2", "--quiet", sys.executable, "-m", "trainfleet",
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
    done = _slurm(box, "sbatch", "-N2", "--parsable", "--wait", f"--output={out}", str(job),
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
    assert _slurm(box, "squeue", "-h").stdout == ""
