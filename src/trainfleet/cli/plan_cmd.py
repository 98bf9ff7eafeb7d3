"""`trainfleet plan`: memory per GPU and CPU RAM per node; the fastest DeepSpeed config that fits.

trainfleet plan --model ./DeepSeek-R1-Distill-Qwen-32B --nodes 2 --gpus-per-node 8 --gpu H20
trainfleet plan --model config.json -c cluster.yaml --gpu-memory 80GiB --zero 3 --json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from trainfleet.cli.common import add_cluster_arguments

if TYPE_CHECKING:
    from trainfleet.plan.hardware import Gpu, LocalGpus

HELP = "memory per GPU and CPU RAM per node for a model and config; the fastest config that fits"
DESCRIPTION = """\
Counts the model's parameters from its config.json (no weights are read), then for the
requested config: per GPU the params, gradients, fp32 master and Adam states as DeepSpeed
partitions them by ZeRO stage and offload, activations for the model's architecture,
logits and loss, communication buffers, the optimizer step's temporaries, CUDA context and a
fragmentation margin; per node the CPU RAM while every rank loads the model (with and
without zero.Init) and the offloaded states. DeepSpeed's own estimate is printed beside it.
Then every ZeRO stage / offload / micro batch / checkpointing combination is estimated and
those that fit are ranked by step time (compute at an assumed MFU, communication over the
stated or measured bus bandwidth). Exit 0: the requested config fits; 1: it does not."""

DEFAULT_BUSBW = {True: 150.0, False: 12.5}
"""GB/s when neither --busbw nor --commtest is given: one node (NVLink-class), several nodes
(one 100 Gb/s NIC per node)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", required=True, metavar="DIR|config.json", help="local model dir or its config"
    )
    add_cluster_arguments(parser)
    where = parser.add_argument_group("hardware (instead of, or on top of, a cluster)")
    where.add_argument("--nodes", type=int, help="default: the cluster's nodes, else 1")
    where.add_argument(
        "--gpus-per-node",
        type=int,
        help="default: the cluster's slots, else this machine's GPUs, else 8",
    )
    # The GPU table is not imported here: building the parser stays light for every command.
    where.add_argument(
        "--gpu",
        help="H100, A100, H20, H200... (default: this machine's GPU, else H100; a wrong name "
        "lists all)",
    )
    where.add_argument("--gpu-memory", metavar="SIZE", help="per GPU, e.g. 80GiB; overrides --gpu")
    where.add_argument("--gpu-tflops", type=float, help="dense bf16 peak; overrides --gpu")
    where.add_argument("--cpu-memory", metavar="SIZE", help="per node, e.g. 1TiB (else unchecked)")
    where.add_argument("--busbw", type=float, metavar="GB/s", help="collective bus bandwidth")
    where.add_argument(
        "--commtest", metavar="FILE", help="`trainfleet commtest --json` output: its busbw"
    )
    where.add_argument("--mfu", type=float, default=0.4, help="assumed utilisation (0.4)")
    where.add_argument(
        "--headroom",
        type=float,
        default=0.1,
        help="fraction of GPU memory to keep free (0.1: the GPU-side terms are not yet"
        " measured on a GPU by this project)",
    )
    train = parser.add_argument_group("training config (the one asked about)")
    train.add_argument("--seq-len", type=int, default=4096)
    train.add_argument("--micro-batch", type=int, default=1)
    train.add_argument(
        "--global-batch", type=int, help="sequences per optimizer step (default 8 per GPU)"
    )
    train.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=3)
    train.add_argument("--offload", choices=("none", "optimizer", "all"), default="none")
    train.add_argument("--grad-ckpt", action="store_true", help="gradient checkpointing")
    train.add_argument("--lora-rank", type=int, default=0, help="0: full fine-tuning")
    train.add_argument("--precision", choices=("bf16", "fp16", "fp32"), default="bf16")
    parser.add_argument("--json", action="store_true", help="the same data as JSON")
    parser.add_argument(
        "--emit-deepspeed",
        metavar="FILE",
        help="write the best fitting config's DeepSpeed JSON (the requested one if none fits)",
    )


