"""Runs a launch's channels (one ssh to each node's bootstrap, or DeepSpeed's runner): output
merged with `[node:rank]` prefixes and written per rank (`launch/output.py`), fail-fast, the
join and hang watchdogs, and the same stop on every path. Which backend made the channels is
not its business (`launch/backend.py`).

    >>> channels = backend.start(plan, cluster, run_dir)  # doctest: +SKIP
    >>> result = supervise(plan, channels, run_dir=Path("runs/x"))  # doctest: +SKIP
    >>> result.exit_code  # doctest: +SKIP

Lifecycle of a run (RunState): STARTING -> RUNNING -> (DONE | FAILED | STALLED | HUNG |
INTERRUPTED). Heartbeats (`trainfleet.heartbeat`) are taken out of the output into
RUN_DIR/status.json (`launch/progress.py`), rewritten every STATUS_EVERY_S; with a hang
timeout, a run in which no rank advanced for that long is HUNG (before the first step, while
the ranks beat startup phases, the startup timeout is the bound): every rank's stack is dumped
(`launch/stacks.py`) and the collective it is stuck in read from every rank's Flight Recorder
(`launch/collectives.py`) before the stop.
Every exit from RUNNING other than DONE stops every node the same way: each channel is asked to
stop as its backend made it (`Channel.stop_by`: closing a node's bootstrap's stdin, which
SIGTERMs and then SIGKILLs every process of the job on that node, tracked by pid, never by
name; SIGINT to DeepSpeed's runner); a channel that has not ended after the grace period is
cut off here.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from trainfleet.catalog import FindingId
from trainfleet.launch import collectives, stacks
from trainfleet.launch.backend import Channel, Plan
from trainfleet.launch.output import MergedOutput, pump
from trainfleet.launch.rootcause import RankError
from trainfleet.status import rules as status_rules
from trainfleet.untrusted import printable

CUT_OFF_AFTER_S = 5
"""After a node's grace period: how long before its ssh is killed."""
SSH_DROPPED = 255
STATUS_EVERY_S = 1.0
STRAGGLERS_EVERY_S = 5.0
"""How often the launcher judges stragglers from the ranks' busy_s (`status/rules.py`)."""
KEEPALIVE_EVERY_S = 5.0
LIFELINE_S = 30.0
"""A bootstrap that has heard nothing from the launcher for this long stops its node's job
(`bootstrap.py`): the launcher writes an empty line to each every KEEPALIVE_EVERY_S. The
launcher's side gives up on a silent node after 15 s (ssh's ServerAliveInterval=5 x 3)."""


def channel_end(code: int) -> str:
    """A channel's end in words: ssh's 255 is its connection, a negative code a signal here."""
    if code == SSH_DROPPED:
        return "its connection dropped"
    if code < 0:
        return f"its connection ended: its ssh was killed by signal {-code}"
    return f"exit code {code}"


