"""Doctor interface and link checks: NCCL/gloo variables per node, defaults, slow links."""

from __future__ import annotations

import pytest
from doctor_fixtures import expect_one, make_survey, reparsed, sheets_of, with_id

from trainfleet.doctor.checks import network, transport
from trainfleet.doctor.findings import Severity

pytestmark = pytest.mark.unit

N1, N2, N3, N4 = "gpu-node-1", "gpu-node-2", "gpu-node-3", "gpu-node-4"
ONE_IFACE_FOR_ALL = {"GLOO_SOCKET_IFNAME": "ens14f0", "NCCL_SOCKET_IFNAME": "ens14f0"}


def _by_variable(findings, variable):
    return [f for f in with_id(findings, "iface-mismatch") if f.evidence[0].startswith(variable)]


def test_one_interface_name_for_all_nodes_flags_the_nodes_without_it(tmp_path):
    survey = make_survey(tmp_path, env=ONE_IFACE_FOR_ALL)
    findings = network.check_interfaces(survey)
    for variable in ("NCCL_SOCKET_IFNAME=ens14f0", "GLOO_SOCKET_IFNAME=ens14f0"):
        flagged = _by_variable(findings, variable)
        assert sorted(n for f in flagged for n in f.nodes) == [N2, N3]
        for finding in flagged:
            (node,) = finding.nodes
            own = {N2: "ens14f1", N3: "ens14f2"}[node]
            assert finding.severity is Severity.ERROR
            assert "cluster.yaml env" in finding.evidence[0] and own in finding.evidence[0]
            assert f"{node}: {variable.split('=')[0]}={own}" in finding.fix
    assert all(f.id == "iface-mismatch" for f in findings)
    gloo = _by_variable(findings, "GLOO_SOCKET_IFNAME")[0]
    assert "Unable to find address for: ens14f0" in gloo.evidence[0]


def test_nccl_interface_from_the_launch_environment(tmp_path):
    survey = make_survey(tmp_path, launch_env={"NCCL_SOCKET_IFNAME": "ens14f0"})
    findings = network.check_interfaces(survey)
    assert sorted(n for f in with_id(findings, "iface-mismatch") for n in f.nodes) == [N2, N3]
    assert all("this machine's environment" in f.evidence[0] for f in findings)


def test_nccl_interface_from_a_nodes_own_environment(tmp_path):
    survey = make_survey(tmp_path)
    sheets = sheets_of(survey)
    sheets[N3]["env"]["NCCL_SOCKET_IFNAME"] = "eth0"
    survey = reparsed(survey, sheets)
    expect_one(
        network.check_interfaces(survey),
        "iface-mismatch",
        Severity.ERROR,
        (N3,),
        evidence=["NCCL_SOCKET_IFNAME=eth0", f"{N3}'s own environment", "ens14f2"],
        fix=["NCCL_SOCKET_IFNAME=ens14f2"],
    )


@pytest.mark.parametrize("value", ["ens14f", "^docker,lo", "^=eth0", "e"])
def test_nccl_values_that_cover_every_node_are_fine(tmp_path, value):
    survey = make_survey(tmp_path, env={"NCCL_SOCKET_IFNAME": value})
    assert network.check_interfaces(survey) == []


def test_per_node_values_are_fine(tmp_path):
    per_node = {
        n: {"NCCL_SOCKET_IFNAME": i, "GLOO_SOCKET_IFNAME": i}
        for n, i in {N1: "ens14f0", N2: "ens14f1", N3: "ens14f2"}.items()
    }
    assert network.check_interfaces(make_survey(tmp_path, node_env=per_node)) == []


def test_gloo_interface_counts_must_match(tmp_path):
    per_node = {
        N1: {"GLOO_SOCKET_IFNAME": "ens14f0"},
        N2: {"GLOO_SOCKET_IFNAME": "ens14f1,lo"},
        N3: {"GLOO_SOCKET_IFNAME": "ens14f2"},
    }
    finding = expect_one(
        network.check_interfaces(make_survey(tmp_path, node_env=per_node)),
        "iface-mismatch",
        Severity.ERROR,
        (N1, N2, N3),
        evidence=[f"2 interface(s) on {N2}", f"1 interface(s) on {N1}"],
        fix=["same number"],
    )
    assert len(finding.evidence) == 3


