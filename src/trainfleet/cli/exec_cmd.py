"""`trainfleet exec`: run a command on every node at once (what the seeds install pdsh for).

trainfleet exec -c cluster.yaml -- nvidia-smi -L
trainfleet exec --hostfile hostfile --fold -- 'python -c "import torch; print(torch.__version__)"'
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from trainfleet.cli.common import (
    CLUSTER_YAML_EXAMPLE,
    add_cluster_arguments,
    cluster_from_args,
    command_after_dashes,
)

if TYPE_CHECKING:
    from trainfleet.remote import NodeResult

HELP = "run a command on every node"
DESCRIPTION = """\
Run a command on every node of the cluster at once, over the system ssh client (so
~/.ssh/config, agents and jump hosts work as with `ssh host`). Each output line is
prefixed with its node; the exit code is the worst node's. Unreachable nodes are
reported with the reason (refused, timed out, no route, auth, host key) and the fix.

One word after `--` is a shell command line (pipes work, as with pdsh); several words
are run as an exact argv."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cluster_arguments(parser)
    parser.add_argument(
        "--fold", action="store_true", help="group nodes with identical output (gpu-node-[1-3])"
    )
    parser.add_argument(
        "--timeout", type=float, metavar="S", help="stop a node's command after S seconds"
    )
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    parser.epilog = CLUSTER_YAML_EXAMPLE


def _print_line(node: str, stream: str, line: str) -> None:
    """`node: line` as lines arrive (remote hands them over one at a time, from one thread)."""
    print(f"{node}: {line}", file=sys.stdout if stream == "stdout" else sys.stderr, flush=True)


def _print_folded(results: list[NodeResult]) -> None:
    """Each stream folded on its own: one node's stray stderr line (an ssh warning, say) must
    not split the nodes whose stdout is the same."""
    from trainfleet.nodeset import fold_groups

    answered = [r for r in results if not r.failure.is_connection_failure]
    # A node that printed nothing at all still gets its (empty) line.
    silent_or_stdout = {r.node: r.stdout for r in answered if r.stdout or not r.stderr}
    for names, stdout in fold_groups(silent_or_stdout):
        for line in stdout.splitlines() or [""]:
            print(f"{names}: {line}")
    for names, stderr in fold_groups({r.node: r.stderr for r in answered if r.stderr}):
        for line in stderr.splitlines():
            print(f"{names}: {line}", file=sys.stderr)


def _print_summary(results: list[NodeResult]) -> None:
    from trainfleet.nodeset import fold_groups

    failed = [r for r in results if not r.ok]
    if not failed:
        return
    print(f"trainfleet exec: {len(failed)} of {len(results)} nodes failed:", file=sys.stderr)
    for names, (reason, pitfall, fix) in fold_groups(
        {r.node: (r.reason(), r.failure.pitfall_id, r.failure.fix(r.node)) for r in failed}
    ):
        tag = f" [{pitfall}]" if pitfall else ""
        print(f"  {names}: {reason}{tag}", file=sys.stderr)
        if fix:
            print(f"    fix: {fix}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from trainfleet.remote import command_argv, run_on_nodes, worst_returncode

    argv = command_argv(command_after_dashes(args.command))
    cluster = cluster_from_args(args)
    streaming = not (args.fold or args.json)
    results = run_on_nodes(
        cluster.nodes, argv, timeout=args.timeout, on_line=_print_line if streaming else None
    )
    if args.json:
        print(json.dumps({"command": argv, "nodes": [r.to_json() for r in results]}, indent=2))
        return worst_returncode(results)
    if args.fold:
        _print_folded(results)
    _print_summary(results)
    return worst_returncode(results)
