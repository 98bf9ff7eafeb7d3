"""A node's fact sheet (the probe's JSON), parsed once at collection into frozen, typed values.

    >>> sheet = {"probe_version": PROBE_VERSION, "hostname": "gpu-node-1",
    ...          "gpus": {"devices": [{"index": "0", "name": "NVIDIA H100 80GB HBM3",
    ...                                "memory.total": "81559"}]},
    ...          "shm": "64G", "tools": ["ninja"]}
    >>> facts = parse_fact_sheet(sheet, node="gpu-node-1")
    >>> facts.hostname, facts.gpus.devices[0].memory_mib, facts.shm.total, facts.tools
    ('gpu-node-1', 81559, None, {})
    >>> parse_fact_sheet({"probe_version": 0}, node="gpu-node-2")
    Traceback (most recent call last):
    ...
    trainfleet.doctor.facts.parse.FactSheetError: gpu-node-2 answered with a probe version 0 ...

What a node sends back is untrusted input (a node can be broken or hostile): a value of the
wrong type, or a key that is missing, becomes "unknown" (None, an empty tuple or mapping, a
default object) here, so that no check raises on it deep inside. Only the probe's version is
refused: a sheet from another probe means something else by its fields. Strings are checked
for their type only; the code that puts one in a file or a command validates it there
(`trainfleet.untrusted`).
"""

from trainfleet.doctor.facts.parse import (
    FactSheetError,
    parse_fact_sheet,
    parse_imports,
    read_fact_sheet,
)
from trainfleet.doctor.facts.sheet import (
    Active,
    ClientName,
    CodeHash,
    CommandOutput,
    Disk,
    Firewall,
    Gpu,
    GpuProcess,
    Gpus,
    Imports,
    Interface,
    JitLock,
    Limits,
    Listener,
    Memory,
    NodeFacts,
    Packages,
    Python,
    Resolution,
    Route,
    SshOutcome,
    Transfer,
    Workdir,
    Xid,
)
from trainfleet.node.probe import PROBE_VERSION

__all__ = [
    "PROBE_VERSION",
    "FactSheetError",
    "parse_fact_sheet",
    "parse_imports",
    "read_fact_sheet",
    "Active",
    "ClientName",
    "CodeHash",
    "CommandOutput",
    "Disk",
    "Firewall",
    "Gpu",
    "GpuProcess",
    "Gpus",
    "Imports",
    "Interface",
    "JitLock",
    "Limits",
    "Listener",
    "Memory",
    "NodeFacts",
    "Packages",
    "Python",
    "Resolution",
    "Route",
    "SshOutcome",
    "Transfer",
    "Workdir",
    "Xid",
]
