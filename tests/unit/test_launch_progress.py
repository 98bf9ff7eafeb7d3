"""Heartbeats from ranks to status.json: what advances, what the hang watchdog measures, which
ranks are behind, and the lines the supervisor takes out of the output."""

from __future__ import annotations

import io
import json
import os
import time

from trainfleet import heartbeat
from trainfleet.launch.progress import Progress
from trainfleet.launch.stacks import split_dump, where_it_waits
from trainfleet.train.checkpoints import tree_bytes


def _progress() -> Progress:
    return Progress(run_id="r", ranks={"a": range(0, 2), "b": range(2, 4)}, started_at=0.0)


def test_step_times_are_per_step_even_when_beats_skip_steps():
    p = _progress()
    p.beat(2, {"step": 10}, now=100.0)
    p.beat(2, {"step": 14}, now=108.0)  # logging every 4 steps: 2 s per step
    row = p.to_json(state="running", now=109.0)["ranks"][2]
    assert row["step"] == 14 and row["step_times_s"] == [2.0] and row["node"] == "b"


def test_a_beat_at_the_same_step_updates_fields_but_is_not_progress():
    p = _progress()
    p.beat(0, {"step": 5}, now=10.0)
    p.beat(0, {"step": 5, "loss": 0.25}, now=20.0)
    assert p.stuck_for(now=30.0) == 20.0
    assert p.rows[0]["loss"] == 0.25


def test_a_new_phase_counts_as_progress_so_a_long_save_is_not_a_hang():
    p = _progress()
    p.beat(0, {"step": 5, "phase": "training"}, now=10.0)
    p.beat(0, {"step": 5, "phase": "saving"}, now=50.0)
    assert p.stuck_for(now=60.0) == 10.0
    p.beat(0, {"step": 5, "phase": "saving"}, now=70.0)  # the same phase again: not progress
    assert p.stuck_for(now=80.0) == 30.0


def test_a_save_still_writing_is_progress_and_a_save_that_writes_nothing_is_not():
    """A checkpoint save longer than the hang timeout: its beats carry the bytes written so
    far. Growth is progress; the same size again is not (a stuck NFS); the next save's bytes
    count from zero again, not from the last save's size."""
    p = _progress()
    p.beat(0, {"step": 8, "phase": "training"}, now=0.0)
    p.beat(0, {"step": 8, "phase": "saving", "phase_progress": 0}, now=10.0)
    p.beat(0, {"step": 8, "phase": "saving", "phase_progress": 5_000}, now=20.0)
    p.beat(0, {"step": 8, "phase": "saving", "phase_progress": 9_000}, now=30.0)
    assert p.stuck_for(now=35.0) == 5.0
    p.beat(0, {"step": 8, "phase": "saving", "phase_progress": 9_000}, now=40.0)
    p.beat(0, {"step": 8, "phase": "saving", "phase_progress": 9_000}, now=50.0)
    assert p.stuck_for(now=55.0) == 25.0
    p.beat(0, {"step": 9, "phase": "training"}, now=60.0)
    p.beat(0, {"step": 16, "phase": "saving", "phase_progress": 0}, now=70.0)
    p.beat(0, {"step": 16, "phase": "saving", "phase_progress": 100}, now=80.0)
    assert p.stuck_for(now=80.0) == 0.0


def test_beating_sends_the_phase_then_its_progress_until_the_block_ends(tmp_path):
    out = io.StringIO()
    checkpoint = tmp_path / "checkpoint-8"
    with heartbeat.beating(8, phase="saving", measure=lambda: tree_bytes(checkpoint),
                           every=0.05, stream=out, run_id="r1", rank=0):  # fmt: skip
        checkpoint.mkdir()
        (checkpoint / "shard").write_bytes(b"x" * 1000)
        time.sleep(0.3)
    beats = [json.loads(line.split(":", 4)[4]) for line in out.getvalue().splitlines()]
    assert beats[0]["phase"] == "saving" and beats[0]["phase_progress"] == 0
    assert beats[-1]["phase_progress"] == 1000 and all(b["step"] == 8 for b in beats)
    sent = len(beats)
    time.sleep(0.2)
    assert len(out.getvalue().splitlines()) == sent  # the thread stopped with the block


