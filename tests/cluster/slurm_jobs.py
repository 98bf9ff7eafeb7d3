"""What the Slurm sandbox tests share: their marks, Slurm's clients run against a sandbox, the
queue once its jobs have completed, and an all_reduce launched inside a `salloc` allocation."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from trainfleet.errors import SandboxError
from trainfleet.sandbox.slurm import require_slurm, slurm_env


def _without_slurm() -> str:
    try:
        require_slurm()
    except SandboxError as exc:
        return str(exc)
    return ""


PYTESTMARK = [
    pytest.mark.cluster,
    pytest.mark.skipif(bool(_without_slurm()), reason=_without_slurm() or "Slurm is there"),
]


def run_slurm(box, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **slurm_env(box)},
    )


def queue_once_completed(box, within_s: float = 30) -> str:
    """squeue's jobs ("ID STATE NODES" lines) once none is COMPLETING. After salloc or a batch
    script returns, a job stays CG while the slurmds end what is left of it and run its epilog
    (seen here once, right after salloc returned); a job in any other state is returned at once."""
    deadline = time.monotonic() + within_s
    while True:
        out = run_slurm(box, "squeue", "-h", "-o", "%i %t %N").stdout
        states = {line.split()[1] for line in out.splitlines()}
        if states != {"CG"} or time.monotonic() > deadline:
            return out
        time.sleep(0.5)


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


def salloc_launch(box, tmp_path, *args: str, env: dict | None = None) -> tuple[int, str]:
    """`salloc -N2 trainfleet launch ARGS -- allreduce.py`: (exit code, stdout and stderr)."""
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    argv = ["salloc", "-N2", "--quiet", sys.executable, "-m", "trainfleet", "launch",
            "--run-dir", str(tmp_path / "run"), *args, "--", str(script)]  # fmt: skip
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=240, cwd=tmp_path,
        env={**os.environ, **slurm_env(box), **(env or {})},
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr
