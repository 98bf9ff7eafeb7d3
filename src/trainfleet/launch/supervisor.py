"""Runs a launch's channels (one ssh to each node's bootstrap, or DeepSpeed's runner): output
merged with `[node:rank]` prefixes and written per rank (`launch/output.py`), fail-fast, the
join and hang watchdogs, and the same stop on every path. Which backend made the channels is
not its business (`launch/backend.py`).

    >>> channels = backend.start(plan, cluster, run_dir)  # doctest: +SKIP
    >>> result = supervise(plan, channels, run_dir=Path("runs/x"))  # doctest: +SKIP
    >>> result.exit_code  # doctest: +SKIP

A run goes through RunState's lifecycle (`launch/result.py`, with the LaunchResult it ends
with). Heartbeats (`trainfleet.heartbeat`) are taken out of the output into
RUN_DIR/status.json (`launch/progress.py`), rewritten every STATUS_EVERY_S; with a hang
timeout, a run in which no rank advanced for that long is HUNG (before the first step, while
the ranks beat startup phases, the startup timeout is the bound): every rank's stack is dumped
and the collective it is stuck in read from every rank's Flight Recorder before the stop
(`launch/watchdogs.py`, with the straggler judge). What the output said is the run's facts
(`launch/runfacts.py`): joins, progress, errors.
Every exit from RUNNING other than DONE stops every node the same way: each channel is asked to
stop as its backend made it (`Channel.stop_by`: closing a node's bootstrap's stdin, which
SIGTERMs and then SIGKILLs every process of the job on that node, tracked by pid, never by
name; SIGINT to DeepSpeed's runner); a channel that has not ended after the grace period is
cut off here.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from trainfleet.catalog import FindingId
from trainfleet.launch import watchdogs
from trainfleet.launch.backend import KEEPALIVE_EVERY_S, LIFELINE_S, Channel, Plan
from trainfleet.launch.output import MergedOutput, TextOut, pump
from trainfleet.launch.result import SSH_DROPPED, LaunchResult, RunState, channel_end, exit_code
from trainfleet.launch.runfacts import RunFacts
from trainfleet.untrusted import printable

CUT_OFF_AFTER_S = 5
"""After a node's grace period: how long before its ssh is killed."""
STATUS_EVERY_S = 1.0
PUMP_DRAIN_S = 2.0
"""How long, once a channel of several nodes has ended, its last lines may take to be read."""


