"""Each network fault the sandbox injects is real: measured from inside the nodes.

(The ssh faults are checked through `run_on_nodes` in test_sandbox_exec.py; doctor's tests
check that each fault is *diagnosed*.)
"""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from trainfleet.cluster import load_cluster
from trainfleet.remote import run_on_nodes
from trainfleet.sandbox.faults import BARE_PATH, DECOYS, SMALL_MTU

pytestmark = pytest.mark.cluster

_LISTEN = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(8)\n"
    "print('ready', flush=True); time.sleep(30)\n"
)
_CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()\n"
    "    print('open')\n"
    "except OSError as exc:\n"
    "    print(type(exc).__name__)\n"
)


def _in_node(box, which, argv) -> str:
    out = subprocess.run(box.exec_argv(which, argv), capture_output=True, text=True, timeout=30)
    return out.stdout.strip()


def _tcp_from(box, src, dst, port) -> str:
    """'open', or the exception a connect from node `src` to node `dst`:`port` gives."""
    listener = subprocess.Popen(
        box.exec_argv(dst, [sys.executable, "-c", _LISTEN, str(port)]),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert listener.stdout.readline().strip() == "ready"
        return _in_node(
            box, src, [sys.executable, "-c", _CONNECT, box.node(dst).address, str(port)]
        )
    finally:
        listener.kill()
        listener.wait()


def test_firewall_passes_ssh_and_master_port_but_drops_ephemeral_ports(make_sandbox):
    box = make_sandbox(nodes=2, faults=["firewall-blocks-ports@1"])
    assert _tcp_from(box, 2, 1, 29500) == "open"
    assert _tcp_from(box, 2, 1, 41234) == "TimeoutError"  # dropped, like NCCL's random ports
    assert _tcp_from(box, 1, 2, 41234) == "open"  # only node 1 filters its input
    assert _in_node(box, 2, [sys.executable, "-c", _CONNECT, box.node(1).address, "22"]) == "open"


def test_firewall_ssh_only_drops_the_master_port_too(make_sandbox):
    box = make_sandbox(nodes=2, faults=["firewall-ssh-only@2"])
    assert _tcp_from(box, 1, 2, 29500) == "TimeoutError"


def test_port_in_use_holds_the_master_port_on_the_master(make_sandbox):
    box = make_sandbox(nodes=2, faults=["port-in-use"])
    probe = "import socket; s = socket.socket(); s.bind(('0.0.0.0', 29500)); print('free')"
    busy = subprocess.run(
        box.exec_argv(1, [sys.executable, "-c", probe]), capture_output=True, text=True
    )
    assert "Address already in use" in busy.stderr
    assert _in_node(box, 2, [sys.executable, "-c", probe]) == "free"


def test_hostname_loopback_only_on_the_faulty_node(make_sandbox):
    box = make_sandbox(nodes=2, faults=["hostname-loopback@2"])
    assert _in_node(box, 2, ["getent", "hosts", "gpu-node-2"]).split()[0] == "127.0.1.1"
    assert _in_node(box, 1, ["getent", "hosts", "gpu-node-2"]).split()[0] == box.node(2).address


def test_link_faults_mtu_slow_link_decoy(make_sandbox):
    box = make_sandbox(nodes=2, faults=["mtu-mismatch@2", "slow-link@2", "decoy-iface@2"])
    node = box.node(2)
    assert _in_node(box, 2, ["cat", f"/sys/class/net/{node.ifname}/mtu"]) == str(SMALL_MTU)
    assert _in_node(box, 1, ["cat", f"/sys/class/net/{box.node(1).ifname}/mtu"]) == "1500"
    assert "tbf" in _in_node(box, 2, ["tc", "qdisc", "show", "dev", node.ifname])
    links = _in_node(box, 2, ["ip", "-o", "-4", "addr", "show"])
    for name, address in DECOYS.items():
        assert f"{name}    inet {address}" in links
    names = [line.split()[1] for line in links.splitlines()]
    assert names.index("virbr0") < names.index(node.ifname)  # decoys come first, as NCCL sees


def test_hostname_unresolvable_and_bare_environment(make_sandbox):
    box = make_sandbox(nodes=2, faults=["hostname-unresolvable@2", "remote-env-differs@2"])
    lookup = subprocess.run(
        box.exec_argv(2, ["getent", "hosts", "gpu-node-2"]), capture_output=True, timeout=30
    )
    assert (lookup.returncode, lookup.stdout) == (2, b"")  # getent's "not found", not a failure
    assert _in_node(box, 1, ["getent", "hosts", "gpu-node-2"]).split()[0] == box.node(2).address
    cluster = load_cluster(cluster_file=str(box.cluster_file))
    paths = [r.stdout.strip() for r in run_on_nodes(cluster.nodes, ["sh", "-c", "echo $PATH"])]
    assert paths[1] == BARE_PATH and paths[0] != BARE_PATH


def test_node_down_does_not_answer(make_sandbox):
    box = make_sandbox(nodes=2, faults=["node-down@2"])
    with pytest.raises(OSError) as raised:
        socket.create_connection((box.node(2).address, 22), timeout=2).close()
    assert not isinstance(raised.value, ConnectionRefusedError)  # no answer at all, not "no"
