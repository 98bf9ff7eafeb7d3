"""The training data pipeline: three record shapes from JSONL, Parquet and a saved dataset; exact
loss masks; bad records named by file and line; the cache (hit, key, racing processes, same
bytes); packing that a tiny Llama cannot see through (logits of a packed sample equal its
logits alone)."""

from __future__ import annotations

import doctest
import json
import multiprocessing
import shutil
import socket
import time
from pathlib import Path

import pytest

transformers = pytest.importorskip(
    "transformers", reason="the train extra: pip install transformers"
)
datasets = pytest.importorskip("datasets", reason="the train extra: pip install datasets")

from trainfleet.errors import TrainfleetError  # noqa: E402
from trainfleet.train import data  # noqa: E402
from trainfleet.train.data import IGNORE_INDEX, DataError  # noqa: E402

pytestmark = pytest.mark.unit

SPECIALS = ["<unk>", "<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The same rendering with assistant text marked; the newline after <|im_end|> left outside
# (printed as '\n': transformers renders with trim_blocks, which eats a newline after a tag).
CHATML_GENERATION = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}<|im_end|>{% endgeneration %}"
    "{% else %}{{ m.content }}<|im_end|>{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Earlier assistant turns shrink once another follows (as templates that drop past reasoning do).
CHATML_DROPS_HISTORY = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and not loop.last %}...{% else %}{{ m.content }}{% endif %}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEXT = [{"text": "the cat sat"}, {"text": "a dog"}, {"text": "hello world!"}]
PROMPT_COMPLETION = [
    {"prompt": "Q: 2+2? A: ", "completion": "4"},
    {"prompt": "Q: name? A: ", "completion": "Bob"},
]
MESSAGES = [
    {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "ab"},
        ]
    },
    {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": "ok"},
        ]
    },
]


def make_tokenizer(chat_template: str = CHATML, extra_chars: str = ""):
    """Characters as tokens, BOS added like Llama's tokenizer, ChatML markers as specials."""
    from tokenizers import Tokenizer, models, processors

    chars = [chr(c) for c in range(32, 127)] + ["\n"] + list(extra_chars)
    vocab = {token: i for i, token in enumerate(SPECIALS + chars)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.add_special_tokens(SPECIALS)
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", vocab["<s>"])]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        chat_template=chat_template,
    )


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer")
    make_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    return transformers.AutoTokenizer.from_pretrained(tokenizer_dir)


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def write(tmp_path: Path, fmt: str, records: list[dict]) -> Path:
    if fmt == "jsonl":
        path = tmp_path / "data.jsonl"
        path.write_text("".join(json.dumps(record) + "\n" for record in records))
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = tmp_path / "data.parquet"
        pq.write_table(pa.Table.from_pylist(records), path)
    else:
        path = tmp_path / "saved"
        datasets.Dataset.from_list(records).save_to_disk(str(path))
    return path


def build(tmp_path, records_or_path, tokenizer, fmt="jsonl", **kwargs):
    path = records_or_path
    if isinstance(records_or_path, list):
        path = write(tmp_path, fmt, records_or_path)
    kwargs = {"seq_len": 64, "packing": False, **kwargs}
    cache = data.tokenize_to_cache(path, tokenizer, cache_root=tmp_path / "cache", **kwargs)
    return data.load_cached(cache)


def expected(tok, untrained: str, trained: str):
    """(input_ids, labels): BOS, `untrained` then `trained` text, then a trained EOS."""
    head, tail = [tok.bos_token_id, *ids(tok, untrained)], ids(tok, trained)
    input_ids = head + tail + [tok.eos_token_id]
    labels = [IGNORE_INDEX] * len(head) + tail + [tok.eos_token_id]
    return input_ids, labels


def rows(dataset) -> list[tuple[list[int], list[int]]]:
    items = [dataset[i] for i in range(len(dataset))]
    return [(item["input_ids"].tolist(), item["labels"].tolist()) for item in items]


# ---------------------------------------------------------------------------- shapes and masks
def test_module_example_runs():
    result = doctest.testmod(data, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "saved"])
