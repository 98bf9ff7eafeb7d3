"""GPU health: one function per fault, each naming the node, the GPU and the fix.

    >>> exclude({"gpu-node-2": [3, 5], "gpu-node-1": [0]})
    '-e gpu-node-1:0@gpu-node-2:3,5'
    >>> torch_cuda("2.11.0+cu130"), torch_cuda("2.5.1+cu118"), torch_cuda("2.5.1")
    ('13.0', '11.8', None)

Errors are what makes a job fail or hang (a GPU with uncorrected ECC errors, rows waiting to be
remapped, a fatal Xid, MIG mode, a driver older than torch's CUDA); warnings what makes it slow
(an NVLink or PCIe link running below what the GPU has, clocks held down, persistence off,
drivers that differ). A fault of one GPU is fixed for now by leaving that GPU out: the fix names
the DeepSpeed-style `-e NODE:GPU` that `launch` and `train` take. The facts come from one
nvidia-smi query per node (`node/gpus.py`); what a node's nvidia-smi did not say is not judged,
nor a GPU the node's slots do not use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from trainfleet.catalog import FindingId
from trainfleet.doctor.collect import Survey
from trainfleet.doctor.facts import Gpu, Gpus
from trainfleet.doctor.findings import Finding, Severity

FATAL_XIDS = {
    48: "double-bit ECC error",
    63: "row remapping or page retirement event",
    64: "row remapping or page retirement failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
"""Xids after which the GPU should not be trusted with a job (NVIDIA's Xid catalog); others
(13, 31, 43: a program's own fault) are warnings."""


def exclude(gpus: dict[str, list[int]]) -> str:
    """The `-e` that leaves out these GPUs, in DeepSpeed's syntax (hosts sorted)."""
    return "-e " + "@".join(
        f"{host}:{','.join(map(str, sorted(set(indexes))))}"
        for host, indexes in sorted(gpus.items())
    )


def torch_cuda(version: str | None) -> str | None:
    """The CUDA a torch wheel was built for, from its local version (`+cu124` -> 12.4)."""
    if not version or "+cu" not in version:
        return None
    digits = version.split("+cu", 1)[1]
    if not digits.isdigit() or len(digits) < 3:
        return None
    return f"{int(digits[:-1])}.{digits[-1]}"


def _gpus(survey: Survey) -> Iterator[tuple[str, Gpus]]:
    for host, facts in survey.facts.items():
        if facts.gpus is not None:
            yield host, facts.gpus


def _in_use(survey: Survey, host: str, gpus: Gpus) -> list[tuple[int, Gpu]]:
    """(index, GPU) for the node's GPUs its slots run on (`-i`/`-e` and slots=N choose
    them): a GPU left out is not the job's problem, so leaving out a faulty one lets the
    launch go ahead."""
    used = set(survey.cluster.node(host).gpu_ids)
    return [(gpu.index, gpu) for gpu in gpus.devices if gpu.index is not None and gpu.index in used]


def _per_gpu(
    survey: Survey,
    *,
    id: FindingId,
    severity: Severity,
    bad: Callable[[Gpu], str | None],
    fix: Callable[[dict[str, list[int]]], str],
) -> list[Finding]:
    """One finding over every GPU that `bad` describes (its words: the evidence)."""
    evidence: list[str] = []
    found: dict[str, list[int]] = {}
    for host, gpus in _gpus(survey):
        for index, gpu in _in_use(survey, host, gpus):
            words = bad(gpu)
            if words is not None:
                evidence.append(f"{host} {gpu.label}: {words}")
                found.setdefault(host, []).append(index)
    if not found:
        return []
    return [
        Finding(id=id, severity=severity, nodes=tuple(found), evidence=evidence, fix=fix(found))
    ]


def check_nvidia_smi(survey: Survey) -> list[Finding]:
    findings = []
    for host, gpus in _gpus(survey):
        if gpus.error is not None:
            findings.append(
                Finding(
                    id=FindingId.NVIDIA_SMI_FAILED,
                    severity=Severity.ERROR,
                    nodes=(host,),
                    evidence=[f"{host}: {gpus.error}"],
                    fix=f"load the NVIDIA driver on {host} (after a driver upgrade: reboot it; "
                    "else reinstall the driver for its kernel), or leave it out "
                    f"(`-e {host}`)",
                )
            )
        elif gpus.query == "basic":
            findings.append(
                Finding(
                    id=FindingId.NVIDIA_SMI_FAILED,
                    severity=Severity.WARNING,
                    nodes=(host,),
                    evidence=[
                        f"{host}: its nvidia-smi answers only the basic fields, so its GPUs' "
                        "ECC, clocks, MIG and PCIe were not checked"
                    ],
                    fix=f"update the NVIDIA driver on {host}",
                )
            )
    return findings


def check_ecc(survey: Survey) -> list[Finding]:
    return _per_gpu(
        survey,
        id=FindingId.GPU_ECC_UNCORRECTED,
        severity=Severity.ERROR,
        bad=lambda gpu: (
            f"{gpu.ecc_uncorrected} uncorrected ECC error(s) since the driver loaded"
            if gpu.ecc_uncorrected
            else None
        ),
        fix=lambda found: (
            f"leave the GPU out ({exclude(found)}); reset it "
            "(`nvidia-smi -r -i GPU`) or have the node serviced if the errors come back"
        ),
    )


def check_remapping(survey: Survey) -> list[Finding]:
    def bad(gpu: Gpu) -> str | None:
        if gpu.remap_failed:
            return "row remapping failed: the GPU needs replacing"
        if gpu.remap_pending:
            return "rows are waiting to be remapped: the GPU needs a reset"
        if gpu.retired_pending:
            return "pages are waiting to be retired: the GPU needs a reset"
        return None

    return _per_gpu(
        survey,
        id=FindingId.GPU_REMAP_PENDING,
        severity=Severity.ERROR,
        bad=bad,
        fix=lambda found: (
            "pending: reset the GPU (`nvidia-smi -r -i GPU`, nothing may use it) or reboot "
            f"the node; failed: have it replaced; meanwhile leave it out ({exclude(found)})"
        ),
    )


def check_xid(survey: Survey) -> list[Finding]:
    findings = []
    for host, gpus in _gpus(survey):
        by_bus = {_bus(gpu.bus_id): gpu for gpu in gpus.devices if gpu.bus_id}
        in_use = [gpu for _, gpu in _in_use(survey, host, gpus)]
        fatal: dict[str, list[int]] = {}
        evidence: dict[Severity, list[str]] = {Severity.ERROR: [], Severity.WARNING: []}
        for xid in gpus.xid:
            gpu = by_bus.get(_bus(xid.bus_id))
            if gpu is not None and gpu not in in_use:
                continue
            where = gpu.label if gpu else f"the GPU at {xid.bus_id}"
            what = FATAL_XIDS.get(xid.code, "see NVIDIA's Xid catalog")
            severity = Severity.ERROR if xid.code in FATAL_XIDS else Severity.WARNING
            evidence[severity].append(f"{host} {where}: Xid {xid.code} ({what}): {xid.line}")
            if severity is Severity.ERROR and gpu and gpu.index is not None:
                fatal.setdefault(host, []).append(gpu.index)
        if evidence[Severity.ERROR]:
            findings.append(
                Finding(
                    id=FindingId.GPU_XID,
                    severity=Severity.ERROR,
                    nodes=(host,),
                    evidence=evidence[Severity.ERROR],
                    fix=(f"leave the GPU out ({exclude(fatal)}) " if fatal else "")
                    + f"and have {host} checked; the Xid stays in the log until it reboots",
                )
            )
        if evidence[Severity.WARNING]:
            findings.append(
                Finding(
                    id=FindingId.GPU_XID,
                    severity=Severity.WARNING,
                    nodes=(host,),
                    evidence=evidence[Severity.WARNING],
                    fix="look the Xid up in NVIDIA's Xid catalog; most of these are a "
                    "program's own fault and gone after a reset",
                )
            )
    return findings


def _bus(bus_id: str) -> str:
    """A PCI address as nvidia-smi ("00000000:3B:00.0") and the kernel ("0000:3b:00") write
    it, reduced to bus:device ("3b:00")."""
    parts = bus_id.lower().split(".")[0].split(":")
    return ":".join(parts[-2:])


def check_mig(survey: Survey) -> list[Finding]:
    return _per_gpu(
        survey,
        id=FindingId.GPU_MIG_ENABLED,
        severity=Severity.ERROR,
        bad=lambda gpu: "MIG mode is on: CUDA sees its instances, not the GPU" if gpu.mig else None,
        fix=lambda found: (
            "turn MIG off (`sudo nvidia-smi -i GPU -mig 0`, then reset the GPU) "
            f"or leave the GPU out ({exclude(found)})"
        ),
    )


def check_cuda_driver(survey: Survey) -> list[Finding]:
    findings = []
    for host, gpus in _gpus(survey):
        facts = survey.facts[host]
        built = (facts.imports.torch_cuda if facts.imports else None) or torch_cuda(
            facts.packages.torch
        )
        if not built or not gpus.cuda_version or not gpus.devices:
            continue
        need, have = _version(built), _version(gpus.cuda_version)
        if need is None or have is None or have >= need:
            continue
        error = have[0] < need[0]
        driver = gpus.devices[0].driver or "?"
        findings.append(
            Finding(
                id=FindingId.CUDA_DRIVER_TOO_OLD,
                severity=Severity.ERROR if error else Severity.WARNING,
                nodes=(host,),
                evidence=[
                    f"{host}: driver {driver} supports CUDA up to {gpus.cuda_version}; torch "
                    f"{facts.packages.torch} was built for CUDA {built}"
                    + (
                        ""
                        if error
                        else " (it runs through CUDA's minor version compatibility, except "
                        "kernels compiled at run time)"
                    )
                ],
                fix=f"upgrade the driver on {host} to one that supports CUDA {built}, or "
                f"install a torch built for CUDA {gpus.cuda_version} or older there (the "
                "builds and their pip commands: https://pytorch.org/get-started/previous-versions/)",
            )
        )
    return findings


def _version(text: str) -> tuple[int, ...] | None:
    parts = text.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else None


def check_driver_differs(survey: Survey) -> list[Finding]:
    drivers = {
        host: gpus.devices[0].driver
        for host, gpus in _gpus(survey)
        if gpus.devices and gpus.devices[0].driver
    }
    if len(set(drivers.values())) < 2:
        return []
    return [
        Finding(
            id=FindingId.GPU_DRIVER_DIFFERS,
            severity=Severity.WARNING,
            nodes=tuple(drivers),
            evidence=[f"{host}: driver {driver}" for host, driver in drivers.items()],
            fix="install one driver version on every node",
        )
    ]


def check_nvlink(survey: Survey) -> list[Finding]:
    """A link down on a node whose other links are up: a node with no link up has no NVLink
    in use (PCIe cards list theirs as <inactive>), which is no fault."""
    evidence: list[str] = []
    found: dict[str, list[int]] = {}
    for host, gpus in _gpus(survey):
        if not any(gpu.nvlinks_up for gpu in gpus.devices):
            continue
        for index, gpu in _in_use(survey, host, gpus):
            if gpu.nvlinks_down:
                links = ", ".join(map(str, gpu.nvlinks_down))
                evidence.append(f"{host} {gpu.label}: NVLink {links} down, {gpu.nvlinks_up} up")
                found.setdefault(host, []).append(index)
    if not found:
        return []
    return [
        Finding(
            id=FindingId.NVLINK_DOWN,
            severity=Severity.WARNING,
            nodes=tuple(found),
            evidence=evidence,
            fix="reset the GPU or reboot the node; if the link stays down, have it serviced. "
            f"Until then that node's collectives are slower ({exclude(found)} leaves it out)",
        )
    ]


def check_pcie(survey: Survey) -> list[Finding]:
    def bad(gpu: Gpu) -> str | None:
        if gpu.pcie_width and gpu.pcie_width_max and gpu.pcie_width < gpu.pcie_width_max:
            return f"PCIe link x{gpu.pcie_width} of x{gpu.pcie_width_max}"
        return None

    return _per_gpu(
        survey,
        id=FindingId.GPU_PCIE_DEGRADED,
        severity=Severity.WARNING,
        bad=bad,
        fix=lambda found: (
            "reseat the GPU or its riser and check the slot's settings in the "
            f"BIOS; host transfers and offload are slower on it meanwhile ({exclude(found)} leaves "
            "it out)"
        ),
    )


def check_throttled(survey: Survey) -> list[Finding]:
    return _per_gpu(
        survey,
        id=FindingId.GPU_THROTTLED,
        severity=Severity.WARNING,
        bad=lambda gpu: (
            "clocks held down: "
            + ", ".join(gpu.slowdowns)
            + (f" at {gpu.temperature_c} C" if gpu.temperature_c is not None else "")
            if gpu.slowdowns
            else None
        ),
        fix=lambda found: (
            "check the node's cooling and power supply; a slowed GPU makes its "
            f"rank the straggler of every step ({exclude(found)} leaves it out)"
        ),
    )


def check_persistence(survey: Survey) -> list[Finding]:
    findings = []
    for host, gpus in _gpus(survey):
        off = [gpu for gpu in gpus.devices if gpu.persistence is False]
        if off:
            findings.append(
                Finding(
                    id=FindingId.GPU_PERSISTENCE_OFF,
                    severity=Severity.WARNING,
                    nodes=(host,),
                    evidence=[
                        f"{host}: persistence mode is off on "
                        + ("every GPU" if len(off) == len(gpus.devices) else "GPU ")
                        + (
                            ""
                            if len(off) == len(gpus.devices)
                            else ", ".join(str(gpu.index) for gpu in off)
                        )
                    ],
                    fix=f"on {host}: `sudo nvidia-smi -pm 1` (or enable nvidia-persistenced)",
                )
            )
    return findings
