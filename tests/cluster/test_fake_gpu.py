"""doctor against sandbox nodes with simulated GPUs: each GPU finding named on its node.

The GPUs are simulated because none can exist here (nor in CI): a `fake-gpu*` node's
nvidia-smi and dmesg are sandbox/fakegpu.py answering as a recorded H200, laid over the node's
/usr/bin, so doctor's probe runs them over ssh as it runs the real ones.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainfleet.cli.main import main
from trainfleet.cluster import load_cluster
from trainfleet.doctor import run_doctor
from trainfleet.remote import run_on_nodes
from trainfleet.sandbox.faults import FAULTS

pytestmark = pytest.mark.cluster

EXPECTED = {
    "fake-gpu-ecc": "gpu-ecc-uncorrected",
    "fake-gpu-remap": "gpu-remap-pending",
    "fake-gpu-xid": "gpu-xid",
    "fake-gpu-mig": "gpu-mig-enabled",
    "fake-gpu-old-driver": "cuda-driver-too-old",
    "fake-gpu-nvlink": "nvlink-down",
    "fake-gpu-pcie": "gpu-pcie-degraded",
    "fake-gpu-throttled": "gpu-throttled",
    "fake-gpu-persistence": "gpu-persistence-off",
    "fake-gpu-count": "gpu-count-mismatch",
    "fake-gpu-busy": "gpu-busy",
    "fake-gpu-no-driver": "nvidia-smi-failed",
}
"""The finding doctor must name for each fault (as FAULTS says: asserted below)."""
VARIANTS = list(EXPECTED)
GPU_IDS = set(EXPECTED.values())
SANDBOX = {
    # gpu-node-1: no GPU; gpu-node-2: healthy ones; then one variant per node. 8 slots each,
    # as on seed 000's servers (fake-gpu-count's 7 GPUs are one short).
    "nodes": 2 + len(VARIANTS),
    "slots": 8,
    "faults": ["fake-gpu@2", *(f"{name}@{k}" for k, name in enumerate(VARIANTS, 3))],
}
HOST = {name: f"gpu-node-{k}" for k, name in enumerate(VARIANTS, 3)}


def test_every_gpu_fault_is_expected_to_cause_the_id_faults_py_gives_it():
    assert {n: FAULTS[n].pitfall_id for n in EXPECTED} == EXPECTED
    assert {n for n, kind in FAULTS.items() if kind.gpus} == {"fake-gpu", *EXPECTED}


def test_doctor_counts_eight_gpus_on_the_fake_gpu_node_none_elsewhere_and_finds_nothing(
    make_sandbox, capsys
):
    box = make_sandbox(nodes=2, faults=["fake-gpu@2"])
    code = main(["doctor", "-c", str(box.cluster_file), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report["findings"]
    assert [report["nodes"][f"gpu-node-{k}"]["gpus"] for k in (1, 2)] == [0, 8]
    assert [f for f in report["findings"] if f["id"] in GPU_IDS] == []
    # Laid over that node's /usr/bin alone: node 1 (and this machine) have no nvidia-smi.
    cluster = load_cluster(cluster_file=str(box.cluster_file))
    found = run_on_nodes(cluster.nodes, ["sh", "-c", "command -v nvidia-smi || echo none"])
    assert [r.stdout.strip() for r in found] == ["none", "/usr/bin/nvidia-smi"]


@pytest.fixture(scope="module")
def report(module_sandbox):
    return run_doctor(load_cluster(cluster_file=str(module_sandbox.cluster_file)), quick=True)


@pytest.mark.parametrize("name", VARIANTS)
def test_doctor_names_each_gpu_finding_on_its_node_alone(report, name):
    nodes = {node for f in report.findings if f.id == EXPECTED[name] for node in f.nodes}
    assert nodes == {HOST[name]}, report.findings


ALLREDUCE = """\
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print("world", dist.get_world_size(), "sum", int(t.item()), flush=True)
"""


def test_launch_stops_before_anything_starts_and_runs_with_the_named_gpu_left_out(
    make_sandbox, tmp_path
):
    """4 slots per node; GPU 3 of node 2 has uncorrected ECC errors. The launch is refused
    with the `-e` that leaves it out; given that `-e`, 7 ranks run (on CPU: the GPUs are
    simulated, the ranks use gloo)."""
    box = make_sandbox(nodes=2, slots=4, faults=["fake-gpu-ecc@2"])
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)

    def launch(*args: str) -> tuple[int, str]:
        run_dir = tmp_path / f"run{len(args)}"
        argv = [sys.executable, "-m", "trainfleet", "launch", "-c", str(box.cluster_file),
                "--run-dir", str(run_dir), *args, "--", str(script)]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=tmp_path)
        return done.returncode, done.stdout + done.stderr

    code, out = launch()
    assert code != 0, out
    assert "the preflight doctor found errors; nothing was started" in out, out
    assert "gpu-ecc-uncorrected" in out and "leave the GPU out (-e gpu-node-2:3)" in out, out
    assert "world" not in out

    code, out = launch("-e", "gpu-node-2:3")
    assert code == 0, out
    assert out.count("world 7 sum 7") == 7, out
