"""Which interface NCCL and gloo pick on a node, from its facts; pure functions.

    >>> from trainfleet.doctor.facts import Interface
    >>> ifaces = [Interface(name="lo", up=True, ipv4=("127.0.0.1/8",)),
    ...           Interface(name="docker0", up=True, ipv4=("172.17.0.1/16",)),
    ...           Interface(name="ens14f0", up=True, ipv4=("10.0.0.11/24",))]
    >>> nccl_matches("^docker,lo", ifaces), nccl_default(ifaces)
    (['ens14f0'], 'ens14f0')
    >>> gloo_missing("ens14f1", ifaces)
    ['ens14f1']

Semantics from NCCL's docs and source (`NCCL_SOCKET_IFNAME`: comma-separated prefixes, a
leading `^` excludes, a leading `=` means exact names, a value of one character is ignored;
unset: ib* first, then anything but docker* and lo, then docker*, then lo) and from
PyTorch's gloo setup (`GLOO_SOCKET_IFNAME`: exact names, every process the same count).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from trainfleet.doctor.facts import Interface, NodeFacts

_VIRTUAL_PREFIXES = (
    "docker",
    "virbr",
    "veth",
    "br-",
    "cni",
    "flannel",
    "cali",
    "tailscale",
    "wg",
    "tun",
    "vxlan",
)


def ifaces_of(facts: NodeFacts) -> tuple[Interface, ...]:
    """A node's interfaces from its fact sheet (() when the probe could not list them)."""
    return facts.interfaces or ()


def usable(iface: Interface) -> bool:
    return iface.up and bool(iface.ipv4)


def nccl_accepts(value: str, name: str) -> bool:
    """Whether NCCL_SOCKET_IFNAME=value lets NCCL take the interface `name`: comma-separated
    prefixes, `=` in front for exact names, `^` in front to exclude; a value of one character
    (or none) is ignored (NCCL reads it only when `strlen > 1`), so it excludes nothing."""
    if len(value) <= 1:
        return True
    exclude = value.startswith("^")
    spec = value[1:] if exclude else value
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    items = [item for item in spec.split(",") if item]
    hit = any(name == item if exact else name.startswith(item) for item in items)
    return hit != exclude


def nccl_matches(value: str, ifaces: Sequence[Interface]) -> list[str]:
    """Names of usable interfaces NCCL would accept for NCCL_SOCKET_IFNAME=value."""
    return [i.name for i in ifaces if usable(i) and nccl_accepts(value, i.name)]


def nccl_default(ifaces: Sequence[Interface]) -> str | None:
    """The interface NCCL's bootstrap uses when NCCL_SOCKET_IFNAME is unset."""
    for value in ("ib", "^docker,lo", "docker", "lo"):
        found = nccl_matches(value, ifaces)
        if found:
            return found[0]
    return None


def gloo_missing(value: str, ifaces: Sequence[Interface]) -> list[str]:
    """Names in GLOO_SOCKET_IFNAME that are not a usable interface here (gloo fails on them)."""
    if len(value) <= 1:
        return []
    names = {i.name for i in ifaces if usable(i)}
    return [name for name in value.split(",") if name not in names]


def is_virtual(name: str) -> bool:
    return name.startswith(_VIRTUAL_PREFIXES)


def iface_holding(address: str, ifaces: Sequence[Interface]) -> str | None:
    for iface in ifaces:
        for cidr in iface.ipv4:
            if cidr.split("/")[0] == address:
                return iface.name
    return None


def chosen_interface(facts: NodeFacts, master_addr: str | None) -> str | None:
    """What trainfleet sets per node: the interface that routes to the master (on the master,
    the one that holds the master address); None when the node's interfaces are unknown."""
    if facts.interfaces is None:
        return None
    dev = facts.route_to_master.dev if facts.route_to_master else None
    if dev == "lo" and master_addr:
        return iface_holding(master_addr, facts.interfaces) or dev
    return dev


def subnet_of(iface_name: str | None, ifaces: Sequence[Interface]) -> str | None:
    for iface in ifaces:
        if iface.name == iface_name and iface.ipv4:
            try:
                return str(ipaddress.ip_interface(iface.ipv4[0]).network)
            except ValueError:
                return None  # not an address: the node's own word, not a subnet
    return None
