"""Checks for every value of a cluster spec that can reach a remote shell or ssh: host names,
login names, interfaces, paths, numbers, environment variables. Errors name the file and line.

    >>> check_host("gpu-node-1", "hostfile", 1)
    'gpu-node-1'
"""

from __future__ import annotations

import re
from typing import Any

from trainfleet.errors import SpecError
from trainfleet.spec_yaml import LineDict

# Letters, digits and the few punctuation marks that host names, ssh aliases and IPv4/IPv6
# addresses use. No shell metacharacter, no whitespace, no leading '-' (ssh would read an option).
# Every pattern ends in \Z, not $: `$` would also accept a value ending in a newline.
HOST_RE = re.compile(r"[A-Za-z0-9_:][A-Za-z0-9_.:%-]*\Z")
USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
IFACE_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,14}\Z")
ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Paths that reach a remote shell (python, workdir): absolute or ~, no metacharacters.
PATH_RE = re.compile(r"[A-Za-z0-9_./~+,=@%:-]+\Z")
SLOTS_RE = re.compile(r"[0-9]{1,6}\Z")  # ASCII digits only: str.isdigit() accepts '²'
MAX_SLOTS = 4096
SHELL_META = set(";&|<>()$`\\\"' \t\n*?[]{}!#~")


def metachars(value: str) -> str:
    found = sorted({ch for ch in value if ch in SHELL_META or not ch.isprintable()})
    return " ".join(repr(ch) for ch in found)


def check_host(host: str, source: str, line: int | None) -> str:
    """Reject a host that is empty, starts with '-' or holds shell metacharacters."""
    if not host:
        raise SpecError(source, line, "empty host name", "write a host name or address")
    if isinstance(host, str) and HOST_RE.match(host):
        return host
    if host.startswith("-"):
        problem = f"host name {host!r} starts with '-' (ssh would read it as an option)"
    elif "@" in host:
        problem = f"host name {host!r} holds '@' (the --include/--exclude separator)"
    else:
        bad = metachars(host) or "characters outside letters, digits and '._:%-'"
        problem = f"host name {host!r} contains shell metacharacters ({bad}); it is never run"
    raise SpecError(
        source,
        line,
        problem,
        "use the node's address or an ssh config alias made of letters, digits and '.-_'"
        " (put the login name in cluster.yaml `ssh: {user: ...}` or ~/.ssh/config)",
    )


def check_pattern(value: Any, what: str, pattern: re.Pattern[str], source: str, line: int) -> str:
    if not isinstance(value, str) or not value:
        raise SpecError(source, line, f"{what} must be a non-empty string", f"set {what}")
    if not pattern.match(value):
        bad = metachars(value) or "unexpected characters"
        raise SpecError(
            source,
            line,
            f"{what} {value!r} contains characters a remote shell would interpret ({bad})",
            f"use a plain {what} without shell metacharacters",
        )
    return value


def check_int(value: Any, what: str, source: str, line: int, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(source, line, f"{what} must be an integer, got {value!r}", f"set {what}")
    if not low <= value <= high:
        raise SpecError(
            source, line, f"{what} must be in {low}..{high}, got {value}", f"set {what}"
        )
    return value


def check_env(value: Any, source: str, line: int) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(source, line, "env must be a mapping", "write `env: {NAME: value}`")
    env: dict[str, str] = {}
    for key, val in value.items():
        key_line = value.line_of(key) if isinstance(value, LineDict) else line
        if not isinstance(key, str) or not ENV_KEY_RE.match(key):
            raise SpecError(
                source,
                key_line,
                f"environment variable name {key!r} is not a valid name",
                "use letters, digits and '_', not starting with a digit",
            )
        if isinstance(val, dict | list) or val is None:
            raise SpecError(
                source, key_line, f"env {key} must be a string or number", f"write `{key}: value`"
            )
        # Values may hold anything: they are always quoted before they reach a shell.
        env[key] = str(val).lower() if isinstance(val, bool) else str(val)
    return env


def parse_slots(text: str, source: str, line: int | None, host: str) -> int:
    slots = int(text) if SLOTS_RE.match(text) else -1
    if not 1 <= slots <= MAX_SLOTS:
        shown = text if len(text) <= 12 else text[:12] + "..."
        raise SpecError(
            source,
            line,
            f"slots for {host!r} must be a number in 1..{MAX_SLOTS}, got {shown!r}",
            f"write e.g. `{host} slots=8`",
        )
    return slots
