"""On a GPU machine: what trainfleet's GPU paths do on a real GPU, in one command.

    OUT=dir python bench/gpu_validate.py [--parts smi,health,paths,planner] [--budget-s 480]

1. smi: every nvidia-smi output doctor reads or will read (the query fields one by one, the
   combined query, remapped rows, NVLink, compute apps, `-q`, the kernel log's readability),
   recorded with exit codes in OUT/nvidia_smi.json: the recorded formats that the GPU health
   tests replay. Then the cost of one node's health query (median of 10), the figure doctor's
   budget of under 2 s per node is held to.
2. health: the probe's GPU answer (node/gpus.py) on this GPU, doctor's report, and `plan`'s
   default (this machine's GPUs).
3. paths: trainfleet's own commands on this GPU: doctor's facts (and a process holding GPU
   memory reported as gpu-busy), `launch` of a 1-rank NCCL all_reduce, fail-fast on a CUDA
   rank's crash, and the hang watchdog's stack dump and Flight Recorder record of a CUDA rank
   stuck in a kernel.
4. planner: `trainfleet plan`'s predicted peak against torch.cuda.max_memory_allocated() for a
   Qwen2.5-0.5B-shaped model (random weights) over ZeRO 0-3, checkpointing, LoRA, offload, seq
   len and micro batch, one process per config (bench/gpu_memory_probe.py); with --snapshot,
   also what was live at each phase's peak, by the code that allocated it.

Each part writes what it measured as it goes (OUT/summary.json), so a run stopped at its limit
still returns what it finished. Without a GPU the parts say so and stop.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(os.environ.get("OUT") or ROOT / "gpu-validate-out")

sys.path.insert(0, str(ROOT / "src"))
from trainfleet.node import gpus  # noqa: E402

HEALTH_FIELDS = ",".join(gpus.FIELDS)
"""The one query doctor's probe asks each node (node/gpus.py), each field also recorded alone."""

MORE_FIELDS = (
    "ecc.errors.uncorrected.aggregate.total,clocks_event_reasons.active,"
    "serial,vbios_version,compute_cap,compute_mode,mig.mode.pending,ecc.mode.pending,"
    "ecc.errors.corrected.volatile.total,retired_pages.double_bit.count,"
    "retired_pages.single_bit_ecc.count,clocks_throttle_reasons.active,"
    "clocks_event_reasons.sw_power_cap,clocks_event_reasons.gpu_idle,pcie.link.gen.gpucurrent,"
    "pcie.link.gen.gpumax,pcie.link.gen.hostmax,temperature.memory,power.draw,power.limit,"
    "clocks.sm,clocks.max.sm,utilization.gpu,memory.free,fabric.state,fabric.status"
)

REMAPPED = (
    "--query-remapped-rows=gpu_bus_id,gpu_uuid,remapped_rows.correctable,"
    "remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure"
)

PLANNER_CONFIGS = (
    # (zero, offload, seq_len, micro_batch, grad_ckpt, lora_rank): the most telling first.
    (2, "none", 2048, 1, False, 0),
    (3, "none", 2048, 1, False, 0),
    (2, "none", 2048, 1, True, 0),
    (0, "none", 512, 4, False, 0),
    (2, "none", 512, 4, False, 0),
    (3, "none", 2048, 4, True, 0),
    (1, "none", 1024, 2, False, 0),
    (2, "none", 2048, 1, False, 16),
    (3, "none", 512, 1, True, 16),
    (2, "optimizer", 512, 1, False, 0),
)

QWEN05B = {
    # Qwen2.5-0.5B's published shape (494M params); weights are random.
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
}

ALLREDUCE = """\
import os, torch, torch.distributed as dist
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
t = torch.ones(4, device="cuda") * (dist.get_rank() + 1)
dist.all_reduce(t)
torch.cuda.synchronize()
print("allreduce nccl", t.tolist(), torch.cuda.get_device_name(), flush=True)
if os.environ.get("PLANT_CRASH"):
    x = torch.zeros(1, device="cuda")
    raise RuntimeError("planted crash after a CUDA op on rank %d" % dist.get_rank())
dist.destroy_process_group()
"""

HANG = """\
import os, torch, torch.distributed as dist
from trainfleet import heartbeat
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
for step in range(1, 11):
    dist.all_reduce(torch.ones(1, device="cuda"))
    torch.cuda.synchronize()
    heartbeat.beat(step, total_steps=100, busy_s=0.001)
print("step 10 done; a kernel that spins for ever, then synchronize", flush=True)
torch.cuda._sleep(1 << 62)
torch.cuda.synchronize()
"""


