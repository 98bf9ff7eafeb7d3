"""What belongs to this test process: the sandboxes it names and brings up, and the processes
it starts (on this machine, or on the nodes of its sandboxes). pytest-xdist may run two test
processes side by side; each checks and cleans up only its own."""

from __future__ import annotations

import os
import re
from pathlib import Path

SESSION_TAG = f"{os.getpid() % 1000:03d}"
"""Three digits in the name of every sandbox this test process brings up. Under pytest-xdist
each worker is its own process with its own tag, so a worker ends (or checks for leftovers)
only what is its own, never what the other worker is using."""
os.environ["TRAINFLEET_TEST_SESSION"] = SESSION_TAG  # marks this process's local children

TEST_SANDBOX = re.compile(r"^[tmcs](\d{3})(?:\d{4}|ref)$")
"""Names the tests give their sandboxes: a kind letter (t make_sandbox, m module_sandbox, c
chaos's reference, s test_setup's boxes), the session tag, then a number or `ref`. A user's
sandbox is never named so by the tests' own hands."""


def own_sandbox_name(kind: str, suffix: str) -> str:
    name = f"{kind}{SESSION_TAG}{suffix}"
    assert TEST_SANDBOX.match(name), name
    return name


def sandboxes_up() -> set[str]:
    """Every sandbox with a state dir or a namespace on this machine (tf-NAME-N)."""
    from trainfleet.sandbox import netns, state

    root = state.state_root()
    names = {p.name for p in root.iterdir() if p.is_dir()} if root.is_dir() else set()
    return names | {ns[3:].rsplit("-", 1)[0] for ns in netns.netns_list() if ns.startswith("tf-")}


def own_sandboxes_up() -> list[str]:
    return sorted(
        name
        for name in sandboxes_up()
        if (match := TEST_SANDBOX.match(name)) and match.group(1) == SESSION_TAG
    )


def own_cmdlines() -> dict[int, str]:
    """`pid -> command line` of the processes this test process started, and only those: on
    the nodes of its sandboxes (inside their network namespaces), or on this machine (they
    inherit TRAINFLEET_TEST_SESSION from the test process's environment)."""
    from trainfleet.localprocs import cmdlines
    from trainfleet.sandbox import netns

    mine = {f"tf-{name}-" for name in own_sandboxes_up()}
    namespaces = set()
    for ns in netns.netns_list():
        if any(ns.startswith(prefix) for prefix in mine):
            try:
                namespaces.add(os.stat(f"/run/netns/{ns}").st_ino)
            except OSError:
                pass
    mark = f"TRAINFLEET_TEST_SESSION={SESSION_TAG}".encode()
    own = {}
    for pid, cmdline in cmdlines().items():
        try:
            inside = os.stat(f"/proc/{pid}/ns/net").st_ino in namespaces
            if inside or mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                own[pid] = cmdline
        except OSError:  # gone meanwhile
            continue
    return own
