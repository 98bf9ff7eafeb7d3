"""commtest arithmetic and verdicts (pure), the report from a recorded run and from records cut
short, and the worker itself as a one-rank gloo group in a subprocess (real torch, no network):
the result checks of every op, and the time budget's decisions."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainfleet.commtest import CommtestOptions, build_report, summary_from_records
from trainfleet.commtest.formulas import (
    OPS,
    RECORD_MARK,
    busbw,
    round_robin,
    sizes,
    slow_findings,
    verdict,
)
from trainfleet.commtest.report import render
from trainfleet.errors import TrainfleetError
from trainfleet.units import parse_size

pytestmark = pytest.mark.unit

RECORDED = Path(__file__).parent / "fixtures" / "commtest" / "slow_node3.json"


@pytest.mark.parametrize(
    ("op", "ranks", "factor"),
    [
        ("all_reduce", 8, 2 * 7 / 8),
        ("all_reduce", 2, 1.0),
        ("all_gather", 4, 3 / 4),
        ("reduce_scatter", 16, 15 / 16),
        ("all_to_all", 2, 0.5),
        ("broadcast", 8, 1.0),
        ("sendrecv", 8, 1.0),
    ],
)
def test_busbw_factors_are_nccl_tests(op, ranks, factor):
    assert busbw(op, algbw=10.0, ranks=ranks) == pytest.approx(10.0 * factor)


def test_sizes_and_their_spelling():
    assert parse_size("1K") == 1024 and parse_size("64M") == 64 << 20
    assert (
        parse_size("1G") == 1 << 30 and parse_size("4096") == 4096 and parse_size("2MiB") == 2 << 20
    )
    assert sizes(1024, 1 << 20, 4) == [1024, 4096, 16384, 65536, 262144, 1048576]
    for bad in ("1X", "", "x", "1.2.3G"):
        with pytest.raises(TrainfleetError, match="cannot read size"):
            parse_size(bad)
    with pytest.raises(TrainfleetError):
        sizes(1 << 20, 1024, 2)
    with pytest.raises(TrainfleetError, match="unknown op"):
        CommtestOptions(ops=("all_reduce", "allreduce"))


@pytest.mark.parametrize("count", range(2, 10))
def test_round_robin_meets_every_pair_once_in_disjoint_rounds(count):
    nodes = [f"n{i}" for i in range(count)]
    rounds = round_robin(nodes)
    assert len(rounds) == (count - 1 if count % 2 == 0 else count)
    met = [frozenset(pair) for r in rounds for pair in r]
    assert sorted(map(sorted, met)) == sorted(
        map(sorted, map(frozenset, itertools.combinations(nodes, 2)))
    )
    for r in rounds:
        busy = [n for pair in r for n in pair]
        assert len(busy) == len(set(busy))  # no node in two pairs of a round


def _rates(slow=(), bad_pair=None, nodes=("a", "b", "c", "d")):
    rates = {}
    for a, b in itertools.permutations(nodes, 2):
        rate = 1e9
        if a in slow or b in slow or {a, b} == set(bad_pair or ()):
            rate = 5e6
        rates[(a, b)] = rate
    return rates


def test_a_slow_node_a_slow_pair_and_a_clean_matrix():
    [node] = slow_findings(_rates(slow=("c",)), "send/recv")
    assert (node.id, node.nodes) == ("slow-link", ("c",))
    assert "send/recv a -> c: 5.0 MB/s" in node.evidence and "ethtool" in node.fix
    [pair] = slow_findings(_rates(bad_pair=("a", "b")), "raw TCP")
    assert set(pair.nodes) == {"a", "b"}
    assert slow_findings(_rates(), "send/recv") == []


def test_verdict_against_the_slowest_link():
    ok, text = verdict(0.9e9, {"eth0 (kernel)": 1.25e9, "raw TCP a -> b": 1.5e9}, 1 << 30)
    assert ok and text.startswith("PASS") and "72%" in text and "eth0 (kernel)" in text
    ok, text = verdict(0.2e9, {"raw TCP a -> b": 1.5e9}, 1 << 30)
    assert not ok and text.startswith("SHORTFALL") and "1.0 GiB" in text
    assert verdict(None, {}, None)[0] is False


def test_report_from_a_recorded_run_with_a_shaped_link():
    report = build_report(json.loads(RECORDED.read_text()))
    assert [(f.id, f.nodes) for f in report.findings] == [("slow-link", ("gpu-node-3",))]
    assert report.links["raw TCP gpu-node-3 -> gpu-node-1"] < 10e6
    text = render(report)
    assert "#wrong" in text and "# Out of bounds values : 0 OK" in text
    assert "WARNING slow-link  [gpu-node-3]" in text


CHECKS = """
import os, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
dist.init_process_group("gloo", rank=0, world_size=1)
from trainfleet.commtest.formulas import OPS
from trainfleet.commtest.worker import Op, time_op
out = {}
for name in OPS:
    op = Op(name, 4096, torch.device("cpu"))
    seconds, wrong = time_op(op, 2, 1, torch.device("cpu"))
    tensor = getattr(op, "out", None)
    if tensor is None:
        tensor = op.buf
    tensor[0] += 1  # one wrong element: the check must see it
    out[name] = [wrong, op.wrong(), op.bytes]
