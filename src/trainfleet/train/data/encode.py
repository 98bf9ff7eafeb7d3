"""Records -> samples: the tokenizer (a fast one, for its offsets, with an EOS), the tokens of
each record shape and which of them are trained; a record that tokenizes to nothing to train on
is an error, or skipped and counted.

    >>> from trainfleet.train.data.encode import _trained
    >>> # "2+2=4" after prompt "2+2=": BOS (no characters), "2", "+2", "=4" across the boundary
    >>> _trained([(0, 0), (0, 1), (1, 3), (3, 5)], [(4, 5)]).tolist()
    [False, False, False, True]

EOS ends every sample. A token is trained when one of its characters lies in a trained span
(tokenizer offsets), so tokens that merge across the prompt/completion boundary count as
completion. Chat templates with `{% generation %}` go through transformers'
`apply_chat_template(..., return_assistant_tokens_mask=True)`; without it, each assistant
turn's span is the text between the conversation rendered up to it with
`add_generation_prompt=True` and rendered through it, which needs a template that renders
earlier turns the same whatever follows.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainfleet.errors import TrainfleetError
from trainfleet.train.data.records import _EXAMPLES, DataError, _problem, _records

IGNORE_INDEX = -100
"""The label the loss skips (transformers' `ignore_index`)."""
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
_ENCODE_BATCH = 256

TokenIds = Sequence[int] | np.ndarray
"""Token ids: the encoder's are int32 arrays; `pack` takes lists too."""
Sample = tuple[TokenIds, TokenIds]
"""(input_ids, labels) of one sample, labels IGNORE_INDEX where there is no loss."""


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

    def _finish(self, token_ids: list[int], trained_mask: Any, eos_trained: bool) -> Sample | str:
        ids, trained = np.asarray(token_ids, dtype=np.int32), np.asarray(trained_mask, dtype=bool)
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

    def flush(encoder: _Encoder) -> Iterator[Sample]:
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
            yield from flush(encoder)
    if pending and encoder is not None:  # a pending record made the encoder
        yield from flush(encoder)


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
