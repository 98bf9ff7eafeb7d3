r"""DeepSpeed's hostfile (`host slots=N`) and its --include/--exclude NODE_SPEC filters
(`worker-0@worker-1:0,2`), read as DeepSpeed's runner reads them, but refusing what it would
silently drop (`node-1 slots=8;reboot` is 8 slots to DeepSpeed, an error here).

    >>> parse_hostfile("gpu-node-1 slots=8\n# spare\ngpu-node-2 slots=8\n")
    {'gpu-node-1': (8, 1), 'gpu-node-2': (8, 3)}
    >>> print(hostfile_text({"gpu-node-1": 8, "gpu-node-2": 4}), end="")
    gpu-node-1 slots=8
    gpu-node-2 slots=4

`hostfile_text` is the one writer of hostfile lines (setup hostfile, the deepspeed backend's
hostfile, the sandbox's).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace

from trainfleet.cluster.model import Node
from trainfleet.cluster.validate import SLOTS_RE, check_host, metachars, parse_slots
from trainfleet.errors import SpecError

# DeepSpeed 0.19.8 runner.py `_parse_hostfile` searches each stripped line of `readlines()` for
# `^(\S+)\s+slots=(\d+)` and ignores whatever follows the digits; ASCII digits here.
_HOSTFILE_LINE = re.compile(r"(\S+)\s+slots=([0-9]+)")
# What may follow the count: MPI's max_slots and a comment. Anything else (`slots=8;reboot`,
# `slots=4xyz`, `slots=1 slots=2`, `slots=4٣`, a NUL) DeepSpeed would drop without a word, or
# read as another number; here it is an error naming the line.
_ALLOWED_TAIL = re.compile(r"(?:\s+max[_-]slots=[0-9]+)?\s*(?:#.*)?\Z", re.DOTALL)
_LINE_FIX = (
    "each line is `HOST slots=N` (DeepSpeed/MPI hostfile; MPI's `max_slots=M` and a `# comment`"
    " may follow), a `#` comment or blank"
)


def _lines(text: str) -> list[str]:
    """The lines DeepSpeed's `readlines()` gives: split at LF, CRLF and CR only (str.splitlines
    also splits at a form feed, a vertical tab, U+2028 and others, and would find hosts there
    that DeepSpeed does not see)."""
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _meta_note(text: str) -> str:
    meta = metachars(text.replace(" ", "").replace("\t", ""))
    return f" (it holds shell metacharacters {meta}; nothing was run)" if meta else ""


def parse_hostfile(text: str, source: str = "hostfile") -> dict[str, tuple[int, int]]:
    """Hosts and slots, in file order, read as DeepSpeed's runner reads them.

    Returns {host: (slots, line)}. Stricter than DeepSpeed where DeepSpeed would go on with a
    surprise: slots=0, shell metacharacters and text after the slot count other than MPI's
    `max_slots=M` or a `# comment` are errors.
    """
    pool: dict[str, tuple[int, int]] = {}
    for lineno, raw in enumerate(_lines(text), start=1):
        line = raw.strip()
        if line == "" or line.startswith("#"):
            continue
        match = _HOSTFILE_LINE.match(line)
        if not match:
            raise SpecError(source, lineno, f"bad entry {line!r}{_meta_note(line)}", _LINE_FIX)
        host = check_host(match.group(1), source, lineno)
        tail = line[match.end() :]
        if not _ALLOWED_TAIL.match(tail):
            raise SpecError(
                source,
                lineno,
                f"bad entry {line!r}: unexpected {tail!r} after `slots={match.group(2)}`"
                + _meta_note(tail),
                "remove it (DeepSpeed's runner reads no further than the count, and says"
                f" nothing); {_LINE_FIX}",
            )
        slots = parse_slots(match.group(2), source, lineno, host)
        if host in pool:
            raise SpecError(
                source,
                lineno,
                f"host {host!r} appears twice (first on line {pool[host][1]})",
                "keep one entry per node",
            )
        pool[host] = (slots, lineno)
    if not pool:
        raise SpecError(source, None, "no hosts in hostfile", "add lines like `node-1 slots=8`")
    return pool


def hostfile_text(slots: Mapping[str, int], header: str = "") -> str:
    """A hostfile with one `HOST slots=N` line per entry of `slots`, after `header` (comment
    lines), read back with parse_hostfile first: exactly what launch and DeepSpeed's runner
    will read, or a SpecError."""
    text = header + "".join(f"{host} slots={n}\n" for host, n in slots.items())
    parse_hostfile(text)
    return text


def _parse_node_specs(spec: str, flag: str) -> dict[str, list[int]]:
    """`worker-0@worker-1:0,2` -> {'worker-0': [], 'worker-1': [0, 2]} (DeepSpeed's syntax)."""
    result: dict[str, list[int]] = {}
    for part in spec.split("@"):
        host, sep, slot_text = part.partition(":")
        # IPv6 literals hold ':' themselves; DeepSpeed's syntax cannot name their slots.
        if sep and ":" in slot_text:
            host, sep, slot_text = part, "", ""
        check_host(host, flag, None)
        slots: list[int] = []
        if sep:
            for item in slot_text.split(","):
                if not SLOTS_RE.match(item):
                    raise SpecError(
                        flag,
                        None,
                        f"slot {item!r} for {host!r} is not a number",
                        "write NODE[:SLOT[,SLOT...]][@NODE...], e.g. worker-0@worker-1:0,2",
                    )
                slots.append(int(item))
        result.setdefault(host, []).extend(slots)
    return {host: sorted(set(slots)) for host, slots in result.items()}


def filter_nodes(nodes: list[Node], include: str = "", exclude: str = "") -> list[Node]:
    """Apply DeepSpeed's --include/--exclude to `nodes`, keeping their order."""
    if include and exclude:
        raise SpecError(
            "--include/--exclude", None, "they are mutually exclusive", "give only one of them"
        )
    if not include and not exclude:
        return nodes
    flag = "--include" if include else "--exclude"
    by_host = {node.host: node for node in nodes}
    chosen: dict[str, list[int]] = {} if include else {n.host: list(n.gpu_ids) for n in nodes}
    for host, slots in _parse_node_specs(include or exclude, flag).items():
        if host not in by_host:
            raise SpecError(
                flag,
                None,
                f"host {host!r} is not in the cluster",
                f"known hosts: {', '.join(by_host)}",
            )
        available = by_host[host].gpu_ids
        for slot in slots:
            if slot not in available:
                raise SpecError(
                    flag,
                    None,
                    f"no slot {slot} on host {host!r} (it has {list(available)})",
                    "use slot indices the node has",
                )
        if include:
            chosen[host] = slots or list(available)
        else:
            chosen[host] = [s for s in chosen[host] if slots and s not in slots]
    kept = [
        replace(node, slots=len(chosen[node.host]), gpu_ids=tuple(chosen[node.host]))
        for node in nodes
        if chosen.get(node.host)
    ]
    if not kept:
        raise SpecError(flag, None, "no node is left", "keep at least one node")
    return kept
