"""commtest in bounded time on a node whose link is shaped to 50 Mbit/s: how soon the slow node
is named, and how long the whole run takes, against the time budget.

    sudo .venv/bin/python bench/commtest_slow_link.py [--nodes 3] [--max-bytes 16M]
                                                      [--time-budgets 30,60]

A sandbox of --nodes nodes, one rank each, `--fault slow-link@N` on the last one (tc shapes its
link to 50 Mbit/s). For each budget, one `trainfleet commtest --max-bytes 16M` with every op
(what the issue ran: an unbounded sweep did not end within 400 s there), its stderr read line by
line as it comes: the seconds from the command's start to the first line naming the slow node,
to the end of the command, the measuring time the report gives, and the sizes the budget cut.
Every node shares this machine's 2 cores; the times are this machine's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from trainfleet import sandbox
from trainfleet.commtest.formulas import human


def _run(argv: list[str], cwd: Path, slow_node: str) -> dict:
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    named: list[float] = []

    def watch_stderr() -> None:
        for line in proc.stderr:
            if not named and "slow-link" in line and slow_node in line:
                named.append(time.monotonic() - started)

    reader = threading.Thread(target=watch_stderr, daemon=True)
    reader.start()
    out = proc.stdout.read()
    proc.wait()
    reader.join()
    wall = time.monotonic() - started
    report = json.loads(out)
    return {"named_s": named[0] if named else None, "wall_s": wall, "report": report,
            "code": proc.returncode}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--max-bytes", default="16M")
    parser.add_argument("--time-budgets", default="30,60", help="seconds, comma-separated")
    args = parser.parse_args()
    slow_node = f"gpu-node-{args.nodes}"
    box = sandbox.up(name="bsl", nodes=args.nodes, faults=[f"slow-link@{args.nodes}"])
    cwd = Path(tempfile.mkdtemp(prefix="trainfleet-bench-"))
    runs = []
    try:
        for budget in args.time_budgets.split(","):
            argv = [sys.executable, "-m", "trainfleet", "commtest", "-c", str(box.cluster_file)]
            argv += ["--max-bytes", args.max_bytes, "--time-budget", budget, "--json"]
            runs.append((budget, _run(argv, cwd, slow_node)))
    finally:
        sandbox.down("bsl")
    print(f"{args.nodes} nodes, 1 rank each, gloo; {slow_node}'s link shaped to 50 Mbit/s; ")
    print(f"every op, 1K..{args.max_bytes} by 2; 2 shared cores\n")
    print(f"{'budget':>7} {'slow node named':>16} {'whole run':>10} {'measuring':>10} "
          f"{'rows':>5}  cut by the budget")  # fmt: skip
    for budget, run in runs:
        report = run["report"]
        named = f"{run['named_s']:.1f} s" if run["named_s"] is not None else "never"
        cut = ", ".join(f"{s['op']} from {human(s['bytes'])}" for s in report["skipped"])
        print(
            f"{budget + ' s':>7} {named:>16} {run['wall_s']:>8.1f} s "
            f"{report['seconds'] or 0:>8.1f} s {len(report['results']):>5}  {cut or '-'}"
        )
        slow = [f["nodes"] for f in report["findings"] if f["id"] == "slow-link"]
        print(f"{'':>7} findings: {slow}, exit {run['code']}")


if __name__ == "__main__":
    main()
