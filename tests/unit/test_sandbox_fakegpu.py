"""The sandbox's simulated nvidia-smi and dmesg (sandbox/fakegpu.py) against real recordings.

The GPU is simulated because none can exist here (nor in CI): these tests hold the fake to
what a real H200 printed (tests/unit/fixtures/nvidia_smi/: h200-580.159.04.json, and
h200-580.159.04-formats.json, taken on another lent H200 to check the refusal, `-q -d
COMPUTE`, units and a compute process), byte for byte, and run `node/gpus.py`'s `facts()`
against the fake's wrappers on PATH as the sandbox's nodes run it.
"""

from __future__ import annotations

import dataclasses
import doctest
import json
import os
from pathlib import Path

import pytest

from trainfleet.node import gpus
from trainfleet.sandbox import fakegpu
from trainfleet.sandbox.fakegpu import FakeGpuSpec, FakeProcess, nvidia_smi
from trainfleet.sandbox.faults import FAULTS, HEALTHY_GPUS

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia_smi"
RECORDING = json.loads((FIXTURES / "h200-580.159.04.json").read_text())
FORMATS = json.loads((FIXTURES / "h200-580.159.04-formats.json").read_text())["commands"]
ONE = FakeGpuSpec(gpus=1)
"""The recorded machine: one H200."""
VARIANTS = {name: kind.gpus for name, kind in FAULTS.items() if kind.gpus and name != "fake-gpu"}


def _args(entry: dict) -> str:
    return " ".join(entry["argv"][1:])


def _recorded(argv: list[str], recording: list[dict] = RECORDING) -> dict:
    return next(entry for entry in recording if entry["argv"] == argv)


def test_the_examples_in_its_docstring_hold():
    assert doctest.testmod(fakegpu).failed == 0


def test_the_embedded_recording_equals_the_fixture():
    alone = {}
    for entry in RECORDING:
        argv = entry["argv"]
        if len(argv) == 3 and argv[1].startswith("--query-gpu=") and "," not in argv[1]:
            name = argv[1].split("=")[1]
            if argv[2] == "--format=csv" and not name.startswith(fakegpu.OLD_CLOCKS):
                alone[name] = tuple(entry["stdout"].splitlines())
    assert fakegpu.RECORDED_GPU == alone
    remapped = next(e for e in RECORDING if _args(e).startswith("--query-remapped-rows"))
    headers, values = (line.split(", ") for line in remapped["stdout"].splitlines())
    assert fakegpu.RECORDED_REMAPPED == dict(
        zip(headers, zip(headers, values, strict=True), strict=True)
    )
    apps = next(e for e in RECORDING if _args(e).startswith("--query-compute-apps"))
    names = apps["argv"][1].split("=")[1].split(",")
    assert fakegpu.RECORDED_APPS == dict(
        zip(names, apps["stdout"].strip().split(", "), strict=True)
    )
    assert (
        f"CUDA Version{' ' * 43}: {fakegpu.RECORDED_CUDA}\n"
        in _recorded(["nvidia-smi", "-q"])["stdout"]
    )
    assert fakegpu.RECORDED_GPU["driver_version"][1] == fakegpu.RECORDED_DRIVER
    dmesg = _recorded(["sh", "-c", "dmesg 2>&1 | tail -n 50; echo rc=$?"])["stdout"]
    assert dmesg.splitlines()[-7:-1] == fakegpu.RECORDED_KERNEL_LOG


@pytest.mark.parametrize(
    "argv",
    [
        e["argv"]
        for e in RECORDING
        if e["argv"][0] == "nvidia-smi"
        and (_args(e).startswith("--query-") or _args(e) in ("nvlink --status", "-L"))
    ],
    ids=lambda argv: " ".join(argv[1:])[:60],
)
def test_each_recorded_command_is_answered_byte_for_byte(argv):
    """Every field alone, the combined query in both formats, remapped rows, compute apps
    (none running), nvlink (none: the recorded H200 is PCIe-attached), -L."""
    recorded = _recorded(argv)
    answer = nvidia_smi(ONE, argv[1:])
    assert (answer.stdout, answer.rc) == (recorded["stdout"], recorded["rc"])


