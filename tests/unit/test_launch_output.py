"""A launch's output pump reads what nodes send as data (security review F6, F8, F9): a malformed
mark or heartbeat is a note and reading goes on; a node speaks only for its own ranks; a line
is cut at 64 KiB; trainfleet's hang notes show what nodes said as text."""

from __future__ import annotations

import asyncio
import io
import json

import pytest

from trainfleet.launch.backend import Channel
from trainfleet.launch.backends.ssh import LaunchPlan, NodePlan
from trainfleet.launch.options import LaunchOptions
from trainfleet.launch.output import MergedOutput, pump
from trainfleet.launch.runfacts import RunFacts
from trainfleet.status.rundir import load_status

pytestmark = pytest.mark.unit

CAP = 64 * 1024
NODE_A = Channel(name="gpu-node-1", argv=[])
NODE_B = Channel(name="gpu-node-2", argv=[])


def _plan() -> LaunchPlan:
    """Two nodes: gpu-node-1 runs ranks 0-1, gpu-node-2 ranks 2-3."""
    nodes = [
        NodePlan(host=f"gpu-node-{i + 1}", node_rank=i, first_rank=2 * i, slots=2, argv=[],
                 env={}, cwd="/w")
        for i in range(2)
    ]  # fmt: skip
    return LaunchPlan(options=LaunchOptions(command=("train.py",), run_id="r1"),
                      master="gpu-node-1", master_addr="10.0.0.1", master_port=29500,
                      nodes=nodes)  # fmt: skip


def _merged(tmp_path, out: io.StringIO) -> tuple[MergedOutput, RunFacts]:
    """The output of a launch of `_plan()`, and the run's facts it gives its events to."""
    facts = RunFacts(_plan())
    return MergedOutput(_plan(), tmp_path, out, 0.0, facts), facts


def _pumped(output: MergedOutput, channel: Channel, data: bytes) -> None:
    """`data` through the launcher's pump, as a channel's stderr, to its end."""

    async def run() -> None:
        stream = asyncio.StreamReader()
        stream.feed_data(data)
        stream.feed_eof()
        await pump(stream, channel, "stderr", output)

    asyncio.run(run())


def _beat(rank: str, fields: str) -> str:
    return f"@@trainfleet:r1:beat:{rank}:{fields}\n"


def test_malformed_marks_and_beats_are_one_note_and_later_lines_still_arrive(tmp_path):
    """A `²` rank (`isdigit()` is true for it, `int()` refuses it) ended the pump, and with it
    the reading of that node; a string phase_progress raised on comparison; `total_steps:
    "10"` was stored and `trainfleet status` then refused the status.json."""
    out = io.StringIO()
    output, facts = _merged(tmp_path, out)
    lines = [
        _beat("²", '{"step": 1}'),
        "@@trainfleet:r1:exit=0:¹\n",
        "@@trainfleet:r1:exit=²:0\n",
        _beat("0", '{"step": 1, "phase": "saving", "phase_progress": 5}'),
        _beat("0", '{"step": 1, "phase": "saving", "phase_progress": "x"}'),
        _beat("0", '{"step": 2, "total_steps": "10", "loss": 0.5}'),
        _beat("0", "[" * 50_000),  # (deeper than json can read)
        "@@trainfleet:r1:started:1\n",
        "@@trainfleet:r1:pid:17133\n",  # the node's bootstrap, about itself: no rank, no note
        "a line of the job after them\n",
        _beat("1", '{"step": 7, "pid": 4242}'),
    ]
    _pumped(output, NODE_A, "".join(lines).encode())
    output.close()
    rows = facts.progress.rows
    assert rows[1]["step"] == 7 and rows[1]["pid"] == 4242  # read on after every bad line
    assert rows[0]["step"] == 2 and rows[0]["loss"] == 0.5 and rows[0]["phase_progress"] == 5
    assert "total_steps" not in rows[0]
    assert facts.joins.started == {1} and facts.joins.exited == {}
    shown = out.getvalue()
    assert "a line of the job after them" in shown and "@@trainfleet" not in shown
    notes = [line for line in shown.splitlines() if line.startswith("trainfleet: gpu-node-1")]
    assert len(notes) == 1, shown  # one note per node on the terminal, not a flood
    assert "a mark for rank ²," in notes[0] and "launch.log" in notes[0]
    logged = (tmp_path / "logs" / "launch.log").read_text()
    assert "`phase_progress` is 'x', not a finite number" in logged
    assert "`total_steps` is '10', not a whole number of steps" in logged
    assert "rank 0's exit mark exit=² has no exit code" in logged
    assert "17133" not in logged
    facts.progress.write(tmp_path / "status.json", state="running", now=1.0)
    assert load_status(tmp_path / "status.json")["ranks"][0]["step"] == 2  # status reads it


