"""The stack phase's decisions, without running it (its real runs are in tests/cluster; the node
side runs here for real on one process, without the all_reduce)."""

from __future__ import annotations

import ast
import base64
import json
import subprocess
import sys

import pytest
from doctor_fixtures import make_survey, reparsed, sheets_of

from trainfleet import node
from trainfleet.doctor import collective
from trainfleet.node import collective as node_collective
from trainfleet.node.answer import MARK
from trainfleet.remote import Failure, NodeResult

pytestmark = pytest.mark.unit


def test_the_stack_phase_runs_in_full_mode_where_a_node_has_the_stack(tmp_path):
    survey = make_survey(tmp_path)
    sheets = sheets_of(survey)
    assert collective.should_run(survey) and collective.can_all_reduce(survey)
    survey.quick = True
    assert not collective.should_run(survey)
    survey.quick = False
    sheets["gpu-node-3"]["packages"]["torch"] = None
    sheets["gpu-node-3"].pop("imports", None)
    survey = reparsed(survey, sheets)
    assert collective.should_run(survey) and not collective.can_all_reduce(survey)
    for sheet in sheets.values():
        sheet["packages"]["torch"] = sheet["packages"]["deepspeed"] = None
    assert not collective.should_run(reparsed(survey, sheets))


def test_no_all_reduce_when_a_node_was_not_examined(tmp_path):
    survey = make_survey(tmp_path)
    sheets = sheets_of(survey)
    del sheets["gpu-node-2"]
    survey = reparsed(survey, sheets)
    assert collective.should_run(survey) and not collective.can_all_reduce(survey)


IMPORTED = {"torch": "2.13.0+cpu", "torch_distributed": True, "gloo": True, "seconds": 1.4}


def _result(node, rc, stderr, *reports, failure=None):
    failure = failure or (Failure.NONE if rc == 0 else Failure.COMMAND_FAILED)
    steps = [{"step": step, "report": said} for r in reports for step, said in r.items()]
    stdout = "".join(MARK + json.dumps(s) + "\n" for s in steps)
    return NodeResult(
        node=node, returncode=rc, stdout=stdout, stderr=stderr, duration_s=1.0, failure=failure
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
            _result("gpu-node-1", 0, "", {"imports": IMPORTED}, {"all_reduce": {"ok": True}}),
            _result(
                "gpu-node-2",
                1,
                "Traceback...\nRuntimeError: Unable to find address for: ens14f0",
                {"imports": IMPORTED},
            ),
            _result(
                "gpu-node-3",
                1,
                "torch.distributed.DistNetworkError: timed out",
                {"imports": IMPORTED},
            ),  # fmt: skip
        ]

    monkeypatch.setattr(collective, "run_on_nodes", fake_run)
    findings, _ = collective.run_stack(survey, all_reduce=True)
    assert [(f.id, f.nodes) for f in findings] == [("iface-mismatch", ("gpu-node-2", "gpu-node-3"))]
    assert "gpu-node-2: RuntimeError: Unable to find address for: ens14f0" in findings[0].evidence
    # each rank is bound to the interface trainfleet chose for its node
    assert seen["gpu-node-2"][1] == "GLOO_SOCKET_IFNAME=ens14f1"
    groups = [_arguments(calls[host])[0]["all_reduce"] for host in seen]
    assert [g["rank"] for g in groups] == [0, 1, 2]  # ranks in node order
    assert {(g["world"], g["startup_s"], g["timeout_s"]) for g in groups} == {
        (3, collective.STARTUP_S, collective.TIMEOUT_S)
    }
    assert all(survey.facts[h].imports.torch == "2.13.0+cpu" for h in seen)


def test_a_retried_connect_is_not_the_verdict(tmp_path, monkeypatch):
    """Seen on a 32-node sandbox: while ARP resolved on the loaded bridge, gloo logged `No route
    to host` for connects it then retried, and the rank's real error was a timeout; that was
    reported as a firewall. A retried line is not the rank's verdict."""
    survey = make_survey(tmp_path)
    retried = ("[gloo/transport/tcp/debug_logger.cc:9] ERROR failed to connect, willRetry=1, "
               "retry=1, retryLimit=3, rank=2, error=SO_ERROR: No route to host")  # fmt: skip
    verdict = "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:129] Timed out waiting 20000ms"
    monkeypatch.setattr(
        collective,
        "run_on_nodes",
        lambda nodes, argv, stdin, timeout: [
            _result(n.host, 1, f"{retried}\n{verdict}\n{retried}", {"imports": IMPORTED})
            for n in nodes
        ],
    )
    [finding] = collective.run_stack(survey, all_reduce=True)[0]
    assert finding.id == "rendezvous-timeout"
    assert f"gpu-node-1: {verdict}" in finding.evidence


def test_a_passing_all_reduce_gives_no_finding(tmp_path, monkeypatch):
    survey = make_survey(tmp_path)
    monkeypatch.setattr(
        collective,
        "run_on_nodes",
        lambda nodes, argv, stdin, timeout: [
            _result(n.host, 0, "", {"imports": IMPORTED}, {"all_reduce": {"ok": True}})
            for n in nodes
        ],
    )
    assert collective.run_stack(survey, all_reduce=True)[0] == []


def test_a_node_whose_import_fails_or_hangs_is_reported_by_the_checks(tmp_path, monkeypatch):
    """Imports only (the checks before found an error): each node's report goes into its facts,
    a crash or a hang in the import becomes its import error; no all_reduce, no finding of its
    own. The software checks then name the node."""
    from trainfleet.doctor.checks.software import check_torch

    survey = make_survey(tmp_path)

    def fake_run(nodes, argv, stdin, timeout):
        assert all(_arguments(line)[0] == {"all_reduce": None} for line in stdin.values())
        return [
            _result("gpu-node-1", 0, "", {"imports": IMPORTED}),
            _result("gpu-node-2", -11, "Fatal Python error: Segmentation fault"),
            _result("gpu-node-3", 124, "", failure=Failure.TIMED_OUT),
        ]

    monkeypatch.setattr(collective, "run_on_nodes", fake_run)
    assert collective.run_stack(survey, all_reduce=False)[0] == []
    assert survey.facts["gpu-node-2"].imports.import_error == (
        "Fatal Python error: Segmentation fault"
    )
    assert "did not finish" in survey.facts["gpu-node-3"].imports.import_error
    assert [f.nodes for f in check_torch(survey)] == [("gpu-node-2",), ("gpu-node-3",)]


def test_the_node_side_reports_its_imports_and_skips_the_all_reduce_when_told():
    """The real node program, in this interpreter's environment (torch installed here)."""
    argv = node.argv(sys.executable, node_collective.run)
    done = subprocess.run(argv, input=node.line(node_collective.run, {"all_reduce": None}),
                          capture_output=True, check=False, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    # DeepSpeed may print to stdout when something imports it; the report is its own line
    said = node.read_answers(done.stdout.decode(), node_collective.StepReport, node="here")
    [report] = [s["report"] for s in said if s["step"] == "imports"]
    import torch

    assert report["torch"] == torch.__version__ and report["gloo"] is True
