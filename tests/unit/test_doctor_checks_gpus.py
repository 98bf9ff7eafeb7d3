"""Doctor's GPU health checks on node answers made from a real H200's nvidia-smi output.

No GPU can exist on the machines these tests run on: each node's answer (`node/gpus.py`'s
GpuFacts) is built from what nvidia-smi printed on an NVIDIA H200 (driver 580.159.04, CUDA
13.0; tests/unit/fixtures/nvidia_smi/h200-580.159.04.json, recorded by bench/gpu_validate.py),
one value per field, as eight GPUs, with one field changed per fault.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from doctor_fixtures import expect_one, make_survey, reparsed, sheets_of

from trainfleet.doctor.checks import gpus as checks
from trainfleet.doctor.checks import run_checks
from trainfleet.doctor.facts.parse import nvlink_states
from trainfleet.doctor.findings import Severity
from trainfleet.node import gpus

pytestmark = pytest.mark.unit

N1, N2, N3 = "gpu-node-1", "gpu-node-2", "gpu-node-3"
RECORDING = Path(__file__).parent / "fixtures" / "nvidia_smi" / "h200-580.159.04.json"


def _recorded_values() -> dict[str, str]:
    """{field: value} as `--format=csv,noheader,nounits` gives it, from the fields recorded
    one by one (`--format=csv`: a header, then the value with its unit)."""
    values = {}
    for record in json.loads(RECORDING.read_text()):
        argv = record["argv"]
        if len(argv) == 3 and argv[1].startswith("--query-gpu=") and "," not in argv[1]:
            header, value = record["stdout"].strip().splitlines()
            unit = header.partition(" [")[2].rstrip("]")
            values[argv[1].split("=", 1)[1]] = value.removesuffix(" " + unit) if unit else value
    return values


RECORDED = _recorded_values()


def h200_node(count: int = 8, *, change: dict[int, dict[str, str]] | None = None, **more) -> dict:
    """A node's GpuFacts: `count` recorded H200s (index, uuid, bus id made distinct), fields
    changed per GPU index as `change` says, the rest of the answer from `more`."""
    devices = []
    for index in range(count):
        device = {field: RECORDED[field] for field in gpus.FIELDS}
        device["index"] = str(index)
        device["uuid"] = RECORDED["uuid"][:-2] + f"{index:02x}"
        device["pci.bus_id"] = f"00000000:{0x18 + 0x10 * index:02X}:00.0"
        device.update((change or {}).get(index, {}))
        devices.append(device)
    answer = {
        "query": "health",
        "devices": devices,
        "remapped": [
            {
                "gpu_bus_id": d["pci.bus_id"],
                "remapped_rows.pending": "No",
                "remapped_rows.failure": "No",
                "remapped_rows.uncorrectable": "0",
            }
            for d in devices
        ],  # fmt: skip
        "nvlink": "",
        "cuda_version": "13.0",
        "processes": [],
        "kernel_log": {"source": "dmesg", "xid": [], "error": None},
        "error": None,
    }
    answer.update(more)
    return answer


@pytest.fixture
def survey(tmp_path):
    return make_survey(tmp_path, slots=dict.fromkeys((N1, N2, N3), 8))


def _with(survey, **answers):
    sheets = sheets_of(survey)
    for host in sheets:
        sheets[host]["gpus"] = h200_node()
    for host, answer in answers.items():
        sheets[host.replace("_", "-")]["gpus"] = answer
    return reparsed(survey, sheets)


def test_the_recorded_values_are_read_as_the_h200_said_them():
    assert RECORDED["name"] == "NVIDIA H200" and RECORDED["memory.total"] == "143771"
    assert RECORDED["retired_pages.pending"] == "[N/A]"  # Hopper remaps rows instead


def test_eight_healthy_h200s_raise_nothing(survey):
    healthy = _with(survey)
    facts = healthy.facts[N1].gpus
    assert facts is not None and len(facts.devices) == 8
    gpu = facts.devices[3]
    assert (gpu.index, gpu.name, gpu.memory_mib, gpu.driver) == (
        3,
        "NVIDIA H200",
        143771,
        "580.159.04",
    )
    assert (gpu.persistence, gpu.mig, gpu.ecc, gpu.ecc_uncorrected) == (True, False, True, 0)
    assert gpu.retired_pending is None and gpu.remap_pending is False  # [N/A]: not judged
    assert (gpu.pcie_width, gpu.pcie_width_max, gpu.slowdowns) == (16, 16, ())
    assert facts.cuda_version == "13.0" and facts.kernel_log == "dmesg"
    gpu_ids = {f.id.value for f in run_checks(healthy, started=0, finished=1e12)}
    assert not {i for i in gpu_ids if i.startswith(("gpu-", "nvlink", "cuda-driver", "nvidia"))}


def test_uncorrected_ecc_errors_are_an_error_naming_the_gpu_to_leave_out(survey):
    bad = h200_node(change={3: {"ecc.errors.uncorrected.volatile.total": "2"}})
    expect_one(
        checks.check_ecc(_with(survey, gpu_node_2=bad)),
        "gpu-ecc-uncorrected",
        Severity.ERROR,
        (N2,),
        evidence=["GPU 3 (00000000:48:00.0): 2 uncorrected ECC error(s)"],
        fix=["-e gpu-node-2:3", "nvidia-smi -r"],
    )


def test_a_gpu_left_out_of_the_slots_is_not_judged(survey):
    """What the fix says works: with `-e gpu-node-2:3` the node's slots skip GPU 3."""
    bad = h200_node(change={3: {"ecc.errors.uncorrected.volatile.total": "2"}})
    survey = _with(survey, gpu_node_2=bad)
    nodes = [
        dataclasses.replace(n, slots=7, gpu_ids=(0, 1, 2, 4, 5, 6, 7)) if n.host == N2 else n
        for n in survey.cluster.nodes
    ]
    left_out = dataclasses.replace(
        survey, cluster=dataclasses.replace(survey.cluster, nodes=tuple(nodes))
    )
    assert checks.check_ecc(survey) and checks.check_ecc(left_out) == []


