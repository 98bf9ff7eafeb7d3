"""The node probe's pure helpers and active tests, run on this machine (loopback only)."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time

import pytest
from doctor_fixtures import probe_params

from trainfleet import node
from trainfleet.cluster import load_cluster
from trainfleet.doctor.collect import plan_params
from trainfleet.node import network, peers, probe

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0100007F:1F90", ("127.0.0.1", 8080)),  # /proc/net/tcp: little-endian IPv4
        ("0B0AD50A:7332", ("10.213.10.11", 29490)),
        ("00000000:0016", ("0.0.0.0", 22)),
        ("00000000000000000000000001000000:1F90", ("::1", 8080)),  # /proc/net/tcp6
        ("00000000000000000000000000000000:0016", ("::", 22)),
        ("0000000000000000FFFF00000100007F:734C", ("::ffff:127.0.0.1", 29516)),
        ("B80D0120000000000000000001000000:01BB", ("2001:db8::1", 443)),
    ],
)
def test_hex_addr(text, expected):
    assert network._hex_addr(text) == expected


def _listener(host: str = "127.0.0.1", family: int = socket.AF_INET) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(8)
    return sock


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # bound, never listening: connects are refused


def test_listening_finds_our_own_listener_with_pid_and_command():
    with _listener() as sock:
        port = sock.getsockname()[1]
        entries = [e for e in network.listening({port}) if e["port"] == port]
    assert entries == [
        {"addr": "127.0.0.1", "port": port, "pid": os.getpid(), "cmd": entries[0]["cmd"]}
    ]
    assert "python" in entries[0]["cmd"]


@pytest.mark.skipif(not socket.has_ipv6 or not os.path.exists("/proc/net/tcp6"), reason="no IPv6")
def test_listening_reads_ipv6_sockets():
    try:
        sock = _listener("::1", socket.AF_INET6)
    except OSError as exc:
        pytest.skip(f"cannot bind ::1: {exc}")
    with sock:
        port = sock.getsockname()[1]
        entries = [e for e in network.listening(set()) if e["port"] == port]
    assert entries == [{"addr": "::1", "port": port, "pid": None, "cmd": None}]


def test_tcp_check_open():
    with _listener() as sock:
        port = sock.getsockname()[1]
        status, when = peers.tcp_check("127.0.0.1", port, time.time() + 2, 1.0)
        assert status == "open" and abs(when - time.time()) < 1


def test_tcp_check_refused_is_retried_until_the_deadline():
    port = _closed_port()
    start = time.time()
    status, last_attempt = peers.tcp_check("127.0.0.1", port, start + 0.5, 1.0)
    assert status == "refused" and last_attempt >= start + 0.4  # kept retrying
    assert 0.4 <= time.time() - start < 1.5


def test_tcp_check_a_timeout_counts_only_when_the_attempt_had_its_whole_bound():
    with _listener() as sock:  # its accept queue full: further handshakes get no answer
        sock.listen(0)
        port = sock.getsockname()[1]
        queued = [socket.create_connection(("127.0.0.1", port), timeout=1) for _ in range(1)]
        try:
            assert peers.tcp_check("127.0.0.1", port, time.time() + 2, 0.5)[0] == "timeout"
            # The deadline leaves 0.2 s of a 0.5 s bound: a loaded probe, not a dropped port.
            assert peers.tcp_check("127.0.0.1", port, time.time() + 0.2, 0.5)[0] == "late"
        finally:
            for conn in queued:
                conn.close()


def test_listeners_measure_a_stream_and_report_a_port_in_use():
    with _listener("0.0.0.0") as taken:
        busy = taken.getsockname()[1]
        free = _closed_port()
        listeners = peers.Listeners([free, busy])
        try:
            assert listeners.status == {
                str(free): "listening",
                str(busy): "bind failed: Address already in use",
            }
            sent = peers.send_stream("127.0.0.1", free, 0.2)
        finally:
            listeners.close_when(1, time.time() + 3)
    assert sent.startswith("sent ")
    count = int(sent.split()[1])
    assert count > 1 << 16
    received, first, last = listeners.streams["127.0.0.1"]
    assert received == count and 0 < last - first < 2
    assert listeners.accepted == 1


def test_send_stream_to_a_closed_port():
    assert peers.send_stream("127.0.0.1", _closed_port(), 0.1).startswith("not connected")


def _probe(params: dict, cwd) -> dict:
    """The node probe run here with `params`, its fact sheet parsed; behind the barrier, the
    launch node's word that every peer started follows its program on stdin."""
    go = probe.GoLine(peers=[p["node"] for p in params["peers"]], inbound=params["inbound"],
                      bandwidth_from=params["bandwidth_from"])  # fmt: skip
    stdin = node.line(probe.main, params)
    proc = subprocess.run(
        node.argv(sys.executable, probe),
        input=stdin + (json.dumps(go).encode() + b"\n" if params["barrier"] else b""),
        capture_output=True,
        timeout=60,
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return node.read_answer(proc.stdout.decode(), probe.FactSheet, node=params["node"])


def test_a_probe_without_tcp_tests_neither_listens_nor_connects_but_still_tests_ssh(tmp_path):
    """What setup's steps but the firewall's ask for: node a's peer b never starts its probe
    (as a firewall that drops every packet would look), and a waits for nothing."""
    cluster = load_cluster(hosts="a,b")
    addresses = {"a": "127.0.0.1", "b": "127.0.0.1"}
    rng = random.Random(0)
    plain, _ = plan_params(cluster, addresses, quick=False, rng=rng, tcp=False)
    with_tcp, _ = plan_params(cluster, addresses, quick=False, rng=rng)
    for params in (plain, with_tcp):
        # no real ssh to these names here: each peer's ssh test is a command that says no
        for peer in params["a"]["peers"]:
            assert peer["ssh_argv"][0] == "ssh"
            peer["ssh_argv"] = [sys.executable, "-c", "print('refused')"]
        params["a"]["workdir"] = str(tmp_path)
    with_tcp["a"].update(connect_timeout=1, skew=0)

    facts = _probe(plain["a"], tmp_path)
    tested = _probe(with_tcp["a"], tmp_path)

    assert facts["active"]["listen"] == {} and facts["active"]["tcp"] == {}
    assert "bandwidth_send" not in facts["active"]
    assert set(facts["active"]["ssh"]) == {"a", "b"}
    assert facts["active"]["shared"] == {"b": False}  # the shared-storage token still written
    ports = [str(p) for p in with_tcp["a"]["listen_ports"]]
    assert sorted(tested["active"]["listen"]) == sorted(ports)
    assert set(tested["active"]["tcp"]) == {"b"}


def test_payload_runs_as_a_one_node_probe(tmp_path):
    params = probe_params(master_addr=None, workdir=str(tmp_path),
                          owner_ports=[], connect_timeout=1, skew=0)  # fmt: skip
    facts = _probe(params, tmp_path)
    assert facts["node"] == "solo" and facts["probe_version"] == probe.PROBE_VERSION
    assert facts["hostname"] == socket.gethostname()
    assert facts["hostname"] in facts["resolve"]
    assert "lo" in {iface["name"] for iface in facts["interfaces"]}
    assert facts["python"]["executable"] == sys.executable
    assert facts["workdir"] == {
        "path": str(tmp_path),
        "exists": True,
        "disk": facts["workdir"]["disk"],
    }
    assert facts["code"] is None and "imports" not in facts  # quick
    assert set(facts["active"]) == {"listen", "listen_since", "listen_until", "bandwidth_in"}
    assert facts["active"]["listen"] == {} and facts["active"]["bandwidth_in"] == {}
    assert list(tmp_path.iterdir()) == []  # no peers: no token written


def test_the_launch_node_sends_every_probe_key_and_the_probe_reads_each_one():
    """No key sent and never read (import_timeout was), none read with a default that repeats
    a launch-side constant and never sent (ssh_parallel was)."""
    cluster = load_cluster(hosts="a,b")
    params, _ = plan_params(cluster, {"a": "127.0.0.1", "b": "127.0.0.1"}, quick=False,
                            rng=random.Random(3))  # fmt: skip
    assert set(params["a"]) == probe.ProbeParams.__required_keys__
    read = node.source("probe") + node.source("peers")
    unread = [k for k in probe.ProbeParams.__required_keys__ if f'params["{k}"]' not in read]
    assert unread == []
    assert "params.get(" not in read and "go.get(" not in read
