"""Estimated time per optimizer step: compute from FLOPs at an assumed utilisation,
communication from the bytes ZeRO moves over the cluster's slowest collective bandwidth.

    >>> from trainfleet.plan.model import ModelShape
    >>> from trainfleet.plan.memory import TrainSetup
    >>> shape = ModelShape.from_config({"model_type": "llama", "vocab_size": 32000,
    ...     "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    ...     "num_attention_heads": 32})
    >>> links = Links(peak_flops=989e12, busbw=50e9)
    >>> t = step_time(shape, TrainSetup(zero=3), links, nodes=2, gpus_per_node=8,
    ...     global_batch=64)
    >>> t.accumulation, t.step_s > t.compute_s
    (4, True)

Compute: model FLOPs per token = 6 N + 12 L a d s (PaLM appendix B, as torchtitan counts it),
N = every parameter a token's matmuls touch: the layers and the output projection, not the
input embedding (a lookup). Gradient checkpointing runs the forward twice: 8 N instead of 6 N of
hardware FLOPs. LoRA skips the frozen weights' gradients: 4 N. Time = FLOPs / (peak x mfu),
mfu assumed (default 0.4; published FSDP/Megatron runs reach 0.4-0.6, research B2).

Communication per optimizer step, S = bytes of the 16-bit params (trainable for gradients),
ring factors from nccl-tests (all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n):
- ZeRO-0/1: one all_reduce of the gradients at the accumulation boundary (ZeRO-1: a
  reduce_scatter then an all_gather of the updated params: the same volume);
- ZeRO-2: a reduce_scatter every micro step, an all_gather after the step;
- ZeRO-3: per micro step an all_gather in forward, one in backward (one more when checkpointing
  recomputes the forward) and a reduce_scatter of the gradients.
Overlap: DeepSpeed overlaps ZeRO-2/3 collectives with backward when `overlap_comm` is on (what
`train` writes), so their step is max(compute, comm); ZeRO-0/1 reduce after backward:
compute + comm. Offload adds what cannot overlap: gradients to and params from CPU RAM over
PCIe, and CPU-Adam's update (an assumed rate, stated in `Links`).
These are estimates to rank configs against each other, not a promise of tokens/s.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainfleet.errors import TrainfleetError
from trainfleet.plan.memory import TrainSetup, trainable_numels
from trainfleet.plan.model import ModelShape
from trainfleet.plan.zero import partition_elements


@dataclass(kw_only=True, slots=True, frozen=True)
class Links:
    """What the step-time estimate assumes; every field is printed with the plan."""

    peak_flops: float
    """Dense 16-bit FLOP/s of one GPU."""
    busbw: float
    """Collective bus bandwidth across all ranks, bytes/s (between nodes: about the node's
    NIC bandwidth; `trainfleet commtest` measures it)."""
    mfu: float = 0.4
    pcie: float = 25e9
    """Host <-> GPU bytes/s per GPU (PCIe 4 x16 in practice)."""
    cpu_adam_rate: float = 1e9
    """Parameter updates/s per node by DeepSpeed's CPU-Adam (assumed, not measured here)."""

    def __post_init__(self) -> None:
        if not 0 < self.mfu <= 1:
            raise TrainfleetError(f"mfu {self.mfu}", "a fraction of peak: 0 < mfu <= 1")
        for name in ("peak_flops", "busbw", "pcie", "cpu_adam_rate"):
            if getattr(self, name) <= 0:
                raise TrainfleetError(f"{name} must be positive", "")


@dataclass(kw_only=True, slots=True, frozen=True)
class StepTime:
    accumulation: int
    compute_s: float
    comm_s: float
    offload_s: float
    step_s: float
    tokens_per_s: float


def compute_params(shape: ModelShape) -> int:
    """N in 6N: the layers, the final norm and the output projection (tied or not)."""
    return shape.total_params() - (0 if shape.tie_word_embeddings else shape.embedding_params())


def flops_per_token(shape: ModelShape, seq_len: int) -> float:
    """Model FLOPs (what MFU counts): 6 N + 12 L a d s."""
    attention = 12 * shape.num_layers * shape.num_heads * shape.head_dim * seq_len
    return 6 * compute_params(shape) + attention


def step_time(
    shape: ModelShape,
    setup: TrainSetup,
    links: Links,
    *,
    nodes: int,
    gpus_per_node: int,
    global_batch: int,
) -> StepTime:
    ranks = nodes * gpus_per_node
    accumulation = max(1, global_batch // (setup.micro_batch * ranks))
    tokens_per_gpu = setup.micro_batch * setup.seq_len * accumulation

    model_flops = flops_per_token(shape, setup.seq_len)
    dense = 6 * compute_params(shape)
    passes = 6 if not setup.lora_rank else 4  # LoRA: no weight gradients for frozen weights
    hardware = dense * (passes + (2 if setup.grad_ckpt else 0)) / 6 + (model_flops - dense)
    compute = tokens_per_gpu * hardware / (links.peak_flops * links.mfu)

    all_params = sum(shape.parameter_numels()) * setup.param_bytes
    trainable = sum(trainable_numels(shape, setup)) * setup.param_bytes
    ring = (ranks - 1) / ranks if ranks > 1 else 0.0
    if setup.zero <= 1:
        moved = 2 * ring * trainable
    elif setup.zero == 2:
        moved = accumulation * ring * trainable + ring * trainable
    else:
        gathers = 3 if setup.grad_ckpt else 2
        moved = accumulation * ring * (gathers * all_params + trainable)
    comm = moved / links.busbw

    offload = 0.0
    if setup.offload != "none":
        _, partition = partition_elements(
            trainable_numels(shape, setup), stage=setup.zero, ranks=ranks
        )
        transfers = 2 * partition * setup.param_bytes  # gradients down, updated params up
        if setup.offload == "all":  # each gather first brings this rank's partition up
            params, _ = partition_elements(shape.parameter_numels(), stage=3, ranks=ranks)
            gathers = 3 if setup.grad_ckpt else 2
            transfers += accumulation * gathers * params * setup.param_bytes
        offload = transfers / links.pcie + partition * gpus_per_node / links.cpu_adam_rate

    overlapped = setup.zero >= 2
    step = (max(compute, comm) if overlapped else compute + comm) + offload
    return StepTime(
        accumulation=accumulation,
        compute_s=compute,
        comm_s=comm,
        offload_s=offload,
        step_s=step,
        tokens_per_s=tokens_per_gpu * ranks / step,
    )
