"""`trainfleet train`: multi-node SFT / continued pretraining of a HF causal LM with DeepSpeed.

trainfleet train -c cluster.yaml --config train.yaml
trainfleet train --hosts a:8,b:8 --model /data/qwen-32b --data sft.jsonl --output /data/run1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from trainfleet.cli.common import (
    CLUSTER_YAML_EXAMPLE,
    add_cluster_arguments,
    add_hang_timeout_argument,
    add_startup_timeout_argument,
    cluster_from_args,
    preflight_lines,
)
from trainfleet.cli.slurm_job import (
    add_slurm_arguments,
    in_job,
    requeue_if_signalled,
    submit_job,
    submits_job,
)
from trainfleet.hf_names import HF_NAMES
from trainfleet.launch import backends

if TYPE_CHECKING:
    from trainfleet.train.config import TrainConfig

HELP = "multi-node SFT / continued pretraining of a Hugging Face causal LM with DeepSpeed ZeRO"
DESCRIPTION = """\
Checks the model directory and the data on this node (a bad record names its file and line;
nothing starts), tokenizes once into OUTPUT/.cache, then runs HF Trainer with DeepSpeed ZeRO
on every slot of every node through `trainfleet launch` (quick doctor first, per-node
environment, merged `[node:rank]` output, fail-fast). Checkpoints every --save-steps become
`latest` only once complete; running the same command again resumes from it. At the end the
model is exported to OUTPUT/final (consolidated safetensors + tokenizer), with the metrics in
OUTPUT/metrics.jsonl, TensorBoard files in OUTPUT/tensorboard and OUTPUT/loss.png. OUTPUT
must be storage every node sees. On Slurm: inside `salloc`/`sbatch` it trains on the job's
nodes; from a login node, `--backend slurm --nodes N` submits this same command as a batch job
(its script and output in OUTPUT/slurm/) and follows it here."""

BACKENDS = ("ssh", "slurm")
"""The launch backends train runs on (its ranks are torchrun's: not DeepSpeed's runner)."""

FLAGS = {
    "model": str,
    "data": str,
    "output": str,
    "zero": int,
    "offload": str,
    "precision": str,
    "max_steps": int,
    "num_train_epochs": float,
    "micro_batch_size": int,
    "gradient_accumulation_steps": int,
    "seq_len": int,
    "learning_rate": float,
    "warmup_steps": float,
    "warmup_ratio": float,
    "lr_scheduler": str,
    "weight_decay": float,
    "max_grad_norm": float,
    "save_steps": int,
    "logging_steps": int,
    "keep_checkpoints": int,
    "seed": int,
    "deepspeed_config": str,
}
HF_BOOLEANS = {"bf16": ("precision", "bf16"), "fp16": ("precision", "fp16"),
               "gradient_checkpointing": ("grad_ckpt", True)}  # fmt: skip


def _hf_bool(text: str) -> bool:
    """HF's spelling of booleans: `--bf16`, `--bf16 true`, `--bf16 False`."""
    value = text.strip().lower()
    if value in ("true", "1", "yes", "y"):
        return True
    if value in ("false", "0", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cluster_arguments(parser)
    parser.add_argument("--backend", choices=BACKENDS, help=backends.help_text(BACKENDS))
    add_slurm_arguments(parser)
    parser.add_argument("--config", metavar="train.yaml", help="every setting; flags override")
    settings = parser.add_argument_group(
        "settings (also train.yaml keys, with _ for -); HF TrainingArguments names work too"
    )
    hf_for = {ours: theirs for theirs, ours in HF_NAMES.items()}
    for name, kind in FLAGS.items():
        spellings = [f"--{name.replace('_', '-')}"]
        if "_" in name:
            spellings.append(f"--{name}")
        if name in hf_for:
            spellings.append(f"--{hf_for[name]}")
        settings.add_argument(*spellings, type=kind, dest=name, metavar=name.upper())
    settings.add_argument("--grad-ckpt", action="store_true", default=None, dest="grad_ckpt")
    for name, (dest, _value) in HF_BOOLEANS.items():
        settings.add_argument(
            f"--{name}",
            nargs="?",
            const=True,
            type=_hf_bool,
            dest=f"hf_{name}",
            metavar="BOOL",
            help=f"HF's --{name}: sets {dest}",
        )
    settings.add_argument(
        "--no-packing", action="store_false", default=None, dest="packing", help="pad instead"
    )
    settings.add_argument(
        "--no-export", action="store_false", default=None, dest="export", help="no OUTPUT/final"
    )
    parser.add_argument("--no-preflight", dest="preflight", action="store_false")
    parser.add_argument("--join-timeout", type=float, default=120.0, metavar="S")
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="N",
        help="after a crash, a hang or a stall: quick preflight, relaunch, resume from the latest"
        " complete checkpoint, up to N times (each logged in OUTPUT/restarts.jsonl)",
    )
    add_hang_timeout_argument(parser)
    add_startup_timeout_argument(parser)
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the outcome as JSON on stdout at the end (the ranks' lines go to stderr)",
    )
    parser.epilog = CLUSTER_YAML_EXAMPLE


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """train.yaml (--config) with the flags given on top, HF's spellings included."""
    from trainfleet.train import load_train_config

    overrides = {name: getattr(args, name) for name in [*FLAGS, "grad_ckpt", "packing", "export"]}
    overrides.update(hf_booleans(args))
    return load_train_config(args.config, overrides)


