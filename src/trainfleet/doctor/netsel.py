"""Which interface NCCL and gloo pick on a node, from its facts; pure functions.

    >>> ifaces = [{"name": "lo", "up": True, "ipv4": ["127.0.0.1/8"]},
    ...           {"name": "docker0", "up": True, "ipv4": ["172.17.0.1/16"]},
    ...           {"name": "ens14f0", "up": True, "ipv4": ["10.0.0.11/24"]}]
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


def ifaces_of(facts: dict) -> list[dict]:
    """A node's interfaces from its fact sheet ([] when the probe could not list them)."""
    found = facts.get("interfaces")
    return found if isinstance(found, list) else []


def usable(iface: dict) -> bool:
    return bool(iface.get("up")) and bool(iface.get("ipv4"))


def nccl_matches(value: str, ifaces: list[dict]) -> list[str]:
    """Names of usable interfaces NCCL would accept for NCCL_SOCKET_IFNAME=value."""
    if len(value) <= 1:
        return [i["name"] for i in ifaces if usable(i)]
    exclude = value.startswith("^")
    spec = value[1:] if exclude else value
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    items = [item for item in spec.split(",") if item]

    def hit(name: str) -> bool:
        return any(name == item if exact else name.startswith(item) for item in items)

    return [i["name"] for i in ifaces if usable(i) and hit(i["name"]) != exclude]


def nccl_default(ifaces: list[dict]) -> str | None:
    """The interface NCCL's bootstrap uses when NCCL_SOCKET_IFNAME is unset."""
    for value in ("ib", "^docker,lo", "docker", "lo"):
        found = nccl_matches(value, ifaces)
        if found:
            return found[0]
    return None


def gloo_missing(value: str, ifaces: list[dict]) -> list[str]:
    """Names in GLOO_SOCKET_IFNAME that are not a usable interface here (gloo fails on them)."""
    if len(value) <= 1:
        return []
    names = {i["name"] for i in ifaces if usable(i)}
    return [name for name in value.split(",") if name not in names]


def is_virtual(name: str) -> bool:
    return name.startswith(_VIRTUAL_PREFIXES)


def iface_holding(address: str, ifaces: list[dict]) -> str | None:
    for iface in ifaces:
        for cidr in iface.get("ipv4", []):
            if cidr.split("/")[0] == address:
                return iface["name"]
    return None


def chosen_interface(facts: dict, master_addr: str | None) -> str | None:
    """What trainfleet sets per node: the interface that routes to the master (on the master,
    the one that holds the master address)."""
    route = facts.get("route_to_master") or {}
    ifaces = facts.get("interfaces") or []
    if not isinstance(ifaces, list):
        return None
    dev = route.get("dev")
    if dev == "lo" and master_addr:
        return iface_holding(master_addr, ifaces) or dev
    return dev


def subnet_of(iface_name: str | None, ifaces: list[dict]) -> str | None:
    for iface in ifaces:
        if iface["name"] == iface_name and iface.get("ipv4"):
            return str(ipaddress.ip_interface(iface["ipv4"][0]).network)
    return None