def test_q_compute_opens_with_the_recorded_header_and_lists_each_gpu_as_the_device_did():
    recorded = _recorded(["nvidia-smi", "-q"])["stdout"].splitlines(keepends=True)
    said = nvidia_smi(ONE, ["-q", "-d", "COMPUTE"]).stdout.splitlines(keepends=True)
    timestamp = 3
    assert said[:timestamp] == recorded[:timestamp]
    assert said[timestamp + 1 : 7] == recorded[timestamp + 1 : 7]  # driver, CUDA 13.0, blank
    device = _recorded(["nvidia-smi", "-q", "-d", "COMPUTE"], FORMATS)["stdout"]
    assert said[timestamp + 1 :] == device.splitlines(keepends=True)[timestamp + 1 :]
    cuda = [line for line in said if line.startswith("CUDA Version")]
    assert cuda == [f"{'CUDA Version'.ljust(fakegpu.Q_LABEL_WIDTH)}: 13.0\n"]


SECOND_UUID = FORMATS[-1]["stdout"].strip().rsplit(", ", 1)[1]
SECOND = FakeGpuSpec(gpus=1, fields={0: {"uuid": SECOND_UUID, "temperature.gpu": "35"}})
"""The fake set to the second device's own UUID and temperature."""


@pytest.mark.parametrize(
    "entry",
    [e for e in FORMATS if e["argv"][1] != "-q" and "power" not in _args(e) and "while" not in e],
    ids=lambda e: _args(e)[:60],
)
def test_the_second_recordings_formats_are_answered_byte_for_byte(entry):
    """Refusals (stdout, exit 2), gpus.py's own queries (the legacy names' header says the new
    names), no process running, a query without --format."""
    answer = nvidia_smi(SECOND, entry["argv"][1:])
    assert (answer.stdout, answer.rc, answer.stderr) == (entry["stdout"], entry["rc"], "")


def test_nounits_keeps_the_header_units_and_a_process_row_reads_as_the_device_printed():
    spec = dataclasses.replace(
        ONE, processes=(FakeProcess(pid=577, name="python3", used_mib=4614, gpu=0),)
    )
    said = nvidia_smi(spec, ["--query-gpu=memory.total,utilization.gpu", "--format=csv,nounits"])
    assert said.stdout == "memory.total [MiB], utilization.gpu [%]\n143771, 0\n"
    for entry in FORMATS:
        if "while" in entry:  # a process held memory: its pid, name and use are the device's
            uuid = entry["stdout"].strip().rsplit(", ", 1)[1]
            expected = entry["stdout"].replace(uuid, fakegpu.gpu_uuid(0))
            pid = expected.splitlines()[-1].split(", ")[0]
            spec = dataclasses.replace(
                ONE, processes=(FakeProcess(pid=int(pid), name="python3", used_mib=4614, gpu=0),)
            )
            assert nvidia_smi(spec, entry["argv"][1:]).stdout == expected


@pytest.mark.parametrize("field", ["no.such.field", "memory.totally", "clocks_event_reasons"])
def test_an_unknown_field_is_refused_as_the_real_one_refuses_it(field):
    answer = nvidia_smi(HEALTHY_GPUS, [f"--query-gpu=index,{field}", "--format=csv"])
    assert answer == (f'Field "{field}" is not a valid field to query.\n\n', 2, "")


def test_a_command_it_does_not_simulate_says_so_and_fails():
    answer = nvidia_smi(HEALTHY_GPUS, ["-r", "-i", "0"])
    assert answer.rc != 0 and "not simulated" in answer.stderr and answer.stdout == ""


