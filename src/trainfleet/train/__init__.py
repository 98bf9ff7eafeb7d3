"""`trainfleet train`: multi-node SFT and continued pretraining of Hugging Face causal LMs with
DeepSpeed ZeRO, started on every slot of every node through `trainfleet launch`.

    >>> from trainfleet.cluster import load_cluster
    >>> config = load_train_config("train.yaml", {})  # doctest: +SKIP
    >>> run_train(load_cluster(cluster_file="cluster.yaml"), config)  # doctest: +SKIP
    0

On the launch node, before any rank starts: the model directory and the data are checked (a
hub name, a missing path, an empty dataset, a bad record, a sample too long are errors here,
with the file and line), and the data is tokenized once into OUTPUT/.cache. Then
`worker.py` runs on every rank. OUTPUT must be the same storage on every node (NFS, or the
sandbox's shared filesystem): checkpoints, the data cache and the export live there.

Modules: `config` (train.yaml and flags; HF's TrainingArguments names too), `user_deepspeed`
(a user's --deepspeed JSON, checked here), `data` (records, masks, packing, the cache),
`worker` (what each rank runs), `checkpoints` (complete-or-nothing checkpoints, `latest`),
`metrics` (JSONL, TensorBoard, progress, loss curve), `demo_assets` (the built-in demo).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from trainfleet.cluster import Cluster
from trainfleet.errors import TrainfleetError
from trainfleet.heartbeat import HANG_TIMEOUT_S
from trainfleet.plan.memory import TrainSetup
from trainfleet.train import checkpoints, user_deepspeed
from trainfleet.train.config import TrainConfig, load_train_config

if TYPE_CHECKING:
    from trainfleet.doctor import DoctorReport
    from trainfleet.doctor.facts import NodeFacts
    from trainfleet.launch.backend import Plan
    from trainfleet.launch.result import LaunchResult

__all__ = ["TrainConfig", "check_model_dir", "load_train_config", "run_train"]

_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def check_model_dir(model: str) -> Path:
    path = Path(model)
    if not path.exists():
        if _HUB_NAME.match(model):
            raise TrainfleetError(
                f"--model {model}: no such directory; it looks like a Hugging Face hub name,"
                " and trainfleet downloads nothing while training",
                f"download it once (`huggingface-cli download {model} --local-dir DIR`) to"
                " storage every node sees, then pass --model DIR",
            )
        raise TrainfleetError(f"--model {model}: no such directory", "pass a local model dir")
    if not (path / "config.json").is_file():
        raise TrainfleetError(
            f"--model {model}: no config.json in it",
            "pass a Hugging Face model directory (config.json, *.safetensors, tokenizer files)",
        )
    return path


def run_train(
    cluster: Cluster,
    config: TrainConfig,
    *,
    preflight: bool = True,
    join_timeout: float = 120.0,
    hang_timeout: float | None = HANG_TIMEOUT_S,
    startup_timeout: float | None = 1800.0,
    max_restarts: int = 0,
    backend: str | None = None,
    preempt_signal: str | None = None,
    slurm_restart: tuple[str, int] | None = None,
    out: TextIO | None = None,
) -> tuple[LaunchResult, Plan]:
    """Check, tokenize, launch; after a crash, a hang or a stall, up to `max_restarts` times:
    the quick preflight again and a new launch that resumes from the latest checkpoint
    (`launch/restarts.py`). Returns (LaunchResult, plan); raises PreflightFailed when the
    quick doctor finds errors, TrainfleetError for bad input (nothing started then).
    `backend`: a launch backend's name (None: the cluster's default, `backends.default_for`).
    `preempt_signal`: the signal the ranks get before a Slurm job's time limit (`--requeue`):
    they save a checkpoint and stop. `slurm_restart`: (job, SLURM_RESTART_COUNT) of a job Slurm
    started again, logged with the restarts."""
    from trainfleet.launch import LaunchOptions, new_run_id, restarts
    from trainfleet.launch.backends import default_for
    from trainfleet.launch.restarts import launch_with_restarts
    from trainfleet.train import data

    check_model_dir(config.model)
    output = config.output_dir
    check_output_dir(output)
    output.mkdir(parents=True, exist_ok=True)
    out = out or sys.stdout
    cache = data.prepare_cache(config, output / ".cache", out=out)
    rows = data.load_cached(cache).summary.rows
    derived = config.max_steps is None and config.num_train_epochs is not None
    config = config.with_steps(rows, cluster.world_size)
    if derived:
        print(
            f"steps: {config.max_steps} ({config.num_train_epochs:g} epoch(s) of {rows:,} rows"
            f" on {cluster.world_size} rank(s), micro batch {config.micro_batch_size},"
            f" accumulation {config.gradient_accumulation_steps})",
            file=out,
            flush=True,
        )
    spec = {"config": config.to_json(), "cache": str(cache)}
    setup = config.plan_setup()
    if config.deepspeed_config:
        # What the user wrote is what runs (read here, sent with the job: the nodes need not
        # see the file) and what the memory check checks.
        spec["deepspeed"], changes = user_deepspeed.check_user_deepspeed(
            config.deepspeed_config, settings=config.to_json()
        )
        setup = dataclasses.replace(setup, **changes)
    encoded = base64.b64encode(json.dumps(spec).encode()).decode()
    options = LaunchOptions(
        command=("-m", "trainfleet.train.worker", encoded),
        backend=backend or default_for(cluster),
        preempt_signal=preempt_signal,
        restart=slurm_restart[1] if slurm_restart else 0,
        run_id=new_run_id(),
        local_rank_arg="never",
        join_timeout=join_timeout,
        hang_timeout=hang_timeout,
        startup_timeout=startup_timeout,
    )

    def check_fit(plan: Plan, report: DoctorReport) -> None:
        facts = report.survey.facts if report.survey else {}
        check_memory(config, plan.rank_ranges(), facts, strict=preflight, out=out, setup=setup)

    requeued = None
    if slurm_restart:
        job, count = slurm_restart
        requeued = restarts.slurm_restart(output / "restarts.jsonl", job=job, restart=count,
                                          run_id=options.run_id)  # fmt: skip
    return launch_with_restarts(
        cluster,
        options,
        max_restarts=max_restarts,
        run_dir_of=lambda attempt: output / "runs" / attempt.run_id,
        log=output / "restarts.jsonl",
        then="the run resumes from its latest complete checkpoint",
        preflight=preflight,
        on_first_plan=check_fit,
        out=out,
        requeued=requeued,
    )


def check_output_dir(output: Path) -> None:
    """Refuses an output directory holding checkpoints trainfleet did not write: a resume there
    would mix runs, and trainfleet's rotation must never touch them."""
    foreign = checkpoints.foreign_checkpoints(output)
    if foreign:
        names = ", ".join(p.name for p in foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise TrainfleetError(
            f"{output} holds {len(foreign)} checkpoint(s) trainfleet did not write ({names};"
            " a Hugging Face run's?): trainfleet would resume beside them",
            "use another --output (nothing there is changed), or move them out",
        )


def check_memory(
    config: TrainConfig,
    rank_ranges: dict[str, range],
    facts: Mapping[str, NodeFacts],
    *,
    strict: bool,
    out: TextIO,
    setup: TrainSetup | None = None,
) -> None:
    """The planner's memory figures for this run against each node's (`train/preflight.py`);
    raises WontFit when a node is short (`strict`; else the problems are printed)."""
    from trainfleet.plan.model import ModelShape
    from trainfleet.train import preflight as fit_check

    try:
        shape = ModelShape.from_path(config.model)
    except TrainfleetError as exc:  # a family the planner cannot count: train anyway
        print(f"trainfleet train: no memory check: {exc.what}", file=out, flush=True)
        return
    setup = setup or config.plan_setup()
    ranks_per_node = {host: len(ranks) for host, ranks in rank_ranges.items()}
    fit = fit_check.check_fit(shape, setup, ranks_per_node=ranks_per_node, facts=facts)
    print("\n".join(fit.lines), file=out, flush=True)
    if not fit.problems:
        return
    if not strict:
        print(f"trainfleet train: warning: {'; '.join(fit.problems)}", file=out, flush=True)
        return
    world = sum(ranks_per_node.values())
    fix = fit_check.what_would_fit(
        shape, setup, ranks_per_node=ranks_per_node, facts=facts, model=config.model,
        global_batch=config.micro_batch_size * config.gradient_accumulation_steps * world,
    )  # fmt: skip
    raise fit_check.WontFit(
        "the plan says this run does not fit, nothing was started:\n  " + "\n  ".join(fit.problems),
        fix + " (--no-preflight starts it anyway)",
    )
