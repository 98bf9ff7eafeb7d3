"""Host keys as OpenSSH's tools show them: what `ssh-keyscan` gets from a host, and the SHA256
fingerprint `ssh-keygen -l` prints for a key. Used by `doctor --fix` and `setup ssh`.

    >>> fingerprint("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEu0j7Yen8E0N5VghM9IYpPVGZ6C9upE6vc"
    ...             "OK677SwQR")
    'ssh-ed25519 SHA256:SJMUTI1e8X1iboPlwKpa21bq2/cOU1w2TPahhmfOg7U'

A key a host offers is its own word: only `type base64` counts (`trainfleet.untrusted`).
"""

from __future__ import annotations

import base64
import hashlib
import subprocess

from trainfleet.untrusted import valid_key

KEYSCAN_TIMEOUT_S = 5


def fingerprint(key: str) -> str:
    """`ssh-ed25519 AAAA...` -> `ssh-ed25519 SHA256:...`, as `ssh-keygen -l` prints it."""
    kind, blob = key.split()[:2]
    digest = hashlib.sha256(base64.b64decode(blob)).digest()
    return f"{kind} SHA256:{base64.b64encode(digest).decode().rstrip('=')}"


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
