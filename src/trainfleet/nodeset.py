"""Fold node names into ranges, as clush does: gpu-node-1, gpu-node-2, gpu-node-3 -> gpu-node-[1-3].

>>> fold_names(["gpu-node-1", "gpu-node-2", "gpu-node-3", "gpu-node-5", "login"])
'gpu-node-[1-3,5],login'
>>> fold_groups({"gpu-node-1": "ok", "gpu-node-2": "ok", "gpu-node-3": "down"})
[('gpu-node-[1-2]', 'ok'), ('gpu-node-3', 'down')]
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
