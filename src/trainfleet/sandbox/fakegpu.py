"""A simulated `nvidia-smi` (and `dmesg`) for sandbox nodes, answering from a real H200.

No GPU can exist in the sandbox (nor in CI), so a node given a `fake-gpu*` fault runs this
file, through two-line wrappers, as its `nvidia-smi` and `dmesg`. It answers the commands
`trainfleet.node.gpus` runs in nvidia-smi's own formats, with the values an H200 (driver
580.159.04, CUDA 13.0) gave when recorded (tests/unit/fixtures/nvidia_smi/), changed where a
FakeGpuSpec says so:

    >>> spec = FakeGpuSpec(gpus=2, fields={1: {"memory.used": "30000"}})
    >>> print(nvidia_smi(spec, ["--query-gpu=index,memory.used", "--format=csv"]).stdout, end="")
    index, memory.used [MiB]
    0, 0 MiB
    1, 30000 MiB
    >>> print(nvidia_smi(spec, ["--query-gpu=bogus", "--format=csv"]).stdout, end="")
    Field "bogus" is not a valid field to query.
    <BLANKLINE>

Only fields the recording holds are known; any other is refused as the real one refuses a
field it does not know (checked on a lent H200: stdout, exit 2; the other recording beside
the fixture). GPU k's index, uuid and pci.bus_id are derived from the recorded GPU's (GPU 0
is that GPU). It runs on this machine only (Python 3.11 is fine), as a file with the standard
library alone: `main()` reads the spec file its wrapper names (`write_wrappers`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import stat
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

# The recording (tests/unit/fixtures/nvidia_smi/h200-580.159.04.json), copied as data: each
# field asked alone with --format=csv gave (header, value). test_sandbox_fakegpu.py asserts
# these equal the fixture, so they cannot drift from it.
RECORDED_GPU: dict[str, tuple[str, str]] = {
    "index": ("index", "0"),
    "uuid": ("uuid", "GPU-a46f2210-a63b-4031-6311-9d99841a68c5"),
    "name": ("name", "NVIDIA H200"),
    "pci.bus_id": ("pci.bus_id", "00000000:00:06.0"),
    "driver_version": ("driver_version", "580.159.04"),
    "persistence_mode": ("persistence_mode", "Enabled"),
    "mig.mode.current": ("mig.mode.current", "Disabled"),
    "ecc.mode.current": ("ecc.mode.current", "Enabled"),
    "ecc.errors.uncorrected.volatile.total": ("ecc.errors.uncorrected.volatile.total", "0"),
    "ecc.errors.uncorrected.aggregate.total": ("ecc.errors.uncorrected.aggregate.total", "0"),
    "retired_pages.pending": ("retired_pages.pending", "[N/A]"),
    "clocks_event_reasons.active": ("clocks_event_reasons.active", "0x0000000000000001"),
    "clocks_event_reasons.hw_slowdown": ("clocks_event_reasons.hw_slowdown", "Not Active"),
    "clocks_event_reasons.hw_thermal_slowdown": (
        "clocks_event_reasons.hw_thermal_slowdown",
        "Not Active",
    ),
    "clocks_event_reasons.hw_power_brake_slowdown": (
        "clocks_event_reasons.hw_power_brake_slowdown",
        "Not Active",
    ),
    "clocks_event_reasons.sw_thermal_slowdown": (
        "clocks_event_reasons.sw_thermal_slowdown",
        "Not Active",
    ),
    "pcie.link.gen.current": ("pcie.link.gen.current", "5"),
    "pcie.link.gen.max": ("pcie.link.gen.max", "5"),
    "pcie.link.width.current": ("pcie.link.width.current", "16"),
    "pcie.link.width.max": ("pcie.link.width.max", "16"),
    "temperature.gpu": ("temperature.gpu", "38"),
    "memory.total": ("memory.total [MiB]", "143771 MiB"),
    "memory.used": ("memory.used [MiB]", "0 MiB"),
    "serial": ("serial", "1653824070576"),
    "vbios_version": ("vbios_version", "96.00.A5.00.1A"),
    "compute_cap": ("compute_cap", "9.0"),
    "compute_mode": ("compute_mode", "Default"),
    "mig.mode.pending": ("mig.mode.pending", "Disabled"),
    "ecc.mode.pending": ("ecc.mode.pending", "Enabled"),
    "ecc.errors.corrected.volatile.total": ("ecc.errors.corrected.volatile.total", "0"),
    "retired_pages.double_bit.count": ("retired_pages.double_bit.count", "[N/A]"),
    "retired_pages.single_bit_ecc.count": ("retired_pages.single_bit_ecc.count", "[N/A]"),
    "clocks_event_reasons.sw_power_cap": ("clocks_event_reasons.sw_power_cap", "Not Active"),
    "clocks_event_reasons.gpu_idle": ("clocks_event_reasons.gpu_idle", "Active"),
    "pcie.link.gen.gpucurrent": ("pcie.link.gen.gpucurrent", "5"),
    "pcie.link.gen.gpumax": ("pcie.link.gen.gpumax", "5"),
    "pcie.link.gen.hostmax": ("pcie.link.gen.hostmax", "[N/A]"),
    "temperature.memory": ("temperature.memory", "42"),
    "power.draw": ("power.draw [W]", "79.69 W"),
    "power.limit": ("power.limit [W]", "700.00 W"),
    "clocks.sm": ("clocks.current.sm [MHz]", "345 MHz"),
    "clocks.max.sm": ("clocks.max.sm [MHz]", "1980 MHz"),
    "utilization.gpu": ("utilization.gpu [%]", "0 %"),
    "memory.free": ("memory.free [MiB]", "143156 MiB"),
    "fabric.state": ("fabric.state", "N/A"),
    "fabric.status": ("fabric.status", "N/A"),
}
RECORDED_REMAPPED: dict[str, tuple[str, str]] = {
    "gpu_bus_id": ("gpu_bus_id", "00000000:00:06.0"),
    "gpu_uuid": ("gpu_uuid", "GPU-a46f2210-a63b-4031-6311-9d99841a68c5"),
    "remapped_rows.correctable": ("remapped_rows.correctable", "0"),
    "remapped_rows.uncorrectable": ("remapped_rows.uncorrectable", "0"),
    "remapped_rows.pending": ("remapped_rows.pending", "No"),
    "remapped_rows.failure": ("remapped_rows.failure", "No"),
}
RECORDED_APPS: dict[str, str] = {
    "pid": "pid",
    "process_name": "process_name",
    "used_memory": "used_gpu_memory [MiB]",
    "gpu_uuid": "gpu_uuid",
}
"""--query-compute-apps: header per field (no process ran when recorded)."""
RECORDED_DRIVER = "580.159.04"
RECORDED_CUDA = "13.0"
Q_LABEL_WIDTH = 55
"""`-q` pads each label to this column before its ": "."""
RECORDED_KERNEL_LOG = [
    "[    0.244072] EXT4-fs (vda): mounted filesystem 00000000-0000-0000-0000-000000000000 "
    "r/w without journal. Quota mode: none.",
    "[    0.437453] nvidia: loading out-of-tree module taints kernel.",
    "[    0.537820] nvidia-nvlink: Nvlink Core is being initialized, major device number 240",
    "[    0.537833] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  "
    "Release Build  (nixbld@)  ",
    "[    1.136365] NVRM: gpuClearFbhubPoisonIntrForBug2924523_GA100: FBHUB Interrupt "
    "detected. Clearing it.",
    "[    3.485018] NVRM: Persistence mode is deprecated and will be removed in a future "
    "release. Please use nvidia-persistenced instead.",
]
"""The recorded `dmesg`'s last lines: the driver's (all but the first) after a boot line."""

NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
    "that the latest NVIDIA driver is installed and running.\n\n"
)
"""Printed, exit 9, where the driver is not loaded (stdout, as the refusal: not yet seen on a
device)."""
NO_DRIVER_EXIT = 9
REFUSED_EXIT = 2
NEW_CLOCKS, OLD_CLOCKS = "clocks_event_reasons.", "clocks_throttle_reasons."
NVLINK_SPEED = "26.562 GB/s"
"""One NVLink 4 link's speed as `nvlink --status` prints it on H100/H200 SXM (public output)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FakeProcess:
    """A compute process holding memory on a GPU, as --query-compute-apps lists it."""

    pid: int
    name: str
    """As nvidia-smi prints it ("python3")."""
    used_mib: int
    gpu: int
    """The GPU's index."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FakeGpuSpec:
    """What a node's simulated nvidia-smi says; the defaults are the recording, on 8 GPUs."""

    gpus: int = 8
    """How many GPUs (8: seed 000's servers)."""
    fields: dict[int, dict[str, str]] = field(default_factory=dict)
    """{GPU index: {--query-gpu field: value}} over the recording's, the value without its
    unit ("30000" for memory.used: the unit is the field's)."""
    remapped: dict[int, dict[str, str]] = field(default_factory=dict)
    """{GPU index: {--query-remapped-rows field: value}} over the recording's."""
    driver: str = RECORDED_DRIVER
    cuda: str = RECORDED_CUDA
    """The newest CUDA the driver supports, as `-q` prints it."""
    old_clock_names: bool = False
    """The driver knows only `clocks_throttle_reasons.*` and refuses `clocks_event_reasons.*`
    (drivers before 535); else both are known, the header naming the new one (recorded)."""
    nvlinks: int = 0
    """Links per GPU in `nvlink --status` (18 on an H200 SXM); 0 prints nothing, as the
    recorded PCIe-attached H200 did."""
    inactive_links: tuple[tuple[int, int], ...] = ()
    """(GPU index, link) pairs printed `<inactive>`."""
    processes: tuple[FakeProcess, ...] = ()
    xid: tuple[str, ...] = ()
    """Kernel messages `dmesg` prints after the driver's, e.g. `xid_line(...)`."""
    driver_loaded: bool = True
    """False: every nvidia-smi command fails as without a loaded driver (NO_DRIVER)."""
    torch: str | None = None
    """The version the node's torch metadata claims (a CUDA build's, e.g. "2.11.0+cu130"),
    for the faults judged against torch's CUDA. No CUDA torch can be installed here: the
    sandbox lays a dist-info of this version over its CPU build's, in that node's mount
    namespace alone (`torch_claim`). None: the real one."""

    def __post_init__(self) -> None:
        if not 1 <= self.gpus <= 16:
            raise ValueError(f"gpus: {self.gpus} is not in 1..16; give 1 to 16 GPUs")
        for name, known, table in (
            ("fields", RECORDED_GPU, self.fields),
            ("remapped", RECORDED_REMAPPED, self.remapped),
        ):
            for gpu, values in table.items():
                self._check_gpu(name, gpu)
                unknown = sorted(set(values) - set(known))
                if unknown:
                    raise ValueError(
                        f"{name}[{gpu}]: unknown field(s) {unknown}; known: {', '.join(known)}"
                    )
        for gpu, link in self.inactive_links:
            self._check_gpu("inactive_links", gpu)
            if not 0 <= link < self.nvlinks:
                raise ValueError(f"inactive_links: link {link} of {self.nvlinks}; raise nvlinks")
        for process in self.processes:
            self._check_gpu("processes", process.gpu)

    def _check_gpu(self, name: str, gpu: int) -> None:
        if not 0 <= gpu < self.gpus:
            raise ValueError(f"{name}: GPU {gpu} of {self.gpus}; use 0..{self.gpus - 1}")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> FakeGpuSpec:
        valid = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - valid)
        if unknown:
            raise ValueError(f"unknown key(s) {unknown}; valid: {', '.join(sorted(valid))}")
        data = dict(data)
        for name in ("fields", "remapped"):  # JSON keys are strings
            data[name] = {int(k): dict(v) for k, v in data.get(name, {}).items()}
        data["inactive_links"] = tuple(tuple(pair) for pair in data.get("inactive_links", ()))
        data["processes"] = tuple(FakeProcess(**p) for p in data.get("processes", ()))
        data["xid"] = tuple(data.get("xid", ()))
        return cls(**data)


