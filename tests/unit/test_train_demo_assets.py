"""The built-in demo's assets: the tokenizer and model directories load offline with the Auto
classes, the chat template's assistant mask is exactly the answer and its <eos>, the dataset is
deterministic and never contains an eval word, and the model really learns from it (a short
plain training loop halves the loss)."""

from __future__ import annotations

import doctest
import importlib.util
import json

import pytest

from trainfleet.train import demo_assets
from trainfleet.train.demo_assets import Answer, Example

pytestmark = pytest.mark.unit

needs_transformers = pytest.mark.skipif(
    not all(importlib.util.find_spec(name) for name in ("torch", "transformers", "tokenizers")),
    reason="torch, transformers and tokenizers are needed to build the demo's model files",
)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    # A load that tried the hub would fail here instead of passing on a machine with network.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    if not all(importlib.util.find_spec(n) for n in ("torch", "transformers", "tokenizers")):
        pytest.skip("torch, transformers and tokenizers are needed")
    directory = tmp_path_factory.mktemp("demo") / "model"
    demo_assets.write_tokenizer(directory)
    demo_assets.write_model(directory, tokenizer_dir=directory, seed=0)
    return directory


def _conversations(n: int = 300, seed: int = 0) -> list[dict]:
    return [demo_assets.chat(example) for example in demo_assets.train_examples(n, seed)]


