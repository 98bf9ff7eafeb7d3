"""Samples -> rows: how samples are laid into rows of at most seq_len, and `Rows`, the flat token
arrays plus row offsets that the cache stores.

    >>> from trainfleet.train.data import pack
    >>> rows = pack([([1, 2, 3], [1, 2, 3]), ([4, 5], [4, 5]), ([6], [6])],
    ...             seq_len=4, packing=True, split=False)
    >>> [rows.row(i)["input_ids"] for i in range(len(rows))]
    [[1, 2, 3, 6], [4, 5]]
    >>> rows.row(0)["position_ids"]
    [0, 1, 2, 0]

Packing: `text` samples are cut into rows of exactly seq_len (a sample is split across rows
and its pieces each restart at position 0; the last row may be shorter and is kept).
`prompt/completion` and `messages` samples are never split (an answer without its question
teaches the wrong thing): best-fit-decreasing puts whole samples into rows of at most seq_len,
and a sample longer than seq_len is dropped and counted (TRL's default "bfd" packing keeps
samples whole too, but truncates long ones, which can cut an answer and its EOS).
`position_ids` restart at 0 at every sample, and the first token of a sample is never a target.
Without packing, rows are samples (long `text` cut into seq_len pieces), padded per batch.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from trainfleet.train.data.encode import IGNORE_INDEX, Sample, TokenIds

_ARRAYS = ("input_ids", "labels", "position_ids", "row_offsets")


@dataclass(slots=True)
class Rows:
    """Rows as flat int32 token arrays plus where each row starts: what the cache stores."""

    pieces: dict[str, list[np.ndarray]] = field(
        default_factory=lambda: {name: [] for name in _ARRAYS[:3]}
    )
    row_offsets: list[int] = field(default_factory=lambda: [0])
    tokens: int = 0

    def add_piece(self, input_ids: TokenIds, labels: TokenIds) -> None:
        """One sample (or piece of one): positions from 0, its first token never a target."""
        targets = np.array(labels, dtype=np.int32)
        targets[0] = IGNORE_INDEX
        self.pieces["input_ids"].append(np.asarray(input_ids, dtype=np.int32))
        self.pieces["labels"].append(targets)
        self.pieces["position_ids"].append(np.arange(len(targets), dtype=np.int32))
        self.tokens += len(targets)

    def end_row(self) -> None:
        self.row_offsets.append(self.tokens)

    def __len__(self) -> int:
        return len(self.row_offsets) - 1

    def arrays(self) -> dict[str, np.ndarray]:
        flat = {
            name: np.concatenate([np.empty(0, np.int32), *p]) for name, p in self.pieces.items()
        }
        return {**flat, "row_offsets": np.asarray(self.row_offsets, dtype=np.int64)}

    def row(self, index: int) -> dict[str, list[int]]:
        start, end = self.row_offsets[index : index + 2]
        arrays = self.arrays()
        return {name: arrays[name][start:end].tolist() for name in self.pieces}


def pack(samples: Iterable[Sample], *, seq_len: int, packing: bool, split: bool) -> Rows:
    """Rows of samples. packing+split: rows of exactly seq_len (the last may be shorter);
    packing without split: whole samples, best fit decreasing, rows of at most seq_len; no
    packing: one sample per row, split into seq_len pieces when `split`."""
    if packing and not split:
        return _pack_whole(list(samples), seq_len)
    rows, fill = Rows(), 0
    for input_ids, labels in samples:
        start = 0
        while start < len(input_ids):
            take = min(seq_len - fill, len(input_ids) - start)
            rows.add_piece(input_ids[start : start + take], labels[start : start + take])
            fill, start = fill + take, start + take
            if fill == seq_len or not packing:
                rows.end_row()
                fill = 0
    if fill:
        rows.end_row()
    return rows


def _pack_whole(samples: list[Sample], seq_len: int) -> Rows:
    order = sorted(range(len(samples)), key=lambda i: (-len(samples[i][0]), i))
    bins: list[list[int]] = []
    bins_by_room: dict[int, deque[int]] = {}  # room left -> bins with that much, oldest first
    rooms: list[int] = []  # sorted keys of bins_by_room: the best fit is one bisect away
    for index in order:
        length = len(samples[index][0])
        if length > seq_len:
            raise ValueError(f"sample of {length} tokens does not fit seq_len {seq_len}")
        at = bisect_left(rooms, length)
        if at < len(rooms):
            room = rooms[at]
            chosen = bins_by_room[room].popleft()
            if not bins_by_room[room]:
                del bins_by_room[room]
                rooms.pop(at)
        else:
            room, chosen = seq_len, len(bins)
            bins.append([])
        bins[chosen].append(index)
        if left := room - length:
            if left not in bins_by_room:
                bins_by_room[left] = deque()
                insort(rooms, left)
            bins_by_room[left].append(chosen)
    rows = Rows()
    for members in bins:
        for index in members:
            rows.add_piece(*samples[index])
        rows.end_row()
    return rows
