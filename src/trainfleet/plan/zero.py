"""Model-state bytes per rank under DeepSpeed ZeRO 0/1/2/3, to the byte, as DeepSpeed lays them
out (params in the training dtype, an fp32 master copy, Adam's two fp32 states).

    >>> states = zero_model_states([1000, 7], stage=3, ranks=2)
    >>> states.params_bytes, states.master_bytes, states.optimizer_bytes
    (1008, 2016, 4032)

Layout rules (DeepSpeed 0.19.8, checked against a real engine by tests/unit/test_plan_zero.py):
- ZeRO-0 with bf16/fp16 (DeepSpeed's FP16_Optimizer): one flat 16-bit copy and one flat fp32
  master copy of all params, Adam's states for all of them, no padding.
- ZeRO-1/2: one flat 16-bit buffer of all params on every rank, padded to a multiple of
  2 x ranks elements (`nccl_start_alignment_factor` = 2); each rank's fp32 master and Adam
  states cover 1/ranks of the padded buffer.
- ZeRO-3: each parameter is partitioned on its own, ceil(numel / ranks) elements per rank; the
  16-bit partition, the fp32 master and Adam's states all have that size.
- fp32 training keeps the same layout with 4-byte params: DeepSpeed still clones an fp32 master
  partition from them.
- Offloading the optimizer moves the master copy and Adam's states to CPU RAM (same sizes);
  offloading params (ZeRO-3) moves the param partition too.
Gradients, buckets and activations: `memory.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trainfleet.errors import TrainfleetError

BIT16 = 2
FP32 = 4
ADAM_STATES = 2
ALIGNMENT = 2
"""DeepSpeed's nccl_start_alignment_factor: partitions start on 4-byte boundaries of 16-bit."""


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelStates:
    """Bytes one rank holds; `*_on_cpu` says where offloading put them."""

    params_bytes: int
    master_bytes: int
    optimizer_bytes: int
    params_on_cpu: bool = False
    optimizer_on_cpu: bool = False

    @property
    def gpu_bytes(self) -> int:
        return (0 if self.params_on_cpu else self.params_bytes) + (
            0 if self.optimizer_on_cpu else self.master_bytes + self.optimizer_bytes
        )

    @property
    def cpu_bytes(self) -> int:
        return self.total_bytes - self.gpu_bytes

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.master_bytes + self.optimizer_bytes


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def partition_elements(numels: Sequence[int], *, stage: int, ranks: int) -> tuple[int, int]:
    """(param elements on a rank, fp32 elements of its partition)."""
    if stage == 0:
        return sum(numels), sum(numels)
    if stage in (1, 2):
        padded = ceil_div(sum(numels), ALIGNMENT * ranks) * ALIGNMENT * ranks
        return padded, padded // ranks
    if stage == 3:
        share = sum(ceil_div(n, ranks) for n in numels)
        return share, share
    raise TrainfleetError(f"ZeRO stage {stage} does not exist", "use 0, 1, 2 or 3")


def zero_model_states(
    numels: Sequence[int],
    *,
    stage: int,
    ranks: int,
    offload_optimizer: bool = False,
    offload_params: bool = False,
    param_bytes: int = BIT16,
) -> ModelStates:
    """`param_bytes`: 2 for bf16/fp16 training, 4 for fp32."""
    if offload_params and stage != 3:
        raise TrainfleetError(
            "offloading params needs ZeRO-3", "use --zero 3, or offload the optimizer only"
        )
    if offload_optimizer and stage == 0:
        raise TrainfleetError(
            "offloading the optimizer needs ZeRO 1, 2 or 3", "use --zero 1 or higher"
        )
    bit16, fp32 = partition_elements(numels, stage=stage, ranks=ranks)
    return ModelStates(
        params_bytes=bit16 * param_bytes,
        master_bytes=fp32 * FP32,
        optimizer_bytes=fp32 * FP32 * ADAM_STATES,
        params_on_cpu=offload_params,
        optimizer_on_cpu=offload_optimizer,
    )
