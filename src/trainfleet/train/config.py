"""The training config: `train.yaml`, with the common fields also as flags (flags win).

    >>> config = load_train_config(None, {"model": "m", "data": "d.jsonl", "output": "out"})
    >>> config.zero, config.packing, config.lora is None
    (3, True, True)

Every field is documented below; unknown keys are refused with the list of valid ones, and a
wrong type names the file, the line and the field.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from trainfleet.errors import SpecError, TrainfleetError
from trainfleet.hf_names import HF_NAMES
from trainfleet.plan.memory import TrainSetup
from trainfleet.spec_yaml import LineDict, load_yaml_with_lines

SCHEDULERS = ("cosine", "linear", "constant_with_warmup")
DEFAULT_MAX_STEPS = 100
"""Steps when neither max_steps nor num_train_epochs is given."""


@dataclass(kw_only=True, slots=True)
class LoraConfig:
    rank: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] = field(
        default_factory=lambda: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ]
    )
    """Every linear of a Llama/Qwen/Mistral/Gemma layer by default (what `plan` counts)."""
    merge_on_export: bool = True
    """Export the base model with the adapters merged in (else the adapters alone)."""

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise TrainfleetError(f"lora.rank: {self.rank}", "a positive rank, e.g. 16")


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    model: str
    """A local Hugging Face model directory (config.json, safetensors, tokenizer)."""
    data: str
    """JSONL, Parquet, or a `datasets` dataset saved to disk: text, prompt/completion or
    messages records."""
    output: str
    """Checkpoints, metrics, logs and the exported model (on storage every node sees)."""
    zero: int = 3
    """DeepSpeed ZeRO stage, 0-3."""
    offload: str = "none"
    """none, optimizer, all (params too; ZeRO-3)."""
    precision: str = "bf16"
    max_steps: int | None = None
    """Optimizer steps; None: from num_train_epochs, else 100. Given, it wins over epochs, as
    in HF Trainer."""
    num_train_epochs: float | None = None
    """Passes over the data (HF's name): the steps come from the packed rows, the world size,
    micro batch and accumulation, as HF Trainer counts them (`with_steps`)."""
    micro_batch_size: int = 1
    """Sequences per rank per forward."""
    gradient_accumulation_steps: int = 1
    seq_len: int = 2048
    """Tokens per sequence (packed sequences are exactly this long)."""
    learning_rate: float = 2e-5
    warmup_steps: float = 0
    """Warmup steps; below 1, a share of the steps (HF 5's rule: ceil(steps x w))."""
    warmup_ratio: float = 0.0
    """Warmup as a share of the steps, when warmup_steps is 0 (HF 4's name; ceil(steps x r))."""
    lr_scheduler: str = "cosine"
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    grad_ckpt: bool = False
    """Gradient checkpointing: less activation memory, one more forward."""
    save_steps: int = 0
    """Checkpoint every N steps (0: only at the end)."""
    keep_checkpoints: int = 2
    """The last K checkpoints are kept; older ones are deleted after a newer one is complete."""
    logging_steps: int = 1
    packing: bool = True
    """Several samples per sequence, padding-free, no attention across samples."""
    skip_bad_records: bool = False
    """Skip and count malformed records instead of stopping at the first."""
    seed: int = 42
    deepspeed_config: str | None = None
    """A DeepSpeed JSON to use instead of the generated one (`plan --emit-deepspeed` writes one)."""
    lora: LoraConfig | None = None
    """Present: LoRA via peft instead of full fine-tuning."""
    export: bool = True
    """Write a consolidated HF model to OUTPUT/final at the end."""

    def __post_init__(self) -> None:
        self.plan_setup()  # ZeRO stage, offload, precision, sizes: the planner's own checks
        checks = [(self.lr_scheduler in SCHEDULERS, "lr_scheduler", ", ".join(SCHEDULERS))]
        checks.append((self.max_steps is None or self.max_steps >= 1, "max_steps", "at least 1"))
        checks.append((self.gradient_accumulation_steps >= 1, "gradient_accumulation_steps",
                       "at least 1"))  # fmt: skip
        epochs = self.num_train_epochs
        checks.append((epochs is None or epochs > 0, "num_train_epochs", "a positive number"))
        checks.append((0 <= self.warmup_ratio < 1, "warmup_ratio", "0 <= r < 1"))
        checks.append((not (0 < self.warmup_steps < 1 and self.warmup_ratio), "warmup_steps",
                       "a step count when warmup_ratio is given (one share, not two)"))  # fmt: skip
        for name in ("save_steps", "warmup_steps"):
            checks.append((getattr(self, name) >= 0, name, "0 or more"))
        checks.append((self.keep_checkpoints >= 1, "keep_checkpoints", "at least 1"))
        checks.append((self.learning_rate > 0, "learning_rate", "positive"))
        for ok, name, valid in checks:
            if not ok:
                raise TrainfleetError(f"{name}: {getattr(self, name)!r}", f"use {valid}")

    def plan_setup(self) -> TrainSetup:
        """This run as the planner sees it (what `plan.ds_config` turns into DeepSpeed JSON)."""
        return TrainSetup(
            zero=self.zero,
            offload=self.offload,
            micro_batch=self.micro_batch_size,
            seq_len=self.seq_len,
            grad_ckpt=self.grad_ckpt,
            precision=self.precision,
            lora_rank=self.lora.rank if self.lora else 0,
        )

    def with_steps(self, rows: int, world_size: int) -> TrainConfig:
        """This config with max_steps and warmup_steps settled: from num_train_epochs when
        max_steps was not given, else 100; warmup as HF counts it (a whole number of steps, or
        ceil(steps x share) for a warmup_steps below 1 or a warmup_ratio).

        The steps are HF Trainer's (transformers 5.23 `set_initial_training_values`): each
        rank's batches per epoch are ceil(rows / (world x micro batch)); an accumulation begun
        at the end of an epoch is a step, with at least one per epoch; then
        ceil(epochs x steps per epoch)."""
        steps = self.max_steps
        if steps is None and self.num_train_epochs is not None:
            batches = math.ceil(rows / (world_size * self.micro_batch_size))
            per_epoch = max(math.ceil(batches / self.gradient_accumulation_steps), 1)
            steps = math.ceil(self.num_train_epochs * per_epoch)
        steps = steps or DEFAULT_MAX_STEPS
        share = self.warmup_steps if 0 < self.warmup_steps < 1 else self.warmup_ratio
        warmup = int(self.warmup_steps) or math.ceil(steps * share)
        return dataclasses.replace(self, max_steps=steps, warmup_steps=warmup)

    @property
    def output_dir(self) -> Path:
        return Path(self.output)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainConfig:
        lora = data.get("lora")
        return cls(**{**data, "lora": LoraConfig(**lora) if lora else None})


def _type_ok(value: Any, annotation: Any) -> bool:
    hint = typing.get_origin(annotation)
    if hint in (typing.Union, types.UnionType):
        return any(_type_ok(value, arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if hint is list:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def _from_mapping(cls: type, raw: dict, source: str, where: str) -> Any:
    hints = typing.get_type_hints(cls)
    valid = [f.name for f in fields(cls)]
    values = {}
    for key, value in raw.items():
        line = raw.line_of(key) if isinstance(raw, LineDict) else None
        if key not in valid:
            raise SpecError(source, line, f"unknown key {key!r} in {where}", f"valid keys: "
                            f"{', '.join(valid)}")  # fmt: skip
        if key == "lora" and value is not None:
            if not isinstance(value, dict):
                raise SpecError(source, line, "lora must be a mapping", "e.g. lora: {rank: 16}")
            value = _from_mapping(LoraConfig, value, source, "lora")
        elif not _type_ok(value, hints[key]):
            raise SpecError(
                source, line, f"{key}: {value!r} is not {hints[key]}", f"fix {key} in {source}"
            )
        values[key] = value
    missing = [
        f.name
        for f in fields(cls)
        if f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
        and f.name not in values
    ]
    if missing:
        raise SpecError(source, None, f"no {', '.join(missing)}", f"set {missing[0]}: in "
                        f"{source} or --{missing[0]}")  # fmt: skip
    return cls(**values)


def load_train_config(path: str | Path | None, overrides: dict[str, Any]) -> TrainConfig:
    """train.yaml (or nothing) with `overrides` (the flags that were given) on top."""
    raw: dict = LineDict(1)
    source = "flags"
    if path:
        source = str(path)
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise TrainfleetError(
                f"{path}: {exc.strerror}", "pass an existing train.yaml"
            ) from None
        raw = load_yaml_with_lines(text, source) or LineDict(1)
        if not isinstance(raw, dict):
            raise SpecError(source, 1, "not a mapping of settings", "write `key: value` lines")
    merged = LineDict(1)
    lines = getattr(raw, "key_lines", {})
    for key, value in raw.items():
        ours = HF_NAMES.get(key, key)  # HF's name for the same setting
        if ours != key and ours in raw:
            raise SpecError(source, lines.get(key), f"{key} and {ours} both set",
                            f"keep one ({key} is HF's name for {ours})")  # fmt: skip
        merged[ours] = value
        if key in lines:
            merged.key_lines[ours] = lines[key]
    merged.update({k: v for k, v in overrides.items() if v is not None})
    return _from_mapping(TrainConfig, merged, source, source)
