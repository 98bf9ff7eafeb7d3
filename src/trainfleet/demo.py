"""`make demo`: the main job on the built-in default. A 2-node sandbox (each node with its own
interface name), `doctor` on it, `trainfleet train` of a tiny Llama with DeepSpeed ZeRO-3 across
the two nodes on a bundled chat task, the exported model's answers beside the expected ones,
and teardown; then the same cluster with a firewall fault, which `doctor` names.

    python -m trainfleet.demo

Without root (no network namespaces) it trains on this machine alone with 2 ranks. The sandbox
is always taken down, also when a step fails or on Ctrl-C. Everything the demo writes is in
./demo-run (model, data, checkpoints, metrics, loss.png, the exported model).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

from trainfleet import sandbox
from trainfleet.cli.main import main as trainfleet

DEMO_NAME = "demo"
IFNAMES = "ens14f0,ens14f1"
WORKDIR = Path("demo-run")
EVAL_CHATS = 100


def _step(argv: list[str]) -> int:
    print(f"\n$ trainfleet {shlex.join(argv)}", flush=True)
    return trainfleet(argv)


def _assets() -> tuple[Path, Path]:
    from trainfleet.train import demo_assets

    model, data = WORKDIR / "model", WORKDIR / "train.jsonl"
    if not (model / "config.json").exists():
        demo_assets.write_tokenizer(model)
        demo_assets.write_model(model, tokenizer_dir=model, seed=0)
    chats = demo_assets.RECIPE.train_chats
    if not data.exists():
        demo_assets.write_dataset(data, n=chats, seed=0)
    print(f"\n# a tiny Llama ({model}) and {chats} chats 'reverse <word>' ({data})")
    return model, data


def _train_argv(cluster: list[str], model: Path, data: Path) -> list[str]:
    from trainfleet.train.demo_assets import RECIPE

    return [
        "train",
        *cluster,
        "--model", str(model.resolve()),
        "--data", str(data.resolve()),
        "--output", str((WORKDIR / "output").resolve()),
        "--zero", "3",
        "--precision", "fp32",  # CPUs without bf16 matmul units are faster in fp32
        "--seq-len", "128",  # ~4 chats packed per sequence
        "--micro-batch-size", "8",  # x 2 ranks x ~4 chats a row: RECIPE's 64 chats a step
        "--max-steps", str(RECIPE.steps),
        "--learning-rate", str(RECIPE.learning_rate),
        "--warmup-steps", str(RECIPE.warmup_steps),
        "--save-steps", "200",
    ]  # fmt: skip


def _answers() -> int:
    from trainfleet.train import demo_assets

    final = WORKDIR / "output" / "final"
    answers = demo_assets.generate_answers(final, demo_assets.eval_examples(EVAL_CHATS, seed=1))
    print(f"\n# the exported model ({final}) on {EVAL_CHATS} words it never saw:")
    print(demo_assets.render_answers(answers))
    return 0 if demo_assets.accuracy(answers) >= 0.5 else 1


def run_demo() -> int:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("# not root: training on this machine alone, 2 ranks (no sandbox)")
        model, data = _assets()
        if _step(_train_argv(["--hosts", "localhost:2"], model, data)) != 0:
            return 1
        return _answers()

    cluster_file = str(sandbox.state.state_root() / DEMO_NAME / "cluster.yaml")
    up = ["sandbox", "up", "--name", DEMO_NAME, "--nodes", "2", "--slots", "1"]
    down = ["sandbox", "down", "--name", DEMO_NAME]
    model, data = _assets()
    if _step([*up, "--ifnames", IFNAMES]) != 0:
        return 1
    try:
        if _step(["doctor", "-c", cluster_file]) != 0:
            return 1
        if _step(_train_argv(["-c", cluster_file], model, data)) != 0:
            return 1
    finally:
        _step(down)
    if _answers() != 0:
        return 1
    # The seeds' worst case: ssh and port 29500 pass, NCCL's random ports are dropped.
    print("\n# the same cluster with a firewall on gpu-node-1 that drops all but ssh and 29500:")
    if _step([*up, "--fault", "firewall-blocks-ports@1"]) != 0:
        return 1
    try:
        found = _step(["doctor", "-c", cluster_file, "--quick"])
    finally:
        _step(down)
    return 0 if found == 1 else 1  # doctor must have found the error


if __name__ == "__main__":
    sys.exit(run_demo())
