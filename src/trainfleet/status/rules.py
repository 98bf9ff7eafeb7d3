"""How a status.json becomes the status view: ETA, stragglers, silent ranks, notes (pure).

    >>> rows = [{"rank": r, "node": "n1", "step": 40, "total_steps": 100, "last_beat_at": 99.0,
    ...          "step_times_s": [2.0] * 5, "busy_times_s": [busy] * 5}
    ...         for r, busy in enumerate([1.0, 1.0, 1.5])]
    >>> doc = {"run_id": "r1", "state": "running", "started_at": 0.0, "updated_at": 99.5,
    ...        "world_size": 3, "nodes": {"n1": [0, 1, 2]}, "ranks": rows}
    >>> view = build_view(doc, now=100.0)
    >>> view.eta_s, view.stragglers, view.ranks[2].slower_by  # 60 steps x 2.0 s; 1.5 / 1.0 s
    (120.0, [2], 0.5)

ETA: the steps a rank has left x the median of its recent seconds per step; the job's is its
slowest rank's. Stragglers: in synchronous data-parallel training every rank's step takes as
long as the slowest rank's, so step times look alike and are never used for this; only
`busy_s` (the seconds a rank computed rather than waited, `trainfleet.heartbeat`) tells the
slow one apart. A rank is a straggler when the median of its recent busy_s (at least
MIN_BUSY_SAMPLES) exceeds the median of the other ranks' medians by more than the margin
(MARGIN: 20%). A rank is silent when, while the run lives, its last heartbeat is older than
SILENT_FACTOR x its median step time, and at least SILENT_MIN_S, unless it said it is in
another phase than training (saving a checkpoint: no step for a while is expected).
"""

from __future__ import annotations

from statistics import median
from typing import Any

from trainfleet.heartbeat import STEPPING_PHASES
from trainfleet.status.hang import Hang
from trainfleet.status.human import duration
from trainfleet.status.view import (
    LIVE_STATES,
    NodeRow,
    RankRow,
    StatusView,
    exit_code,
    fold_ranks,
)

MARGIN = 0.20
"""A straggler's median busy_s is more than this above the median over all ranks (0.2: 20%)."""
MIN_BUSY_SAMPLES = 5
SILENT_FACTOR = 5
SILENT_MIN_S = 30.0
STALE_AFTER_S = 30.0
"""The launcher rewrites status.json every second: a live run's file older than this has lost
its launcher (killed, or its machine is down)."""


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _rank_row(row: dict[str, Any], *, live: bool, clock: float) -> RankRow:
    step, total, last = row.get("step"), row.get("total_steps"), row.get("last_beat_at")
    step_times, busy_times = row.get("step_times_s") or [], row.get("busy_times_s") or []
    median_step = median(step_times) if step_times else None
    eta = None
    if live and step is not None and total and median_step is not None:
        eta = max(total - step, 0) * median_step
    since = None if last is None else max(clock - last, 0.0)
    silent_after = max(SILENT_FACTOR * (median_step or 0.0), SILENT_MIN_S)
    enough_busy = len(busy_times) >= MIN_BUSY_SAMPLES
    return RankRow(
        rank=row["rank"],
        node=row["node"],
        step=step,
        total_steps=total,
        loss=row.get("loss"),
        tokens_per_s=row.get("tokens_per_s"),
        memory_bytes=row.get("memory_bytes"),
        phase=row.get("phase"),
        pid=row.get("pid"),
        since_beat_s=_round(since, 1),
        median_step_s=_round(median_step, 4),
        median_busy_s=_round(median(busy_times), 4) if enough_busy else None,
        busy_samples=len(busy_times),
        eta_s=_round(eta, 1),
        silent=live
        and since is not None
        and since > silent_after
        and row.get("phase") in STEPPING_PHASES,
        silent_after_s=round(silent_after, 1),
    )


