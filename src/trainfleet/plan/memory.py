"""Memory per GPU and CPU RAM per node for one training config: every term named.

    >>> from trainfleet.plan.model import ModelShape
    >>> shape = ModelShape.from_config({"model_type": "llama", "vocab_size": 32000,
    ...     "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    ...     "num_attention_heads": 32})
    >>> gpu = gpu_memory(shape, TrainSetup(zero=3, seq_len=4096), ranks=16)
    >>> round(gpu.total_bytes / 2**30, 1) > round(gpu.params_bytes / 2**30, 1)
    True

The peak per GPU is the larger of two moments, because activations are gone by the time the
optimizer steps:

    total = params + optimizer + max(backward, step) + context + margin
    backward = grads + activations + logits + buffers       (start of backward)
    step     = grads + step temporaries                     (optimizer step)

- params, optimizer: `zero.zero_model_states` (exact, checked against DeepSpeed engines).
- grads, from DeepSpeed 0.19.8's code: ZeRO-0/1 keep every param's 16-bit `.grad` until the
  step (ZeRO-1 reduces at the accumulation boundary); ZeRO-2 copies each reduced gradient into
  its own partition (`grads_in_partition`, 16-bit); ZeRO-3 keeps a flat 16-bit partition buffer
  (`grad_partitions_flat_buffer`). With the optimizer offloaded the partition lives in CPU RAM.
- buffers: the reduce bucket (`reduce_bucket_size` elements, twice with `overlap_comm`);
  ZeRO-3 also the gathered working set (the largest module plus the prefetch bucket, capped by
  `stage3_max_live_parameters`) and the persistent small params (numel <= threshold) held
  whole on every rank.
- step temporaries: the fp32 copy of this rank's gradient partition the optimizer reads
  (ZeRO-0: of every gradient; ZeRO-3: one `sub_group_size` group at a time).
- activations, logits: `activations.py` (checked against saved-tensor hooks).
- context: CUDA context, kernels and NCCL's buffers, a stated constant (1-2 GB are reported,
  see research A1.3); margin: the caching allocator's fragmentation, a stated fraction.
Grads, buffers, context and margin are read from DeepSpeed's code and public reports; they
are not yet measured on a GPU by this project (a lent GPU runs that check).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainfleet.errors import TrainfleetError
from trainfleet.plan import activations, cpu_memory
from trainfleet.plan.model import ModelShape
from trainfleet.plan.zero import ModelStates, partition_elements, zero_model_states

CONTEXT_BYTES = 3 * 2**29
"""1.5 GiB per GPU: CUDA context and kernels (HF measured 1.3 GB on a V100) plus NCCL."""
FRAGMENTATION = 0.05
"""Of the allocated peak: what PyTorch's caching allocator reserves beyond it."""
PROCESS_BYTES = 2**30
"""Host RAM per rank for the runtime itself (Python, torch, CUDA, NCCL, DeepSpeed), stated: on
this project's CPU-only venv it measured 270 MiB; CUDA's host side adds to it."""
SMALLEST_BUCKET = 10**7
PRECISIONS = {"bf16": 2, "fp16": 2, "fp32": 4}
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
OFFLOADS = ("none", "optimizer", "all")
LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