def test_behind_names_the_lowest_step_and_ranks_that_never_beat():
    p = _progress()
    for rank, step in ((0, 7), (1, 7), (2, 6), (3, 7)):
        p.beat(rank, {"step": step}, now=1.0)
    assert p.behind() == [2]
    q = _progress()
    q.beat(0, {"step": 1}, now=1.0)
    assert q.behind() == [1, 2, 3]
    assert q.stuck_for(now=5.0) == 4.0 and _progress().stuck_for(now=5.0) is None


def test_status_json_is_written_whole(tmp_path):
    p = _progress()
    p.beat(1, {"step": 3, "busy_s": 0.5, "pid": 42}, now=5.0)
    p.write(tmp_path / "status.json", state="running", now=6.0)
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["nodes"] == {"a": [0, 1], "b": [2, 3]} and status["world_size"] == 4
    assert status["ranks"][1]["busy_times_s"] == [0.5] and status["ranks"][1]["pid"] == 42
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]


def test_beat_writes_nothing_outside_a_launch(monkeypatch):
    monkeypatch.delenv("TRAINFLEET_RUN_ID", raising=False)
    out = io.StringIO()
    heartbeat.beat(1, stream=out)
    assert out.getvalue() == ""
    monkeypatch.setenv("TRAINFLEET_RUN_ID", "run9")
    monkeypatch.setenv("RANK", "5")
    heartbeat.beat(2, loss=0.5, stream=out)
    prefix, payload = out.getvalue().rstrip("\n").split(":beat:5:")
    assert prefix == "@@trainfleet:run9"
    assert heartbeat.parse(payload)["loss"] == 0.5


def test_malformed_beats_are_refused():
    assert heartbeat.parse("not json") is None
    assert heartbeat.parse('{"step": "3"}') is None
    assert heartbeat.parse("[1]") is None


def test_stack_dumps_split_per_rank_and_say_where_each_waits():
    text = (
        "@@rank 0 pid 10\nState:\tS (sleeping)\nProcess 10: python\n\n"
        'Thread 10 (idle): "MainThread"\n'
        "    all_reduce (torch/distributed/distributed_c10d.py:2950)\n"
        "@@rank 1 pid 11\nState:\tT (stopped)\nProcess 11: python\n\n"
        "Thread 11 (idle)\n    <module> (hang_rank.py:17)\n"
        "@@rank 2 pid 12\nState:\tgone (the process has exited)\n"
    )
    dumps = split_dump(text)
    assert sorted(dumps) == [0, 1, 2]
    assert where_it_waits(dumps[0]) == "all_reduce (torch/distributed/distributed_c10d.py:2950)"
    assert (
        where_it_waits(dumps[1]) == "stopped (SIGSTOP or a debugger), in <module> (hang_rank.py:17)"
    )
    assert where_it_waits(dumps[2]) == "gone (the process has exited)"


def test_a_node_that_did_not_answer_says_so():
    from trainfleet.launch.backends.over_ssh import no_dump as _no_dump

    dumps = split_dump(_no_dump({1: 77}, "connect timed out"))
    assert where_it_waits(dumps[1]) == "no stack: the node did not answer (connect timed out)"


def test_heartbeats_carry_the_mark_the_launcher_reads(monkeypatch, capsys):
    """The shim's beats (an unchanged Trainer's) and a script's `heartbeat.beat` are one
    format: the same prefix, a payload `heartbeat.read` takes the same way."""
    from trainfleet.node import shim

    monkeypatch.setenv(shim.RUN_ID_ENV, "r1")
    monkeypatch.setenv("RANK", "3")
    shim.beat(12, loss=1.5, phase=None)
    heartbeat.beat(12, loss=1.5)
    lines = capsys.readouterr().err.splitlines()
    prefix = f"{shim.MARK}:r1:beat:3:"
    assert len(lines) == 2 and all(line.startswith(prefix) for line in lines), lines
    read = [heartbeat.read(line[len(prefix) :]) for line in lines]
    assert read[0] == read[1] == ({"step": 12, "pid": os.getpid(), "loss": 1.5}, [])


