"""doctor --fix: what it plans from findings, the cluster.yaml edits, the known_hosts append."""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest
from doctor_fixtures import make_survey, reparsed, sheets_of, window, with_id

from trainfleet import clusterfile
from trainfleet.cluster import parse_cluster_yaml
from trainfleet.doctor import DoctorReport, fix, node_summaries
from trainfleet.doctor.checks import network, run_checks
from trainfleet.doctor.findings import Finding, Severity
from trainfleet.doctor.fix import (
    _append_here,
    apply_plan,
    plan_fixes,
    render_plan,
)
from trainfleet.errors import TrainfleetError
from trainfleet.keyscan import fingerprint, unknown_key_name

pytestmark = pytest.mark.unit

N1, N2, N3 = "gpu-node-1", "gpu-node-2", "gpu-node-3"
ONE_IFACE_FOR_ALL = {"GLOO_SOCKET_IFNAME": "ens14f0", "NCCL_SOCKET_IFNAME": "ens14f0"}
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEu0j7Yen8E0N5VghM9IYpPVGZ6C9upE6vcOK677SwQR"


def _report(survey) -> DoctorReport:
    started, finished = window()
    return DoctorReport(
        findings=run_checks(survey, started=started, finished=finished),
        nodes=node_summaries(survey),
        survey=survey,
    )


def test_the_known_hosts_name_comes_from_sshs_own_message():
    stderr = (
        "No ED25519 host key is known for [10.0.0.2]:2222 and you have requested strict "
        "checking.\r\nHost key verification failed.\r\n"
    )
    assert unknown_key_name(stderr) == "[10.0.0.2]:2222"
    assert (
        unknown_key_name(
            "No ECDSA host key is known for gpu-node-2 and you have requested strict checking."
        )
        == "gpu-node-2"
    )
    assert unknown_key_name("Permission denied (publickey).") is None


