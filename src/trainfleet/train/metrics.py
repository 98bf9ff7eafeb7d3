"""What every logging step reports: loss, learning rate, grad norm, tokens/s (total and per
device), samples/s, MFU on GPUs, peak memory; as JSONL in OUTPUT/metrics.jsonl, TensorBoard
event files in OUTPUT/tensorboard (HF's own writer), a progress line with ETA on rank 0, and
a PNG loss curve at the end.

    >>> eta(steps_done=25, steps_total=100, seconds=50.0)
    '1m40s'

MFU = tokens/s per device x model FLOPs per token / peak FLOP/s of the device, with FLOPs per
token = 6N + 12 L a d s and N every parameter a token's matmuls touch (the layers and the
output projection, not the input embedding): `plan.speed.flops_per_token`.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from trainfleet import heartbeat
from trainfleet.plan.hardware import GPUS

if TYPE_CHECKING:  # importing this module stays light: transformers only where it runs
    from transformers import TrainerCallback


def eta(*, steps_done: int, steps_total: int, seconds: float) -> str:
    if steps_done <= 0:
        return "?"
    left = int(seconds / steps_done * (steps_total - steps_done))
    return f"{left // 60}m{left % 60:02d}s" if left >= 60 else f"{left}s"


def peak_flops_of(device_name: str) -> float | None:
    """The table's peak for a CUDA device name like 'NVIDIA H100 80GB HBM3'."""
    words = device_name.upper().replace("-", " ").split()
    for name, gpu in sorted(GPUS.items(), key=lambda item: -len(item[0])):
        if name.upper().split("-")[0] in words:
            return gpu.peak_flops
    return None


def peak_memory_bytes() -> int:
    """GPU: the caching allocator's peak; CPU: this process's peak RSS."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def make_callback(
    *, output: Path, flops_per_token: float, world_size: int, max_steps: int, is_rank0: bool
) -> TrainerCallback:
    """A transformers TrainerCallback (built here so that importing this module stays light)."""
    import torch
    from transformers import TrainerCallback

    peak = peak_flops_of(torch.cuda.get_device_name()) if torch.cuda.is_available() else None

    class Metrics(TrainerCallback):
        def __init__(self) -> None:
            self.started = time.monotonic()
            self.last_time = self.started
            self.last_tokens = 0
            self.last_step = 0
            self.first_step = 0
            self.file: IO[str] | None = None
            self.busy = 0.0
            """Seconds in the model's forward passes since the last step ended."""
            self.forward_started = 0.0

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if model is not None:  # busy time: the seconds in the model's forward passes
                model.register_forward_pre_hook(self._forward_begins)
                model.register_forward_hook(self._forward_ends)
            self.started = self.last_time = time.monotonic()
            self.last_tokens = state.num_input_tokens_seen
            self.last_step = self.first_step = state.global_step
            if is_rank0:
                self.file = open(output / "metrics.jsonl", "a")

        def _forward_begins(self, module, inputs):
            self.forward_started = time.monotonic()

        def _forward_ends(self, module, inputs, output):
            self.busy += time.monotonic() - self.forward_started

        def on_step_end(self, args, state, control, **kwargs):
            heartbeat.beat(
                state.global_step,
                total_steps=max_steps,
                busy_s=round(self.busy, 4),
                memory_bytes=peak_memory_bytes(),
                phase="training",
            )
            self.busy = 0.0

        def on_log(self, args, state, control, logs=None, **kwargs):
            # Rank 0 reports: only it opened the file, in on_train_begin.
            if self.file is None or not logs or "loss" not in logs:
                return
            now = time.monotonic()
            seconds = max(now - self.last_time, 1e-9)
            tokens = state.num_input_tokens_seen - self.last_tokens
            steps = state.global_step - self.last_step
            tokens_per_s = tokens / seconds
            record: dict[str, Any] = {
                "step": state.global_step,
                "loss": logs["loss"],
                "learning_rate": logs.get("learning_rate"),
                "grad_norm": logs.get("grad_norm"),
                "tokens_per_s": tokens_per_s,
                "tokens_per_s_per_device": tokens_per_s / world_size,
                "samples_per_s": steps * args.train_batch_size * world_size / seconds,
                "peak_memory_bytes": peak_memory_bytes(),
                "seconds": now - self.started,
                "tokens_seen": state.num_input_tokens_seen,
            }
            if peak:
                record["mfu"] = tokens_per_s / world_size * flops_per_token / peak
            heartbeat.beat(state.global_step, loss=logs["loss"], tokens_per_s=tokens_per_s)
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
            done = state.global_step
            left = eta(
                steps_done=done - self.first_step,
                steps_total=max_steps - self.first_step,
                seconds=now - self.started,
            )
            print(
                f"step {done}/{max_steps} loss {logs['loss']:.4f}"
                f" lr {record['learning_rate'] or 0:.2e} tokens/s {tokens_per_s:,.0f} ETA {left}",
                flush=True,
            )
            self.last_time, self.last_tokens, self.last_step = (
                now,
                state.num_input_tokens_seen,
                done,
            )

        def on_train_end(self, args, state, control, **kwargs):
            if self.file:
                self.file.close()

    return Metrics()


def plot_loss(metrics_file: Path, png: Path) -> bool:
    """The loss curve from metrics.jsonl (all restarts of the run); False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("loss curve: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return False
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows])
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return True
