"""The doctor report: the healthy recording, exit codes, --json shape, the human rendering."""

from __future__ import annotations

import json

import pytest
from doctor_fixtures import NODES, expect_one, make_survey, reparsed, sheets_of, stub_which, window

from trainfleet import doctor
from trainfleet.doctor import DoctorReport, node_summaries
from trainfleet.doctor.checks import run_checks
from trainfleet.doctor.findings import Severity
from trainfleet.doctor.report import render
from trainfleet.remote import Failure, NodeResult, classify

pytestmark = pytest.mark.unit

N1, N2, N3 = NODES


@pytest.fixture(autouse=True)
def _launch_machine_tools(monkeypatch):
    stub_which(monkeypatch, present=("pdsh",))


def _report(survey, problems=()) -> DoctorReport:
    started, finished = window()
    return DoctorReport(
        findings=run_checks(survey, started=started, finished=finished),
        nodes=node_summaries(survey),
        problems=list(problems),
        seconds=1.25,
    )


def test_healthy_recording_has_no_errors_or_warnings(tmp_path, monkeypatch):
    stub_which(monkeypatch, present=())  # the most a clean cluster may get: pdsh info
    report = _report(make_survey(tmp_path))
    assert [f.severity for f in report.findings if f.severity > Severity.INFO] == []
    assert [f.id for f in report.findings] == ["pdsh-missing"]
    assert report.exit_code == 0


def test_healthy_node_summaries(tmp_path):
    nodes = node_summaries(make_survey(tmp_path))
    assert list(nodes) == list(NODES)
    interfaces = {h: (n.interface, n.nccl_default) for h, n in nodes.items()}
    assert interfaces == {
        N1: ("ens14f0", "ens14f0"),  # the master: the interface holding the master address
        N2: ("ens14f1", "ens14f1"),
        N3: ("ens14f2", "ens14f2"),
    }
    assert {n.subnet for n in nodes.values()} == {"10.213.207.0/24"}
    assert nodes[N2].gloo_default == "10.213.207.12"
    assert nodes[N1].versions["torch"] == "2.13.0+cpu" and nodes[N1].slots == 1


def test_gloo_default_on_a_loopback_hostname(tmp_path):
    survey = make_survey(tmp_path)
    sheets = sheets_of(survey)
    sheets[N2]["resolve"][N2] = {"addresses": ["127.0.1.1"]}
    survey = reparsed(survey, sheets)
    assert node_summaries(survey)[N2].gloo_default == "127.0.1.1 (loopback!)"


def test_exit_code_is_one_with_an_error_and_zero_with_warnings(tmp_path):
    survey = make_survey(tmp_path)
    sheets = sheets_of(survey)
    sheets[N3]["shm"]["total"] = 1 << 20
    assert _report(reparsed(survey, sheets)).exit_code == 0
    sheets[N3]["code"]["sha256"] = "f" * 64
    report = _report(reparsed(survey, sheets))
    assert [f.id for f in report.findings] == ["code-differs", "shm-small"]
    assert report.exit_code == 1


def _crashed(returncode: int, stderr: str) -> dict[str, NodeResult]:
    return {
        h: NodeResult(
            node=h,
            returncode=returncode,
            stdout="",
            stderr=stderr,
            duration_s=0.1,
            failure=Failure.COMMAND_FAILED,
        )  # fmt: skip
        for h in NODES
    }


def test_exit_code_two_when_no_probe_produced_facts(tmp_path, monkeypatch):
    survey = make_survey(tmp_path, failed=_crashed(1, "Traceback\nSyntaxError: bad"))
    monkeypatch.setattr(doctor, "collect", lambda cluster, **_: survey)
    report = doctor.run_doctor(survey.cluster)
    assert report.problems == [f"{h}: the probe failed: exit 1: SyntaxError: bad" for h in NODES]
    assert report.exit_code == 2 and report.to_json()["exit_code"] == 2
    assert all(not n.reachable for n in report.nodes.values())


def test_missing_python_everywhere_is_a_finding_not_a_doctor_problem(tmp_path, monkeypatch):
    survey = make_survey(tmp_path, failed=_crashed(127, "bash: python: No such file or directory"))
    monkeypatch.setattr(doctor, "collect", lambda cluster, **_: survey)
    report = doctor.run_doctor(survey.cluster)
    assert report.problems == []
    missing = [(f.id, f.severity, f.nodes) for f in report.findings]
    assert missing == [("remote-path-missing", Severity.ERROR, (h,)) for h in NODES]
    assert report.exit_code == 1


