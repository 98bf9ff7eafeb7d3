"""The human status view, drawn from the `StatusView` whose `to_json()` is what `--json` prints.

    >>> duration(0.42), duration(75), duration(3725), duration(200000)
    ('0.4 s', '1m15s', '1h02m', '2d07h')
    >>> human_bytes(33_500_000_000), human_bytes(700 * 2**20), rate(12345.6)
    ('31.2 GiB', '700 MiB', '12.3k')

One row per rank, grouped by node; above MAX_RANK_ROWS ranks, one row per node and then the
flagged ranks' rows. Notes (stragglers, silent ranks, what cannot be judged) come last.

Much of it is what nodes said (a rank's phase, where a hung rank waits, a collective's name):
every line goes out through `untrusted.printable`, so that a control character reaches the
terminal as `?`, never as a command to it (`--json` keeps the text: JSON escapes it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainfleet.heartbeat import STEPPING_PHASES
from trainfleet.status.view import fold_ranks
from trainfleet.untrusted import printable

if TYPE_CHECKING:
    from trainfleet.status.view import RankRow, StatusView

MAX_RANK_ROWS = 16
_RANK_HEAD = ("node", "rank", "step", "last beat", "tokens/s", "memory", "busy", "ETA", "loss")
_NODE_HEAD = ("node", "ranks", "step", "last beat", "tokens/s", "memory", "slowest")
_RIGHT = {"rank", "step", "last beat", "tokens/s", "memory", "busy", "ETA", "loss"}


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def human_bytes(n_bytes: int | None) -> str:
    if n_bytes is None:
        return "-"
    if n_bytes >= 2**30:
        return f"{n_bytes / 2**30:.1f} GiB"
    return f"{n_bytes / 2**20:.0f} MiB"


def rate(per_s: float | None) -> str:
    if per_s is None:
        return "-"
    if per_s >= 1e6:
        return f"{per_s / 1e6:.2f}M"
    return f"{per_s / 1e3:.1f}k" if per_s >= 1e3 else f"{per_s:.0f}"


def _step(step: int | None, total: int | None) -> str:
    if step is None:
        return "-"
    return f"{step}/{total}" if total else str(step)


def _flags(rank: RankRow) -> str:
    flags = []
    if rank.straggler:
        flags.append(f"STRAGGLER +{rank.slower_by:.0%}")
    if rank.silent:
        flags.append("SILENT")
    if rank.phase not in STEPPING_PHASES:
        flags.append(rank.phase)
    if rank.step is None:
        flags.append("no beat yet")
    return ", ".join(flags)


def _table(head: tuple[str, ...], rows: list[list[str]]) -> list[str]:
    """Aligned columns, plus a last, unaligned one (the flags)."""
    widths = [max(len(r[i]) for r in [list(head), *rows]) for i in range(len(head))]
    lines = []
    for row in [[*head, "flags"], *rows]:
        cells = [
            cell.rjust(width) if name in _RIGHT else cell.ljust(width)
            for name, cell, width in zip(head, row, widths, strict=False)  # row: + flags
        ]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return lines


def _rank_rows(ranks: list[RankRow]) -> list[list[str]]:
    rows, previous = [], None
    for r in ranks:
        rows.append([
            r.node if r.node != previous else "",
            str(r.rank),
            _step(r.step, r.total_steps),
            duration(r.since_beat_s),
            rate(r.tokens_per_s),
            human_bytes(r.memory_bytes),
            "-" if r.median_busy_s is None else f"{r.median_busy_s:.2f} s",
            duration(r.eta_s),
            "-" if r.loss is None else f"{r.loss:.4g}",
            _flags(r),
        ])  # fmt: skip
        previous = r.node
    return rows


def _node_rows(view: StatusView) -> list[list[str]]:
    rows = []
    total = view.total_steps
    for n in view.nodes:
        steps = "-" if n.min_step is None else str(n.min_step)
        if n.max_step is not None and n.max_step != n.min_step:
            steps += f"-{n.max_step}"
        slowest = "-" if n.slowest_rank is None else f"rank {n.slowest_rank}"
        flagged = f"{len(n.flagged)} flagged: {fold_ranks(n.flagged)}" if n.flagged else ""
        rows.append([
            n.node, fold_ranks(n.ranks), steps + (f"/{total}" if total else ""),
            duration(n.since_beat_s), rate(n.tokens_per_s),
            human_bytes(n.memory_bytes), slowest, flagged,
        ])  # fmt: skip
    return rows


def _head(view: StatusView) -> list[str]:
    line = f"run {view.run_id}: {view.state}"
    if view.starting_up and view.live:
        line += " (starting up: no step yet, startup phases judged by the startup timeout)"
    if view.step is not None:
        line += f", step {_step(view.step, view.total_steps)}"
        if view.total_steps:
            line += f" ({view.step / view.total_steps:.0%})"
    if view.eta_s is not None:
        line += f", ETA {duration(view.eta_s)}"
    ended = "" if view.live else f", ended {duration(view.updated_ago_s)} ago"
    second = (
        f"{view.world_size} rank(s) on {len(view.nodes)} node(s), "
        f"{'elapsed' if view.live else 'ran for'} {duration(view.elapsed_s)}{ended}, "
        f"restarts {view.restarts}"
    )
    last = view.last_restart
    if last:
        ago = duration(view.now - last["at"]) if isinstance(last.get("at"), int | float) else "?"
        second += f" (last: attempt {last.get('attempt')}, {ago} ago: {last.get('cause')})"
    where = f"status: {view.status_file}"
    if view.live:
        where += f" (rewritten {duration(view.updated_ago_s)} ago)"
    return [line, second, where]


def _hang(view: StatusView) -> list[str]:
    hang = view.hang
    if hang is None:
        return []
    line = "hang:"
    startup = hang.phase == "startup"
    if hang.stuck_s is not None:
        what = "no startup progress before the first step" if startup else "no rank advanced"
        line += f" {what} for {duration(hang.stuck_s)}"
    bound = view.startup_timeout_s if startup else view.hang_timeout_s
    if isinstance(bound, int | float) and bound:
        line += f" ({'startup' if startup else 'hang'} timeout {duration(bound)})"
    if hang.detected_at is not None:
        line += f", detected {duration(view.now - hang.detected_at)} ago"
    lines = [line]
    nodes = {r.rank: r.node for r in view.ranks}
    for who in hang.behind:
        known = nodes.get(who.rank, "?") if who.rank is not None else "?"
        text = f"rank {who.rank} ({who.node or known})"
        lines.append(f"  behind: {text}" + (f": {who.where}" if who.where else ""))
    report = hang.report
    if report and report.collectives:
        from trainfleet.launch.collectives import describe  # (launch's package imports status)

        for found in report.collectives:
            try:
                lines.append(f"  stuck in {describe(found, nodes)}")
            except (KeyError, TypeError):
                lines.append("  stuck in a collective (unreadable record: see status.json)")
    stacks = report.stacks if report else None
    if isinstance(stacks, tuple) and stacks:
        more = f" (+{len(stacks) - 3} more)" if len(stacks) > 3 else ""
        lines.append(f"  stacks: {', '.join(stacks[:3])}{more}")
    elif isinstance(stacks, str):
        lines.append(f"  stacks: {stacks}")
    return lines


def render(view: StatusView) -> str:
    """The human view of `view` (`--json` prints its `to_json()`)."""
    lines = [*_head(view), *_hang(view), ""]
    if len(view.ranks) <= MAX_RANK_ROWS:
        lines += _table(_RANK_HEAD, _rank_rows(view.ranks))
    else:
        lines += _table(_NODE_HEAD, _node_rows(view))
        flagged = [r for r in view.ranks if r.straggler or r.silent]
        if flagged:
            lines += ["", "flagged ranks:", *_table(_RANK_HEAD, _rank_rows(flagged))]
    if view.notes:
        lines += ["", *view.notes]
    return "\n".join(map(printable, lines))
