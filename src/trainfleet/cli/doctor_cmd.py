"""`trainfleet doctor`: check every node and every pair of nodes before a launch.

trainfleet doctor -c cluster.yaml
trainfleet doctor --hostfile hostfile --quick --json
"""

from __future__ import annotations

import argparse
import json
import sys

from trainfleet.cli.common import CLUSTER_YAML_EXAMPLE, add_cluster_arguments, cluster_from_args
from trainfleet.errors import TrainfleetError

HELP = "find every multi-node pitfall before launch"
DESCRIPTION = """\
Probe every node at once (a stdlib-only script over ssh: nodes need only python3) and
test every pair of nodes: ssh both ways, TCP to the master port and to random ports
(what a firewall that passes ssh and 29500 but drops NCCL's ports breaks), shared
storage. Each problem is reported with its PITFALLS.md id, its node(s), the evidence and
the fix. Exit 0: no errors; 1: errors found; 2: doctor itself could not run."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cluster_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="skip the slow parts (imports of torch & co., node-to-node ssh, code hash)",
    )
    parser.epilog = CLUSTER_YAML_EXAMPLE


def run(args: argparse.Namespace) -> int:
    from trainfleet.doctor import run_doctor
    from trainfleet.doctor.report import render

    try:
        report = run_doctor(cluster_from_args(args), quick=args.quick)
    except TrainfleetError as exc:
        print(f"trainfleet doctor: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_json(), indent=2) if args.json else render(report))
    return report.exit_code
