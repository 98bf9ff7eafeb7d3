"""Packed vs padded training throughput on the bundled chat data, side by side in one run.

    .venv/bin/python bench/train_packing.py [--steps 40] [--micro-batch-size 8] [--repeat 2]

The demo's tiny Llama and its "reverse <word>" chats (trainfleet.train.demo_assets), trained
by `trainfleet train --hosts localhost:1` (one rank, DeepSpeed ZeRO-2 on CPU, fp32), once with
packing (the default: several chats per --seq-len row, padding-free) and once with
`--no-packing` (one chat per row, each batch padded to its longest row, as transformers'
padding collators do). Runs alternate, --repeat times each.

A third mode, "padded, same tokens": padding with a micro batch as many chats as a packed
batch holds on average, so that both feed about as many tokens per step: the first ratio is
what a user gets from switching packing on at the same micro batch (more tokens per step, no
padding), the second the share due to padding alone. On this CPU a tiny model's step has a
large fixed cost (DeepSpeed's step, the optimizer, gloo), so tokens per step weigh heavily.

Printed per mode: real (non-padding) tokens per second, the median over the logged steps after
the first --warmup (read from OUTPUT/metrics.jsonl, which counts non-padding tokens), the
share of padding in the batches (`data.measure_padding` on the same cache); then the ratios.
Absolute figures are this machine's CPU; the ratios are the comparison.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def _train(
    workdir: Path, output: Path, *, packing: bool, micro_batch_size: int, args: argparse.Namespace
) -> float:
    argv = [
        sys.executable, "-m", "trainfleet", "train", "--hosts", "localhost:1",
        "--model", str(workdir / "model"), "--data", str(workdir / "chats.jsonl"),
        "--output", str(output), "--zero", "2", "--precision", "fp32",
        "--max-steps", str(args.steps), "--micro-batch-size", str(micro_batch_size),
        "--seq-len", str(args.seq_len), "--learning-rate", "3e-3", "--no-export",
        "--no-preflight",
    ]  # fmt: skip
    if not packing:
        argv.append("--no-packing")
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"train failed ({'packed' if packing else 'padded'}):\n{proc.stdout}{proc.stderr}")
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["tokens_per_s"] for r in rows if r["step"] > args.warmup)


def _counts(output: Path, micro_batch_size: int):
    """(padding share of the batches, rows in the cache)."""
    from trainfleet.train import data

    dataset = data.load_cached(sorted((output / ".cache").iterdir())[-1])
    counts = data.measure_padding(dataset, batch_size=micro_batch_size)
    return 1 - counts.real_fraction, len(dataset)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5, help="logged steps left out")
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--chats", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from trainfleet.train import demo_assets

    with tempfile.TemporaryDirectory(prefix="tf-bench-packing-") as tmp:
        workdir = Path(tmp)
        demo_assets.write_tokenizer(workdir / "model")
        demo_assets.write_model(workdir / "model", tokenizer_dir=workdir / "model", seed=0)
        demo_assets.write_dataset(workdir / "chats.jsonl", n=args.chats)
        modes = {"packed": (True, args.micro_batch_size), "padded": (False, args.micro_batch_size)}
        speeds: dict[str, list[float]] = {}
        for attempt in range(args.repeat):
            for mode in ("packed", "padded", "padded, same tokens"):
                packing, micro_batch_size = modes[mode]
                output = workdir / f"{mode.replace(', ', '-').replace(' ', '-')}-{attempt}"
                speed = _train(workdir, output, packing=packing, micro_batch_size=micro_batch_size,
                               args=args)  # fmt: skip
                speeds.setdefault(mode, []).append(speed)
                print(f"  {mode} (micro batch {micro_batch_size}) run {attempt + 1}:"
                      f" {speed:,.0f} tokens/s", flush=True)  # fmt: skip
                if mode == "packed" and attempt == 0:
                    _, rows = _counts(output, args.micro_batch_size)
                    wide = round(args.micro_batch_size * args.chats / rows)
                    modes["padded, same tokens"] = (False, wide)
        table = []
        for mode, (_, micro_batch_size) in modes.items():
            slug = mode.replace(", ", "-").replace(" ", "-")
            padding, rows = _counts(workdir / f"{slug}-0", micro_batch_size)
            table.append((mode, micro_batch_size, statistics.median(speeds[mode]), rows, padding))

    print(
        f"\n{args.chats} chats, seq_len {args.seq_len}, {args.steps} steps, median of"
        f" {args.repeat} runs each (steps > {args.warmup}):"
    )
    print(f"{'mode':<20} {'micro batch':>11} {'real tokens/s':>14} {'rows':>6}  padding")
    for mode, micro_batch_size, speed, rows, padding in table:
        print(f"{mode:<20} {micro_batch_size:>11} {speed:>14,.0f} {rows:>6}  {padding:.0%}")
    packed = table[0][2]
    print(f"packed / padded at the same micro batch: {packed / table[1][2]:.2f}x")
    print(f"packed / padded with as many tokens per step: {packed / table[2][2]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
