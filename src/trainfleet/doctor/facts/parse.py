r"""Parsing a node's answer into a `NodeFacts`: the version checked, every other field taken
for what it is or as unknown.

    >>> import json
    >>> from trainfleet.node import answer, probe
    >>> sheet = {**dict.fromkeys(probe.FactSheet.__required_keys__), "node": "n1"}
    >>> sheet["probe_version"] = PROBE_VERSION
    >>> read_fact_sheet("noise\n%s%s\n" % (answer.MARK, json.dumps(sheet)), node="n1").node
    'n1'
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

from trainfleet import node as node_programs
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
    Resolver,
    Route,
    SshOutcome,
    Transfer,
    Workdir,
    Xid,
)
from trainfleet.errors import NodeAnswerError, TrainfleetError
from trainfleet.node.probe import PROBE_VERSION, FactSheet

T = TypeVar("T")


class FactSheetError(TrainfleetError):
    """A node's answer is no fact sheet this trainfleet can read (none, or another version)."""


def _dict(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list:
    return value if isinstance(value, list) else []


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _strs(value: object) -> tuple[str, ...]:
    return tuple(item for item in _list(value) if isinstance(item, str))


def _map(value: object, parse: Callable[[object], T | None]) -> dict[str, T]:
    """The entries of a JSON object whose value parses; the others are unknown (left out)."""
    parsed = {key: parse(item) for key, item in _dict(value).items() if isinstance(key, str)}
    return {key: item for key, item in parsed.items() if item is not None}


def _items(value: object, parse: Callable[[dict], T | None]) -> tuple[T, ...]:
    """The entries of a JSON list that are objects and parse."""
    parsed = (parse(item) for item in _list(value) if isinstance(item, dict))
    return tuple(item for item in parsed if item is not None)


def _resolution(raw: object) -> Resolution | None:
    if not isinstance(raw, dict):
        return None
    return Resolution(addresses=_strs(raw.get("addresses")), error=_str(raw.get("error")))


def _interface(raw: dict) -> Interface | None:
    name = _str(raw.get("name"))
    if name is None:
        return None
    return Interface(
        name=name,
        state=_str(raw.get("state")),
        up=raw.get("up") is True,
        mtu=_int(raw.get("mtu")),
        link_type=_str(raw.get("link_type")),
        bridge=raw.get("bridge") is True,
        ipv4=_strs(raw.get("ipv4")),
        ipv6=_strs(raw.get("ipv6")),
    )


def _interfaces(raw: object) -> tuple[Interface, ...] | None:
    return _items(raw, _interface) if isinstance(raw, list) else None


def _route(raw: object) -> Route | None:
    if not isinstance(raw, dict):
        return None
    return Route(
        dev=_str(raw.get("dev")),
        src=_str(raw.get("src")),
        gateway=_str(raw.get("gateway")),
        error=_str(raw.get("error")),
    )


def _client_name(raw: object) -> ClientName | None:
    if not isinstance(raw, dict):
        return None
    return ClientName(
        name=_str(raw.get("name")), error=_str(raw.get("error")), seconds=_float(raw.get("seconds"))
    )


def _resolver(raw: object) -> Resolver:
    raw = _dict(raw)
    return Resolver(
        nameservers=_strs(raw.get("nameservers")),
        timeout=_int(raw.get("timeout")),
        attempts=_int(raw.get("attempts")),
    )


def _listener(raw: dict) -> Listener:
    return Listener(
        addr=_str(raw.get("addr")),
        port=_int(raw.get("port")),
        pid=_int(raw.get("pid")),
        cmd=_str(raw.get("cmd")),
    )


def _command_output(raw: object) -> CommandOutput | None:
    if not isinstance(raw, dict):
        return None
    return CommandOutput(
        rc=_int(raw.get("rc")), out=_str(raw.get("out")) or "", err=_str(raw.get("err")) or ""
    )


def _firewall(raw: object) -> Firewall:
    raw = _dict(raw)
    return Firewall(
        iptables=_command_output(raw.get("iptables")),
        nft=_command_output(raw.get("nft")),
        ufw=_command_output(raw.get("ufw")),
        firewalld=_command_output(raw.get("firewalld")),
    )


def _disk(raw: object) -> Disk:
    raw = _dict(raw)
    total, free, error = _int(raw.get("total")), _int(raw.get("free")), _str(raw.get("error"))
    return Disk(total=total, free=free, error=error)


def _workdir(raw: object) -> Workdir:
    raw = _dict(raw)
    return Workdir(
        path=_str(raw.get("path")), exists=_bool(raw.get("exists")), disk=_disk(raw.get("disk"))
    )


def _packages(raw: object) -> Packages:
    raw = _dict(raw)
    return Packages(**{name: _str(raw.get(name)) for name in Packages.__dataclass_fields__})


def parse_imports(raw: object) -> Imports | None:
    """What the stack phase reported of a node's imports (`node/collective.py`); None: nothing."""
    if not isinstance(raw, dict):
        return None
    return Imports(
        torch=_str(raw.get("torch")),
        torch_cuda=_str(raw.get("torch_cuda")),
        nccl=_str(raw.get("nccl")),
        torch_distributed=_bool(raw.get("torch_distributed")),
        gloo=_bool(raw.get("gloo")),
        torch_error=_str(raw.get("torch_error")),
        import_error=_str(raw.get("import_error")),
    )


def _text(value: object) -> str | None:
    """nvidia-smi's text for a field; None for its 'no value' words and anything not text."""
    if not isinstance(value, str) or value.strip("[] ") in ("", "N/A", "Not Supported", "Unknown"):
        return None
    return value.strip()


def _number(value: object) -> int | None:
    text = _text(value)
    return int(text) if text is not None and text.isdigit() else None


def _flag(value: object, yes: str, no: str) -> bool | None:
    text = _text(value)
    return {yes: True, no: False}.get(text) if text is not None else None


SLOWDOWNS = (
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
)
"""The clock event reasons that are faults (`nvidia-smi --help-query-gpu`: GPU idle,
application clocks and the software power cap are the GPU doing as it is told)."""

_NVLINK = re.compile(r"^GPU (\d+):|^\s*Link (\d+):\s*(.*)$")


def nvlink_states(text: str) -> dict[int, tuple[int, tuple[int, ...]]]:
    """{GPU index: (links up, numbers of the links down)} from `nvidia-smi nvlink --status`.
    A link is up only with a speed (`Link 0: 26.562 GB/s`); `<inactive>` or any other word is
    down: a reading nobody has seen is no evidence of a working link.

    >>> nvlink_states("GPU 0: NVIDIA H100 (UUID: GPU-1)\\n\\t Link 0: 26.562 GB/s\\n"
    ...               "\\t Link 1: <inactive>\\nGPU 1: NVIDIA H100 (UUID: GPU-2)\\n")
    {0: (1, (1,)), 1: (0, ())}
    """
    states: dict[int, tuple[int, tuple[int, ...]]] = {}
    gpu = None
    for line in text.splitlines():
        found = _NVLINK.match(line)
        if found is None:
            continue
        if found.group(1) is not None:
            gpu = int(found.group(1))
            states[gpu] = (0, ())
        elif gpu is not None:
            up, down = states[gpu]
            if re.match(r"[0-9.]+ [GM]B/s", found.group(3)):
                states[gpu] = (up + 1, down)
            else:
                states[gpu] = (up, (*down, int(found.group(2))))
    return states


_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+),")


