"""A real sandbox cluster: separate hosts, real sshd, `trainfleet exec` across them."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from session_scope import own_sandbox_name
from trainfleet import sandbox
from trainfleet.cli.main import main
from trainfleet.cluster import load_cluster
from trainfleet.errors import SandboxError
from trainfleet.remote import Failure, run_on_nodes

pytestmark = pytest.mark.cluster

IFNAMES = ["ens14f0", "ens14f1", "ens14f2"]


def _leftovers(name: str) -> dict[str, list[str]]:
    """Everything of sandbox `name` still on this machine."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    procs = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True).stdout
    state_dir = str(sandbox.state.state_root() / name)
    return {
        "netns": [ln for ln in netns.splitlines() if ln.startswith(f"tf-{name}-")],
        "links": [ln for ln in links.splitlines() if f"tv-{name}-" in ln or f"tfbr-{name}" in ln],
        # A zombie already released everything; the sshd's parent (init) reaps it later.
        "processes": [p for p in procs.splitlines() if state_dir in p and not p.startswith("Z")],
        "etc": [str(p) for p in Path("/etc/netns").glob(f"tf-{name}-*")],
        "state": [state_dir] if Path(state_dir).exists() else [],
    }


def test_exec_prints_each_nodes_own_hostname(make_sandbox, capsys):
    box = make_sandbox(nodes=3, ifnames=IFNAMES)
    assert main(["exec", "-c", str(box.cluster_file), "--", "hostname"]) == 0
    lines = sorted(capsys.readouterr().out.splitlines())
    assert lines == ["gpu-node-1: gpu-node-1", "gpu-node-2: gpu-node-2", "gpu-node-3: gpu-node-3"]


def test_nodes_have_their_own_interface_names_and_hosts_files(make_sandbox):
    box = make_sandbox(nodes=3, ifnames=IFNAMES)
    cluster = load_cluster(cluster_file=str(box.cluster_file))
    results = run_on_nodes(cluster.nodes, ["ls", "/sys/class/net"])
    for node, result in zip(box.nodes, results, strict=True):
        assert result.ok, result.stderr
        assert set(result.stdout.split()) == {"lo", node.ifname}
    resolved = run_on_nodes(cluster.nodes, ["getent", "hosts", "gpu-node-3"])
    assert {r.stdout.split()[0] for r in resolved} == {box.node(3).address}


def test_every_node_reaches_every_node_over_ssh_including_itself(make_sandbox):
    box = make_sandbox(nodes=3)
    cluster = load_cluster(cluster_file=str(box.cluster_file))
    hop = " ; ".join(
        f"ssh -F {box.ssh_config} -oBatchMode=yes {n.hostname} hostname" for n in box.nodes
    )
    for result in run_on_nodes(cluster.nodes, ["sh", "-c", hop]):
        assert result.ok, result.stderr
        assert result.stdout.split() == ["gpu-node-1", "gpu-node-2", "gpu-node-3"]


def test_hostfile_with_an_unreachable_node_fails_fast_and_names_it(make_sandbox, tmp_path, capsys):
    box = make_sandbox(nodes=1)
    unreachable = box.subnet.rsplit(".", 1)[0] + ".250"  # in the sandbox subnet, held by no node
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"gpu-node-1 slots=1\n{unreachable} slots=1\n")
    argv = ["exec", "--hostfile", str(hostfile), "--ssh-config", str(box.ssh_config)]
    start = time.monotonic()
    code = main([*argv, "--connect-timeout", "5", "--", "true"])
    elapsed = time.monotonic() - start
    err = capsys.readouterr().err
    assert code == 255
    assert elapsed < 5 + 3, f"took {elapsed:.1f} s with a 5 s connect timeout"
    assert f"{unreachable}: unreachable" in err and "[ssh-unreachable]" in err
    assert "gpu-node-1" not in err  # the reachable node is not reported as failed


