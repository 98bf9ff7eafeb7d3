"""Doctor network checks on recorded fact sheets: firewall, ports, names, MTU, IPv6."""

from __future__ import annotations

import pytest
from doctor_fixtures import MASTER, MASTER_ADDR, expect_one, make_survey, reparsed, sheets_of

from trainfleet.doctor.checks import network, transport
from trainfleet.doctor.findings import Severity

pytestmark = pytest.mark.unit

N1, N2, N3 = "gpu-node-1", "gpu-node-2", "gpu-node-3"


@pytest.fixture
def survey(tmp_path):
    return make_survey(tmp_path)


def _master_ports(sheets) -> list[str]:
    ports = list(sheets[MASTER]["active"]["listen"])
    assert "29500" in ports and len(ports) == 3
    return [p for p in ports if p != "29500"]


# ----------------------------------------------------------------------------- firewall


def test_firewall_dropping_random_ports_names_the_target_and_says_master_port_passes(survey):
    sheets = sheets_of(survey)
    random_ports = _master_ports(sheets)
    for src in (N2, N3):
        for port in random_ports:
            sheets[src]["active"]["tcp"][MASTER][port] = "timeout"
    survey = reparsed(survey, sheets)
    finding = expect_one(
        network.check_firewall(survey),
        "firewall-blocks-ports",
        Severity.ERROR,
        (MASTER,),
        evidence=[f"{N2} -> {MASTER}:{random_ports[0]} timeout", "29500 gets through"],
        fix=[MASTER, "iptables -I INPUT -p tcp -s 10.213.207.0/24 -j ACCEPT"],
    )
    assert "disable the firewall" in finding.fix and "do not" in finding.fix


def test_firewall_when_everything_is_dropped_does_not_claim_the_master_port_passes(survey):
    sheets = sheets_of(survey)
    for src in (N2, N3):
        for port in sheets[src]["active"]["tcp"][MASTER]:
            sheets[src]["active"]["tcp"][MASTER][port] = "timeout"
    survey = reparsed(survey, sheets)
    finding = expect_one(
        network.check_firewall(survey), "firewall-blocks-ports", Severity.ERROR, (MASTER,)
    )
    assert "gets through" not in "\n".join(finding.evidence)


def test_firewall_shows_the_drop_rules_and_the_ufw_rule_when_ufw_is_active(survey):
    sheets = sheets_of(survey)
    target = sheets[N3]
    target["firewall"]["iptables"]["out"] += "-A INPUT -p tcp -m tcp --dport 40000:60000 -j DROP\n"
    target["firewall"]["ufw"] = {"rc": 0, "out": "Status: active\n", "err": ""}
    port = next(iter(target["active"]["listen"]))
    sheets[N1]["active"]["tcp"][N3][port] = "timeout"
    survey = reparsed(survey, sheets)
    expect_one(
        network.check_firewall(survey),
        "firewall-blocks-ports",
        Severity.ERROR,
        (N3,),
        evidence=[f"{N3} firewall: -A INPUT -p tcp -m tcp --dport 40000:60000 -j DROP"],
        fix=["ufw allow from 10.213.207.0/24 proto tcp"],
    )


def test_firewall_ignores_a_port_the_target_could_not_bind(survey):
    sheets = sheets_of(survey)
    port = next(iter(sheets[N2]["active"]["listen"]))
    sheets[N2]["active"]["listen"][port] = "bind failed: Address already in use"
    sheets[N1]["active"]["tcp"][N2][port] = "refused"
    sheets[N3]["active"]["tcp"][N2][port] = "refused"
    survey = reparsed(survey, sheets)
    assert network.check_firewall(survey) == []


def test_firewall_silent_on_the_recording(survey):
    assert network.check_firewall(survey) == []


# ----------------------------------------------------------------------------- port in use


