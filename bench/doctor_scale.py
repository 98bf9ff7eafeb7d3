"""`trainfleet doctor` on clean sandboxes of 2 to 32 nodes (full) and 64 (--quick): wall time,
the CPU seconds each node spent and the launcher's, and from them the wall a cluster whose
nodes have their own CPUs would see.

    sudo .venv/bin/python bench/doctor_scale.py [--sizes 2,4,8,16,32] [--quick-sizes 64]
                                                [--repeat 3] [--beds sh,bash,sh+dns,bash+load]

A bed is the nodes' login shell (`sh`: /bin/sh, no rc file; `bash`: root's own bash, which
sources this machine's ~/.bashrc for every ssh command, here a pyenv init: a heavy rc file as
conda's or pyenv's), `+dns`: every node's resolver never answers (the sandbox's
`dns-unreachable` fault), `+load`: two CPU-bound processes run beside doctor on this machine.
Each row's ratio is its wall over the first bed's at the same size and kind.

Each size: a fresh sandbox, one warm-up run (opens the shared ssh connections, warms the page
cache), then the median of --repeat runs of the CLI as a user types it. Every
node's sshd (and so all a probe or rank starts there) is put in a CPU-accounting cgroup of its
own; the launcher's CPU is that of the `trainfleet doctor` process and its children (its ssh
clients). All sandbox nodes share this machine's cores, so the wall here is about the sum of
all nodes' CPU over the cores; on a cluster each node spends its own CPU on its own cores:

    projected = wall - CPU-bound time here + the busiest node's CPU + the launcher's CPU

with the CPU-bound time here taken as (all nodes' CPU + the launcher's) / cores. The
projection keeps the waiting (timeouts, skew, network) and assumes one node's work runs on
one core. A run with an error on a clean sandbox is printed as a failure with its finding ids.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from trainfleet import sandbox

TARGETS = {8: 8.0, 32: 40.0}
"""The issue's goals for the full doctor on this machine, in seconds..."""
QUICK_TARGETS = {64: 15.0}
"""...and for --quick."""

WORKDIR = Path(tempfile.mkdtemp(prefix="trainfleet-bench-"))
"""A stable working directory for the probes (the code hash of a tree being edited differs)."""
(WORKDIR / "train.py").write_text("print('hello')\n")

CGROUP = Path("/sys/fs/cgroup")


class NodeCpu:
    """One CPU-accounting cgroup per sandbox node, holding its sshd (v2 cpu.stat or v1
    cpuacct.usage)."""

    def __init__(self, box: sandbox.Sandbox):
        v2 = (CGROUP / "cgroup.controllers").exists()
        parent = CGROUP if v2 else CGROUP / "cpuacct"
        self.groups = {}
        for node in box.nodes:
            group = parent / f"trainfleet-bench-{box.name}-{node.index}"
            group.mkdir(exist_ok=True)
            (group / "cgroup.procs").write_text(str(box.sshd_pid(node.index)))
            self.groups[node.hostname] = group

    def seconds(self) -> dict[str, float]:
        used = {}
        for host, group in self.groups.items():
            if (group / "cpu.stat").exists() and not (group / "cpuacct.usage").exists():
                line = next(x for x in (group / "cpu.stat").read_text().splitlines()
                            if x.startswith("usage_usec"))  # fmt: skip
                used[host] = int(line.split()[1]) / 1e6
            else:
                used[host] = int((group / "cpuacct.usage").read_text()) / 1e9
        return used

    def remove(self) -> None:
        for group in self.groups.values():
            for _ in range(50):
                try:
                    group.rmdir()
                    break
                except OSError:  # its processes are still ending
                    time.sleep(0.1)


def _doctor(cluster_file: Path, quick: bool, cpu: NodeCpu) -> dict[str, float]:
    """One CLI run: wall, phases, each node's CPU and the launcher's, and the projection."""
    argv = [sys.executable, "-m", "trainfleet", "doctor", "-c", str(cluster_file), "--json"]
    nodes_before = cpu.seconds()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        [*argv, *(["--quick"] if quick else [])], capture_output=True, text=True, cwd=WORKDIR
    )
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    launcher = (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime)
    nodes = {h: s - nodes_before[h] for h, s in cpu.seconds().items()}
    report = json.loads(proc.stdout)
    if proc.returncode != 0:
        ids = sorted({f["id"] for f in report["findings"] if f["severity"] == "error"})
        raise BenchFailure(f"{elapsed:.0f} s, errors on a clean sandbox: {', '.join(ids)}")
    bound_here = (sum(nodes.values()) + launcher) / os.cpu_count()
    projected = max(elapsed - bound_here, 0.0) + max(nodes.values()) + launcher
    return {
        "wall": elapsed,
        **report["phases"],
        "launcher_cpu": launcher,
        "node_cpu_max": max(nodes.values()),
        "node_cpu_median": statistics.median(nodes.values()),
        "projected": projected,
    }


