"""ZeRO model states per rank, predicted to the byte and measured on real DeepSpeed engines:
3 local ranks over gloo on CPU (torchrun, DS_ACCELERATOR=cpu), ZeRO 0-3 in bf16 and 2-3 in fp32,
shapes whose sizes do not divide evenly, so that every padding rule shows."""

from __future__ import annotations

import importlib.util
import json

import pytest
from torchrun_result import torchrun_result

from trainfleet.errors import TrainfleetError
from trainfleet.plan.model import ModelShape
from trainfleet.plan.zero import zero_model_states

pytestmark = pytest.mark.unit

CASES = {
    # 220,286 params: not a multiple of 2 x 3 (ZeRO-1/2 padding), odd tensors (ZeRO-3).
    "llama-odd": (
        "llama",
        {
            "vocab_size": 1001,
            "hidden_size": 62,
            "intermediate_size": 175,
            "num_hidden_layers": 2,
            "num_attention_heads": 1,
            "num_key_value_heads": 1,
        },
    ),
    "qwen2-biases": (
        "qwen2",
        {
            "vocab_size": 1003,
            "hidden_size": 64,
            "intermediate_size": 171,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "tie_word_embeddings": False,
        },
    ),
}
RANKS = 3
STAGES = [(0, "bf16"), (1, "bf16"), (2, "bf16"), (3, "bf16"), (2, "fp32"), (3, "fp32")]


def test_the_layout_rules():
    assert zero_model_states([1000, 7], stage=3, ranks=2).params_bytes == (500 + 4) * 2
    assert zero_model_states([1001], stage=1, ranks=3).params_bytes == 1002 * 2  # 6 | 1002
    offloaded = zero_model_states([600], stage=3, ranks=2, offload_optimizer=True)
    assert (offloaded.gpu_bytes, offloaded.cpu_bytes) == (600, 300 * 4 * 3)
    with pytest.raises(TrainfleetError, match="needs ZeRO-3"):
        zero_model_states([600], stage=2, ranks=2, offload_params=True)


@pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None
    or importlib.util.find_spec("transformers") is None,
    reason="needs deepspeed and transformers (make venv installs them)",
)
def test_prediction_equals_what_real_zero_engines_hold_to_the_byte():
    measured = torchrun_result(
        "zero_states.py",
        [json.dumps(CASES)],
        ranks=RANKS,
        env={"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"},
    )
    for name, (family, kwargs) in CASES.items():
        numels = ModelShape.from_config({"model_type": family, **kwargs}, name).parameter_numels()
        for stage, precision in STAGES:
            param_bytes = 2 if precision == "bf16" else 4
            predicted = zero_model_states(numels, stage=stage, ranks=RANKS, param_bytes=param_bytes)
            got = measured[f"{name}/{stage}/{precision}"]
            want = [predicted.params_bytes, predicted.master_bytes, predicted.optimizer_bytes]
            assert got == want, (name, stage, precision)
