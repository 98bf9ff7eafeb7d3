"""Training data: records are checked, tokenized, masked and packed once, into a cache every rank
loads.

    >>> rows = pack([([1, 2, 3], [1, 2, 3]), ([4, 5, 6], [-100, 5, 6])],
    ...             seq_len=4, packing=True, split=True)
    >>> [rows.row(i)["input_ids"] for i in range(len(rows))]
    [[1, 2, 3, 4], [5, 6]]
    >>> rows.row(0)["labels"], rows.row(0)["position_ids"]
    ([-100, 2, 3, -100], [0, 1, 2, 0])

On the launch node `tokenize_to_cache(data, model_dir, cache_root=..., seq_len=...)` raises a
`DataError` naming the file and line for a bad record (or skips and counts it with
`skip_bad_records`), and for an empty dataset or a seq_len no sample fits in; each rank then
`load_cached(path)` and batches rows with `collator(...)`.

Modules (each imports only modules listed before it):

- `records`: finding the input files; reading JSONL, Parquet and saved datasets; the record
  shapes (`text`, `prompt` + `completion`, `messages`) and what is wrong with a record;
  `DataError`.
- `encode`: the tokenizer; records -> samples (input_ids, labels) with the loss masks, chat
  templates included; bad records skipped and counted.
- `packing`: samples -> `Rows`: split into seq_len rows, or whole samples packed
  best-fit-decreasing; `position_ids` restart at every sample.
- `build_once`: a directory built by one process under a lock, renamed into place, while the
  others wait.
- `cache`: the cache key, `tokenize_to_cache`, `prepare_cache`, `DataSummary`, `load_cached` and
  the memory-mapped `TokenizedDataset`.
- `batches`: rows -> batches for the model (`collator`, `Collator`) and `measure_padding`.

Reused: transformers' tokenizer, chat-template rendering and assistant mask; `datasets` and
pyarrow to read saved datasets and Parquet. Not reused: `DataCollatorWithFlattening` (it
rebuilds position_ids per row, losing the samples packed inside a row), TRL's `pack_dataset`
(bins up to seq_len, or "wrapped" rows that run samples together with no position reset) and
its SFTTrainer (adding trl for ~100 lines of masking was not worth the dependency).
"""

from __future__ import annotations

from trainfleet.train.data import batches, build_once, cache, encode, packing, records
from trainfleet.train.data.batches import (
    PACKING_ATTENTION,
    Collator,
    TokenCounts,
    collator,
    measure_padding,
)
from trainfleet.train.data.cache import (
    FORMAT_VERSION,
    DataSummary,
    TokenizedDataset,
    load_cached,
    prepare_cache,
    tokenize_to_cache,
)
from trainfleet.train.data.encode import IGNORE_INDEX, Sample
from trainfleet.train.data.packing import Rows, pack
from trainfleet.train.data.records import DataError

__all__ = [
    "FORMAT_VERSION",
    "IGNORE_INDEX",
    "PACKING_ATTENTION",
    "Collator",
    "DataError",
    "DataSummary",
    "Rows",
    "Sample",
    "TokenCounts",
    "TokenizedDataset",
    "collator",
    "load_cached",
    "measure_padding",
    "pack",
    "prepare_cache",
    "tokenize_to_cache",
]

# doctest.testmod(data) runs each module's example too (they need numpy, as this package does,
# so they run with the train extra, not in tests/unit/test_docstring_examples.py).
__test__ = {
    "records": records,
    "encode": encode,
    "packing": packing,
    "build_once": build_once,
    "cache": cache,
    "batches": batches,
}