def test_module_example_runs():
    result = doctest.testmod(demo_assets, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


# ------------------------------------------------------------------------------- the task data
def test_dataset_is_deterministic_by_seed(tmp_path):
    first = demo_assets.write_dataset(tmp_path / "a.jsonl", 500, seed=7).read_text()
    again = demo_assets.write_dataset(tmp_path / "b.jsonl", 500, seed=7).read_text()
    other = demo_assets.write_dataset(tmp_path / "c.jsonl", 500, seed=8).read_text()
    assert first == again
    assert first != other
    records = [json.loads(line) for line in first.splitlines()]
    assert len(records) == 500
    for record in records:
        user, assistant = record["messages"]
        assert (user["role"], assistant["role"]) == ("user", "assistant")
        word = user["content"].removeprefix(demo_assets.INSTRUCTION)
        assert user["content"] == demo_assets.INSTRUCTION + word
        assert demo_assets.MIN_WORD <= len(word) <= demo_assets.MAX_WORD
        assert assistant["content"] == word[::-1]
    assert demo_assets.eval_examples(50, seed=3) == demo_assets.eval_examples(50, seed=3)


def test_eval_words_never_appear_in_training_whatever_the_seeds():
    train_prompts = {
        ex.prompt for seed in range(3) for ex in demo_assets.train_examples(5000, seed)
    }
    for seed in range(3):
        held_out = demo_assets.eval_examples(500, seed)
        assert not train_prompts & {ex.prompt for ex in held_out}
        assert len(set(held_out)) == len(held_out)
        assert all(ex.answer == ex.prompt.removeprefix("reverse ")[::-1] for ex in held_out)
    # Short words are few (26**3): a plain random split would collide there.
    assert any(len(ex.answer) == demo_assets.MIN_WORD for ex in held_out)


def test_accuracy_and_rendering_count_exact_matches_only():
    answers = [Answer("reverse abc", "cba", "cba"), Answer("reverse abcd", "dcba", "dcb")]
    assert demo_assets.accuracy(answers) == 0.5
    assert demo_assets.accuracy([]) == 0.0
    text = demo_assets.render_answers(answers)
    assert text.splitlines()[-1] == "accuracy: 1/2 = 50%"
    assert "WRONG" in text.splitlines()[1] and "WRONG" not in text.splitlines()[0]


# --------------------------------------------------------------------- tokenizer and template
@needs_transformers
def test_tokenizer_loads_offline_and_round_trips_every_character(model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert (tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token) == (
        "<pad>",
        "<bos>",
        "<eos>",
    )
    assert len({tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}) == 3
    texts = [m["content"] for chat in _conversations() for m in chat["messages"]]
    texts.append(demo_assets.CHARACTERS)
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert len(ids) == len(text)  # one token per character
        assert tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids) == text


@needs_transformers
def test_chat_template_masks_exactly_the_answer_and_its_eos(model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for chat in _conversations(50):
        answer = chat["messages"][1]["content"]
        out = tokenizer.apply_chat_template(
            chat["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        ids, mask = out["input_ids"], out["assistant_masks"]
        trained = [token for token, m in zip(ids, mask, strict=True) if m]
        assert tokenizer.decode(trained) == answer + "<eos>"
        assert mask == [0] * (len(ids) - len(answer) - 1) + [1] * (len(answer) + 1)
        prompt = tokenizer.apply_chat_template(
            chat["messages"][:1], tokenize=True, add_generation_prompt=True, return_dict=True
        )["input_ids"]
        # What generation starts from is exactly the untrained head of the training sample.
        assert ids[: len(prompt)] == prompt
        assert len(prompt) == len(ids) - len(answer) - 1
        assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1
        assert len(ids) == 2 * len(answer) + 12 <= demo_assets.RECIPE.seq_len


# ---------------------------------------------------------------------------------- the model
@needs_transformers
def test_model_dir_loads_and_the_seed_fixes_the_weights(model_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    assert (model_dir / "model.safetensors").is_file()
    demo_assets.write_tokenizer(tmp_path / "tokenizer")
    demo_assets.write_model(tmp_path / "copied", tmp_path / "tokenizer", seed=0)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (tmp_path / "copied" / name).read_bytes() == (
            tmp_path / "tokenizer" / name
        ).read_bytes()
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.dtype == torch.float32
    assert 300_000 <= model.num_parameters() <= 2_000_000
    assert model.config.pad_token_id == 0 and model.config.eos_token_id == 2
    state = model.state_dict()

    torch.manual_seed(123)
    marker = torch.rand(1)
    demo_assets.write_model(tmp_path / "same", model_dir, seed=0)
    demo_assets.write_model(tmp_path / "other", model_dir, seed=1)
    torch.manual_seed(123)
    assert torch.equal(torch.rand(1), marker)  # the caller's RNG is left alone
    same = AutoModelForCausalLM.from_pretrained(tmp_path / "same").state_dict()
    other = AutoModelForCausalLM.from_pretrained(tmp_path / "other").state_dict()
    name = "model.layers.0.self_attn.q_proj.weight"
    assert all(torch.equal(state[key], same[key]) for key in state)
    assert not torch.equal(state[name], other[name])


def _batches(tokenizer, path, batch_size: int):
    import torch

    records = [json.loads(line) for line in path.read_text().splitlines()]
    for start in range(0, len(records) - batch_size + 1, batch_size):
        encoded = [
            tokenizer.apply_chat_template(
                record["messages"], return_dict=True, return_assistant_tokens_mask=True
            )
            for record in records[start : start + batch_size]
        ]
        width = max(len(e["input_ids"]) for e in encoded)
        ids = torch.full((batch_size, width), tokenizer.pad_token_id)
        labels = torch.full((batch_size, width), -100)
        for row, e in enumerate(encoded):
            n = len(e["input_ids"])
            ids[row, :n] = torch.tensor(e["input_ids"])
            trained = torch.tensor(e["assistant_masks"], dtype=torch.bool)
            labels[row, :n] = torch.where(trained, ids[row, :n], -100)
        yield ids, (ids != tokenizer.pad_token_id).long(), labels


@pytest.fixture
def one_thread():
    # Two intra-op threads on a shared 2-core machine can run 10x slower than one.
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@needs_transformers
def test_short_training_run_halves_the_loss_and_generation_batches_agree(
    model_dir, tmp_path, one_thread
):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    recipe, steps = demo_assets.RECIPE, 120
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    data = demo_assets.write_dataset(tmp_path / "train.jsonl", steps * 32, seed=0)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=recipe.learning_rate, betas=recipe.betas, weight_decay=0.0
    )
    warmup = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / recipe.warmup_steps)
    )
    losses = []
    for ids, attention, labels in _batches(tokenizer, data, 32):
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm)
        optimizer.step()
        warmup.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    start, end = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert len(losses) == steps
    assert start > 3.5  # about ln(vocab): an untrained model
    assert end < start / 2, f"loss {start:.2f} -> {end:.2f}: the model did not learn"

    trained = tmp_path / "trained"
    model.save_pretrained(trained)
    tokenizer.save_pretrained(trained)
    examples = demo_assets.eval_examples(12, seed=0)
    batched = demo_assets.generate_answers(trained, examples)
    one_by_one = demo_assets.generate_answers(trained, [tuple(ex) for ex in examples], batch_size=1)
    # Left padding must not change a greedy answer.
    assert batched == one_by_one
    assert [(a.prompt, a.expected) for a in batched] == [tuple(ex) for ex in examples]
    for answer in batched:
        assert "<" not in answer.got, answer  # "<" is no character here: a special token leaked
        assert len(answer.got) <= demo_assets.MAX_WORD + 1
    assert isinstance(examples[0], Example)
