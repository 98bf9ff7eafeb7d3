"""--include/--exclude NODE_SPEC filters, with DeepSpeed's `parse_resource_filter` semantics."""

from __future__ import annotations

import pytest

from trainfleet.cluster import filter_nodes, load_cluster
from trainfleet.errors import SpecError

pytestmark = pytest.mark.unit


@pytest.fixture
def nodes():
    """worker-0..2 with 4 GPUs each, in hostfile order worker-1, worker-0, worker-2."""
    return list(load_cluster(hosts="worker-1:4,worker-0:4,worker-2:4").nodes)


def _shape(nodes):
    return [(n.host, n.slots, n.gpu_ids) for n in nodes]


def test_no_filter_keeps_everything(nodes):
    assert filter_nodes(nodes) == nodes
    assert filter_nodes(nodes, include="", exclude="") == nodes


def test_include_whole_node_takes_all_its_slots(nodes):
    assert _shape(filter_nodes(nodes, include="worker-0")) == [("worker-0", 4, (0, 1, 2, 3))]


def test_include_builds_from_scratch_in_hostfile_order(nodes):
    kept = filter_nodes(nodes, include="worker-2:3,1@worker-1:0")
    # Order follows the cluster (worker-1 before worker-2), not the spec; slots are sorted.
    assert _shape(kept) == [("worker-1", 1, (0,)), ("worker-2", 2, (1, 3))]


def test_include_repeated_slots_count_once(nodes):
    assert _shape(filter_nodes(nodes, include="worker-0:1,1,0")) == [("worker-0", 2, (0, 1))]


def test_exclude_whole_node_drops_it(nodes):
    kept = filter_nodes(nodes, exclude="worker-0")
    assert _shape(kept) == [("worker-1", 4, (0, 1, 2, 3)), ("worker-2", 4, (0, 1, 2, 3))]


def test_exclude_slots_keeps_the_rest_of_the_node(nodes):
    kept = filter_nodes(nodes, exclude="worker-1:0,2@worker-2")
    assert _shape(kept) == [("worker-1", 2, (1, 3)), ("worker-0", 4, (0, 1, 2, 3))]


def test_node_left_with_no_slots_is_dropped(nodes):
    kept = filter_nodes(nodes, exclude="worker-0:0,1,2,3")
    assert [n.host for n in kept] == ["worker-1", "worker-2"]


def test_filter_keeps_the_other_node_fields(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text("env: {A: '1'}\nnodes:\n  - {host: n1, slots: 4, interface: eth0}\n  - n2\n")
    cluster = load_cluster(cluster_file=str(path), include="n1:1,3")
    (node,) = cluster.nodes
    assert (node.host, node.slots, node.gpu_ids) == ("n1", 2, (1, 3))
    assert node.interface == "eth0" and dict(node.env) == {"A": "1"}


def test_ip_addresses_in_specs(nodes):
    ipnodes = list(load_cluster(hosts="10.0.0.1:2,fe80::2").nodes)
    assert _shape(filter_nodes(ipnodes, include="10.0.0.1:1")) == [("10.0.0.1", 1, (1,))]
    # An IPv6 literal holds ':' itself, so it can only be named as a whole node.
    assert _shape(filter_nodes(ipnodes, include="fe80::2")) == [("fe80::2", 1, (0,))]
    assert _shape(filter_nodes(ipnodes, exclude="fe80::2")) == [("10.0.0.1", 2, (0, 1))]


def test_load_cluster_applies_filter_and_moves_master(nodes):
    cluster = load_cluster(hosts="worker-1:4,worker-0:4", exclude="worker-1")
    assert [n.host for n in cluster.nodes] == ["worker-0"]
    assert cluster.master == "worker-0"
    assert cluster.world_size == 4


def test_load_cluster_keeps_yaml_master_when_it_survives(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text("master: b\nnodes: [a, b, c]\n")
    assert load_cluster(cluster_file=str(path), exclude="a").master == "b"
    assert load_cluster(cluster_file=str(path), exclude="b").master == "a"


# ----------------------------------------------------------------------------- errors


def _spec_error(nodes, **kwargs) -> SpecError:
    with pytest.raises(SpecError) as err:
        filter_nodes(nodes, **kwargs)
    assert err.value.line is None
    assert err.value.fix
    return err.value


def test_include_and_exclude_together_is_an_error(nodes):
    err = _spec_error(nodes, include="worker-0", exclude="worker-1")
    assert "mutually exclusive" in str(err)


@pytest.mark.parametrize("flag", ["include", "exclude"])
def test_unknown_host_lists_the_known_ones(nodes, flag):
    err = _spec_error(nodes, **{flag: "worker-9"})
    assert err.source == f"--{flag}"
    assert "'worker-9'" in str(err)
    assert "worker-1, worker-0, worker-2" in err.fix


@pytest.mark.parametrize("flag", ["include", "exclude"])
def test_unknown_slot_names_what_the_node_has(nodes, flag):
    err = _spec_error(nodes, **{flag: "worker-0:4"})
    assert "no slot 4" in str(err) and "[0, 1, 2, 3]" in str(err)


@pytest.mark.parametrize("spec", ["worker-0:a", "worker-0:1,", "worker-0:", "worker-0:-1"])
def test_non_numeric_slot_is_an_error(nodes, spec):
    err = _spec_error(nodes, include=spec)
    assert "is not a number" in str(err)
    assert "worker-0@worker-1:0,2" in err.fix


@pytest.mark.parametrize("spec", ["worker-0;id", "@worker-0", "-oProxyCommand=x"])
def test_bad_host_in_spec_is_an_error(nodes, spec):
    err = _spec_error(nodes, include=spec)
    assert err.source == "--include"


def test_excluding_everything_is_an_error(nodes):
    err = _spec_error(nodes, exclude="worker-0@worker-1@worker-2:0,1,2,3")
    assert "no node is left" in str(err)


def test_superscript_digit_slot_is_a_spec_error(nodes):
    _spec_error(nodes, include="worker-0:²")
