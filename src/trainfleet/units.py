"""Sizes as people write them, one spelling for the whole tool.

    >>> parse_size("1G"), parse_size("80GiB") == 80 * 2**30, parse_size("96GB")
    (1073741824, True, 96000000000)
    >>> gib(3 * 2**30 // 2)
    '1.50 GiB'

A bare K/M/G/T and KiB/MiB/GiB/TiB are binary (as nccl-tests' -b/-e and `free -g`); KB/MB/GB/TB
are decimal (as datasheets and network speeds).
"""

from __future__ import annotations

import re

from trainfleet.errors import TrainfleetError

_POWERS = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(I?B)?\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    match = _SIZE.fullmatch(text)
    if not match:
        raise TrainfleetError(
            f"cannot read size {text!r}",
            "write it like 64M, 80GiB (binary) or 96GB (decimal), or a number of bytes",
        )
    number, prefix, suffix = match.group(1), match.group(2).upper(), (match.group(3) or "").upper()
    base = 1000 if suffix == "B" and prefix else 1024
    return int(float(number) * base ** _POWERS[prefix])


def gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.2f} GiB"
