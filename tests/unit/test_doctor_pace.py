"""doctor's pace: deadlines that follow each probe's own lines, the barrier before the peers'
tests, and the runner's `Watch` that carries them out (real local processes, no ssh)."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time

import pytest

from trainfleet import node
from trainfleet.cluster import load_cluster
from trainfleet.doctor.collect import go_lines, plan_params, strip_marks
from trainfleet.doctor.pace import STALL_S, START_GAP_S, Pace
from trainfleet.node import probe
from trainfleet.node.probe import MARK
from trainfleet.remote import NodeResult, Watch, run_on_nodes
from trainfleet.remote.failures import Failure

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _pace(hosts=("a", "b", "c"), **kwargs):
    clock = Clock()
    pace = Pace(list(hosts), start_min=20.0, cap=90.0, clock=clock,
                go_line=lambda host, up: json.dumps(sorted(up)).encode(), **kwargs)  # fmt: skip
    return pace, clock


def _say(pace, clock, host, at, words):
    clock.now = 100.0 + at
    pace.on_line(host, "stderr", f"{MARK} {words}")


def test_the_barrier_waits_while_probes_keep_starting_then_lets_the_started_ones_go():
    pace, clock = _pace()
    _say(pace, clock, "a", 5.0, "started")
    _say(pace, clock, "b", 18.0, "started")  # a busy machine: starts spread over many seconds
    clock.now = 100.0 + 25.0  # past start_min, but b started less than START_GAP_S ago
    assert not pace.ready()
    assert pace.deadline("c") == 100.0 + 18.0 + START_GAP_S
    clock.now = 100.0 + 18.0 + START_GAP_S
    assert pace.ready() and asyncio.run(pace.more_stdin("a")) == b'["a", "b"]'
    assert pace.times("c").bound == "start"
    # c starting now tests no one: its line names no peers
    _say(pace, clock, "c", 30.0, "started")
    assert asyncio.run(pace.more_stdin("c")) == b'["a", "b"]'


def test_the_barrier_opens_at_once_when_every_probe_started_or_ended():
    pace, clock = _pace()
    _say(pace, clock, "a", 0.5, "started")
    _say(pace, clock, "b", 0.6, "started")
    assert not pace.ready()
    pace.ended("c")  # its ssh failed: ssh's own error names it
    assert pace.ready() and asyncio.run(pace.more_stdin("a")) == b'["a", "b"]'
    assert pace.deadline("c") is None


def test_a_started_probe_is_waited_for_while_it_says_it_is_alive_up_to_the_cap():
    pace, clock = _pace(hosts=("a",))
    _say(pace, clock, "a", 1.0, "started")
    for at in range(2, 40):
        _say(pace, clock, "a", float(at), "alive facts")
        assert pace.deadline("a") == 100.0 + at + STALL_S
    assert pace.times("a").bound == "silence"
    for at in range(40, 120):
        _say(pace, clock, "a", float(at), "alive peers")
    assert pace.deadline("a") == 100.0 + 1.0 + 90.0 and pace.times("a").bound == "cap"
    assert pace.times("a").phase == "peers" and pace.times("a").started_s == 1.0


def test_lines_that_are_not_the_probes_words_change_nothing():
    pace, clock = _pace(hosts=("a",))
    lines = [("stdout", f"{MARK} started"), ("stderr", "started"),
             ("stderr", f"{MARK} alive ../../x"), ("stderr", f"{MARK} hello")]  # fmt: skip
    for stream, text in lines:
        pace.on_line("a", stream, text)
    pace.on_line("zz", "stderr", f"{MARK} started")
    assert pace.times("a").started_s is None and pace.times("a").phase is None


def test_go_lines_count_only_the_connections_of_the_peers_that_started():
    cluster = load_cluster(hosts="a,b,c,d")
    addresses = {h: f"10.0.0.{i}" for i, h in enumerate("abcd", 1)}
    params, _ = plan_params(cluster, addresses, quick=True, rng=random.Random(1))
    line = go_lines(params, addresses)
    every = json.loads(line("a", frozenset("abcd")))
    assert every["peers"] == list("abcd") and every["inbound"] == params["a"]["inbound"] == 3 * 3
    three = json.loads(line("a", frozenset("abc")))  # d's probe never started
    assert three["peers"] == list("abc") and three["inbound"] == 2 * 3
    ring = {h: (params[h]["bandwidth_to"] or {}).get("node") for h in "abcd"}
    sender = next(h for h, to in ring.items() if to == "a")
    assert json.loads(line("a", frozenset("abcd") - {sender}))["bandwidth_from"] is False
    assert json.loads(line("d", frozenset("abc"))) == {"peers": [], "inbound": 0,
                                                     "bandwidth_from": False}  # fmt: skip


def test_strip_marks_keeps_the_nodes_own_stderr():
    result = NodeResult(node="a", returncode=1, stdout="", duration_s=1.0,
                        stderr=f"{MARK} started\nTraceback: boom\n{MARK} alive facts\n",
                        failure=Failure.COMMAND_FAILED)  # fmt: skip
    assert strip_marks(result).stderr == "Traceback: boom\n"


class _Follow(Watch):
    """A deadline 1 s after the last line; the second stdin line once `go` was printed."""

    def __init__(self):
        self.last = time.monotonic()
        self.gone = False

    def on_line(self, node, stream, text):
        self.last = time.monotonic()
        self.gone = self.gone or text == "go?"

    def deadline(self, node):
        return self.last + 1.0

    async def more_stdin(self, node):
        while not self.gone:
            await asyncio.sleep(0.05)
        return b"second\n"


def test_a_watch_keeps_a_run_alive_while_it_works_and_stops_it_when_it_goes_silent():
    local = load_cluster(hosts="localhost").nodes
    talk = "for i in 1 2 3 4; do echo tick; sleep 0.5; done; echo go?; read a; read b; echo $b"
    watch = _Follow()
    (result,) = run_on_nodes(local, ["sh", "-c", talk], stdin=b"first\n", watch=watch)
    assert result.ok and result.stdout.split() == ["tick"] * 4 + ["go?", "second"]
    assert result.duration_s > 2.0  # past the 1 s bound a fixed timeout would have had
    watch = _Follow()
    (result,) = run_on_nodes(local, ["sh", "-c", "echo tick; sleep 30"], watch=watch)
    assert result.failure is Failure.TIMED_OUT and result.duration_s < 10


def test_the_probe_behind_the_barrier_says_it_started_and_tests_only_the_peers_named(tmp_path):
    cluster = load_cluster(hosts="a,b")
    params, _ = plan_params(cluster, {"a": "127.0.0.1", "b": "127.0.0.1"}, quick=True,
                            rng=random.Random(2))  # fmt: skip
    params["a"]["workdir"] = str(tmp_path)  # its shared-storage token goes there
    go = json.dumps({"peers": ["a"], "inbound": 0, "bandwidth_from": False}).encode() + b"\n"
    proc = subprocess.run(node.argv(sys.executable, probe),
                          input=node.line(probe.main, params["a"]) + go,
                          capture_output=True, timeout=60, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    sheet = node.read_answer(proc.stdout.decode(), probe.FactSheet, node="a")
    assert proc.stderr.decode().splitlines()[0] == f"{MARK} started"
    assert sheet["active"]["go_wait"] >= 0 and sheet["active"]["tcp"] == {}
    assert "b" not in sheet["active"].get("shared", {})
