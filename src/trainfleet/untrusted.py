"""The checks every word a node reports passes before trainfleet writes it anywhere: known_hosts
(host names, keys), firewall rules (addresses, interfaces, nftables and firewalld names) and
cluster.yaml (interfaces). Root on a node controls what it reports: its `hostname`, its `ip`
output, ssh-keyscan's answer, the text in its probe's report. A node reporting `*` as its name,
or a name holding a newline and `@cert-authority * KEY`, would otherwise have its key trusted for
every host; an interface `ens1\n    env: {LD_PRELOAD: ...}` would reach every node's launch.

    >>> [valid_name(n) for n in ("gpu-node-1", "10.0.0.11", "fe80::2", "*", "a\\n@cert-authority")]
    [True, True, True, False, False]
    >>> valid_name("gpu-node-1\\n"), valid_name("fe80::1%x *"), valid_name("10.0.0.1,*")
    (False, False, False)
    >>> key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFol2UvIazLX/8FAnaR4NxMQs2aW4irjM1pE/uTTkDhM"
    >>> valid_key(key), valid_key("@cert-authority *"), valid_key("ssh-ed25519 AAAA")
    (True, False, False)
    >>> valid_interface("ens14f0"), valid_interface("ens1\\n  env: {}"), valid_peer("0.0.0.0")
    (True, False, False)
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from typing import TypeGuard

_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_KEY = re.compile(r"(\S+) ([A-Za-z0-9+/]+={0,2})")
KEY_TYPES = frozenset(
    {
        "ssh-ed25519",
        "ssh-rsa",
        "ssh-dss",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "sk-ssh-ed25519@openssh.com",
        "sk-ecdsa-sha2-nistp256@openssh.com",
    }
)
"""The public key types OpenSSH writes in known_hosts and authorized_keys lines."""
_ADDRESS = re.compile(r"[0-9A-Fa-f:.]+")
"""An IP address as written, without a zone (`%eth0` may hold any character)."""


def valid_name(name: str) -> bool:
    """A host name (dot-separated labels of letters, digits, `-` and `_`) or an IP address:
    nothing known_hosts reads as a pattern (`*`, `?`, `!`, `,`), a marker or a second line."""
    if _ADDRESS.fullmatch(name):
        try:
            ipaddress.ip_address(name)
            return True
        except ValueError:
            pass
    return 0 < len(name) <= 253 and all(_LABEL.fullmatch(label) for label in name.split("."))


def valid_known_hosts_name(name: str) -> bool:
    """`valid_name`, or `[name]:port` as known_hosts writes a host on another port."""
    bracketed = re.fullmatch(r"\[(.+)\]:\d+", name)
    return valid_name(bracketed.group(1) if bracketed else name)


def valid_key(key: str) -> bool:
    """Exactly one public key, `type base64` as ssh-keyscan prints it after the host name: a
    type OpenSSH knows, and base64 whose blob starts with that same type (as every SSH public
    key does), so that the fingerprint of a key that passes can always be computed."""
    match = _KEY.fullmatch(key)
    if not match or match.group(1) not in KEY_TYPES:
        return False
    try:
        blob = base64.b64decode(match.group(2), validate=True)
    except binascii.Error:
        return False
    size = int.from_bytes(blob[:4], "big")
    return blob[4 : 4 + size] == match.group(1).encode() and len(blob) > 4 + size


_IFACE = re.compile(r"[A-Za-z0-9_.-]{1,15}")
_WORD = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def valid_interface(name: object) -> TypeGuard[str]:
    """A Linux interface name (at most 15 characters), nothing a tool or YAML reads as syntax."""
    return isinstance(name, str) and bool(_IFACE.fullmatch(name)) and name not in (".", "..")


def valid_word(name: object) -> TypeGuard[str]:
    """A plain word (nftables table and chain names, firewalld zones): nft joins its arguments
    into one command line and parses it, so a name from a node's ruleset must be one."""
    return isinstance(name, str) and bool(_WORD.fullmatch(name))


def valid_peer(address: object) -> bool:
    """A unicast IPv4 address a peer node can have (not 0.0.0.0, loopback or multicast)."""
    try:
        ip = ipaddress.IPv4Address(address)
    except (ValueError, TypeError):
        return False
    return not (ip.is_unspecified or ip.is_loopback or ip.is_multicast or ip.is_reserved)


def printable(text: str) -> str:
    """`text` with control characters (escape sequences, carriage returns, newlines) shown as
    `?`: a node's words go to the user's terminal as text, never as commands to it."""
    return "".join(c if c.isprintable() else "?" for c in text)


def printable_lines(text: str) -> str:
    """`printable` for each line of a report: its own line breaks stay, nothing else does.
    Every human report applies it last, to whatever its lines quote from nodes.

    >>> print(printable_lines("torch: \\x1b]0;title\\x07broken\\nfix: reinstall\\r"))
    torch: ?]0;title?broken
    fix: reinstall?
    """
    return "\n".join(printable(line) for line in text.split("\n"))