@dataclass(kw_only=True, slots=True, frozen=True)
class TrainSetup:
    """What the planner varies; DeepSpeed knobs default to what `train` writes (HF's 'auto')."""

    zero: int = 3
    """ZeRO stage, 0-3."""
    offload: str = "none"
    """none, optimizer (master + Adam states + fp32 grads to CPU), all (also params; ZeRO-3)."""
    micro_batch: int = 1
    """Sequences per GPU per forward."""
    seq_len: int = 4096
    grad_ckpt: bool = False
    """HF gradient checkpointing: each layer keeps its input, recomputes the rest."""
    precision: str = "bf16"
    lora_rank: int = 0
    """0: full fine-tuning; else LoRA adapters of this rank on every linear of each layer."""
    reduce_bucket: int | None = None
    """Elements; None: hidden_size^2 (HF's auto), at least 1e7 so that small models reduce in
    a few collectives (measured on a 0.8M-param model: 28 reduce-scatters per step -> 1)."""
    prefetch_bucket: int | None = None
    """ZeRO-3 elements; None: 0.9 x hidden_size^2 (HF's auto), at least 1e7."""
    persistence_threshold: int | None = None
    """ZeRO-3: params this small stay whole on every rank; None: the larger of HF's auto
    (10 x hidden_size) and DeepSpeed's default (1e5), so that small models are not gathered
    tensor by tensor."""
    max_live_parameters: int = 10**9
    sub_group_size: int = 10**9

    def __post_init__(self) -> None:
        if self.zero not in (0, 1, 2, 3):
            raise TrainfleetError(f"zero: {self.zero} is not a ZeRO stage", "use 0, 1, 2 or 3")
        if self.offload not in OFFLOADS:
            raise TrainfleetError(f"offload: {self.offload!r}", f"use one of {', '.join(OFFLOADS)}")
        if self.offload == "all" and self.zero != 3:
            raise TrainfleetError("offload: all (params too) needs ZeRO-3", "use --zero 3")
        if self.offload == "optimizer" and self.zero == 0:
            raise TrainfleetError("offload: optimizer needs ZeRO 1-3", "use --zero 1 or higher")
        if self.precision not in PRECISIONS:
            raise TrainfleetError(
                f"precision: {self.precision!r}", f"use one of {', '.join(PRECISIONS)}"
            )
        for name in ("micro_batch", "seq_len"):
            if getattr(self, name) < 1:
                raise TrainfleetError(f"{name}: {getattr(self, name)}", "it must be at least 1")
        if self.lora_rank < 0:
            raise TrainfleetError("lora_rank: must be 0 (full fine-tuning) or more", "")

    def buckets(self, hidden_size: int) -> tuple[int, int, int]:
        """(reduce bucket, ZeRO-3 prefetch bucket, persistence threshold) in elements."""
        h = hidden_size
        return (
            self.reduce_bucket if self.reduce_bucket is not None else max(h * h, SMALLEST_BUCKET),
            self.prefetch_bucket
            if self.prefetch_bucket is not None
            else max(h * h * 9 // 10, SMALLEST_BUCKET),
            self.persistence_threshold
            if self.persistence_threshold is not None
            else max(10 * h, 10**5),
        )

    @property
    def param_bytes(self) -> int:
        return PRECISIONS[self.precision]

    @property
    def overlap_comm(self) -> bool:
        """What `train` writes: on for ZeRO 2-3 (DeepSpeed's default is on for 3 only)."""
        return self.zero >= 2


@dataclass(kw_only=True, slots=True, frozen=True)
class GpuMemory:
    """Bytes on one GPU; `total_bytes` is the peak (see the module docstring)."""

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    logits_bytes: int
    buffers_bytes: int
    step_bytes: int
    context_bytes: int
    margin_bytes: int
    total_bytes: int


@dataclass(kw_only=True, slots=True, frozen=True)
class CpuMemory:
    """Bytes of host RAM on one node."""

    offload_bytes: int
    """Offloaded states of this node's ranks (pinned), held for the whole run."""
    loading_bytes: int
    """Peak while `from_pretrained` runs on every rank of the node."""
    loading_without_zero_init_bytes: int
    process_bytes: int
    """The node's ranks' runtime (`PROCESS_BYTES` each), stated."""
    cpu_peak_bytes: int


def lora_numels(shape: ModelShape, rank: int) -> list[int]:
    """Adapter tensors (A: rank x in, B: out x rank) on each of the layer's seven linears."""
    h, inter = shape.hidden_size, shape.intermediate_size
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    linears = [(h, q), (h, kv), (h, kv), (q, h), (h, inter), (h, inter), (inter, h)]
    return [n for fan_in, fan_out in linears for n in (rank * fan_in, fan_out * rank)] * (
        shape.num_layers
    )


def model_states(shape: ModelShape, setup: TrainSetup, *, ranks: int) -> ModelStates:
    """Trainable states (every param, or LoRA's adapters) plus the frozen base's 16-bit copy."""
    offload = {
        "offload_optimizer": setup.offload != "none",
        "offload_params": setup.offload == "all",
    }
    if not setup.lora_rank:
        return zero_model_states(
            shape.parameter_numels(),
            stage=setup.zero,
            ranks=ranks,
            param_bytes=setup.param_bytes,
            **offload,
        )
    adapters = zero_model_states(
        lora_numels(shape, setup.lora_rank),
        stage=setup.zero,
        ranks=ranks,
        param_bytes=setup.param_bytes,
        **offload,
    )
    # Frozen params are outside the optimizer: whole on every rank, except that ZeRO-3
    # partitions every param of the model.
    frozen, _ = partition_elements(
        shape.parameter_numels(), stage=3 if setup.zero == 3 else 0, ranks=ranks
    )
    return ModelStates(
        params_bytes=adapters.params_bytes + frozen * setup.param_bytes,
        master_bytes=adapters.master_bytes,
        optimizer_bytes=adapters.optimizer_bytes,
        params_on_cpu=adapters.params_on_cpu,
        optimizer_on_cpu=adapters.optimizer_on_cpu,
    )


def trainable_numels(shape: ModelShape, setup: TrainSetup) -> list[int]:
    """The tensors the optimizer updates: every param, or LoRA's adapters."""
    if setup.lora_rank:
        return lora_numels(shape, setup.lora_rank)
    return shape.parameter_numels()


def gpu_memory(shape: ModelShape, setup: TrainSetup, *, ranks: int) -> GpuMemory:
    grad_bytes = setup.param_bytes
    trainable = trainable_numels(shape, setup)
    elements, partition = partition_elements(trainable, stage=setup.zero, ranks=ranks)
    states = model_states(shape, setup, ranks=ranks)
    offloaded = setup.offload != "none"

    if setup.zero <= 1:
        grads = sum(trainable) * grad_bytes
    else:
        grads = 0 if offloaded else partition * grad_bytes

    reduce_bucket, prefetch, threshold = setup.buckets(shape.hidden_size)
    buffers = reduce_bucket * grad_bytes * (2 if setup.overlap_comm else 1)
    if setup.zero == 3:
        gathered = min(shape.largest_module_params() + prefetch, setup.max_live_parameters)
        persistent = sum(n for n in shape.parameter_numels() if n <= threshold)
        buffers += (gathered + persistent) * setup.param_bytes
    if setup.zero == 0:
        step = elements * 4
    elif offloaded:
        step = 0  # the fp32 gradient partition is in CPU RAM, where CPU-Adam reads it
    elif setup.zero == 3:
        step = min(setup.sub_group_size, partition) * 4
    else:
        step = partition * 4

    dtype_bytes = setup.param_bytes
    acts = activations.activation_bytes(
        shape,
        seq_len=setup.seq_len,
        micro_batch=setup.micro_batch,
        dtype_bytes=dtype_bytes,
        grad_ckpt=setup.grad_ckpt,
    )
    logits = activations.logits_bytes(
        shape, seq_len=setup.seq_len, micro_batch=setup.micro_batch, dtype_bytes=dtype_bytes
    )
    params_on_gpu = 0 if states.params_on_cpu else states.params_bytes
    optimizer_on_gpu = (
        0 if states.optimizer_on_cpu else states.master_bytes + states.optimizer_bytes
    )
    allocated = params_on_gpu + optimizer_on_gpu + grads + max(acts + logits + buffers, step)
    margin = int(allocated * FRAGMENTATION)
    return GpuMemory(
        params_bytes=params_on_gpu,
        grads_bytes=grads,
        optimizer_bytes=optimizer_on_gpu,
        activations_bytes=acts,
        logits_bytes=logits,
        buffers_bytes=buffers,
        step_bytes=step,
        context_bytes=CONTEXT_BYTES,
        margin_bytes=margin,
        total_bytes=allocated + CONTEXT_BYTES + margin,
    )


def loading_casts(shape: ModelShape, setup: TrainSetup) -> bool:
    """Whether `from_pretrained` converts every tensor (a new copy per rank): the checkpoint's
    dtype is not the training dtype, or config.json does not say (assume the costly case)."""
    return shape.checkpoint_dtype != TORCH_DTYPES[setup.precision]


def cpu_memory_per_node(
    shape: ModelShape, setup: TrainSetup, *, ranks: int, ranks_per_node: int
) -> CpuMemory:
    """Offloaded states are allocated at `deepspeed.initialize`, after loading has freed its
    buffers, so the node's peak is the larger of the two, not their sum, plus each rank's
    runtime. The page cache holding the mmap'd checkpoint is not counted: the kernel drops it
    under pressure."""
    states = model_states(shape, setup, ranks=ranks)
    _, partition = partition_elements(trainable_numels(shape, setup), stage=setup.zero, ranks=ranks)
    per_rank = states.cpu_bytes + (partition * 4 if setup.offload != "none" else 0)
    loading = {
        zero_init: cpu_memory.node_loading_peak_bytes(
            shape,
            ranks_per_node=ranks_per_node,
            ranks=ranks,
            zero_init=zero_init,
            load_dtype_bytes=setup.param_bytes,
            dtype_cast=loading_casts(shape, setup),
            zero_params_on="offload" if setup.offload == "all" else "gpu",
        )
        for zero_init in (True, False)
    }
    # `train` builds the model under zero.Init (HfDeepSpeedConfig first) with ZeRO-3 only.
    loading_now = loading[setup.zero == 3]
    offload = per_rank * ranks_per_node
    processes = PROCESS_BYTES * ranks_per_node
    return CpuMemory(
        offload_bytes=offload,
        loading_bytes=loading_now,
        loading_without_zero_init_bytes=loading[False],
        process_bytes=processes,
        cpu_peak_bytes=processes + max(offload, loading_now),
    )