def test_text_trains_every_token(tmp_path, tokenizer_dir, tok, fmt):
    dataset = build(tmp_path, TEXT, tokenizer_dir, fmt)
    assert dataset.summary.shape == "text"
    assert rows(dataset) == [expected(tok, "", r["text"]) for r in TEXT]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "saved"])
def test_prompt_completion_trains_the_completion_only(tmp_path, tokenizer_dir, tok, fmt):
    dataset = build(tmp_path, PROMPT_COMPLETION, tokenizer_dir, fmt)
    assert dataset.summary.shape == "prompt_completion"
    assert rows(dataset) == [expected(tok, r["prompt"], r["completion"]) for r in PROMPT_COMPLETION]


CHAT_ROWS_BY_PREFIX = [
    # rendered prefix by prefix: an assistant turn is everything the template adds after the
    # generation prompt, the newline after <|im_end|> included
    [
        ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", False),
        ("yo<|im_end|>\n", True),
        ("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n", False),
        ("ab<|im_end|>\n", True),
    ],
    [
        (
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nx<|im_end|>\n"
            "<|im_start|>assistant\n",
            False,
        ),
        ("ok<|im_end|>\n", True),
    ],
]


def chat_expected(tok, pieces):
    input_ids, labels = [], []
    for text, trained in pieces:
        piece = ids(tok, text)
        input_ids += piece
        labels += piece if trained else [IGNORE_INDEX] * len(piece)
    labels[0] = IGNORE_INDEX
    return input_ids + [tok.eos_token_id], labels + [tok.eos_token_id]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "saved"])
def test_messages_without_generation_tags_train_assistant_turns(tmp_path, tokenizer_dir, tok, fmt):
    dataset = build(tmp_path, MESSAGES, tokenizer_dir, fmt)
    assert dataset.summary.shape == "messages"
    assert rows(dataset) == [chat_expected(tok, pieces) for pieces in CHAT_ROWS_BY_PREFIX]


def test_messages_with_generation_tags_use_transformers_assistant_mask(tmp_path):
    tok = make_tokenizer(CHATML_GENERATION)
    dataset = build(tmp_path, MESSAGES, tok)
    # the template marks content + <|im_end|>: the newline after it is not trained
    pieces = [
        [("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", False),
         ("yo<|im_end|>", True),
         ("\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n", False),
         ("ab<|im_end|>", True), ("\n", False)],
        [("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nx<|im_end|>\n"
          "<|im_start|>assistant\n", False), ("ok<|im_end|>", True), ("\n", False)],
    ]  # fmt: skip
    assert rows(dataset) == [chat_expected(tok, p) for p in pieces]


def test_template_that_rewrites_history_needs_generation_tags(tmp_path):
    with pytest.raises(DataError, match=r"data.jsonl:1: .*assistant turn 1.*") as caught:
        build(tmp_path, MESSAGES, make_tokenizer(CHATML_DROPS_HISTORY))
    assert "{% generation %}" in caught.value.fix


def test_messages_need_a_chat_template(tmp_path):
    with pytest.raises(DataError, match="no chat template"):
        build(tmp_path, MESSAGES, make_tokenizer(chat_template=None))


# ---------------------------------------------------------------------------- bad records
@pytest.mark.parametrize(
    "lines, line, problem",
    [
        (['{"text": "ok"}', "", "{not json"], 3, "not JSON"),
        (['{"prompt": "p", "completion": "c"}', '{"prompt": "p"}'], 2,
         "missing field 'completion'"),
        (['{"text": "ok"}', '{"text": 5}'], 2, "field 'text' is int, not a string"),
        (['{"text": "ok"}', '{"text": "  "}'], 2, "field 'text' is empty"),
        (['{"text": "ok"}', "[1, 2]"], 2, "not a JSON object (list)"),
        (['{"body": "ok"}'], 1, "none of the fields text, prompt+completion"),
        (['{"messages": [{"role": "user", "content": "hi"}]}'], 1, "no assistant message"),
        (['{"messages": [{"role": "user"}]}'], 1, "messages[0] is not an object"),
        (['{"messages": {"role": "user"}}'], 1, "field 'messages' is dict, not a list"),
    ],
)  # fmt: skip
def test_bad_record_is_named_by_file_and_line(tmp_path, tokenizer_dir, lines, line, problem):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as caught:
        build(tmp_path, path, tokenizer_dir)
    assert caught.value.where == f"{path}:{line}"
    assert problem in caught.value.problem
    assert "skip_bad_records" in caught.value.fix


