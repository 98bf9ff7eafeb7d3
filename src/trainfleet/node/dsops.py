"""DeepSpeed's JIT-built ops on this node (`setup pyenv`): whether each one is built for the
target environment, and building them, as a rank's first start would.

    >>> cuda_tag("cuda: Optional[str] = None\\nhip: Optional[str] = None\\n")
    'cpu'
    >>> cuda_tag("cuda: Optional[str] = '12.4'\\nhip: Optional[str] = None\\n")
    'cu124'

DeepSpeed compiles an op (fused_adam, cpu_adam, its CPU shared-memory comm...) the first time
a rank needs it, with torch's cpp_extension: sources, flags and paths go into a build.ninja
under torch's extensions directory, and ninja decides what is out of date. Every node does it
at the first launch, minutes each, silently, and a node without a compiler or ninja fails
there (and nowhere else). `state` tells, without importing torch, whether ninja would have
anything to do; `build` loads each op through DeepSpeed's own builder, which builds it when
ninja says so and does nothing otherwise.

A build directory copied from another node (with its ninja logs and file times) counts as
built only when ninja finds it current here: same commands (so the same paths and flags, the
GPU architectures included), no source or header newer than what was built. Anything else is
built again here. That is what lets `setup pyenv` build once and copy to identical nodes.
"""

import ast
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Dict, List, Optional, TypedDict

from trainfleet.node import answer

_CUDA = re.compile(r"^(cuda|hip)\s*(?::[^=]*)?=\s*(None|'([0-9.]+)')", re.M)


def cuda_tag(version_py):
    """torch's accelerator part of the extensions directory name, from torch/version.py's text
    (ROCm before CUDA, as torch's cpp_extension decides)."""
    found = dict((m.group(1), m.group(3)) for m in _CUDA.finditer(version_py))
    if found.get("hip"):
        return "rocm" + found["hip"].replace(".", "")
    if found.get("cuda"):
        return "cu" + found["cuda"].replace(".", "")
    return "cpu"


def extensions_root():
    """Where torch's cpp_extension builds for this python and the torch it would import:
    $TORCH_EXTENSIONS_DIR, else the user's cache dir, torch_extensions, pyXY_ACCELERATOR.
    None when there is no torch."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root:
        return root
    version_py = _find(os.path.join("torch", "version.py"))
    if version_py is None:
        return None
    with open(version_py) as f:
        tag = cuda_tag(f.read())
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    folder = "py%d%d%s_%s" % (sys.version_info[0], sys.version_info[1], sys.abiflags, tag)
    return os.path.join(os.path.realpath(os.path.join(cache, "torch_extensions")), folder)


def _find(relative):
    """The first file `relative` on sys.path (as the import system would find the package)."""
    for entry in sys.path:
        candidate = os.path.join(entry or ".", relative)
        if os.path.isfile(candidate):
            return candidate
    return None


def prebuilt_ops():
    """The ops DeepSpeed was installed with, compiled (DS_BUILD_OPS): no JIT build for them.
    Read from the file it writes at install time, not by importing it."""
    path = _find(os.path.join("deepspeed", "git_version_info_installed.py"))
    if path is None:
        return set()
    with open(path) as f:
        text = f.read()
    found = re.search(r"^installed_ops\s*=\s*(\{.*\})\s*$", text, re.M)
    try:
        ops = ast.literal_eval(found.group(1)) if found else {}
    except (ValueError, SyntaxError):
        return set()
    return set(name for name, built in ops.items() if built is True)


def _sources(build_ninja):
    return re.findall(r"^build [^:]+: compile (\S+)", build_ninja, re.M)


def op_state(directory, target, ninja):
    """'current' when ninja has nothing to do there and the build is of `target`'s sources;
    'missing' when nothing was built; 'stale' otherwise."""
    try:
        with open(os.path.join(directory, "build.ninja")) as f:
            sources = _sources(f.read())
    except OSError:
        return "missing"
    roots = (target.rstrip("/") + "/", os.path.realpath(target) + "/")
    if not sources or not all(s.startswith(roots) for s in sources) or not ninja:
        return "stale"
    try:
        dry = subprocess.run(
            [ninja, "-n", "-C", directory],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return "stale"
    said = dry.stdout.decode(errors="replace")
    return "current" if dry.returncode == 0 and "no work to do" in said else "stale"


class OpsJob(TypedDict):
    """`state`'s and `build`'s input."""

    target: str
    """The environment whose python runs the job."""
    ops: List[str]
    env: Dict[str, str]
    """The node's variables from cluster.yaml (CUDA_HOME, TORCH_EXTENSIONS_DIR...)."""


class OpsState(TypedDict):
    """`state`'s answer."""

    root: Optional[str]
    """torch's extensions directory (None: no torch)."""
    ops: Dict[str, str]
    """{name: current|prebuilt|missing|stale}"""


class OpBuilt(TypedDict):
    """`build`'s answer, one per op, sent as each is done."""

    op: str
    result: str
    """built|current|prebuilt|incompatible|unknown|failed"""
    seconds: float
    error: str


def state(job: OpsJob) -> int:
    """Sends OpsState; an op installed compiled is 'prebuilt'."""
    os.environ.update(job["env"])
    root = extensions_root()
    ninja = shutil.which("ninja")
    prebuilt = prebuilt_ops()
    ops = {}
    for name in job["ops"]:
        if name in prebuilt:
            ops[name] = "prebuilt"
        elif root:
            ops[name] = op_state(os.path.join(root, name), job["target"], ninja)
        else:
            ops[name] = "missing"
    answer.send(OpsState(root=root, ops=ops))
    return 0


def _so_time(directory, name):
    try:
        return os.stat(os.path.join(directory, name + ".so")).st_mtime_ns
    except OSError:
        return None


def build(job: OpsJob) -> int:
    """Loads each of job["ops"] through DeepSpeed's builder (building what ninja says is out
    of date); sends one OpBuilt per op as soon as it is done (a build that dies or times out
    later keeps what was built before). Exit code 1 when one failed."""
    os.environ.update(job["env"])
    from deepspeed.ops.op_builder.all_ops import ALL_OPS

    root = extensions_root()
    prebuilt = prebuilt_ops()
    failed = False
    for name in job["ops"]:
        seconds, error = 0.0, ""
        builder = ALL_OPS.get(name)
        if builder is None:
            result = "unknown"
        elif name in prebuilt:
            result = "prebuilt"  # installed with the package (DS_BUILD_OPS)
        elif not builder.is_compatible(False):
            result = "incompatible"
        else:
            before = _so_time(os.path.join(root, name), name)
            started = time.monotonic()
            try:
                builder.load(verbose=False)
            except Exception as exc:  # the compiler's or ninja's words, for the user
                result = "failed"
                error = str(exc)[-2000:]
                failed = True
            else:
                after = _so_time(os.path.join(root, name), name)
                result = "current" if before and before == after else "built"
            seconds = round(time.monotonic() - started, 1)
        answer.send(OpBuilt(op=name, seconds=seconds, error=error, result=result))
    return 1 if failed else 0