def test_port_in_use_names_the_holder_on_one_line(survey):
    sheets = sheets_of(survey)
    facts = sheets[MASTER]
    facts["active"]["listen"]["29500"] = "bind failed: Address already in use"
    facts["listening"] = [e for e in facts["listening"] if e["port"] != 29500] + [
        {"addr": "0.0.0.0", "port": 29500, "pid": 4242, "cmd": "python\ntrain.py \n --lr 1e-4"}
    ]
    survey = reparsed(survey, sheets)
    finding = expect_one(
        network.check_port_in_use(survey),
        "port-in-use",
        Severity.ERROR,
        (MASTER,),
        evidence=["29500", "pid 4242: python train.py --lr 1e-4"],
        fix=["kill 4242", MASTER, "master_port"],
    )
    assert len(finding.evidence) == 1 and "\n" not in finding.evidence[0]


def test_port_in_use_long_command_is_shortened(survey):
    sheets = sheets_of(survey)
    facts = sheets[MASTER]
    facts["listening"].append({"addr": "::", "port": 29500, "pid": 77, "cmd": "x" * 300})
    survey = reparsed(survey, sheets)
    finding = expect_one(
        network.check_port_in_use(survey), "port-in-use", Severity.ERROR, (MASTER,)
    )
    assert finding.evidence[0].endswith("...") and len(finding.evidence[0]) < 200


def test_port_in_use_bind_failure_without_a_visible_owner(survey):
    sheets = sheets_of(survey)
    sheets[MASTER]["active"]["listen"]["29500"] = "bind failed: Address already in use"
    sheets[MASTER]["listening"] = []
    survey = reparsed(survey, sheets)
    expect_one(
        network.check_port_in_use(survey),
        "port-in-use",
        Severity.ERROR,
        (MASTER,),
        evidence=["a process this user cannot see"],
        fix=["master_port"],
    )


def test_port_in_use_ignores_the_probes_own_listener(survey):
    sheets = sheets_of(survey)
    facts = sheets[MASTER]
    own = [e for e in facts["listening"] if e["port"] == 29500]
    assert own and all(e["pid"] == facts["pid"] for e in own)  # the recording holds it
    survey = reparsed(survey, sheets)
    assert network.check_port_in_use(survey) == []


# ----------------------------------------------------------------------------- names


def test_hostname_loopback_on_one_node(survey):
    sheets = sheets_of(survey)
    sheets[N2]["resolve"][N2] = {"addresses": ["127.0.1.1"]}
    survey = reparsed(survey, sheets)
    expect_one(
        network.check_hostnames(survey),
        "hostname-loopback",
        Severity.ERROR,
        (N2,),
        evidence=["127.0.1.1"],
        fix=["GLOO_SOCKET_IFNAME=ens14f1", N2],
    )


def test_hostname_loopback_is_fine_on_a_one_node_cluster(tmp_path):
    survey = make_survey(tmp_path, nodes=[N1])
    sheets = sheets_of(survey)
    sheets[N1]["resolve"][N1] = {"addresses": ["127.0.1.1"]}
    survey = reparsed(survey, sheets)
    assert network.check_hostnames(survey) == []


def test_hostname_unresolvable_own_name_is_an_error(survey):
    sheets = sheets_of(survey)
    sheets[N3]["resolve"][N3] = {"error": "[Errno -2] Name or service not known"}
    survey = reparsed(survey, sheets)
    expect_one(
        network.check_hostnames(survey),
        "hostname-unresolvable",
        Severity.ERROR,
        (N3,),
        evidence=["Name or service not known"],
        fix=[N3, "/etc/hosts"],
    )


def test_hostname_unresolvable_master_name_is_a_warning(survey):
    sheets = sheets_of(survey)
    sheets[N2]["resolve"][MASTER] = {"error": "[Errno -2] Name or service not known"}
    survey = reparsed(survey, sheets)
    expect_one(
        network.check_hostnames(survey),
        "hostname-unresolvable",
        Severity.WARNING,
        (N2,),
        evidence=[MASTER],
        fix=[MASTER_ADDR, N2],
    )