def test_exec_json_and_fold(make_sandbox, capsys):
    box = make_sandbox(nodes=3)
    assert main(["exec", "-c", str(box.cluster_file), "--fold", "--", "echo same"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "gpu-node-[1-3]: same", f"stderr: {err!r}"
    code = main(["exec", "-c", str(box.cluster_file), "--json", "--", "sh -c 'exit $((3 - 0))'"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 3
    assert [n["returncode"] for n in doc["nodes"]] == [3, 3, 3]
    assert {n["failure"] for n in doc["nodes"]} == {"command_failed"}


def test_down_leaves_nothing_behind(make_sandbox):
    box = make_sandbox(nodes=3, faults=["port-in-use", "slow-link", "decoy-iface"])
    assert all(_leftovers(box.name).values())  # the check sees a live sandbox
    sandbox.down(box.name)
    assert _leftovers(box.name) == {k: [] for k in ("netns", "links", "processes", "etc", "state")}
    assert sandbox.down(box.name) == []  # idempotent


def test_down_cleans_up_after_a_crash_that_lost_the_state(make_sandbox):
    box = make_sandbox(nodes=2)
    (box.state_dir / "state.json").unlink()  # as if `up` died before recording anything
    assert sandbox.load(box.name) is None
    sandbox.down(box.name)
    assert _leftovers(box.name) == {k: [] for k in ("netns", "links", "processes", "etc", "state")}


def test_up_refuses_a_second_sandbox_of_the_same_name(make_sandbox):
    box = make_sandbox(nodes=1)
    with pytest.raises(SandboxError) as err:
        sandbox.up(nodes=1, name=box.name)
    assert "already up" in err.value.what


def test_two_sandboxes_whose_names_map_to_one_subnet_each_get_their_own(make_sandbox):
    """Names hash to 250 subnets: two alike must not put two bridges on one /24, where one
    sandbox's packets would go to the other's nodes."""
    by_subnet: dict[str, str] = {}
    for number in range(9000, 9999):
        name = own_sandbox_name("t", str(number))
        twin = by_subnet.setdefault(sandbox.state.default_subnet(name), name)
        if twin != name:
            break
    boxes: list[sandbox.Sandbox] = []
    try:
        for each in (twin, name):
            boxes.append(sandbox.up(name=each, nodes=2))
        assert boxes[0].subnet != boxes[1].subnet
        for box in boxes:
            results = run_on_nodes(
                load_cluster(cluster_file=str(box.cluster_file)).nodes, ["hostname"]
            )
            assert [r.stdout for r in results] == ["gpu-node-1\n", "gpu-node-2\n"], box.name
        with pytest.raises(SandboxError) as err:  # a subnet asked for that is in use
            make_sandbox(nodes=1, subnet=boxes[0].subnet)
        assert f"overlaps {boxes[0].subnet}" in err.value.what
    finally:
        for box in boxes:
            sandbox.down(box.name)


def test_status_reports_nodes(make_sandbox, capsys):
    box = make_sandbox(nodes=2, faults=["node-down@2"])
    assert main(["sandbox", "status", "--name", box.name, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(n["hostname"], n["sshd"], n["faults"]) for n in doc["nodes"]] == [
        ("gpu-node-1", True, []),
        ("gpu-node-2", False, ["node-down"]),
    ]


def test_ssh_failures_are_classified_per_node(make_sandbox):
    box = make_sandbox(
        nodes=5,
        faults=[
            "ssh-auth-failed@2",
            "ssh-hostkey-changed@3",
            "ssh-hostkey-unknown@4",
            "node-down@5",
        ],
    )
    cluster = load_cluster(cluster_file=str(box.cluster_file))
    # The down node can only time out: keep that short.
    nodes = [replace(n, ssh=replace(n.ssh, connect_timeout=3)) for n in cluster.nodes]
    failures = {r.node: r.failure for r in run_on_nodes(nodes, ["true"])}
    assert failures["gpu-node-1"] is Failure.NONE
    assert failures["gpu-node-2"] is Failure.AUTH
    assert failures["gpu-node-3"] is Failure.HOSTKEY_CHANGED
    assert failures["gpu-node-4"] is Failure.HOSTKEY_UNKNOWN
    assert failures["gpu-node-5"] in (Failure.CONNECT_TIMEOUT, Failure.NO_ROUTE)
    assert [failures[f"gpu-node-{k}"].pitfall_id for k in range(2, 6)] == [
        "ssh-auth-failed",
        "ssh-hostkey-changed",
        "ssh-hostkey-unknown",
        "ssh-unreachable",
    ]
