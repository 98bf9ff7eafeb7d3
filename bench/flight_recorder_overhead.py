"""What the Flight Recorder trainfleet turns on (TORCH_FR_BUFFER_SIZE=2000) costs per collective.

    .venv/bin/python bench/flight_recorder_overhead.py [--ranks 2] [--ops 3000] [--repeats 3]

Runs the same torchrun job twice per repeat, alternating: --ranks local gloo ranks doing --ops
all_reduces of 1 KiB (small, so that the per-call cost shows rather than the bytes) and a
barrier, with TORCH_FR_BUFFER_SIZE=0 (off) and =2000 (what trainfleet sets). Prints rank 0's
microseconds per all_reduce for each, and the ratio on over off. On a GPU job the collectives
are NCCL's and take far longer than here, so this is the ceiling of the relative cost.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

JOB = """
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(256)
for _ in range(50):
    dist.all_reduce(t)
dist.barrier()
started = time.perf_counter()
for _ in range({ops}):
    dist.all_reduce(t)
dist.barrier()
took = time.perf_counter() - started
if dist.get_rank() == 0:
    print("us_per_op %.3f" % (took / {ops} * 1e6), flush=True)
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(script: Path, ranks: int, buffer: str) -> float:
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": buffer, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}",
            f"--master-port={_free_port()}", str(script)]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=True)
    return float(re.search(r"us_per_op ([\d.]+)", done.stdout).group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--ops", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    script = Path(tempfile.mkdtemp(prefix="trainfleet-bench-")) / "job.py"
    script.write_text(JOB.format(ops=args.ops))
    off, on = [], []
    for _ in range(args.repeats):
        off.append(run(script, args.ranks, "0"))
        on.append(run(script, args.ranks, "2000"))
    print(f"{args.ranks} local gloo ranks, {args.ops} all_reduce of 1 KiB, {args.repeats} repeats")
    print(f"Flight Recorder off : {median(off):8.1f} us per all_reduce  {off}")
    print(f"Flight Recorder 2000: {median(on):8.1f} us per all_reduce  {on}")
    print(f"on / off: {median(on) / median(off):.3f}")


if __name__ == "__main__":
    main()