def hf_booleans(args: argparse.Namespace) -> dict:
    """--bf16/--fp16/--gradient_checkpointing as the settings they are here."""
    from trainfleet.errors import TrainfleetError

    if args.hf_bf16 and args.hf_fp16:
        raise TrainfleetError("--bf16 and --fp16 both given", "pass one of them")
    if (args.hf_bf16 or args.hf_fp16) and args.precision:
        raise TrainfleetError(
            f"--precision {args.precision} and --{'bf16' if args.hf_bf16 else 'fp16'} both given",
            "pass one of them",
        )
    found = {}
    for name, (dest, value) in HF_BOOLEANS.items():
        given = getattr(args, f"hf_{name}")
        if given is True:
            found[dest] = value
        elif given is False and dest == "grad_ckpt":
            found[dest] = False
        elif given is False and args.precision is None:
            found.setdefault(dest, "fp32")  # `--bf16 false`: full precision
    return found


def outcome_of(output: str) -> dict:
    """What --json adds to the launch outcome: where the run wrote, its last logged step and
    loss (OUTPUT/metrics.jsonl, None before the first), and the export (None until written)."""
    last = {}
    metrics = Path(output) / "metrics.jsonl"
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill
            if isinstance(row, dict) and "loss" in row:
                last = row
    final = Path(output) / "final"
    return {
        "output": output,
        "last_step": last.get("step"),
        "last_loss": last.get("loss"),
        "final": str(final) if (final / "config.json").exists() else None,
    }


def run(args: argparse.Namespace) -> int:
    from trainfleet.cli.launch_cmd import render_outcome
    from trainfleet.launch import PreflightFailed
    from trainfleet.train import run_train

    config = config_from_args(args)
    if submits_job(args):
        if not Path(config.model).is_dir():
            print(f"trainfleet: note: --model {config.model} is not a directory on this machine:"
                  " the job fails unless its nodes have it", file=sys.stderr)  # fmt: skip
        return submit_job(args, run_dir=None, directory=_submission_dir(config.output))
    cluster = cluster_from_args(args)
    job = in_job(args)
    try:
        result, plan = run_train(
            cluster,
            config,
            preflight=args.preflight,
            join_timeout=args.join_timeout,
            hang_timeout=args.hang_timeout or None,
            startup_timeout=args.startup_timeout or None,
            max_restarts=args.max_restarts,
            backend=args.backend,
            preempt_signal=job.preempt_signal,
            slurm_restart=(job.job_id, job.restart) if job.job_id and job.restart else None,
            # With --json, stdout holds only the JSON outcome.
            out=sys.stderr if args.json else None,
        )
    except PreflightFailed as exc:
        print("\n".join(preflight_lines(exc.report.findings, args)), file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({**result.to_json(), **outcome_of(config.output)}, indent=2))
    else:
        print(render_outcome(result, plan), file=sys.stderr)
    if requeue_if_signalled(job, result.signalled):
        return 0
    return result.exit_code


def _submission_dir(output: str) -> Path:
    """OUTPUT/slurm/TIME-XXXX: where a submitted job's script and output go."""
    from trainfleet.launch import new_run_id

    return Path(output).absolute() / "slurm" / new_run_id()