class Summary:
    """OUT/summary.json, rewritten after every result so a stopped run keeps what it had."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}

    def put(self, key: str, value) -> None:
        self.data[key] = value
        self.path.write_text(json.dumps(self.data, indent=1, default=str))


def run(argv: list[str], *, timeout: float = 60, env: dict | None = None) -> dict:
    started = time.monotonic()
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=OUT / "work"
        )
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except FileNotFoundError as exc:
        rc, out, err = 127, "", str(exc)
    except subprocess.TimeoutExpired as exc:
        rc = 124
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
    return {
        "argv": argv,
        "rc": rc,
        "stdout": out,
        "stderr": err,
        "seconds": round(time.monotonic() - started, 3),
    }


def say(*parts) -> None:
    print(*parts, flush=True)


PROBE_GPUS = "from trainfleet.node import gpus; gpus.facts()"
"""What the probe runs per node: five nvidia-smi calls and the kernel log, in a new Python."""


def part_smi(summary: Summary) -> None:
    records = []
    smi = "nvidia-smi"
    commands = [
        [smi],
        [smi, "--version"],
        [smi, "-L"],
        [smi, "--help-query-gpu"],
        [smi, "--help-query-remapped-rows"],
        [smi, "--help-query-compute-apps"],
        [smi, f"--query-gpu={HEALTH_FIELDS}", "--format=csv"],
        [smi, f"--query-gpu={HEALTH_FIELDS}", "--format=csv,noheader,nounits"],
        [smi, REMAPPED, "--format=csv"],
        [smi, "--query-gpu=no.such.field", "--format=csv"],
        [smi, "-q", "-d", "COMPUTE"],
        [smi, REMAPPED, "--format=csv,noheader,nounits"],
        [smi, "--query-compute-apps=pid,process_name,used_memory,gpu_uuid", "--format=csv"],
        [smi, "nvlink", "--status"],
        [smi, "nvlink", "-s"],
        [smi, "nvlink", "-e"],
        [smi, "topo", "-m"],
        [smi, "-q"],
        ["dcgmi", "--version"],
        ["sh", "-c", "dmesg 2>&1 | tail -n 50; echo rc=$?"],
        ["sh", "-c", "dmesg 2>&1 | grep -i xid | tail -n 20"],
        ["sh", "-c", "journalctl -k --no-pager -q 2>&1 | tail -n 5"],
        [
            "sh",
            "-c",
            "ls -la /dev/nvidia* /proc/driver/nvidia/gpus/*/information 2>&1;"
            " cat /proc/driver/nvidia/version 2>&1",
        ],  # fmt: skip
    ]
    fields = HEALTH_FIELDS.split(",") + MORE_FIELDS.split(",")
    commands += [[smi, f"--query-gpu={field}", "--format=csv"] for field in fields]
    for argv in commands:
        records.append(run(argv, timeout=60))
    (OUT / "nvidia_smi.json").write_text(json.dumps(records, indent=1))
    valid = {
        r["argv"][1].split("=", 1)[1]: r["stdout"].strip().splitlines()[-1:] or [r["stderr"]]
        for r in records
        if len(r["argv"]) == 3
        and r["argv"][1].startswith("--query-gpu=")
        and "," not in r["argv"][1]  # fmt: skip
    }
    bad = {k: v for k, v in valid.items() if not records or "not a valid field" in str(v)}
    say(f"smi: {len(records)} outputs recorded; fields not valid here: {sorted(bad) or 'none'}")
    for field, value in valid.items():
        say(f"  {field:45s} {value}")
    summary.put("smi_fields", valid)

    costs = {}
    for name, argv in (
        ("health query", [smi, f"--query-gpu={HEALTH_FIELDS}", "--format=csv,noheader,nounits"]),
        ("remapped rows", [smi, REMAPPED, "--format=csv,noheader,nounits"]),
        ("nvlink status", [smi, "nvlink", "--status"]),
        ("compute apps", [smi, "--query-compute-apps=pid,used_memory", "--format=csv"]),
        ("probe's gpus", [sys.executable, "-c", PROBE_GPUS]),
    ):
        times = [run(argv, timeout=30)["seconds"] for _ in range(10)]
        costs[name] = {"median_s": statistics.median(times), "max_s": max(times)}
        say(f"cost {name:15s} median {costs[name]['median_s'] * 1000:7.1f} ms,"
            f" max {costs[name]['max_s'] * 1000:7.1f} ms (10 runs)")  # fmt: skip
    summary.put("query_cost", costs)


def trainfleet(*args: str, timeout: float = 120, env: dict | None = None) -> dict:
    return run([sys.executable, "-m", "trainfleet", *args], timeout=timeout, env=env)


def part_health(summary: Summary) -> None:
    """The probe's GPU answer on this GPU, doctor's report of it, and plan's default here."""
    probe = run([sys.executable, "-c", "import json; from trainfleet.node import gpus;"
                 " print(json.dumps(gpus.facts(), indent=1))"], timeout=60)  # fmt: skip
    say("probe's gpus.facts():", probe["rc"], probe["stdout"][-3000:], probe["stderr"][-800:])
    doctor = trainfleet("doctor", "--hosts", "localhost", timeout=180)
    say("doctor:", doctor["rc"], doctor["stdout"][-2500:], doctor["stderr"][-800:])
    plan = trainfleet("plan", "--model", str(OUT / "work" / "qwen05b" / "config.json"),
                      "--seq-len", "2048", "--zero", "2", timeout=120)  # fmt: skip
    say("plan, no cluster given:", plan["rc"], plan["stdout"][:700], plan["stderr"][-400:])
    summary.put("health", {"probe": probe, "doctor": doctor, "plan": plan})


