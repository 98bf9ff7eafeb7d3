"""`trainfleet setup pyenv`: this machine's training environment on every node, at the same
versions, with no internet on the nodes, and cluster.yaml's `python:` pointing at it.

    >>> from trainfleet.setup.pyenv.wheels import Dist
    >>> tag = "cp311-cp311-manylinux_2_28_x86_64"
    >>> torch = Dist(name="torch", version="2.13.0+cpu", tags=(tag,))
    >>> node = NodeEnv(version="3.11.2", packages={"torch": "2.4"}, glibc="2.36", machine="x86_64")
    >>> [(d.name, d.version) for d in plan_node(node, [torch], python="3.11")[0]]
    [('torch', '2.13.0+cpu')]
    >>> old = NodeEnv(version="3.11.2", glibc="2.17", machine="x86_64")
    >>> plan_node(old, [torch], python="3.11")[1]
    ['torch 2.13.0+cpu: needs glibc 2.28 or newer, the node has 2.17']

The environment goes to TARGET on every node (default: this machine's own venv path, so the
same path works everywhere). Per node: what TARGET holds (`trainfleet.node.pyenv`), and the
packages whose version differs from this machine's, or that are missing, are installed; a node
that matches is left alone. Before anything is copied, every node must be able to take every
wheel it needs (its Python's minor version, glibc, machine, NVIDIA driver for a CUDA torch):
otherwise nothing is installed anywhere and the nodes are named with the reasons. The wheels
are gathered once here (`wheels`), copied with tar over ssh, installed with no index, and
doctor's version checks end the step.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Literal

from trainfleet import node as node_programs
from trainfleet.cluster import Cluster, Node, parse_cluster_yaml
from trainfleet.cluster.validate import PATH_RE
from trainfleet.clusterfile import NodeEdit
from trainfleet.errors import NodeAnswerError, SetupError
from trainfleet.launch.environment import launch_shell_env
from trainfleet.node import pyenv as node_pyenv
from trainfleet.nodeset import fold_names
from trainfleet.remote import run_on_nodes
from trainfleet.setup import clusteryaml, verify
from trainfleet.setup.pyenv import dsops, wheels
from trainfleet.setup.pyenv.wheels import Dist
from trainfleet.setup.result import Confirm, SetupResult
from trainfleet.setup.sync.transfer import COPY_TIMEOUT_S, stream_tar
from trainfleet.untrusted import printable

WHEEL_DIR = ".trainfleet-wheels"
"""Inside TARGET on a node, while installing; removed once pip is done."""


def wheel_cache() -> Path:
    """Where packages packed back into wheels are kept here (a second run packs nothing)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "trainfleet" / "wheels"


_VERSION = re.compile(r"\d+\.\d+\.\d+")
_PATH = re.compile(r"[A-Za-z0-9_./:+,=@%~-]{1,4000}")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+!-]{0,80}")


@dataclass(kw_only=True, slots=True)
class NodeEnv:
    """What a node's `inspect` reported, checked (a node's words are untrusted)."""

    version: str
    """The Python that would run there: TARGET's, else its python3 of our minor version."""
    packages: dict[str, str] = field(default_factory=dict)
    """What TARGET holds (empty when it does not exist yet)."""
    glibc: str | None = None
    machine: str = ""
    driver: str | None = None
    in_target: bool = False
    writable: bool = True
    free_bytes: int | None = None
    executable: str = ""
    path: str = DEFAULT_PATH
    """PATH as non-interactive ssh sets it there."""
    implementation: str = "cpython"