class _Run:
    """One run of the channels: the processes, the state (RunState), the facts the output gave
    (`self.facts`) and the watchdogs' verdicts; `result()` once it has ended."""

    def __init__(self, plan: Plan, run_dir: Path, out: TextOut) -> None:
        self.plan = plan
        self.run_dir = run_dir
        self.started = time.monotonic()
        self.facts = RunFacts(plan)
        """What the output has said: joins, progress (status.json), errors, nodes' ends."""
        self.output = MergedOutput(plan, run_dir, out, self.started, self.facts)
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.channels: dict[str, Channel] = {}
        self.pumps: dict[str, list[asyncio.Task]] = {}
        """Each channel's stdout and stderr readers."""
        self.codes: dict[str, int | None] = {}
        self.state = RunState.STARTING
        self.first_failure: str | None = None
        self.failure_code: int | None = None
        self.interrupted = asyncio.Event()
        self.signalled: str | None = None
        """SIGUSR1/2 this process got and passed on to every rank (a Slurm job's time-limit
        signal, `--requeue`)."""
        self.not_joined: set[int] = set()
        self.status_written = 0.0
        self.keepalive_sent = 0.0
        self.stragglers = watchdogs.Stragglers(self.output.note)

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
            # asyncio types the pipes Optional; those used here were asked for just above (a
            # payload is stdin: has_stdin).
            assert proc.stdout is not None and proc.stderr is not None
            if channel.payload:
                assert proc.stdin is not None
                proc.stdin.write(channel.payload)
                try:
                    await proc.stdin.drain()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # it ended before reading it (srun or ssh refused): `watch` says how
            self.procs[channel.name] = proc
            self.channels[channel.name] = channel
            self.codes[channel.name] = None
            for name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr)):
                task = asyncio.ensure_future(pump(stream, channel, name, self.output))
                task.add_done_callback(functools.partial(self._pump_ended, channel.name, name))
                self.pumps.setdefault(channel.name, []).append(task)
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
            ended = {waits.pop(t): t.result() for t in done if t in waits}
            for name, code in ended.items():
                self.codes[name] = code
                pumps = self.pumps.get(name)
                if self.channels[name].demux is not None and pumps:
                    # Its last lines may say which of its nodes ended first, and how.
                    await asyncio.wait(pumps, timeout=PUMP_DRAIN_S)
            # pdsh (deepspeed backend) and srun (slurm) say when one node's command has ended,
            # and how: that node failed, rather than the channel that carried its output.
            node_failure = next(((n, c) for n, c in self.facts.node_exits if c != 0), None)
            if node_failure and self.state is RunState.RUNNING:
                self._failed(*node_failure)
            for name, code in ended.items():
                if code != 0 and self.state is RunState.RUNNING:
                    self._failed(name, code)
            if self.state is RunState.FAILED:
                break
            if waits and self._stalled():
                break
            self.write_status()
            self._keepalive()
            self.stragglers.judge(self.facts.progress, now=time.monotonic())
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
        if not self.codes or self.facts.joins.started or not self.plan.world_size:
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
            self.facts.progress.write(self.run_dir / "status.json", state=self.state.value, now=now)
            self.status_written = now

    def pass_on(self, sig: signal.Signals) -> None:
        """A signal to this process goes to every rank on every node (their bootstraps)."""
        name = sig.name.removeprefix("SIG")
        self.signalled = name
        reached = [
            node
            for n, p in self.procs.items() if self.channels[n].pass_signal(p, name)
            for node in self.channels[n].reaches
        ]  # fmt: skip
        self.output.note(f"got SIG{name}: passed on to the ranks on {', '.join(reached) or 'none'}")

    def _keepalive(self) -> None:
        """An empty line to every bootstrap: it stops its job when they stop coming."""
        now = time.monotonic()
        if now - self.keepalive_sent < KEEPALIVE_EVERY_S:
            return
        self.keepalive_sent = now
        for name, proc in self.procs.items():
            if proc.returncode is None:
                self.channels[name].keep_alive(proc)

    def _stalled(self) -> bool:
        """The join watchdog (`launch/watchdogs.py`): True once it fired."""
        not_joined = watchdogs.not_joined(
            self.facts.joins,
            started_at=self.started,
            timeout=self.plan.options.join_timeout,
            note=self.output.note,
            now=time.monotonic(),
        )
        if not_joined is None:
            return False
        self.state, self.not_joined = RunState.STALLED, not_joined
        return True

    def _hung(self) -> bool:
        """The hang watchdog (`launch/watchdogs.py`): True once it fired."""
        hang = watchdogs.hung(
            self.facts.progress,
            all_exited=self.facts.joins.all_exited,
            startup_timeout=self.plan.options.startup_timeout,
            hang_timeout=self.plan.options.hang_timeout,
            note=self.output.note,
            now=time.time(),
        )
        if hang is None:
            return False
        self.state, self.facts.progress.hang = RunState.HUNG, hang
        return True

    async def dump_stacks(self, dump: Callable[[dict], dict[str, str]]) -> None:
        """Every rank's stack, into the hang record (`watchdogs.dump_stacks`)."""
        progress = self.facts.progress
        # Called for a HUNG run only: _hung sets the state and the hang together.
        assert progress.hang is not None
        progress.hang = await watchdogs.dump_stacks(
            progress, progress.hang, run_dir=self.run_dir, dump=dump, note=self.output.note
        )

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
            node
            for n, code in self.codes.items()
            if self.channels[n].lifeline and code is not None and (code == SSH_DROPPED or code < 0)
            for node in self.channels[n].reaches
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
        pumps = [task for tasks in self.pumps.values() for task in tasks]
        if pumps:
            await asyncio.wait(pumps, timeout=2)

    def result(self) -> LaunchResult:
        root = None
        if self.state is RunState.FAILED:
            root = self.facts.tracker.root_cause(self.first_failure)
        elif self.state is not RunState.DONE:
            # Stalled: the cause is the diagnosis; interrupted: the user. Unless a rank erred.
            root = self.facts.tracker.root_cause()
            root = root if root and not root.consequence else None
        ranges = self.plan.rank_ranges()
        by_node: dict[str, list[int]] = {}
        for rank in sorted(self.not_joined):
            node = next((h for h, r in ranges.items() if rank in r), "?")
            by_node.setdefault(node, []).append(rank)
        codes = dict(self.codes)
        codes.update(self.facts.node_exits)
        return LaunchResult(
            state=self.state,
            exit_code=exit_code(self.state, self.failure_code, root),
            run_dir=self.run_dir,
            seconds=time.monotonic() - self.started,
            node_codes=codes,
            root_cause=root,
            first_failure=self.first_failure,
            not_joined=by_node,
            hang=self.facts.progress.hang,
        )


async def _supervise(
    plan: Plan,
    channels: list[Channel],
    run_dir: Path,
    out: TextOut,
    diagnose: Callable[[], list] | None,
    dump_stacks: Callable[[dict], dict[str, str]] | None = None,
    restarts: list | None = None,
) -> LaunchResult:
    run = _Run(plan, run_dir, out)
    run.facts.progress.restarts = list(restarts or [])
    loop = asyncio.get_running_loop()
    # The caller's own handlers come back afterwards: asyncio's removal would leave the
    # defaults (a program or test harness that runs a launch keeps its SIGTERM handling).
    callers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in callers:
        loop.add_signal_handler(sig, run.interrupted.set)
    passed = (signal.SIGUSR1, signal.SIGUSR2)
    callers.update({sig: signal.getsignal(sig) for sig in passed})
    for sig in passed:
        loop.add_signal_handler(sig, run.pass_on, sig)
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
    result.restarts = run.facts.progress.restarts
    result.signalled = run.signalled
    if diagnosis is not None:
        result.diagnosis = await diagnosis
        result.seconds = time.monotonic() - run.started
    return result


def supervise(
    plan: Plan,
    channels: list[Channel],
    *,
    run_dir: Path,
    out: TextOut | None = None,
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
