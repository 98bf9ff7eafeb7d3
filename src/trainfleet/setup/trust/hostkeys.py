"""Host keys: every name a node is reached by, the keys it offers, and what known_hosts lacks.

    >>> known_hosts_names("gpu-node-1", hostname="10.0.0.11", address="10.0.0.11", port=2222)
    ['[gpu-node-1]:2222', '[10.0.0.11]:2222']
    >>> new = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICn6fxmxLQuKd20BsR8GCBByLcd3+WHtcWT3d/Oj9bCK"
    >>> old = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQDU"  # known before; the node offers no RSA
    >>> add, stale = plan_names(["gpu-node-1"], [new], {"gpu-node-1": [old]})
    >>> add == [f"gpu-node-1 {new}"], stale == {"gpu-node-1": [old]}
    (True, True)

ssh looks a host up in known_hosts under the name it connects to (HostKeyAlias, else the
HostName after ~/.ssh/config, as `[name]:port` off port 22); users, pdsh and DeepSpeed also
reach a node by its alias, its own hostname or its address. Every one of those names gets a
line, so that none of them stops a non-interactive ssh with a host key question.

A key goes only under names the user gave (the cluster spec, ~/.ssh/config's HostName and
HostKeyAlias) and the address this machine connects to. The node's own `hostname` is its own
word: root there can make it any name, another node's or github.com. It is added only where it
resolves here to the node's address and names no other node and not this machine
(`own_hostname_refused`). A name that has keys, none of which the node offers, is a *changed*
key whatever the key types (OpenSSH's rule): it is only replaced after the user saw the old and
the new fingerprint and said yes (never StrictHostKeyChecking=no, never --yes alone). A name or
a key goes into a known_hosts line only when it is plain (`trainfleet.untrusted`).
"""

from __future__ import annotations

import ipaddress
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field

from trainfleet.cluster import Node
from trainfleet.keyscan import fingerprint, keyscan
from trainfleet.node import sshkeys
from trainfleet.remote import ssh_options
from trainfleet.untrusted import valid_key, valid_known_hosts_name, valid_name


@dataclass(kw_only=True, slots=True)
class Target:
    """How this machine reaches one node, from `ssh -G` (no connection is made)."""

    node: str
    """The name in the cluster spec (an alias, a host name or an address)."""
    hostname: str
    """What ssh connects to (HostName from the ssh config, or the name itself)."""
    port: int
    address: str | None
    """hostname resolved to IPv4 here (None when it does not resolve)."""
    hostkey_alias: str | None = None
    proxied: bool = False
    """Reached through a ProxyJump/ProxyCommand (its ssh starts another ssh)."""
    machine_hostname: str | None = None
    """The node's own `hostname`, once a command could run there and `own_hostname_refused`
    found nothing against it."""
    offered: list[str] = field(default_factory=list)
    """Its host keys as `type base64`, from ssh-keyscan."""

    @property
    def bare_names(self) -> list[str]:
        """The names the user gave and the address connected to, without `[name]:port`."""
        found = (self.hostkey_alias, self.node, self.hostname, self.address)
        return [name for name in found if name and valid_name(name)]

    @property
    def names(self) -> list[str]:
        return known_hosts_names(
            self.node,
            hostname=self.hostname,
            address=self.address,
            port=self.port,
            hostkey_alias=self.hostkey_alias,
            machine_hostname=self.machine_hostname,
        )


def known_hosts_names(
    node: str,
    *,
    hostname: str,
    address: str | None,
    port: int,
    hostkey_alias: str | None = None,
    machine_hostname: str | None = None,
) -> list[str]:
    """Every name ssh may look the node up under, in known_hosts notation, without repeats."""
    names: list[str] = []
    for name in (hostkey_alias, node, hostname, address, machine_hostname):
        if not name or not valid_name(name):
            continue  # a node's own word for its name is checked in trust.py, with a note
        written = name if port == 22 else f"[{name}]:{port}"
        if written not in names:
            names.append(written)
    return names


def known_hosts_lines(names: list[str], keys: list[str]) -> list[str]:
    """One line per name and key (`ssh-keygen -R NAME` then takes out exactly one name). A name
    or key that is not plain (`valid_name`, `valid_key`) is a bug here, never a line."""
    bad = [n for n in names if not valid_known_hosts_name(n)]
    bad += [k for k in keys if not valid_key(k)]
    if bad:
        raise ValueError(f"not a known_hosts name or key: {bad!r}")
    return [f"{name} {key}" for name in names for key in keys]


def plan_names(
    names: list[str], offered: list[str], known: dict[str, list[str]]
) -> tuple[list[str], dict[str, list[str]]]:
    """(lines to add, {name: old keys} for names whose key changed).

    A name changed when it has keys and the node offers none of them, whatever their types: a
    man in the middle offering only an ECDSA key where an Ed25519 one is known is a change
    (ssh says REMOTE HOST IDENTIFICATION HAS CHANGED), not a new key. A stale name is dropped
    whole (`ssh-keygen -R`) and gets every offered key again.
    """
    add: list[str] = []
    stale: dict[str, list[str]] = {}
    for name in names:
        have = known.get(name, [])
        if have and not any(key in offered for key in have):
            stale[name] = have
            add += known_hosts_lines([name], offered)
        else:
            add += known_hosts_lines([name], [k for k in offered if k not in have])
    return add, stale


