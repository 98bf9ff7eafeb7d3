"""Exact parameter counts of a Hugging Face causal LM from its config.json, without weights.

    >>> shape = ModelShape.from_config({"model_type": "llama", "vocab_size": 32000,
    ...     "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    ...     "num_attention_heads": 32, "num_key_value_heads": 32})
    >>> shape.total_params()
    6738415616

Families and what differs between them (from the transformers modeling files):
llama, mistral: q/k/v/o (biases only with `attention_bias`), gate/up/down (biases with
`mlp_bias`), 2 RMSNorms per layer; qwen2: q/k/v always with bias, o without; qwen3: no q/k/v bias
by default, plus q_norm and k_norm (RMSNorm over head_dim) per layer; gemma: head_dim from the
config, embeddings tied by default; gemma2, gemma3_text: 4 norms per layer (pre/post attention,
pre/post feed-forward), gemma3 also q_norm/k_norm. Tied embeddings count once (as DeepSpeed and
`model.parameters()` do).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainfleet.errors import TrainfleetError

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text")
_TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3_text"}
_QKV_BIAS_ALWAYS = {"qwen2"}
_QK_NORM = {"qwen3", "gemma3_text"}
_FOUR_NORMS = {"gemma2", "gemma3_text"}
_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelShape:
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    checkpoint_dtype: str | None = None
    """config.json's `torch_dtype` (`dtype` in transformers 5): what the weights are saved in."""
    source: str = "<config>"

    @classmethod
    def from_config(cls, config: dict[str, Any], source: str = "<config>") -> ModelShape:
        family = config.get("model_type")
        if family == "gemma3":  # the multimodal wrapper: its text model is what trains here
            config, family = {**config.get("text_config", {})}, "gemma3_text"
        if family not in FAMILIES:
            raise TrainfleetError(
                f"{source}: model_type {family!r} is not one trainfleet can count",
                f"supported: {', '.join(FAMILIES)}",
            )
        missing = [key for key in _REQUIRED if not isinstance(config.get(key), int)]
        if missing:
            raise TrainfleetError(
                f"{source}: config has no integer {', '.join(missing)}",
                "pass the model's own config.json",
            )
        heads = config["num_attention_heads"]
        attention_bias = bool(config.get("attention_bias", False))
        return cls(
            family=family,
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", family in _TIED_BY_DEFAULT)),
            qkv_bias=family in _QKV_BIAS_ALWAYS or attention_bias,
            o_bias=attention_bias,
            mlp_bias=bool(config.get("mlp_bias", False)),
            checkpoint_dtype=config.get("dtype") or config.get("torch_dtype"),
            source=source,
        )

    @classmethod
    def from_path(cls, path: str | Path) -> ModelShape:
        """A model directory (its config.json) or a config.json file."""
        path = Path(path)
        config_file = path / "config.json" if path.is_dir() else path
        try:
            config = json.loads(config_file.read_text())
        except FileNotFoundError:
            raise TrainfleetError(
                f"{config_file}: no such file",
                "pass a local model directory or its config.json (nothing is downloaded)",
            ) from None
        except ValueError as exc:
            raise TrainfleetError(f"{config_file}: not JSON ({exc})", "") from None
        return cls.from_config(config, str(config_file))

    # -------------------------------------------------------------------- counts
    def attention_params(self) -> int:
        h, d = self.hidden_size, self.head_dim
        q, kv = self.num_heads * d, self.num_kv_heads * d
        weights = h * q + 2 * h * kv + q * h
        biases = (q + 2 * kv if self.qkv_bias else 0) + (h if self.o_bias else 0)
        norms = 2 * d if self.family in _QK_NORM else 0
        return weights + biases + norms

    def mlp_params(self) -> int:
        h, inter = self.hidden_size, self.intermediate_size
        return 3 * h * inter + ((2 * inter + h) if self.mlp_bias else 0)

    def layer_params(self) -> int:
        norms = (4 if self.family in _FOUR_NORMS else 2) * self.hidden_size
        return self.attention_params() + self.mlp_params() + norms

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def total_params(self) -> int:
        head = 0 if self.tie_word_embeddings else self.embedding_params()
        final_norm = self.hidden_size
        return self.embedding_params() + self.num_layers * self.layer_params() + final_norm + head

    def parameter_numels(self) -> list[int]:
        """Every parameter tensor's element count, in the model's order (tied weights once):
        what ZeRO-3 partitions one by one."""
        h, d, inter = self.hidden_size, self.head_dim, self.intermediate_size
        q, kv = self.num_heads * d, self.num_kv_heads * d

        def linear(n_in: int, n_out: int, bias: bool) -> list[int]:
            return [n_in * n_out, n_out] if bias else [n_in * n_out]

        layer = [
            *linear(h, q, self.qkv_bias),
            *linear(h, kv, self.qkv_bias),
            *linear(h, kv, self.qkv_bias),
            *linear(q, h, self.o_bias),
            *([d, d] if self.family in _QK_NORM else []),
            *linear(h, inter, self.mlp_bias),
            *linear(h, inter, self.mlp_bias),
            *linear(inter, h, self.mlp_bias),
            *[h] * (4 if self.family in _FOUR_NORMS else 2),
        ]
        numels = [self.embedding_params(), *layer * self.num_layers, h]
        if not self.tie_word_embeddings:
            numels.append(self.embedding_params())
        return numels

    def largest_module_params(self) -> int:
        """Params one module owns directly (DeepSpeed's `model_to_params` largest layer): the
        embedding or lm_head for every family here, else the biggest projection."""
        h = self.hidden_size
        projections = [
            self.num_heads * self.head_dim * h,
            self.intermediate_size * h,
        ]
        return max([self.embedding_params(), *projections])


def weights_on_disk(path: str | Path) -> int | None:
    """Bytes of a model directory's weight files; None for a bare config.json."""
    path = Path(path)
    if not path.is_dir():
        return None
    files = [f for pattern in ("*.safetensors", "*.bin", "*.pt") for f in path.glob(pattern)]
    return sum(f.stat().st_size for f in files) or None
