"""`trainfleet status`: every node's and rank's progress, while a job runs or after it ended.

trainfleet status                      # the newest run under ./trainfleet-runs or ./runs
trainfleet status /data/run1 --follow  # a `trainfleet train` OUTPUT: its newest run
trainfleet status trainfleet-runs/20250301-101500-ab12 --json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from trainfleet.errors import TrainfleetError

if TYPE_CHECKING:
    from trainfleet.status import StatusView

HELP = "each node's and rank's step, heartbeat age, throughput, memory and ETA; stragglers"
DESCRIPTION = """\
Reads RUN_DIR/status.json, which `trainfleet launch` (and so `trainfleet train`) rewrites
every second while a job runs and once at its end: works from another terminal during the
run and from the run directory afterwards. RUN_DIR may be a run dir, a `trainfleet train`
OUTPUT dir or a trainfleet-runs dir (their newest run); without it, the newest run under
./trainfleet-runs or ./runs, or the current directory when it is a run dir.

One row per rank, grouped by node (above 16 ranks: one row per node, then the flagged
ranks): step, seconds since its last heartbeat, tokens/s, memory, median busy seconds per
step, ETA (steps left x the median of recent step times). A straggler is a rank whose median
busy_s (the seconds it computed rather than waited, over its last heartbeats, at least 5) is
more than --margin (20%) above the median over all ranks; step times cannot tell, as every
rank's step waits for the slowest. A rank with no heartbeat for 5x its median step time (and
at least 30 s) while the job runs is silent.

Exit code: 0 when the job is starting, running or done; 1 when it failed, stalled, hung or
was interrupted (and for errors: no run found, an unreadable status.json)."""


def _margin(text: str) -> float:
    """0.2 or 20%."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write 0.2 or 20%") from None
    if not 0 < value < 10:
        raise argparse.ArgumentTypeError(f"{text!r}: between 0 and 10 (1000%)")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir",
        nargs="?",
        type=Path,
        metavar="RUN_DIR",
        help="a run dir, a `trainfleet train` OUTPUT dir, or a trainfleet-runs dir",
    )
    parser.add_argument(
        "-f", "--follow", action="store_true", help="redraw until the job ends, then exit"
    )
    parser.add_argument(
        "--interval", type=float, default=2.0, metavar="S", help="with --follow (default 2)"
    )
    parser.add_argument(
        "--margin",
        type=_margin,
        default=None,
        metavar="F",
        help="a straggler's median busy_s is this much above all ranks' (default 0.2 = 20%%)",
    )
    parser.add_argument(
        "--json", action="store_true", help="the view as JSON (with --follow: one per line)"
    )


def _show(view: StatusView, *, as_json: bool, redraw: bool) -> None:
    from trainfleet.status import render

    if as_json:
        print(json.dumps(view.to_json()), flush=True)
        return
    if redraw:
        sys.stdout.write("\x1b[H\x1b[2J")  # home, clear: a terminal shows the latest view only
    print(render(view), flush=True)


def run(args: argparse.Namespace) -> int:
    from trainfleet.status import MARGIN, find_status_file, read_view, watch

    if args.interval <= 0:
        raise TrainfleetError(f"--interval {args.interval}: must be > 0", "e.g. --interval 2")
    margin = MARGIN if args.margin is None else args.margin
    path = find_status_file(args.run_dir, cwd=Path.cwd())
    if not args.follow:
        view = read_view(path, margin=margin)
        _show(view, as_json=args.json, redraw=False)
        return view.exit_code
    redraw = sys.stdout.isatty() and not args.json
    for view in watch(path, interval=args.interval, margin=margin):
        _show(view, as_json=args.json, redraw=redraw)
        if not redraw and not args.json and view.live:
            print(flush=True)  # views apart when they scroll (a file, a pipe)
    return view.exit_code
