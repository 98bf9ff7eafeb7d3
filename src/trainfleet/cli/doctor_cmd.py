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
storage. Each problem is reported with its id (docs/findings.md), its node(s), the evidence and
the fix. Exit 0: no errors; 1: errors found; 2: doctor itself could not run.

--fix then shows the safe, reversible changes it can make (unknown host keys added after
their fingerprints are shown; each node's interface pinned in cluster.yaml, the old file
kept), asks before making them (--yes: do not ask), and runs doctor again. It never opens
a firewall, trusts a changed host key or kills a process: it prints what to do."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cluster_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="skip the slow parts (imports of torch & co., node-to-node ssh, code hash)",
    )
    parser.add_argument(
        "--all-pairs",
        action="store_true",
        help="every node tests every node (TCP and ssh) however many there are; by default,"
        " beyond 16 nodes each node tests the master and log2(N) others",
    )
    parser.add_argument(
        "--fix",
        action="store_true",
        help="then make the safe, reversible changes for what was found, after showing them",
    )
    parser.add_argument(
        "-y", "--yes", action="store_true", help="with --fix: make the changes without asking"
    )
    parser.epilog = CLUSTER_YAML_EXAMPLE


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        print("not a terminal: nothing changed (pass --yes to make these changes)")
        return False
    try:
        return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
    except EOFError:
        return False


def run(args: argparse.Namespace) -> int:
    from trainfleet.doctor import run_doctor
    from trainfleet.doctor.fix import apply_plan, plan_fixes, render_plan
    from trainfleet.doctor.report import render

    try:
        cluster = cluster_from_args(args)
        report = run_doctor(cluster, quick=args.quick, all_pairs=args.all_pairs)
    except TrainfleetError as exc:
        print(f"trainfleet doctor: {exc}", file=sys.stderr)
        return 2
    if not args.fix:
        print(json.dumps(report.to_json(), indent=2) if args.json else render(report))
        return report.exit_code

    plan = plan_fixes(report, cluster_file=args.cluster_file)
    out = sys.stderr if args.json else sys.stdout
    if not args.json:
        print(render(report), end="\n\n")
    print(render_plan(plan), file=out)
    fixed = None
    if plan.changes and (args.yes or (not args.json and _confirm("make these changes?"))):
        applied = apply_plan(plan, cluster)
        print("\n".join(applied), file=out)
        print("\nrunning doctor again:", file=out)
        cluster = cluster_from_args(args)  # the cluster.yaml may have changed
        fixed = run_doctor(cluster, quick=args.quick, all_pairs=args.all_pairs)
        if not args.json:
            print(render(fixed))
    if args.json:
        data = report.to_json()
        data["fix"] = plan.to_json() | {"applied": fixed is not None}
        data["after_fix"] = fixed.to_json() if fixed else None
        print(json.dumps(data, indent=2))
    return (fixed or report).exit_code
