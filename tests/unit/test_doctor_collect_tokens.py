"""Doctor's shared-storage tokens (.trainfleet-doctor-RUN_ID in each node's workdir) are removed
from every node whose probe ran, also where it timed out or sent no fact sheet back: such runs
left the directories in the launch directory (three were once committed to this repo)."""

from __future__ import annotations

import importlib
import random
import subprocess
import sys

import pytest
from doctor_fixtures import probe_params

from trainfleet import node
from trainfleet.cluster import load_cluster
from trainfleet.node import probe
from trainfleet.remote import Failure, NodeResult

# The module, not the function trainfleet.doctor exports under the same name.
collect = importlib.import_module("trainfleet.doctor.collect")

pytestmark = pytest.mark.unit


def test_tokens_are_removed_wherever_the_probe_ran(monkeypatch, tmp_path):
    cluster = load_cluster(hosts="a,b,c,d")
    params = {h: {"workdir": str(tmp_path), "run_id": "r1", "peers": [{}]} for h in "abcd"}
    outcomes = {
        "a": Failure.NONE,
        "b": Failure.TIMED_OUT,  # killed after writing its token
        "c": Failure.COMMAND_FAILED,  # crashed, no fact sheet
        "d": Failure.CONNECT_TIMEOUT,  # never ran: nothing to remove, no wait on it
    }
    results = [
        NodeResult(node=h, returncode=0, stdout="", stderr="", duration_s=0.0, failure=f)
        for h, f in outcomes.items()
    ]
    removed = {}

    def fake_run(nodes, argv, timeout):
        removed.update({n.host: argv[n.host] for n in nodes})
        return []

    monkeypatch.setattr(collect, "run_on_nodes", fake_run)
    collect._remove_tokens(cluster, results, params)
    assert sorted(removed) == ["a", "b", "c"]
    assert removed["b"] == ["rm", "-rf", "--", str(tmp_path / ".trainfleet-doctor-r1")]


def _probe_with_itself_as_peer(workdir, **extra):
    """A one-node probe that lists itself among its peers, so it writes its shared-storage
    token unless told not to."""
    params = probe_params(
        run_id="r2",
        workdir=str(workdir),
        peers=[{"node": "solo", "address": "127.0.0.1", "ports": [], "ssh_argv": None}],
        connect_timeout=1,
        skew=0,
        **extra,
    )
    proc = subprocess.run(
        node.argv(sys.executable, probe),
        input=node.line(probe.main, params),
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return node.read_answer(proc.stdout.decode(), probe.FactSheet, node="solo")["active"]


def test_a_read_only_probe_writes_no_token_where_a_plain_one_does(tmp_path):
    plain, read_only = tmp_path / "plain", tmp_path / "read-only"
    plain.mkdir()
    read_only.mkdir()
    assert _probe_with_itself_as_peer(plain)["token"] == "written"
    assert [p.name for p in plain.iterdir()] == [".trainfleet-doctor-r2"]
    assert "token" not in _probe_with_itself_as_peer(read_only, share_token=False)
    assert list(read_only.iterdir()) == []


def test_launch_dry_run_asks_for_read_only_probes_and_removes_nothing(monkeypatch):
    cluster = load_cluster(hosts="a,b")
    addresses = {"a": "10.0.0.1", "b": "10.0.0.2"}
    rng = random.Random(1)
    params, _ = collect.plan_params(cluster, addresses, quick=True, rng=rng, read_only=True)
    assert {p["share_token"] for p in params.values()} == {False}
    default, _ = collect.plan_params(cluster, addresses, quick=True, rng=rng)
    assert {p["share_token"] for p in default.values()} == {True}
    results = [
        NodeResult(node=h, returncode=0, stdout="", stderr="", duration_s=0, failure=Failure.NONE)
        for h in "ab"
    ]
    monkeypatch.setattr(collect, "run_on_nodes", lambda *a, **k: pytest.fail("ran rm on nodes"))
    collect._remove_tokens(cluster, results, params)
