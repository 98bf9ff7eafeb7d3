"""`trainfleet train`: multi-node SFT / continued pretraining of a HF causal LM with DeepSpeed.

trainfleet train -c cluster.yaml --config train.yaml
trainfleet train --hosts a:8,b:8 --model /data/qwen-32b --data sft.jsonl --output /data/run1
"""

from __future__ import annotations

import argparse
import sys

from trainfleet.cli.common import CLUSTER_YAML_EXAMPLE, add_cluster_arguments, cluster_from_args

HELP = "multi-node SFT / continued pretraining of a Hugging Face causal LM with DeepSpeed ZeRO"
DESCRIPTION = """\
Checks the model directory and the data on this node (a bad record names its file and line;
nothing starts), tokenizes once into OUTPUT/.cache, then runs HF Trainer with DeepSpeed ZeRO
on every slot of every node through `trainfleet launch` (quick doctor first, per-node
environment, merged `[node:rank]` output, fail-fast). Checkpoints every --save-steps become
`latest` only once complete; running the same command again resumes from it. At the end the
model is exported to OUTPUT/final (consolidated safetensors + tokenizer), with the metrics in
OUTPUT/metrics.jsonl, TensorBoard files in OUTPUT/tensorboard and OUTPUT/loss.png. OUTPUT
must be storage every node sees."""

FLAGS = {
    "model": str,
    "data": str,
    "output": str,
    "zero": int,
    "offload": str,
    "precision": str,
    "max_steps": int,
    "micro_batch_size": int,
    "gradient_accumulation_steps": int,
    "seq_len": int,
    "learning_rate": float,
    "warmup_steps": int,
    "save_steps": int,
    "keep_checkpoints": int,
    "seed": int,
    "deepspeed_config": str,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cluster_arguments(parser)
    parser.add_argument("--config", metavar="train.yaml", help="every setting; flags override")
    settings = parser.add_argument_group("settings (also train.yaml keys, with _ for -)")
    for name, kind in FLAGS.items():
        settings.add_argument(f"--{name.replace('_', '-')}", type=kind, dest=name)
    settings.add_argument("--grad-ckpt", action="store_true", default=None, dest="grad_ckpt")
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
    parser.add_argument(
        "--hang-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="stop when no rank advanced a step (or a phase: saving, exporting) for S"
        " seconds, after dumping every rank's stack into RUN_DIR/stacks (default 300; 0: off)",
    )
    parser.epilog = CLUSTER_YAML_EXAMPLE


def run(args: argparse.Namespace) -> int:
    from trainfleet.cli.launch_cmd import _render_findings, render_outcome
    from trainfleet.launch import PreflightFailed
    from trainfleet.train import load_train_config, run_train

    overrides = {name: getattr(args, name) for name in [*FLAGS, "grad_ckpt", "packing", "export"]}
    config = load_train_config(args.config, overrides)
    cluster = cluster_from_args(args)
    try:
        result, plan = run_train(
            cluster,
            config,
            preflight=args.preflight,
            join_timeout=args.join_timeout,
            hang_timeout=args.hang_timeout or None,
            max_restarts=args.max_restarts,
        )
    except PreflightFailed as exc:
        print(
            "trainfleet: the preflight doctor found errors; nothing was started:", file=sys.stderr
        )
        print("\n".join(_render_findings(exc.report.findings)), file=sys.stderr)
        return 1
    print(render_outcome(result, plan), file=sys.stderr)
    return result.exit_code