def parse_node_env(stdout: str, *, node: str) -> NodeEnv:
    """`node_pyenv.inspect`'s answer (`node_pyenv.EnvFacts`); ValueError when it is not what it
    should be."""
    try:
        # Its keys checked there; each value is checked below (a node's words are untrusted).
        raw: node_pyenv.EnvFacts = node_programs.read_answer(stdout, node_pyenv.EnvFacts, node=node)
    except NodeAnswerError as exc:
        raise ValueError(exc.problem) from None
    version = str(raw["version"])
    if not _VERSION.fullmatch(version):
        raise ValueError(f"python version {printable(version)!r}")
    packages = {}
    for name, value in (raw["packages"] if isinstance(raw["packages"], dict) else {}).items():
        if _WORD.fullmatch(str(name)) and _WORD.fullmatch(str(value)):
            packages[wheels.normalize(name)] = str(value)

    def word(key: Literal["libc_version", "machine", "driver", "implementation"]) -> str | None:
        value = raw[key]
        return str(value) if value and _WORD.fullmatch(str(value)) else None

    free = raw["free_bytes"]
    return NodeEnv(
        version=version,
        packages=packages,
        glibc=word("libc_version") if raw["libc"] == "glibc" else None,
        machine=word("machine") or "",
        driver=word("driver"),
        in_target=raw["in_target"] is True,
        writable=raw["writable"] is not False,
        free_bytes=free if isinstance(free, int) else None,
        executable=printable(str(raw["executable"])),
        path=path if _PATH.fullmatch(path := str(raw["path"])) else DEFAULT_PATH,
        implementation=word("implementation") or "unknown",
    )


def plan_node(node: NodeEnv, dists: list[Dist], *, python: str) -> tuple[list[Dist], list[str]]:
    """(the packages the node lacks or has at another version, why it cannot take them)."""
    if ".".join(node.version.split(".")[:2]) != python:
        where = "its environment's" if node.in_target else "its newest python3 found"
        return [], [f"{where} Python is {node.version}, this machine's is {python}: the wheels "
                    f"are built for {python}; install python{python} there"]  # fmt: skip
    todo = [d for d in dists if node.packages.get(d.name) != d.version]
    reasons = []
    if node.implementation != "cpython":  # cp311 wheels are CPython's
        reasons.append(f"its python is {node.implementation}, this machine's is cpython")
    for dist in todo:
        why = [wheels.cannot_take(t, python=python, glibc=node.glibc, machine=node.machine)
               for t in dist.tags]  # fmt: skip
        if all(why):
            reasons.append(f"{dist.name} {dist.version}: {why[0]}")
        if dist.name == "torch" and (old := wheels.driver_too_old(dist.version, node.driver)):
            reasons.append(old)
    if todo and not node.writable:
        reasons.append("cannot write there (permissions)")
    # the wheels (about half of it, compressed) and the installed files at once
    need = sum(d.installed_bytes for d in todo) * 3 // 2
    if node.free_bytes is not None and node.free_bytes < need:
        reasons.append(f"needs about {need / 1e9:.1f} GB free there, the disk has "
                       f"{node.free_bytes / 1e9:.1f} GB")  # fmt: skip
    return todo, reasons


def _with_target_python(target: str, python: str, program: ModuleType = node_pyenv) -> list[str]:
    """A node program run by TARGET's python when there is one, else by the node's python3.X,
    else python3 (`inspect` and `install` both; `dsops` once TARGET exists)."""
    pick = (
        'p="$1/bin/python"; [ -x "$p" ] || p=$(command -v "python$2" || command -v python3); '
        'shift 2; exec "$p" "$@"'
    )
    return ["sh", "-c", pick, "sh", target, python, *node_programs.argv("python3", program)[1:]]


def inspect_nodes(cluster: Cluster, target: str, python: str) -> dict[str, NodeEnv]:
    stdin = node_programs.line(node_pyenv.inspect, node_pyenv.InspectJob(target=target))
    results = run_on_nodes(
        cluster.nodes, _with_target_python(target, python), stdin=stdin, timeout=60
    )
    down = [r for r in results if r.failure.is_connection_failure]
    if down:
        raise SetupError(
            f"cannot reach {fold_names([r.node for r in down])}: {down[0].reason()}",
            "fix ssh first (`trainfleet setup ssh`)",
        )
    envs, broken = {}, {}
    for result in results:
        try:
            envs[result.node] = parse_node_env(result.stdout, node=result.node)
        except ValueError as exc:
            broken[result.node] = f"{exc} ({result.reason() if not result.ok else 'exit 0'})"
    if broken:
        raise SetupError(
            "no usable report from " + "; ".join(f"{h}: {why}" for h, why in broken.items()),
            "check that python3 runs there (`trainfleet exec -- python3 -V`)",
        )
    return envs


