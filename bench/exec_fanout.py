"""Wall time of `trainfleet exec -- true` on 2, 8 and 32 sandbox nodes, warm connections.

    sudo .venv/bin/python bench/exec_fanout.py [--sizes 2,8,32] [--repeat 5]

Side by side in one run, on the same sandbox and the same shared ssh connections:
  - `trainfleet exec` as a user types it (a new process: Python start-up included),
  - the fan-out alone (`run_on_nodes`, in-process),
  - pdsh -R ssh (what the seeds install for this),
  - a serial `for node in ...; ssh node true` loop (what a hostfile loop in bash does).
Prints medians and the ratios between them, twice: with root's own login shell (here bash,
whose ~/.bashrc runs `pyenv init`, 0.12 s of CPU per command, paid by every node on this one
machine's 2 cores) and with /bin/sh, which isolates the fan-out itself. Needs root.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from trainfleet import sandbox
from trainfleet.cluster import load_cluster
from trainfleet.remote import control_dir, node_argv, run_on_nodes

TRAINFLEET = [sys.executable, "-m", "trainfleet"]


def _timed(fn, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _check(proc: subprocess.CompletedProcess) -> None:
    if proc.returncode != 0:
        raise SystemExit(f"bench step failed ({proc.returncode}): {proc.stderr[-500:]}")


def bench_size(count: int, repeat: int, login_shell: str | None) -> dict[str, float]:
    name = f"bf{count}"
    box = sandbox.up(nodes=count, name=name, login_shell=login_shell)
    try:
        cluster = load_cluster(cluster_file=str(box.cluster_file))
        nodes = cluster.nodes
        assert all(r.ok for r in run_on_nodes(nodes, ["true"]))  # open the shared connections
        cli = [*TRAINFLEET, "exec", "-c", str(box.cluster_file), "--", "true"]
        row = {
            "trainfleet exec": _timed(
                lambda: _check(subprocess.run(cli, capture_output=True, text=True)), repeat
            ),
            "fan-out only": _timed(lambda: run_on_nodes(nodes, ["true"]), repeat),
        }
        if shutil.which("pdsh"):
            ssh_args = (
                f"-F {box.ssh_config} -oBatchMode=yes -oControlMaster=auto "
                f"-oControlPath={control_dir()}/%C -oControlPersist=60 %h"
            )
            env = {**os.environ, "PDSH_SSH_ARGS": ssh_args, "PDSH_RCMD_TYPE": "ssh"}
            hosts = ",".join(n.host for n in nodes)
            pdsh = ["pdsh", "-f", str(max(32, count)), "-w", hosts, "true"]
            row["pdsh -R ssh"] = _timed(
                lambda: _check(subprocess.run(pdsh, env=env, capture_output=True, text=True)),
                repeat,
            )
        serial = [node_argv(n, ["true"]) for n in nodes]
        row["serial ssh loop"] = _timed(
            lambda: [subprocess.run(argv, capture_output=True, check=True) for argv in serial], 1
        )
        row["one ssh (remote shell)"] = _timed(
            lambda: subprocess.run(serial[0], capture_output=True, check=True), repeat
        )
        return row
    finally:
        sandbox.down(name)


def _report(title: str, rows: dict[int, dict[str, float]], repeat: int) -> None:
    columns = list(next(iter(rows.values())))
    print(f"\n{title}: exec -- true, warm connections, median of {repeat} (serial loop: 1 run)")
    print(f"{'nodes':>5}  " + "  ".join(f"{c:>22}" for c in columns))
    for count, row in rows.items():
        print(f"{count:>5}  " + "  ".join(f"{row[c]:>21.3f}s" for c in columns))
    for count, row in rows.items():
        ratios = []
        for ours in ("trainfleet exec", "fan-out only"):
            ratios.append(f"serial loop / {ours} = {row['serial ssh loop'] / row[ours]:.2f}x")
            if "pdsh -R ssh" in row:
                ratios.append(f"pdsh / {ours} = {row['pdsh -R ssh'] / row[ours]:.2f}x")
        print(f"{count:>5} nodes: " + ", ".join(ratios))
    first, last = min(rows), max(rows)
    growth = rows[last]["trainfleet exec"] / rows[first]["trainfleet exec"]
    print(
        f"trainfleet exec, {last} / {first} nodes = {growth:.1f}x for {last / first:.0f}x the nodes"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,8,32")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{os.cpu_count()} cores; every sandbox node shares them")
    shells = {
        "root's own shell (bash + ~/.bashrc)": None,
        "login shell /bin/sh (no rc file)": "/bin/sh",
    }
    for title, shell in shells.items():
        _report(title, {n: bench_size(n, args.repeat, shell) for n in sizes}, args.repeat)
    return 0


if __name__ == "__main__":
    if os.geteuid() != 0:
        raise SystemExit("bench/exec_fanout.py needs root (it brings up sandbox clusters)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    sys.exit(main())
