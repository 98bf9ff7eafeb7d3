"""The DeepSpeed JSON for a planned config: what `plan --emit-deepspeed` writes and `train` reads.

    >>> config = deepspeed_config(TrainSetup(zero=2, micro_batch=2), hidden_size=64,
    ...     accumulation=4, ranks=8)
    >>> config["train_batch_size"], config["zero_optimization"]["reduce_bucket_size"]
    (64, 10000000)

Bucket sizes are the values HF's `auto` would fill in (transformers' `trainer_config_finalize`:
reduce bucket hidden^2, ZeRO-3 prefetch 0.9 hidden^2, persistence threshold 10 hidden), raised
to floors for small models (`TrainSetup.buckets`), written
out so the file works with DeepSpeed alone and the planner's buffers match what runs. The
optimizer's hyperparameters are `auto`: HF Trainer (and `trainfleet train`) fill them from the
training arguments. Gradient checkpointing is a model setting, not DeepSpeed's: it is in the
plan's output, not in this file.
"""

from __future__ import annotations

from typing import Any

from trainfleet.plan.memory import TrainSetup


def deepspeed_config(
    setup: TrainSetup, *, hidden_size: int, accumulation: int, ranks: int
) -> dict[str, Any]:
    reduce_bucket, prefetch, threshold = setup.buckets(hidden_size)
    zero: dict[str, Any] = {
        "stage": setup.zero,
        "overlap_comm": setup.overlap_comm,
        "contiguous_gradients": True,
        "reduce_bucket_size": reduce_bucket,
    }
    if setup.offload != "none":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if setup.offload == "all":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if setup.zero == 3:
        zero.update(
            {
                "stage3_prefetch_bucket_size": prefetch,
                "stage3_param_persistence_threshold": threshold,
                "stage3_max_live_parameters": setup.max_live_parameters,
                "sub_group_size": setup.sub_group_size,
                # the consolidated 16-bit weights for an HF export at the end
                "stage3_gather_16bit_weights_on_model_save": True,
            }
        )
    return {
        "train_batch_size": setup.micro_batch * accumulation * ranks,
        "train_micro_batch_size_per_gpu": setup.micro_batch,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": setup.precision == "bf16"},
        "fp16": {"enabled": setup.precision == "fp16"},
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        },
        "zero_optimization": zero,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
