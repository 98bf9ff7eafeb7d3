"""Host keys as ssh and ssh-keyscan report them: a key's fingerprint, the known_hosts name ssh
looked up and did not find, and the keys a host offers. Used by `doctor --fix` and `setup ssh`.

    >>> port_of("[10.0.0.2]:2222"), port_of("gpu-node-1")
    (2222, 22)
"""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess

from trainfleet.untrusted import printable, valid_key, valid_known_hosts_name

KEYSCAN_TIMEOUT_S = 5

# OpenSSH's sshconnect.c, with StrictHostKeyChecking=yes (BatchMode) and no entry for the host:
# "No ED25519 host key is known for [10.0.0.2]:2222 and you have requested strict checking."
# The name is exactly what ssh looks up in known_hosts (HostKeyAlias, HostName, [name]:port).
_UNKNOWN_KEY = re.compile(r"No \S+ host key is known for (\S+) and you have requested strict")


def fingerprint(key: str) -> str:
    """`ssh-ed25519 AAAA...` -> `ssh-ed25519 SHA256:...`, as `ssh-keygen -l` prints it (a
    line of a known_hosts file that is not a key says so instead)."""
    kind_and_blob = " ".join(key.split()[:2])  # a .pub file's line ends in a comment
    if not valid_key(kind_and_blob):
        return f"{printable(key)[:40]!r} (not a valid public key)"
    kind, blob = kind_and_blob.split()
    digest = hashlib.sha256(base64.b64decode(blob)).digest()
    return f"{kind} SHA256:{base64.b64encode(digest).decode().rstrip('=')}"


def unknown_key_name(stderr: str) -> str | None:
    """The known_hosts name ssh looked up and did not find, from its error text (a probe's
    report can carry any text: only a plain name or `[name]:port` counts)."""
    match = _UNKNOWN_KEY.search(stderr)
    if not match:
        return None
    name = match.group(1)
    return name if valid_known_hosts_name(name) else None


def port_of(name: str) -> int:
    match = re.fullmatch(r"\[.+\]:(\d+)", name)
    return int(match.group(1)) if match else 22


def keyscan(address: str, port: int) -> list[str]:
    """The host keys `address:port` offers, as `type base64` (empty when it does not answer)."""
    try:
        out = subprocess.run(
            ["ssh-keyscan", "-T", str(KEYSCAN_TIMEOUT_S), "-p", str(port), "--", address],
            capture_output=True,
            text=True,
            timeout=KEYSCAN_TIMEOUT_S + 5,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    keys = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and not line.startswith("#"):
            keys.append(f"{parts[1]} {parts[2]}")
    return sorted({key for key in keys if valid_key(key)})
