"""Making a sandbox's nodes (`sandbox up`, once `build.up` has chosen where they go): the
bridge, one namespace per node with its veth, interface name, /etc/hosts, /etc/passwd and
sshd_config, its host key and fake GPUs; the client files (key, known_hosts, ssh_config,
cluster.yaml, hostfile); the network faults (iptables, tc, links, decoy interfaces). Then what
runs on the nodes is started (`sandbox/daemons.py`).

    >>> from trainfleet.sandbox import up
    >>> sandbox = up(nodes=2, faults=["slow-link@2"])  # doctest: +SKIP
    >>> (sandbox.state_dir / "nodes" / "gpu-node-2" / "sshd_config").exists()  # doctest: +SKIP
    True

A fault that changes what a node is made with is applied here by name: `node.index in
faulted(sandbox, "NAME")` while the node is made, `_apply_network_faults` for iptables, tc and
links. The state file is written first, so that `down` finds even a half-built sandbox.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
from pathlib import Path

from trainfleet.sandbox import fakegpu, hostile, netns, texts, users
from trainfleet.sandbox.daemons import (
    FAKE_GPU_DIR,
    fake_gpus,
    faulted,
    start_port_holders,
    start_sshds,
    throttle_cpus,
)
from trainfleet.sandbox.faults import (
    BARE_PATH,
    DECOYS,
    FAULTS,
    SILENT_RESOLVER,
    SLOW_LINK_RATE,
    SLOW_LOGIN_S,
    SMALL_MTU,
    firewall_rules,
)
from trainfleet.sandbox.state import Sandbox


def _keygen(path: Path, kind: str = "ed25519") -> str:
    netns.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", path.name, "-f", str(path)])
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def build_nodes(sandbox: Sandbox) -> None:
    """Lay `sandbox` out (its state first, so that `down` finds even a half-built one), then
    each node: its namespaces and addresses, keys, ssh files, faults, and what runs on it."""
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
        if node.index in faulted(sandbox, "ssh-hostkey-type-changed"):
            host_key = "ssh_host_ecdsa_key"
            host_keys[node.index] = _keygen(node_dir / host_key, "ecdsa")
        else:
            host_keys[node.index] = _keygen(node_dir / host_key)
        login_dir = users.make_node_home(node_dir, user) if user else node_dir / "login"
        gpus = fake_gpus(sandbox, node.index)
        if gpus is not None:
            fakegpu.write_wrappers(node_dir / FAKE_GPU_DIR, gpus)
        if node.index in faulted(sandbox, "planted-modules"):
            login_dir.mkdir(mode=0o700, exist_ok=True)
            hostile.plant_modules(login_dir, node_dir)
        netns.run(["ip", "netns", "add", ns])
        if node.index in faulted(sandbox, "decoy-iface"):
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
        if node.index in faulted(sandbox, "hostname-loopback"):
            own_name = "loopback"
        elif node.index in faulted(sandbox, "hostname-unresolvable"):
            own_name = "absent"
        silent = node.index in faulted(sandbox, "dns-unreachable")
        mapped = node.index not in faulted(sandbox, "client-name-unresolvable") and not silent
        hosts = texts.etc_hosts_text(sandbox.nodes, node, own_name=own_name, mapped=mapped)
        _write(Path("/etc/netns") / ns / "hosts", hosts)
        if silent:  # glibc's defaults: 5 s per try, 2 tries
            _write(Path("/etc/netns") / ns / "resolv.conf", f"nameserver {SILENT_RESOLVER}\n")
        bare_env = node.index in faulted(sandbox, "remote-env-differs")
        shell = "/bin/sh" if bare_env else sandbox.login_shell
        if node.index in faulted(sandbox, "slow-login"):
            shell = _slow_shell(node_dir, shell or _root_shell())
        # root's sessions start in its home: on a planted node, the directory planted.
        home = login_dir if user is None and login_dir.exists() else None
        if shell or home:
            _write(Path("/etc/netns") / ns / "passwd", _passwd_for_root(shell, home))
        trust = node.index not in faulted(sandbox, "ssh-auth-failed")
        broken = node.index in faulted(sandbox, "torch-import-error")
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
    start_sshds(sandbox)
    throttle_cpus(sandbox)
    start_port_holders(sandbox)


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
        if node.index in faulted(sandbox, "ssh-hostkey-unknown"):
            continue
        key = host_keys[node.index]
        if node.index in faulted(sandbox, "ssh-hostkey-changed") | faulted(
            sandbox, "ssh-hostkey-type-changed"
        ):
            key = _keygen(state / "nodes" / node.hostname / "previous_host_key")
        known.append((node, key))
    _write(state / "hostfile", texts.hostfile_text(sandbox.nodes, sandbox.slots))
    if sandbox.auth == "password":
        # Nothing is known on fresh servers; a changed key is one trusted before a reinstall.
        was_known = faulted(sandbox, "ssh-hostkey-changed") | faulted(
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