def test_a_directory_of_jsonl_files_reads_in_name_order(tmp_path, tokenizer_dir, tok):
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / "b.jsonl").write_text(json.dumps(TEXT[1]) + "\n" + json.dumps(TEXT[2]) + "\n")
    (folder / "a.jsonl").write_text(json.dumps(TEXT[0]) + "\n")
    assert rows(build(tmp_path, folder, tokenizer_dir)) == [
        expected(tok, "", r["text"]) for r in TEXT
    ]
    (folder / "b.jsonl").write_text(json.dumps(TEXT[1]) + "\n{}\n")
    with pytest.raises(DataError, match=r"shards/b.jsonl:2: missing field .text."):
        build(tmp_path, folder, tokenizer_dir)


def test_a_saved_dataset_dict_trains_on_its_train_split(tmp_path, tokenizer_dir):
    splits = {
        "train": datasets.Dataset.from_list(TEXT),
        "test": datasets.Dataset.from_list(TEXT[:1]),
    }
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "saved"))
    assert build(tmp_path, tmp_path / "saved", tokenizer_dir).summary.samples == 3


def test_bad_parquet_row_is_named_by_index(tmp_path, tokenizer_dir):
    records = [*PROMPT_COMPLETION, {"prompt": "p", "completion": None}]
    with pytest.raises(DataError, match=r"data.parquet row 2: missing field 'completion'"):
        build(tmp_path, records, tokenizer_dir, "parquet")


def test_skip_bad_records_skips_and_counts(tmp_path, tokenizer_dir):
    path = tmp_path / "data.jsonl"
    good = [json.dumps(r) for r in TEXT]
    path.write_text("\n".join(["oops", good[0], '{"text": ""}', good[1], good[2]]) + "\n")
    dataset = build(tmp_path, path, tokenizer_dir, skip_bad_records=True)
    summary = dataset.summary
    assert (summary.records, summary.bad_records, summary.samples) == (5, 2, 3)
    assert summary.bad_examples[0].startswith(f"{path}:1: not JSON")
    assert summary.bad_examples[1] == f"{path}:3: field 'text' is empty"
    assert "2 bad records skipped" in summary.render()


def test_empty_dataset_is_an_error(tmp_path, tokenizer_dir):
    path = tmp_path / "data.jsonl"
    path.write_text("\n\n")
    with pytest.raises(DataError, match="no records"):
        build(tmp_path, path, tokenizer_dir)


def test_every_record_bad_is_an_error_even_when_skipping(tmp_path, tokenizer_dir):
    path = tmp_path / "data.jsonl"
    path.write_text("nope\n[]\n")
    with pytest.raises(DataError, match="all 2 records are bad, e.g. .*:1: not JSON"):
        build(tmp_path, path, tokenizer_dir, skip_bad_records=True)


@pytest.mark.parametrize("packing", [True, False])
def test_seq_len_shorter_than_every_prompt_is_an_error(tmp_path, tokenizer_dir, packing):
    # "Q: 2+2? A: " is 11 characters + BOS: no completion token would fit in 10
    with pytest.raises(DataError, match=r"seq_len 10 is shorter than every sample: the shortest"
                       r" is 14 tokens \(12 before the first trained token\)"):  # fmt: skip
        build(tmp_path, PROMPT_COMPLETION, tokenizer_dir, seq_len=10, packing=packing)


def test_samples_longer_than_seq_len_are_dropped_and_counted(tmp_path, tokenizer_dir):
    records = [*PROMPT_COMPLETION, {"prompt": "long " * 10, "completion": "x"}]
    dataset = build(tmp_path, records, tokenizer_dir, seq_len=20)
    assert (dataset.summary.samples, dataset.summary.too_long) == (2, 1)
    assert "1 samples longer than seq_len 20 dropped" in dataset.summary.render()