def _judge_stragglers(ranks: list[RankRow], margin: float) -> tuple[str, float | None]:
    """Fills each rank's slower_by and straggler; returns (the check's outcome, the reference)."""
    if len(ranks) == 1:
        return "one rank", None
    if not any(r.busy_samples for r in ranks):
        return "no busy_s", None
    ready = [(r, r.median_busy_s) for r in ranks if r.median_busy_s is not None]
    if len(ready) < 2:
        return "too few samples", None
    reference = median(busy for _, busy in ready)
    if reference <= 0:
        return "too few samples", None
    for r, busy in ready:
        # Against the others, not all: with two ranks the median of all is their mean, and a
        # rank 40% slower than the other would be only 17% above it.
        others = median(other_busy for x, other_busy in ready if x is not r)
        if others <= 0:
            continue
        r.others_busy_s = round(others, 4)
        r.slower_by = round(busy / others - 1, 3)
        r.straggler = r.slower_by > margin
    return "ok", round(reference, 4)


def stragglers(ranks: list[dict[str, Any]], *, margin: float = MARGIN) -> dict[int, RankRow]:
    """The straggler ranks of status.json's `ranks` rows, judged as `build_view` judges them
    (what the launcher checks while the run goes on).

    >>> rows = [{"rank": r, "node": "n", "busy_times_s": [b] * 5} for r, b in enumerate([1, 1, 2])]
    >>> {r: row.slower_by for r, row in stragglers(rows).items()}
    {2: 1.0}
    """
    judged = [_rank_row(row, live=False, clock=0.0) for row in ranks]
    _judge_stragglers(judged, margin)
    return {r.rank: r for r in judged if r.straggler}


def _slowest(rows: list[RankRow]) -> int | None:
    timed = [(r.median_busy_s, r) for r in rows if r.median_busy_s is not None]
    if timed:
        return max(timed, key=lambda pair: pair[0])[1].rank
    if not rows:
        return None
    behind = min(rows, key=lambda r: (-1 if r.step is None else r.step, -(r.since_beat_s or 0)))
    return behind.rank


def _node_row(node: str, rows: list[RankRow]) -> NodeRow:
    steps = [r.step for r in rows if r.step is not None]
    tokens = [r.tokens_per_s for r in rows if r.tokens_per_s is not None]
    memory = [r.memory_bytes for r in rows if r.memory_bytes is not None]
    since = [r.since_beat_s for r in rows if r.since_beat_s is not None]
    return NodeRow(
        node=node,
        ranks=[r.rank for r in rows],
        min_step=min(steps, default=None),
        max_step=max(steps, default=None),
        since_beat_s=max(since, default=None),
        tokens_per_s=_round(sum(tokens), 1) if tokens else None,
        memory_bytes=max(memory, default=None),
        slowest_rank=_slowest(rows),
        flagged=[r.rank for r in rows if r.straggler or r.silent],
    )


def build_view(
    status: dict[str, Any],
    *,
    now: float,
    margin: float = MARGIN,
    status_file: str = "",
    launcher_gone: bool | None = None,
) -> StatusView:
    """The view of a checked status.json (`rundir.check_status`) at Unix time `now`;
    `launcher_gone`: whether the launcher process has ended, when that can be known."""
    state = status["state"]
    live = state in LIVE_STATES
    # Once the run ended, "since the last heartbeat" counts to its last word, not to now.
    clock = now if live else status["updated_at"]
    ranks = [_rank_row(row, live=live, clock=clock) for row in status["ranks"]]
    check, reference = _judge_stragglers(ranks, margin)
    by_node: dict[str, list[RankRow]] = {node: [] for node in status.get("nodes") or {}}
    for r in ranks:
        by_node.setdefault(r.node, []).append(r)
    steps = [r.step for r in ranks if r.step is not None]
    totals = [r.total_steps for r in ranks if r.total_steps]
    etas = [r.eta_s for r in ranks if r.eta_s is not None]
    restarts = status.get("restarts") or []
    updated_ago = max(now - status["updated_at"], 0.0)
    view = StatusView(
        run_id=status["run_id"],
        state=state,
        live=live,
        exit_code=exit_code(state),
        status_file=status_file,
        now=round(now, 3),
        updated_ago_s=round(updated_ago, 1),
        stale=live and (updated_ago > STALE_AFTER_S or bool(launcher_gone)),
        launcher_gone=bool(live and launcher_gone),
        elapsed_s=round(max(clock - status["started_at"], 0.0), 1),
        world_size=status["world_size"],
        restarts=len(restarts),
        last_restart=restarts[-1] if restarts else None,
        hang=Hang.from_json(status["hang"]) if status.get("hang") is not None else None,
        launcher=status.get("launcher"),
        hang_timeout_s=status.get("hang_timeout_s"),
        startup_timeout_s=status.get("startup_timeout_s"),
        # (a file from before startup was tracked has no training_started_at at all)
        starting_up="training_started_at" in status
        and status["training_started_at"] is None
        and any(r.step is not None for r in ranks),
        step=min(steps, default=None),
        total_steps=max(totals, default=None),
        eta_s=max(etas, default=None),
        margin=margin,
        straggler_check=check,
        reference_busy_s=reference,
        stragglers=[r.rank for r in ranks if r.straggler],
        silent=[r.rank for r in ranks if r.silent],
        not_beaten=[r.rank for r in ranks if r.step is None],
        nodes=[_node_row(node, rows) for node, rows in by_node.items()],
        ranks=ranks,
    )
    view.notes = _notes(view)
    return view


