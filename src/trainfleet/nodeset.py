"""Fold node names into ranges, as clush does: gpu-node-1, gpu-node-2, gpu-node-3 -> gpu-node-[1-3],
and expand such a list again, as Slurm writes SLURM_JOB_NODELIST.

>>> fold_names(["gpu-node-1", "gpu-node-2", "gpu-node-3", "gpu-node-5", "login"])
'gpu-node-[1-3,5],login'
>>> fold_groups({"gpu-node-1": "ok", "gpu-node-2": "ok", "gpu-node-3": "down"})
[('gpu-node-[1-2]', 'ok'), ('gpu-node-3', 'down')]
>>> expand_names("gpu-node-[1-3,5],login")
['gpu-node-1', 'gpu-node-2', 'gpu-node-3', 'gpu-node-5', 'login']
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable, Mapping
from typing import TypeVar

_NUMBERED = re.compile(r"^(.*?)(\d+)(\D*)$")

V = TypeVar("V", bound=Hashable)


def _ranges(numbers: list[tuple[int, str]]) -> str:
    """[(1,'1'), (2,'2'), (5,'5')] -> '1-2,5'; zero padding is kept ('01-03')."""
    parts: list[str] = []
    start = prev = numbers[0]
    for item in numbers[1:]:
        padded = item[1].startswith("0") or prev[1].startswith("0")
        if item[0] == prev[0] + 1 and (len(item[1]) == len(prev[1]) or not padded):
            prev = item
            continue
        parts.append(start[1] if start == prev else f"{start[1]}-{prev[1]}")
        start = prev = item
    parts.append(start[1] if start == prev else f"{start[1]}-{prev[1]}")
    return ",".join(parts)


def fold_names(names: Iterable[str]) -> str:
    """One compact string for a set of names; order of first appearance per pattern."""
    groups: dict[tuple[str, str], list[tuple[int, str]]] = {}
    order: list[tuple[str, str] | str] = []
    for name in names:
        match = _NUMBERED.match(name)
        if not match or ":" in name:  # addresses with ':' stay whole
            order.append(name)
            continue
        key = (match.group(1), match.group(3))
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append((int(match.group(2)), match.group(2)))
    parts = []
    for entry in order:
        if isinstance(entry, str):
            parts.append(entry)
            continue
        prefix, suffix = entry
        numbers = sorted(set(groups[entry]))
        if len(numbers) == 1:
            parts.append(f"{prefix}{numbers[0][1]}{suffix}")
        else:
            parts.append(f"{prefix}[{_ranges(numbers)}]{suffix}")
    return ",".join(parts)


def fold_groups(values: Mapping[str, V]) -> list[tuple[str, V]]:
    """Nodes with equal values folded together, in order of first appearance."""
    by_value: dict[V, list[str]] = {}
    for node, value in values.items():
        by_value.setdefault(value, []).append(node)
    return [(fold_names(nodes), value) for value, nodes in by_value.items()]


_GROUP = re.compile(r"\[([^\[\]]*)\]")


def expand_names(hostlist: str) -> list[str]:
    """Slurm's hostlist syntax as names, in its order: commas outside brackets separate
    entries, each bracket a set of numbers and ranges (zero padding kept), several brackets in
    one entry their product, as `scontrol show hostnames` prints them (no scontrol needed:
    it is missing inside many containers).

    >>> expand_names("n[01-03]-ib,rack[1-2]-n[1-2]")
    ['n01-ib', 'n02-ib', 'n03-ib', 'rack1-n1', 'rack1-n2', 'rack2-n1', 'rack2-n2']
    >>> expand_names("gpu-node-[3-1]")
    Traceback (most recent call last):
    ...
    ValueError: gpu-node-[3-1]: range 3-1 runs backwards
    """
    names: list[str] = []
    for entry in _entries(hostlist):
        found = _GROUP.search(entry)
        if found is None:
            if "[" in entry or "]" in entry:
                raise ValueError(f"{entry}: unbalanced brackets")
            names.append(entry)
            continue
        head, tail = entry[: found.start()], entry[found.end() :]
        names += [name for number in _numbers(entry, found.group(1))
                  for name in expand_names(head + number + tail)]  # fmt: skip
    return names


def _entries(hostlist: str) -> list[str]:
    entries, depth, start = [], 0, 0
    for at, char in enumerate(hostlist):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            entries.append(hostlist[start:at])
            start = at + 1
    entries.append(hostlist[start:])
    return [entry.strip() for entry in entries if entry.strip()]


def _numbers(entry: str, ranges: str) -> list[str]:
    numbers = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"{entry}: {part!r} is not a number or a range")
        if not high:
            numbers.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"{entry}: range {part} runs backwards")
        width = len(low) if low.startswith("0") else 0
        numbers += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return numbers