print(out)
dist.destroy_process_group()
"""


def test_every_op_checks_its_result(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = subprocess.run(
        [sys.executable, "-c", CHECKS],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "PORT": str(port)},
    )
    assert done.returncode == 0, done.stderr
    results = eval(done.stdout.strip().splitlines()[-1])  # (our own dict literal)
    assert set(results) == set(OPS)
    for name, (wrong, after_corruption, size) in results.items():
        assert wrong == 0, name
        assert after_corruption == 1, name
        assert size == 4096


def test_with_nccl_over_infiniband_the_ports_are_the_links_to_judge_against():
    summary = json.loads(RECORDED.read_text())
    summary["backend"] = "nccl"
    for rank in summary["ranks"]:
        rank["ib"] = {"mlx5_0/1": 200e9 / 8, "mlx5_1/1": 200e9 / 8}
    report = build_report(summary)
    assert set(report.links) == {f"InfiniBand on gpu-node-{k} (2 port(s))" for k in range(1, 5)}
    assert all(rate == 50e9 for rate in report.links.values())


def _run_worker(tmp_path, **spec_changes) -> str:
    """The shipped worker as one gloo rank (real torch, no network); its output."""
    import base64
    import os
    import socket

    spec = {
        "ops": ["all_reduce", "broadcast"],
        "sizes": [1024, 4096, 16384],
        "iters": 4,
        "warmup": 1,
        "timeout": 60,
        "rounds": [[("gpu-node-8", "gpu-node-9")], [("gpu-node-8", "gpu-node-9")]],
        "pair_bytes": 1024,
        "pair_iters": 1,
        "tcp_seconds": 0.05,
        "pair_end": None,
        "end": None,
        **spec_changes,
    }
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", TRAINFLEET_NODE="gpu-node-1")
    encoded = base64.b64encode(json.dumps(spec).encode()).decode()
    done = subprocess.run(
        [sys.executable, "-m", "trainfleet.commtest.worker", encoded],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_worker_without_a_budget_measures_every_size_at_the_full_count(tmp_path):
    summary = summary_from_records(_run_worker(tmp_path), rounds=2)
    assert [(r["op"], r["iters"]) for r in summary["results"]] == [
        ("all_reduce", 4), ("all_reduce", 4), ("all_reduce", 4),
        ("broadcast", 4), ("broadcast", 4), ("broadcast", 4),
    ]  # fmt: skip
    assert summary["skipped"] == [] and summary["pair_rounds"] == [2, 2]
    assert summary["seconds"] is not None  # the end record: a complete run


def test_worker_over_its_budget_skips_what_does_not_fit_and_says_so(tmp_path):
    """A budget already spent when measuring starts: one pair round (the first always runs),
    then every op skipped from its first size, each named."""
    summary = summary_from_records(_run_worker(tmp_path, pair_end=0.0, end=0.0), rounds=2)
    assert summary["results"] == []
    assert summary["skipped"] == [
        {"op": "all_reduce", "bytes": 1024, "reason": "time budget"},
        {"op": "broadcast", "bytes": 1024, "reason": "time budget"},
    ]
    assert summary["pair_rounds"] == [1, 2]
    report = build_report(summary)
    assert report.skipped == summary["skipped"] and report.pair_rounds == (1, 2)
    text = render(report)
    assert "# all_reduce: from 1.0 KiB up not measured (time budget)" in text


def test_records_cut_by_an_interrupt_give_an_incomplete_report():
    summary = json.loads(RECORDED.read_text())
    lines = [RECORD_MARK + json.dumps({"kind": "start", **{k: summary[k] for k in
             ("backend", "world_size", "device", "ranks")}})]  # fmt: skip
    lines += [RECORD_MARK + json.dumps({"kind": "pairs", "round": [1, 6], **summary["pairs"]})]
    lines += [RECORD_MARK + json.dumps({"kind": "row", **row}) for row in summary["results"][:2]]
    lines += [RECORD_MARK + '{"kind": "row", "op": "all_red']  # torn by the interrupt
    got = summary_from_records("noise\n" + "\n".join(lines), rounds=6)
    assert len(got["results"]) == 2 and got["seconds"] is None and got["pair_rounds"] == [1, 6]
    report = build_report(got, stopped="interrupted")
    data = report.to_json()
    assert data["complete"] is False and data["stopped"] == "interrupted"
    assert data["verdict"].startswith("INCOMPLETE (interrupted)") and not data["passed"]
    # The slow node is named from what was measured.
    assert [f["nodes"] for f in data["findings"]] == [["gpu-node-3"]]
    assert summary_from_records("no records here", rounds=0) is None


def test_time_budget_must_be_positive():
    with pytest.raises(TrainfleetError, match="time-budget"):
        CommtestOptions(time_budget=0)
    with pytest.raises(TrainfleetError, match="time-budget"):
        CommtestOptions(time_budget=-5)


def test_a_run_stopped_before_any_record_still_gives_a_report():
    empty = {"backend": "?", "world_size": 6, "device": "?", "ranks": [], "results": []}
    empty.update(pairs={}, pair_rounds=[0, 3])
    data = build_report(empty, stopped="the commtest job did not finish: joining").to_json()
    assert json.loads(json.dumps(data))["complete"] is False
    assert data["results"] == [] and data["findings"] == [] and not data["passed"]
    assert data["verdict"].startswith("INCOMPLETE (the commtest job did not finish: joining)")
    assert "INCOMPLETE" in render(build_report(empty, stopped="interrupted"))


def test_one_slow_pair_is_named_only_when_both_measures_agree():
    from trainfleet.commtest import pair_findings

    nodes = ["gpu-node-1", "gpu-node-2", "gpu-node-3", "gpu-node-4"]
    even = {f"{a}>{b}": 1.3e9 for a in nodes for b in nodes if a != b}
    stalled = {**even, "gpu-node-3>gpu-node-2": 0.31e9}  # the clean sandbox's one stall
    assert pair_findings({"sendrecv": stalled, "tcp": even}) == []
    slow_path = {**even, "gpu-node-3>gpu-node-2": 0.05e9}
    found = pair_findings({"sendrecv": stalled, "tcp": slow_path})
    assert [f.nodes for f in found] == [("gpu-node-2", "gpu-node-3")]
    assert found[0].evidence[0].startswith("send/recv gpu-node-3 -> gpu-node-2")
    # Without a TCP measure of the pair, send/recv alone still names it.
    assert [f.nodes for f in pair_findings({"sendrecv": stalled})] == [("gpu-node-2", "gpu-node-3")]
    # A node all of whose pairs are slow needs no second opinion.
    node3 = {k: (0.006e9 if "gpu-node-3" in k else v) for k, v in even.items()}
    assert [f.nodes for f in pair_findings({"sendrecv": node3, "tcp": even})] == [("gpu-node-3",)]
