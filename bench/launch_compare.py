"""trainfleet launch against DeepSpeed's runner launched by hand, side by side in one run.

    sudo .venv/bin/python bench/launch_compare.py [--sizes 2,4] [--repeat 3] [--cap 120]

1. Time from the command to every rank having finished a trivial gloo all_reduce
   (trainfleet/examples/allreduce.py) on 2 and 4 sandbox nodes: `trainfleet launch -c
   cluster.yaml -- allreduce.py` (with its preflight doctor, and with --no-preflight) against
   `deepspeed --hostfile ... allreduce.py` set up by hand as the seeds do (hostfile,
   .deepspeed_env with GLOO_SOCKET_IFNAME, pdsh's ssh options, --no_ssh_check because
   DeepSpeed's own ssh check ignores pdsh's ssh options). Runs alternate; medians are printed.
2. Time from the command to a diagnosis when a firewall on the master passes ssh and the master
   port but drops every other port: trainfleet (preflight; and --no-preflight, where the join
   watchdog fires after its default 60 s) against the deepspeed runner, capped at --cap s.

Every sandbox node shares this machine's 2 cores: absolute times are this machine's; the
ratios are the comparison.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainfleet import sandbox
from trainfleet.catalog import FindingId
from trainfleet.examples import ALLREDUCE

SCRIPT = ALLREDUCE
DEEPSPEED = Path(sys.executable).parent / "deepspeed"


def _run(argv: list[str], *, cwd: Path, env: dict | None = None, cap: float = 300):
    """(seconds, exit code or None when capped, output)."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=cap)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        # SIGINT: DeepSpeed's runner then kills its ranks on every node (its own pdsh pkill).
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        code = None
    return time.perf_counter() - start, code, out


def _trainfleet(box, cwd: Path, *extra: str, cap: float = 300):
    argv = [sys.executable, "-m", "trainfleet", "launch", "-c", str(box.cluster_file)]
    argv += ["--run-dir", str(cwd / f"run-{time.time_ns()}"), *extra, "--", str(SCRIPT)]
    return _run(argv, cwd=cwd, cap=cap)


def _deepspeed(box, cwd: Path, cap: float = 300):
    """The seeds' way: a hostfile, .deepspeed_env, pdsh with the right ssh options."""
    state = box.cluster_file.parent
    (cwd / ".deepspeed_env").write_text("GLOO_SOCKET_IFNAME=eth0\nDS_ACCELERATOR=cpu\n")
    master_addr = box.nodes[0].address
    argv = [str(DEEPSPEED), "--no_ssh_check", "--hostfile", str(state / "hostfile")]
    argv += ["--master_addr", master_addr, "--master_port", "29500", str(SCRIPT)]
    env = {"DS_ACCELERATOR": "cpu", "PDSH_SSH_ARGS_APPEND": f"-F {state / 'ssh_config'}"}
    return _run(argv, cwd=cwd, env=env, cap=cap)


def bench_start(count: int, repeat: int) -> dict[str, float]:
    box = sandbox.up(name=f"bl{count}", nodes=count)
    cwd = Path(tempfile.mkdtemp(prefix="trainfleet-bench-"))
    runs: dict[str, list[float]] = {"trainfleet": [], "no-preflight": [], "deepspeed": []}
    try:
        _trainfleet(box, cwd)  # warm-up: page cache, ssh connections
        for _ in range(repeat):
            for name, run in (
                ("trainfleet", lambda: _trainfleet(box, cwd)),
                ("no-preflight", lambda: _trainfleet(box, cwd, "--no-preflight")),
                ("deepspeed", lambda: _deepspeed(box, cwd)),
            ):
                seconds, code, out = run()
                if code != 0:
                    raise SystemExit(f"{name} failed on {count} nodes:\n{out[-3000:]}")
                runs[name].append(seconds)
    finally:
        sandbox.down(f"bl{count}")
    return {name: statistics.median(times) for name, times in runs.items()}


def bench_firewall(cap: float) -> list[tuple[str, float, str]]:
    box = sandbox.up(name="blfw", nodes=3, faults=["firewall-blocks-ports@1"])
    cwd = Path(tempfile.mkdtemp(prefix="trainfleet-bench-"))
    rows = []
    try:
        for name, run in (
            ("trainfleet launch", lambda: _trainfleet(box, cwd, cap=cap)),
            (
                "trainfleet launch --no-preflight",
                lambda: _trainfleet(box, cwd, "--no-preflight", cap=cap),
            ),
            ("deepspeed runner", lambda: _deepspeed(box, cwd, cap=cap)),
        ):
            seconds, code, out = run()
            named = FindingId.FIREWALL_BLOCKS_PORTS in out
            if code is None:
                verdict = f"no diagnosis within {cap:.0f} s (still running; stopped)"
            elif named:
                verdict = f"exit {code}, names {FindingId.FIREWALL_BLOCKS_PORTS} on gpu-node-1"
            else:
                last = [line for line in out.splitlines() if line.strip()][-1:]
                verdict = f"exit {code}, no cause named; last line: {last[0][:100] if last else ''}"
            rows.append((name, seconds, verdict))
    finally:
        sandbox.down("blfw")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2,4")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cap", type=float, default=120.0)
    args = parser.parse_args()
    print(f"2 cores; every sandbox node shares them; median of {args.repeat}\n")
    print("1. launch to every rank done (trivial gloo all_reduce)")
    print(f"{'nodes':>5} {'trainfleet':>11} {'--no-preflight':>15} {'deepspeed':>10} {'ratio':>7}")
    for count in (int(s) for s in args.sizes.split(",")):
        t = bench_start(count, args.repeat)
        ratio = t["trainfleet"] / t["deepspeed"]
        print(
            f"{count:>5} {t['trainfleet']:>10.2f}s {t['no-preflight']:>14.2f}s "
            f"{t['deepspeed']:>9.2f}s {ratio:>6.2f}x",
            flush=True,
        )
    print("\n2. firewall on the master (ssh and 29500 pass, other ports dropped), 3 nodes")
    for name, seconds, verdict in bench_firewall(args.cap):
        print(f"  {name:<34} {seconds:7.1f} s  {verdict}", flush=True)


if __name__ == "__main__":
    main()
