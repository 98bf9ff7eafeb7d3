"""The tokenized data cache: `tokenize_to_cache` checks, tokenizes and packs a dataset once
per key into CACHE_ROOT/tokenized-<key> with its `DataSummary`; `prepare_cache` does it for a
train config on the launch node; every rank opens it with `load_cached`, a memory-mapped
`TokenizedDataset`.

    >>> import tempfile
    >>> from pathlib import Path
    >>> from trainfleet.train.data import DataSummary, load_cached, pack
    >>> from trainfleet.train.data.cache import _write
    >>> rows = pack([([1, 2, 3], [1, 2, 3])], seq_len=4, packing=True, split=True)
    >>> summary = DataSummary(shape="text", packing=True, seq_len=4, records=1, bad_records=0,
    ...     bad_examples=(), too_long=0, samples=1, tokens=3, trained_tokens=2, rows=1)
    >>> with tempfile.TemporaryDirectory() as cache:
    ...     _write(Path(cache), rows, summary)
    ...     print(load_cached(cache).summary.render())
    ...     print({name: value.tolist() for name, value in load_cached(cache)[0].items()})
    data: 1 text records -> 1 samples, 3 tokens (2 trained) in 1 packed rows of up to 4
    {'input_ids': [1, 2, 3], 'labels': [-100, 2, 3], 'position_ids': [0, 1, 2]}
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from trainfleet.errors import TrainfleetError
from trainfleet.train.data.build_once import _build_once, _synced
from trainfleet.train.data.encode import IGNORE_INDEX, _load_tokenizer, _samples, _Tally
from trainfleet.train.data.packing import _ARRAYS, Rows, pack
from trainfleet.train.data.records import DataError, _input_files, _records, _shape_of

if TYPE_CHECKING:
    from trainfleet.train.config import TrainConfig

FORMAT_VERSION = 1
"""Bumped whenever the cache's content or layout changes: part of the cache key."""


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


def _write(directory: Path, rows: Rows, summary: DataSummary) -> None:
    for name, values in rows.arrays().items():
        with _synced(directory / f"{name}.npy") as out:
            np.save(out, values)
    fields = dataclasses.asdict(summary)
    del fields["path"]
    meta = {"format": FORMAT_VERSION, "summary": fields}
    with _synced(directory / "meta.json") as out:
        out.write(json.dumps(meta, indent=1, sort_keys=True).encode() + b"\n")