class Answer(NamedTuple):
    stdout: str
    rc: int = 0
    stderr: str = ""


def gpu_uuid(gpu: int) -> str:
    """The recorded UUID with its last byte counted up by the index (GPU 0: as recorded).

    >>> gpu_uuid(1)
    'GPU-a46f2210-a63b-4031-6311-9d99841a68c6'
    """
    recorded = RECORDED_GPU["uuid"][1]
    return f"{recorded[:-2]}{(int(recorded[-2:], 16) + gpu) % 256:02x}"


def bus_id(gpu: int) -> str:
    """The recorded PCI address with its device number counted up by the index.

    >>> bus_id(2)
    '00000000:00:08.0'
    """
    domain, bus, rest = RECORDED_GPU["pci.bus_id"][1].split(":")
    device, function = rest.split(".")
    return f"{domain}:{bus}:{int(device, 16) + gpu:02X}.{function}"


def xid_line(gpu: int, xid: int, pid: int, name: str, message: str) -> str:
    """A kernel message for an Xid on GPU `gpu`, in the driver's format (NVIDIA/NVSentinel#155).

    >>> xid_line(2, 79, 1234, "python", "GPU has fallen off the bus.")
    'NVRM: Xid (PCI:0000:00:08): 79, pid=1234, name=python, GPU has fallen off the bus.'
    """
    domain, bus, rest = bus_id(gpu).split(":")
    where = f"PCI:{domain[-4:]}:{bus}:{rest.split('.')[0]}"
    return f"NVRM: Xid ({where}): {xid}, pid={pid}, name={name}, {message}"


