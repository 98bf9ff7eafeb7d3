"""Why a node's command did not succeed: ssh's exit status and messages classified into
`Failure`s, each with its finding id and fix, and the per-node `NodeResult`.

    >>> classify(255, "ssh: connect to host n1 port 22: Connection refused", False, True)
    <Failure.REFUSED: 'unreachable: connection refused'>
    >>> Failure.REFUSED.pitfall_id
    <FindingId.SSH_UNREACHABLE: 'ssh-unreachable'>
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from trainfleet.catalog import FindingId


class Failure(enum.Enum):
    """Why a node's command did not succeed; `pitfall_id` is the finding id it maps to."""

    NONE = "ok"
    REFUSED = "unreachable: connection refused"
    CONNECT_TIMEOUT = "unreachable: connect timed out"
    NO_ROUTE = "unreachable: no route to host"
    DNS = "unreachable: name does not resolve"
    SSH_ERROR = "unreachable: ssh failed"
    AUTH = "auth failed"
    HOSTKEY_UNKNOWN = "host key unknown"
    HOSTKEY_CHANGED = "host key changed"
    HOSTKEY_ALGO = "no common host key algorithm"
    TIMED_OUT = "timed out"
    COMMAND_FAILED = "command failed"

    @property
    def pitfall_id(self) -> FindingId | None:
        return _PITFALL_IDS.get(self)

    def fix(self, host: str) -> str:
        """What to do about it on `host`; empty for NONE and COMMAND_FAILED."""
        return _FIXES.get(self, "").format(host=host)

    @property
    def is_connection_failure(self) -> bool:
        """The command never ran (or the connection broke): nothing is known of the node."""
        return self not in (Failure.NONE, Failure.COMMAND_FAILED, Failure.TIMED_OUT)


_PITFALL_IDS = {
    Failure.REFUSED: FindingId.SSH_UNREACHABLE,
    Failure.CONNECT_TIMEOUT: FindingId.SSH_UNREACHABLE,
    Failure.NO_ROUTE: FindingId.SSH_UNREACHABLE,
    Failure.DNS: FindingId.HOSTNAME_UNRESOLVABLE,
    Failure.SSH_ERROR: FindingId.SSH_UNREACHABLE,
    Failure.AUTH: FindingId.SSH_AUTH_FAILED,
    Failure.HOSTKEY_UNKNOWN: FindingId.SSH_HOSTKEY_UNKNOWN,
    Failure.HOSTKEY_CHANGED: FindingId.SSH_HOSTKEY_CHANGED,
    Failure.HOSTKEY_ALGO: FindingId.SSH_HOSTKEY_ALGO,
}

_FIXES = {
    Failure.REFUSED: "nothing listens on {host}'s ssh port: start sshd there, or fix the port",
    Failure.CONNECT_TIMEOUT: "check {host}'s address, that it is up, and that a firewall "
    "lets port 22 through",
    Failure.NO_ROUTE: "check {host}'s address and that it is up and on this network",
    Failure.DNS: "add {host} to /etc/hosts or ~/.ssh/config (HostName), or use its address",
    Failure.SSH_ERROR: "run `ssh -v {host} true` to see where the connection stops",
    Failure.AUTH: "`ssh-copy-id {host}` from the machine that connects (or add its public key "
    "to {host}'s ~/.ssh/authorized_keys)",
    Failure.HOSTKEY_UNKNOWN: "check its fingerprint (`ssh-keyscan {host} | ssh-keygen -lf -`), "
    "then `ssh-keyscan {host} >> ~/.ssh/known_hosts`",
    Failure.HOSTKEY_CHANGED: "if {host} was reinstalled, confirm its new fingerprint, then "
    "`ssh-keygen -R {host}`",
    Failure.HOSTKEY_ALGO: "add `HostKeyAlgorithms +ssh-rsa` for {host} in ~/.ssh/config, "
    "or give the node new host keys",
    Failure.TIMED_OUT: "the command ran longer than --timeout; raise it or check {host}",
}

# ssh's own messages, first match wins (the hostkey-changed banner comes with
# "Host key verification failed", so it is tested first).
_SSH_PATTERNS: tuple[tuple[str, Failure], ...] = (
    ("REMOTE HOST IDENTIFICATION HAS CHANGED", Failure.HOSTKEY_CHANGED),
    ("no matching host key type found", Failure.HOSTKEY_ALGO),
    ("Host key verification failed", Failure.HOSTKEY_UNKNOWN),
    ("No ED25519 host key is known", Failure.HOSTKEY_UNKNOWN),
    ("host key is known for", Failure.HOSTKEY_UNKNOWN),
    ("Permission denied", Failure.AUTH),
    ("Too many authentication failures", Failure.AUTH),
    ("Connection refused", Failure.REFUSED),
    ("Connection timed out", Failure.CONNECT_TIMEOUT),
    ("Operation timed out", Failure.CONNECT_TIMEOUT),
    ("No route to host", Failure.NO_ROUTE),
    ("Network is unreachable", Failure.NO_ROUTE),
    ("Could not resolve hostname", Failure.DNS),
    ("Name or service not known", Failure.DNS),
    ("Temporary failure in name resolution", Failure.DNS),
)


def classify(returncode: int | None, stderr: str, timed_out: bool, via_ssh: bool) -> Failure:
    """Map an exit status and stderr to a Failure class."""
    if timed_out:
        return Failure.TIMED_OUT
    if returncode == 0:
        return Failure.NONE
    if via_ssh and returncode == 255:
        for needle, failure in _SSH_PATTERNS:
            if needle in stderr:
                return failure
        return Failure.SSH_ERROR
    return Failure.COMMAND_FAILED


@dataclass(kw_only=True, slots=True)
class NodeResult:
    """What one node did with the command."""

    node: str
    returncode: int | None
    """Exit status; None when it was killed for the timeout."""
    stdout: str
    stderr: str
    duration_s: float
    failure: Failure

    @property
    def ok(self) -> bool:
        return self.failure is Failure.NONE

    def reason(self) -> str:
        """One line: the class and ssh's last stderr line, e.g. for the exec summary."""
        detail = self.stderr.strip().splitlines()[-1] if self.stderr.strip() else ""
        if self.failure is Failure.COMMAND_FAILED:
            return f"exit {self.returncode}" + (f": {detail}" if detail else "")
        return self.failure.value + (f" ({detail})" if detail else "")

    def to_json(self) -> dict:
        return {
            "node": self.node,
            "returncode": self.returncode,
            "failure": self.failure.name.lower(),
            "pitfall_id": self.failure.pitfall_id and self.failure.pitfall_id.value,
            "fix": self.failure.fix(self.node),
            "duration_s": round(self.duration_s, 3),
            "stdout": self.stdout,
            "stderr": self.stderr,
        }