def test_clients_without_a_name_on_the_master_are_c10ds_err_3(survey):
    sheets = sheets_of(survey)
    n3 = survey.addresses[N3]
    named = {a: {"name": f"{h}-ipv4-mapped", "seconds": 0.001}
             for h, a in survey.addresses.items()}  # fmt: skip
    sheets[MASTER]["client_names"] = named
    assert network.check_client_names(reparsed(survey, sheets)) == []
    named[n3] = {"error": "[Errno -3] Temporary failure in name resolution", "seconds": 0.002}
    expect_one(
        network.check_client_names(reparsed(survey, sheets)),
        "hostname-unresolvable",
        Severity.WARNING,
        (MASTER,),
        evidence=[f"::ffff:{n3} ({N3})", "Errno -3", "err=-3"],
        fix=[f"::ffff:{n3} {N3}-ipv4-mapped", "/etc/hosts", MASTER],
    )
    sheets[MASTER]["ipv6_disabled"] = "1"  # no dual stack: c10d sees plain IPv4
    assert network.check_client_names(reparsed(survey, sheets)) == []


def test_ipv6_only_master_name(survey):
    sheets = sheets_of(survey)
    sheets[N3]["resolve"][MASTER] = {"addresses": ["fd00:10::11"]}
    survey = reparsed(survey, sheets)
    expect_one(
        transport.check_ipv6(survey),
        "ipv6-mismatch",
        Severity.WARNING,
        (N3,),
        evidence=["fd00:10::11", MASTER],
        fix=[MASTER_ADDR, "NCCL_SOCKET_FAMILY=AF_INET"],
    )


def test_ipv6_alongside_ipv4_is_fine(survey):
    sheets = sheets_of(survey)
    sheets[N3]["resolve"][MASTER] = {"addresses": ["fd00:10::11", MASTER_ADDR]}
    survey = reparsed(survey, sheets)
    assert transport.check_ipv6(survey) == []


# ----------------------------------------------------------------------------- MTU


def _set_mtu(facts: dict, name: str, mtu: int) -> None:
    matching = [i for i in facts["interfaces"] if i["name"] == name]
    assert len(matching) == 1
    matching[0]["mtu"] = mtu


def test_mtu_mismatch_names_only_the_odd_node(survey):
    sheets = sheets_of(survey)
    _set_mtu(sheets[N3], "ens14f2", 1280)
    survey = reparsed(survey, sheets)
    expect_one(
        transport.check_mtu(survey),
        "mtu-mismatch",
        Severity.ERROR,
        (N3,),
        evidence=[f"{N3}: ens14f2 mtu 1280", "gpu-node-[1-2]: mtu 1500"],
        fix=["ip link set ens14f2 mtu 1500", N3],
    )


def test_mtu_of_an_unused_interface_does_not_matter(survey):
    sheets = sheets_of(survey)
    _set_mtu(sheets[N2], "lo", 1500)
    survey = reparsed(survey, sheets)
    assert transport.check_mtu(survey) == []


def test_refused_before_the_peer_listened_is_not_a_firewall(tmp_path):
    """A peer whose probe started late refuses at first: inconclusive, not blocked."""
    survey = make_survey(tmp_path)
    sheets = sheets_of(survey)
    target = sheets["gpu-node-2"]["active"]
    port = str(survey.ports["gpu-node-2"][0])
    src = sheets["gpu-node-1"]["active"]
    src["tcp"]["gpu-node-2"][port] = "refused"
    src.setdefault("tcp_last_attempt", {}).setdefault("gpu-node-2", {})[port] = 100.0
    target["listen_since"] = 103.0  # it listened 3 s after the last refused attempt
    assert [f for f in network.check_firewall(reparsed(survey, sheets))] == []
    target["listen_since"] = 90.0  # it listened before: refused for real (REJECT)
    assert [f.nodes for f in network.check_firewall(reparsed(survey, sheets))] == [("gpu-node-2",)]
    target["listen_until"] = 99.0  # ...unless it had already stopped listening (a late peer)
    assert [f for f in network.check_firewall(reparsed(survey, sheets))] == []