def _sizes(files: dict[str, Path], names: list[str]) -> str:
    total = sum(files[n].stat().st_size for n in names)
    return f"{total / 1e6:.0f} MB"


def gather(dists: list[Dist], *, wheel_dirs: list[str], cache: Path) -> dict[str, Path]:
    """{dist name: a wheel file here}: found in `wheel_dirs` or the cache, else packed."""
    found = {}
    for dist in dists:
        cached = cache / dist.filename
        if dist.editable is None and (path := wheels.find_wheel(dist, wheel_dirs)):
            found[dist.name] = path
        elif cached.exists() and dist.editable is None:
            found[dist.name] = cached
    todo = [d for d in dists if d.name not in found]
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        for dist, path in zip(todo, pool.map(lambda d: wheels.repack(d, cache), todo), strict=True):
            found[dist.name] = path
    return found


def _copy(node: Node, target: str, files: list[Path]) -> str:
    """tar the wheel files over ssh into TARGET/.trainfleet-wheels; '' when done."""
    create = ["tar", "-cf", "-"]
    for path in files:
        create += ["-C", str(path.parent), path.name]
    ended = stream_tar(create, node, f"{target}/{WHEEL_DIR}")
    if ended.extracted != 0:  # first: tar here then only saw its reader go away
        return ended.extracted_err or f"exit {ended.extracted}"
    if ended.created != 0:
        return f"tar here: {ended.created_err}"
    return ""


def _install(node: Node, target: str, python: str, names: list[str], pip: str) -> str:
    job = node_pyenv.InstallJob(target=target, dir=f"{target}/{WHEEL_DIR}", wheels=names, pip=pip)
    stdin = node_programs.line(node_pyenv.install, job)
    [done] = run_on_nodes([node], _with_target_python(target, python), stdin=stdin,
                          timeout=COPY_TIMEOUT_S)  # fmt: skip
    if done.ok:
        return ""
    tail = [printable(line) for line in done.stderr.splitlines() if line.strip()][-3:]
    return "; ".join(tail) or done.reason()


def _say(text: str) -> None:
    print(f"trainfleet setup pyenv: {text}", file=sys.stderr, flush=True)


def this_python() -> str:
    return "{}.{}".format(*sys.version_info[:2])


def default_target() -> str | None:
    """This machine's venv (None when trainfleet does not run in one)."""
    return sys.prefix if sys.prefix != sys.base_prefix else None


