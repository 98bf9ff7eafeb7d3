"""Run under torchrun with DS_ACCELERATOR=cpu: the host RAM one rank gains while
`AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)` runs.

    torchrun --nproc-per-node=2 load_rss.py MODEL_DIR plain|zero3 [DTYPE]

DTYPE (default bfloat16) is what `from_pretrained` is given; a checkpoint saved in another dtype
is cast while loading, which is what costs without zero.Init (see plan/cpu_memory.py).

Mode `zero3` first creates (and keeps alive) a `HfDeepSpeedConfig` holding a minimal ZeRO-3 bf16
config, the way seed 004 must: transformers then builds the model under `deepspeed.zero.Init`
and loads the checkpoint one module at a time through `GatheredParameters`. In transformers 5.23
`HfDeepSpeedConfig` subclasses accelerate's class: without accelerate it is a bare `object` and
`dep_version_check("accelerate")` raises.

What is measured, from a baseline taken after the imports and `init_distributed` (so the runtime
cost of torch, deepspeed and the process group is not in the figure) until `from_pretrained`
returns:
- RssAnon, the anonymous resident memory, sampled from /proc/self/status by a background thread
  every SAMPLE_S: this is the figure that matters for a host OOM. The kernel cannot drop
  anonymous pages without swap (training hosts run without), so N ranks that each hold a copy
  of the model need N copies of RAM. The safetensors files are mmap'd instead: their pages are
  file-backed (RssFile), live in the page cache, are shared by every rank that maps the same
  file (one copy per node, however many ranks), and the kernel reclaims them under pressure by
  dropping them, since they can be read again from disk.
- RssFile, its peak the same way, to show where the checkpoint bytes went.
- VmHWM, the kernel's own high-water mark of the whole RSS (anon + file + shmem), reset to the
  current RSS at the baseline through /proc/self/clear_refs and reported above the baseline's
  VmRSS: it needs no sampling, so it bounds from above what the sampler may have missed between
  two reads (file pages count in it too).
Peaks are reported as bytes above the baseline. Rank 0 prints every rank's result as one line
`RESULT [{...}, ...]`, in rank order.
"""

import json
import os
import sys
import threading
import time

import deepspeed
import torch
import torch.distributed as dist
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.integrations import HfDeepSpeedConfig

SAMPLE_S = 0.002
FIELDS = ("RssAnon", "RssFile", "VmHWM", "VmRSS")
ZERO3_CONFIG = {
    # DeepSpeedConfig (built by zero.Init) insists on a batch size; nothing trains here.
    "train_micro_batch_size_per_gpu": 1,
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 3},
}


def read_status():
    """The FIELDS of /proc/self/status, in bytes."""
    found = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in FIELDS:
                found[key] = int(value.split()[0]) * 1024
    return found


class PeakSampler(threading.Thread):
    """Largest value of each field seen; the thread reads /proc while the loader releases the GIL
    (tensor copies, file reads, collectives all do)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak = read_status()
        self.samples = 0
        self._stop_event = threading.Event()

    def run(self):
        while not self._stop_event.is_set():
            self._take()
            time.sleep(SAMPLE_S)

    def _take(self):
        now = read_status()
        self.samples += 1
        for key, value in now.items():
            self.peak[key] = max(self.peak[key], value)

    def stop(self):
        self._stop_event.set()
        self.join()
        self._take()  # the state after loading counts too (it is what stays)
        return self.peak


def reset_high_water_mark():
    # "5" resets VmHWM to the current RSS (Linux >= 4.0, proc(5)).
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def held_bytes(model, mode):
    """The parameter bytes this rank keeps once loading is over: its ZeRO-3 partition, or the
    whole model."""
    if mode == "zero3":
        return sum(p.ds_tensor.numel() * p.ds_tensor.element_size() for p in model.parameters())
    return sum(p.numel() * p.element_size() for p in model.parameters())


def main(model_dir, mode, dtype):
    # Resolving the class imports modeling_utils and the model's module (~80 MiB of anonymous
    # memory: code, not weights): a per-process runtime cost, so it belongs in the baseline.
    AutoModelForCausalLM._model_mapping[type(AutoConfig.from_pretrained(model_dir))]
    deepspeed.init_distributed("gloo")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    baseline = read_status()
    reset_high_water_mark()
    sampler = PeakSampler()
    sampler.start()
    started = time.monotonic()
    keep_alive = HfDeepSpeedConfig(ZERO3_CONFIG) if mode == "zero3" else None
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    seconds = time.monotonic() - started
    peak = sampler.stop()
    after = read_status()
    result = {
        "mode": mode,
        "dtype": dtype,
        "ranks": ranks,
        "rank": rank,
        "seconds": round(seconds, 2),
        "samples": sampler.samples,
        "baseline": baseline,
        "peak_anon": peak["RssAnon"] - baseline["RssAnon"],
        "peak_file": peak["RssFile"] - baseline["RssFile"],
        "peak_hwm": after["VmHWM"] - baseline["VmRSS"],
        "after_anon": after["RssAnon"] - baseline["RssAnon"],
        "after_file": after["RssFile"] - baseline["RssFile"],
        "held": held_bytes(model, mode),
        "zero3_active": keep_alive is not None and hasattr(next(model.parameters()), "ds_id"),
    }
    gathered = [None] * ranks
    dist.all_gather_object(gathered, result)
    if rank == 0:
        print("RESULT " + json.dumps(gathered), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or sys.argv[2] not in ("plain", "zero3"):
        sys.exit(f"usage: {os.path.basename(sys.argv[0])} MODEL_DIR plain|zero3 [DTYPE]")
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) == 4 else "bfloat16")
    sys.stdout.flush()
    os._exit(0)  # see trainfleet.train.worker: no C++ teardown after ZeRO-3 on gloo
