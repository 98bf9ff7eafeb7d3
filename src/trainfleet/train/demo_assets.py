"""The built-in demo's assets: a character tokenizer, a tiny random Llama and a synthetic chat task
(reverse a word) that the model visibly learns on CPU in a few hundred optimizer steps.

    >>> examples = eval_examples(2, seed=0)
    >>> [(example.prompt, example.answer) for example in examples]
    [('reverse kte', 'etk'), ('reverse lnnb', 'bnnl')]
    >>> chat(examples[0])["messages"][1]
    {'role': 'assistant', 'content': 'etk'}

Everything is built locally (nothing is downloaded):

    write_tokenizer("demo/model")
    write_model("demo/model", tokenizer_dir="demo/model", seed=0)
    write_dataset("demo/train.jsonl", n=RECIPE.train_chats, seed=0)
    answers = generate_answers("demo/output", eval_examples(100, seed=1))
    print(render_answers(answers))

Train and eval words never overlap, whatever the seeds: a word is held out for eval when its CRC32
is divisible by 10 (`is_held_out`), and the training set skips those. The measured recipe (steps,
batch, learning rate) is `RECIPE`.
"""

from __future__ import annotations

import json
import random
import shutil
import string
import zlib
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
USER, ASSISTANT = "<|user|>", "<|assistant|>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK, USER, ASSISTANT)
"""In id order: `<pad>` is 0, `<bos>` 1, `<eos>` 2."""
CHARACTERS = " " + string.ascii_lowercase + string.digits + ".,:;!?+-*/=()'\""
"""One token each; anything else encodes as `<unk>`."""

LETTERS = string.ascii_lowercase
MIN_WORD, MAX_WORD = 3, 7
INSTRUCTION = "reverse "

# The assistant's content and its <eos> are inside {% generation %}: the trainer's labels, and
# the model learns to stop. The role markers are single special tokens, never labels.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "<|assistant|>{% generation %}{{ message['content'] }}{{ eos_token }}{% endgeneration %}"
    "{% else %}<|user|>{{ message['content'] }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)
MAX_POSITIONS = 128
"""The model's `max_position_embeddings` and the tokenizer's `model_max_length`; a chat here is
2 * len(word) + 12 tokens, at most 26."""

MODEL_CONFIG: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": MAX_POSITIONS,
    # Untied: a separate lm_head is 7K parameters here and keeps ZeRO-3's export of shared
    # parameters out of the demo.
    "tie_word_embeddings": False,
}
"""The tiny Llama beside the tokenizer's vocabulary and special ids: about 0.8M parameters."""


@dataclass(kw_only=True, slots=True, frozen=True)
class DemoRecipe:
    """Hyperparameters measured with a plain single-process loop (fp32, CPU, torch AdamW, one
    epoch of `train_chats`, exact match on 200 held-out words). Seeds 0-5 reached >= 90% at
    step 200-350 and 95-100% at step 400; loss 4.1 at step 1, ~2.0 at 50, 0.6-1.0 at 100,
    0.2-0.35 at 150, 0.06-0.2 at 200, < 0.01 at 400. About 0.1 s a step on one idle core;
    bf16 autocast learns the same and is no faster on CPU. Ranks that share cores want one
    intra-op thread each (OMP_NUM_THREADS=1): two threads per process on two busy cores ran up
    to 10x slower here."""

    global_batch_size: int = 64
    """Chats per optimizer step over all ranks: 2 ranks x micro batch 32 in `make demo`. 32 a
    step needs about twice the steps and fails to reach 90% in 600 for some seeds."""
    learning_rate: float = 3e-3
    """Peak; linear warmup over `warmup_steps`, then times max(0.1, 1 - step / steps)."""
    warmup_steps: int = 30
    steps: int = 400
    """>= 90% came at step 200-350 in all 6 measured seeds: 400 leaves a margin."""
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seq_len: int = 32
    """Every chat fits (18-26 tokens); packed rows of 32 hold exactly one chat."""

    @property
    def train_chats(self) -> int:
        """One epoch of `steps` full batches: what `write_dataset`'s `n` should be."""
        return self.steps * self.global_batch_size


RECIPE = DemoRecipe()


class Example(NamedTuple):
    prompt: str
    answer: str


class Answer(NamedTuple):
    prompt: str
    expected: str
    got: str

    @property
    def correct(self) -> bool:
        return self.got == self.expected


# ------------------------------------------------------------------------------------ the task
def is_held_out(word: str) -> bool:
    """Eval's words: a fixed tenth of all words, chosen by hash so no seed can leak them."""
    return zlib.crc32(word.encode()) % 10 == 0


def _random_word(rng: random.Random) -> str:
    return "".join(rng.choice(LETTERS) for _ in range(rng.randint(MIN_WORD, MAX_WORD)))


