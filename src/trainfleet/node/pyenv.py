"""`setup pyenv`'s jobs on a node: what its training environment holds, and installing wheels
into it with no index (the nodes of such clusters often have no internet).

    >>> import sys; found = facts(InspectJob(target=sys.prefix))
    >>> found["version"] == "%d.%d.%d" % sys.version_info[:3], "pip" in found["packages"]
    (True, True)

`inspect` runs with the target environment's python when it exists (what it holds is what
that python sees), else with the node's python3 of the launch node's minor version: what it
reports then is what a new environment would be made from. `install` makes the environment if
missing (`venv --without-pip`: pip comes as one of the wheels, so no ensurepip is needed) and
installs exactly the given wheel files, with the pip among them, without an index and without
resolving dependencies (the launch node sent the whole set), then byte-compiles them on every
core. The wheel directory, trainfleet's own, is removed afterwards.
"""

import os
import platform
import shutil
import subprocess
import sys
from typing import Dict, List, Optional, TypedDict

from trainfleet.node import answer, isolated, software


class InspectJob(TypedDict):
    target: str
    """The environment's directory (it may not exist yet)."""


class EnvFacts(TypedDict):
    """`inspect`'s answer (`facts`), checked by `trainfleet.setup.pyenv.step.parse_node_env`."""

    executable: str
    version: str
    implementation: str
    in_target: bool
    target_exists: bool
    packages: Dict[str, str]
    """What the target holds, {name: version} (empty where this python is not the target's)."""
    libc: str
    libc_version: str
    machine: str
    driver: Optional[str]
    free_bytes: int
    writable: bool
    path: str


class InstallJob(TypedDict):
    target: str
    dir: str
    """Where the wheels were put (removed once installed)."""
    wheels: List[str]
    pip: str
    """The file name of pip's own wheel among them."""


def _driver():
    """The NVIDIA driver version, or None (no nvidia-smi, no GPU, or it fails)."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.decode(errors="replace").split()
    return lines[0] if done.returncode == 0 and lines else None


def inspect(job: InspectJob) -> int:
    """Sends `facts`."""
    answer.send(facts(job))
    return 0


def facts(job: InspectJob) -> EnvFacts:
    """This python (version, implementation, whether it is the target's), the packages it sees
    when it is, glibc, machine, NVIDIA driver, free disk where the target is (or would be)."""
    target = os.path.abspath(job["target"])
    in_target = os.path.realpath(sys.prefix) == os.path.realpath(target)
    libc, libc_version = platform.libc_ver()
    parent = target
    while not os.path.isdir(parent):
        parent = os.path.dirname(parent)
    disk = os.statvfs(parent)
    return EnvFacts(
        executable=sys.executable,
        version="%d.%d.%d" % sys.version_info[:3],
        implementation=sys.implementation.name,
        in_target=in_target,
        target_exists=os.path.exists(target),
        packages={k: v[0] for k, v in software.dist_infos().items()} if in_target else {},
        libc=libc,
        libc_version=libc_version,
        machine=platform.machine(),
        driver=_driver(),
        free_bytes=disk.f_bavail * disk.f_frsize,
        writable=os.access(parent, os.W_OK),
        path=os.environ.get("PATH", ""),
    )


def install(job: InstallJob) -> int:
    """Makes job["target"] a venv if it is not one (with this python), then installs
    job["wheels"] (file names in job["dir"]) with the pip wheel job["pip"]. -> pip's exit code;
    its output goes to stderr."""
    target = job["target"]
    python = os.path.join(target, "bin", "python")
    if not os.path.exists(python):
        venv = isolated.module_argv(sys.executable, "venv", ["--without-pip", target])
        made = subprocess.run(venv)
        if made.returncode != 0:
            return made.returncode
    # pip runs from its own wheel (a zip on sys.path): the environment needs no pip to start.
    pip = os.path.join(job["dir"], job["pip"], "pip")
    argv = [python, pip, "install", "--no-index", "--no-deps", "--disable-pip-version-check"]
    # --no-compile, then compileall on every core: pip compiles one module at a time (torch's
    # install took 2.6 times as long here). Compiled they must be: ranks get the launch shell's
    # PYTHON* variables, PYTHONDONTWRITEBYTECODE too, and would compile every import each time.
    argv += ["--no-warn-script-location", "--no-compile", "--quiet"]
    argv += [os.path.join(job["dir"], name) for name in job["wheels"]]
    done = subprocess.run(argv, stdout=sys.stderr)
    if done.returncode != 0:
        return done.returncode
    shutil.rmtree(job["dir"], ignore_errors=True)
    # What is compiled already is skipped; what cannot be (a file for another Python) is
    # left, as pip leaves it (-qq: no list of those).
    lib = os.path.join(target, "lib")
    compile_all = isolated.module_argv(python, "compileall", ["-qq", "-j", "0", lib])
    subprocess.run(compile_all, stdout=sys.stderr)
    return 0