def test_doctor_problem_on_one_node_with_others_reachable_is_not_exit_two(tmp_path):
    survey = make_survey(tmp_path, failed={N3: _crashed(1, "SyntaxError: bad")[N3]})
    assert _report(survey, [f"{N3}: the probe failed: exit 1"]).exit_code == 0


def _unreachable(tmp_path):
    stderr = "Permission denied (publickey)."
    failed = {
        h: NodeResult(
            node=h,
            returncode=255,
            stdout="",
            stderr=stderr,
            duration_s=0.3,
            failure=classify(255, stderr, False, True),
        )  # fmt: skip
        for h in (N2, N3)
    }
    return make_survey(tmp_path, failed=failed)


def test_json_shape(tmp_path):
    report = _report(_unreachable(tmp_path))
    data = json.loads(json.dumps(report.to_json()))
    assert list(data["nodes"]) == list(NODES)
    assert data["nodes"][N2] == {
        "reachable": False,
        "address": "10.213.207.12",
        "failure": "auth failed (Permission denied (publickey).)",
    }
    assert data["nodes"][N1]["reachable"] is True and data["nodes"][N1]["interface"] == "ens14f0"
    # NodeSummary.to_json keeps the keys doctor --json had when nodes were dicts, in order.
    assert list(data["nodes"][N1]) == [
        "reachable", "hostname", "address", "interface", "subnet", "nccl_default",
        "gloo_default", "python", "versions", "gpus", "slots", "probe_seconds",
    ]  # fmt: skip
    assert list(data["nodes"][N1]["versions"]) == [
        "python", "torch", "nccl", "deepspeed", "transformers", "accelerate"
    ]  # fmt: skip
    assert data["exit_code"] == 1 and data["problems"] == []
    for finding in data["findings"]:
        assert set(finding) == {"id", "severity", "nodes", "evidence", "fix"}
    auth = [f for f in data["findings"] if f["id"] == "ssh-auth-failed"]
    assert [(f["severity"], f["nodes"]) for f in auth] == [("error", [N2]), ("error", [N3])]
    assert auth[0]["evidence"] == [
        "ssh from this machine: auth failed (Permission denied (publickey).)"
    ]
    assert "ssh-copy-id gpu-node-2" in auth[0]["fix"]


def test_render(tmp_path):
    survey = _unreachable(tmp_path)
    sheets = sheets_of(survey)
    sheets[N1]["imports"] = {"torch_error": "ImportError: libtorch_cuda.so"}
    survey = reparsed(survey, sheets)
    report = _report(survey)
    expect_one(report.findings, "torch-missing", Severity.ERROR, (N1,))
    text = render(report)
    assert text.startswith("trainfleet doctor: 3 node(s), 3 errors (1.2 s)")
    assert f"ERROR   ssh-auth-failed  [{N2}]" in text
    assert "ERROR   torch-missing  [gpu-node-1]" in text
    assert "  fix: `ssh-copy-id gpu-node-2`" in text
    assert "gpu-node-[2-3]: not examined: auth failed (Permission denied (publickey).)" in text
    assert "gpu-node-1: ens14f0 (10.213.207.0/24)" in text


def test_a_nodes_text_reaches_the_terminal_as_text_and_json_keeps_it_escaped(tmp_path):
    """A node's torch import error set the terminal's title and cleared the screen when doctor
    printed it (review F9)."""
    survey = _unreachable(tmp_path)
    sheets = sheets_of(survey)
    sheets[N1]["imports"] = {"torch_error": "ImportError: \x1b]0;owned\x07\x1b[2J\x9b31m ok\r"}
    report = _report(reparsed(survey, sheets))
    text = render(report)
    assert "ImportError: ?]0;owned??[2J?31m ok?" in text
    assert not any(c in text for c in "\x1b\x07\x9b\r")
    doc = json.dumps(report.to_json())
    assert "\\u001b]0;owned\\u0007\\u001b[2J\\u009b31m ok\\r" in doc  # the text, escaped


def test_render_folds_node_names(tmp_path):
    survey = make_survey(tmp_path)
    sheets = sheets_of(survey)
    for facts in sheets.values():
        facts["packages"]["torch"] = None
        facts.pop("imports", None)  # no torch: the stack phase does not run there
    survey = reparsed(survey, sheets)
    text = render(_report(survey))
    assert "1 warning" in text and "WARNING torch-missing  [gpu-node-[1-3]]" in text
    assert "\n  fix: install the training environment" in text