def setup_pyenv(
    cluster: Cluster,
    *,
    target: str | None = None,
    packages: list[str] | tuple[str, ...] = (),
    requirements: str | None = None,
    wheel_dirs: list[str] | tuple[str, ...] = (),
    cache: Path | None = None,
    confirm: Confirm,
    cluster_in: str | None = None,
    cluster_out: str | None = None,
    dry_run: bool = False,
    ds_ops: str | None = None,
    say: Callable[[str], None] = _say,
) -> SetupResult:
    """Install this machine's training packages into `target` on every node that differs, then
    DeepSpeed's JIT ops (`ds_ops`, see `trainfleet.setup.pyenv.dsops`) where they are not built."""
    target = target or default_target()
    if not target:
        raise SetupError(
            "trainfleet does not run in a venv here, so there is no environment path to use on "
            "the nodes",
            "pass --venv PATH (where the nodes get the environment), or run trainfleet from the"
            " training venv",
        )
    target = target.rstrip("/")
    if not os.path.isabs(target) or not PATH_RE.match(target):
        raise SetupError(f"--venv {target!r} is not an absolute path of plain characters",
                         "pass an absolute path such as /opt/envs/train")  # fmt: skip
    result = SetupResult(step="pyenv", dry_run=dry_run)
    own = list(packages)
    if requirements:
        try:
            own += wheels.requirement_names(requirements)
        except (OSError, ValueError) as exc:
            raise SetupError(f"reading {requirements}: {exc}", "pass a requirements file") from exc
    dists, missing = wheels.closure([*wheels.TRAINING, *own])
    if not_here := [m for m in own if m in missing]:
        raise SetupError(
            f"{', '.join(not_here)} not installed here: the nodes get this machine's versions",
            f"install {' '.join(not_here)} here first (pip install), then run this again",
        )
    if not any(d.name == "pip" for d in dists):  # a venv made by uv, or --without-pip
        raise SetupError(
            "pip is not installed here, and the nodes install the wheels with it",
            f"install it here first: `{sys.executable} -m ensurepip`",
        )
    python = this_python()
    envs = inspect_nodes(cluster, target, python)
    plans = {host: plan_node(env, dists, python=python) for host, env in envs.items()}
    refused = {h: why for h, (_, why) in plans.items() if why}
    if refused:
        raise SetupError(
            "nothing was installed anywhere: "
            + "; ".join(
                f"{h} cannot take the environment: {', '.join(w)}" for h, w in refused.items()
            ),  # fmt: skip
            "fix those nodes (or leave them out with --exclude), then run this again",
        )
    todo = {h: names for h, (names, _) in plans.items() if names}
    for dist in dists:
        if dist.editable and any(dist in names for names in todo.values()):
            result.note(
                f"{dist.name} is installed editable here (from {dist.editable}): the nodes get "
                "the same link, so that directory must be there too (sync)"
            )
    verb = "would install" if dry_run else "installed"
    for host, names in todo.items():
        made = ""
        if not envs[host].in_target:
            verb_made = "would create" if dry_run else "created"
            made = f"{verb_made} {target} ({envs[host].executable}), "
        listed = ", ".join(f"{d.name} {d.version}" for d in names[:6])
        more = f" and {len(names) - 6} more" if len(names) > 6 else ""
        result.add(host, f"{made}{verb} {len(names)} package(s): {listed}{more}")
    ops = dsops.chosen(ds_ops, {d.name for d in dists}, cpu_torch=dsops.torch_is_cpu_only())
    job_envs = {n.host: _job_env(n, target, envs[n.host].path) for n in cluster.nodes}
    argv_for = functools.partial(_with_target_python, target, python)
    ops_todo = _ops_to_build(cluster, envs, argv_for, target, ops, job_envs)
    if dry_run:
        for host, op_names in ops_todo.items():
            result.add(host, f"would build DeepSpeed ops {', '.join(op_names)} (on one node, "
                             "copied to the others)")  # fmt: skip
    elif todo or ops_todo:
        plan = [f"  {c.node}: {c.what}" for c in result.changes]
        plan += [f"  {h}: build DeepSpeed ops {', '.join(o)} (on one node, copied to the others)"
                 for h, o in ops_todo.items()]  # fmt: skip
        if not confirm("\n".join([f"install into {target} on:", *plan, "go ahead?"])):
            raise SetupError("the installation was not confirmed; nothing was changed",
                             "run again and answer yes, or pass --yes")  # fmt: skip
        if todo:
            _install_everywhere(cluster, dists, todo, target, python, wheel_dirs, cache, result)
        if ops:
            dsops.prepare(cluster, argv_for=argv_for, target=target, ops=ops, envs=job_envs,
                          result=result, say=say)  # fmt: skip
    _record_python(cluster, target, envs, cluster_in, cluster_out, result)
    checked = cluster
    if not dry_run and (written := result.files.get("cluster")):
        checked = parse_cluster_yaml(Path(written).read_text(), written)
    result.checks = [verify.PYENV.label]
    result.findings = verify.findings(verify.survey(checked, verify.PYENV), verify.PYENV)
    return result


def _ops_to_build(
    cluster: Cluster,
    envs: dict[str, NodeEnv],
    argv_for: dsops.ArgvFor,
    target: str,
    ops: Sequence[str],
    job_envs: dict[str, dict[str, str]],
) -> dict[str, list[str]]:
    """{host: the ops it lacks}, asked of the nodes that have TARGET (the others lack all)."""
    if not ops:
        return {}
    ready = [h for h, env in envs.items() if env.in_target]
    states = dsops.survey(cluster, ready, argv_for, target, ops, job_envs) if ready else {}
    wanted = {n.host: states[n.host].todo if n.host in states else list(ops) for n in cluster.nodes}
    return {host: names for host, names in wanted.items() if names}