def test_a_node_cannot_set_another_node_s_ranks_status_pid_or_exit(tmp_path):
    """gpu-node-2 set rank 0's (gpu-node-1's) row: its step, its phase, and the pid that
    `py-spy dump` then reads on gpu-node-1 when the run hangs."""
    out = io.StringIO()
    output, facts = _merged(tmp_path, out)
    forged = [
        _beat("0", '{"step": 999999, "pid": 1, "phase": "done"}'),
        "@@trainfleet:r1:started:0\n",
        "@@trainfleet:r1:exit=0:0\n",
        _beat("2", '{"step": 3, "pid": 77}'),  # its own rank: taken
    ]
    _pumped(output, NODE_B, "".join(forged).encode())
    row = facts.progress.rows[0]
    assert row["step"] is None and "pid" not in row and "phase" not in row
    assert facts.joins.started == set() and facts.joins.exited == {}
    assert facts.progress.rows[2]["step"] == 3 and facts.progress.rows[2]["pid"] == 77
    assert "gpu-node-2: a mark for rank 0, not one of its ranks (2-3): ignored" in out.getvalue()
    _pumped(output, NODE_A, _beat("0", '{"step": 4, "pid": 4242}').encode())
    assert facts.progress.rows[0]["step"] == 4 and facts.progress.rows[0]["pid"] == 4242


def test_a_32_mib_line_without_newline_is_cut_at_64_kib_with_a_note(tmp_path):
    """F8: every 64 KiB read re-split the whole pending line (6.9 s of the event loop for
    32 MiB, keepalives late). The line is cut at the cap; the note says how much of which
    node's line was dropped; the lines after it still come."""
    out = io.StringIO()
    output, facts = _merged(tmp_path, out)
    _pumped(output, NODE_B, b"y" * (32 << 20) + b"\nafter\n" + b"z" * (CAP + 5))
    output.close()
    shown = out.getvalue().splitlines()
    assert shown[0].split() == ["[gpu-node-2]", "y" * CAP]
    dropped = (32 << 20) - CAP
    assert shown[1].startswith(f"trainfleet: gpu-node-2: {dropped} bytes of a line on its stderr"
                               f" dropped (a line is cut at {CAP} bytes)")  # fmt: skip
    assert shown[2].split() == ["[gpu-node-2]", "after"]
    assert shown[3].split() == ["[gpu-node-2]", "z" * CAP]  # the last one, at the stream's end
    assert len(shown) == 4  # its cut is noted in the launch log only
    assert "gpu-node-2: 5 bytes of a line" in (tmp_path / "logs" / "launch.log").read_text()


def test_the_line_splitter_holds_at_most_the_cap_whatever_comes():
    """Linear time: each chunk is split once and only the cap's worth of an open line is held,
    so 32 MiB without a newline costs 512 reads of 64 KiB, not 512 re-splits of up to 32 MiB."""
    from trainfleet.remote.lines import CappedLines

    lines = CappedLines(cap=CAP)
    for _ in range(512):
        assert lines.feed(b"x" * CAP) == [] and len(lines.pending) <= CAP
    (line,) = lines.end()
    assert (len(line.raw), line.dropped) == (CAP, (32 << 20) - CAP)
    small = CappedLines(cap=4)
    assert [(x.raw, x.dropped) for x in small.feed(b"ab\ncdefghij\n\nkl")] == [
        (b"ab", 0), (b"cdef", 4), (b"", 0),
    ]  # fmt: skip
    assert [(x.raw, x.dropped) for x in small.end()] == [(b"kl", 0)]


def test_hang_notes_show_what_nodes_said_as_text_and_a_node_dumps_only_its_own_ranks(tmp_path):
    """F9: where a hung rank waits (its stack) and its Flight Recorder's names are the node's
    text, printed by trainfleet's own notes; and a node's dump for another node's rank is
    not taken for that rank."""
    from trainfleet.launch import watchdogs
    from trainfleet.status.hang import Hang

    out = io.StringIO()
    progress = RunFacts(_plan()).progress
    for rank in range(4):
        progress.beat(rank, {"step": 5, "pid": 100 + rank}, now=1.0)
    record = {"rank": 2, "pg_status": {"0": {"last_enqueued_collective": "3",
                                             "last_completed_collective": "2"}},
              "entries": [{"pg_id": 0, "pg_name": "pg\x1b[2J", "collective_seq_id": 3,
                           "profiling_name": "gloo:all_reduce\x1b]0;x\x07"}]}  # fmt: skip
    frame = 'Thread 1 (idle): "MainThread"\n    wait\x1b[2J\x1b[H (x.py:1)\n'
    dumps = {
        "gpu-node-1": f"@@rank 0 pid 100\nState:\tS\n{frame}",
        "gpu-node-2": (f"@@rank 2 pid 102\n@@flight {json.dumps(record)}\nState:\tS\n{frame}"
                       f"@@rank 0 pid 1\n@@flight {json.dumps(dict(record, rank=0))}\n"
                       "State:\tS\nThread 1 (idle): \"MainThread\"\n    forged (f.py:1)\n"),
    }  # fmt: skip
    hang = Hang(stuck_s=30.0, detected_at=1.0, phase="training")
    note = MergedOutput(_plan(), tmp_path, out, 0.0, RunFacts(_plan())).note
    hang = asyncio.run(
        watchdogs.dump_stacks(progress, hang, run_dir=tmp_path, dump=lambda pids: dumps, note=note)
    )
    said = out.getvalue()
    assert "\x1b" not in said and "\x07" not in said
    assert "behind at step 5: gpu-node-1 rank 0: wait?[2J?[H (x.py:1)" in said
    assert "stuck in all_reduce?]0;x? #3 of process group 0 (pg?[2J)" in said
    assert hang.report.flight_records == (2,)  # not rank 0's, from gpu-node-2
    assert "forged" not in said
    assert not (tmp_path / "stacks" / "gpu-node-2.rank0.txt").exists()
    assert hang.behind[0].where == "wait\x1b[2J\x1b[H (x.py:1)"  # kept as it came
