"""`trainfleet plan`: memory per GPU and CPU RAM per node for a model and config, beside
DeepSpeed's own estimate, and the configs that fit ranked by estimated step time.

    >>> from trainfleet.plan.model import ModelShape
    >>> from trainfleet.plan.search import Target
    >>> from trainfleet.plan.speed import Links
    >>> shape = ModelShape.from_config({"model_type": "llama", "vocab_size": 32000,
    ...     "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    ...     "num_attention_heads": 32})
    >>> target = Target(nodes=1, gpus_per_node=8, gpu_memory_bytes=80 * 2**30,
    ...     cpu_memory_bytes=None, links=Links(peak_flops=989e12, busbw=150e9))
    >>> plan = make_plan(shape, TrainSetup(zero=3), target, global_batch=64)
    >>> plan.requested.fits
    True

Modules: `model` (parameter counts from config.json), `zero` (model states to the byte),
`activations` (saved-for-backward bytes per layer, logits), `cpu_memory` (host RAM while
loading), `memory` (the per-GPU and per-node sums), `speed` (step time), `search` (the ranked
configs), `estimators` (DeepSpeed's and Accelerate's estimators), `ds_config` (the JSON to run).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainfleet.plan.estimators import (
    accelerate_training_bytes,
    zero2_model_states,
    zero3_model_states,
)
from trainfleet.plan.memory import TrainSetup
from trainfleet.plan.model import ModelShape
from trainfleet.plan.search import Candidate, Target, check_global_batch, evaluate, explain, search

__all__ = ["Plan", "TrainSetup", "make_plan"]


@dataclass(kw_only=True, slots=True, frozen=True)
class Plan:
    shape: ModelShape
    target: Target
    global_batch: int
    requested: Candidate
    ranked: list[Candidate]
    deepspeed_estimate: tuple[float, float] | None
    """DeepSpeed's estimator for the requested stage and offload: (CPU bytes per node, GPU
    bytes per GPU); None for ZeRO-0/1, which it has no estimator for."""
    accelerate_estimate: int
    """`accelerate estimate-memory`'s training figure: the whole model on one GPU."""

    @property
    def best(self) -> Candidate | None:
        return self.ranked[0] if self.ranked and self.ranked[0].fits else None


def deepspeed_estimate(
    shape: ModelShape, setup: TrainSetup, target: Target
) -> tuple[float, float] | None:
    params = shape.total_params()
    if setup.zero == 2:
        return zero2_model_states(
            params,
            gpus_per_node=target.gpus_per_node,
            nodes=target.nodes,
            offload_optimizer=setup.offload != "none",
        )
    if setup.zero == 3:
        return zero3_model_states(
            params,
            shape.largest_module_params(),
            gpus_per_node=target.gpus_per_node,
            nodes=target.nodes,
            offload_optimizer=setup.offload != "none",
            offload_params=setup.offload == "all",
            zero_init=True,
        )
    return None


def make_plan(shape: ModelShape, setup: TrainSetup, target: Target, *, global_batch: int) -> Plan:
    check_global_batch(setup, target, global_batch)
    ranked = search(shape, setup, target, global_batch=global_batch)
    best = ranked[0] if ranked and ranked[0].fits else None
    requested = evaluate(shape, setup, target, global_batch=global_batch)
    return Plan(
        shape=shape,
        target=target,
        global_batch=global_batch,
        requested=replace(requested, reason=explain(requested, best, target)),
        ranked=ranked,
        deepspeed_estimate=deepspeed_estimate(shape, setup, target),
        accelerate_estimate=accelerate_training_bytes(shape.total_params(), setup.precision),
    )