def _examples(n: int, seed: int, held_out: bool) -> list[Example]:
    # A separate stream per split: eval(seed=0) does not replay train(seed=0)'s words.
    rng = random.Random(f"{'eval' if held_out else 'train'}:{seed}")
    examples: list[Example] = []
    seen: set[str] = set()
    while len(examples) < n:
        word = _random_word(rng)
        if is_held_out(word) != held_out or (held_out and word in seen):
            continue
        seen.add(word)
        examples.append(Example(INSTRUCTION + word, word[::-1]))
    return examples


def train_examples(n: int, seed: int = 0) -> list[Example]:
    """`n` training examples (repeats possible, never a held-out word); same seed, same list."""
    return _examples(n, seed, held_out=False)


def eval_examples(n: int, seed: int = 0) -> list[Example]:
    """`n` distinct held-out examples (words no training set contains); same seed, same list."""
    return _examples(n, seed, held_out=True)


def chat(example: Example) -> dict[str, list[dict[str, str]]]:
    return {
        "messages": [
            {"role": "user", "content": example.prompt},
            {"role": "assistant", "content": example.answer},
        ]
    }


def write_dataset(path: str | Path, n: int, seed: int = 0) -> Path:
    """`n` training chats as JSONL: `{"messages": [{"role": "user", ...}, {"role": ...}]}`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = (json.dumps(chat(example)) + "\n" for example in train_examples(n, seed))
    path.write_text("".join(lines))
    return path


# ------------------------------------------------------------------ tokenizer and model files
@contextmanager
def _no_progress_bars() -> Iterator[None]:
    """The demo prints answers, not "Writing model shards" and "Loading weights" bars."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def write_tokenizer(directory: str | Path) -> Path:
    """A character-level `PreTrainedTokenizerFast` with the chat template: tokenizer.json,
    tokenizer_config.json and chat_template.jinja."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *CHARACTERS])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    # Every character its own pre-token; added (special) tokens are matched before this runs.
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=[USER, ASSISTANT],
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS,
    )
    directory = Path(directory)
    fast.save_pretrained(directory)
    return directory


def write_model(
    directory: str | Path, tokenizer_dir: str | Path, seed: int = 0, **sizes: int
) -> Path:
    """A randomly initialised `LlamaForCausalLM` sized by `MODEL_CONFIG` (or `sizes` on top,
    e.g. `hidden_size=512`), saved in fp32 safetensors with the tokenizer beside it. Same seed,
    same weights; the global RNG is left as it was."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = AutoConfig.for_model(
        "llama",
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **{**MODEL_CONFIG, **sizes},
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # fp32: the weights are the optimizer's master copy either way, 3 MB on disk, and CPU
        # inference in fp32 is faster than bf16 on CPUs without bf16 matmul units.
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    directory = Path(directory)
    with _no_progress_bars():
        model.save_pretrained(directory, safe_serialization=True)
    # Copied, not re-saved: transformers 5 writes loading options (`is_local`,
    # `local_files_only`) into a re-saved tokenizer_config.json.
    for name in TOKENIZER_FILES:
        source = Path(tokenizer_dir) / name
        if source.is_file() and source.resolve() != (directory / name).resolve():
            shutil.copyfile(source, directory / name)
    return directory


# ---------------------------------------------------------------------------------- evaluation
def generate_answers(
    model_dir: str | Path, examples: Iterable[Example | tuple[str, str]], batch_size: int = 64
) -> list[Answer]:
    """Greedy answers of the model in `model_dir` (CPU, fp32) to each (prompt, expected)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"  # generation continues each row from its last token
    with _no_progress_bars():
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    asked = [Example(*example) for example in examples]
    answers = []
    for start in range(0, len(asked), batch_size):
        batch = asked[start : start + batch_size]
        prompts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": example.prompt}],
                tokenize=False,
                add_generation_prompt=True,
            )
            for example in batch
        ]
        # The template already wrote <bos>: no second one from the tokenizer.
        inputs = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            output = model.generate(
                **inputs,
                do_sample=False,
                max_new_tokens=MAX_WORD + 1,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        new_tokens = output[:, inputs["input_ids"].shape[1] :]
        texts = tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        answers += [Answer(ex.prompt, ex.answer, got) for ex, got in zip(batch, texts, strict=True)]
    return answers


def accuracy(answers: Sequence[Answer]) -> float:
    """Exact-match share of `answers`; 0.0 for none."""
    return sum(answer.correct for answer in answers) / len(answers) if answers else 0.0


def render_answers(answers: Sequence[Answer], limit: int = 10) -> str:
    """The first `limit` answers beside the expected ones, then the accuracy over all."""
    width = max((len(answer.prompt) for answer in answers[:limit]), default=0)
    lines = [
        f"{answer.prompt:<{width}}  expected {answer.expected:<{MAX_WORD}}  got {answer.got!r}"
        f"  {'ok' if answer.correct else 'WRONG'}"
        for answer in answers[:limit]
    ]
    correct = sum(answer.correct for answer in answers)
    lines.append(f"accuracy: {correct}/{len(answers)} = {accuracy(answers):.0%}")
    return "\n".join(lines)
