"""`sandbox up`: the bridge, one namespace per node with its veth, interface name, hostname,
/etc/hosts and sshd, the client files (key, known_hosts, ssh_config, cluster.yaml, hostfile),
then the faults asked for. On any failure, whatever was made is removed again.

    >>> [n.address for n in plan_nodes("tf", 2, ["ens14f0", "ens14f1"], "10.9.9.0/24")]
    ['10.9.9.11', '10.9.9.12']
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import shlex
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from trainfleet import node as node_programs
from trainfleet.cluster import DEFAULT_MASTER_PORT
from trainfleet.errors import SandboxError
from trainfleet.node import porthold
from trainfleet.sandbox import cpu, fakegpu, hostile, netns, texts, users
from trainfleet.sandbox import slurm as slurm_daemons
from trainfleet.sandbox.faults import (
    BARE_PATH,
    DECOYS,
    FAULTS,
    SILENT_RESOLVER,
    SLOW_LINK_RATE,
    SLOW_LOGIN_S,
    SMALL_MTU,
    firewall_rules,
    parse_fault,
)
from trainfleet.sandbox.lifecycle import down
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
_SSHD_START_TIMEOUT_S = 15.0


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


def _keygen(path: Path, kind: str = "ed25519") -> str:
    netns.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", path.name, "-f", str(path)])
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


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
            _build(sandbox)
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


def _faulted(sandbox: Sandbox, fault_name: str) -> set[int]:
    """The nodes given `fault_name`. A name not in the catalog is a bug here, never a fault
    that silently injects nothing."""
    if fault_name not in FAULTS:
        raise KeyError(f"no sandbox fault {fault_name!r}")
    return {f.node for f in sandbox.faults if f.name == fault_name}


def _build(sandbox: Sandbox) -> None:
    state = sandbox.state_dir
    state.mkdir(parents=True, exist_ok=True)
    # The password sandbox's user must reach its home and the ssh config under it.
    state.chmod(0o711 if sandbox.auth == "password" else 0o700)
    # Record the state first: `down` must find even a half-built sandbox.
    _write(state / "state.json", json.dumps(sandbox.to_json(), indent=2) + "\n")
    net = ipaddress.ip_network(sandbox.subnet)
    prefix = net.prefixlen
    gateway = str(next(net.hosts()))

    netns.run(["ip", "link", "add", sandbox.bridge, "type", "bridge"])
    netns.run(["ip", "addr", "add", f"{gateway}/{prefix}", "dev", sandbox.bridge])
    netns.run(["ip", "link", "set", sandbox.bridge, "up"])

    user = users.new_user(state) if sandbox.auth == "password" else None
    if user is None:  # the password sandbox trusts no key at all
        client_key = _keygen(state / "id_ed25519")
        _write(state / "authorized_keys", client_key + "\n", 0o600)
    host_keys: dict[int, str] = {}
    for node in sandbox.nodes:
        ns = node.netns
        node_dir = state / "nodes" / node.hostname
        node_dir.mkdir(parents=True, exist_ok=True)
        host_key = "ssh_host_ed25519_key"
        if node.index in _faulted(sandbox, "ssh-hostkey-type-changed"):
            host_key = "ssh_host_ecdsa_key"
            host_keys[node.index] = _keygen(node_dir / host_key, "ecdsa")
        else:
            host_keys[node.index] = _keygen(node_dir / host_key)
        login_dir = users.make_node_home(node_dir, user) if user else node_dir / "login"
        gpus = _fake_gpus(sandbox, node.index)
        if gpus is not None:
            fakegpu.write_wrappers(node_dir / FAKE_GPU_DIR, gpus)
        if node.index in _faulted(sandbox, "planted-modules"):
            login_dir.mkdir(mode=0o700, exist_ok=True)
            hostile.plant_modules(login_dir, node_dir)
        netns.run(["ip", "netns", "add", ns])
        if node.index in _faulted(sandbox, "decoy-iface"):
            _add_decoys(ns)  # first, so they come before the data interface, as on real hosts
        # The peer is created straight inside the namespace: every node may call it eth0.
        netns.run(
            [
                "ip",
                "link",
                "add",
                node.host_veth,
                "type",
                "veth",
                "peer",
                "name",
                node.ifname,
                "netns",
                ns,
            ]
        )
        netns.run(["ip", "link", "set", node.host_veth, "master", sandbox.bridge, "up"])
        netns.run(["ip", "-n", ns, "addr", "add", f"{node.address}/{prefix}", "dev", node.ifname])
        netns.run(["ip", "-n", ns, "link", "set", "lo", "up"])
        netns.run(["ip", "-n", ns, "link", "set", node.ifname, "up"])
        own_name = "address"
        if node.index in _faulted(sandbox, "hostname-loopback"):
            own_name = "loopback"
        elif node.index in _faulted(sandbox, "hostname-unresolvable"):
            own_name = "absent"
        silent = node.index in _faulted(sandbox, "dns-unreachable")
        mapped = node.index not in _faulted(sandbox, "client-name-unresolvable") and not silent
        hosts = texts.etc_hosts_text(sandbox.nodes, node, own_name=own_name, mapped=mapped)
        _write(Path("/etc/netns") / ns / "hosts", hosts)
        if silent:  # glibc's defaults: 5 s per try, 2 tries
            _write(Path("/etc/netns") / ns / "resolv.conf", f"nameserver {SILENT_RESOLVER}\n")
        bare_env = node.index in _faulted(sandbox, "remote-env-differs")
        shell = "/bin/sh" if bare_env else sandbox.login_shell
        if node.index in _faulted(sandbox, "slow-login"):
            shell = _slow_shell(node_dir, shell or _root_shell())
        # root's sessions start in its home: on a planted node, the directory planted.
        home = login_dir if user is None and login_dir.exists() else None
        if shell or home:
            _write(Path("/etc/netns") / ns / "passwd", _passwd_for_root(shell, home))
        trust = node.index not in _faulted(sandbox, "ssh-auth-failed")
        broken = node.index in _faulted(sandbox, "torch-import-error")
        sshd_config = texts.sshd_config_text(
            node,
            state,
            trust=trust,
            path=BARE_PATH if bare_env else None,
            password_user=user.name if user else None,
            host_key=host_key,
            pythonpath=str(hostile.broken_torch(node_dir)) if broken else None,
        )
        _write(node_dir / "sshd_config", sshd_config)
    if user is not None:
        etc_dirs = [Path("/etc/netns") / node.netns for node in sandbox.nodes]
        users.write_login_files(state, etc_dirs, user)

    _write_client_files(sandbox, host_keys)
    _apply_network_faults(sandbox)
    _start_sshds(sandbox)
    _throttle_cpus(sandbox)
    _start_port_holders(sandbox)


FAKE_GPU_DIR = "fakegpu"
"""In a node's directory: its simulated GPUs' spec and the `nvidia-smi` and `dmesg` wrappers
(bin/), laid over its /usr/bin (`_start_sshds`)."""


def _fake_gpus(sandbox: Sandbox, index: int) -> fakegpu.FakeGpuSpec | None:
    """The GPUs node `index` simulates: those of its `fake-gpu*` fault; None: it has none."""
    specs = [(f.name, f.kind.gpus) for f in sandbox.faults if f.node == index and f.kind.gpus]
    if len(specs) > 1:
        names = ", ".join(name for name, _ in specs)
        raise SandboxError(
            f"node {index} is given {len(specs)} fake-gpu faults ({names})",
            "give each node at most one fake-gpu* fault",
        )
    return specs[0][1] if specs else None


def _claimed_torch(sandbox: Sandbox, index: int, directory: Path) -> tuple[Path, Path] | None:
    """(the layer, site-packages) where node `index`'s fake GPUs claim a torch build."""
    gpus = _fake_gpus(sandbox, index)
    if gpus is None or gpus.torch is None:
        return None
    try:
        return fakegpu.torch_claim(directory, gpus.torch)
    except (ImportError, FileNotFoundError, OSError) as exc:
        raise SandboxError(
            f"fake-gpu on node {index}: cannot claim torch {gpus.torch} ({exc})",
            "install torch in the python that runs trainfleet (make test does)",
        ) from None