def test_each_gpu_has_its_own_index_uuid_and_bus_id_and_gpu_0_is_the_recorded_one():
    said = nvidia_smi(HEALTHY_GPUS, ["--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"])
    rows = [line.split(", ") for line in said.stdout.splitlines()]
    assert len(rows) == 8 and [r[0] for r in rows] == [str(k) for k in range(8)]
    assert len({r[1] for r in rows}) == 8 and len({r[2] for r in rows}) == 8
    assert rows[0][1:] == [fakegpu.RECORDED_GPU["uuid"][1], fakegpu.RECORDED_GPU["pci.bus_id"][1]]


def test_a_spec_travels_as_json_and_a_bad_one_names_the_field_and_the_fix():
    for spec in [HEALTHY_GPUS, *VARIANTS.values()]:
        assert FakeGpuSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    with pytest.raises(ValueError, match=r"fields\[1\]: unknown field\(s\) \['memory.usd'\]"):
        FakeGpuSpec(fields={1: {"memory.usd": "1"}})
    with pytest.raises(ValueError, match="GPU 8 of 8; use 0..7"):
        FakeGpuSpec(remapped={8: {"remapped_rows.pending": "Yes"}})
    with pytest.raises(ValueError, match="unknown key.*'gpu'.*valid:"):
        FakeGpuSpec.from_json({"gpu": 8})


def _every_answer(spec: FakeGpuSpec) -> dict[str, str]:
    """What each command gpus.py runs prints, by command (the -q timestamp left out)."""
    commands = {
        "gpu": ["--query-gpu=" + ",".join(gpus.FIELDS), "--format=csv,noheader,nounits"],
        "legacy": [
            "--query-gpu=" + ",".join(gpus.legacy_names(gpus.FIELDS)),
            "--format=csv,noheader,nounits",
        ],
        "remapped": ["--query-remapped-rows=" + ",".join(gpus.REMAPPED), "--format=csv"],
        "apps": ["--query-compute-apps=" + ",".join(gpus.APPS), "--format=csv"],
        "nvlink": ["nvlink", "--status"],
        "q": ["-q", "-d", "COMPUTE"],
    }
    said = {key: nvidia_smi(spec, argv) for key, argv in commands.items()}
    answers = {key: f"{a.rc}\n{a.stdout}{a.stderr}" for key, a in said.items()}
    answers["q"] = "".join(
        line for line in answers["q"].splitlines(keepends=True) if not line.startswith("Timestamp")
    )
    answers["dmesg"] = fakegpu.dmesg(spec, []).stdout
    return answers


CHANGED = {
    "fake-gpu-ecc": {"gpu", "legacy"},
    "fake-gpu-remap": {"remapped"},
    "fake-gpu-xid": {"dmesg"},
    "fake-gpu-mig": {"gpu", "legacy"},
    "fake-gpu-old-driver": {"gpu", "legacy", "q", "dmesg"},
    "fake-gpu-nvlink": {"nvlink"},
    "fake-gpu-pcie": {"gpu", "legacy"},
    "fake-gpu-throttled": {"gpu", "legacy"},
    "fake-gpu-persistence": {"gpu", "legacy"},
    "fake-gpu-count": {"gpu", "legacy", "remapped", "q"},
    "fake-gpu-busy": {"gpu", "legacy", "apps"},
    "fake-gpu-no-driver": {"gpu", "legacy", "remapped", "apps", "nvlink", "q", "dmesg"},
}


def test_every_gpu_fault_has_its_expected_changes_listed():
    assert set(CHANGED) == set(VARIANTS)


@pytest.mark.parametrize("name", sorted(CHANGED))
def test_each_variant_changes_what_it_says_and_nothing_else(name):
    healthy, variant = _every_answer(HEALTHY_GPUS), _every_answer(VARIANTS[name])
    assert {key for key in healthy if healthy[key] != variant[key]} == CHANGED[name]


@pytest.fixture
def fake_on_path(tmp_path, monkeypatch):
    """install(spec): the fake's wrappers first on PATH, as on a sandbox node."""

    def install(spec: FakeGpuSpec) -> None:
        bin_dir = fakegpu.write_wrappers(tmp_path / "fakegpu", spec)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    return install