class RunState(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    STALLED = "stalled"
    """Not every rank joined the rendezvous within the join timeout."""
    INTERRUPTED = "interrupted"
    HUNG = "hung"
    """Every rank had joined, then no rank advanced a step for the hang timeout."""


def hang_headline(hang: dict) -> tuple[FindingId, str]:
    """A HUNG run's finding id and what happened, from its `hang` dict (status.json's)."""
    stuck = f"{hang.get('stuck_s', 0):.0f} s"
    if hang.get("phase") == "startup":
        return FindingId.STARTUP_TIMEOUT, f"no startup progress for {stuck}, before the first step"
    return FindingId.RANK_HUNG, f"no rank advanced past step {hang.get('step')} for {stuck}"


@dataclass(kw_only=True, slots=True)
class LaunchResult:
    state: RunState
    exit_code: int
    run_dir: Path
    seconds: float
    node_codes: dict[str, int | None]
    root_cause: RankError | None = None
    first_failure: str | None = None
    """The node whose command ended first with an error (or whose connection dropped)."""
    not_joined: dict[str, list[int]] = field(default_factory=dict)
    """STALLED: per node, the ranks that had not joined."""
    diagnosis: list = field(default_factory=list)
    """STALLED: doctor's findings between the nodes (filled by the caller)."""
    hang: dict | None = None
    """HUNG: `stuck_s`, `detected_at`, `step` (the lowest), `behind` (node, rank, where it
    waits), `stacks` (the dumps' directory); the same dict as status.json's `hang`."""
    restarts: list = field(default_factory=list)
    """The restarts before this run (`launch/restarts.py`), as given to `supervise`."""

    def to_json(self) -> dict:
        return {
            "state": self.state.value,
            "exit_code": self.exit_code,
            "run_dir": str(self.run_dir),
            "seconds": round(self.seconds, 3),
            "node_codes": self.node_codes,
            "root_cause": self.root_cause.to_json() if self.root_cause else None,
            "first_failure": self.first_failure,
            "not_joined": self.not_joined,
            "diagnosis": [f.to_json() for f in self.diagnosis],
            "hang": self.hang,
            "restarts": self.restarts,
        }


class _Run:
    def __init__(self, plan: Plan, run_dir: Path, out: IO[str]) -> None:
        self.plan = plan
        self.run_dir = run_dir
        self.started = time.monotonic()
        self.output = MergedOutput(plan, run_dir, out, self.started)
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.channels: dict[str, Channel] = {}
        self.pumps: list[asyncio.Task] = []
        self.codes: dict[str, int | None] = {}
        self.state = RunState.STARTING
        self.first_failure: str | None = None
        self.failure_code: int | None = None
        self.interrupted = asyncio.Event()
        self.not_joined: set[int] = set()
        self.status_written = 0.0
        self.keepalive_sent = 0.0
        self.stragglers_checked = 0.0
        self.stragglers: set[int] = set()

    async def start(self, channels: list[Channel]) -> None:
        for channel in channels:
            proc = await asyncio.create_subprocess_exec(
                *channel.argv,
                stdin=asyncio.subprocess.PIPE if channel.has_stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # Ctrl-C reaches trainfleet, which stops nodes in order
                cwd=channel.cwd,
                env=channel.env,
            )
            if channel.payload:
                proc.stdin.write(channel.payload)
                await proc.stdin.drain()
            self.procs[channel.name] = proc
            self.channels[channel.name] = channel
            self.codes[channel.name] = None
            for name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr)):
                task = asyncio.ensure_future(pump(stream, channel, name, self.output))
                task.add_done_callback(functools.partial(self._pump_ended, channel.name, name))
                self.pumps.append(task)
        self.state = RunState.RUNNING

    def _pump_ended(self, node: str, stream: str, task: asyncio.Task) -> None:
        """A pump ends with its stream; one that raised (a bug: a line's errors are caught in
        it) is said at once, not lost in a task nobody awaits."""
        if not task.cancelled() and task.exception() is not None:
            self.output.note(
                f"reading {node}'s {stream} stopped ({printable(repr(task.exception()))}): a"
                " trainfleet bug, please report it; that node's ranks may block writing output"
            )

    def _failed(self, where: str, code: int) -> None:
        self.state = RunState.FAILED
        self.first_failure, self.failure_code = where, code
        why = channel_end(code)
        self.output.note(f"{where} failed ({why}): stopping every rank on every node")

    async def watch(self) -> None:
        """Until every node is done, one fails, the watchdog fires or the user interrupts."""
        waits = {asyncio.ensure_future(proc.wait()): name for name, proc in self.procs.items()}
        interrupted = asyncio.ensure_future(self.interrupted.wait())
        while waits:
            done, _ = await asyncio.wait(
                [*waits, interrupted], timeout=0.25, return_when=asyncio.FIRST_COMPLETED
            )
            if interrupted in done:
                self.state = RunState.INTERRUPTED
                self.output.note("interrupted: stopping every rank on every node")
                break
            for task in [t for t in done if t in waits]:
                name = waits.pop(task)
                self.codes[name] = task.result()
                if task.result() != 0 and self.state is RunState.RUNNING:
                    self._failed(name, task.result())
            # pdsh (deepspeed backend) says when one node's command has ended, and how.
            node_failure = next(((n, c) for n, c in self.output.node_exits if c != 0), None)
            if node_failure and self.state is RunState.RUNNING:
                self._failed(*node_failure)
            if self.state is RunState.FAILED:
                break
            not_joined = self.output.joins.stalled(
                self.started, time.monotonic(), self.plan.options.join_timeout
            )
            if not_joined is not None and waits:
                self.state = RunState.STALLED
                self.not_joined = not_joined
                self.output.note(
                    f"not every rank joined the rendezvous within "
                    f"{self.plan.options.join_timeout:.0f} s: stopping every rank on every node"
                )
                break
            self.write_status()
            self._keepalive()
            self._judge_stragglers()
            if self._hung():
                break
        else:
            self.state = RunState.DONE
            self._nothing_ran()
        interrupted.cancel()
        if self.state is not RunState.DONE:
            self.output.note(f"what the nodes print while stopping is in {self.output.log_dir}")
            self.output.quiet = True

    def _nothing_ran(self) -> None:
        """Every launcher ended with 0 but no rank ever said it started (every rank's first
        code, the shim, says so before anything else): nothing ran, whatever the exit codes.
        DeepSpeed's runner exits 0 when pdsh is ended by a signal (it passes on only positive
        codes), and its ranks' output is then lost with it."""
        if not self.codes or self.output.joins.started or not self.plan.world_size:
            return
        where = ", ".join(sorted(self.codes))
        self.state = RunState.FAILED
        self.first_failure, self.failure_code = where, 1
        self.output.note(
            f"{where} ended with exit code 0, but no rank ever started (not one start mark "
            "came back): nothing ran; DeepSpeed's runner exits 0 when pdsh is ended by a signal"
        )

    def write_status(self, *, now: float | None = None, force: bool = False) -> None:
        now = time.time() if now is None else now
        if force or now - self.status_written >= STATUS_EVERY_S:
            self.output.progress.write(
                self.run_dir / "status.json", state=self.state.value, now=now
            )
            self.status_written = now

    def _keepalive(self) -> None:
        """An empty line to every bootstrap: it stops its job when they stop coming."""
        now = time.monotonic()
        if now - self.keepalive_sent < KEEPALIVE_EVERY_S:
            return
        self.keepalive_sent = now
        for name, proc in self.procs.items():
            if proc.returncode is None:
                self.channels[name].keep_alive(proc)

    def _judge_stragglers(self) -> None:
        """Says once when a rank becomes a straggler (its median busy_s above the others' by
        more than status's margin), and once when it no longer is."""
        now = time.monotonic()
        if now - self.stragglers_checked < STRAGGLERS_EVERY_S:
            return
        self.stragglers_checked = now
        progress = self.output.progress
        found = status_rules.stragglers(progress.rank_rows())
        for rank in sorted(set(found) - self.stragglers):
            row = found[rank]
            self.output.note(
                f"{FindingId.RANK_STRAGGLER}: rank {rank} ({row.node}) computes"
                f" {row.slower_by:.0%} longer per step than the other ranks (median busy"
                f" {row.median_busy_s:.3g} s over its last {row.busy_samples} steps, the others'"
                f" {row.others_busy_s:.3g} s): every step waits for it; a slower or throttled"
                " GPU/CPU, or another job on the node"
            )
        for rank in sorted(self.stragglers - set(found)):
            self.output.note(f"rank {rank} ({progress.rows[rank]['node']}) is no longer a"
                             " straggler")  # fmt: skip
        self.stragglers = set(found)

    def _hung(self) -> bool:
        """No rank advanced for the bound of the run's phase: the startup timeout before the
        first step (only startup beats so far), the hang timeout from it on."""
        progress = self.output.progress
        if self.output.joins.all_exited:
            # Every rank has ended: what still runs is the nodes' launchers (torchrun's agents
            # meet at an exit barrier), whose end watch() sees; silence now is no hang (seen in
            # CI: a loaded node's agent took longer than a 5 s hang timeout to end).
            return False
        startup = progress.in_startup
        # Before the first step and after the last, no step advances for a while by design
        # (loading, tokenizing; the final save, an export): their own bound.
        phase = "startup" if startup else "finishing" if progress.finishing else "training"
        own_bound = phase != "training"
        timeout = self.plan.options.startup_timeout if own_bound else self.plan.options.hang_timeout
        stuck = progress.stuck_for(now=time.time())
        if timeout is None or stuck is None or stuck < timeout:
            return False
        self.state = RunState.HUNG
        progress.hang = {"stuck_s": round(stuck, 1), "detected_at": time.time(),
                         "phase": phase}  # fmt: skip
        if startup:
            what = f"no rank made startup progress for {stuck:.0f} s"
            what += f" (startup timeout {timeout:g} s)"
        elif own_bound:
            what = f"every rank ended its last step {stuck:.0f} s ago and the run has not ended"
            what += f" (startup timeout {timeout:g} s, also the bound for the end)"
        else:
            what = f"no rank advanced a step for {stuck:.0f} s (hang timeout {timeout:g} s)"
        self.output.note(
            f"{what}: dumping every rank's stack, then stopping every rank on every node"
        )
        return True

    async def dump_stacks(self, dump: Callable[[dict], dict[str, str]]) -> None:
        """Every rank's stack (while they still run), then which ranks are behind and where."""
        progress = self.output.progress
        pids: dict[str, dict[int, int]] = {}
        for rank, row in progress.rows.items():
            if row.get("pid"):
                pids.setdefault(row["node"], {})[rank] = row["pid"]
        texts = await asyncio.get_running_loop().run_in_executor(None, dump, pids)
        dumps, records = {}, {}
        for node, text in texts.items():
            dumps[node] = {}
            for rank, part in stacks.split_dump(text).items():
                if rank in progress.nodes.get(node, ()):  # a node speaks for its own ranks
                    records[rank], dumps[node][rank] = stacks.take_flight_record(part)
            stacks.write_dumps(self.run_dir, node, dumps[node])
        stacks.write_flight_records(self.run_dir, progress.rows, records)
        behind = []
        ranks_behind = progress.behind()
        for rank in ranks_behind:
            node = progress.rows[rank]["node"]
            text = dumps.get(node, {}).get(rank)
            where = stacks.where_it_waits(text) if text else "no stack (no pid in its heartbeats)"
            behind.append({"node": node, "rank": rank, "where": where})
        lowest = progress.rows[ranks_behind[0]]["step"]
        stuck = collectives.stuck_collectives(records, world_size=len(progress.rows))
        progress.hang = {**(progress.hang or {}), "step": lowest, "behind": behind,
                         "stacks": str(self.run_dir / "stacks"), "collectives": stuck,
                         "flight_records": sorted(r for r, v in records.items() if v)}  # fmt: skip
        # What a rank's stack and Flight Recorder say is the node's text: printable here,
        # kept as it came in status.json (whose JSON escapes control characters).
        for entry in behind:
            self.output.note(
                f"behind at step {lowest}: {entry['node']} rank {entry['rank']}: "
                + printable(entry["where"])
            )
        nodes = {rank: row["node"] for rank, row in progress.rows.items()}
        for found in stuck:
            self.output.note(f"stuck in {printable(collectives.describe(found, nodes))}")
        if not stuck:
            self.output.note(printable(collectives.none_stuck(records, nodes)))

    async def stop(self) -> None:
        """Ask every channel to stop as it says (a bootstrap's stdin closed: it stops its
        node's job; SIGINT to DeepSpeed's runner: it stops its nodes); past the grace period,
        kill what is left here."""
        stop_started = time.monotonic()
        running = {n: p for n, p in self.procs.items() if p.returncode is None}
        for name, proc in running.items():
            self.channels[name].ask_to_stop(proc)
        if running:
            limit = self.plan.options.grace + CUT_OFF_AFTER_S
            await asyncio.wait(
                [asyncio.ensure_future(p.wait()) for p in running.values()], timeout=limit
            )
            for name, proc in running.items():
                if proc.returncode is None:
                    self.output.note(f"{name} did not stop within {limit:.0f} s: cutting it off")
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                    await proc.wait()
        for name, proc in self.procs.items():
            if self.codes.get(name) is None:
                self.codes[name] = proc.returncode
        took = time.monotonic() - stop_started
        # A node whose connection was lost or cut here never confirmed that its job ended.
        lost = [
            n for n, code in self.codes.items()
            if self.channels[n].lifeline and code is not None and (code == SSH_DROPPED or code < 0)
        ]  # fmt: skip
        if lost and self.state is not RunState.DONE:
            self.output.note(
                f"stopped ({took:.1f} s after the stop began), but {', '.join(lost)} could not"
                " confirm it (connection lost): a node's bootstrap stops its ranks itself once"
                f" it has heard nothing from here for {LIFELINE_S:.0f} s; to check once it"
                " answers: trainfleet exec [cluster options] -- ps -eo pid,args"
                f" ({FindingId.ORPHAN_PROCESSES})"
            )
        elif running and self.state is not RunState.DONE:
            self.output.note(f"every rank on every node stopped, {took:.1f} s after the stop began")
        if self.pumps:
            await asyncio.wait(self.pumps, timeout=2)

    def result(self) -> LaunchResult:
        root = None
        if self.state is RunState.FAILED:
            root = self.output.tracker.root_cause(self.first_failure)
        elif self.state is not RunState.DONE:
            # Stalled: the cause is the diagnosis; interrupted: the user. Unless a rank erred.
            root = self.output.tracker.root_cause()
            root = root if root and not root.consequence else None
        exit_code = 0
        if self.state is RunState.FAILED:
            code = self.failure_code or 1
            exit_code = root.exitcode if root and root.exitcode and root.exitcode > 0 else code
        elif self.state is RunState.INTERRUPTED:
            exit_code = 130
        elif self.state in (RunState.STALLED, RunState.HUNG):
            exit_code = 1
        ranges = self.plan.rank_ranges()
        by_node: dict[str, list[int]] = {}
        for rank in sorted(self.not_joined):
            node = next((h for h, r in ranges.items() if rank in r), "?")
            by_node.setdefault(node, []).append(rank)
        codes = dict(self.codes)
        codes.update(self.output.node_exits)
        return LaunchResult(
            state=self.state,
            exit_code=exit_code,
            run_dir=self.run_dir,
            seconds=time.monotonic() - self.started,
            node_codes=codes,
            root_cause=root,
            first_failure=self.first_failure,
            not_joined=by_node,
            hang=self.output.progress.hang,
        )


