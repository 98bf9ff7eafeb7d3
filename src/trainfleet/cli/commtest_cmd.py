"""`trainfleet commtest`: collective bandwidth across the cluster, a verdict, the slow link.

trainfleet commtest -c cluster.yaml
trainfleet commtest --hostfile hostfile --ops all_reduce --max-bytes 256M --plot busbw.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trainfleet.cli.common import CLUSTER_YAML_EXAMPLE, add_cluster_arguments, cluster_from_args

HELP = "collective bandwidth across the cluster, a verdict, and the slow node or link"
DESCRIPTION = """\
Runs one job through `trainfleet launch` on every slot of every node (NCCL on GPUs, gloo on
CPUs; the nodes need trainfleet and torch installed), within --time-budget seconds of
measuring. First the nodes' first ranks measure each pair of nodes, in rounds of disjoint
pairs: send/recv and a raw TCP stream, each direction; a node or link much slower than the
rest is named (`slow-link`) as soon as the rounds show it. Then per op and size: the time per
op on the slowest rank (as many ops as the budget gives each size, at most --iters), algbw and
busbw with nccl-tests' factors, and a check of every result; sizes that no longer fit the
budget are skipped and listed. The verdict compares all_reduce busbw at the largest size
measured with the slowest link (kernel-reported speed, raw TCP). Ctrl-C or a hung collective
still prints what was measured (and valid --json), marked incomplete.
Exit 0: PASS; 1: shortfall, wrong results or a slow link; 2: the job did not finish (a hung
collective ends at --timeout); 130: interrupted."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cluster_arguments(parser)
    # No commtest import here: building the parser must stay light for every command.
    parser.add_argument(
        "--ops", help="comma-separated collectives (default: all; a wrong name lists them)"
    )
    parser.add_argument("--min-bytes", default="1K", metavar="SIZE")
    parser.add_argument("--max-bytes", default="1G", metavar="SIZE")
    parser.add_argument("--factor", type=int, default=2)
    parser.add_argument(
        "--time-budget",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds of measuring, pair rounds first (default 60; 0: no bound)",
    )
    parser.add_argument(
        "--iters", type=int, default=20, help="at most this many timed ops per size (default 20)"
    )
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--timeout", type=int, default=60, metavar="S", help="a collective taking longer is hung"
    )
    parser.add_argument("--no-pairs", action="store_true", help="skip the node pair rounds")
    parser.add_argument("--pair-bytes", default="4M", metavar="SIZE")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="busbw vs size per op")
    parser.add_argument("--run-dir", metavar="DIR", help="logs go here")
    parser.epilog = CLUSTER_YAML_EXAMPLE


def run(args: argparse.Namespace) -> int:
    from trainfleet.commtest import CommtestOptions, run_commtest
    from trainfleet.commtest.formulas import OPS
    from trainfleet.commtest.report import plot, render
    from trainfleet.errors import TrainfleetError
    from trainfleet.units import parse_size

    options = CommtestOptions(
        ops=tuple(op.strip() for op in args.ops.split(",") if op.strip()) if args.ops else OPS,
        min_bytes=parse_size(args.min_bytes),
        max_bytes=parse_size(args.max_bytes),
        factor=args.factor,
        iters=args.iters,
        warmup=args.warmup,
        time_budget=args.time_budget or None,
        timeout=args.timeout,
        pairs=not args.no_pairs,
        pair_bytes=parse_size(args.pair_bytes),
    )
    try:
        report = run_commtest(
            cluster_from_args(args),
            options,
            run_dir=Path(args.run_dir) if args.run_dir else None,
        )
    except TrainfleetError as exc:
        print(f"trainfleet commtest: {exc}", file=sys.stderr)
        return 2
    if args.plot and report.results:
        plot(report, Path(args.plot))
    print(json.dumps(report.to_json(), indent=2) if args.json else render(report))
    if args.plot and report.results and not args.json:
        print(f"plot: {args.plot}")
    if report.stopped == "interrupted":
        return 130
    if report.stopped:
        print(f"trainfleet commtest: {report.stopped}", file=sys.stderr)
        return 2
    return 0 if report.passed and not report.findings else 1
