"""Take a sandbox down (also after a crash or a half `up`) and report each node's state.

    >>> from trainfleet.sandbox import up, down
    >>> sandbox = up(nodes=3, ifnames=["ens14f0", "ens14f1", "ens14f2"])  # doctest: +SKIP
    >>> sandbox.cluster_file  # doctest: +SKIP
    PosixPath('/run/trainfleet/sandbox/tf/cluster.yaml')
    >>> down()  # doctest: +SKIP

Every node is a network namespace `tf-NAME-K` with a veth into the bridge `tfbr-NAME`, its own
interface name, hostname (UTS namespace of its sshd), /etc/hosts (/etc/netns/tf-NAME-K/hosts)
and sshd (`build` makes them). The key, authorized_keys, known_hosts, ssh_config, cluster.yaml
and hostfile live in the state dir; the user's ~/.ssh is never touched. `down` finds what to
remove by name prefix, not only from the state file, so it also cleans up what a crashed `up`
left.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from trainfleet.errors import SandboxError
from trainfleet.localprocs import pid_alive
from trainfleet.sandbox import cpu, netns, slurm, texts
from trainfleet.sandbox.state import DEFAULT_NAME, Sandbox, check_name, load, state_root


def down(name: str = DEFAULT_NAME) -> list[str]:
    """Remove everything `up` made for this name; returns what was removed. Safe to repeat."""
    netns.require_root_and_netns()
    check_name(name)
    removed: list[str] = []
    sandbox = None
    try:
        sandbox = load(name)
    except SandboxError:
        pass  # unreadable state: clean up by name prefix below
    if sandbox is not None and sandbox.cluster_file.exists():
        _close_client_connections(sandbox)
    prefix = f"tf-{name}-"
    for ns in netns.netns_list():
        if ns.startswith(prefix):
            netns.kill_netns_processes(ns)
            netns.run(["ip", "netns", "del", ns])
            removed.append(f"netns {ns}")
    removed += [f"cgroup {g}" for g in cpu.remove_all(cpu.cgroup_prefix(name))]
    for link in netns.links_with_prefix(f"tv-{name}-"):
        netns.run(["ip", "link", "del", link], check=False)
        removed.append(f"link {link}")
    bridge = f"tfbr-{name}"
    if netns.link_exists(bridge):
        netns.run(["ip", "link", "del", bridge])
        removed.append(f"bridge {bridge}")
    for etc in Path("/etc/netns").glob(f"{prefix}*"):
        shutil.rmtree(etc, ignore_errors=True)
        removed.append(str(etc))
    state_dir = state_root() / name
    removed += slurm.stop(state_dir)
    if state_dir.exists():
        shutil.rmtree(state_dir)
        removed.append(str(state_dir))
    return removed


def _close_client_connections(sandbox: Sandbox) -> None:
    from trainfleet.cluster import load_cluster
    from trainfleet.remote import close_connections

    try:
        close_connections(load_cluster(cluster_file=str(sandbox.cluster_file)).nodes)
    except Exception:  # best effort: the masters also exit once their peer is gone
        pass


@dataclass(frozen=True, slots=True)
class NodeStatus:
    node: texts.SandboxNode
    netns_present: bool
    sshd_running: bool
    faults: tuple[str, ...]

    def to_json(self) -> dict:
        return {
            **self.node.to_json(),
            "netns": self.netns_present,
            "sshd": self.sshd_running,
            "faults": list(self.faults),
        }


def status(name: str = DEFAULT_NAME) -> tuple[Sandbox, list[NodeStatus]] | None:
    """The recorded sandbox and each node's live state, or None when it is not up."""
    sandbox = load(name)
    if sandbox is None:
        return None
    present = set(netns.netns_list())
    result = []
    for node in sandbox.nodes:
        pid = sandbox.sshd_pid(node.index)
        result.append(
            NodeStatus(
                node=node,
                netns_present=node.netns in present,
                sshd_running=pid_alive(pid) and pid in netns.netns_pids(node.netns),
                faults=tuple(f.name for f in sandbox.faults if f.node == node.index),
            )
        )
    return sandbox, result
