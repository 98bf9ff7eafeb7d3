"""Parameter counts from configs (exact, checked against transformers' own models built on the
meta device), and DeepSpeed's and Accelerate's estimators reproduced (checked against their
own functions)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys

import pytest

from trainfleet.errors import TrainfleetError
from trainfleet.plan.estimators import (
    accelerate_training_bytes,
    zero2_model_states,
    zero3_model_states,
)
from trainfleet.plan.model import ModelShape

pytestmark = pytest.mark.unit

TINY = dict(
    vocab_size=1000,
    hidden_size=64,
    intermediate_size=176,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
FAMILIES = {
    "llama": {},
    "llama+biases+tied": {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True},
    "mistral": {},
    "qwen2": {"tie_word_embeddings": False},
    "qwen3": {"head_dim": 32, "tie_word_embeddings": False},
    "gemma": {"head_dim": 32, "num_key_value_heads": 1},
    "gemma2": {"head_dim": 32},
    "gemma3_text": {"head_dim": 32},
}
# Published shapes; totals as transformers counts them on the meta device (below).
REAL = {
    "Llama-2-70B": (
        "llama",
        {
            "vocab_size": 32000,
            "hidden_size": 8192,
            "intermediate_size": 28672,
            "num_hidden_layers": 80,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "tie_word_embeddings": False,
        },
        68_976_648_192,
        262_144_000,
    ),
    "DeepSeek-R1-Distill-Qwen-32B": (
        "qwen2",
        {
            "vocab_size": 152064,
            "hidden_size": 5120,
            "intermediate_size": 27648,
            "num_hidden_layers": 64,
            "num_attention_heads": 40,
            "num_key_value_heads": 8,
            "tie_word_embeddings": False,
        },
        32_763_876_352,
        778_567_680,
    ),
    "Llama-3.1-8B": (
        "llama",
        {
            "vocab_size": 128256,
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "tie_word_embeddings": False,
        },
        8_030_261_248,
        525_336_576,
    ),
}

COUNT_WITH_TRANSFORMERS = """
import json, sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
out = {}
for name, (family, kwargs) in json.loads(sys.argv[1]).items():
    config = AutoConfig.for_model(family, **kwargs)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    numels = [p.numel() for p in model.parameters()] if total < 10**8 else []
    out[name] = [config.to_dict(), total, largest, numels]
print(json.dumps(out))
"""


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="transformers is not installed"
)
def test_counts_equal_transformers_models_on_the_meta_device():
    cases = {name: (name.split("+")[0], {**TINY, **extra}) for name, extra in FAMILIES.items()}
    cases.update({name: (family, kwargs) for name, (family, kwargs, _, _) in REAL.items()})
    done = subprocess.run(
        [sys.executable, "-c", COUNT_WITH_TRANSFORMERS, json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for name, (config, total, largest, numels) in json.loads(done.stdout).items():
        shape = ModelShape.from_config(config, name)
        assert shape.total_params() == total, name
        assert shape.largest_module_params() == largest, name
        if numels:  # the tensors one by one, in order (what ZeRO-3 partitions)
            assert shape.parameter_numels() == numels, name


@pytest.mark.parametrize("name", sorted(REAL))
def test_published_shapes(name):
    family, kwargs, total, largest = REAL[name]
    shape = ModelShape.from_config({"model_type": family, **kwargs}, name)
    assert (shape.total_params(), shape.largest_module_params()) == (total, largest)


def test_bad_configs_name_the_file_and_the_fix(tmp_path):
    with pytest.raises(TrainfleetError, match="model_type 'bert' is not one"):
        ModelShape.from_config({"model_type": "bert", **TINY}, "x/config.json")
    with pytest.raises(TrainfleetError, match="no integer hidden_size"):
        ModelShape.from_config({"model_type": "llama", **TINY, "hidden_size": "64"})
    with pytest.raises(TrainfleetError, match="nothing is downloaded"):
        ModelShape.from_path(tmp_path / "meta-llama" / "Llama-2-70b-hf")
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(TrainfleetError, match="not JSON"):
        ModelShape.from_path(tmp_path)


def test_deepspeed_doc_examples_t5_3b():
    """memory.rst's ZeRO-3 table for t5-3b (printed as P=2851M, largest layer 32M: exactly
    2,851,598,336 and its 32128 x 1024 embedding), 1 node x 8 GPUs, in GiB."""
    gib = 2**30
    cases = [
        (True, True, True, 71.71, 0.12),
        (True, True, False, 127.48, 0.12),
        (True, False, True, 63.74, 0.79),
        (True, False, False, 127.48, 0.79),
        (False, False, True, 1.47, 6.10),
        (False, False, False, 127.48, 6.10),
    ]
    for optimizer, params, zero_init, cpu, gpu in cases:
        got = zero3_model_states(
            2_851_598_336,
            32_128 * 1024,
            gpus_per_node=8,
            nodes=1,
            offload_optimizer=optimizer,
            offload_params=params,
            zero_init=zero_init,
        )
        assert (round(got[0] / gib, 2), round(got[1] / gib, 2)) == (cpu, gpu)


REFERENCE = """
import json, os, sys
os.environ["DS_ACCELERATOR"] = "cpu"
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs as z2
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs as z3
out = []
for p, ll, g, n in json.loads(sys.argv[1]):
    for off in (True, False):
        out.append(["z2", p, ll, g, n, off, None, None, list(z2(p, g, n, off))])
    for oo, op, zi in [(1, 1, 1), (1, 1, 0), (1, 0, 1), (1, 0, 0), (0, 0, 1), (0, 0, 0)]:
        got = list(z3(p, ll, g, n, oo, op, zi))[:2]
        out.append(["z3", p, ll, g, n, bool(oo), bool(op), bool(zi), got])
print(json.dumps(out))
"""


@pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed"
)
def test_reproduction_equals_deepspeeds_own_functions():
    grid = [
        [p, ll, g, n]
        for (p, ll), g, n in itertools.product(
            [(2_851_000_000, 32_000_000), (68_976_648_192, 262_144_000), (1_234_567, 8_901)],
            [1, 8],
            [1, 2, 4],
        )
    ]
    done = subprocess.run(
        [sys.executable, "-c", REFERENCE, json.dumps(grid)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for kind, p, ll, g, n, opt, params, zero_init, want in json.loads(done.stdout):
        if kind == "z2":
            got = zero2_model_states(p, gpus_per_node=g, nodes=n, offload_optimizer=opt)
        else:
            got = zero3_model_states(
                p,
                ll,
                gpus_per_node=g,
                nodes=n,
                offload_optimizer=opt,
                offload_params=params,
                zero_init=zero_init,
            )
        assert list(got) == want, (kind, p, g, n, opt, params, zero_init)


@pytest.mark.skipif(
    importlib.util.find_spec("accelerate") is None, reason="accelerate is not installed"
)
def test_accelerate_reproduction_equals_accelerates_own_function():
    from accelerate.commands.estimate import estimate_training_usage

    for params in (1_234_567, 8_030_261_248):
        for ours, theirs in (("fp32", "float32"), ("bf16", "bfloat16"), ("fp16", "float16")):
            sizes = estimate_training_usage(4 * params, theirs)
            assert accelerate_training_bytes(params, ours) == max(sizes.values()), (params, ours)
