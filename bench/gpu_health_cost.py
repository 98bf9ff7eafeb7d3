"""What doctor's GPU health costs, on the recorded H200 output (no GPU needed).

    .venv/bin/python bench/gpu_health_cost.py [--sizes 8,64,256] [--repeat 5]

Two figures, each measured side by side in one run:

- per node: the probe's `gpus.facts()` reading what nvidia-smi and dmesg printed on an H200,
  as 8 GPUs with 18 NVLinks each (sandbox/fakegpu.py replays them in-process, so this is the
  reading alone). nvidia-smi's own time is measured on a GPU by bench/gpu_validate.py (on an
  H200: 34 ms for the health query, 22-30 ms for each small call, 220 ms for the whole of
  `gpus.facts()` in a fresh Python; docs/notes/2026-11.md).
- per cluster: parsing every node's fact sheet and running every check, on N nodes of 8 GPUs
  each against the same N nodes with no GPU (the ratio is what the GPU checks add).

"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from trainfleet.cluster import Cluster, Node
from trainfleet.doctor.checks import run_checks
from trainfleet.doctor.collect import Survey
from trainfleet.doctor.facts import parse_fact_sheet
from trainfleet.node import gpus, probe, system
from trainfleet.sandbox import fakegpu

SPEC = fakegpu.FakeGpuSpec(gpus=8, nvlinks=18)


def replayed_run(argv, timeout=5.0, env=None):
    """`system.run` answering nvidia-smi and dmesg from the recording, in-process."""
    program = fakegpu.PROGRAMS.get(argv[0])
    if program is None:
        return 127, "", "not found"
    answer = program(SPEC, list(argv[1:]))
    return answer.rc, answer.stdout, answer.stderr


def node_answer() -> dict:
    real = system.run
    system.run = replayed_run
    try:
        return gpus.facts()
    finally:
        system.run = real


def timed(work, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def survey(size: int, with_gpus: bool, answer: dict) -> Survey:
    hosts = [f"gpu-node-{k}" for k in range(1, size + 1)]
    slots = 8 if with_gpus else 1
    nodes = tuple(
        Node(host=h, slots=slots, gpu_ids=tuple(range(slots)), python="python3") for h in hosts
    )
    sheets = {
        h: {
            "probe_version": probe.PROBE_VERSION,
            "hostname": h,
            "gpus": answer if with_gpus else None,
        }
        for h in hosts
    }
    return Survey(
        cluster=Cluster(nodes=nodes, master=hosts[0]),
        addresses=dict.fromkeys(hosts, "10.0.0.1"),
        master_addr="10.0.0.1",
        ports={h: [45000] for h in hosts},
        facts={h: parse_fact_sheet(sheet, node=h) for h, sheet in sheets.items()},
        quick=True,
    )


def checked(size: int, with_gpus: bool, answer: dict) -> None:
    run_checks(survey(size, with_gpus, answer), started=0, finished=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,64,256")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    answer = node_answer()
    per_node = timed(node_answer, args.repeat * 10)
    print(f"per node: gpus.facts() reading 8 recorded H200s with 18 NVLinks each: "
          f"{per_node * 1000:.2f} ms (median of {args.repeat * 10})")  # fmt: skip
    print(f"{'nodes':>6} {'no GPU: parse+checks':>22} {'8 GPUs each':>12} {'ratio':>6}")
    for size in (int(s) for s in args.sizes.split(",")):
        base, gpu = (
            timed(functools.partial(checked, size, with_gpus, answer), args.repeat)
            for with_gpus in (False, True)
        )
        print(f"{size:>6} {base * 1000:>19.1f} ms {gpu * 1000:>9.1f} ms {gpu / base:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