def _xid(line: object) -> Xid | None:
    if not isinstance(line, str) or (found := _XID.search(line)) is None:
        return None
    return Xid(bus_id=found.group(1), code=int(found.group(2)), line=line.strip())


def _gpu(raw: dict, remapped: dict[str, dict], nvlinks: dict) -> Gpu:
    index = _number(raw.get("index"))
    bus_id = _text(raw.get("pci.bus_id"))
    remap = remapped.get(bus_id or "", {})
    up, down = nvlinks.get(index, (0, ()))
    return Gpu(
        index=index,
        uuid=_text(raw.get("uuid")),
        name=_text(raw.get("name")),
        bus_id=bus_id,
        memory_mib=_number(raw.get("memory.total")),
        used_mib=_number(raw.get("memory.used")),
        driver=_text(raw.get("driver_version")),
        persistence=_flag(raw.get("persistence_mode"), "Enabled", "Disabled"),
        mig=_flag(raw.get("mig.mode.current"), "Enabled", "Disabled"),
        ecc=_flag(raw.get("ecc.mode.current"), "Enabled", "Disabled"),
        ecc_uncorrected=_number(raw.get("ecc.errors.uncorrected.volatile.total")),
        retired_pending=_flag(raw.get("retired_pages.pending"), "Yes", "No"),
        remap_pending=_flag(remap.get("remapped_rows.pending"), "Yes", "No"),
        remap_failed=_flag(remap.get("remapped_rows.failure"), "Yes", "No"),
        slowdowns=tuple(
            name for name in SLOWDOWNS if _text(raw.get("clocks_event_reasons." + name)) == "Active"
        ),
        pcie_gen=_number(raw.get("pcie.link.gen.current")),
        pcie_gen_max=_number(raw.get("pcie.link.gen.max")),
        pcie_width=_number(raw.get("pcie.link.width.current")),
        pcie_width_max=_number(raw.get("pcie.link.width.max")),
        temperature_c=_number(raw.get("temperature.gpu")),
        nvlinks_up=up,
        nvlinks_down=down,
    )


