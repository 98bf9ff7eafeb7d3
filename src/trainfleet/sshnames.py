"""What may be written into a known_hosts line: a plain host name or IP address, and a key as
`type base64`. Names and keys reach it from nodes (their `hostname`, ssh-keyscan's answer, ssh's
error text in a probe's report), and root on a node controls all of them: a node reporting `*`
as its name, or a name holding a newline and `@cert-authority * KEY`, would otherwise have its
key trusted for every host.

    >>> [valid_name(n) for n in ("gpu-node-1", "10.0.0.11", "fe80::2", "*", "a\\n@cert-authority")]
    [True, True, True, False, False]
    >>> valid_name("gpu-node-1\\n"), valid_name("fe80::1%x *"), valid_name("10.0.0.1,*")
    (False, False, False)
    >>> valid_key("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB"), valid_key("@cert-authority *")
    (True, False)
"""

from __future__ import annotations

import ipaddress
import re

_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_KEY = re.compile(r"(?:ssh|ecdsa|sk)-[A-Za-z0-9@.-]+ [A-Za-z0-9+/]+={0,2}")
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


def valid_key(key: str) -> bool:
    """`type base64`, as ssh-keyscan prints a key after the host name."""
    return bool(_KEY.fullmatch(key))
