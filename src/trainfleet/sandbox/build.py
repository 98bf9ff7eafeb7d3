"""`sandbox up`: the checks, where the sandbox goes on this machine (a free subnet, each
node's address, interface name and namespace, room in the kernel's neighbour table), then the
build, one `up` at a time. On any failure, whatever was made is removed again. The build itself
is `sandbox/nodes.py` (the bridge, the namespaces and their files, the client files, the
network faults), which ends by starting what runs on the nodes (`sandbox/daemons.py`).

    >>> [n.address for n in plan_nodes("tf", 2, ["ens14f0", "ens14f1"], "10.9.9.0/24")]
    ['10.9.9.11', '10.9.9.12']
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import re
from collections.abc import Sequence
from pathlib import Path

from trainfleet.cluster import DEFAULT_MASTER_PORT
from trainfleet.errors import SandboxError
from trainfleet.sandbox import netns, texts, users
from trainfleet.sandbox import slurm as slurm_daemons
from trainfleet.sandbox.faults import DECOYS, parse_fault
from trainfleet.sandbox.lifecycle import down
from trainfleet.sandbox.nodes import build_nodes
from trainfleet.sandbox.state import (
    DEFAULT_NAME,
    MAX_NODES,
    Sandbox,
    check_name,
    default_subnet,
    load,
    state_root,
)

_IFNAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,14}$")


def plan_nodes(
    name: str, count: int, ifnames: Sequence[str], subnet: str
) -> list[texts.SandboxNode]:
    if not 1 <= count <= MAX_NODES:
        raise SandboxError(f"--nodes must be in 1..{MAX_NODES}, got {count}", "pick fewer nodes")
    if len(ifnames) not in (0, 1, count):
        raise SandboxError(
            f"{len(ifnames)} interface names for {count} nodes",
            "give one name for all nodes, or one per node (--ifnames ens14f0,ens14f1)",
        )
    for ifname in ifnames:
        if not _IFNAME_RE.match(ifname) or ifname == "lo" or ifname in DECOYS:
            raise SandboxError(f"bad interface name {ifname!r}", "use e.g. eth0 or ens14f0")
    net = ipaddress.ip_network(subnet)
    hosts = list(net.hosts())
    if len(hosts) < count + 11:
        raise SandboxError(f"subnet {subnet} is too small for {count} nodes", "use a /24")
    names = list(ifnames) * count if len(ifnames) == 1 else list(ifnames) or ["eth0"] * count
    return [
        texts.SandboxNode(
            index=k,
            hostname=f"gpu-node-{k}",
            address=str(hosts[9 + k]),
            ifname=names[k - 1],
            netns=f"tf-{name}-{k}",
            host_veth=f"tv-{name}-{k}",
        )
        for k in range(1, count + 1)
    ]


def up(
    *,
    nodes: int,
    name: str = DEFAULT_NAME,
    ifnames: Sequence[str] = (),
    slots: int = 1,
    faults: Sequence[str] = (),
    subnet: str | None = None,
    master_port: int = DEFAULT_MASTER_PORT,
    login_shell: str | None = None,
    node_local_dir: str | None = None,
    auth: str = "key",
    slurm: bool = False,
) -> Sandbox:
    """Create the sandbox; on any failure, remove whatever was made and raise.

    `login_shell` (e.g. /bin/sh) replaces root's shell on the nodes, so that commands skip this
    machine's ~/.bashrc; for benchmarks, where all nodes share this machine's cores.
    `node_local_dir`: every node sees its own private directory at that path (the state dir's
    nodes/HOST/local, bind-mounted; the test user's with auth="password"), as nodes without
    shared storage do.
    `auth`: 'password' makes fresh servers: sshd accepts only the test user's password (in
    STATE/password), nothing is trusted, every node has its own home (see `users`).
    `slurm`: a real Slurm too, its controller on node 1 (`sandbox/slurm.py`).
    """
    if auth not in users.AUTH_MODES:
        raise SandboxError(f"unknown auth {auth!r}", f"use one of {', '.join(users.AUTH_MODES)}")
    if node_local_dir is not None and not Path(node_local_dir).is_dir():
        raise SandboxError(f"{node_local_dir} is not a directory", "create it first")
    if login_shell is not None and not os.access(login_shell, os.X_OK):
        raise SandboxError(f"login shell {login_shell} is not an executable", "use e.g. /bin/sh")
    netns.require_root_and_netns()
    if slurm:
        slurm_daemons.require_slurm()
    check_name(name)
    # One `up` at a time on this machine: each picks its subnet from those still free.
    with _one_up_at_a_time():
        if load(name) is not None or any(ns.startswith(f"tf-{name}-") for ns in netns.netns_list()):
            raise SandboxError(
                f"sandbox {name!r} is already up",
                f"run `trainfleet sandbox down --name {name}` first",
            )
        subnet = _free_subnet(name, subnet)
        planned = plan_nodes(name, nodes, ifnames, subnet)
        hostnames = [n.hostname for n in planned]
        parsed = [parse_fault(f, hostnames) for f in faults]
        sandbox = Sandbox(
            name=name,
            state_dir=state_root() / name,
            subnet=subnet,
            bridge=f"tfbr-{name}",
            nodes=planned,
            faults=parsed,
            slots=slots,
            master_port=master_port,
            login_shell=login_shell,
            node_local_dir=node_local_dir,
            auth=auth,
            slurm=slurm,
        )
        try:
            sandbox.host_changes = _room_for_neighbours(len(planned))
            build_nodes(sandbox)
            if slurm:
                slurm_daemons.start(sandbox)
        except BaseException:
            down(name)
            raise
    return sandbox


@contextlib.contextmanager
def _one_up_at_a_time():
    state_root().mkdir(parents=True, exist_ok=True)
    with open(state_root() / ".up.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


NEIGHBOUR_LIMITS = "/proc/sys/net/ipv4/neigh/default/gc_thresh{}"


def neighbour_room(sizes: Sequence[int]) -> dict[int, int]:
    """gc_thresh1..3 for sandboxes of these sizes all up, each node talking to every other.

    The ARP entries of every network namespace live in one table of this kernel, whose limits
    (gc_thresh1/2/3, 128/512/1024 by default) are this machine's, not each namespace's: 32
    nodes talking all-to-all hold 32 x 32 entries (31 peers and the bridge each, and the
    bridge's 32). Past gc_thresh3 the kernel logs `neighbor table overflow!` and a connect
    fails with `No route to host` until a retry (measured here: gloo's full mesh across 32
    sandbox nodes took 69 s instead of 5). A real node holds only its own peers.

        >>> neighbour_room([32])
        {1: 1568, 2: 3136, 3: 6272}
    """
    needed = sum(n * n + n for n in sizes) + 512  # + this machine's own neighbours
    return {1: needed, 2: 2 * needed, 3: 4 * needed}


def _room_for_neighbours(nodes: int) -> list[str]:
    """Raises (never lowers) the neighbour table's limits to fit every sandbox up and this one
    (`neighbour_room`). -> what was changed, with the old values."""
    sizes = [nodes]
    for entry in state_root().iterdir():
        try:
            other = load(entry.name) if (entry / "state.json").exists() else None
        except SandboxError:
            other = None
        sizes += [len(other.nodes)] if other else []
    changes = []
    for which, wanted in neighbour_room(sizes).items():
        path = Path(NEIGHBOUR_LIMITS.format(which))
        try:
            current = int(path.read_text())
            if current < wanted:
                path.write_text(f"{wanted}\n")
                changes.append(f"net.ipv4.neigh.default.gc_thresh{which} {current} -> {wanted}")
        except (OSError, ValueError):
            continue  # a kernel without the knob, or a read-only /proc: the defaults hold
    return changes


def _free_subnet(name: str, asked: str | None) -> str:
    """The subnet asked for, if nothing on this machine overlaps it, else the name's default
    /24 or the next free one."""
    taken = netns.ipv4_networks()
    if asked is None:
        return default_subnet(name, taken)
    try:
        subnet = ipaddress.ip_network(asked)
    except ValueError as exc:
        raise SandboxError(
            f"--subnet {asked!r} is not a network ({exc})", "use e.g. 10.99.0.0/24"
        ) from None
    clash = next((net for net in taken if subnet.overlaps(net)), None)
    if clash is not None:
        raise SandboxError(
            f"subnet {asked} overlaps {clash}, already on an interface of this machine",
            "give another --subnet, or leave it out to get a free one",
        )
    return asked