def _notes(view: StatusView) -> list[str]:
    """The view's findings in words, in the order a reader needs them."""
    notes = []
    if view.launcher_gone:
        launcher = view.launcher or {}
        notes.append(
            f"the launcher (pid {launcher.get('pid')} on {launcher.get('host')}) is no longer"
            " running: this is its last word, not the job's state now"
        )
    elif view.stale:
        notes.append(
            f"status.json was last rewritten {duration(view.updated_ago_s)} ago (every second "
            "while the launcher runs): the launcher is gone (killed, or its machine is down), "
            "so this is its last word, not the job's state now"
        )
    for r in view.ranks:
        if r.straggler:
            notes.append(
                f"straggler: rank {r.rank} ({r.node}): median busy {r.median_busy_s:.3g} s per "
                f"step over its last {r.busy_samples}, {r.slower_by:.0%} above the median of the "
                f"other ranks ({r.others_busy_s:.3g} s; margin {view.margin:.0%}): every rank "
                "waits for it"
            )
    for r in view.ranks:
        if r.silent:
            notes.append(
                f"silent: rank {r.rank} ({r.node}): no heartbeat for {duration(r.since_beat_s)} "
                f"(more than {SILENT_FACTOR} x its median step, at least {SILENT_MIN_S:.0f} s)"
            )
        elif (
            view.live
            and r.phase not in STEPPING_PHASES
            and (r.since_beat_s or 0) > (r.silent_after_s or 0)
        ):
            notes.append(
                f"rank {r.rank} ({r.node}) is {r.phase}: no new step for "
                f"{duration(r.since_beat_s)}, not silent while {r.phase} (the hang watchdog "
                "judges it by --hang-timeout)"
            )
    if view.not_beaten:
        everyone = len(view.not_beaten) == view.world_size
        plural = "s" if len(view.not_beaten) > 1 else ""
        who = "any rank" if everyone else f"rank{plural} {fold_ranks(view.not_beaten)}"
        if not view.live:
            why = " in the whole run"
        elif everyone:
            why = (
                " yet: still starting, or the script never calls trainfleet.heartbeat.beat() "
                "(trainfleet train does)"
            )
        else:
            why = " yet: stuck before its first step, or the script beats on some ranks only"
        notes.append(f"no heartbeat from {who}{why}")
    if view.straggler_check == "no busy_s" and len(view.not_beaten) < view.world_size:
        notes.append(
            "stragglers: cannot be told without busy_s, which no rank reports (every rank's "
            "step lasts as long as the slowest's, so step times look alike): pass busy_s= "
            "(seconds computing, not waiting) to trainfleet.heartbeat.beat()"
        )
    elif view.straggler_check == "too few samples":
        fewest = min((r.busy_samples for r in view.ranks if r.step is not None), default=0)
        notes.append(
            f"stragglers: not judged yet, {MIN_BUSY_SAMPLES} busy_s samples per rank needed "
            f"(fewest so far: {fewest})"
        )
    elif view.straggler_check == "ok":
        unjudged = [r.rank for r in view.ranks if r.median_busy_s is None]
        if unjudged:
            notes.append(
                f"rank{'s' if len(unjudged) > 1 else ''} {fold_ranks(unjudged)}: fewer than "
                f"{MIN_BUSY_SAMPLES} busy_s samples, not judged as stragglers"
            )
    return notes
