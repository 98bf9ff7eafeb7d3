"""Reading the data: the input files (a JSONL or Parquet file, a directory of JSONL files, a
directory written by `datasets`' save_to_disk), their records in file order with where each came
from, a record's shape, and what is wrong with a record. `DataError` lives here, where every
other data module imports it from.

    >>> from trainfleet.train.data.records import _problem, _shape_of
    >>> _shape_of({"prompt": "2+2=", "completion": "4"})
    'prompt_completion'
    >>> _problem({"prompt": "2+2=", "completion": 4}, "prompt_completion")
    "field 'completion' is int, not a string"

Records (the shape is detected from the first valid one, then required of every one): `text`
(loss on every token), `prompt` + `completion` (loss on the completion), `messages` (rendered
with the tokenizer's chat template, loss on the assistant turns).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainfleet.errors import TrainfleetError

_EXAMPLES = {
    "text": '{"text": "..."}',
    "prompt_completion": '{"prompt": "...", "completion": "..."}',
    "messages": '{"messages": [{"role": "user", "content": "..."}, '
    '{"role": "assistant", "content": "..."}]}',
}


class DataError(TrainfleetError):
    """A record, or a whole dataset, that cannot be trained on."""

    def __init__(self, where: str, problem: str, fix: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(f"{where}: {problem}", fix)


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