def test_nccl_default_on_a_virtual_bridge_is_the_wrong_interface(tmp_path):
    survey = make_survey(tmp_path)
    sheets = sheets_of(survey)
    virbr0 = {
        "name": "virbr0",
        "state": "UP",
        "up": True,
        "mtu": 1500,
        "ipv4": ["192.168.122.1/24"],
    }
    sheets[N2]["interfaces"].insert(0, virbr0)
    survey = reparsed(survey, sheets)
    expect_one(
        network.check_interfaces(survey),
        "iface-wrong",
        Severity.WARNING,
        (N2,),
        evidence=["NCCL would use virbr0", "ens14f1"],
        fix=["NCCL_SOCKET_IFNAME=ens14f1", N2],
    )


def test_nccl_default_does_not_matter_once_the_variable_is_set(tmp_path):
    survey = make_survey(tmp_path, launch_env={"NCCL_SOCKET_IFNAME": "ens14f"})
    sheets = sheets_of(survey)
    sheets[N2]["interfaces"].insert(0, {"name": "virbr0", "up": True, "ipv4": ["1.2.3.4/24"]})
    survey = reparsed(survey, sheets)
    assert network.check_interfaces(survey) == []


def test_route_to_the_master_through_a_virtual_interface(tmp_path):
    survey = make_survey(tmp_path)
    sheets = sheets_of(survey)
    sheets[N3]["interfaces"].append({"name": "docker0", "up": True, "ipv4": ["172.17.0.1/16"]})
    sheets[N3]["route_to_master"]["dev"] = "docker0"
    survey = reparsed(survey, sheets)
    findings = network.check_interfaces(survey)
    virtual = [f for f in with_id(findings, "iface-wrong") if "virtual" in f.evidence[0]]
    assert [f.nodes for f in virtual] == [(N3,)]
    assert virtual[0].severity is Severity.WARNING and "docker0" in virtual[0].evidence[0]


def test_interfaces_silent_on_the_recording(tmp_path):
    assert network.check_interfaces(make_survey(tmp_path)) == []


# ----------------------------------------------------------------------------- slow link

MB = 1_000_000


def _ring(sheets, nodes, slow_node=None, slow=5.0, fast=1000.0):
    """Bandwidth in a ring as the receivers measured it: node i -> node i+1."""
    for i, src in enumerate(nodes):
        dst = nodes[(i + 1) % len(nodes)]
        rate = slow if slow_node in (src, dst) else fast
        sheets[dst]["active"]["bandwidth_in"] = {
            src: {"bytes": int(rate * MB * 0.3), "seconds": 0.3}
        }


def test_slow_node_in_a_four_node_ring(tmp_path):
    nodes = (N1, N2, N3, N4)
    survey = make_survey(tmp_path, nodes=nodes)
    sheets = sheets_of(survey)
    _ring(sheets, nodes, slow_node=N3)
    survey = reparsed(survey, sheets)
    expect_one(
        transport.check_slow_link(survey),
        "slow-link",
        Severity.WARNING,
        (N3,),
        evidence=[f"{N2} -> {N3}: 5.0 MB/s", f"{N3} -> {N4}: 5.0 MB/s", "1000.0 MB/s"],
        fix=[N3, "ethtool"],
    )


def test_slow_node_in_a_three_node_ring(tmp_path):
    survey = make_survey(tmp_path)
    sheets = sheets_of(survey)
    _ring(sheets, (N1, N2, N3), slow_node=N2)
    survey = reparsed(survey, sheets)
    expect_one(transport.check_slow_link(survey), "slow-link", Severity.WARNING, (N2,))


def test_one_slow_link_names_both_ends(tmp_path):
    nodes = (N1, N2, N3, N4)
    survey = make_survey(tmp_path, nodes=nodes)
    sheets = sheets_of(survey)
    _ring(sheets, nodes)
    sheets[N2]["active"]["bandwidth_in"][N1]["bytes"] = int(5 * MB * 0.3)
    survey = reparsed(survey, sheets)
    expect_one(transport.check_slow_link(survey), "slow-link", Severity.WARNING, (N1, N2))


def test_fewer_than_three_links_are_not_compared(tmp_path):
    survey = make_survey(tmp_path)
    sheets = sheets_of(survey)
    _ring(sheets, (N1, N2, N3), slow_node=N2)
    sheets[N1]["active"]["bandwidth_in"] = {}
    survey = reparsed(survey, sheets)
    assert len(transport.link_rates(survey)) == 2
    assert transport.check_slow_link(survey) == []


def test_recorded_ring_is_even(tmp_path):
    survey = make_survey(tmp_path)
    rates = transport.link_rates(survey)
    assert set(rates) == {(N1, N2), (N2, N3), (N3, N1)}
    assert transport.check_slow_link(survey) == []