async def _supervise(
    plan: Plan,
    channels: list[Channel],
    run_dir: Path,
    out: IO[str],
    diagnose: Callable[[], list] | None,
    dump_stacks: Callable[[dict], dict[str, str]] | None = None,
    restarts: list | None = None,
) -> LaunchResult:
    run = _Run(plan, run_dir, out)
    run.output.progress.restarts = list(restarts or [])
    loop = asyncio.get_running_loop()
    # The caller's own handlers come back afterwards: asyncio's removal would leave the
    # defaults (a program or test harness that runs a launch keeps its SIGTERM handling).
    callers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in callers:
        loop.add_signal_handler(sig, run.interrupted.set)
    diagnosis = None
    try:
        await run.start(channels)
        await run.watch()
        if run.state is RunState.STALLED and diagnose is not None:
            run.output.note("asking doctor why, while the ranks stop")
            diagnosis = loop.run_in_executor(None, diagnose)
        if run.state is RunState.HUNG and dump_stacks is not None:
            await run.dump_stacks(dump_stacks)
    finally:
        await run.stop()
        run.write_status(force=True)
        for sig, handler in callers.items():
            loop.remove_signal_handler(sig)
            if handler is not None:  # None: not set from Python
                signal.signal(sig, handler)
        run.output.close()
    result = run.result()
    result.restarts = run.output.progress.restarts
    if diagnosis is not None:
        result.diagnosis = await diagnosis
        result.seconds = time.monotonic() - run.started
    return result


def supervise(
    plan: Plan,
    channels: list[Channel],
    *,
    run_dir: Path,
    out: IO[str] | None = None,
    diagnose: Callable[[], list] | None = None,
    dump_stacks: Callable[[dict], dict[str, str]] | None = None,
    restarts: list | None = None,
) -> LaunchResult:
    """Run `channels` to their end: each rank's output goes to `run_dir/logs/NODE.rankN.log`
    (NODE.log for lines of no rank). `diagnose` runs (in a thread, while the ranks stop) when
    not every rank joined; its findings go into the result. `dump_stacks({node: {rank: pid}})`
    -> {node: what trainfleet.node.procs.dump_stacks printed} runs when the run hangs, before
    the stop."""
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    return asyncio.run(
        _supervise(plan, channels, run_dir, out or sys.stdout, diagnose, dump_stacks, restarts)
    )
