"""Which peers each probe tests: every pair up to 16 nodes, a structured sample beyond (the
master and the nodes 1, 2, 4, ... places on; the master tests all), and each listener told
exactly how many connections the sample sends it."""

from __future__ import annotations

import importlib
import random

import pytest

from trainfleet.cluster import load_cluster
from trainfleet.doctor.checks import network, transport
from trainfleet.setup import verify

collect = importlib.import_module("trainfleet.doctor.collect")

pytestmark = pytest.mark.unit


def _params(count: int, **kwargs) -> dict[str, dict]:
    hosts = [f"n{i}" for i in range(1, count + 1)]
    cluster = load_cluster(hosts=",".join(hosts))
    addresses = {h: f"10.0.0.{i}" for i, h in enumerate(hosts, start=1)}
    params, _ = collect.plan_params(cluster, addresses, quick=False, rng=random.Random(0), **kwargs)
    return params


def _tested_pairs(params: dict[str, dict]) -> set[tuple[str, str]]:
    return {(src, dst) for src, p in params.items() for dst in p["test_peers"] if dst != src}


@pytest.mark.parametrize("count", [2, 16])
def test_up_to_16_nodes_every_node_tests_every_node(count):
    params = _params(count)
    assert len(_tested_pairs(params)) == count * (count - 1)


@pytest.mark.parametrize("count", [17, 32, 64])
def test_beyond_16_each_node_is_tested_by_several_and_the_master_by_all(count):
    params = _params(count)
    pairs = _tested_pairs(params)
    assert len(pairs) < count * (count - 1) / 2
    hosts = list(params)
    master = hosts[0]
    for host in hosts[1:]:
        assert (host, master) in pairs and (master, host) in pairs
        sources = {src for src, dst in pairs if dst == host}
        targets = {dst for src, dst in pairs if src == host}
        assert len(sources) >= (count - 1).bit_length() and len(targets) >= 2, host
        assert params[host]["test_peers"].count(host) == 1  # its ssh to itself


@pytest.mark.parametrize("count", [3, 20])
def test_each_listener_waits_for_exactly_the_connections_sent_to_it(count):
    params = _params(count)
    for host, p in params.items():
        ports = len(p["listen_ports"])
        sent = sum(ports for src, dst in _tested_pairs(params) if dst == host)
        assert p["inbound"] == sent, host


def test_all_pairs_tests_every_pair_at_any_size():
    assert len(_tested_pairs(_params(20, all_pairs=True))) == 20 * 19


def test_setup_steps_skip_the_tcp_tests_only_where_no_check_of_theirs_reads_them():
    """A step's survey leaves the node-to-node TCP tests out (no waiting on ports a firewall
    drops) unless one of its checks reads what they measure."""
    reads_tcp = {network.check_firewall, network.check_port_in_use, transport.check_slow_link}
    sets = [v for v in vars(verify).values() if isinstance(v, verify.CheckSet)]
    assert len(sets) == 7
    for check_set in sets:
        assert check_set.tcp == any(c in reads_tcp for c in check_set.checks), check_set.label
    assert [s.label for s in sets if s.tcp] == [verify.FIREWALL.label]
