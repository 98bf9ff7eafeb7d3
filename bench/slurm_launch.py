"""trainfleet's Slurm backend against the plain `srun` line users write, on the sandbox's real
Slurm: the wall from the command to every rank's first line, and to its end.

    sudo .venv/bin/python bench/slurm_launch.py [--nodes 2] [--repeat 3]

One sandbox with Slurm (`sandbox up --slurm`); from this machine, which plays the login node,
each of these runs the same script (a rank prints its first line, joins a gloo group, does 20
all_reduces 0.1 s apart, prints its last line), interleaved, --repeat times each:

- baseline: `srun -N N --ntasks-per-node=1 bash -c 'RANK=$SLURM_PROCID ... python job.py'`,
  MASTER_ADDR the first node of SLURM_JOB_NODELIST, as the guides write it;
- srun torchrun: `srun -N N --ntasks-per-node=1 torchrun --nnodes N --nproc-per-node 1
  --rdzv-backend c10d --rdzv-endpoint FIRST:29400 job.py`, the same script under torchrun's
  agent, as guides write it for torchrun: the part of the rest that is torchrun's;
- salloc: `salloc -N N trainfleet launch -- job.py` (its preflight, bootstrap, torchrun, merged
  output, watchdogs), ranks started as steps of the job;
- sbatch: `trainfleet launch --backend slurm --nodes N -- job.py` from the login node: sbatch,
  then the job followed (`scontrol show job` and the output file, each read once a second).

Medians; ratios against the baseline. The goal (#36): at most 1.2x the baseline's wall.
--steps sets the script's length (20 all_reduces 0.1 s apart by default; 300 is a 30 s job).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainfleet import sandbox
from trainfleet.sandbox.slurm import slurm_env

GOAL = 1.2
JOB = """\
import os, socket, time, torch, torch.distributed as dist
print("rank", os.environ["RANK"], "first line on", socket.gethostname(), flush=True)
dist.init_process_group("gloo")
t = torch.ones(1)
for _ in range(int(os.environ.get("STEPS", "20"))):
    dist.all_reduce(t)
    time.sleep(0.1)
print("rank", dist.get_rank(), "last line", flush=True)
"""
BASELINE = (
    'export MASTER_ADDR=$(echo "$SLURM_JOB_NODELIST" | sed "s/\\[\\([0-9]*\\).*/\\1/")'
    " MASTER_PORT=29400 WORLD_SIZE=$SLURM_NTASKS RANK=$SLURM_PROCID LOCAL_RANK=0;"
    " exec {python} job.py"
)
"""What guides put in the srun line; the sed takes `gpu-node-[1-2]`'s first name (the sandbox's
nodes are one range)."""
TORCHRUN = (
    "exec {python} -m torch.distributed.run --nnodes=$SLURM_NNODES --nproc-per-node=1"
    ' --rdzv-backend=c10d --rdzv-endpoint=$(echo "$SLURM_JOB_NODELIST" |'
    ' sed "s/\\[\\([0-9]*\\).*/\\1/"):29400 job.py'
)


def _timed(argv: list[str], cwd: Path, env: dict[str, str], nodes: int) -> dict[str, float]:
    """Seconds from start to the last rank's first line, and to the command's end."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    first: dict[str, float] = {}
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        found = re.search(r"rank (\d+) first line", line)
        if found:
            first.setdefault(found[1], time.monotonic() - start)
    code = proc.wait()
    end = time.monotonic() - start
    if code != 0 or len(first) != nodes:
        raise SystemExit(f"{argv[:6]} failed ({code}):\n{''.join(lines)[-3000:]}")
    return {"first": max(first.values()), "end": end}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="all_reduces, 0.1 s apart")
    args = parser.parse_args()
    box = sandbox.up(name="bslurm", nodes=args.nodes, slurm=True)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cwd = Path(tmp)
            (cwd / "job.py").write_text(JOB)
            env = {**os.environ, **slurm_env(box), "STEPS": str(args.steps)}
            n = str(args.nodes)
            tf = [sys.executable, "-m", "trainfleet", "launch"]
            runs = {
                "baseline": ["srun", "-N", n, "--ntasks-per-node=1", "bash", "-c",
                             BASELINE.format(python=sys.executable)],
                "srun torchrun": ["srun", "-N", n, "--ntasks-per-node=1", "bash", "-c",
                                  TORCHRUN.format(python=sys.executable)],
                "salloc": ["salloc", "-N", n, "--quiet", *tf, "--", "job.py"],
                "sbatch": [*tf, "--backend", "slurm", "--nodes", n, "--", "job.py"],
            }  # fmt: skip
            _timed(runs["salloc"], cwd, env, args.nodes)  # warm: imports, page cache
            took: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
            for _ in range(args.repeat):
                for name, argv in runs.items():
                    took[name].append(_timed(argv, cwd, env, args.nodes))
    finally:
        sandbox.down(box.name)
    base = {k: statistics.median(t[k] for t in took["baseline"]) for k in ("first", "end")}
    print(f"{args.nodes} nodes, {args.steps} steps, median of {args.repeat}; seconds (ratio to"
          " the baseline)")  # fmt: skip
    print(f"{'':14} {'every first line':>22} {'end':>18}")
    for name, times in took.items():
        row = {k: statistics.median(t[k] for t in times) for k in ("first", "end")}
        print(f"{name:14} {row['first']:>14.2f} ({row['first'] / base['first']:.2f}x)"
              f" {row['end']:>10.2f} ({row['end'] / base['end']:.2f}x)")  # fmt: skip
    print(f"goal: at most {GOAL}x the baseline's wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
