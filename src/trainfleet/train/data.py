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

Records (the shape is detected from the first valid one, then required of every one): `text`
(loss on every token), `prompt` + `completion` (loss on the completion), `messages` (rendered
with the tokenizer's chat template, loss on the assistant turns). EOS ends every sample.
A token is trained when one of its characters lies in a trained span (tokenizer offsets), so
tokens that merge across the prompt/completion boundary count as completion. Chat templates
with `{% generation %}` go through transformers' `apply_chat_template(...,
return_assistant_tokens_mask=True)`; without it, each assistant turn's span is the text
between the conversation rendered up to it with `add_generation_prompt=True` and rendered
through it, which needs a template that renders earlier turns the same whatever follows.

Packing: `text` samples are cut into rows of exactly seq_len (a sample is split across rows
and its pieces each restart at position 0; the last row may be shorter and is kept).
`prompt/completion` and `messages` samples are never split (an answer without its question
teaches the wrong thing): best-fit-decreasing puts whole samples into rows of at most seq_len,
and a sample longer than seq_len is dropped and counted (TRL's default "bfd" packing keeps
samples whole too, but truncates long ones, which can cut an answer and its EOS).
`position_ids` restart at 0 at every sample, and the first token of a sample is never a target.
transformers (5.x, `masking_utils.find_packed_sequence_indices`) builds a block-diagonal causal
mask from such position_ids for sdpa, eager and flex_attention when no attention_mask and no
KV cache are passed (Trainer's `use_cache=False`); flash-attention reads them only for a batch
of one row, so `collator(attn_implementation="flash_attention_2")` flattens the batch.
`tests/unit/test_train_data.py` checks that a packed sample's logits equal the sample's alone.
Without packing, rows are samples (long `text` cut into seq_len pieces), padded per batch.

Reused: transformers' tokenizer, chat-template rendering and assistant mask; `datasets` and
pyarrow to read saved datasets and Parquet. Not reused: `DataCollatorWithFlattening` (it
rebuilds position_ids per row, losing the samples packed inside a row), TRL's `pack_dataset`
(bins up to seq_len, or "wrapped" rows that run samples together with no position reset) and
its SFTTrainer (adding trl for ~100 lines of masking was not worth the dependency).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import time
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TextIO

import numpy as np

from trainfleet.errors import TrainfleetError
from trainfleet.procs import pid_alive

if TYPE_CHECKING:
    from trainfleet.train.config import TrainConfig

FORMAT_VERSION = 1
"""Bumped whenever the cache's content or layout changes: part of the cache key."""
IGNORE_INDEX = -100
"""The label the loss skips (transformers' `ignore_index`)."""
PACKING_ATTENTION = ("sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3")
"""Attention implementations that keep packed samples apart given restarting position_ids."""
_ONE_ROW_ATTENTION = ("flash_attention_2", "flash_attention_3")
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
_EXAMPLES = {
    "text": '{"text": "..."}',
    "prompt_completion": '{"prompt": "...", "completion": "..."}',
    "messages": '{"messages": [{"role": "user", "content": "..."}, '
    '{"role": "assistant", "content": "..."}]}',
}
_ARRAYS = ("input_ids", "labels", "position_ids", "row_offsets")
_ENCODE_BATCH = 256

Sample = tuple[Sequence[int], Sequence[int]]
"""(input_ids, labels) of one sample, labels IGNORE_INDEX where there is no loss."""


class DataError(TrainfleetError):
    """A record, or a whole dataset, that cannot be trained on."""

    def __init__(self, where: str, problem: str, fix: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(f"{where}: {problem}", fix)


@dataclass(kw_only=True, slots=True, frozen=True)
class DataSummary:
    shape: str
    """text, prompt_completion or messages."""
    packing: bool
    seq_len: int
    records: int
    bad_records: int
    """Skipped with skip_bad_records (else the first one is an error)."""
    bad_examples: tuple[str, ...]
    """The first few skipped records: `file:line: problem`."""
    too_long: int
    """prompt/completion and messages samples longer than seq_len: dropped."""
    samples: int
    tokens: int
    trained_tokens: int
    rows: int
    path: str = ""
    """The cache directory (not stored in it, so that caches are byte-identical anywhere)."""

    def render(self) -> str:
        shape = self.shape.replace("_", "/")
        lines = [
            f"data: {self.records:,} {shape} records -> {self.samples:,} samples, "
            f"{self.tokens:,} tokens ({self.trained_tokens:,} trained) in {self.rows:,} "
            f"{'packed' if self.packing else 'padded'} rows of up to {self.seq_len}"
        ]
        if self.bad_records:
            lines.append(f"  {self.bad_records:,} bad records skipped, e.g. {self.bad_examples[0]}")
        if self.too_long:
            lines.append(f"  {self.too_long:,} samples longer than seq_len {self.seq_len} dropped")
        return "\n".join(lines)


@dataclass(slots=True)
class Rows:
    """Rows as flat int32 token arrays plus where each row starts: what the cache stores."""

    pieces: dict[str, list[np.ndarray]] = field(
        default_factory=lambda: {name: [] for name in _ARRAYS[:3]}
    )
    row_offsets: list[int] = field(default_factory=lambda: [0])
    tokens: int = 0

    def add_piece(self, input_ids: Sequence[int], labels: Sequence[int]) -> None:
        """One sample (or piece of one): positions from 0, its first token never a target."""
        labels = np.array(labels, dtype=np.int32)
        labels[0] = IGNORE_INDEX
        self.pieces["input_ids"].append(np.asarray(input_ids, dtype=np.int32))
        self.pieces["labels"].append(labels)
        self.pieces["position_ids"].append(np.arange(len(labels), dtype=np.int32))
        self.tokens += len(labels)

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


# ---------------------------------------------------------------------------- entry points
def prepare_cache(
    config: TrainConfig, cache_root: str | Path, *, out: TextIO | None = None
) -> Path:
    """Check and tokenize a train config's data on the launch node (the tokenizer is the model
    directory's); prints the summary. Errors here stop the run before any rank starts."""
    path = tokenize_to_cache(
        config.data,
        config.model,
        cache_root=cache_root,
        seq_len=config.seq_len,
        packing=config.packing,
        skip_bad_records=config.skip_bad_records,
    )
    print(load_cached(path).summary.render(), file=out or sys.stdout, flush=True)
    return path


def tokenize_to_cache(
    data: str | Path,
    tokenizer: str | Path | Any,
    *,
    cache_root: str | Path,
    seq_len: int,
    packing: bool = True,
    skip_bad_records: bool = False,
    wait_timeout_s: float = 1800.0,
) -> Path:
    """CACHE_ROOT/tokenized-<key>, built unless present. The key hashes the data's bytes, the
    tokenizer (vocab, rules, chat template), seq_len, packing, skip_bad_records and
    FORMAT_VERSION. One caller per cache root builds it (a lock file), into a temp directory
    renamed into place; the others wait for it, up to `wait_timeout_s`."""
    if seq_len < 2:
        raise TrainfleetError(f"seq_len {seq_len}", "use at least 2 (typically 2048)")
    data = Path(data)
    files = _input_files(data)
    tok = _load_tokenizer(tokenizer)
    key = _cache_key(data, files, tok, seq_len, packing, skip_bad_records)
    root = Path(cache_root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"tokenized-{key}"

    def build(tmp: Path) -> None:
        rows, summary = _tokenize(data, tok, seq_len, packing, skip_bad_records)
        _write(tmp, rows, summary)

    return _build_once(final, build, wait_timeout_s)


def load_cached(path: str | Path) -> TokenizedDataset:
    return TokenizedDataset(Path(path))


class TokenizedDataset:
    """A cache directory as a map-style dataset for HF Trainer (memory-mapped): row i ->
    input_ids, labels and, packed, position_ids, as int64 numpy arrays."""

    def __init__(self, path: Path) -> None:
        try:
            meta = json.loads((path / "meta.json").read_text())
        except (OSError, ValueError):
            raise TrainfleetError(
                f"{path}: not a tokenized data cache", "build it with tokenize_to_cache"
            ) from None
        if meta.get("format") != FORMAT_VERSION:
            raise TrainfleetError(
                f"{path}: cache format {meta.get('format')}, this trainfleet reads "
                f"{FORMAT_VERSION}",
                "run prepare_cache again (it writes a new cache beside this one)",
            )
        self.path = path
        summary = {**meta["summary"], "bad_examples": tuple(meta["summary"]["bad_examples"])}
        self.summary = DataSummary(**summary, path=str(path))
        self._arrays = {name: np.load(path / f"{name}.npy", mmap_mode="r") for name in _ARRAYS}

    def __len__(self) -> int:
        return len(self._arrays["row_offsets"]) - 1

    def __getitem__(self, index: int) -> dict[str, Any]:
        index = range(len(self))[index]
        start, end = self._arrays["row_offsets"][index : index + 2]
        names = _ARRAYS[:3] if self.summary.packing else _ARRAYS[:2]
        return {name: np.array(self._arrays[name][start:end], dtype=np.int64) for name in names}

    def row_lengths(self) -> Any:
        return np.diff(self._arrays["row_offsets"])

    def trained_tokens(self) -> int:
        return int((self._arrays["labels"] != IGNORE_INDEX).sum())


# ---------------------------------------------------------------------------- batches
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


# ---------------------------------------------------------------------------- reading
@dataclass(frozen=True, slots=True)
class _Unreadable:
    problem: str


def _input_files(data: Path) -> list[Path]:
    """The files whose bytes are the data (what the cache key hashes)."""
    accepted = (
        "pass a .jsonl or .parquet file, a directory of .jsonl files, or a directory written "
        "by `datasets`' save_to_disk"
    )
    if not data.exists():
        raise TrainfleetError(f"{data}: no such file or directory", accepted)
    if _input_kind(data) == "datasets":
        return sorted(path for path in data.rglob("*") if path.is_file())
    if data.is_dir():
        files = sorted(data.glob("*.jsonl"))
        if not files:
            raise TrainfleetError(f"{data}: no .jsonl files and no saved dataset in it", accepted)
        return files
    if _input_kind(data) is None:
        raise TrainfleetError(f"{data}: not .jsonl, .json or .parquet", accepted)
    return [data]


def _input_kind(data: Path) -> str | None:
    if data.is_dir():
        saved = (data / "state.json").is_file() or (data / "dataset_dict.json").is_file()
        return "datasets" if saved else "jsonl"
    return {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}.get(data.suffix.lower())


def _records(data: Path) -> Iterator[tuple[str, Any]]:
    """(where, record) in file order; `where` is `file:line` (JSONL) or `file row N`."""
    kind = _input_kind(data)
    if kind == "jsonl":
        for path in _input_files(data):
            with path.open("rb") as lines:
                for number, line in enumerate(lines, 1):
                    if line.strip():
                        yield f"{path}:{number}", _parse_json(line)
    elif kind == "parquet":
        import pyarrow.parquet as pq

        try:
            batches = pq.ParquetFile(data).iter_batches(batch_size=1024)
            row = 0
            for batch in batches:
                for record in batch.to_pylist():
                    yield f"{data} row {row}", record
                    row += 1
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            raise TrainfleetError(f"{data}: unreadable Parquet ({exc})", "") from None
    else:
        yield from _saved_dataset_records(data)


def _saved_dataset_records(data: Path) -> Iterator[tuple[str, Any]]:
    import datasets

    loaded = datasets.load_from_disk(str(data))
    if isinstance(loaded, datasets.DatasetDict):
        splits = list(loaded)
        if "train" not in loaded and len(splits) != 1:
            raise TrainfleetError(
                f"{data}: a DatasetDict with splits {', '.join(splits)} and no 'train'",
                "save the split to train on alone, or name it 'train'",
            )
        loaded = loaded["train" if "train" in loaded else splits[0]]
    row = 0
    for columns in loaded.iter(batch_size=1024):
        for values in zip(*columns.values(), strict=True):
            yield f"{data} row {row}", dict(zip(columns, values, strict=True))
            row += 1


def _parse_json(line: bytes) -> Any:
    try:
        return json.loads(line)
    except UnicodeDecodeError:
        return _Unreadable("not UTF-8")
    except ValueError as exc:
        return _Unreadable(f"not JSON ({exc})")


# ---------------------------------------------------------------------------- checking
def _shape_of(record: Any) -> str | None:
    if not isinstance(record, dict):
        return None
    if record.get("messages") is not None:
        return "messages"
    if record.get("prompt") is not None or record.get("completion") is not None:
        return "prompt_completion"
    return "text" if record.get("text") is not None else None


def _problem(record: Any, shape: str | None) -> str | None:
    """What is wrong with a record of this shape (None: nothing)."""
    if isinstance(record, _Unreadable):
        return record.problem
    if not isinstance(record, dict):
        return f"not a JSON object ({type(record).__name__})"
    if shape is None:
        return "none of the fields text, prompt+completion or messages"
    if shape == "messages":
        return _messages_problem(record.get("messages"))
    for name in ("text",) if shape == "text" else ("prompt", "completion"):
        value = record.get(name)
        if value is None:
            return f"missing field {name!r}"
        if not isinstance(value, str):
            return f"field {name!r} is {type(value).__name__}, not a string"
        if not value.strip():
            return f"field {name!r} is empty"
    return None


def _messages_problem(messages: Any) -> str | None:
    if messages is None:
        return "missing field 'messages'"
    if not isinstance(messages, list):
        return f"field 'messages' is {type(messages).__name__}, not a list"
    if not messages:
        return "field 'messages' is empty"
    for i, message in enumerate(messages):
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            return f"messages[{i}] is not an object with 'role' and 'content' strings"
    if not any(m["role"] == "assistant" and m["content"].strip() for m in messages):
        return "no assistant message with content: nothing to train on"
    return None


# ---------------------------------------------------------------------------- tokenizing
def _load_tokenizer(tokenizer: str | Path | Any) -> Any:
    if isinstance(tokenizer, (str, Path)):
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise TrainfleetError(
                f"{tokenizer}: no tokenizer loads from it ({exc})",
                "pass the model directory holding tokenizer.json and tokenizer_config.json",
            ) from None
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    if not tokenizer.is_fast:
        raise TrainfleetError(
            f"{name}: a slow (Python) tokenizer: masks need a fast tokenizer's offsets",
            "use a model directory with tokenizer.json",
        )
    if tokenizer.eos_token_id is None:
        raise TrainfleetError(f"{name}: the tokenizer has no eos_token", "set eos_token in "
                              "tokenizer_config.json")  # fmt: skip
    return tokenizer


def _cache_key(
    data: Path, files: list[Path], tok: Any, seq_len: int, packing: bool, skip: bool
) -> str:
    digest = hashlib.sha256()
    template = tok.chat_template if tok.chat_template is not None else ""
    settings = {
        "format": FORMAT_VERSION,
        "seq_len": seq_len,
        "packing": packing,
        "skip_bad_records": skip,
        "tokenizer_class": type(tok).__name__,
        "tokenizer": tok.backend_tokenizer.to_str(),  # vocab, merges, normalizer, added tokens
        "special_tokens": tok.special_tokens_map,
        "chat_template": template,
    }
    digest.update(json.dumps(settings, sort_keys=True).encode())
    for path in files:
        name = path.relative_to(data).as_posix() if data.is_dir() else ""
        digest.update(f"\0{name}\0{path.stat().st_size}\0".encode())
        with path.open("rb") as content:
            while chunk := content.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()[:20]


@dataclass(slots=True)
class _Tally:
    records: int = 0
    bad: int = 0
    bad_examples: list[str] = field(default_factory=list)
    """The first three."""
    too_long: int = 0
    shortest_too_long: tuple[int, int] | None = None
    """(tokens, untrained tokens before the first trained one) of the shortest dropped sample."""
    samples: int = 0


class _Encoder:
    """Checked records of one shape -> samples (input_ids, labels)."""

    def __init__(self, tok: Any, shape: str | None, first_where: str) -> None:
        self.tok, self.shape = tok, shape
        self.template = ""
        if shape == "messages":
            if not tok.chat_template:
                raise DataError(
                    first_where,
                    "messages records, and the tokenizer has no chat template",
                    "use a tokenizer with a chat_template, or write text or prompt/completion "
                    "records",
                )
            self.template = tok.get_chat_template()

    def encode(self, records: list[tuple[str, dict]]) -> list[Sample | str]:
        """A sample or, for a record that tokenizes to nothing to train on, the problem."""
        if self.shape == "messages":
            encoded = [self._messages(where, record["messages"]) for where, record in records]
        else:
            texts, starts = [], []
            for _, record in records:
                prompt = record["prompt"] if self.shape == "prompt_completion" else ""
                texts.append(prompt + record["completion"] if prompt else record["text"])
                starts.append(len(prompt))
            batch = self.tok(texts, add_special_tokens=True, return_offsets_mapping=True)
            encoded = [
                (ids, _trained(offsets, [(start, len(text))]), True)
                for ids, offsets, start, text in zip(
                    batch["input_ids"], batch["offset_mapping"], starts, texts, strict=True
                )
            ]
        return [sample if isinstance(sample, str) else self._finish(*sample) for sample in encoded]

    def _finish(self, ids: list[int], trained: Any, eos_trained: bool) -> Sample | str:
        ids, trained = np.asarray(ids, dtype=np.int32), np.asarray(trained, dtype=bool)
        if not len(ids) or ids[-1] != self.tok.eos_token_id:
            ids = np.append(ids, np.int32(self.tok.eos_token_id))
            trained = np.append(trained, eos_trained)
        if not trained[1:].any():
            return "no token to train on after tokenizing"
        return ids, np.where(trained, ids, IGNORE_INDEX).astype(np.int32)

    def _messages(self, where: str, messages: list[dict]) -> tuple[list[int], Any, bool] | str:
        import jinja2

        try:
            return self._messages_masked(where, messages)
        except jinja2.TemplateError as exc:  # the template's raise_exception: roles out of order
            return f"the chat template refuses it: {exc}"

    def _messages_masked(self, where: str, messages: list[dict]) -> tuple[list[int], Any, bool]:
        eos_trained = messages[-1]["role"] == "assistant"
        if _GENERATION_TAG.search(self.template):
            out = self.tok.apply_chat_template(
                messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
            )
            return out["input_ids"], out["assistant_masks"], eos_trained
        full = self._render(messages, add_generation_prompt=False)
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = self._render(messages[:i], add_generation_prompt=True)
            through = self._render(messages[: i + 1], add_generation_prompt=False)
            if not (full.startswith(through) and through.startswith(before)):
                raise DataError(
                    where,
                    f"the chat template renders the conversation before assistant turn {i} "
                    "differently once later turns follow, so its tokens cannot be located",
                    "use a template that marks assistant text with {% generation %}...{% "
                    "endgeneration %} (TRL ships such training templates for common models)",
                )
            spans.append((len(before), len(through)))
        batch = self.tok(full, add_special_tokens=False, return_offsets_mapping=True)
        return batch["input_ids"], _trained(batch["offset_mapping"], spans), eos_trained

    def _render(self, messages: list[dict], *, add_generation_prompt: bool) -> str:
        return self.tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )


def _trained(offsets: Sequence[tuple[int, int]], spans: list[tuple[int, int]]) -> np.ndarray:
    """Tokens with a character inside a span (special tokens added outside the text have none)."""
    bounds = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    starts, ends = bounds[:, 0], bounds[:, 1]
    inside = np.zeros(len(bounds), dtype=bool)
    for first, end in spans:
        inside |= (starts < end) & (ends > first)
    return inside & (ends > starts)


def _samples(
    data: Path, tok: Any, seq_len: int, shape: str | None, split: bool, skip: bool, tally: _Tally
) -> Iterator[Sample]:
    encoder: _Encoder | None = None
    pending: list[tuple[str, dict]] = []

    def flush() -> Iterator[Sample]:
        for (where, _), sample in zip(pending, encoder.encode(pending), strict=True):
            if isinstance(sample, str):
                _bad(tally, where, sample, shape, skip)
            elif len(sample[0]) > seq_len and not split:
                tally.too_long += 1
                first_trained = int(np.argmax(sample[1] != IGNORE_INDEX))
                tally.shortest_too_long = min(
                    tally.shortest_too_long or (sys.maxsize, 0), (len(sample[0]), first_trained)
                )
            else:
                tally.samples += 1
                yield sample
        pending.clear()

    for where, record in _records(data):
        tally.records += 1
        encoder = encoder or _Encoder(tok, shape, where)
        problem = _problem(record, shape)
        if problem:
            _bad(tally, where, problem, shape, skip)
            continue
        pending.append((where, record))
        if len(pending) == _ENCODE_BATCH:
            yield from flush()
    if pending:
        yield from flush()


def _bad(tally: _Tally, where: str, problem: str, shape: str | None, skip: bool) -> None:
    if not skip:
        example = f"write records like {_EXAMPLES[shape]}" if shape else "write JSON objects"
        raise DataError(
            where,
            problem,
            f"{example}; or set skip_bad_records: true to skip and count bad records",
        )
    tally.bad += 1
    if len(tally.bad_examples) < 3:
        tally.bad_examples.append(f"{where}: {problem}")


def _tokenize(
    data: Path, tok: Any, seq_len: int, packing: bool, skip: bool
) -> tuple[Rows, DataSummary]:
    shape = next((s for _, record in _records(data) if (s := _shape_of(record))), None)
    split = shape == "text"
    tally = _Tally()
    rows = pack(
        _samples(data, tok, seq_len, shape, split, skip, tally),
        seq_len=seq_len,
        packing=packing,
        split=split,
    )
    fix = "check the file; JSONL holds one JSON object per line"
    if tally.records == 0:
        raise DataError(str(data), "no records: the dataset is empty", fix)
    if tally.bad == tally.records:
        example = tally.bad_examples[0]
        raise DataError(str(data), f"all {tally.records} records are bad, e.g. {example}", fix)
    if tally.samples == 0:
        tokens, prompt = tally.shortest_too_long or (0, 0)
        before = f" ({prompt} before the first trained token)" if prompt >= seq_len else ""
        raise DataError(
            str(data),
            f"seq_len {seq_len} is shorter than every sample: the shortest is {tokens} "
            f"tokens{before}",
            f"raise seq_len to at least {tokens}, or shorten the records",
        )
    summary = DataSummary(
        shape=shape or "",
        packing=packing,
        seq_len=seq_len,
        records=tally.records,
        bad_records=tally.bad,
        bad_examples=tuple(tally.bad_examples),
        too_long=tally.too_long,
        samples=tally.samples,
        tokens=rows.tokens,
        trained_tokens=sum(int((labels != IGNORE_INDEX).sum()) for labels in rows.pieces["labels"]),
        rows=len(rows),
    )
    return rows, summary


# ---------------------------------------------------------------------------- the cache
def _write(directory: Path, rows: Rows, summary: DataSummary) -> None:
    for name, values in rows.arrays().items():
        with _synced(directory / f"{name}.npy") as out:
            np.save(out, values)
    meta = {"format": FORMAT_VERSION, "summary": dataclasses.asdict(summary)}
    del meta["summary"]["path"]
    with _synced(directory / "meta.json") as out:
        out.write(json.dumps(meta, indent=1, sort_keys=True).encode() + b"\n")


@contextmanager
def _synced(path: Path) -> Iterator[BinaryIO]:
    """A file that is on disk when the block ends: before a rename makes it visible."""
    with path.open("wb") as out:
        yield out
        out.flush()
        os.fsync(out.fileno())


def _build_once(final: Path, build: Callable[[Path], None], timeout_s: float) -> Path:
    """`final`, built by `build(tmp)` by whichever caller takes the lock; the others wait. A
    directory appears complete or not at all (rename); a lock left by a dead process on this
    host is taken over. At worst two builders race (a stale lock taken twice): the first
    rename wins and the other's identical copy is discarded."""
    lock = final.with_name(final.name + ".lock")
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while not final.is_dir():
        if _take_lock(lock):
            try:
                if not final.is_dir():
                    _build_atomically(final, build)
            finally:
                lock.unlink(missing_ok=True)
            break
        if time.monotonic() > deadline:
            raise TrainfleetError(
                f"{final}: still being written by {_lock_holder(lock)} after {timeout_s:.0f}s",
                f"if that process is gone, delete {lock} and run again; a large dataset may "
                "need a longer wait",
            )
        time.sleep(delay)
        delay = min(delay * 2, 1.0)
    return final


def _build_atomically(final: Path, build: Callable[[Path], None]) -> None:
    tmp = final.with_name(f".{final.name}.tmp-{socket.gethostname()}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        build(tmp)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if not final.is_dir():  # else another builder renamed its identical copy first
            raise


def _take_lock(lock: Path) -> bool:
    try:
        handle = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        host, _, pid = _lock_holder(lock).partition(" pid ")
        if host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid)):
            lock.unlink(missing_ok=True)
        return False
    with os.fdopen(handle, "w") as out:
        out.write(f"{socket.gethostname()} pid {os.getpid()}\n")
    return True


def _lock_holder(lock: Path) -> str:
    try:
        return lock.read_text().strip() or "another process"
    except OSError:
        return "another process"