def _gpu_process(raw: dict) -> GpuProcess:
    return GpuProcess(
        pid=_text(raw.get("pid")),
        name=_text(raw.get("process_name")),
        used_mib=_text(raw.get("used_memory")),
        gpu=_text(raw.get("gpu_uuid")),
    )


def _gpus(raw: object) -> Gpus | None:
    if not isinstance(raw, dict):
        return None
    if raw.get("error") is not None:
        return Gpus(error=_str(raw.get("error")) or "nvidia-smi failed (unreadable message)")
    remapped_rows = raw.get("remapped")
    remapped = {
        bus: row
        for row in _list(remapped_rows)
        if isinstance(row, dict) and (bus := _text(row.get("gpu_bus_id")))
    }
    nvlink = _str(raw.get("nvlink"))
    nvlinks = nvlink_states(nvlink) if nvlink else {}
    log = _dict(raw.get("kernel_log"))
    return Gpus(
        devices=tuple(
            _gpu(item, remapped, nvlinks)
            for item in _list(raw.get("devices"))
            if isinstance(item, dict)
        ),
        processes=_items(raw.get("processes"), _gpu_process),
        query=_str(raw.get("query")),
        cuda_version=_str(raw.get("cuda_version")),
        remapped_known=isinstance(remapped_rows, list),
        xid=tuple(x for x in map(_xid, _list(log.get("xid"))) if x is not None),
        kernel_log=_str(log.get("source")),
        kernel_log_error=_str(log.get("error")),
    )


def _jit_lock(raw: dict) -> JitLock | None:
    """A lock report with a path, an age and a list of pids; any other is unknown (dropped),
    not judged: a lock whose holders are unreadable must not look free to remove."""
    path, age, pids = _str(raw.get("path")), _float(raw.get("age_s")), raw.get("busy_pids")
    if path is None or age is None or not isinstance(pids, list):
        return None
    if any(_int(pid) is None for pid in pids):
        return None
    return JitLock(path=path, age_s=age, busy_pids=tuple(pids))


def _code(raw: object) -> CodeHash | None:
    if not isinstance(raw, dict):
        return None
    return CodeHash(
        sha256=_str(raw.get("sha256")),
        files=_int(raw.get("files")),
        truncated=raw.get("truncated") is True,
    )


def _ssh_outcome(raw: object) -> SshOutcome | None:
    """An outcome without an exit status is unknown (left out), not a failed ssh."""
    raw = _dict(raw)
    rc = _int(raw.get("rc"))
    if rc is None:
        return None
    return SshOutcome(
        rc=rc,
        stderr=_str(raw.get("stderr")) or "",
        seconds=_float(raw.get("seconds")),
    )


def _transfer(raw: object) -> Transfer | None:
    raw = _dict(raw)
    size, seconds = _int(raw.get("bytes")), _float(raw.get("seconds"))
    return None if size is None or seconds is None else Transfer(bytes=size, seconds=seconds)