def vouched(path: str, lines: list[str]) -> set[str]:
    """--known-hosts FILE: the lines whose key the file lists under that very name (hashed
    entries included). The file vouches for a key under its names only, never under others."""
    return {
        line
        for line in lines
        if line.split(" ", 1)[1] in sshkeys.known_keys(path, line.split(" ", 1)[0])
    }


def describe_new(target: Target, lines: list[str], known: dict[str, list[str]]) -> list[str]:
    """Each key about to be trusted, with every name it goes under and the names it is trusted
    under already (a trusted key under a new name is still a question)."""
    by_key: dict[str, list[str]] = {}
    for line in lines:
        name, key = line.split(" ", 1)
        by_key.setdefault(key, []).append(name)
    where = target.node if target.hostname == target.node else f"{target.node} ({target.hostname})"
    described = []
    for key, names in by_key.items():
        trusted = [n for n in target.names if key in known.get(n, [])]
        already = f" (trusted already as {', '.join(trusted)})" if trusted else ""
        described += [f"  {where}: {fingerprint(key)}{already}", f"      as {', '.join(names)}"]
    return described


def describe_changed(owner: str, target: Target, stale: dict[str, list[str]]) -> list[str]:
    """The old and the new fingerprints of a changed key, as the confirmation shows them."""
    by_old: dict[tuple[str, ...], list[str]] = {}
    for name, old in stale.items():
        by_old.setdefault(tuple(old), []).append(name)
    lines = []
    for old_keys, names in by_old.items():
        lines.append(f"  {owner}: {target.node} (known as {', '.join(names)}): CHANGED")
        lines += [f"      was: {fingerprint(key)}" for key in old_keys]
        lines += [f"      now: {fingerprint(key)}" for key in target.offered]
    return lines


LOCALHOST = frozenset(
    {"localhost", "localhost.localdomain", "localhost6", "ip6-localhost", "ip6-loopback"}
)
"""What /etc/hosts files call this machine's loopback."""


def own_hostname_refused(
    reported: str,
    target: Target,
    others: list[Target],
    *,
    this_machine: set[str],
    resolve: Callable[[str], set[str]],
) -> str | None:
    """Why the node's own `hostname` answer may not become a name of its key (None: it may).

    `others`: every other node's target; `this_machine`: this machine's own names;
    `resolve(name)`: the IPv4 addresses the name has here.
    """
    if not valid_name(reported):
        return "is not a host name"
    name = reported.lower()
    if name in {n.lower() for n in target.bare_names}:
        return None  # one of the names it has already
    for other in others:
        if name in {n.lower() for n in other.bare_names}:
            return f"is a name of {other.node}"
    if name in this_machine or name in LOCALHOST or _is_loopback(name):
        return "is a name of this machine"
    addresses = resolve(reported)
    if target.address is None or addresses != {target.address}:
        found = ", ".join(sorted(addresses)) or "nothing"
        return f"resolves here to {found}, not to its address {target.address or '(unknown)'}"
    return None


def _is_loopback(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


# ----------------------------------------------------------------------------- facts


def ssh_settings(node: Node) -> dict:
    """`ssh -G` for the node with its options: hostname, port, hostkeyalias, ..."""
    argv = ssh_g_argv(node)
    out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
    return sshkeys.parse_ssh_g(out)


def ssh_g_argv(node: Node) -> list[str]:
    """`ssh ... -G -- HOST`: what ssh would do for the node, on whichever machine runs it."""
    return ["ssh", *ssh_options(node.ssh, multiplex=False), "-G", "--", node.host]


def _ipv4(name: str) -> str | None:
    try:
        address = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except (OSError, UnicodeError, IndexError):
        return None
    # AF_INET's sockaddr is (host, port); the type of a sockaddr admits other families' ints.
    return address if isinstance(address, str) else None


def ipv4s(name: str) -> set[str]:
    """Every IPv4 address `name` resolves to here (empty when it does not resolve)."""
    try:
        found = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return set()
    return {str(entry[4][0]) for entry in found}


def target_of(node: Node) -> Target:
    settings = ssh_settings(node)
    hostname = settings.get("hostname") or node.host
    port = int(settings.get("port") or node.ssh.port or 22)
    return Target(
        node=node.host,
        hostname=hostname,
        port=port,
        address=_ipv4(hostname),
        hostkey_alias=settings.get("hostkeyalias"),
        proxied=any(settings.get(k, "none") != "none" for k in ("proxyjump", "proxycommand")),
    )


def scan(target: Target) -> list[str]:
    """The keys the node offers on its ssh port (ssh-keyscan, from this machine)."""
    return keyscan(target.address or target.hostname, target.port)