def part_paths(summary: Summary) -> None:
    work = OUT / "work"
    (work / "allreduce.py").write_text(ALLREDUCE)
    (work / "hang.py").write_text(HANG)
    results: dict = {}

    doctor = trainfleet("doctor", "--hosts", "localhost", "--json", timeout=180)
    results["doctor"] = _doctor_view(doctor)
    say("doctor:", json.dumps(results["doctor"])[:1500])
    summary.put("paths", results)

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import torch, time; x = torch.empty(8 << 30, dtype=torch.uint8,"
            " device='cuda'); print('held', flush=True); time.sleep(300)",
        ],  # fmt: skip
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        holder.stdout.readline()
        busy = trainfleet("doctor", "--hosts", "localhost", "--json", timeout=180)
        results["doctor_busy"] = _doctor_view(busy)
        say("doctor with 8 GiB held:", json.dumps(results["doctor_busy"])[:1500])
    finally:
        holder.kill()
        holder.wait()
    summary.put("paths", results)

    plan = trainfleet("plan", "--model", str(OUT / "work" / "qwen05b" / "config.json"),
                      "--seq-len", "2048", "--zero", "2", timeout=120)  # fmt: skip
    results["plan_here"] = {"rc": plan["rc"], "head": plan["stdout"][:1200],
                            "stderr": plan["stderr"][-600:]}  # fmt: skip
    say("plan on this machine:", plan["rc"], plan["stdout"][:600])

    for name, script, extra, env_add in (
        ("launch_nccl", "allreduce.py", [], {}),
        ("launch_crash", "allreduce.py", [], {"PLANT_CRASH": "1"}),
        ("launch_hang", "hang.py", ["--hang-timeout", "6"], {}),
    ):
        env = {**os.environ, **env_add}
        run_dir = work / f"run-{name}"
        started = time.monotonic()
        got = trainfleet("launch", "--hosts", "localhost:1", "--run-dir", str(run_dir), *extra,
                         "--", script, timeout=240, env=env)  # fmt: skip
        view = {
            "rc": got["rc"],
            "seconds": round(time.monotonic() - started, 1),
            "tail": (got["stdout"] + got["stderr"])[-2500:],
            "files": sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file())
            if run_dir.exists()
            else [],
        }
        for sub in ("stacks", "flight"):
            for path in sorted((run_dir / sub).glob("*")) if run_dir.exists() else []:
                view[f"{sub}/{path.name}"] = path.read_text(errors="replace")[:3000]
        results[name] = view
        say(f"{name}: rc {got['rc']} in {view['seconds']} s")
        say(view["tail"][-1500:])
        summary.put("paths", results)


def _doctor_view(got: dict) -> dict:
    try:
        report = json.loads(got["stdout"])
    except ValueError:
        return {"rc": got["rc"], "stdout": got["stdout"][-1500:], "stderr": got["stderr"][-1500:]}
    return {
        "rc": got["rc"],
        "findings": [
            (f.get("id"), f.get("severity"), f.get("message", "")[:300])
            for f in report.get("findings", [])
        ],  # fmt: skip
        "nodes": report.get("nodes"),
        "seconds": report.get("seconds"),
    }


