"""How close gloo gets to the link: all_reduce busbw at large sizes against raw TCP between the
same two nodes, measured in the same commtest run.

    sudo .venv/bin/python bench/commtest_vs_tcp.py [--nodes 2] [--sizes 16M,256M] [--iters 5]

A sandbox of --nodes nodes (one slot each); one `trainfleet commtest` run with all_reduce and
sendrecv at the large sizes; raw TCP is the mean over the directed node pairs of the
commtest's own stream test (the same interfaces, the same run). Prints busbw, raw TCP and
their ratio. All nodes share this machine's 2 cores, so the ratio is this machine's, not a
property of gloo.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from trainfleet import sandbox


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--sizes", default="16M,256M", help="min,max (factor 4)")
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    low, high = args.sizes.split(",")
    box = sandbox.up(name="bct", nodes=args.nodes)
    cwd = Path(tempfile.mkdtemp(prefix="trainfleet-bench-"))
    try:
        argv = [sys.executable, "-m", "trainfleet", "commtest", "-c", str(box.cluster_file)]
        argv += ["--ops", "all_reduce,sendrecv", "--min-bytes", low, "--max-bytes", high]
        argv += ["--factor", "4", "--iters", str(args.iters), "--warmup", "2", "--json"]
        argv += ["--pair-bytes", "64M"]
        done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, check=False)
        if done.returncode == 2:
            raise SystemExit(done.stderr[-3000:])
        report = json.loads(done.stdout)
    finally:
        sandbox.down("bct")
    tcp = statistics.mean(report["pairs"]["tcp"].values())
    pair = statistics.mean(report["pairs"]["sendrecv"].values())
    print(f"{args.nodes} nodes, 1 rank each, gloo on cpu; 2 shared cores\n")
    print(
        f"raw TCP between the nodes (mean of {len(report['pairs']['tcp'])} directions): "
        f"{tcp / 1e9:.3f} GB/s"
    )
    print(
        f"gloo send/recv between the nodes' first ranks (64 MiB): {pair / 1e9:.3f} GB/s "
        f"= {pair / tcp:.2f} x raw TCP\n"
    )
    print(f"{'op':<12} {'size':>12} {'busbw GB/s':>11} {'/ raw TCP':>10}")
    for row in report["results"]:
        print(
            f"{row['op']:<12} {row['bytes']:>12} {row['busbw'] / 1e9:>11.3f} "
            f"{row['busbw'] / tcp:>9.2f}x"
        )
    print(f"\nverdict: {report['verdict']}")


if __name__ == "__main__":
    main()
