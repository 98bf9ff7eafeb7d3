"""A user's DeepSpeed JSON (`--deepspeed ds.json`), read and checked on the launch node before
anything starts: what it says is what runs, and what the memory preflight checks.

    >>> ds = parse_user_deepspeed('{"zero_optimization": {"stage": 2, "offload_optimizer":'
    ...     ' {"device": "cpu"}}, "train_micro_batch_size_per_gpu": "auto"}', "ds.json")
    >>> setup_changes(ds, "ds.json")
    {'zero': 2, 'offload': 'optimizer'}

"auto" values are filled from the training settings by HF Trainer, as it always does; a number
that disagrees with a setting is an error naming both, as HF's own check says ("Please correct
the following DeepSpeed config values that mismatch TrainingArguments values"), but before any
rank starts instead of on every rank.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainfleet.errors import TrainfleetError

OFFLOAD_DEVICES = ("none", "cpu", "nvme")


def read_user_deepspeed(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise TrainfleetError(
            f"--deepspeed {path}: no such file", "pass the DeepSpeed JSON your job uses"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TrainfleetError(f"--deepspeed {path}: cannot read it ({exc})", "check it") from None
    return parse_user_deepspeed(text, path)


def parse_user_deepspeed(text: str, source: str) -> dict[str, Any]:
    try:
        ds = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TrainfleetError(
            f"{source}:{exc.lineno}:{exc.colno}: not JSON ({exc.msg})",
            "fix the file (DeepSpeed reads JSON, no comments or trailing commas)",
        ) from None
    if not isinstance(ds, dict):
        raise TrainfleetError(f"{source}: not a JSON object", 'write {"zero_optimization": ...}')
    return ds


def _section(ds: dict, key: str, source: str) -> dict:
    value = ds.get(key, {})
    if not isinstance(value, dict):
        raise TrainfleetError(f"{source}: {key} must be an object", f'write "{key}": {{...}}')
    return value


def setup_changes(ds: dict, source: str) -> dict[str, Any]:
    """The planner's settings the JSON decides (ZeRO stage, offload), checked."""
    zero = _section(ds, "zero_optimization", source)
    stage = zero.get("stage", 0)  # DeepSpeed's default
    if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
        raise TrainfleetError(
            f"{source}: zero_optimization.stage {stage!r} is not a ZeRO stage", "use 0, 1, 2 or 3"
        )
    devices = {}
    for key in ("offload_optimizer", "offload_param"):
        device = _section(zero, key, source).get("device", "none")
        if device not in OFFLOAD_DEVICES:
            raise TrainfleetError(
                f"{source}: zero_optimization.{key}.device {device!r}",
                f"use one of {', '.join(OFFLOAD_DEVICES)}",
            )
        devices[key] = device
    if devices["offload_param"] != "none" and stage != 3:
        raise TrainfleetError(
            f"{source}: offload_param needs ZeRO stage 3 (stage is {stage})",
            "set zero_optimization.stage to 3, or remove offload_param",
        )
    offload = "none"
    if devices["offload_optimizer"] != "none":
        offload = "all" if devices["offload_param"] != "none" else "optimizer"
    elif devices["offload_param"] != "none":
        offload = "all"
    return {"zero": stage, "offload": offload}


def mismatches(ds: dict, settings: dict[str, Any], source: str) -> list[str]:
    """Values the JSON fixes (not "auto") that disagree with the training settings.
    `settings`: micro_batch_size, gradient_accumulation_steps, precision, max_grad_norm."""
    found = []
    pairs = [
        ("train_micro_batch_size_per_gpu", "micro_batch_size", "--per_device_train_batch_size"),
        ("gradient_accumulation_steps", "gradient_accumulation_steps",
         "--gradient_accumulation_steps"),
        ("gradient_clipping", "max_grad_norm", "--max_grad_norm"),
    ]  # fmt: skip
    for key, setting, flag in pairs:
        value = ds.get(key, "auto")
        if value != "auto" and value != settings[setting]:
            found.append(f"{source} {key}={value} but {flag} {settings[setting]}")
    for key in ("bf16", "fp16"):
        # Only what the JSON says: HF checks a section that is there, and so does this.
        enabled = _section(ds, key, source).get("enabled", "auto")
        if enabled != "auto" and bool(enabled) != (settings["precision"] == key):
            found.append(
                f"{source} {key}.enabled={json.dumps(enabled)} but the precision is "
                f"{settings['precision']}"
            )
    return found


def check_user_deepspeed(path: str, settings: dict[str, Any]) -> tuple[dict, dict[str, Any]]:
    """(the JSON as the user wrote it, the planner settings it decides). Raises
    TrainfleetError for a file DeepSpeed or HF would refuse on every rank."""
    ds = read_user_deepspeed(path)
    changes = setup_changes(ds, path)
    wrong = mismatches(ds, settings, path)
    if wrong:
        raise TrainfleetError(
            "the DeepSpeed JSON and the training settings disagree: " + "; ".join(wrong),
            'set the flag to the JSON\'s value, or write "auto" in the JSON (HF fills it in)',
        )
    return ds, changes
