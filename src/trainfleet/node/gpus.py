"""A node's GPUs and their health, from nvidia-smi and the kernel log, sent as their own text.

    >>> split_csv("0, NVIDIA H200, [N/A]")
    ['0', 'NVIDIA H200', '[N/A]']
    >>> legacy_names(["index", "clocks_event_reasons.hw_slowdown"])
    ['index', 'clocks_throttle_reasons.hw_slowdown']

One query per node answers every per-GPU question (FIELDS); four more small calls give the
remapped rows, the compute processes, the NVLink states and the CUDA version the driver
supports (about 130 ms in all on an H200: docs/notes/2026-11.md). Each value travels as
nvidia-smi printed it (`[N/A]`, `[Not Supported]` included): the launch side reads them
(`trainfleet.doctor.facts`), so a driver that prints something new is shown, not guessed at
here. Field names and their meanings: `nvidia-smi --help-query-gpu` (the H200 recording in
tests/unit/fixtures/nvidia_smi/ holds driver 580's text).

Older drivers name the clock reasons `clocks_throttle_reasons.*` and refuse the newer names
(the whole query fails); then the query is asked again with those names, and where that fails
too, with BASIC alone, the answer saying which set answered (`query`).
"""

import re
from typing import Dict, List, Optional, TypedDict

from trainfleet.node import system

FIELDS = [
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "driver_version",
    "memory.total",
    "memory.used",
    "persistence_mode",
    "mig.mode.current",
    "ecc.mode.current",
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending",
    "clocks_event_reasons.hw_slowdown",
    "clocks_event_reasons.hw_thermal_slowdown",
    "clocks_event_reasons.hw_power_brake_slowdown",
    "clocks_event_reasons.sw_thermal_slowdown",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "temperature.gpu",
]
BASIC = ["index", "uuid", "name", "pci.bus_id", "driver_version", "memory.total", "memory.used"]
REMAPPED = [
    "gpu_bus_id",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "remapped_rows.uncorrectable",
]
APPS = ["pid", "process_name", "used_memory", "gpu_uuid"]
XID = re.compile(r"NVRM: Xid \(")
KEEP_XID_LINES = 50
TIMEOUT_S = 15


class KernelLog(TypedDict):
    source: Optional[str]
    """"dmesg" or "journalctl"; None: neither could be read (see error)."""
    xid: List[str]
    """The last KEEP_XID_LINES `NVRM: Xid (...)` lines since boot."""
    error: Optional[str]


class GpuFacts(TypedDict):
    """`facts()`'s answer: nvidia-smi's text, field by field."""

    query: str
    """Which field set answered: "health" (FIELDS), "legacy" (their older names), "basic"."""
    devices: List[Dict[str, str]]
    """One per GPU: {field (as in FIELDS): text}."""
    remapped: Optional[List[Dict[str, str]]]
    """{REMAPPED field: text} per GPU; None: this nvidia-smi cannot say (pre-Ampere, old)."""
    nvlink: Optional[str]
    """`nvidia-smi nvlink --status` as printed (empty: no NVLink); None: it failed."""
    cuda_version: Optional[str]
    """The newest CUDA the driver supports ("13.0"); None: not printed."""
    processes: List[Dict[str, str]]
    kernel_log: KernelLog
    error: None


class GpuError(TypedDict):
    """nvidia-smi is there but failed: its exit code and message."""

    error: str


def split_csv(line):
    return [part.strip() for part in line.split(",")]


def legacy_names(fields):
    return [f.replace("clocks_event_reasons.", "clocks_throttle_reasons.") for f in fields]


def query(kind, fields):
    """(rows as {field: text}, exit code, nvidia-smi's message where it failed)."""
    code, out, err = system.run(
        ["nvidia-smi", "--%s=%s" % (kind, ",".join(fields)), "--format=csv,noheader,nounits"],
        timeout=TIMEOUT_S,
    )
    if code != 0:
        return None, code, (err.strip() or out.strip() or "no output").splitlines()[-1]
    rows = [split_csv(line) for line in out.splitlines() if line.strip()]
    return [dict(zip(fields, row)) for row in rows if len(row) == len(fields)], 0, ""


NO_DEVICES = "No devices were found"
"""What nvidia-smi says where its driver sees no GPU: a machine without GPUs (nvidia-smi
installed on a CPU node), as when nvidia-smi is missing, not a broken one."""


def facts():
    """None where there is no nvidia-smi or no GPU; GpuError where it fails; else GpuFacts."""
    devices, code, message = query("query-gpu", FIELDS)
    if code == 127 or (code != 0 and NO_DEVICES in message):
        return None
    answered = "health"
    if devices is None:
        answered = "legacy"
        legacy, code, _ = query("query-gpu", legacy_names(FIELDS))
        devices = [dict(zip(FIELDS, row.values())) for row in legacy] if legacy else None
    if devices is None:
        answered = "basic"
        devices, code, _ = query("query-gpu", BASIC)
    if devices is None:
        return GpuError(error="nvidia-smi exit %s: %s" % (code, message))
    remapped = query("query-remapped-rows", REMAPPED)[0]
    processes = query("query-compute-apps", APPS)[0]
    code, nvlink, _ = system.run(["nvidia-smi", "nvlink", "--status"], timeout=TIMEOUT_S)
    return GpuFacts(
        query=answered,
        devices=devices,
        remapped=remapped,
        nvlink=nvlink if code == 0 else None,
        cuda_version=cuda_version(),
        processes=processes or [],
        kernel_log=kernel_log(),
        error=None,
    )


def cuda_version():
    """From the header nvidia-smi prints above every `-q` report: "CUDA Version : 13.0"."""
    code, out, _ = system.run(["nvidia-smi", "-q", "-d", "COMPUTE"], timeout=TIMEOUT_S)
    found = re.search(r"CUDA Version\s*:\s*([0-9][0-9.]*)", out) if code == 0 else None
    return found.group(1) if found else None


def kernel_log():
    """Xid lines since boot from dmesg, else the journal's kernel messages; where neither can
    be read (dmesg_restrict for a non-root user, no journal), says so rather than guessing."""
    errors = []
    for source, argv in (
        ("dmesg", ["dmesg"]),
        ("journalctl", ["journalctl", "-k", "-b", "--no-pager", "-q", "-o", "cat"]),
    ):
        code, out, err = system.run(argv, timeout=TIMEOUT_S)
        if code == 0 and out.strip():
            lines = [line.strip() for line in out.splitlines() if XID.search(line)]
            return KernelLog(source=source, xid=lines[-KEEP_XID_LINES:], error=None)
        errors.append("%s: %s" % (source, (err.strip() or "exit %s" % code).splitlines()[-1]))
    return KernelLog(source=None, xid=[], error="; ".join(errors))