class BenchFailure(Exception):
    """doctor reported errors on a clean sandbox."""


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run.get(key, 0.0) for run in runs) for key in runs[0]}


@contextlib.contextmanager
def _cpu_hogs(count: int):
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def _login_seconds(box: sandbox.Sandbox) -> float:
    """The median of 3 `ssh NODE true` to the last node: what one login costs on this bed."""
    argv = ["ssh", "-F", str(box.ssh_config), box.nodes[-1].hostname, "true"]
    took = []
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True)
        took.append(time.perf_counter() - start)
    return statistics.median(took)


def bench_size(
    count: int, repeat: int, bed: Bed, quick_only: bool
) -> tuple[dict[str, dict], float]:
    """The median run of each kind at this size on this bed, and the bed's login seconds."""
    name = f"bd{count}"
    faults = [f"dns-unreachable@{i}" for i in range(1, count + 1)] if bed.dns else []
    box = sandbox.up(nodes=count, name=name, login_shell=bed.shell, faults=faults)
    cpu = NodeCpu(box)
    try:
        with _cpu_hogs(2 if bed.load else 0):
            _doctor(box.cluster_file, quick_only, cpu)  # warm-up
            rows = {}
            for quick in (True,) if quick_only else (False, True):
                rows["quick" if quick else "full"] = _median(
                    [_doctor(box.cluster_file, quick, cpu) for _ in range(repeat)]
                )
            login = _login_seconds(box)
        return rows, login
    finally:
        sandbox.down(name)
        cpu.remove()


@dataclass(frozen=True)
class Bed:
    name: str
    shell: str | None
    dns: bool
    load: bool

    @classmethod
    def parse(cls, text: str) -> Bed:
        shell, *extras = text.split("+")
        if shell not in SHELLS or not set(extras) <= {"dns", "load"}:
            raise SystemExit(f"--beds: {text!r} is not SHELL[+dns][+load], SHELL one of sh, bash")
        return cls(text, SHELLS[shell], "dns" in extras, "load" in extras)


SHELLS = {"sh": "/bin/sh", "bash": None}
"""A bed's login shell: None leaves root's own (bash and this machine's ~/.bashrc)."""


def _row(count: int, kind: str, run: dict[str, float], target: float | None, ratio: str) -> str:
    goal = f"{run['wall'] / target:.2f}x of {target:.0f} s" if target else ""
    return (
        f"{count:>5}  {kind:<6} {run['wall']:>6.2f}s  {run.get('probe', 0.0):>6.2f}s  "
        f"{run.get('collective', 0.0):>6.2f}s  {run['node_cpu_median']:>6.2f}s  "
        f"{run['node_cpu_max']:>6.2f}s  {run['launcher_cpu']:>6.2f}s  {run['projected']:>6.2f}s"
        f"  {ratio:>6}  {goal}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,4,8,16,32", help="full and --quick at these")
    parser.add_argument("--quick-sizes", default="64", help="--quick only at these")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--beds", default="sh", help="SHELL[+dns][+load], comma-separated")
    args = parser.parse_args()
    plan = [(int(s), False) for s in args.sizes.split(",") if s]
    plan += [(int(s), True) for s in args.quick_sizes.split(",") if s]
    beds = [Bed.parse(text) for text in args.beds.split(",")]
    print(f"{os.cpu_count()} cores; every sandbox node shares them; median of {args.repeat}")
    first: dict[tuple[int, str], float] = {}
    for bed in beds:
        print(f"\nbed {bed.name}")
        print(
            f"{'nodes':>5}  {'kind':<6} {'wall':>7}  {'probe':>7}  {'stack':>7}  "
            f"{'cpu/node':>7}  {'cpu max':>7}  {'launch':>7}  {'project':>7}  {'ratio':>6}  "
            "vs goal"
        )
        for count, quick_only in plan:
            try:
                rows, login = bench_size(count, args.repeat, bed, quick_only)
            except BenchFailure as exc:
                print(f"{count:>5}  did not pass: {exc}", flush=True)
                continue
            for kind, run in rows.items():
                target = (QUICK_TARGETS if kind == "quick" else TARGETS).get(count)
                base = first.setdefault((count, kind), run["wall"])
                print(_row(count, kind, run, target, f"{run['wall'] / base:.2f}x"), flush=True)
            print(f"{'':>5}  login  {login:>6.2f}s  (`ssh NODE true`, median of 3)", flush=True)
    return 0


if __name__ == "__main__":
    if os.geteuid() != 0:
        raise SystemExit("bench/doctor_scale.py needs root (it brings up sandbox clusters)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    sys.exit(main())
