"""Wall time of `trainfleet doctor` (full and --quick) on 2, 4, 8, 16 and 32 sandbox nodes.

    sudo .venv/bin/python bench/doctor_scale.py [--sizes 2,4,8,16,32] [--repeat 3]

Each size: a fresh sandbox, one warm-up run (opens the shared ssh connections, fills the
probe's import cache), then the median of --repeat runs of the CLI as a user types it, with
the phases doctor reports: the probe (facts and every pairwise test) and the gloo all_reduce
(one process per node: N imports of torch, ~1.3 s of CPU each, on this machine's 2 shared
cores). Run twice: with root's own login shell (bash, whose ~/.bashrc here costs 0.12 s of CPU
per ssh session) and with /bin/sh on the nodes. Prints the table and the growth per doubling.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainfleet import sandbox

TARGETS = {8: 5.0, 32: 15.0}
"""The issue's targets for the full doctor, in seconds."""


WORKDIR = Path(tempfile.mkdtemp(prefix="trainfleet-bench-"))
"""A stable working directory for the probes (the code hash of a tree being edited differs)."""
(WORKDIR / "train.py").write_text("print('hello')\n")


def _doctor(cluster_file: Path, quick: bool) -> dict[str, float]:
    """Wall time of one CLI run, and the phases doctor reports (probe, collective)."""
    argv = [sys.executable, "-m", "trainfleet", "doctor", "-c", str(cluster_file), "--json"]
    start = time.perf_counter()
    proc = subprocess.run(
        [*argv, *(["--quick"] if quick else [])], capture_output=True, text=True, cwd=WORKDIR
    )
    elapsed = time.perf_counter() - start
    report = json.loads(proc.stdout)
    if proc.returncode != 0:
        ids = sorted({f["id"] for f in report["findings"] if f["severity"] == "error"})
        raise BenchFailure(f"{elapsed:.0f} s, errors on a clean sandbox: {', '.join(ids)}")
    return {"wall": elapsed, **report["phases"]}


class BenchFailure(Exception):
    """doctor reported errors on a clean sandbox (the machine too loaded for its timeouts)."""


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run.get(key, 0.0) for run in runs) for key in runs[0]}


def bench_size(count: int, repeat: int, shell: str | None) -> tuple[dict, dict]:
    name = f"bd{count}"
    box = sandbox.up(nodes=count, name=name, login_shell=shell)
    try:
        _doctor(box.cluster_file, quick=False)  # warm-up
        full = _median([_doctor(box.cluster_file, False) for _ in range(repeat)])
        quick = _median([_doctor(box.cluster_file, True) for _ in range(repeat)])
        return full, quick
    finally:
        sandbox.down(name)


def _vs(seconds: float, target: float | None) -> str:
    return f"{seconds / target:.2f}x of {target:.0f} s" if target else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,4,8,16,32")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--shells", default="bash,sh", help="bash (root's own), sh, or both")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{os.cpu_count()} cores; every sandbox node shares them; median of {args.repeat}")
    shells = {
        "bash": ("root's own shell (bash + ~/.bashrc)", None),
        "sh": ("login shell /bin/sh (no rc file)", "/bin/sh"),
    }
    for title, shell in (shells[name] for name in args.shells.split(",")):
        print(f"\n{title}")
        print(
            f"{'nodes':>5}  {'full':>7}  {'probe':>7}  {'all_reduce':>10}  {'--quick':>7}"
            f"  {'full vs target':>15}  {'probe vs target':>15}"
        )
        rows = {}
        for count in sizes:
            try:
                full, quick = rows[count] = bench_size(count, args.repeat, shell)
            except BenchFailure as exc:
                print(f"{count:>5}  did not pass: {exc}", flush=True)
                continue
            target = TARGETS.get(count)
            print(
                f"{count:>5}  {full['wall']:>6.2f}s  {full['probe']:>6.2f}s  "
                f"{full.get('collective', 0.0):>9.2f}s  {quick['wall']:>6.2f}s  "
                f"{_vs(full['wall'], target):>15}  {_vs(full['probe'], target):>15}",
                flush=True,
            )
        done = [n for n in sizes if n in rows]
        for a, b in zip(done, done[1:], strict=False):
            print(
                f"  {a}->{b} nodes: full x{rows[b][0]['wall'] / rows[a][0]['wall']:.2f}, "
                f"probe x{rows[b][0]['probe'] / rows[a][0]['probe']:.2f}, "
                f"quick x{rows[b][1]['wall'] / rows[a][1]['wall']:.2f}"
            )
    return 0


if __name__ == "__main__":
    if os.geteuid() != 0:
        raise SystemExit("bench/doctor_scale.py needs root (it brings up sandbox clusters)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    sys.exit(main())
