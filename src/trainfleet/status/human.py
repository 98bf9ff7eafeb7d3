"""The human status view, drawn from `StatusView.to_json()`: what `--json` prints is exactly
what this renders from.

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

from typing import Any

from trainfleet.heartbeat import STEPPING_PHASES
from trainfleet.status.view import fold_ranks
from trainfleet.untrusted import printable

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


def _flags(rank: dict[str, Any]) -> str:
    flags = []
    if rank["straggler"]:
        flags.append(f"STRAGGLER +{rank['slower_by']:.0%}")
    if rank["silent"]:
        flags.append("SILENT")
    if rank["phase"] not in STEPPING_PHASES:
        flags.append(rank["phase"])
    if rank["step"] is None:
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


def _rank_rows(ranks: list[dict[str, Any]]) -> list[list[str]]:
    rows, previous = [], None
    for r in ranks:
        rows.append([
            r["node"] if r["node"] != previous else "",
            str(r["rank"]),
            _step(r["step"], r["total_steps"]),
            duration(r["since_beat_s"]),
            rate(r["tokens_per_s"]),
            human_bytes(r["memory_bytes"]),
            "-" if r["median_busy_s"] is None else f"{r['median_busy_s']:.2f} s",
            duration(r["eta_s"]),
            "-" if r["loss"] is None else f"{r['loss']:.4g}",
            _flags(r),
        ])  # fmt: skip
        previous = r["node"]
    return rows


def _node_rows(data: dict[str, Any]) -> list[list[str]]:
    rows = []
    total = data["total_steps"]
    for n in data["nodes"]:
        steps = "-" if n["min_step"] is None else str(n["min_step"])
        if n["max_step"] is not None and n["max_step"] != n["min_step"]:
            steps += f"-{n['max_step']}"
        slowest = "-" if n["slowest_rank"] is None else f"rank {n['slowest_rank']}"
        flagged = f"{len(n['flagged'])} flagged: {fold_ranks(n['flagged'])}" if n["flagged"] else ""
        rows.append([
            n["node"], fold_ranks(n["ranks"]), steps + (f"/{total}" if total else ""),
            duration(n["since_beat_s"]), rate(n["tokens_per_s"]),
            human_bytes(n["memory_bytes"]), slowest, flagged,
        ])  # fmt: skip
    return rows


def _head(data: dict[str, Any]) -> list[str]:
    line = f"run {data['run_id']}: {data['state']}"
    if data.get("starting_up") and data["live"]:
        line += " (starting up: no step yet, startup phases judged by the startup timeout)"
    if data["step"] is not None:
        line += f", step {_step(data['step'], data['total_steps'])}"
        if data["total_steps"]:
            line += f" ({data['step'] / data['total_steps']:.0%})"
    if data["eta_s"] is not None:
        line += f", ETA {duration(data['eta_s'])}"
    ended = "" if data["live"] else f", ended {duration(data['updated_ago_s'])} ago"
    second = (
        f"{data['world_size']} rank(s) on {len(data['nodes'])} node(s), "
        f"{'elapsed' if data['live'] else 'ran for'} {duration(data['elapsed_s'])}{ended}, "
        f"restarts {data['restarts']}"
    )
    last = data["last_restart"]
    if last:
        ago = duration(data["now"] - last["at"]) if isinstance(last.get("at"), int | float) else "?"
        second += f" (last: attempt {last.get('attempt')}, {ago} ago: {last.get('cause')})"
    where = f"status: {data['status_file']}"
    if data["live"]:
        where += f" (rewritten {duration(data['updated_ago_s'])} ago)"
    return [line, second, where]


def _hang(data: dict[str, Any]) -> list[str]:
    hang = data["hang"]
    if not isinstance(hang, dict):
        return []
    line = "hang:"
    startup = hang.get("phase") == "startup"
    if hang.get("stuck_s") is not None:
        what = "no startup progress before the first step" if startup else "no rank advanced"
        line += f" {what} for {duration(hang['stuck_s'])}"
    bound = data.get("startup_timeout_s") if startup else data["hang_timeout_s"]
    if isinstance(bound, int | float) and bound:
        line += f" ({'startup' if startup else 'hang'} timeout {duration(bound)})"
    if isinstance(hang.get("detected_at"), int | float):
        line += f", detected {duration(data['now'] - hang['detected_at'])} ago"
    lines = [line]
    nodes = {r["rank"]: r["node"] for r in data["ranks"]}
    for who in hang.get("behind") or []:
        if isinstance(who, dict):
            rank = who.get("rank")
            text = f"rank {rank} ({who.get('node', nodes.get(rank, '?'))})"
            lines.append(f"  behind: {text}" + (f": {who['where']}" if who.get("where") else ""))
        else:
            lines.append(f"  behind: rank {who} ({nodes.get(who, '?')})")
    collectives = hang.get("collectives")
    if isinstance(collectives, list) and collectives:
        from trainfleet.launch.collectives import describe  # (launch's package imports status)

        for found in filter(lambda c: isinstance(c, dict), collectives):
            try:
                lines.append(f"  stuck in {describe(found, nodes)}")
            except (KeyError, TypeError):
                lines.append("  stuck in a collective (unreadable record: see status.json)")
    stacks = hang.get("stacks")
    if isinstance(stacks, dict):
        stacks = list(stacks.values())
    if isinstance(stacks, list) and stacks:
        more = f" (+{len(stacks) - 3} more)" if len(stacks) > 3 else ""
        lines.append(f"  stacks: {', '.join(map(str, stacks[:3]))}{more}")
    elif isinstance(stacks, str):
        lines.append(f"  stacks: {stacks}")
    return lines


def render(data: dict[str, Any]) -> str:
    """The human view of `StatusView.to_json()`."""
    lines = [*_head(data), *_hang(data), ""]
    if len(data["ranks"]) <= MAX_RANK_ROWS:
        lines += _table(_RANK_HEAD, _rank_rows(data["ranks"]))
    else:
        lines += _table(_NODE_HEAD, _node_rows(data))
        flagged = [r for r in data["ranks"] if r["straggler"] or r["silent"]]
        if flagged:
            lines += ["", "flagged ranks:", *_table(_RANK_HEAD, _rank_rows(flagged))]
    if data["notes"]:
        lines += ["", *data["notes"]]
    return "\n".join(map(printable, lines))