def _unit(header: str) -> str:
    """'MiB' of 'memory.total [MiB]'; '' where the header names none."""
    return header[header.index("[") + 1 : -1] if header.endswith("]") else ""


def _bare(header: str, value: str) -> str:
    """The recorded value without its unit ('143771' of '143771 MiB')."""
    unit = _unit(header)
    return value[: -len(unit) - 1] if unit and value.endswith(f" {unit}") else value


def _with_unit(header: str, value: str) -> str:
    unit = _unit(header)
    return f"{value} {unit}" if unit and not value.startswith("[") else value


def _gpu_value(spec: FakeGpuSpec, gpu: int, name: str) -> str:
    """A --query-gpu field's value, without its unit."""
    derived = {
        "index": str(gpu),
        "uuid": gpu_uuid(gpu),
        "pci.bus_id": bus_id(gpu),
        "driver_version": spec.driver,
    }
    if name in spec.fields.get(gpu, {}):
        return spec.fields[gpu][name]
    return derived.get(name) or _bare(*RECORDED_GPU[name])


def _remapped_value(spec: FakeGpuSpec, gpu: int, name: str) -> str:
    derived = {"gpu_bus_id": bus_id(gpu), "gpu_uuid": gpu_uuid(gpu)}
    if name in spec.remapped.get(gpu, {}):
        return spec.remapped[gpu][name]
    return derived.get(name) or RECORDED_REMAPPED[name][1]