def test_fingerprint_is_what_ssh_keygen_prints(tmp_path):
    key_file = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key_file], check=True)
    listed = subprocess.run(
        ["ssh-keygen", "-lf", f"{key_file}.pub"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    public = (tmp_path / "k.pub").read_text()
    assert fingerprint(public) == f"ssh-ed25519 {listed}"
    assert fingerprint(KEY) == "ssh-ed25519 SHA256:SJMUTI1e8X1iboPlwKpa21bq2/cOU1w2TPahhmfOg7U"


def test_append_known_hosts_creates_0600_keeps_old_lines_and_never_duplicates(tmp_path):
    path = tmp_path / "ssh" / "known_hosts"
    assert _append_here(str(path), [f"10.0.0.2 {KEY}"]) == "1"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    path.write_text(path.read_text() + "10.0.0.9 ssh-rsa AAAA")  # an old line, no newline
    assert _append_here(str(path), [f"10.0.0.2 {KEY}", f"10.0.0.3 {KEY}"]) == "1"
    assert path.read_text().splitlines() == [
        f"10.0.0.2 {KEY}",
        "10.0.0.9 ssh-rsa AAAA",
        f"10.0.0.3 {KEY}",
    ]


def test_fix_pins_interfaces_and_the_mismatch_is_gone(tmp_path):
    """One GLOO/NCCL_SOCKET_IFNAME for nodes whose interfaces are named differently (seed 000):
    --fix pins each node's own interface, after which the check finds nothing."""
    survey = make_survey(tmp_path, env=ONE_IFACE_FOR_ALL)
    report = _report(survey)
    assert with_id(report.findings, "iface-mismatch")
    cluster_file = str(tmp_path / "cluster.yaml")
    plan = plan_fixes(report, cluster_file=cluster_file)
    assert plan.host_keys == []
    assert plan.interfaces.interfaces == {N2: "ens14f1", N3: "ens14f2"}
    text = render_plan(plan)
    assert f"pin interface per node ({N2}: ens14f1, {N3}: ens14f2)" in text
    assert f"undo: mv {plan.interfaces.backup} {cluster_file}" in text
    before = (tmp_path / "cluster.yaml").read_text()

    apply_plan(plan, survey.cluster)

    assert (tmp_path / os.path.basename(plan.interfaces.backup)).read_text() == before
    edited = (tmp_path / "cluster.yaml").read_text()
    fixed = make_survey(tmp_path, env=ONE_IFACE_FOR_ALL)  # (rewrites cluster.yaml)
    fixed.cluster = parse_cluster_yaml(edited, cluster_file)
    assert with_id(network.check_interfaces(fixed), "iface-mismatch") == []
    assert node_summaries(fixed)[N2].interface == "ens14f1"


def test_an_interface_name_a_node_reports_is_never_written_unless_it_is_one(tmp_path, monkeypatch):
    """Without -c, --fix writes a new cluster.yaml: a node's `ip` output naming an interface
    `ens14f1\n    env: {LD_PRELOAD: ...}` must not reach it, nor every node at the next
    launch (#17)."""
    evil = "ens14f1\n    env: {LD_PRELOAD: /tmp/x.so}"
    survey = make_survey(tmp_path, env=ONE_IFACE_FOR_ALL)
    sheets = sheets_of(survey)
    for entry in sheets[N2]["interfaces"]:
        if entry["name"] == "ens14f1":
            entry["name"] = evil
    sheets[N2]["route_to_master"]["dev"] = evil
    survey = reparsed(survey, sheets)
    report = _report(survey)
    here = tmp_path / "elsewhere"
    here.mkdir()
    monkeypatch.chdir(here)
    plan = plan_fixes(report)
    assert N2 not in plan.interfaces.interfaces
    assert plan.interfaces.interfaces == {N3: "ens14f2"}
    assert any(f"interface of {N2}" in n and "not an interface name" in n for n in plan.not_done)
    assert "LD_PRELOAD" not in plan.interfaces.text
    with pytest.raises(TrainfleetError):
        clusterfile.new(survey.cluster, nodes={N2: {"interface": evil}}, written_by="test")


def test_a_pinned_interface_that_is_not_the_route_to_the_master_is_a_warning(tmp_path):
    survey = make_survey(tmp_path)
    sheets = sheets_of(survey)
    sheets[N2]["interfaces"].append(
        {"name": "ens9", "up": True, "ipv4": ["192.168.5.2/24"], "mtu": 1500}
    )
    text = (tmp_path / "cluster.yaml").read_text()
    survey = reparsed(survey, sheets)
    pinned = clusterfile.edit(text, "c", nodes={N2: {"interface": "ens9"}})
    survey.cluster = parse_cluster_yaml(pinned, "c")
    findings = with_id(network.check_interfaces(survey), "iface-wrong")
    assert [(f.nodes, f.severity) for f in findings] == [((N2,), Severity.WARNING)]
    assert "pins interface ens9" in findings[0].evidence[0] and "ens14f1" in findings[0].fix
    # The pin is what trainfleet sets there (and what the report says), not the route.
    assert node_summaries(survey)[N2].interface == "ens9"


def test_what_fix_never_does_is_listed_with_the_reason(tmp_path):
    survey = make_survey(tmp_path)
    report = _report(survey)
    report.findings.append(
        Finding(id="firewall-blocks-ports", severity=Severity.ERROR, nodes=(N3,), fix="x")
    )
    plan = plan_fixes(report, cluster_file=str(tmp_path / "cluster.yaml"))
    assert plan.changes == 0
    text = render_plan(plan)
    assert "nothing it can change safely" in text
    assert f"firewall-blocks-ports [{N3}]: doctor never changes a firewall" in text


def _unknown_key_stderr(name: str) -> str:
    return (
        f"No ED25519 host key is known for {name} and you have requested strict checking.\r\n"
        "Host key verification failed.\r\n"
    )


def _scans(monkeypatch) -> list[tuple[str, int]]:
    """ssh-keyscan stubbed: every address answers with KEY; the calls are recorded."""
    calls: list[tuple[str, int]] = []

    def keyscan(address: str, port: int) -> list[str]:
        calls.append((address, port))
        return [KEY]

    monkeypatch.setattr(fix, "keyscan", keyscan)
    return calls


def test_an_unknown_key_between_two_nodes_is_added_on_the_node_that_reported_it(
    tmp_path, monkeypatch
):
    scans = _scans(monkeypatch)
    survey = make_survey(tmp_path)
    sheets = sheets_of(survey)
    sheets[N2]["active"]["ssh"][N3] = {"rc": 255, "stderr": _unknown_key_stderr(N3)}
    plan = plan_fixes(_report(reparsed(survey, sheets)), cluster_file=str(tmp_path / "c.yaml"))
    assert [(k.target, k.peer, k.name, k.keys) for k in plan.host_keys] == [(N2, N3, N3, [KEY])]
    assert scans == [(survey.addresses[N3], 22)]


ODD_DESTINATIONS = [
    "evil.example.com",  # a plain name, not a node of the cluster (F13: a KeyError once)
    "10.0.0.66",
    "",
    "gpu-node-1.",
    "GPU-NODE-2",
    "\x1b]0;owned\x07gpu-node-2",
    "x" * 5000,
]


@pytest.mark.parametrize("dst", ODD_DESTINATIONS, ids=range(len(ODD_DESTINATIONS)))
@pytest.mark.parametrize("name", ["evil.example.com", "[evil.example.com]:2222", N3])
def test_a_destination_that_is_not_a_node_is_ignored_with_a_note(tmp_path, monkeypatch, dst, name):
    """A node's fact sheet names the ssh destinations it tried: one that is not a node of the
    cluster gets no key scanned or added, a note naming the reporting node, and no traceback."""
    scans = _scans(monkeypatch)
    survey = make_survey(tmp_path)
    sheets = sheets_of(survey)
    sheets[N2]["active"]["ssh"][dst] = {"rc": 255, "stderr": _unknown_key_stderr(name)}
    report = _report(reparsed(survey, sheets))
    plan = plan_fixes(report, cluster_file=str(tmp_path / "cluster.yaml"))
    assert plan.host_keys == [] and scans == []
    assert [n for n in plan.not_done if n.startswith("host key of")] == [
        f"host key of {dst[:60]!r}: {N2} reports an ssh to it, but it is not a node of this"
        " cluster; ignored"
    ]
    text = render_plan(plan)
    assert "\x1b" not in text and "\x07" not in text
    json.dumps(plan.to_json())