@pytest.mark.parametrize(
    ("remap", "words"),
    [
        ({"remapped_rows.pending": "Yes"}, "waiting to be remapped"),
        ({"remapped_rows.failure": "Yes"}, "remapping failed"),
    ],
)
def test_rows_waiting_for_a_remap_or_a_failed_remap_are_an_error(survey, remap, words):
    bad = h200_node()
    bad["remapped"][5].update(remap)
    expect_one(
        checks.check_remapping(_with(survey, gpu_node_3=bad)),
        "gpu-remap-pending",
        Severity.ERROR,
        (N3,),
        evidence=["GPU 5", words],
        fix=["-e gpu-node-3:5"],
    )


def test_pages_pending_retirement_on_an_older_gpu_are_the_same_fault(survey):
    bad = h200_node(change={1: {"retired_pages.pending": "Yes"}}, remapped=None)
    survey = _with(survey, gpu_node_1=bad)
    assert survey.facts[N1].gpus.remapped_known is False
    expect_one(
        checks.check_remapping(survey),
        "gpu-remap-pending",
        Severity.ERROR,
        (N1,),
        evidence=["GPU 1", "retired"],
    )


def test_a_fatal_xid_is_an_error_on_its_gpu_and_another_a_warning(survey):
    fatal = (
        "[ 1843.3] NVRM: Xid (PCI:0000:38:00): 79, pid=1234, name=python, GPU has fallen off"
        " the bus."
    )
    other = "[ 1900.1] NVRM: Xid (PCI:0000:58:00): 13, pid=99, name=python, Graphics Exception"
    bad = h200_node(kernel_log={"source": "dmesg", "xid": [fatal, other], "error": None})
    found = checks.check_xid(_with(survey, gpu_node_2=bad))
    error = [f for f in found if f.severity is Severity.ERROR]
    expect_one(
        error,
        "gpu-xid",
        Severity.ERROR,
        (N2,),
        evidence=["GPU 2 (00000000:38:00.0): Xid 79 (GPU has fallen off the bus)"],
        fix=["-e gpu-node-2:2"],
    )
    warning = [f for f in found if f.severity is Severity.WARNING]
    expect_one(warning, "gpu-xid", Severity.WARNING, (N2,), evidence=["GPU 4", "Xid 13"])