def _gpu_field(spec: FakeGpuSpec, asked: str) -> tuple[str, str] | None:
    """(the field's recorded name, its header) for a --query-gpu name; None: refused."""
    if asked.startswith(NEW_CLOCKS) and spec.old_clock_names:
        return None
    known = NEW_CLOCKS + asked[len(OLD_CLOCKS) :] if asked.startswith(OLD_CLOCKS) else asked
    if known not in RECORDED_GPU:
        return None
    # Drivers that know the old names alone print them; newer ones print the new name.
    old = spec.old_clock_names and asked.startswith(OLD_CLOCKS)
    return known, asked if old else RECORDED_GPU[known][0]


def _csv(headers: list[str], rows: list[list[str]], form: set[str]) -> str:
    """nvidia-smi's csv: `noheader` drops the header line, `nounits` the values' units (the
    header keeps them: verified on a lent H200)."""
    lines = [] if "noheader" in form else [", ".join(headers)]
    for row in rows:
        values = row if "nounits" in form else map(_with_unit, headers, row)
        lines.append(", ".join(values))
    return "".join(f"{line}\n" for line in lines)


def _refused(name: str) -> Answer:
    return Answer(f'Field "{name}" is not a valid field to query.\n\n', REFUSED_EXIT)


def _query(spec: FakeGpuSpec, kind: str, names: list[str], form: set[str]) -> Answer:
    headers, rows = [], []
    if kind == "query-gpu":
        known = []
        for name in names:
            found = _gpu_field(spec, name)
            if found is None:
                return _refused(name)
            known.append(found[0])
            headers.append(found[1])
        rows = [[_gpu_value(spec, g, n) for n in known] for g in range(spec.gpus)]
    elif kind == "query-remapped-rows":
        if unknown := [n for n in names if n not in RECORDED_REMAPPED]:
            return _refused(unknown[0])
        headers = [RECORDED_REMAPPED[n][0] for n in names]
        rows = [[_remapped_value(spec, g, n) for n in names] for g in range(spec.gpus)]
    else:
        if unknown := [n for n in names if n not in RECORDED_APPS]:
            return _refused(unknown[0])
        headers = [RECORDED_APPS[n] for n in names]
        for p in spec.processes:
            by_name = {"pid": str(p.pid), "process_name": p.name, "used_memory": str(p.used_mib)}
            rows.append([by_name.get(n) or gpu_uuid(p.gpu) for n in names])
    return Answer(_csv(headers, rows, form))


