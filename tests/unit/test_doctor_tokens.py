"""Doctor's shared-storage tokens (.trainfleet-doctor-RUN_ID in each node's workdir) are removed
from every node whose probe ran, also where it timed out or sent no fact sheet back: such runs
left the directories in the launch directory (three were once committed to this repo)."""

from __future__ import annotations

import importlib

import pytest

from trainfleet.cluster import load_cluster
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
