"""NCCL/gloo interface selection (netsel) and findings.merge: pure functions."""

from __future__ import annotations

import pytest
from doctor_fixtures import facts_of

from trainfleet.doctor import netsel
from trainfleet.doctor.facts import Interface
from trainfleet.doctor.findings import Finding, Severity, merge

pytestmark = pytest.mark.unit


def _iface(name: str, ipv4: list[str] | None = None, up: bool = True) -> dict:
    return {"name": name, "up": up, "ipv4": ipv4 if ipv4 is not None else ["10.0.0.1/24"]}


def _parsed(*ifaces: dict) -> tuple[Interface, ...]:
    """Interfaces as a fact sheet lists them, parsed as collect parses a node's sheet."""
    return facts_of({"interfaces": list(ifaces)}).interfaces


IFACES_JSON = [
    _iface("lo", ["127.0.0.1/8"]),
    _iface("docker0", ["172.17.0.1/16"]),
    _iface("ens14f0", ["10.0.0.11/24"]),
    _iface("ens14f1", ["10.0.1.11/24"], up=False),  # down
    _iface("ens14f2", []),  # no address
    _iface("ens14f10", ["10.0.2.11/24"]),
]
IFACES = _parsed(*IFACES_JSON)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("ens", ["ens14f0", "ens14f10"]),  # prefix
        ("ens14f1", ["ens14f10"]),  # a prefix: ens14f1 itself is down
        ("=ens14f1", []),  # exact: only the down one
        ("=ens14f0,ens14f10", ["ens14f0", "ens14f10"]),
        ("^docker,lo", ["ens14f0", "ens14f10"]),  # exclude prefixes
        ("^=ens14f0", ["lo", "docker0", "ens14f10"]),  # exclude exact names
        ("^ens", ["lo", "docker0"]),
        ("eth", []),
        ("e", ["lo", "docker0", "ens14f0", "ens14f10"]),  # one character: ignored
        ("=", ["lo", "docker0", "ens14f0", "ens14f10"]),  # even '=' or '^' alone
        ("^", ["lo", "docker0", "ens14f0", "ens14f10"]),
        ("", ["lo", "docker0", "ens14f0", "ens14f10"]),
    ],
)
def test_nccl_socket_ifname_semantics(value, expected):
    assert netsel.nccl_matches(value, IFACES) == expected


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["lo", "docker0", "ens14f0", "ib0"], "ib0"),  # ib* first
        (["lo", "docker0", "ens14f0", "virbr0"], "ens14f0"),  # then anything but docker/lo
        (["lo", "virbr0", "ens14f0"], "virbr0"),  # in interface order: virbr0 is not excluded
        (["lo", "docker0"], "docker0"),  # then docker
        (["lo"], "lo"),  # then lo
    ],
)
def test_nccl_default_order(names, expected):
    assert netsel.nccl_default(_parsed(*(_iface(n) for n in names))) == expected


def test_nccl_default_skips_unusable_interfaces():
    unusable = _parsed(_iface("ib0", []), _iface("eth0", up=False), _iface("lo"))
    assert netsel.nccl_default(unusable) == "lo"
    assert netsel.nccl_default(_parsed(_iface("eth0", up=False))) is None


def test_gloo_takes_exact_usable_names():
    assert netsel.gloo_missing("ens14f0", IFACES) == []
    assert netsel.gloo_missing("ens14f", IFACES) == ["ens14f"]  # no prefix matching
    assert netsel.gloo_missing("ens14f0,ens14f1,ens14f2", IFACES) == ["ens14f1", "ens14f2"]
    assert netsel.gloo_missing("x", IFACES) == []  # one character: ignored


def test_chosen_interface_on_the_master_is_the_one_holding_its_address():
    facts = facts_of(
        {"interfaces": IFACES_JSON, "route_to_master": {"dev": "lo", "src": "10.0.2.11"}}
    )
    assert netsel.chosen_interface(facts, "10.0.2.11") == "ens14f10"
    assert netsel.chosen_interface(facts, "192.0.2.1") == "lo"  # address held nowhere


def test_chosen_interface_elsewhere_is_the_route_device():
    facts = facts_of(
        {"interfaces": IFACES_JSON, "route_to_master": {"dev": "ens14f0", "src": "10.0.0.11"}}
    )
    assert netsel.chosen_interface(facts, "10.0.0.12") == "ens14f0"
    no_route = facts_of({"interfaces": IFACES_JSON, "route_to_master": None})
    assert netsel.chosen_interface(no_route, "x") is None
    broken = {"interfaces": {"error": "ip: not found"}, "route_to_master": {"dev": "eth0"}}
    assert netsel.chosen_interface(facts_of(broken), "10.0.0.12") is None


def test_subnet_and_virtual():
    assert netsel.subnet_of("ens14f0", IFACES) == "10.0.0.0/24"
    assert netsel.subnet_of("ens14f2", IFACES) is None
    assert netsel.subnet_of("missing", IFACES) is None
    assert [
        n for n in ("docker0", "virbr0", "veth1a2b", "ens14f0", "ib0") if netsel.is_virtual(n)
    ] == [
        "docker0",
        "virbr0",
        "veth1a2b",
    ]


# ----------------------------------------------------------------------------- merge


def _f(pitfall_id, severity, nodes, evidence, fix="fix it"):
    return Finding(id=pitfall_id, severity=severity, nodes=nodes, evidence=evidence, fix=fix)


def test_merge_joins_same_id_severity_and_fix():
    findings = [
        _f("slow-link", Severity.WARNING, ("n1",), ["a"]),
        _f("torch-missing", Severity.INFO, ("n1",), ["i"]),
        _f("slow-link", Severity.WARNING, ("n2", "n1"), ["a", "b"]),
        _f("slow-link", Severity.WARNING, ("n3",), ["c"], fix="other fix"),
        _f("port-in-use", Severity.ERROR, ("n1",), ["e"]),
        _f("slow-link", Severity.ERROR, ("n4",), ["d"]),
    ]
    before = [f.to_json() for f in findings]
    merged = merge(findings)
    assert [(f.id, f.severity, f.nodes, f.evidence, f.fix) for f in merged] == [
        ("port-in-use", Severity.ERROR, ("n1",), ["e"], "fix it"),
        ("slow-link", Severity.ERROR, ("n4",), ["d"], "fix it"),
        ("slow-link", Severity.WARNING, ("n1", "n2"), ["a", "b"], "fix it"),
        ("slow-link", Severity.WARNING, ("n3",), ["c"], "other fix"),
        ("torch-missing", Severity.INFO, ("n1",), ["i"], "fix it"),
    ]
    assert [f.to_json() for f in findings] == before  # inputs untouched


def test_finding_json():
    finding = _f("gpu-busy", Severity.WARNING, ("n1",), ["pid 1"])
    assert finding.to_json() == {
        "id": "gpu-busy",
        "severity": "warning",
        "nodes": ["n1"],
        "evidence": ["pid 1"],
        "fix": "fix it",
    }