def _nvlink_status(spec: FakeGpuSpec) -> str:
    if not spec.nvlinks:
        return ""
    lines = []
    for gpu in range(spec.gpus):
        name = _gpu_value(spec, gpu, "name")
        lines.append(f"GPU {gpu}: {name} (UUID: {gpu_uuid(gpu)})")
        for link in range(spec.nvlinks):
            state = "<inactive>" if (gpu, link) in spec.inactive_links else NVLINK_SPEED
            lines.append(f"\t Link {link}: {state}")
    return "".join(f"{line}\n" for line in lines)


def _q_line(label: str, value: str, indent: int = 0) -> str:
    return f"{' ' * indent}{label.ljust(Q_LABEL_WIDTH - indent)}: {value}\n"


def _q_compute(spec: FakeGpuSpec) -> str:
    """`-q -d COMPUTE`: the header every `-q` report opens with, then each GPU's compute mode
    (the layout a lent H200 printed)."""
    text = "\n==============NVSMI LOG==============\n\n"
    text += _q_line("Timestamp", time.strftime("%a %b %d %H:%M:%S %Y"))
    text += _q_line("Driver Version", spec.driver) + _q_line("CUDA Version", spec.cuda)
    text += "\n" + _q_line("Attached GPUs", str(spec.gpus))
    for gpu in range(spec.gpus):
        text += f"GPU {bus_id(gpu)}\n"
        text += _q_line("Compute Mode", _gpu_value(spec, gpu, "compute_mode"), indent=4) + "\n"
    return text


def _list(spec: FakeGpuSpec) -> str:
    """`-L`, as recorded."""
    return "".join(
        f"GPU {g}: {_gpu_value(spec, g, 'name')} (UUID: {gpu_uuid(g)})\n" for g in range(spec.gpus)
    )


def nvidia_smi(spec: FakeGpuSpec, args: list[str]) -> Answer:
    """What nvidia-smi prints for `args`; commands `trainfleet.node.gpus` does not run (and
    `-L`) are answered with a message saying the fake does not simulate them."""
    if not spec.driver_loaded:
        return Answer(NO_DRIVER, NO_DRIVER_EXIT)
    if args[:1] == ["nvlink"] and args[1:] in (["--status"], ["-s"]):
        return Answer(_nvlink_status(spec))
    if args == ["-q", "-d", "COMPUTE"]:
        return Answer(_q_compute(spec))
    if args == ["-L"]:
        return Answer(_list(spec))
    kinds = ("query-gpu", "query-remapped-rows", "query-compute-apps")
    if args and args[0].startswith("--") and args[0][2:].partition("=")[0] in kinds:
        kind, _, names = args[0][2:].partition("=")
        form = {"csv"}
        if len(args) == 2 and args[1].startswith("--format="):
            form = set(args[1][len("--format=") :].split(","))
        if len(args) <= 2 and "csv" in form and form <= {"csv", "noheader", "nounits"}:
            return _query(spec, kind, names.split(","), form)
    return Answer(
        "",
        REFUSED_EXIT,
        f"nvidia-smi {shlex.join(args)}: not simulated by trainfleet's fake GPU (sandbox/"
        "fakegpu.py answers --query-gpu/-remapped-rows/-compute-apps with --format=csv[,noheader]"
        "[,nounits], nvlink --status, -q -d COMPUTE, -L)\n",
    )