def test_gpus_facts_reads_the_recorded_values_from_eight_healthy_gpus(fake_on_path):
    fake_on_path(HEALTHY_GPUS)
    found = gpus.facts()
    assert found["query"] == "health" and len(found["devices"]) == 8
    for index, device in enumerate(found["devices"]):
        expected = {f: fakegpu._bare(*fakegpu.RECORDED_GPU[f]) for f in gpus.FIELDS}
        expected |= {"index": str(index), "uuid": fakegpu.gpu_uuid(index)}
        expected["pci.bus_id"] = fakegpu.bus_id(index)
        assert device == expected
    assert [r["remapped_rows.pending"] for r in found["remapped"]] == ["No"] * 8
    assert (found["nvlink"], found["cuda_version"], found["processes"]) == ("", "13.0", [])
    assert found["kernel_log"] == {"source": "dmesg", "xid": [], "error": None}


def _one_change(found: dict, healthy: dict) -> dict:
    """{(GPU index, field): value} where `found`'s devices and remapped rows differ."""
    changed = {}
    for table in ("devices", "remapped"):
        for index, (new, old) in enumerate(zip(found[table], healthy[table], strict=False)):
            changed |= {(index, f): new[f] for f in new if new[f] != old.get(f)}
    return changed


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("fake-gpu-ecc", {(3, "ecc.errors.uncorrected.volatile.total"): "2"}),
        ("fake-gpu-remap", {(5, "remapped_rows.pending"): "Yes"}),
        ("fake-gpu-mig", {(0, "mig.mode.current"): "Enabled"}),
        ("fake-gpu-pcie", {(2, "pcie.link.width.current"): "8"}),
        (
            "fake-gpu-throttled",
            {
                (1, "clocks_event_reasons.hw_slowdown"): "Active",
                (1, "clocks_event_reasons.hw_thermal_slowdown"): "Active",
            },
        ),
        ("fake-gpu-persistence", {(k, "persistence_mode"): "Disabled" for k in range(8)}),
        ("fake-gpu-busy", {(0, "memory.used"): "30000"}),
    ],
)
def test_gpus_facts_reads_each_variants_changed_value(fake_on_path, name, expected):
    fake_on_path(HEALTHY_GPUS)
    healthy = gpus.facts()
    fake_on_path(VARIANTS[name])
    found = gpus.facts()
    assert _one_change(found, healthy) == expected
    assert found["query"] == "health" and len(found["devices"]) == 8


def test_gpus_facts_reads_the_other_variants(fake_on_path):
    fake_on_path(VARIANTS["fake-gpu-xid"])
    xid = gpus.facts()["kernel_log"]
    assert xid["source"] == "dmesg" and len(xid["xid"]) == 1
    assert "NVRM: Xid (PCI:0000:00:08): 79," in xid["xid"][0]  # GPU 2's bus
    fake_on_path(VARIANTS["fake-gpu-old-driver"])
    old = gpus.facts()
    assert (old["query"], old["cuda_version"]) == ("legacy", "11.4")
    assert {d["driver_version"] for d in old["devices"]} == {"470.256.02"}
    assert old["devices"][0]["clocks_event_reasons.hw_slowdown"] == "Not Active"
    fake_on_path(VARIANTS["fake-gpu-nvlink"])
    nvlink = gpus.facts()["nvlink"]
    assert nvlink.count("GB/s") == 8 * 18 - 1
    assert "GPU 6: NVIDIA H200" in nvlink and "\t Link 3: <inactive>\n" in nvlink
    fake_on_path(VARIANTS["fake-gpu-count"])
    assert len(gpus.facts()["devices"]) == 7
    fake_on_path(VARIANTS["fake-gpu-busy"])
    assert gpus.facts()["processes"] == [
        {
            "pid": "48213",
            "process_name": "python3",
            "used_memory": "30000",
            "gpu_uuid": fakegpu.gpu_uuid(0),
        }
    ]
    fake_on_path(VARIANTS["fake-gpu-no-driver"])
    failed = gpus.facts()
    assert failed == {"error": f"nvidia-smi exit 9: {fakegpu.NO_DRIVER.strip()}"}