def _root_shell() -> str:
    for line in Path("/etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == "root" and len(fields) == 7 and fields[6]:
            return fields[6]
    return "/bin/sh"


def _slow_shell(node_dir: Path, shell: str) -> str:
    """The `slow-login` fault's login shell: waits SLOW_LOGIN_S, then is `shell`."""
    script = node_dir / "slow-login"
    _write(script, f'#!/bin/sh\nsleep {SLOW_LOGIN_S}\nexec {shlex.quote(shell)} "$@"\n')
    script.chmod(0o755)
    return str(script)


def _passwd_for_root(shell: str | None, home: Path | None) -> str:
    """This machine's /etc/passwd with root's login shell and home replaced where given."""
    lines = []
    for line in Path("/etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == "root" and len(fields) == 7:
            fields[5], fields[6] = str(home or fields[5]), shell or fields[6]
        lines.append(":".join(fields) + "\n")
    return "".join(lines)


def _write_client_files(sandbox: Sandbox, host_keys: dict[int, str]) -> None:
    state = sandbox.state_dir
    known = []
    for node in sandbox.nodes:
        if node.index in _faulted(sandbox, "ssh-hostkey-unknown"):
            continue
        key = host_keys[node.index]
        if node.index in _faulted(sandbox, "ssh-hostkey-changed") | _faulted(
            sandbox, "ssh-hostkey-type-changed"
        ):
            key = _keygen(state / "nodes" / node.hostname / "previous_host_key")
        known.append((node, key))
    _write(state / "hostfile", texts.hostfile_text(sandbox.nodes, sandbox.slots))
    if sandbox.auth == "password":
        # Nothing is known on fresh servers; a changed key is one trusted before a reinstall.
        was_known = _faulted(sandbox, "ssh-hostkey-changed") | _faulted(
            sandbox, "ssh-hostkey-type-changed"
        )
        changed = [(n, k) for n, k in known if n.index in was_known]
        if changed:
            (sandbox.home / ".ssh").mkdir(mode=0o700, exist_ok=True)
            _write(sandbox.home / ".ssh" / "known_hosts", texts.known_hosts_text(changed), 0o600)
        user = users.SANDBOX_USER
        _write(state / "ssh_config", texts.password_ssh_config_text(sandbox.nodes, user))
        text = texts.cluster_yaml_text(
            sandbox.nodes, state, sandbox.slots, sandbox.master_port, password_user=user
        )
        _write(sandbox.cluster_file, text)
        return
    _write(state / "known_hosts", texts.known_hosts_text(known))
    _write(state / "ssh_config", texts.ssh_config_text(sandbox.nodes, state))
    _write(
        sandbox.cluster_file,
        texts.cluster_yaml_text(sandbox.nodes, state, sandbox.slots, sandbox.master_port),
    )


def _apply_network_faults(sandbox: Sandbox) -> None:
    for fault in sandbox.faults:
        node = sandbox.node(fault.node)
        ns = node.netns
        if fault.name not in FAULTS:
            raise KeyError(f"no sandbox fault {fault.name!r}")
        if fault.name in ("firewall-blocks-ports", "firewall-ssh-only"):
            for rule in firewall_rules(fault.name, sandbox.master_port):
                netns.run(netns.in_netns(ns, ["iptables", *rule]))
        elif fault.name == "slow-link":
            shape = ["root", "tbf", "rate", SLOW_LINK_RATE, "burst", "64kb", "latency", "100ms"]
            netns.run(["tc", "-n", ns, "qdisc", "add", "dev", node.ifname, *shape])
            netns.run(["tc", "qdisc", "add", "dev", node.host_veth, *shape])
        elif fault.name == "mtu-mismatch":
            netns.run(["ip", "-n", ns, "link", "set", node.ifname, "mtu", str(SMALL_MTU)])
        elif fault.name == "node-down":
            netns.run(["ip", "-n", ns, "link", "set", node.ifname, "down"])


def _add_decoys(ns: str) -> None:
    """Bridges like libvirt's and docker's, with addresses on no cluster network. (No `dummy`
    kernel module here: each is a veth whose peer stays in the namespace.)"""
    for name, address in DECOYS.items():
        peer = f"{name}-peer"
        netns.run(["ip", "-n", ns, "link", "add", name, "type", "veth", "peer", "name", peer])
        netns.run(["ip", "-n", ns, "addr", "add", address, "dev", name])
        netns.run(["ip", "-n", ns, "link", "set", peer, "up"])
        netns.run(["ip", "-n", ns, "link", "set", name, "up"])


def _start_sshds(sandbox: Sandbox) -> None:
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    down_nodes = _faulted(sandbox, "node-down")
    impostors = _faulted(sandbox, "hostname-impostor")
    hostnames = [node.hostname for node in sandbox.nodes]
    starting = []
    for node in sandbox.nodes:
        if node.index in down_nodes:
            continue
        said = hostile.claimed_name(hostnames, node.index) if node.index in impostors else None
        node_dir = sandbox.state_dir / "nodes" / node.hostname
        # Own UTS namespace: every ssh session into the node sees its hostname; own mount
        # namespace: the node-local directory, if any, is private to it.
        script = 'hostname "$1" && exec "$2" -f "$3" -E "$4"'
        if sandbox.node_local_dir:
            local = node_dir / "local"
            local.mkdir(exist_ok=True)
            if sandbox.auth == "password":  # the test user's, as a data disk given to it
                owner = (node_dir / "home").stat()
                os.chown(local, owner.st_uid, owner.st_gid)
            script = f'mount --bind "$5" "$6" && {script}'
        if sandbox.auth == "password":  # the node's own home, at the one home path
            script = f'mount --bind "$7" "$8" && {script}'
        fake_bin = node_dir / FAKE_GPU_DIR / "bin"
        if _fake_gpus(sandbox, node.index) is not None:
            # Where the node's nvidia-smi would be, found by any PATH: the wrappers over its
            # /usr/bin (read-only, this node's mount namespace only; gone with it at `down`).
            if set(str(fake_bin)) & {":", ","}:
                raise SandboxError(
                    f"{fake_bin} holds ':' or ',', which overlayfs options cannot",
                    "set TRAINFLEET_SANDBOX_DIR to a path without them",
                )
            script = f'mount -t overlay overlay -o "lowerdir=$9:/usr/bin" /usr/bin && {script}'
        claimed = _claimed_torch(sandbox, node.index, node_dir / FAKE_GPU_DIR)
        if claimed is not None:  # this node's torch metadata says a CUDA build
            script = f'mount -t overlay overlay -o "lowerdir=${{10}}:${{11}}" "${{11}}" && {script}'
        argv = netns.in_netns(
            node.netns,
            [
                "unshare", "--uts", "--mount", "sh", "-c", script, "sh",
                said or node.hostname, netns.SSHD, str(node_dir / "sshd_config"),
                str(node_dir / "sshd.log"), str(node_dir / "local"),
                sandbox.node_local_dir or "", str(node_dir / "home"), str(sandbox.home),
                str(fake_bin), *(str(path) for path in claimed or ()),
            ],
        )  # fmt: skip
        starting.append(
            (
                node,
                subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True),
            )
        )
    for node, proc in starting:
        _, err = proc.communicate(timeout=_SSHD_START_TIMEOUT_S)
        if proc.returncode != 0:
            raise SandboxError(
                f"sshd on {node.hostname} did not start: {err.strip()}",
                f"see {sandbox.state_dir}/nodes/{node.hostname}/sshd.log",
            )
    deadline = time.monotonic() + _SSHD_START_TIMEOUT_S
    waiting = [node for node, _ in starting]
    while waiting:
        waiting = [node for node in waiting if not _port_open(node.address, 22)]
        if waiting and time.monotonic() > deadline:
            names = ", ".join(n.hostname for n in waiting)
            raise SandboxError(
                f"sshd on {names} not listening after {_SSHD_START_TIMEOUT_S} s",
                f"see the sshd.log files under {sandbox.state_dir}/nodes",
            )
        time.sleep(0.05)


def _throttle_cpus(sandbox: Sandbox) -> None:
    """cpu-throttle: the node's sshd, and so all it starts, into a cgroup with a CPU quota."""
    for index in _faulted(sandbox, "cpu-throttle"):
        # sshd listens before it writes its PidFile: it may be a moment behind the port.
        deadline = time.monotonic() + _SSHD_START_TIMEOUT_S
        while (pid := sandbox.sshd_pid(index)) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid is None:
            raise SandboxError(
                f"sshd on {sandbox.node(index).hostname} wrote no pid file",
                f"see the sshd.log files under {sandbox.state_dir}/nodes",
            )
        cpu.throttle(f"{cpu.cgroup_prefix(sandbox.name)}{index}", [pid])


def _port_open(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def _start_port_holders(sandbox: Sandbox) -> None:
    """The 'leftover process from the last run' that holds the master port (seed 000 §5.3),
    and the resolver that never answers (`dns-unreachable`)."""
    holds: list[tuple[int, Callable[..., object], list[int | str]]]
    holds = [(i, porthold.hold, [sandbox.master_port]) for i in _faulted(sandbox, "port-in-use")]
    holds += [
        (i, porthold.hold_udp, [SILENT_RESOLVER, 53]) for i in _faulted(sandbox, "dns-unreachable")
    ]
    for index, function, args in holds:
        argv = sandbox.exec_argv(index, node_programs.argv("python3", function))
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            text=True,
        )
        # Popen types the pipes Optional; both were asked for (PIPE) just above.
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(node_programs.line(function, *args).decode())
        proc.stdin.close()
        if proc.stdout.readline().strip() != "ready":
            raise SandboxError(f"node {index}: the fault's holder could not bind its port", "retry")
        proc.stdout.close()