def dmesg(spec: FakeGpuSpec, args: list[str]) -> Answer:
    """The recorded kernel log's last lines (the driver's only where it is loaded), then
    spec.xid, each a second apart."""
    if args:
        return Answer("", 1, f"dmesg {shlex.join(args)}: only a bare `dmesg` is simulated\n")
    lines = RECORDED_KERNEL_LOG[:1]
    if spec.driver_loaded:
        lines += [line.replace(RECORDED_DRIVER, spec.driver) for line in RECORDED_KERNEL_LOG[1:]]
    lines += [f"[{100 + k:5d}.000000] {message}" for k, message in enumerate(spec.xid)]
    return Answer("".join(f"{line}\n" for line in lines))


PROGRAMS = {"nvidia-smi": nvidia_smi, "dmesg": dmesg}


def torch_claim(directory: Path, version: str) -> tuple[Path, Path]:
    """(a layer for the installed torch's site-packages, that directory): in the layer, torch's
    dist-info renamed for `version` with that Version in its METADATA, and a whiteout hiding
    the real one. Laid over site-packages (overlayfs), the node's package metadata, which the
    probe reads from dist-info names, says `version`; the torch package itself is untouched."""
    from importlib import metadata

    distribution = metadata.distribution("torch")
    files = distribution.files or ()
    record = next((f for f in files if f.name == "METADATA" and f.parent.name.endswith(
        ".dist-info")), None)  # fmt: skip
    if record is None:
        raise FileNotFoundError("torch's METADATA is not among its installed files")
    real = Path(str(distribution.locate_file(record))).parent
    layer = directory / "torch-claim"
    claimed = layer / f"torch-{version}.dist-info"
    shutil.copytree(real, claimed)
    text = (claimed / "METADATA").read_text().splitlines(keepends=True)
    (claimed / "METADATA").write_text(
        "".join(f"Version: {version}\n" if line.startswith("Version:") else line for line in text)
    )
    os.mknod(layer / real.name, 0o600 | stat.S_IFCHR, os.makedev(0, 0))  # overlayfs: whiteout
    return layer, real.parent


def write_wrappers(directory: Path, spec: FakeGpuSpec, python: str = sys.executable) -> Path:
    """The spec file and the two-line `nvidia-smi` and `dmesg` wrappers in `directory`/bin,
    each exec'ing this file with `python` (-I -S: nothing from the node's directories or
    site-packages); returns that bin directory."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    spec_file = directory / "spec.json"
    spec_file.write_text(json.dumps(spec.to_json(), indent=1) + "\n")
    for program in PROGRAMS:
        argv = [python, "-I", "-S", str(Path(__file__).resolve()), str(spec_file), program]
        wrapper = bin_dir / program
        wrapper.write_text(f'#!/bin/sh\nexec {shlex.join(argv)} "$@"\n')
        wrapper.chmod(0o755)
    return bin_dir


def main(argv: list[str] | None = None) -> int:
    """`fakegpu.py SPEC_FILE PROGRAM [ARGS...]`, PROGRAM `nvidia-smi` or `dmesg`."""
    spec_file, program, *args = sys.argv[1:] if argv is None else argv
    try:
        spec = FakeGpuSpec.from_json(json.loads(Path(spec_file).read_text()))
    except (OSError, ValueError, TypeError) as exc:
        sys.stderr.write(
            f"{program}: trainfleet's fake GPU spec {spec_file}: {exc}; take the sandbox down "
            "(`trainfleet sandbox down`) and bring it up again\n"
        )
        return 2
    answer = PROGRAMS[program](spec, args)
    sys.stdout.write(answer.stdout)
    sys.stderr.write(answer.stderr)
    return answer.rc


if __name__ == "__main__":
    sys.exit(main())
