"""One planner config measured on one GPU: the peak memory DeepSpeed really allocates.

Run by bench/gpu_validate.py, one process per config, so each peak is its own:

    python bench/gpu_memory_probe.py --model config.json --zero 2 --seq-len 2048 \
        --micro-batch 1 [--grad-ckpt] [--offload optimizer] [--lora-rank 16] [--steps 3]

The model is built from its config (random weights, bf16, as DeepSpeed's bf16 mode casts it);
ZeRO-3 builds it under zero.Init, as HF Trainer does when a ZeRO-3 config is alive. The DeepSpeed
config is the one `trainfleet plan` writes for this setup (`deepspeed_config`), with the `auto`
hyperparameters filled as HF Trainer would. Each step is a forward and backward of
micro-batch x seq-len random tokens with labels (HF's loss, fp32 logits) and an optimizer step.
The last stdout line is one JSON object: the measured peaks (the whole run's, and each
phase's: init, forward, backward, optimizer step, the largest over the steps) and the planner's
prediction.

--snapshot records every allocation (torch.cuda.memory._record_memory_history, Python frames)
and adds, for each phase of the last step, what was live at that phase's peak, grouped by the
first frame outside torch that allocated it (`file.py:function`): which part of the model,
the loss or DeepSpeed holds the bytes the planner's terms stand for.

    >>> lib = "/opt/torch/.venv/lib/python3.12/site-packages/"
    >>> trace = [{"action": "alloc", "addr": 1, "size": 10, "frames": [_f(lib + "torch/nn/x.py",
    ...     "linear"), _f(lib + "transformers/loss/loss_utils.py", "ForCausalLMLoss")]},
    ...     {"action": "alloc", "addr": 2, "size": 5, "frames": [_f("deepspeed/zero/s.py", "f")]},
    ...     {"action": "free_completed", "addr": 1, "size": 10, "frames": []},
    ...     {"action": "alloc", "addr": 3, "size": 7, "frames": [_f("deepspeed/zero/s.py", "f")]}]
    >>> live_at_peak(trace, 0, 4)
    (15, [['loss_utils.py:ForCausalLMLoss:0', 10], ['s.py:f:0', 5]])
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from trainfleet.plan.ds_config import deepspeed_config
from trainfleet.plan.memory import TrainSetup, gpu_memory
from trainfleet.plan.model import ModelShape

FILLED = {"lr": 1e-5, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
"""What HF Trainer puts for the `auto` optimizer values (its defaults; lr is the bench's)."""


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a config.json")
    parser.add_argument("--zero", type=int, default=2)
    parser.add_argument("--offload", default="none")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--grad-ckpt", action="store_true")
    parser.add_argument("--lora-rank", type=int, default=0)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--torch-adam", action="store_true", help="torch's AdamW instead of DeepSpeed's FusedAdam"
    )
    parser.add_argument(
        "--snapshot", action="store_true", help="what is live at each phase's peak, by who made it"
    )
    return parser.parse_args(argv)


TRACE_ENTRIES = 20_000_000
"""The allocator's trace kept for --snapshot: far more than 3 steps of a 0.5B model make, so
that the trace never wraps and its indices stay the phases' marks."""


def _f(filename: str, name: str) -> dict:
    return {"filename": filename, "line": 0, "name": name}


_TORCH = re.compile(r"(^|/)(site|dist)-packages/torch/|^torch/|^<")
"""A frame of torch itself (or a frozen module): skipped to reach the code that asked."""


def _maker(frames: list[dict]) -> str:
    """`file.py:function:line` of the innermost frame outside torch; `torch` when every frame
    is torch's (the autograd engine's allocations during backward have none)."""
    for frame in frames:
        path = frame.get("filename", "")
        if _TORCH.search(path):
            continue
        return f"{Path(path).name}:{frame.get('name', '?')}:{frame.get('line', 0)}"
    return "torch"


def live_at_peak(trace: list[dict], start: int, end: int, top: int = 12) -> tuple[int, list]:
    """Replaying the trace from its beginning: the most bytes allocated at once between
    entries `start` and `end`, and what was live then, by maker, largest first."""
    live: dict[int, tuple[int, str]] = {}
    total = peak = 0
    peak_at = start
    for index, entry in enumerate(trace[:end]):
        action = entry.get("action")
        if action == "alloc":
            live[entry["addr"]] = (entry["size"], _maker(entry.get("frames") or []))
            total += entry["size"]
        elif action == "free_completed" and entry["addr"] in live:
            total -= live.pop(entry["addr"])[0]
        if index >= start and total > peak:
            peak, peak_at = total, index
    live = {}
    for entry in trace[: peak_at + 1]:
        if entry.get("action") == "alloc":
            live[entry["addr"]] = (entry["size"], _maker(entry.get("frames") or []))
        elif entry.get("action") == "free_completed":
            live.pop(entry["addr"], None)
    by_maker: dict[str, int] = {}
    for size, maker in live.values():
        by_maker[maker] = by_maker.get(maker, 0) + size
    ranked = sorted(by_maker.items(), key=lambda kv: -kv[1])[:top]
    return peak, [[maker, size] for maker, size in ranked]


def setup_of(args: argparse.Namespace) -> TrainSetup:
    return TrainSetup(
        zero=args.zero,
        offload=args.offload,
        micro_batch=args.micro_batch,
        seq_len=args.seq_len,
        grad_ckpt=args.grad_ckpt,
        lora_rank=args.lora_rank,
    )