def test_an_unreadable_kernel_log_is_said_not_guessed(survey):
    closed = {"source": None, "xid": [], "error": "dmesg: read kernel buffer failed"}
    survey = _with(survey, gpu_node_1=h200_node(kernel_log=closed))
    assert survey.facts[N1].gpus.kernel_log is None
    assert "read kernel buffer failed" in survey.facts[N1].gpus.kernel_log_error
    assert checks.check_xid(survey) == []


def test_mig_mode_is_an_error(survey):
    bad = h200_node(change={0: {"mig.mode.current": "Enabled"}})
    expect_one(
        checks.check_mig(_with(survey, gpu_node_1=bad)),
        "gpu-mig-enabled",
        Severity.ERROR,
        (N1,),
        evidence=["GPU 0"],
        fix=["-mig 0", "-e gpu-node-1:0"],
    )


@pytest.mark.parametrize(
    ("torch", "driver_cuda", "severity"),
    [("2.11.0+cu130", "12.4", Severity.ERROR), ("2.5.1+cu124", "12.2", Severity.WARNING)],
)
def test_a_driver_older_than_torchs_cuda(survey, torch, driver_cuda, severity):
    sheets = sheets_of(survey)
    for host in sheets:
        sheets[host]["gpus"] = h200_node()
    sheets[N2]["gpus"] = h200_node(cuda_version=driver_cuda)
    sheets[N2]["packages"] = {**sheets[N2].get("packages", {}), "torch": torch}
    expect_one(
        checks.check_cuda_driver(reparsed(survey, sheets)),
        "cuda-driver-too-old",
        severity,
        (N2,),
        evidence=[f"supports CUDA up to {driver_cuda}", torch],
        fix=[f"supports CUDA {torch[-3:-1]}.{torch[-1]}", f"CUDA {driver_cuda} or older"],
    )


def test_a_torch_whose_cuda_is_unknown_is_not_judged(survey):
    sheets = sheets_of(survey)
    sheets[N2]["gpus"] = h200_node(cuda_version="11.4")
    sheets[N2]["packages"] = {**sheets[N2].get("packages", {}), "torch": "2.5.1"}
    assert checks.check_cuda_driver(reparsed(survey, sheets)) == []


def test_nodes_on_different_drivers_are_a_warning(survey):
    older = h200_node(change={i: {"driver_version": "570.133.20"} for i in range(8)})
    expect_one(
        checks.check_driver_differs(_with(survey, gpu_node_3=older)),
        "gpu-driver-differs",
        Severity.WARNING,
        (N1, N2, N3),
        evidence=["570.133.20"],
    )


def _nvlink_text(count: int, down: dict[int, set[int]]) -> str:
    lines = []
    for gpu in range(count):
        lines.append(f"GPU {gpu}: NVIDIA H200 (UUID: GPU-{gpu})")
        for link in range(18):
            speed = "<inactive>" if link in down.get(gpu, set()) else "26.562 GB/s"
            lines.append(f"\t Link {link}: {speed}")
    return "\n".join(lines) + "\n"


def test_one_nvlink_down_where_the_others_are_up_is_a_warning(survey):
    bad = h200_node(nvlink=_nvlink_text(8, {6: {3}}))
    finding = expect_one(
        checks.check_nvlink(_with(survey, gpu_node_2=bad)),
        "nvlink-down",
        Severity.WARNING,
        (N2,),
        evidence=["GPU 6", "NVLink 3 down, 17 up"],
    )
    assert "-e gpu-node-2:6" in finding.fix


