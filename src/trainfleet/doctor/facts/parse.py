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


def _gpu(raw: dict) -> Gpu:
    return Gpu(
        index=_int(raw.get("index")),
        name=_str(raw.get("name")),
        memory_mib=_int(raw.get("memory_mib")),
        driver=_str(raw.get("driver")),
    )


def _gpu_process(raw: dict) -> GpuProcess:
    return GpuProcess(**{name: _str(raw.get(name)) for name in GpuProcess.__dataclass_fields__})


def _gpus(raw: object) -> Gpus | None:
    if not isinstance(raw, dict):
        return None
    return Gpus(
        devices=_items(raw.get("devices"), _gpu),
        processes=_items(raw.get("processes"), _gpu_process),
        error=_str(raw.get("error")),
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