def part_planner(summary: Summary, deadline: float, configs: int, snapshot: bool = False) -> None:
    config = OUT / "work" / "qwen05b" / "config.json"
    rows: list[dict] = []
    torch_adam = False
    for zero, offload, seq, mb, ckpt, lora in PLANNER_CONFIGS[:configs]:
        left = deadline - time.monotonic()
        if left < 40:
            say(f"planner: stopped for time with {len(PLANNER_CONFIGS) - len(rows)} configs left")
            break
        argv = [sys.executable, str(ROOT / "bench" / "gpu_memory_probe.py"), "--model",
                str(config), "--zero", str(zero), "--offload", offload, "--seq-len", str(seq),
                "--micro-batch", str(mb), "--lora-rank", str(lora)]  # fmt: skip
        argv += ["--grad-ckpt"] if ckpt else []
        argv += ["--snapshot"] if snapshot else []
        got = run(argv + (["--torch-adam"] if torch_adam else []), timeout=min(left, 240))
        if got["rc"] != 0 and not torch_adam and "fused_adam" in got["stderr"].lower():
            say("planner: FusedAdam did not build; torch's AdamW from here on")
            say(got["stderr"][-2000:])
            torch_adam = True
            got = run(argv + ["--torch-adam"], timeout=min(deadline - time.monotonic(), 240))
        row = {"config": [zero, offload, seq, mb, ckpt, lora], "rc": got["rc"],
               "seconds": got["seconds"]}  # fmt: skip
        try:
            row.update(json.loads(got["stdout"].strip().splitlines()[-1]))
        except (ValueError, IndexError):
            row["stderr"] = got["stderr"][-2500:]
        rows.append(row)
        summary.put("planner", rows)
        say(_planner_line(row))
        for phase, seen in row.get("at_peak", {}).items():
            makers = ", ".join(f"{m} {b / 2**30:.2f}" for m, b in seen["makers"][:8])
            say(f"  {phase} peak {seen['peak'] / 2**30:.2f} GiB: {makers}")


def _planner_line(row: dict) -> str:
    zero, offload, seq, mb, ckpt, lora = row["config"]
    name = (f"zero{zero} {offload:9s} seq {seq:4d} mb {mb}"
            f" ckpt {'on ' if ckpt else 'off'} lora {lora:2d}")  # fmt: skip
    if "measured" not in row:
        return f"{name}: failed rc {row['rc']}: {row.get('stderr', '')[-400:]}"
    gib = 2**30
    predicted = row["predicted"]["allocated"]
    measured = row["measured"]["allocated"]
    error = (predicted - measured) / measured * 100
    return (
        f"{name}: predicted {predicted / gib:6.2f} GiB, measured {measured / gib:6.2f} GiB"
        f" ({error:+5.1f} %), reserved {row['measured']['reserved'] / gib:6.2f},"
        f" device {row['measured']['device_used'] / gib:6.2f}, {row['seconds']} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="smi,health,paths,planner")
    parser.add_argument("--budget-s", type=float, default=480)
    parser.add_argument("--configs", type=int, default=len(PLANNER_CONFIGS),
                        help="the planner part's first N configs")  # fmt: skip
    parser.add_argument(
        "--snapshot",
        action="store_true",
        help="the planner part also says what is live at each phase's peak, by who made it",
    )
    parser.add_argument(
        "--arch-list",
        help="TORCH_CUDA_ARCH_LIST for DeepSpeed's op builds (9.0 works around DeepSpeed "
        "0.19.8 failing on torch's '9.0a')",
    )
    args = parser.parse_args()
    if args.arch_list:
        os.environ["TORCH_CUDA_ARCH_LIST"] = args.arch_list
    deadline = time.monotonic() + args.budget_s
    (OUT / "work" / "qwen05b").mkdir(parents=True, exist_ok=True)
    (OUT / "work" / "qwen05b" / "config.json").write_text(json.dumps(QWEN05B))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p
    )
    summary = Summary(OUT / "summary.json")
    if shutil.which("nvidia-smi") is None:
        say("no nvidia-smi here: this bench runs on a GPU machine")
        return 2
    parts = {"smi": part_smi, "health": part_health, "paths": part_paths}
    for name in args.parts.split(","):
        started = time.monotonic()
        try:
            if name == "planner":
                part_planner(summary, deadline, args.configs, args.snapshot)
            else:
                parts[name](summary)
        except Exception as exc:  # one part's failure must not cost the others' figures
            say(f"part {name} failed: {type(exc).__name__}: {exc}")
            summary.put(f"{name}_error", repr(exc))
        say(f"== part {name}: {time.monotonic() - started:.1f} s")
    shutil.make_archive(str(OUT / "runs"), "gztar", OUT / "work")
    shutil.rmtree(OUT / "work", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
