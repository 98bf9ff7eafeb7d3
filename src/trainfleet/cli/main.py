"""The `trainfleet` command: one module per subcommand, registered here.

    >>> from trainfleet.cli.main import main
    >>> main(["exec", "--", "true"])
    0

Each subcommand module has `HELP`, `DESCRIPTION`, `add_arguments(parser)` and
`run(args) -> int`. Known errors print `trainfleet: <what>: <fix>` and exit 1; Ctrl-C exits
130; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from trainfleet import __version__
from trainfleet.cli import (
    commtest_cmd,
    doctor_cmd,
    exec_cmd,
    launch_cmd,
    plan_cmd,
    sandbox_cmd,
    setup_cmd,
    status_cmd,
    sync_cmd,
    train_cmd,
)
from trainfleet.errors import TrainfleetError
from trainfleet.untrusted import printable_lines

COMMANDS: dict[str, ModuleType] = {
    "commtest": commtest_cmd,
    "doctor": doctor_cmd,
    "exec": exec_cmd,
    "launch": launch_cmd,
    "plan": plan_cmd,
    "sandbox": sandbox_cmd,
    "setup": setup_cmd,
    "status": status_cmd,
    "sync": sync_cmd,
    "train": train_cmd,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainfleet",
        description="Multi-node DeepSpeed / torch.distributed training from one command on one "
        "node; every failure explained with its cause, node and fix.",
    )
    parser.add_argument("--version", action="version", version=f"trainfleet {__version__}")
    sub = parser.add_subparsers(dest="command_name", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        sub_parser = sub.add_parser(
            name,
            help=module.HELP,
            description=module.DESCRIPTION,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            # A prefix of a flag is not that flag: `--deepspeed` once reached
            # `--deepspeed-config` by abbreviation, and a typo silently became another option.
            allow_abbrev=False,
        )
        module.add_arguments(sub_parser)
        sub_parser.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # The words as typed: `--backend slurm` submits this same command as a batch job.
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return args.run(args)
    except TrainfleetError as exc:
        message = f"trainfleet: {exc.what}"
        message = f"{message}: {exc.fix}" if exc.fix else message
        print(printable_lines(message), file=sys.stderr)  # it may quote a node's stderr
        return 1
    except KeyboardInterrupt:
        print("trainfleet: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`trainfleet ... | head`): not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
