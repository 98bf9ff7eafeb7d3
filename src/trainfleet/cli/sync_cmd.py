"""`trainfleet sync`: the code directory, at the same path, on every node without shared storage.

trainfleet sync -c cluster.yaml
trainfleet sync --hostfile hostfile --yes ~/projects/llm-finetune
"""

from __future__ import annotations

import argparse
import json
import sys

from trainfleet.cli.common import CLUSTER_YAML_EXAMPLE, add_cluster_arguments, cluster_from_args
from trainfleet.cli.setup_cmd import make_confirm

HELP = "copy the code directory to every node that does not share it (code-differs)"
DESCRIPTION = """\
Runs doctor's probe with DIR as the working directory, then copies DIR to the same path on
every node whose copy differs from this machine's (doctor's code hash), once per group of
nodes that share storage: rsync over ssh (--delete, excluded paths never touched) where both
sides have rsync, tar over ssh otherwise. Shows what it will copy and asks (--yes: do not
ask). Ends with doctor's code-differs and shared-storage checks. DIR defaults to the
cluster's workdir, else the current directory."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cluster_arguments(parser)
    parser.add_argument("directory", nargs="?", metavar="DIR", help="the code directory")
    parser.add_argument(
        "--method", choices=("auto", "rsync", "tar"), default="auto", help="default: auto"
    )
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="PATTERN",
        help="also leave out these paths (repeatable; .git, __pycache__, venvs and run "
        "outputs are always left out)",
    )
    parser.add_argument("--dry-run", action="store_true", help="show what would be copied")
    parser.add_argument("-y", "--yes", action="store_true", help="copy without asking")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.epilog = CLUSTER_YAML_EXAMPLE


def run(args: argparse.Namespace) -> int:
    import os

    from trainfleet.setup.result import render
    from trainfleet.setup.sync.step import DEFAULT_EXCLUDES, sync_code

    cluster = cluster_from_args(args)
    out = sys.stderr if args.json else sys.stdout
    result = sync_code(
        cluster,
        args.directory or cluster.workdir or os.getcwd(),
        method=args.method,
        excludes=(*DEFAULT_EXCLUDES, *args.skip),
        confirm=make_confirm(args.yes, out),
        dry_run=args.dry_run,
    )
    print(json.dumps(result.to_json(), indent=2) if args.json else render(result))
    return result.exit_code
