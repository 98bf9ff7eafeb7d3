"""Host keys: every name a node is reached by, the keys it offers, and what known_hosts lacks.

    >>> known_hosts_names("gpu-node-1", hostname="10.0.0.11", address="10.0.0.11", port=2222)
    ['[gpu-node-1]:2222', '[10.0.0.11]:2222']
    >>> add, stale = plan_names(["gpu-node-1"], ["ssh-ed25519 AAAAnew"],
    ...                         {"gpu-node-1": ["ssh-ed25519 AAAAold"]})
    >>> add, stale
    (['gpu-node-1 ssh-ed25519 AAAAnew'], {'gpu-node-1': ['ssh-ed25519 AAAAold']})

ssh looks a host up in known_hosts under the name it connects to (HostKeyAlias, else the
HostName after ~/.ssh/config, as `[name]:port` off port 22); users, pdsh and DeepSpeed also
reach a node by its alias, its own hostname or its address. Every one of those names gets a
line, so that none of them stops a non-interactive ssh with a host key question. A name that
already has another key of the same type is a *changed* key: it is only replaced after the
user saw the old and the new fingerprint and said yes (never StrictHostKeyChecking=no).
A name or a key goes into a known_hosts line only when it is plain (`trainfleet.untrusted`).
"""

from __future__ import annotations

import socket
import subprocess
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
    """The node's own `hostname`, once a command could run there."""
    offered: list[str] = field(default_factory=list)
    """Its host keys as `type base64`, from ssh-keyscan."""

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
    """(lines to add, {name: old keys} for names whose key of the same type changed).

    A stale name is dropped whole (`ssh-keygen -R`) and gets every offered key again.
    """
    add: list[str] = []
    stale: dict[str, list[str]] = {}
    offered_types = {key.split()[0] for key in offered}
    for name in names:
        have = known.get(name, [])
        old = [k for k in have if k.split()[0] in offered_types and k not in offered]
        if old:
            stale[name] = old
            add += known_hosts_lines([name], offered)
        else:
            add += known_hosts_lines([name], [k for k in offered if k not in have])
    return add, stale


def new_keys(target: Target, known: dict[str, list[str]]) -> list[str]:
    """Offered keys that no name of the node is known with yet (they need the user's yes)."""
    trusted = {key for name in target.names for key in known.get(name, [])}
    return [key for key in target.offered if key not in trusted]


def trusted_by_file(path: str, target: Target) -> bool:
    """--known-hosts FILE: the file holds every offered key under one of the node's names."""
    have = {key for name in target.names for key in sshkeys.known_keys(path, name)}
    return bool(target.offered) and all(key in have for key in target.offered)


def describe_new(target: Target, keys: list[str]) -> list[str]:
    where = target.node if target.hostname == target.node else f"{target.node} ({target.hostname})"
    return [f"  {where}: {fingerprint(key)}" for key in keys]


def describe_changed(owner: str, target: Target, stale: dict[str, list[str]]) -> list[str]:
    """The old and the new fingerprints of a changed key, as the confirmation shows them."""
    by_old: dict[tuple[str, ...], list[str]] = {}
    for name, old in stale.items():
        by_old.setdefault(tuple(old), []).append(name)
    lines = []
    for old, names in by_old.items():
        lines.append(f"  {owner}: {target.node} (known as {', '.join(names)}): CHANGED")
        lines += [f"      was: {fingerprint(key)}" for key in old]
        lines += [f"      now: {fingerprint(key)}" for key in target.offered]
    return lines


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
        return socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except (OSError, UnicodeError, IndexError):
        return None


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