def _install_everywhere(
    cluster: Cluster,
    dists: list[Dist],
    todo: dict[str, list[Dist]],
    target: str,
    python: str,
    wheel_dirs: Sequence[str],
    cache: Path | None,
    result: SetupResult,
) -> None:
    """Gather the wheels once, then per node (at once): copy what it needs, install it."""
    needed = {d.name: d for names in todo.values() for d in names}
    needed["pip"] = next(d for d in dists if d.name == "pip")  # what installs, on every node
    files = gather(
        list(needed.values()),
        wheel_dirs=[*wheel_dirs, *wheels.pip_find_links()],
        cache=cache or wheel_cache(),
    )

    def one(host: str) -> str:
        node = cluster.node(host)
        install = [files[d.name] for d in todo[host]]
        copy = install if files["pip"] in install else [*install, files["pip"]]
        error = _copy(node, target, copy)
        return error or _install(node, target, python, [p.name for p in install],
                                 files["pip"].name)  # fmt: skip

    with ThreadPoolExecutor(max_workers=8) as pool:
        errors = dict(zip(todo, pool.map(one, todo), strict=True))
    sizes = {h: _sizes(files, [d.name for d in todo[h]]) for h in todo}
    result.note("wheels copied: " + ", ".join(f"{h} {size}" for h, size in sizes.items()))
    if failed := {h: e for h, e in errors.items() if e}:
        raise SetupError(
            "; ".join(f"{h}: {e}" for h, e in failed.items()),
            "fix what pip says on that node and run this again (what was installed stays)",
        )


def _venv_first_path(node: Node, target: str, node_path: str) -> str:
    """The PATH the node's ranks get once this step is done: cluster.yaml's, else the node's
    own non-interactive one, with TARGET/bin first."""
    path = node.env.get("PATH") or node_path
    bin_dir = f"{target}/bin"
    return path if path.split(":")[0] == bin_dir else f"{bin_dir}:{path}"


def _job_env(node: Node, target: str, node_path: str) -> dict[str, str]:
    """What a rank there would see of the variables a build of DeepSpeed's ops reads: the
    launch shell's forwarded ones (TORCH_EXTENSIONS_DIR, TORCH_CUDA_ARCH_LIST, CUDA_HOME...),
    then cluster.yaml's, with TARGET/bin first on PATH (ninja is there)."""
    env = {k: v for k, v in launch_shell_env(os.environ).items() if k != "PATH"}
    return {**env, **node.env, "PATH": _venv_first_path(node, target, node_path)}


def _record_python(
    cluster: Cluster,
    target: str,
    envs: dict[str, NodeEnv],
    cluster_in: str | None,
    cluster_out: str | None,
    result: SetupResult,
) -> None:
    """Every node's `python:` is TARGET's, and its PATH starts with TARGET/bin: the tools
    beside that python (torchrun, deepspeed, ninja for DeepSpeed's op builds) are found there,
    and the PATH the launch shell would forward (its own directories, maybe another user's)
    does not reach the ranks. `setup env` records the same PATH for tools beside python."""
    python = f"{target}/bin/python"
    fields: dict[str, NodeEdit] = {}
    for node in cluster.nodes:
        wanted: NodeEdit = {"python": python} if node.python != python else {}
        path = _venv_first_path(node, target, envs[node.host].path)
        if path != (node.env.get("PATH") or envs[node.host].path):
            wanted["env"] = {"PATH": path}
        if wanted:
            fields[node.host] = wanted
    if not fields:
        return
    clusteryaml.record(cluster, fields, cluster_in=cluster_in,
                       out=cluster_out or cluster_in or "cluster.yaml",
                       written_by="trainfleet setup pyenv", result=result)  # fmt: skip
