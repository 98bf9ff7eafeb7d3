"""From bare servers to a first training step: the commands a user types, their wall time and
the bytes copied, on password-only sandboxes of 2 and 4 nodes.

    sudo .venv/bin/python bench/bare_to_step1.py [--sizes 2,4]

The servers: sshd takes only the test user's password, the nodes' python (/usr/bin/python3)
has no torch, each node has its own disk and no shared code, the master's firewall drops
NCCL's ports (the user may run the firewall tools with sudo). The project (the demo's tiny
model and data) is on this machine only. Two commands, as a user types them:

    trainfleet setup -c cluster.yaml --venv DIR/venv --code DIR/project --slots 1 \
        --password-stdin --yes
    trainfleet train -c cluster.yaml --model DIR/project/model --data ... --max-steps 1

Step 1 is when the first `step 1/` line arrives. Setup builds DeepSpeed's CPU ops on one
node and copies them to the others (the nodes share this machine's 2 cores), so the first
launch compiles nothing. The wheels are packed once per machine (the cache is kept): --cold
empties it first. Goal (#21): under 3 minutes for 2 nodes.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from trainfleet import sandbox
from trainfleet.train import demo_assets

GOAL_S = {2: 180.0}


def _project(root: Path) -> Path:
    project = root / "project"
    demo_assets.write_tokenizer(project / "model")
    demo_assets.write_model(project / "model", tokenizer_dir=project / "model", seed=0)
    demo_assets.write_dataset(project / "data.jsonl", n=400)
    return project


def one_size(nodes: int, cache: Path) -> dict:
    local = Path(tempfile.mkdtemp(prefix="tf-bench-local-"))
    local.chmod(0o755)
    name = f"bs{nodes}"
    box = sandbox.up(name=name, nodes=nodes, auth="password", faults=["firewall-blocks-ports@1"],
                     node_local_dir=str(local), login_shell="/bin/sh")  # fmt: skip
    try:
        project = _project(local)
        # Train's output is the one shared directory (every rank reads the tokenized data the
        # launch node wrote there); the ranks run as the test user, the launcher as root.
        shared = Path(tempfile.mkdtemp(prefix="tf-bench-shared-"))
        owner = (box.state_dir / "nodes" / box.nodes[0].hostname / "home").stat()
        os.chown(shared, owner.st_uid, owner.st_gid)
        cluster_file = local / "cluster.yaml"
        spec = yaml.safe_load(box.cluster_file.read_text())
        cluster_file.write_text(yaml.safe_dump({**spec, "python": "/usr/bin/python3"}))
        env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
        setup = [sys.executable, "-m", "trainfleet", "setup", "-c", str(cluster_file),
                 "--venv", str(local / "venv"), "--code", str(project), "--slots", "1",
                 "--password-stdin", "--yes"]  # fmt: skip
        started = time.monotonic()
        done = subprocess.run(setup, input=box.password_file.read_text(), text=True, env=env,
                              capture_output=True, check=False)  # fmt: skip
        setup_s = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(f"setup failed:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}")
        copied = sum(float(mb) for mb in re.findall(r"gpu-node-\d+ (\d+) MB", done.stdout))
        train = [sys.executable, "-m", "trainfleet", "train", "-c", str(cluster_file),
                 "--model", str(project / "model"), "--data", str(project / "data.jsonl"),
                 "--output", str(shared / "out"), "--max-steps", "1",
                 "--seq-len", "64"]  # fmt: skip
        started = time.monotonic()
        proc = subprocess.Popen(train, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, umask=0)  # fmt: skip
        step1_s, lines = None, []
        for line in proc.stdout:
            lines.append(line)
            if step1_s is None and "step 1/" in line:
                step1_s = time.monotonic() - started
        if proc.wait() != 0 or step1_s is None:
            raise SystemExit("train failed:\n" + "".join(lines[-40:]))
        started = time.monotonic()
        again = subprocess.run(setup[:-2] + ["--yes"], env=env, capture_output=True, text=True,
                               check=False)  # fmt: skip
        again_s = time.monotonic() - started
        unchanged = again.stdout.rstrip().endswith("trainfleet setup: nothing changed")
        shutil.rmtree(shared, ignore_errors=True)
        return {"nodes": nodes, "setup_s": setup_s, "step1_s": step1_s, "copied_mb": copied,
                "again_s": again_s, "again_unchanged": unchanged}  # fmt: skip
    finally:
        sandbox.down(name)
        shutil.rmtree(local, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2,4")
    parser.add_argument("--cold", action="store_true", help="pack the wheels anew")
    args = parser.parse_args()
    cache = Path(tempfile.gettempdir()) / "trainfleet-bench-wheel-cache"
    if args.cold:
        shutil.rmtree(cache, ignore_errors=True)
    print("nodes  commands  setup     train to step 1  total     wheels copied  setup again")
    for nodes in (int(n) for n in args.sizes.split(",")):
        row = one_size(nodes, cache)
        total = row["setup_s"] + row["step1_s"]
        goal = GOAL_S.get(nodes)
        verdict = f" (goal {goal:.0f} s: {'met' if total <= goal else 'missed'})" if goal else ""
        again = f"{row['again_s']:.1f} s, " + (
            "nothing changed" if row["again_unchanged"] else "CHANGED something"
        )
        print(f"{nodes:>5}  {2:>8}  {row['setup_s']:6.1f} s  {row['step1_s']:13.1f} s  "
              f"{total:6.1f} s  {row['copied_mb']:9.0f} MB  {again}{verdict}",
              flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
