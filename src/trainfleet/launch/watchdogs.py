"""The watchdogs a launch runs over its facts (`launch/runfacts.py`) while the ranks work: the
join watchdog, stragglers named as they come and go, the hang watchdog, and, once it fires,
every rank's stack and Flight Recorder read into the hang record (`status/hang.py`) before the
stop. Each says what it found through `note` (the merged output's `trainfleet:` lines) and
returns it; the supervisor acts on it.

    >>> from trainfleet.launch.progress import Progress
    >>> progress = Progress(run_id="r1", ranks={"n1": range(0, 2)}, started_at=0.0)
    >>> progress.beat(0, {"step": 3}, now=100.0); progress.beat(1, {"step": 3}, now=100.0)
    >>> hang = hung(progress, all_exited=False, startup_timeout=None, hang_timeout=30.0,
    ...             note=print, now=140.0)  # doctest: +ELLIPSIS
    no rank advanced a step for 40 s (hang timeout 30 s): dumping every rank's stack, then...
    >>> hang.phase, hang.stuck_s
    ('training', 40.0)

Before the first step (only startup beats so far: loading, tokenizing) and after every rank's
last one (a final save, an export), no step advances for a while by design: those phases are
judged by the startup timeout, training by the hang timeout. Silence once every rank has ended
is no hang: what still runs is the nodes' launchers, whose end the supervisor sees.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainfleet.catalog import FindingId
from trainfleet.launch import collectives, stacks
from trainfleet.launch.progress import Progress
from trainfleet.launch.runfacts import Joins
from trainfleet.status import rules as status_rules
from trainfleet.status.hang import Behind, Hang, StackReport
from trainfleet.untrusted import printable

STRAGGLERS_EVERY_S = 5.0
"""How often the launcher judges stragglers from the ranks' busy_s (`status/rules.py`)."""

Note = Callable[[str], None]


def not_joined(
    joins: Joins, *, started_at: float, timeout: float, note: Note, now: float
) -> set[int] | None:
    """The ranks that had not joined the rendezvous, said, once the join timeout ran out
    (`started_at`, `now`: monotonic seconds); None while it has not."""
    missing = joins.stalled(started_at, now, timeout)
    if missing is not None:
        note(
            f"not every rank joined the rendezvous within {timeout:.0f} s: stopping every rank"
            " on every node"
        )
    return missing


class Stragglers:
    """Says once when a rank becomes a straggler (its median busy_s above the others' by more
    than status's margin), and once when it no longer is; judged every STRAGGLERS_EVERY_S."""

    def __init__(self, note: Note) -> None:
        self.note = note
        self.named: set[int] = set()
        self.checked_at = 0.0
        """Monotonic seconds of the last judgement."""

    def judge(self, progress: Progress, *, now: float) -> None:
        if now - self.checked_at < STRAGGLERS_EVERY_S:
            return
        self.checked_at = now
        found = status_rules.stragglers(progress.rank_rows())
        for rank in sorted(set(found) - self.named):
            row = found[rank]
            self.note(
                f"{FindingId.RANK_STRAGGLER}: rank {rank} ({row.node}) computes"
                f" {row.slower_by:.0%} longer per step than the other ranks (median busy"
                f" {row.median_busy_s:.3g} s over its last {row.busy_samples} steps, the others'"
                f" {row.others_busy_s:.3g} s): every step waits for it; a slower or throttled"
                " GPU/CPU, or another job on the node"
            )
        for rank in sorted(self.named - set(found)):
            self.note(f"rank {rank} ({progress.rows[rank]['node']}) is no longer a straggler")
        self.named = set(found)


def hung(
    progress: Progress,
    *,
    all_exited: bool,
    startup_timeout: float | None,
    hang_timeout: float | None,
    note: Note,
    now: float,
) -> Hang | None:
    """The hang, said, when no rank advanced for the bound of the run's phase (`now`: Unix
    seconds); None while the run is not hung."""
    if all_exited:
        # (seen in CI: a loaded node's agent took longer than a 5 s hang timeout to end)
        return None
    startup = progress.in_startup
    phase = "startup" if startup else "finishing" if progress.finishing else "training"
    own_bound = phase != "training"
    timeout = startup_timeout if own_bound else hang_timeout
    stuck = progress.stuck_for(now=now)
    if timeout is None or stuck is None or stuck < timeout:
        return None
    if startup:
        what = f"no rank made startup progress for {stuck:.0f} s"
        what += f" (startup timeout {timeout:g} s)"
    elif own_bound:
        what = f"every rank ended its last step {stuck:.0f} s ago and the run has not ended"
        what += f" (startup timeout {timeout:g} s, also the bound for the end)"
    else:
        what = f"no rank advanced a step for {stuck:.0f} s (hang timeout {timeout:g} s)"
    note(f"{what}: dumping every rank's stack, then stopping every rank on every node")
    return Hang(stuck_s=round(stuck, 1), detected_at=now, phase=phase)


async def dump_stacks(
    progress: Progress,
    hang: Hang,
    *,
    run_dir: Path,
    dump: Callable[[dict], dict[str, str]],
    note: Note,
) -> Hang:
    """Every rank's stack (while they still run), then which ranks are behind and where:
    `hang` with its StackReport. `dump({node: {rank: pid}})` -> {node: what
    trainfleet.node.procs.dump_stacks printed} runs in a thread."""
    pids: dict[str, dict[int, int]] = {}
    for rank, row in progress.rows.items():
        if row.get("pid"):
            pids.setdefault(row["node"], {})[rank] = row["pid"]
    texts = await asyncio.get_running_loop().run_in_executor(None, dump, pids)
    dumps: dict[str, dict[int, str]] = {}
    records: dict[int, dict[str, Any] | None] = {}
    for node, text in texts.items():
        dumps[node] = {}
        for rank, part in stacks.split_dump(text).items():
            if rank in progress.nodes.get(node, ()):  # a node speaks for its own ranks
                records[rank], dumps[node][rank] = stacks.take_flight_record(part)
        stacks.write_dumps(run_dir, node, dumps[node])
    stacks.write_flight_records(run_dir, progress.rows, records)
    behind, said = [], []
    ranks_behind = progress.behind()
    for rank in ranks_behind:
        node = progress.rows[rank]["node"]
        stack = dumps.get(node, {}).get(rank)
        where = stacks.where_it_waits(stack) if stack else "no stack (no pid in its heartbeats)"
        behind.append(Behind(node=node, rank=rank, where=where))
        said.append(f"{node} rank {rank}: {printable(where)}")
    lowest = progress.rows[ranks_behind[0]]["step"]
    stuck = collectives.stuck_collectives(records, world_size=len(progress.rows))
    report = StackReport(
        step=lowest,
        behind=tuple(behind),
        stacks=str(run_dir / "stacks"),
        collectives=tuple(stuck),
        flight_records=tuple(sorted(r for r, v in records.items() if v)),
    )
    # What a rank's stack and Flight Recorder say is the node's text: printable here,
    # kept as it came in status.json (whose JSON escapes control characters).
    for line in said:
        note(f"behind at step {lowest}: {line}")
    nodes = {rank: row["node"] for rank, row in progress.rows.items()}
    for found in stuck:
        note(f"stuck in {printable(collectives.describe(found, nodes))}")
    if not stuck:
        note(printable(collectives.none_stuck(records, nodes)))
    return hang.dumped(report)
