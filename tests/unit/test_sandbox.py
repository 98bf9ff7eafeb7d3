"""Sandbox pieces that need no root: fault parsing, node planning, generated files, errors."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import yaml

from trainfleet.catalog import CATALOG, FindingId
from trainfleet.cluster import parse_cluster_yaml, parse_hostfile
from trainfleet.errors import SandboxError
from trainfleet.sandbox import FAULTS, build, daemons, faults, netns, state, texts

pytestmark = pytest.mark.unit

HOSTS = ["gpu-node-1", "gpu-node-2", "gpu-node-3"]


def test_fault_defaults_and_explicit_nodes():
    assert faults.parse_fault("port-in-use", HOSTS) == faults.Fault("port-in-use", 1)
    assert faults.parse_fault("slow-link", HOSTS) == faults.Fault("slow-link", 3)
    assert faults.parse_fault("slow-link@2", HOSTS).node == 2
    assert faults.parse_fault("mtu-mismatch@gpu-node-2", HOSTS).node == 2


@pytest.mark.parametrize("text", ["no-such-fault", "slow-link@9", "slow-link@0", "slow-link@x"])
def test_bad_faults_are_clear_errors(text):
    with pytest.raises(SandboxError) as err:
        faults.parse_fault(text, HOSTS)
    assert err.value.fix


def test_every_fault_maps_to_a_catalogued_pitfall_or_is_a_hostile_node():
    pitfalls = {name: kind.pitfall_id for name, kind in FAULTS.items() if kind.pitfall_id}
    assert set(pitfalls.values()) <= set(CATALOG)
    assert all(isinstance(pitfall, FindingId) for pitfall in pitfalls.values())
    hostile_ones = {n for n, kind in FAULTS.items() if kind.pitfall_id is None and not kind.gpus}
    assert hostile_ones == {"hostname-impostor", "planted-modules"}


def test_firewall_rules_pass_ssh_and_master_port_only_for_the_ports_fault():
    ports = faults.firewall_rules("firewall-blocks-ports", 29500)
    ssh_only = faults.firewall_rules("firewall-ssh-only", 29500)
    accepted = lambda rules: {r[r.index("--dport") + 1] for r in rules if "--dport" in r}  # noqa: E731
    assert accepted(ports) == {"22", "29500"}
    assert accepted(ssh_only) == {"22"}
    assert ports[-1][-2:] == ["-j", "DROP"] and "--syn" in ports[-1]


def test_plan_nodes_names_addresses_and_interfaces():
    nodes = build.plan_nodes("x", 3, ["ens14f0", "ens14f1", "ens14f2"], "10.9.9.0/24")
    assert [n.hostname for n in nodes] == HOSTS
    assert [n.ifname for n in nodes] == ["ens14f0", "ens14f1", "ens14f2"]
    assert len({n.address for n in nodes}) == 3
    assert all(len(n.host_veth) <= 15 for n in nodes)  # Linux interface name limit
    one_name = build.plan_nodes("x", 2, ["eth1"], "10.9.9.0/24")
    assert [n.ifname for n in one_name] == ["eth1", "eth1"]
    assert [n.ifname for n in build.plan_nodes("x", 2, [], "10.9.9.0/24")] == ["eth0", "eth0"]


@pytest.mark.parametrize(
    "count,ifnames",
    [(0, []), (201, []), (3, ["a", "b"]), (1, ["bad;name"]), (1, ["virbr0"]), (1, ["lo"])],
)
def test_plan_nodes_rejects_bad_input(count, ifnames):
    with pytest.raises(SandboxError):
        build.plan_nodes("x", count, ifnames, "10.9.9.0/24")


@pytest.mark.parametrize("name", ["", "UPPER", "toolongname", "a-b", "a;b"])
def test_bad_sandbox_names(name):
    with pytest.raises(SandboxError):
        state.check_name(name)


def test_not_root_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    with pytest.raises(SandboxError) as err:
        build.up(nodes=2)
    assert "root" in err.value.what and "sudo" in err.value.fix


def test_written_specs_load_back_as_the_same_cluster(tmp_path):
    nodes = build.plan_nodes("x", 2, ["ens14f0", "ens14f1"], "10.9.9.0/24")
    cluster = parse_cluster_yaml(
        texts.cluster_yaml_text(nodes, tmp_path, slots=2, master_port=29501),
        str(tmp_path / "cluster.yaml"),
    )
    assert [n.host for n in cluster.nodes] == ["gpu-node-1", "gpu-node-2"]
    assert cluster.master == "gpu-node-1" and cluster.master_port == 29501
    assert all(n.slots == 2 for n in cluster.nodes)
    ssh = cluster.nodes[0].ssh
    assert ssh.identity_file == str(tmp_path / "id_ed25519")
    assert ssh.known_hosts_file == str(tmp_path / "known_hosts")
    assert ssh.config_file == str(tmp_path / "ssh_config")
    pool = parse_hostfile(texts.hostfile_text(nodes, slots=2))
    assert {h: s for h, (s, _) in pool.items()} == {"gpu-node-1": 2, "gpu-node-2": 2}
    doc = yaml.safe_load(texts.cluster_yaml_text(nodes, tmp_path, 1, 29500))
    assert doc["ssh"]["user"] == "root"


def test_hosts_file_maps_own_name_to_address_loopback_or_nothing():
    nodes = build.plan_nodes("x", 2, [], "10.9.9.0/24")
    own = f"{nodes[1].address}\tgpu-node-2"
    faulty = texts.etc_hosts_text(nodes, nodes[1], own_name="loopback")
    healthy = texts.etc_hosts_text(nodes, nodes[1])
    absent = texts.etc_hosts_text(nodes, nodes[1], own_name="absent")
    assert "127.0.1.1\tgpu-node-2" in faulty and own not in faulty
    assert own in healthy and "127.0.1.1" not in healthy
    assert "gpu-node-2" not in absent and f"{nodes[0].address}\tgpu-node-1" in absent
    # c10d names its clients by their IPv4-mapped address: a name for each, not the node's.
    assert f"::ffff:{nodes[0].address}\tgpu-node-1-ipv4-mapped" in healthy


def test_bare_env_fault_sets_path_in_sshd(tmp_path):
    node = build.plan_nodes("x", 1, [], "10.9.9.0/24")[0]
    assert "SetEnv PATH=/usr/bin:/bin" in texts.sshd_config_text(
        node, tmp_path, trust=True, path="/usr/bin:/bin"
    )
    assert "SetEnv" not in texts.sshd_config_text(node, tmp_path, trust=True)


def test_sshd_config_without_trust_points_at_no_key(tmp_path):
    node = build.plan_nodes("x", 1, [], "10.9.9.0/24")[0]
    trusted = texts.sshd_config_text(node, tmp_path, trust=True)
    untrusted = texts.sshd_config_text(node, tmp_path, trust=False)
    assert f"AuthorizedKeysFile {tmp_path / 'authorized_keys'}" in trusted
    assert "AuthorizedKeysFile /nonexistent" in untrusted
    assert f"ListenAddress {node.address}" in trusted and "PasswordAuthentication no" in trusted


def test_every_fault_in_the_catalog_is_applied_by_name_and_a_misspelt_name_is_a_bug():
    """A fault the builder never names would be accepted by `sandbox up` and inject nothing."""
    from trainfleet.sandbox import nodes  # here, not at the top: the other tests' nodes are lists

    source = "".join(inspect.getsource(module) for module in (build, nodes, daemons))
    named = set(re.findall(r'"([a-z0-9-]+)"', source))
    named |= {name for name, kind in FAULTS.items() if kind.gpus}  # applied by their spec
    assert set(FAULTS) <= named, sorted(set(FAULTS) - named)
    box = state.Sandbox(
        name="x", state_dir=Path("/nonexistent"), subnet="10.9.9.0/24", bridge="b", nodes=[]
    )
    with pytest.raises(KeyError, match="port-in-uses"):
        daemons.faulted(box, "port-in-uses")


def test_the_sandbox_name_may_be_given_as_an_argument_as_users_type_it(
    capsys, tmp_path, monkeypatch
):
    from trainfleet.cli.main import main

    monkeypatch.setenv("TRAINFLEET_SANDBOX_DIR", str(tmp_path))
    assert main(["sandbox", "status", "box2"]) == 1  # not up
    assert "sandbox 'box2' is not up" in capsys.readouterr().out
    assert main(["sandbox", "status", "box2", "--name", "box3"]) == 1
    assert "two sandbox names given (box2 and --name box3)" in capsys.readouterr().err