def ds_config_of(setup: TrainSetup, shape: ModelShape, *, torch_adam: bool) -> dict:
    config = deepspeed_config(setup, hidden_size=shape.hidden_size, accumulation=1, ranks=1)
    params = config["optimizer"]["params"]
    params.update({key: FILLED[key] for key, value in params.items() if value == "auto"})
    if torch_adam:
        params["torch_adam"] = True
    return config


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29600 + os.getpid() % 1000))

    import deepspeed
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    shape = ModelShape.from_path(args.model)
    setup = setup_of(args)
    predicted = gpu_memory(shape, setup, ranks=1)
    ds = ds_config_of(setup, shape, torch_adam=args.torch_adam)
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)

    started = time.monotonic()
    recording = args.snapshot and on_gpu
    if recording:
        torch.cuda.memory._record_memory_history(stacks="python", max_entries=TRACE_ENTRIES)
    keep_alive = HfDeepSpeedConfig(ds) if setup.zero == 3 else None  # zero.Init in from_config
    hf_config = AutoConfig.from_pretrained(Path(args.model).parent)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16)
    if args.grad_ckpt:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if setup.lora_rank:
        from peft import LoraConfig, get_peft_model

        from trainfleet.train.config import LoraConfig as TrainLora

        if args.grad_ckpt:
            model.enable_input_require_grads()
        model = get_peft_model(
            model,
            LoraConfig(
                r=setup.lora_rank,
                lora_alpha=2 * setup.lora_rank,
                target_modules=TrainLora().target_modules,
                task_type="CAUSAL_LM",
            ),
        )
    trainable = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=trainable, config=ds)
    del keep_alive
    generator = torch.Generator().manual_seed(0)
    losses = []
    peaks = {"init": _peak_and_reset(on_gpu)}
    phases: dict[str, int] = {}
    marks: dict[str, tuple[int, int]] = {}
    """The last step's phases as trace indices (--snapshot)."""
    for index in range(args.steps):
        tokens = torch.randint(
            0, shape.vocab_size, (setup.micro_batch, setup.seq_len), generator=generator
        ).to(device)
        last = recording and index == args.steps - 1
        mark = _trace_length(last)
        loss = engine(input_ids=tokens, labels=tokens).loss
        phases["forward"] = _peak_and_reset(on_gpu)
        marks["forward"] = (mark, mark := _trace_length(last))
        engine.backward(loss)
        phases["backward"] = _peak_and_reset(on_gpu)
        marks["backward"] = (mark, mark := _trace_length(last))
        engine.step()
        phases["step"] = _peak_and_reset(on_gpu)
        marks["step"] = (mark, _trace_length(last))
        peaks.update({name: max(peaks.get(name, 0), value) for name, value in phases.items()})
        losses.append(round(float(loss), 4))
    if on_gpu:
        torch.cuda.synchronize()
    at_peak = {}
    if recording:
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        torch.cuda.memory._record_memory_history(enabled=None)
        for name, (start, end) in marks.items():
            peak, makers = live_at_peak(trace, start, end)
            at_peak[name] = {"peak": peak, "makers": makers}
    result = {
        "setup": {
            "zero": setup.zero,
            "offload": setup.offload,
            "seq_len": setup.seq_len,
            "micro_batch": setup.micro_batch,
            "grad_ckpt": setup.grad_ckpt,
            "lora_rank": setup.lora_rank,
            "optimizer": "torch AdamW" if args.torch_adam else "FusedAdam",
        },
        "params": shape.total_params(),
        "predicted": {
            "allocated": predicted.total_bytes - predicted.context_bytes - predicted.margin_bytes,
            "total": predicted.total_bytes,
            "terms": {
                "params": predicted.params_bytes,
                "grads": predicted.grads_bytes,
                "optimizer": predicted.optimizer_bytes,
                "activations": predicted.activations_bytes,
                "logits": predicted.logits_bytes,
                "buffers": predicted.buffers_bytes,
                "step": predicted.step_bytes,
                "margin": predicted.margin_bytes,
                "context": predicted.context_bytes,
            },
        },
        "measured": {
            "allocated": max(peaks.values()) if on_gpu else None,
            "phases": peaks,
            "reserved": torch.cuda.max_memory_reserved() if on_gpu else None,
            "device_used": _device_used_bytes() if on_gpu else None,
        },
        "at_peak": at_peak,
        "losses": losses,
        "seconds": round(time.monotonic() - started, 1),
        "device": torch.cuda.get_device_name(0) if on_gpu else "cpu",
    }
    print(json.dumps(result), flush=True)
    return 0


def _peak_and_reset(on_gpu: bool) -> int:
    """The peak allocated since the last reset (or the start), then a new window begins."""
    if not on_gpu:
        return 0
    import torch

    peak = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    return peak


def _trace_length(recording: bool) -> int:
    """How many entries the allocator's trace holds now (0 when not recording)."""
    if not recording:
        return 0
    import torch

    torch.cuda.synchronize()
    return len(torch.cuda.memory._snapshot()["device_traces"][0])


def _device_used_bytes() -> int:
    """What the whole process holds on the GPU (context, allocator, NCCL): cudaMemGetInfo."""
    import torch

    free, total = torch.cuda.mem_get_info()
    return total - free


if __name__ == "__main__":
    sys.exit(main())