def _busbw(args: argparse.Namespace, nodes: int) -> tuple[float, str]:
    from trainfleet.errors import TrainfleetError

    if args.commtest:
        try:
            rows = json.loads(Path(args.commtest).read_text())["results"]
            largest = max((r for r in rows if r["op"] == "all_reduce"), key=lambda r: r["bytes"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise TrainfleetError(
                f"{args.commtest}: no all_reduce result in it ({exc})",
                "pass the output of `trainfleet commtest --json` (with all_reduce)",
            ) from None
        return largest["busbw"], f"measured by commtest ({args.commtest})"
    if args.busbw:
        return args.busbw * 1e9, "stated (--busbw)"
    return DEFAULT_BUSBW[nodes == 1] * 1e9, "default; measure it with `trainfleet commtest`"


def _gpu_here(here: LocalGpus | None, defaults: list[str], args: argparse.Namespace) -> Gpu:
    """The GPU to plan for when --gpu is not given: this machine's where it has one (its
    memory as nvidia-smi reports it, its peak from the table when the name is there), else
    an H100."""
    from trainfleet.plan.hardware import GPUS, Gpu, known_gpu

    if here is None:
        if not (args.gpu_memory and args.gpu_tflops):
            defaults.append("--gpu H100")
        return GPUS["H100"]
    known = known_gpu(here.product)
    peak = known.peak_flops if known else GPUS["H100"].peak_flops
    if not (args.gpu_memory and args.gpu_tflops):
        memory = f"{here.memory_bytes / 2**30:.1f}GiB"
        note = f"--gpu-memory {memory}" + ("" if known else " --gpu-tflops 989 (an H100's)")
        defaults.append(f"{note} (this machine's {here.product})")
    return Gpu(name=here.product, memory_bytes=here.memory_bytes, peak_flops=peak)


def run(args: argparse.Namespace) -> int:
    from trainfleet.cli.common import cluster_from_args
    from trainfleet.errors import TrainfleetError
    from trainfleet.plan import TrainSetup, make_plan
    from trainfleet.plan.ds_config import deepspeed_config
    from trainfleet.plan.hardware import gpu_by_name, this_machine
    from trainfleet.plan.model import ModelShape, weights_on_disk
    from trainfleet.plan.report import render, to_json
    from trainfleet.plan.search import Target
    from trainfleet.plan.speed import Links
    from trainfleet.units import parse_size

    defaults: list[str] = []
    nodes, gpus_per_node = args.nodes, args.gpus_per_node
    clustered = bool(args.hostfile or args.cluster_file or args.hosts)
    if clustered:
        cluster = cluster_from_args(args)
        slots = {node.slots for node in cluster.nodes}
        if len(slots) > 1 and not gpus_per_node:
            raise TrainfleetError(
                f"the cluster's nodes have different slot counts ({sorted(slots)})",
                "ZeRO needs the same GPUs per node: pass --gpus-per-node",
            )
        nodes = len(cluster.nodes) if nodes is None else nodes
        gpus_per_node = slots.pop() if gpus_per_node is None else gpus_per_node
    here = None if clustered or (nodes and gpus_per_node and args.gpu) else this_machine()
    if nodes is None:
        nodes = 1
        defaults.append("--nodes 1")
    if gpus_per_node is None:
        gpus_per_node = here.count if here else 8
        defaults.append(f"--gpus-per-node {gpus_per_node}" + (" (this machine)" if here else ""))
    gpu = gpu_by_name(args.gpu) if args.gpu else _gpu_here(here, defaults, args)
    busbw, busbw_source = _busbw(args, nodes)
    target = Target(
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        gpu_memory_bytes=parse_size(args.gpu_memory) if args.gpu_memory else gpu.memory_bytes,
        cpu_memory_bytes=parse_size(args.cpu_memory) if args.cpu_memory else None,
        headroom=args.headroom,
        links=Links(
            peak_flops=args.gpu_tflops * 1e12 if args.gpu_tflops else gpu.peak_flops,
            busbw=busbw,
            mfu=args.mfu,
        ),
    )
    setup = TrainSetup(
        zero=args.zero,
        offload=args.offload,
        micro_batch=args.micro_batch,
        seq_len=args.seq_len,
        grad_ckpt=args.grad_ckpt,
        precision=args.precision,
        lora_rank=args.lora_rank,
    )
    global_batch = args.global_batch
    if global_batch is None:
        global_batch = target.ranks * max(8, args.micro_batch)
        defaults.append(f"--global-batch {global_batch}")
    shape = ModelShape.from_path(args.model)
    plan = make_plan(shape, setup, target, global_batch=global_batch)
    disk = weights_on_disk(args.model)

    if args.emit_deepspeed:
        chosen = plan.best or plan.requested
        config = deepspeed_config(
            chosen.setup,
            hidden_size=shape.hidden_size,
            accumulation=chosen.time.accumulation,
            ranks=target.ranks,
        )
        Path(args.emit_deepspeed).write_text(json.dumps(config, indent=2) + "\n")
    if args.json:
        data = to_json(plan, disk_bytes=disk)
        data["busbw_source"] = busbw_source
        data["defaults_filled_in"] = defaults
        print(json.dumps(data, indent=2))
    else:
        if defaults:
            print(f"defaults filled in: {' '.join(defaults)}", file=sys.stderr)
        print(render(plan, disk_bytes=disk))
        print(f"         busbw: {busbw_source}")
        if args.emit_deepspeed:
            chosen = plan.best or plan.requested
            ckpt = "on" if chosen.setup.grad_ckpt else "off"
            print(
                f"\nwrote {args.emit_deepspeed}: {chosen.label()} (gradient checkpointing {ckpt}:"
                " a model setting, pass --grad-ckpt to train)"
            )
    return 0 if plan.requested.fits else 1
