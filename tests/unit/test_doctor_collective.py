"""The all_reduce phase's decisions, without running it (its real runs are in tests/cluster)."""

from __future__ import annotations

import ast
import base64
import json

import pytest
from doctor_fixtures import make_survey, reparsed, sheets_of

from trainfleet.doctor import collective
from trainfleet.remote import Failure, NodeResult

pytestmark = pytest.mark.unit


def test_runs_only_in_full_mode_with_torch_on_every_examined_node(tmp_path):
    survey = make_survey(tmp_path)
    sheets = sheets_of(survey)
    assert collective.should_run(survey)
    survey.quick = True
    assert not collective.should_run(survey)
    survey.quick = False
    sheets["gpu-node-3"]["packages"]["torch"] = None
    sheets["gpu-node-3"].pop("imports", None)
    assert not collective.should_run(reparsed(survey, sheets))


def test_not_run_when_a_node_was_not_examined(tmp_path):
    survey = make_survey(tmp_path)
    sheets = sheets_of(survey)
    del sheets["gpu-node-2"]
    survey = reparsed(survey, sheets)
    assert not collective.should_run(survey)


def _result(node, rc, stderr):
    failure = Failure.NONE if rc == 0 else Failure.COMMAND_FAILED
    return NodeResult(
        node=node, returncode=rc, stdout="", stderr=stderr, duration_s=1.0, failure=failure
    )


def _arguments(line: bytes) -> list:
    """The arguments a shipped program's call gets (the JSON at the end of its line)."""
    program = ast.parse(base64.b64decode(line))
    [loads] = [c for c in ast.walk(program) if isinstance(c, ast.Call)
               and getattr(c.func, "attr", None) == "loads"]  # fmt: skip
    return json.loads(loads.args[0].value)


def test_failures_are_classified_and_each_rank_is_named(tmp_path, monkeypatch):
    survey = make_survey(tmp_path)
    seen, calls = {}, {}

    def fake_run(nodes, argv, stdin, timeout):
        seen.update(argv)
        calls.update(stdin)
        return [
            _result("gpu-node-1", 0, ""),
            _result(
                "gpu-node-2", 1, "Traceback...\nRuntimeError: Unable to find address for: ens14f0"
            ),
            _result("gpu-node-3", 1, "torch.distributed.DistNetworkError: timed out"),
        ]

    monkeypatch.setattr(collective, "run_on_nodes", fake_run)
    findings, _ = collective.run_collective(survey)
    assert [(f.id, f.nodes) for f in findings] == [("iface-mismatch", ("gpu-node-2", "gpu-node-3"))]
    assert "gpu-node-2: RuntimeError: Unable to find address for: ens14f0" in findings[0].evidence
    # each rank is bound to the interface trainfleet chose for its node
    assert seen["gpu-node-2"][1] == "GLOO_SOCKET_IFNAME=ens14f1"
    assert [_arguments(calls[host])[2] for host in seen] == [0, 1, 2]  # ranks in node order


def test_a_passing_all_reduce_gives_no_finding(tmp_path, monkeypatch):
    survey = make_survey(tmp_path)
    monkeypatch.setattr(
        collective,
        "run_on_nodes",
        lambda nodes, argv, stdin, timeout: [_result(n.host, 0, "") for n in nodes],
    )
    assert collective.run_collective(survey)[0] == []