def test_a_node_without_nvlink_in_use_is_no_fault(survey):
    pcie_cards = h200_node(nvlink=_nvlink_text(2, {0: set(range(18)), 1: set(range(18))}))
    assert checks.check_nvlink(_with(survey, gpu_node_2=pcie_cards)) == []
    assert nvlink_states("GPU 0: x\n\t Link 0: some status nobody has seen\n") == {0: (0, (0,))}


def test_a_narrower_pcie_link_is_a_warning_and_a_lower_generation_is_not(survey):
    bad = h200_node(change={2: {"pcie.link.width.current": "8"}, 4: {"pcie.link.gen.current": "1"}})
    expect_one(
        checks.check_pcie(_with(survey, gpu_node_1=bad)),
        "gpu-pcie-degraded",
        Severity.WARNING,
        (N1,),
        evidence=["GPU 2", "x8 of x16"],
    )


def test_hardware_slowdowns_are_a_warning_and_idle_is_not(survey):
    bad = h200_node(
        change={1: {"clocks_event_reasons.hw_thermal_slowdown": "Active", "temperature.gpu": "91"}}
    )
    expect_one(
        checks.check_throttled(_with(survey, gpu_node_3=bad)),
        "gpu-throttled",
        Severity.WARNING,
        (N3,),
        evidence=["GPU 1", "hw_thermal_slowdown at 91 C"],
    )
    assert RECORDED["clocks_event_reasons.gpu_idle"] == "Active"  # the recording: idle


def test_persistence_off_is_a_warning_per_node(survey):
    off = h200_node(change={i: {"persistence_mode": "Disabled"} for i in range(8)})
    expect_one(
        checks.check_persistence(_with(survey, gpu_node_1=off)),
        "gpu-persistence-off",
        Severity.WARNING,
        (N1,),
        evidence=["every GPU"],
        fix=["nvidia-smi -pm 1"],
    )


def test_a_failing_nvidia_smi_is_an_error_and_basic_fields_a_warning(survey):
    failed = {"error": "nvidia-smi exit 9: NVIDIA-SMI has failed because it couldn't "
              "communicate with the NVIDIA driver."}  # fmt: skip
    found = checks.check_nvidia_smi(
        _with(survey, gpu_node_2=failed, gpu_node_3=h200_node(query="basic"))
    )
    expect_one(
        [f for f in found if f.severity is Severity.ERROR],
        "nvidia-smi-failed",
        Severity.ERROR,
        (N2,),
        evidence=["couldn't communicate"],
        fix=["-e gpu-node-2"],
    )
    expect_one(
        [f for f in found if f.severity is Severity.WARNING],
        "nvidia-smi-failed",
        Severity.WARNING,
        (N3,),
        evidence=["were not checked"],
    )


def test_nonsense_from_a_node_is_unknown_not_a_crash(survey):
    nonsense = h200_node(
        change={
            0: {
                "ecc.errors.uncorrected.volatile.total": "lots",
                "pcie.link.width.current": "-1",
                "index": "x",
            }
        }
    )
    nonsense["nvlink"] = 42
    nonsense["kernel_log"] = {"xid": ["NVRM: Xid (PCI:zz): no", 7]}
    survey = _with(survey, gpu_node_1=nonsense)
    assert survey.facts[N1].gpus.devices[0].ecc_uncorrected is None
    assert [f for check in (checks.check_ecc, checks.check_pcie, checks.check_xid,
                            checks.check_nvlink) for f in check(survey)] == []  # fmt: skip


def test_nvidia_smi_on_a_machine_without_gpus_is_no_gpu_not_a_failure(monkeypatch):
    """A CPU node with nvidia-smi installed: its driver finds no device. (The text is
    nvidia-smi's; the exit code is not relied on.)"""
    from trainfleet.node import system

    monkeypatch.setattr(system, "run", lambda argv, timeout=5.0: (6, "No devices were found\n", ""))
    assert gpus.facts() is None
    monkeypatch.setattr(system, "run", lambda argv, timeout=5.0: (9, "", "NVIDIA-SMI has failed"))
    failed = gpus.facts()
    assert failed is not None and failed["error"] == "nvidia-smi exit 9: NVIDIA-SMI has failed"