def _active(raw: object) -> Active:
    raw = _dict(raw)
    return Active(
        tcp=_map(raw.get("tcp"), lambda ports: _map(ports, _str)),
        tcp_last_attempt=_map(raw.get("tcp_last_attempt"), lambda ports: _map(ports, _float)),
        ssh=_map(raw.get("ssh"), _ssh_outcome),
        listen=_map(raw.get("listen"), _str),
        listen_since=_float(raw.get("listen_since")),
        listen_until=_float(raw.get("listen_until")),
        token=_str(raw.get("token")),
        shared=_map(raw.get("shared"), _bool),
        bandwidth_send=_str(raw.get("bandwidth_send")),
        bandwidth_in=_map(raw.get("bandwidth_in"), _transfer),
        go_wait=_float(raw.get("go_wait")),
    )


def parse_fact_sheet(sheet: Any, *, node: str) -> NodeFacts:
    """`sheet` (the probe's JSON object, decoded) as NodeFacts; raises FactSheetError, naming
    `node`, when it is not an object or comes from another probe version."""
    if not isinstance(sheet, dict):
        raise FactSheetError(
            f"{node} answered with {type(sheet).__name__} JSON, not a fact sheet",
            f"check what `{node}`'s python prints for trainfleet's probe",
        )
    version = sheet.get("probe_version")
    if _int(version) != PROBE_VERSION:
        raise FactSheetError(
            f"{node} answered with a probe version {str(version)[:20]} fact sheet, this "
            f"trainfleet reads version {PROBE_VERSION}",
            f"run the probe this trainfleet sends: check that nothing on {node} (a wrapper "
            "around its python, a sitecustomize) answers in its place",
        )
    memory = _dict(sheet.get("memory"))
    python = _dict(sheet.get("python"))
    limits = _dict(sheet.get("limits"))
    return NodeFacts(
        probe_version=PROBE_VERSION,
        node=_str(sheet.get("node")),
        pid=_int(sheet.get("pid")),
        time=_float(sheet.get("time")),
        seconds=_float(sheet.get("seconds")),
        hostname=_str(sheet.get("hostname")),
        fqdn=_str(sheet.get("fqdn")),
        resolve=_map(sheet.get("resolve"), _resolution),
        interfaces=_interfaces(sheet.get("interfaces")),
        route_to_master=_route(sheet.get("route_to_master")),
        client_names=_map(sheet.get("client_names"), _client_name),
        resolver=_resolver(sheet.get("resolver")),
        listening=_items(sheet.get("listening"), _listener),
        firewall=_firewall(sheet.get("firewall")),
        ipv6_disabled=_str(sheet.get("ipv6_disabled")),
        port_range=_str(sheet.get("port_range")),
        limits=Limits(memlock=_int(limits.get("memlock")), nofile=_int(limits.get("nofile"))),
        shm=_disk(sheet.get("shm")),
        memory=Memory(
            total=_int(memory.get("MemTotal")), available=_int(memory.get("MemAvailable"))
        ),
        workdir=_workdir(sheet.get("workdir")),
        python=Python(
            executable=_str(python.get("executable")), version=_str(python.get("version"))
        ),
        packages=_packages(sheet.get("packages")),
        # The probe imports nothing (the stack phase does, and adds its report); a sheet that
        # carries a report (the recorded fixtures) keeps it.
        imports=parse_imports(sheet.get("imports")),
        tools={
            tool: where
            for tool, where in _dict(sheet.get("tools")).items()
            if where is None or isinstance(where, str)
        },
        path=_str(sheet.get("path")) or "",
        cuda_home=_str(sheet.get("cuda_home")),
        env=_map(sheet.get("env"), _str),
        gpus=_gpus(sheet.get("gpus")),
        infiniband=tuple(_dict(sheet.get("infiniband"))),
        jit_locks=_items(sheet.get("jit_locks"), _jit_lock),
        code=_code(sheet.get("code")),
        active=_active(sheet.get("active")),
    )


def read_fact_sheet(stdout: str, *, node: str) -> NodeFacts:
    """The probe's answer (`trainfleet.node.read_answer`) as NodeFacts; FactSheetError when
    there is none or it is not one this trainfleet reads."""
    try:
        sheet = node_programs.read_answer(stdout, FactSheet, node=node)
    except NodeAnswerError as exc:
        raise FactSheetError(
            f"{node}'s probe sent no fact sheet ({exc.problem})", exc.fix
        ) from None
    return parse_fact_sheet(sheet, node=node)
