"""commtest on real sandboxes, through the real launcher: every op's results correct, a clean
cluster has no slow link, a node whose link is shaped to 50 Mbit/s is named within the time
budget, and an interrupted or hung run still reports what it measured."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from session_scope import own_cmdlines
from trainfleet.cli.main import main

pytestmark = pytest.mark.cluster

SMALL = ["--min-bytes", "1K", "--max-bytes", "1M", "--factor", "32", "--iters", "3"]
SMALL += ["--warmup", "1", "--pair-bytes", "1M"]
HANG_TIMEOUT_S = 6
"""--timeout of the hang test: the process group's timeout, so it also bounds the ranks'
rendezvous (two ranks on two nodes, joined within a second or two here); the collective the
firewall stops ends at it either way, so 6 s shows what 10 s did."""


def _commtest(cluster_file, tmp_path, capsys, *extra):
    code = main(
        ["commtest", "-c", str(cluster_file), "--json", "--run-dir", str(tmp_path / "run")]
        + SMALL
        + list(extra)
    )
    out, err = capsys.readouterr()
    return code, json.loads(out), err


@pytest.mark.serial
def test_clean_cluster_every_op_correct_no_slow_link_and_a_plot(make_sandbox, tmp_path, capsys):
    box = make_sandbox(nodes=3, ifnames=["ens14f0", "ens14f1", "ens14f2"], slots=2)
    plot = tmp_path / "busbw.png"
    code, report, err = _commtest(box.cluster_file, tmp_path, capsys, "--plot", str(plot))
    assert report["world_size"] == 6 and report["backend"] == "gloo"
    ops = {r["op"] for r in report["results"]}
    assert ops == {
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "all_to_all",
        "sendrecv",
    }
    assert all(r["wrong"] == 0 and r["busbw"] > 0 for r in report["results"])
    # Every ordered pair of nodes, measured both ways, by send/recv and raw TCP.
    assert len(report["pairs"]["sendrecv"]) == 6 and len(report["pairs"]["tcp"]) == 6
    assert report["findings"] == [] and "slow-link" not in err
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A verdict was drawn against measured links (not the no-data fallback), results right.
    assert report["verdict"].startswith(("PASS", "SHORTFALL")), report["verdict"]
    assert "WRONG" not in report["verdict"] and report["links"]
    assert code == (0 if report["passed"] else 1)


def _worker_processes() -> list[str]:
    return [c for c in own_cmdlines().values() if "trainfleet.commtest.worker" in c]


@pytest.mark.serial
def test_a_shaped_link_is_named_and_the_sizes_it_cannot_carry_in_the_budget_are_skipped(
    make_sandbox, tmp_path, capsys
):
    """The pair rounds come first and name gpu-node-3 on the 50 Mbit/s link; the sweep up to
    16 MiB would take minutes over that link (the issue's 400 s), so the budget cuts it."""
    box = make_sandbox(nodes=3, faults=["slow-link@3"])
    started = time.monotonic()
    sweep = ["--ops", "all_reduce,all_gather", "--min-bytes", "1M", "--max-bytes", "16M"]
    sweep += ["--factor", "4", "--time-budget", "15"]
    code, report, err = _commtest(box.cluster_file, tmp_path, capsys, *sweep)
    slow = [f for f in report["findings"] if f["id"] == "slow-link"]
    assert [f["nodes"] for f in slow] == [["gpu-node-3"]], report["findings"]
    assert slow[0]["evidence"] and slow[0]["fix"]
    assert report["complete"] and report["pair_rounds"] == [3, 3]
    # Named while the job ran, before the sweep's first row.
    live = err.index("commtest: slow-link [gpu-node-3]")
    assert live < err.index("commtest: all_reduce "), err
    assert {s["op"] for s in report["skipped"]} == {"all_reduce", "all_gather"}
    assert all(s["bytes"] <= 16 << 20 for s in report["skipped"])
    # Within the budget, give or take the last size it chose to run.
    assert report["seconds"] < 15 * 1.5, report["seconds"]
    assert time.monotonic() - started < 90
    assert code == 1


def test_ctrl_c_prints_what_was_measured_as_valid_json(make_sandbox, tmp_path):
    box = make_sandbox(nodes=2)
    argv = [sys.executable, "-m", "trainfleet", "commtest", "-c", str(box.cluster_file), "--json"]
    argv += ["--ops", "all_reduce", "--min-bytes", "1K", "--max-bytes", "4M", "--factor", "4"]
    argv += ["--iters", "3000", "--warmup", "1", "--time-budget", "0", "--no-pairs"]
    argv += ["--run-dir", str(tmp_path / "run")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "run" / "logs" / "gpu-node-1.rank0.log"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (log.exists() and '"kind": "row"' in log.read_text()):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    report = json.loads(out)
    assert report["complete"] is False and report["stopped"] == "interrupted"
    assert report["results"] and all(r["wrong"] == 0 for r in report["results"])
    assert len(report["results"]) < 6  # 1K..4M by 4: it was stopped before the end
    assert report["verdict"].startswith("INCOMPLETE (interrupted)")
    deadline = time.monotonic() + 15
    while _worker_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _worker_processes() == []


def test_a_collective_that_hangs_ends_at_the_timeout_with_op_size_and_rank(make_sandbox, tmp_path):
    """The network to gpu-node-2 goes silent mid-run (a firewall added after every rank
    joined, ssh still allowed): the collective hangs, and ends at --timeout, named."""
    box = make_sandbox(nodes=2)
    argv = [sys.executable, "-m", "trainfleet", "commtest", "-c", str(box.cluster_file)]
    argv += ["--ops", "all_reduce", "--min-bytes", "1M", "--max-bytes", "1M", "--iters", "2000"]
    argv += ["--timeout", str(HANG_TIMEOUT_S), "--no-pairs", "--run-dir", str(tmp_path / "run")]
    argv += ["--json"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "run" / "logs" / "gpu-node-1.rank0.log"
    deadline = time.monotonic() + 90
    while not (log.exists() and "ranks joined" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    node2 = box.nodes[1].netns
    subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            node2,
            "iptables",
            "-I",
            "INPUT",
            "-p",
            "tcp",
            "!",
            "--dport",
            "22",
            "-j",
            "DROP",
        ],
        check=True,
    )
    started = time.monotonic()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, (out, err)
    assert "commtest: TIMEOUT op=all_reduce bytes=1048576" in err, err
    report = json.loads(out)  # what was measured before the hang, if anything, and why it ended
    assert report["complete"] is False and "TIMEOUT op=all_reduce" in report["stopped"]
    assert time.monotonic() - started < HANG_TIMEOUT_S + 30
