"""Host RAM one rank gains while `AutoModelForCausalLM.from_pretrained` loads a safetensors
checkpoint, and a node's total, as transformers 5.23 and DeepSpeed 0.19.8 load it (measured by
tests/unit/test_plan_cpu_memory.py on real processes).

    >>> shape = ModelShape.from_config({"model_type": "llama", "vocab_size": 32000,
    ...     "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    ...     "num_attention_heads": 32, "num_key_value_heads": 32})
    >>> gib = lambda n: round(n / 2**30, 1)
    >>> gib(loading_peak_bytes(shape, ranks=8, zero_init=False))  # a fp16/fp32 file loaded as bf16
    12.6
    >>> gib(loading_peak_bytes(shape, ranks=8, zero_init=False, dtype_cast=False))
    0.0
    >>> gib(node_loading_peak_bytes(shape, ranks_per_node=8, ranks=8, zero_init=False))
    100.4
    >>> gib(loading_peak_bytes(shape, ranks=8, zero_init=True, zero_params_on="cpu"))
    2.1

The figure is anonymous memory (RssAnon): what the kernel cannot drop without swap, so what
takes a host down when every rank of a node holds it. Not in it:
- the page cache. Safetensors are mmap'd (`safe_open(..., backend="mmap")` in modeling_utils.py
  `_load_pretrained_model`); their pages are file-backed, shared by every rank of the node that
  reads the same file (one copy of the checkpoint per node, however many ranks) and dropped by
  the kernel under pressure, since they can be read again.
- the per-process runtime: importing torch, deepspeed and transformers (with the model's
  modeling module) and joining the process group cost ~270 MiB of anonymous memory per process
  in this project's venv, model or no model. That is a baseline, measured before loading starts.
- what glibc keeps after a free (see ZeRO-3 on CPU below).

Without zero.Init, transformers 5 builds the model on the meta device (`get_init_context`
appends `torch.device("meta")`), so nothing is allocated or initialised before loading. Each
checkpoint tensor then goes through `_materialize_copy` (core_model_loading.py): `tensor[...]`
on a safetensors slice is a view of the mmap, and `.to(dtype)` copies only when the dtype
differs; `set_param_for_module` wraps the result in a Parameter without copying. So:
- no cast (the checkpoint's dtype is the load dtype; transformers 5's default `dtype="auto"`):
  the parameters stay views of the mmap'd file. Measured: under 4 MiB per rank for a 650 MiB
  fp32 checkpoint loaded as fp32, all of it per-process bookkeeping.
- a cast (a fp16 or fp32 checkpoint loaded with `dtype=torch.bfloat16`): every parameter is new
  memory, total_params x load_dtype_bytes per rank, all kept (it is the model). This is the
  `ranks_per_node x model` host OOM of DeepSpeed #5290 and DeepSpeedExamples #498.

With zero.Init (a `HfDeepSpeedConfig` holding a stage-3 config alive before `from_pretrained`),
`get_init_context` wraps the model's construction in `deepspeed.zero.Init`: each module's
parameters are made whole, then cut to this rank's partition (`_post_init_method`,
partition_parameters.py). Loading (`_load_state_dict_into_zero3_model`, integrations/deepspeed.py)
then walks the modules: every rank gathers the module's parameters (`GatheredParameters(...,
modifier_rank=0)`), rank 0 alone copies the checkpoint values in (it reads the state dict from
the mmap, so its extra is page cache, not anonymous memory; the others read only shapes, on the
meta device), and the exit broadcasts and re-partitions. Per rank, worst rank = every rank:
- partitions: sum over parameters of ceil(numel / ranks) elements (`zero.partition_elements`),
  in the DeepSpeed config's 16-bit dtype (bf16 or fp16 enabled: 2 bytes), whatever dtype
  `from_pretrained` was given, and whatever the checkpoint's dtype (rank 0's `copy_` into the
  gathered buffer converts in place). Where they live is `Init.remote_device`
  (partition_parameters.py: the accelerator, unless `offload_param.device` is cpu).
- the gathered module, on the accelerator (`_allgather_params_sequential`: a flat buffer of
  ceil(numel / ranks) x ranks elements). On DS_ACCELERATOR=cpu it is host RAM, twice: gloo's
  allgather flattens its output into a second buffer of the same size before copying it out
  (measured: 2.0x the largest module, at 1, 2 and 3 ranks). The largest module is the
  embedding or lm_head for the families here (`ModelShape.largest_module_params`).
On GPUs without param offload, loading under zero.Init costs the host no anonymous memory at
all (read from the code above, not measured here). On DS_ACCELERATOR=cpu, glibc keeps much of
what the whole-then-partitioned parameters and the gathers freed (measured: 0.3-0.7x of the
16-bit model beyond this figure, varying by rank and run); `MALLOC_MMAP_THRESHOLD_=131072`
removes it, and the test sets it to measure what the libraries hold.
"""