def test_long_text_is_split_not_dropped(tmp_path, tokenizer_dir, tok):
    dataset = build(tmp_path, [{"text": "abcdefghij"}], tokenizer_dir, seq_len=4)
    whole, _ = expected(tok, "", "abcdefghij")
    assert [r[0] for r in rows(dataset)] == [whole[0:4], whole[4:8], whole[8:12]]
    assert all(r[1][0] == IGNORE_INDEX for r in rows(dataset))


# ---------------------------------------------------------------------------- packing
def test_packed_text_rows_are_exactly_seq_len(tmp_path, tokenizer_dir, tok):
    dataset = build(tmp_path, TEXT, tokenizer_dir, seq_len=8, packing=True)
    stream = [token for r in TEXT for token in expected(tok, "", r["text"])[0]]
    lengths = dataset.row_lengths().tolist()
    assert lengths[:-1] == [8] * (len(lengths) - 1) and 0 < lengths[-1] <= 8
    row = dataset[0]
    assert row["input_ids"].tolist() == stream[:8]
    # "the cat sat" is 13 tokens with BOS and EOS: the second row starts inside it, at 0
    assert row["position_ids"].tolist() == list(range(8))
    assert dataset[1]["position_ids"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert dataset[1]["labels"].tolist()[0] == IGNORE_INDEX
    assert dataset[1]["labels"].tolist()[5] == IGNORE_INDEX  # "a dog" starts: no target


def test_packed_sft_keeps_samples_whole(tmp_path, tokenizer_dir):
    records = [{"prompt": "p" * n, "completion": "c"} for n in (10, 3, 6, 2, 12)]
    dataset = build(tmp_path, records, tokenizer_dir, seq_len=16, packing=True)
    lengths = sorted(n + 3 for n in (10, 3, 6, 2, 12))  # BOS, completion, EOS
    segments = []
    for i in range(len(dataset)):
        positions = dataset[i]["position_ids"].tolist()
        starts = [j for j, p in enumerate(positions) if p == 0] + [len(positions)]
        segments += [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert sorted(segments) == lengths  # no sample cut
    assert dataset.row_lengths().tolist() == [15, 13, 15, 5]  # best fit decreasing: 9+6 share
    assert dataset.summary.samples == 5


# ---------------------------------------------------------------------------- no leakage
def tiny_llama(vocab_size: int, attn_implementation: str):
    import torch

    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(
        "llama",
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation=attn_implementation, dtype=torch.float32
    )
    return model.eval()


@pytest.mark.parametrize(
    "attn_implementation, flatten", [("sdpa", False), ("eager", False), ("sdpa", True)]
)
@pytest.mark.parametrize("records", [TEXT * 3, PROMPT_COMPLETION * 3], ids=["text", "sft"])
def test_a_packed_sample_sees_nothing_of_its_neighbours(
    tmp_path, tokenizer_dir, tok, attn_implementation, flatten, records
):
    import torch

    dataset = build(tmp_path, records, tokenizer_dir, seq_len=32, packing=True)
    collate = data.Collator(packed=True, pad_token_id=tok.pad_token_id, flatten=flatten)
    batch = collate([dataset[i] for i in range(len(dataset))])
    assert "attention_mask" not in batch
    model = tiny_llama(len(tok), attn_implementation)
    with torch.no_grad():  # use_cache=False as Trainer runs it: a KV cache turns packing off
        packed = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False)
        unaware = model(input_ids=batch["input_ids"], use_cache=False)
    checked = leaked = 0
    for row, positions in enumerate(batch["position_ids"]):
        starts = (positions == 0).nonzero().flatten().tolist() + [len(positions)]
        for start, end in zip(starts, starts[1:], strict=False):
            alone = model(input_ids=batch["input_ids"][row : row + 1, start:end], use_cache=False)
            torch.testing.assert_close(
                packed.logits[row, start:end], alone.logits[0], rtol=0, atol=1e-5
            )
            assert batch["labels"][row, start] == IGNORE_INDEX
            checked += 1
            if start > 0:
                leaked += not torch.allclose(unaware.logits[row, start:end], alone.logits[0])
    assert checked >= dataset.summary.samples  # every sample was compared (pieces, pads too)
    assert leaked  # the check can fail: without position_ids the same rows do leak


def test_collator_refuses_attention_that_ignores_packing():
    with pytest.raises(TrainfleetError, match="not known to keep packed samples apart"):
        data.collator(packing=True, attn_implementation="paged|sdpa")
    assert data.collator(packing=True, attn_implementation="flash_attention_2").flatten
    assert not data.collator(packing=False, attn_implementation="paged|sdpa").packed


def test_padded_batches_mask_padding(tmp_path, tokenizer_dir, tok):
    dataset = build(tmp_path, TEXT, tokenizer_dir, packing=False)
    lengths = dataset.row_lengths().tolist()
    for pad_to, width in [(None, max(lengths)), (20, 20)]:
        collate = data.collator(packing=False, pad_token_id=tok.pad_token_id, pad_to=pad_to)
        batch = collate([dataset[i] for i in range(len(dataset))])
        assert set(batch) == {"input_ids", "labels", "attention_mask"}
        assert batch["attention_mask"].sum(1).tolist() == lengths
        assert batch["input_ids"].shape == (3, width)
        assert (batch["labels"][batch["attention_mask"] == 0] == IGNORE_INDEX).all()
        assert (batch["input_ids"][batch["attention_mask"] == 0] == tok.pad_token_id).all()


def test_measure_padding_packed_vs_padded(tmp_path, tokenizer_dir):
    records = [{"text": "x" * n} for n in (2, 30, 5, 17, 9, 1)]  # 2 special tokens each
    path = write(tmp_path, "jsonl", records)
    packed, padded = (
        data.measure_padding(
            build(tmp_path, path, tokenizer_dir, seq_len=16, packing=packing),
            batch_size=3,
            shuffle_seed=None,
        )
        for packing in (True, False)
    )
    assert packed.real == padded.real == 76
    assert packed.padding == 4  # rows 16 16 16 | 16 12: only the last, shorter row pads
    assert padded.padding == 42  # rows 4 16 16 | 7 16 3 | 11 3 (long texts cut at 16)
    # the first token of every piece is no target: 6 samples + 4 cut by a row end; + 2 cut at 16
    assert (packed.trained, padded.trained) == (76 - 10, 76 - 8)


# ---------------------------------------------------------------------------- the cache
def cache_bytes(path: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(path.iterdir())}


def test_cache_hit_does_not_tokenize_again(tmp_path, tokenizer_dir, monkeypatch):
    path = write(tmp_path, "jsonl", MESSAGES)
    first = data.tokenize_to_cache(path, tokenizer_dir, cache_root=tmp_path / "c", seq_len=64)
    before = cache_bytes(first)

    def tokenize_again(*args):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(data.cache, "_tokenize", tokenize_again)
    again = data.tokenize_to_cache(path, tokenizer_dir, cache_root=tmp_path / "c", seq_len=64)
    assert again == first and cache_bytes(again) == before
    assert first.name.startswith("tokenized-")


def test_same_input_gives_the_same_bytes(tmp_path, tokenizer_dir):
    path = write(tmp_path, "jsonl", PROMPT_COMPLETION * 20)
    one = data.tokenize_to_cache(path, tokenizer_dir, cache_root=tmp_path / "a", seq_len=32)
    two = data.tokenize_to_cache(path, tokenizer_dir, cache_root=tmp_path / "b", seq_len=32)
    assert one.name == two.name and cache_bytes(one) == cache_bytes(two)


def test_cache_key_follows_seq_len_tokenizer_template_and_data(tmp_path, tokenizer_dir):
    path = write(tmp_path, "jsonl", MESSAGES)

    def key(data_path=path, tokenizer=tokenizer_dir, **kwargs):
        kwargs = {"seq_len": 64, **kwargs}
        return data.tokenize_to_cache(
            data_path, tokenizer, cache_root=tmp_path / "c", **kwargs
        ).name

    base = key()
    other_data = tmp_path / "other.jsonl"
    other_data.write_text(path.read_text().replace("yo", "hey"))
    variants = {
        "seq_len": key(seq_len=65),
        "packing": key(packing=False),
        "vocab": key(tokenizer=make_tokenizer(extra_chars="é")),
        "template": key(tokenizer=make_tokenizer(CHATML_GENERATION)),
        "data": key(data_path=other_data),
    }
    assert base == key(tokenizer=make_tokenizer())  # the same tokenizer, in memory
    assert len({base, *variants.values()}) == len(variants) + 1, variants


def _race(barrier, args: tuple, results) -> None:
    path, tokenizer_dir, root, marker_dir = args
    tokenize = data.cache._tokenize  # what tokenize_to_cache calls

    def tokenize_and_mark(*a):
        (marker_dir / f"built-{multiprocessing.current_process().pid}").touch()
        time.sleep(0.5)  # long enough that the other process finds the lock taken
        return tokenize(*a)

    data.cache._tokenize = tokenize_and_mark  # this child's copy of the module only
    barrier.wait()
    results.put(str(data.tokenize_to_cache(path, tokenizer_dir, cache_root=root, seq_len=32)))


def test_racing_processes_build_one_cache(tmp_path, tokenizer_dir):
    path = write(tmp_path, "jsonl", TEXT * 200)
    root, markers = tmp_path / "cache", tmp_path / "markers"
    markers.mkdir()
    context = multiprocessing.get_context("fork")  # children inherit the imported transformers
    barrier, results = context.Barrier(2), context.Queue()
    children = [
        context.Process(target=_race, args=(barrier, (path, tokenizer_dir, root, markers), results))
        for _ in range(2)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(60)
    assert [child.exitcode for child in children] == [0, 0]
    paths = {results.get(timeout=5), results.get(timeout=5)}
    assert len(paths) == 1
    assert [p.name for p in root.iterdir()] == [Path(paths.pop()).name]  # no temp, no lock
    assert len(list(markers.iterdir())) == 1  # one of them tokenized, the other waited
    assert len(data.load_cached(next(root.iterdir()))) > 0


def test_a_dead_builders_lock_is_taken_over(tmp_path, tokenizer_dir):
    path = write(tmp_path, "jsonl", TEXT)
    first = data.tokenize_to_cache(path, tokenizer_dir, cache_root=tmp_path / "c", seq_len=16)
    shutil.rmtree(first)
    lock = first.with_name(first.name + ".lock")
    lock.write_text(f"{socket.gethostname()} pid 999999999\n")
    again = data.tokenize_to_cache(path, tokenizer_dir, cache_root=tmp_path / "c", seq_len=16)
    assert again == first and not lock.exists()


def test_waiting_on_another_hosts_builder_times_out(tmp_path, tokenizer_dir):
    path = write(tmp_path, "jsonl", TEXT)
    first = data.tokenize_to_cache(path, tokenizer_dir, cache_root=tmp_path / "c", seq_len=16)
    shutil.rmtree(first)
    lock = first.with_name(first.name + ".lock")
    lock.write_text("gpu-node-7 pid 4242\n")
    with pytest.raises(TrainfleetError, match="still being written by gpu-node-7 pid 4242") as e:
        data.tokenize_to_cache(
            path, tokenizer_dir, cache_root=tmp_path / "c", seq_len=16, wait_timeout_s=0.2
        )
    assert str(lock) in e.value.fix


def test_prepare_cache_prints_the_summary(tmp_path, tokenizer_dir, capsys):
    from trainfleet.train.config import TrainConfig

    path = write(tmp_path, "jsonl", TEXT)
    config = TrainConfig(
        model=str(tokenizer_dir), data=str(path), output=str(tmp_path / "out"), seq_len=16
    )
    cache = data.prepare_cache(config, tmp_path / "out" / ".cache")
    assert cache.parent == tmp_path / "out" / ".cache"
    assert capsys.readouterr().out.startswith("data: 3 text records -> 3 samples, ")
