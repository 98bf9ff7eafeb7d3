"""The text of every file the sandbox writes: pure functions of the sandbox's layout.

    >>> from trainfleet.sandbox.texts import hostfile_text
    >>> print(hostfile_text([SandboxNode(index=1, hostname="gpu-node-1", address="10.0.0.11",
    ...     ifname="eth0", netns="tf-x-1", host_veth="tv-x-1")], slots=2), end="")
    gpu-node-1 slots=2

Kept apart from the code that runs `ip` and `sshd` so they can be read and tested as text.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from trainfleet.cluster import dshostfile


@dataclass(frozen=True, slots=True)
class SandboxNode:
    index: int
    """1-based, rank order."""
    hostname: str
    address: str
    ifname: str
    """Interface name inside the node (ens14f0, eth0, ...)."""
    netns: str
    host_veth: str
    """The veth end on the bridge, in this machine's namespace."""

    def to_json(self) -> dict:
        return asdict(self)


def sshd_config_text(
    node: SandboxNode,
    state: Path,
    *,
    trust: bool,
    path: str | None = None,
    password_user: str | None = None,
    host_key: str = "ssh_host_ed25519_key",
    pythonpath: str | None = None,
) -> str:
    """`password_user`: sshd accepts only that user, with its password, and the keys in its
    own ~/.ssh/authorized_keys (none at first), as fresh servers do; root cannot log in.
    `host_key`: the file in the node's directory; `path`, `pythonpath`: what every session
    gets as PATH and PYTHONPATH."""
    node_dir = state / "nodes" / node.hostname
    authorized = state / "authorized_keys" if trust else Path("/nonexistent/authorized_keys")
    if password_user:
        login = [
            "AuthorizedKeysFile .ssh/authorized_keys",
            "PermitRootLogin no",
            f"AllowUsers {password_user}",
            "PasswordAuthentication yes",
        ]
    else:
        login = [
            f"AuthorizedKeysFile {authorized}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
        ]
    return "\n".join(
        [
            f"# sshd for sandbox node {node.hostname} (written by `trainfleet sandbox up`)",
            f"ListenAddress {node.address}",
            "Port 22",
            f"HostKey {node_dir / host_key}",
            f"PidFile {node_dir / 'sshd.pid'}",
            *login,
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            # The state dir lives under /run or /tmp, whose modes sshd's StrictModes rejects.
            "StrictModes no",
            "PrintMotd no",
            # doctor's N x N checks and shared connections open many sessions at once.
            "MaxStartups 200:30:400",
            "MaxSessions 200",
            "Subsystem sftp internal-sftp",
            "LogLevel ERROR",
            *([f"SetEnv PATH={path}"] if path else []),
            *([f"SetEnv PYTHONPATH={pythonpath}"] if pythonpath else []),
            "",
        ]
    )


def etc_hosts_text(
    nodes: list[SandboxNode], me: SandboxNode, *, own_name: str = "address", mapped: bool = True
) -> str:
    """/etc/hosts of node `me`; its own name maps to its address, to 127.0.1.1 ('loopback',
    as Debian/Ubuntu installers write it) or nowhere ('absent').

    Each address also gets a name in its IPv4-mapped IPv6 form: c10d's TCPStore listens on
    both stacks, sees its clients as ::ffff:ADDRESS and asks the resolver for their names; with
    no entry (and no DNS in the sandbox) every rank printed `The hostname of the client socket
    cannot be retrieved. err=-3`. The names are distinct (HOST-ipv4-mapped), so that looking
    up HOST still gives its IPv4 address alone. `mapped=False` leaves them out (the
    `client-name-unresolvable` fault)."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    if mapped:
        lines.append("::ffff:127.0.0.1\tlocalhost-ipv4-mapped")
    if own_name == "loopback":
        lines.append(f"127.0.1.1\t{me.hostname}")
    for node in nodes:
        if node is not me or own_name == "address":
            lines.append(f"{node.address}\t{node.hostname}")
            if mapped:
                lines.append(f"::ffff:{node.address}\t{node.hostname}-ipv4-mapped")
    return "\n".join(lines) + "\n"


def ssh_config_text(nodes: list[SandboxNode], state: Path) -> str:
    lines = ["# ssh config for the sandbox (written by `trainfleet sandbox up`); use with ssh -F"]
    for node in nodes:
        lines += [f"Host {node.hostname}", f"    HostName {node.address}"]
    lines += [
        "Host *",
        "    User root",
        f"    IdentityFile {state / 'id_ed25519'}",
        "    IdentitiesOnly yes",
        f"    UserKnownHostsFile {state / 'known_hosts'}",
        "    StrictHostKeyChecking yes",
        "",
    ]
    return "\n".join(lines)


def password_ssh_config_text(nodes: list[SandboxNode], user: str) -> str:
    """The password sandbox's ssh config: names and the login only. Which key and known_hosts
    to use is cluster.yaml's (the same path on every node: each node's own ~/.ssh)."""
    lines = ["# ssh config for the sandbox (written by `trainfleet sandbox up`); use with ssh -F"]
    for node in nodes:
        lines += [f"Host {node.hostname}", f"    HostName {node.address}"]
    lines += ["Host *", f"    User {user}", "    StrictHostKeyChecking yes", ""]
    return "\n".join(lines)


def known_hosts_text(entries: list[tuple[SandboxNode, str]]) -> str:
    """entries: (node, 'ssh-ed25519 AAAA...') for every node that should be known."""
    return "".join(f"{n.hostname},{n.address} {key}\n" for n, key in entries)


def hostfile_text(nodes: list[SandboxNode], slots: int) -> str:
    return dshostfile.hostfile_text({node.hostname: slots for node in nodes})


def cluster_yaml_text(
    nodes: list[SandboxNode],
    state: Path,
    slots: int,
    master_port: int,
    *,
    password_user: str | None = None,
) -> str:
    """`password_user`: log in as that user, with the key and known_hosts in its home (the same
    path on every node and here: none of them exists until `trainfleet setup ssh`)."""
    ssh_dir = state / "home" / ".ssh"
    doc: dict = {
        "master": nodes[0].hostname,
        "master_port": master_port,
        "ssh": {
            "user": password_user or "root",
            # Node names are aliases in this file, as in a user's ~/.ssh/config (seed 004).
            "config_file": str(state / "ssh_config"),
            "identity_file": str(ssh_dir / "id_ed25519" if password_user else state / "id_ed25519"),
            "known_hosts_file": str(
                ssh_dir / "known_hosts" if password_user else state / "known_hosts"
            ),
            "options": ["-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes"],
        },
        # Every node's ranks share this machine's cores: one thread each, or OpenMP's idle
        # spinning and gloo's busy polling starve each other (measured: a ZeRO-3 step of a
        # tiny model took 1.2 s across 2 sandbox nodes with accelerate's 2 threads per rank).
        "env": {"OMP_NUM_THREADS": "1"},
        "nodes": [{"host": node.hostname, "slots": slots} for node in nodes],
    }
    if password_user:
        # That user cannot reach this machine's interpreter under /root; the system one is
        # enough for doctor's probe. Its home is writable (and private) on every node.
        doc["python"] = "python3"
        doc["workdir"] = str(state / "home")
    header = (
        "# A sandbox cluster: every node is a network namespace on this machine with its own\n"
        "# interface, hostname, /etc/hosts and sshd. Written by `trainfleet sandbox up`.\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False)
