"""Stragglers, measured: how soon `trainfleet launch` names a node whose CPU is throttled, and
whether a clean run is ever named.

    sudo .venv/bin/python bench/stragglers.py [--runs 5] [--share 0.75] [--clean-s 20]
                                              [--cap 60] [--work 384] [--json FILE]

Each run: a fresh 2-node sandbox (one rank per node; this machine's 2 cores, one per rank) and
`trainfleet launch` of the heartbeat loop (`trainfleet.examples.HEARTBEAT_LOOP`, --work matrix
products of 256x256 per step: about 0.2 s of compute here at 384). Once every rank has 5
steps, nothing is slowed for --clean-s seconds; then every process of gpu-node-2 gets --share
of one CPU (the sandbox's cpu-throttle cgroup), and the run goes on until the launcher names a
straggler or --cap seconds pass. Per run: the ranks named in the clean part (false), the
seconds from the throttle to the naming of rank 1, and any other rank named after it.

Summary: recall = throttled runs whose rank 1 was named within the cap / runs; precision =
correct namings / all namings, the clean parts included. The launcher judges every 5 s, by the
median busy_s over each rank's last 20 steps against the median of the other ranks', with a
20% margin (`status/rules.py`): a 75% share makes the rank's compute ~33% longer.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from trainfleet import sandbox
from trainfleet.examples import HEARTBEAT_LOOP
from trainfleet.sandbox import cpu
from trainfleet.sandbox.netns import netns_pids

NAMED = re.compile(r"rank-straggler: rank (\d+) \(")


class Launch:
    """`trainfleet launch` of the heartbeat loop; its lines timestamped as they arrive."""

    def __init__(self, cluster_file: Path, run_dir: Path, work: int) -> None:
        argv = [sys.executable, "-m", "trainfleet", "launch", "-c", str(cluster_file),
                "--run-dir", str(run_dir), "--", str(HEARTBEAT_LOOP), "--steps", "100000",
                "--work", str(work)]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)  # fmt: skip
        self.lines: list[tuple[float, str]] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.status = run_dir / "status.json"

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def named(self, after: float, until: float) -> list[tuple[float, int]]:
        return [(at, int(m.group(1))) for at, x in list(self.lines)
                if after <= at < until and (m := NAMED.search(x))]  # fmt: skip

    def every_rank_at(self, step: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                ranks = json.loads(self.status.read_text())["ranks"]
                if all((r["step"] or 0) >= step for r in ranks):
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        tail = "\n".join(x for _, x in self.lines[-20:])
        raise SystemExit(f"the ranks never reached step {step}:\n{tail}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def run_one(index: int, args: argparse.Namespace) -> dict:
    name = f"sg{os.getpid() % 1000:03d}{index}"
    box = sandbox.up(name=name, nodes=2, slots=1)
    root = Path(tempfile.mkdtemp(prefix="trainfleet-bench-"))
    try:
        job = Launch(box.cluster_file, root / "run", args.work)
        job.every_rank_at(5, timeout=180)
        clean_from = time.monotonic()
        time.sleep(args.clean_s)
        throttled = time.monotonic()
        cpu.throttle(f"{cpu.cgroup_prefix(name)}2", netns_pids(box.node(2).netns), args.share)
        deadline = throttled + args.cap
        while time.monotonic() < deadline and not any(
            r == 1 for _, r in job.named(throttled, deadline)
        ):
            time.sleep(0.2)
        job.stop()
        false_clean = [r for _, r in job.named(clean_from, throttled)]
        after = job.named(throttled, deadline)
        right = [at for at, r in after if r == 1]
        return {
            "run": index,
            "clean_s": args.clean_s,
            "named_in_clean_part": false_clean,
            "named_s": round(right[0] - throttled, 1) if right else None,
            "wrong_after_throttle": [r for _, r in after if r != 1],
        }
    finally:
        sandbox.down(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--share", type=float, default=cpu.THROTTLE_SHARE,
        help="gpu-node-2's share of one CPU once throttled (default 0.75)",
    )  # fmt: skip
    parser.add_argument("--clean-s", type=float, default=20.0)
    parser.add_argument("--cap", type=float, default=60.0)
    parser.add_argument("--work", type=int, default=384)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    print(f"2 sandbox nodes x 1 rank on 2 shared cores; gpu-node-2 throttled to {args.share:.0%}"
          f" of one CPU after {args.clean_s:g} s clean; cap {args.cap:g} s\n")  # fmt: skip
    head = f"{'run':>3}  {'named in clean part':<20} {'rank 1 named after':>18}  wrong after"
    print(head + "\n" + "-" * len(head), flush=True)
    rows = []
    for index in range(1, args.runs + 1):
        row = run_one(index, args)
        rows.append(row)
        named = f"{row['named_s']:.1f} s" if row["named_s"] is not None else "-"
        print(f"{index:>3}  {str(row['named_in_clean_part'] or '-'):<20} {named:>18}"
              f"  {row['wrong_after_throttle'] or '-'}", flush=True)  # fmt: skip
    correct = sum(r["named_s"] is not None for r in rows)
    false = sum(len(r["named_in_clean_part"]) + len(r["wrong_after_throttle"]) for r in rows)
    times = sorted(r["named_s"] for r in rows if r["named_s"] is not None)
    precision = correct / (correct + false) if correct + false else float("nan")
    print(f"\nrecall {correct}/{len(rows)} = {correct / len(rows):.0%}; precision {correct}/"
          f"{correct + false} = {precision:.0%}; clean seconds watched"
          f" {args.clean_s * len(rows):g}, false namings {false}")  # fmt: skip
    if times:
        print(f"seconds from the throttle to the naming: min {times[0]:.1f}, median"
              f" {times[len(times) // 2]:.1f}, max {times[-1]:.1f}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
