"""Rows -> batches for the model: `collator(...)` picks the `Collator` for the cache's packing
and the model's attention implementation; `measure_padding` counts the padding an epoch of
batches carries.

    >>> from trainfleet.train.data import collator
    >>> batch = collator(packing=True, attn_implementation="sdpa")([
    ...     {"input_ids": [5, 6, 7], "labels": [-100, 6, 7], "position_ids": [0, 1, 2]},
    ...     {"input_ids": [8], "labels": [-100], "position_ids": [0]},
    ... ])
    >>> sorted(batch), batch["position_ids"].tolist()
    (['input_ids', 'labels', 'position_ids'], [[0, 1, 2], [0, 0, 1]])
    >>> collator(packing=True, attn_implementation="flash_attention_2").flatten
    True

transformers (5.x, `masking_utils.find_packed_sequence_indices`) builds a block-diagonal causal
mask from position_ids that restart at 0 at every sample, for sdpa, eager and flex_attention
when no attention_mask and no KV cache are passed (Trainer's `use_cache=False`);
flash-attention reads them only for a batch of one row, so
`collator(attn_implementation="flash_attention_2")` flattens the batch.
`tests/unit/test_train_data.py` checks that a packed sample's logits equal the sample's alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from trainfleet.errors import TrainfleetError
from trainfleet.train.data.encode import IGNORE_INDEX

if TYPE_CHECKING:
    from trainfleet.train.data.cache import TokenizedDataset

PACKING_ATTENTION = ("sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3")
"""Attention implementations that keep packed samples apart given restarting position_ids."""
_ONE_ROW_ATTENTION = ("flash_attention_2", "flash_attention_3")


@dataclass(kw_only=True, slots=True, frozen=True)
class Collator:
    """Rows -> a batch for the model. Packed: input_ids, labels, position_ids, no
    attention_mask (one would switch transformers' packed-sample masking off); a short row is
    padded with a masked segment whose positions restart at 0, so it attends to itself only.
    Padded: input_ids, labels, attention_mask, padded on the right."""

    packed: bool
    pad_token_id: int = 0
    """Any id: padding is masked out of attention and loss."""
    pad_to: int | None = None
    """Pad every batch to this many tokens (e.g. seq_len); default: the longest row."""
    flatten: bool = False
    """Packed: one row of all the batch's tokens (flash-attention reads packed position_ids
    only when the batch is one row)."""

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        import torch

        rows = [{name: np.asarray(value) for name, value in ex.items()} for ex in examples]
        if self.packed and "position_ids" not in rows[0]:
            raise ValueError("a packed collator needs rows with position_ids (a packed cache)")
        names = ("input_ids", "labels", "position_ids") if self.packed else ("input_ids", "labels")
        if self.packed and self.flatten:
            return {n: torch.from_numpy(np.concatenate([r[n] for r in rows]))[None] for n in names}
        longest = max(len(row["input_ids"]) for row in rows)
        width = self.pad_to or longest
        if width < longest:
            raise ValueError(f"pad_to {self.pad_to} is shorter than a row of {longest} tokens")
        batch = {
            "input_ids": np.full((len(rows), width), self.pad_token_id, dtype=np.int64),
            "labels": np.full((len(rows), width), IGNORE_INDEX, dtype=np.int64),
        }
        if self.packed:
            batch["position_ids"] = np.zeros((len(rows), width), dtype=np.int64)
        else:
            batch["attention_mask"] = np.zeros((len(rows), width), dtype=np.int64)
        for i, row in enumerate(rows):
            length = len(row["input_ids"])
            for name in names:
                batch[name][i, :length] = row[name]
            if self.packed:
                batch["position_ids"][i, length:] = np.arange(width - length)
            else:
                batch["attention_mask"][i, :length] = 1
        return {name: torch.from_numpy(value) for name, value in batch.items()}


def collator(
    *,
    packing: bool,
    pad_token_id: int | None = None,
    attn_implementation: str = "sdpa",
    pad_to: int | None = None,
) -> Collator:
    """The collator for a cache built with `packing`, for the model's attention implementation."""
    if packing and attn_implementation not in PACKING_ATTENTION:
        raise TrainfleetError(
            f"attn_implementation {attn_implementation!r} is not known to keep packed samples "
            "apart (attention would leak from one sample into the next)",
            f"use one of {', '.join(PACKING_ATTENTION)}, or packing: false",
        )
    return Collator(
        packed=packing,
        pad_token_id=0 if pad_token_id is None else pad_token_id,
        pad_to=pad_to,
        flatten=packing and attn_implementation in _ONE_ROW_ATTENTION,
    )


@dataclass(kw_only=True, slots=True, frozen=True)
class TokenCounts:
    real: int
    padding: int
    trained: int

    @property
    def real_fraction(self) -> float:
        return self.real / ((self.real + self.padding) or 1)


def measure_padding(
    dataset: TokenizedDataset,
    *,
    batch_size: int,
    pad_to: int | None = None,
    shuffle_seed: int | None = 0,
) -> TokenCounts:
    """Real and padding tokens over one epoch of `Collator` batches (rows in a seeded random
    order, like the Trainer's sampler; None: in cache order): packing vs padding, for a bench."""
    lengths = dataset.row_lengths()
    if shuffle_seed is not None:
        lengths = lengths[np.random.default_rng(shuffle_seed).permutation(len(lengths))]
    slots = 0
    for start in range(0, len(lengths), batch_size):
        batch = lengths[start : start + batch_size]
        slots += len(batch) * (pad_to or int(batch.max()))
    real = int(lengths.sum())
    return TokenCounts(real=real, padding=slots - real, trained=dataset.trained_tokens())