def test_a_launch_gives_the_callers_signal_handlers_back(tmp_path):
    """asyncio's removal of its handlers leaves the defaults; a program (or the test session,
    which turns SIGTERM into an interrupt so that its sandboxes come down) keeps its own."""
    import io
    import signal

    from trainfleet.cluster import load_cluster
    from trainfleet.launch import LaunchOptions, new_run_id, prepare
    from trainfleet.launch.supervisor import supervise

    def mine(signum, frame):
        pass

    # Both set here: a session started in the background inherits SIGINT ignored.
    before = {sig: signal.signal(sig, mine) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        options = LaunchOptions(command=("-c", "pass"), run_id=new_run_id())
        plan, _ = prepare(load_cluster(), options, run_dir=tmp_path)
        supervise(plan, [], run_dir=tmp_path, out=io.StringIO())
        assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_startup_lasts_until_the_first_plain_step_beat_and_gives_no_step_time():
    """Beats with a phase before any step (loading, tokenizing) are the startup; the first step
    beat after them ends it, and the time from a startup beat to that step is not a step time."""
    p = _progress()
    assert not p.in_startup and p.stuck_for(now=5.0) is None  # nothing beaten: nothing judged
    p.beat(0, {"step": 0, "phase": "tokenizing", "phase_progress": 10}, now=10.0)
    p.beat(1, {"step": 0, "phase": "loading"}, now=11.0)
    assert p.in_startup and p.stuck_for(now=20.0) == 9.0
    p.beat(0, {"step": 0, "phase": "tokenizing", "phase_progress": 500}, now=100.0)
    assert p.stuck_for(now=100.0) == 0.0
    p.beat(0, {"step": 1}, now=400.0)
    p.beat(0, {"step": 2}, now=402.0)
    status = p.to_json(state="running", now=403.0)
    assert not p.in_startup and status["training_started_at"] == 400.0
    assert status["ranks"][0]["step_times_s"] == [2.0]


def test_the_watchdog_judges_startup_by_the_startup_timeout_and_training_by_the_hang_timeout(
    tmp_path,
):
    """A tokenization silent for 50 s is not a hang under --hang-timeout 30 while startup has
    its own bound (120 s); past that bound it is, and says so; after the first step the hang
    timeout is the bound again."""
    from trainfleet.cluster import load_cluster
    from trainfleet.launch import LaunchOptions, new_run_id, prepare
    from trainfleet.launch.result import RunState
    from trainfleet.launch.supervisor import _Run

    options = LaunchOptions(command=("-c", "pass"), run_id=new_run_id(), hang_timeout=30.0,
                            startup_timeout=120.0)  # fmt: skip
    plan, _ = prepare(load_cluster(), options, run_dir=tmp_path)
    out = io.StringIO()
    run = _Run(plan, tmp_path, out)
    progress = run.facts.progress
    now = time.time()
    progress.beat(0, {"step": 0, "phase": "tokenizing", "phase_progress": 1}, now=now - 50)
    assert progress.in_startup and not run._hung()
    progress.beat(0, {"step": 0, "phase": "tokenizing", "phase_progress": 1}, now=now - 10)
    progress.last_advance = now - 121  # no startup progress for longer than its bound
    assert run._hung() and run.state is RunState.HUNG
    assert progress.hang.phase == "startup"
    assert "no rank made startup progress for 121 s (startup timeout 120 s)" in out.getvalue()

    run = _Run(plan, tmp_path, io.StringIO())
    progress = run.facts.progress
    progress.beat(0, {"step": 0, "phase": "loading"}, now=now - 100)
    progress.beat(0, {"step": 1}, now=now - 31)
    assert run._hung() and progress.hang.phase == "training"


def test_once_every_rank_has_exited_silence_is_no_hang(tmp_path):
    """Seen in CI: the ranks had finished and exited 0, torchrun's agents were still meeting at
    their exit barrier on a loaded machine, and the 5 s hang timeout called that a hang."""
    from trainfleet.cluster import load_cluster
    from trainfleet.launch import LaunchOptions, new_run_id, prepare
    from trainfleet.launch.supervisor import _Run

    options = LaunchOptions(command=("-c", "pass"), run_id=new_run_id(), hang_timeout=5.0)
    plan, _ = prepare(load_cluster(), options, run_dir=tmp_path)
    run = _Run(plan, tmp_path, io.StringIO())
    run.facts.progress.beat(0, {"step": 24}, now=time.time() - 30)
    assert run._hung()  # silent for 30 s while the rank still runs: a hang
    run = _Run(plan, tmp_path, io.StringIO())
    run.facts.progress.beat(0, {"step": 24}, now=time.time() - 30)
    run.facts.joins.mark("exit=0", 0, now=time.time())
    assert run.facts.joins.all_exited and not run._hung()
    run.facts.joins.mark("exit=x", 0, now=time.time())  # a garbled mark changes nothing
    assert run.facts.joins.exited == {0: 0}


def test_after_every_ranks_last_step_the_end_is_judged_by_the_startup_bound(tmp_path):
    """Seen in a fresh-clone run: after a restart, both ranks beat step 24/24 and exported, then
    torchrun's exit barrier on a loaded machine outlasted the 5 s hang timeout before every exit
    mark came in. A final save or export advances no step: the end has the startup bound."""
    from trainfleet.cluster import load_cluster
    from trainfleet.launch import LaunchOptions, new_run_id, prepare
    from trainfleet.launch.supervisor import _Run

    options = LaunchOptions(command=("-c", "pass"), run_id=new_run_id(), hang_timeout=5.0,
                            startup_timeout=60.0)  # fmt: skip
    plan, _ = prepare(load_cluster(), options, run_dir=tmp_path)
    run = _Run(plan, tmp_path, io.StringIO())
    progress = run.facts.progress
    progress.beat(0, {"step": 23, "total_steps": 24}, now=time.time() - 30)
    assert not progress.finishing and run._hung()  # a step still to go: a hang
    run = _Run(plan, tmp_path, io.StringIO())
    progress = run.facts.progress
    progress.beat(0, {"step": 24, "total_steps": 24}, now=time.time() - 30)
    assert progress.finishing and not run._hung()  # 30 s < the 60 s bound
    progress.last_advance = time.time() - 90
    assert run._hung() and progress.hang.phase == "finishing"
    assert "ended its last step 90 s ago" in run.output.out.getvalue()


def test_the_launcher_names_a_straggler_once_and_says_when_it_no_longer_is():
    """Judged as `trainfleet status` judges it (the busy_s medians, 20% margin), every
    STRAGGLERS_EVERY_S while the run goes on."""
    from trainfleet.launch.watchdogs import STRAGGLERS_EVERY_S, Stragglers

    said: list[str] = []
    stragglers = Stragglers(said.append)
    ranks = {f"n{r}": range(r, r + 1) for r in range(3)}
    progress = Progress(run_id="r", ranks=ranks, started_at=0.0)
    for step in range(1, 8):
        for rank, busy in ((0, 0.20), (1, 0.21), (2, 0.30)):
            progress.beat(rank, {"step": step, "busy_s": busy}, now=float(step))
    stragglers.judge(progress, now=100.0)
    stragglers.judge(progress, now=100.0 + STRAGGLERS_EVERY_S / 2)  # too soon: not judged again
    assert len(said) == 1 and said[0].count("rank-straggler") == 1, said
    assert said[0].startswith(
        "rank-straggler: rank 2 (n2) computes 46% longer per step than the other ranks"
    )
    for step in range(8, 30):
        for rank in range(3):
            progress.beat(rank, {"step": step, "busy_s": 0.2}, now=float(step))
    stragglers.judge(progress, now=100.0 + STRAGGLERS_EVERY_S)
    assert said[1:] == ["rank 2 (n2) is no longer a straggler"]


def test_a_launcher_that_ends_0_with_no_rank_ever_started_is_no_success(tmp_path):
    """Seen once in a fresh clone's run: DeepSpeed's runner printed its pdsh command, then
    nothing came back and it exited 0 (it passes on only positive exit codes, so a pdsh ended
    by a signal reads as success). No rank's start mark came: nothing ran."""
    import asyncio

    from trainfleet.cluster import load_cluster
    from trainfleet.launch import LaunchOptions, new_run_id, prepare
    from trainfleet.launch.result import RunState
    from trainfleet.launch.supervisor import _Run

    class Ended:
        returncode = 0

        async def wait(self):
            return 0

    class Channel:
        payload = None  # DeepSpeed's runner gets no keepalive lines
        demux = None

    options = LaunchOptions(command=("-c", "pass"), run_id=new_run_id())
    plan, _ = prepare(load_cluster(), options, run_dir=tmp_path)
    run = _Run(plan, tmp_path, io.StringIO())
    run.procs, run.channels = {"deepspeed": Ended()}, {"deepspeed": Channel()}
    asyncio.run(run.watch())
    assert run.state is RunState.FAILED and run.first_failure == "deepspeed"
    assert "ended with exit code 0, but no rank ever started" in run.output.out.getvalue()

    run = _Run(plan, tmp_path, io.StringIO())  # the same end after a rank started: done
    run.procs, run.channels = {"deepspeed": Ended()}, {"deepspeed": Channel()}
    run.facts.joins.mark("started", 0, now=time.time())
    asyncio.run(run.watch())
    assert run.state is RunState.DONE