from __future__ import annotations

from trainfleet.errors import TrainfleetError
from trainfleet.plan.model import ModelShape
from trainfleet.plan.zero import ceil_div, partition_elements

ZERO_PARAMS_ON = ("gpu", "offload", "cpu")
"""Where ZeRO-3 keeps each rank's partition and its gathered module while loading:
gpu: both in GPU memory (the default); offload: `offload_param.device: cpu`, partitions in host
RAM, gathers on the GPU; cpu: DS_ACCELERATOR=cpu, both in host RAM (what the test measures)."""
GLOO_GATHER_COPIES = 2
"""DeepSpeed's flat gather buffer, plus gloo's flattened copy of the output (ProcessGroupGloo's
allgather flattens, then copies into the outputs)."""


def _check(ranks: int, load_dtype_bytes: int, zero_params_on: str) -> None:
    if ranks < 1:
        raise TrainfleetError(f"ranks must be >= 1, got {ranks}", "count every GPU of every node")
    if load_dtype_bytes not in (1, 2, 4):
        raise TrainfleetError(
            f"load_dtype_bytes must be 1, 2 or 4, got {load_dtype_bytes}", "bf16 and fp16 are 2"
        )
    if zero_params_on not in ZERO_PARAMS_ON:
        raise TrainfleetError(
            f"zero_params_on {zero_params_on!r} is not known", f"use one of {ZERO_PARAMS_ON}"
        )


def loading_peak_bytes(
    shape: ModelShape,
    *,
    ranks: int,
    zero_init: bool,
    load_dtype_bytes: int = 2,
    dtype_cast: bool = True,
    zero_params_on: str = "gpu",
) -> int:
    """Peak anonymous host RAM one rank gains while `from_pretrained` runs (the worst rank; all
    ranks are equal here). `dtype_cast` (without zero.Init only): the checkpoint's dtype differs
    from the load dtype; True by default because the planner does not see the checkpoint, and it
    is the case that costs. With zero.Init, `load_dtype_bytes` is the DeepSpeed config's dtype
    and `zero_params_on` one of ZERO_PARAMS_ON."""
    _check(ranks, load_dtype_bytes, zero_params_on)
    if not zero_init:
        model_bytes = shape.total_params() * load_dtype_bytes
        return model_bytes if dtype_cast else 0
    if zero_params_on == "gpu":
        return 0
    partition, _ = partition_elements(shape.parameter_numels(), stage=3, ranks=ranks)
    partitions_bytes = partition * load_dtype_bytes
    if zero_params_on == "offload":
        return partitions_bytes
    gathered = ceil_div(shape.largest_module_params(), ranks) * ranks * load_dtype_bytes
    return partitions_bytes + GLOO_GATHER_COPIES * gathered


def node_loading_peak_bytes(
    shape: ModelShape,
    *,
    ranks_per_node: int,
    ranks: int,
    zero_init: bool,
    load_dtype_bytes: int = 2,
    dtype_cast: bool = True,
    zero_params_on: str = "gpu",
) -> int:
    """Peak anonymous host RAM a node gains while its ranks load: ranks_per_node x the per-rank
    figure, since the ranks load at the same time and (measured) rank 0 holds no more anonymous
    memory than the others. Add the page cache (the checkpoint once per node, reclaimable) and
    each process's runtime if the question is the node's whole RAM."""
    if not 1 <= ranks_per_node <= ranks:
        raise TrainfleetError(
            f"ranks_per_node must be in 1..ranks ({ranks}), got {ranks_per_node}",
            "ranks counts every GPU of every node",
        )
    return ranks_per_node * loading_peak_bytes(
        shape,
        ranks=ranks,
        zero_init=zero_init,
        load_dtype_bytes=load_dtype_bytes,
        dtype_cast=dtype_cast,
        zero_params_on=zero_params_on,
    )
