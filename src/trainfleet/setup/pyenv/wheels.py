"""The launch node's training environment as wheel files, and which nodes can take them.

    >>> cannot_take("cp311-cp311-manylinux_2_28_x86_64", python="3.11", glibc="2.17",
    ...             machine="x86_64")
    'needs glibc 2.28 or newer, the node has 2.17'
    >>> cannot_take("py3-none-any", python="3.8", glibc=None, machine="aarch64") is None
    True

What a node gets is what this machine's environment holds: the packages that matter for
training (TRAINING, those installed here), the user's own, and everything they require, at
the versions installed here (`closure`). Each becomes a wheel without any index: a wheel file
with that exact name and version from a directory the user or pip's configuration names, else
the installed files themselves packed back into one (`repack`, the files each package's RECORD
lists), kept in a cache so that a second run packs nothing. Nodes install them with no index
and no resolver (`trainfleet.node.pyenv`), so they get exactly this set.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from trainfleet.node import isolated

TRAINING = ("torch", "deepspeed", "transformers", "accelerate", "peft", "datasets", "trl",
            "flash-attn", "bitsandbytes", "xformers", "liger-kernel", "tokenizers",
            "safetensors", "sentencepiece", "ninja", "tensorboard", "wandb", "py-spy",
            "matplotlib", "trainfleet", "pip")  # fmt: skip
"""Installed on the nodes when installed here: the stack trainfleet train and the usual
trainers import (matplotlib: train's loss.png), trainfleet itself (train's ranks import it),
and pip (what installs them)."""

MIN_DRIVER = {"11": (450, 80, 2), "12": (525, 60, 13), "13": (580, 65, 6)}
"""CUDA major -> the oldest Linux driver that runs it (NVIDIA's CUDA compatibility guide, minor
version compatibility): a torch built for +cu12x needs at least 525.60.13."""

_DROPPED = ("INSTALLER", "REQUESTED", "direct_url.json", "RECORD")
"""dist-info files of an installation, not of the package: pip writes them anew on the node."""


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True, slots=True)
class Dist:
    name: str
    """Normalized (PEP 503)."""
    version: str
    tags: tuple[str, ...]
    """From its WHEEL file (py3-none-any when it has none)."""
    editable: str | None = None
    """The source directory of an editable install (its link is what the nodes get)."""
    installed_bytes: int = 0
    """What its files take here (RECORD's sizes): what it takes on a node."""

    @property
    def filename(self) -> str:
        stem = re.sub(r"[-_.]+", "_", self.name)
        tag = _compress(self.tags)
        return f"{stem}-{self.version}-{tag}.whl"


def _compress(tags: tuple[str, ...]) -> str:
    """py2-none-any + py3-none-any -> py2.py3-none-any (a wheel file name's tag set)."""
    parts = [t.split("-") for t in tags]
    return "-".join(".".join(dict.fromkeys(p[i] for p in parts)) for i in range(3))


def _dist(dist: metadata.Distribution) -> Dist:
    wheel = dist.read_text("WHEEL") or ""
    tags = tuple(line.split(":", 1)[1].strip() for line in wheel.splitlines()
                 if line.startswith("Tag:"))  # fmt: skip
    editable = None
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    if (direct.get("dir_info") or {}).get("editable"):
        editable = direct.get("url", "").removeprefix("file://")
    return Dist(
        name=normalize(dist.metadata["Name"]),
        version=dist.version,
        tags=tags or ("py3-none-any",),
        editable=editable,
        installed_bytes=sum(f.size or 0 for f in dist.files or []),
    )


def installed() -> dict[str, metadata.Distribution]:
    """This environment's distributions by normalized name (the first on sys.path wins, as
    for imports)."""
    found: dict[str, metadata.Distribution] = {}
    for dist in metadata.distributions():
        found.setdefault(normalize(dist.metadata["Name"] or ""), dist)
    return found


def closure(roots: list[str]) -> tuple[list[Dist], list[str]]:
    """(the roots installed here and everything they require that is installed here, sorted;
    the roots not installed here). A requirement not installed here (an optional one behind a
    marker, or one this environment runs without) is left out, as it is here."""
    from packaging.requirements import Requirement

    dists = installed()
    missing = [r for r in roots if normalize(r) not in dists]
    todo: list[tuple[str, tuple[str, ...]]] = [
        (normalize(r), ()) for r in roots if normalize(r) in dists
    ]
    seen: dict[str, set[str]] = {}
    while todo:
        name, extras = todo.pop()
        if name in seen and set(extras) <= seen[name]:
            continue
        seen.setdefault(name, set()).update(extras)
        for text in dists[name].requires or []:
            req = Requirement(text)
            wanted = [{"extra": e} for e in ("", *seen[name])]
            if req.marker and not any(req.marker.evaluate(env) for env in wanted):
                continue
            if normalize(req.name) in dists:
                todo.append((normalize(req.name), tuple(req.extras)))
    return sorted((_dist(dists[n]) for n in seen), key=lambda d: d.name), missing


def requirement_names(path: str) -> list[str]:
    """The project names a requirements file lists (options, URLs and comments skipped)."""
    names = []
    for number, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.split(" #")[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line)
        if not match:
            raise ValueError(f"{path}:{number}: {raw.strip()!r} is not a requirement")
        names.append(match.group(0))
    return names


# ----------------------------------------------------------------------------- compatibility


def cannot_take(tag: str, *, python: str, glibc: str | None, machine: str) -> str | None:
    """Why a node with this python (major.minor), glibc and machine cannot install a wheel
    with this tag; None when it can."""
    interpreter, abi, platform = tag.split("-")
    major, minor = (int(x) for x in python.split(".")[:2])
    versions = re.findall(r"(?:cp|py)(\d)(\d*)", interpreter)
    fits = []
    for tag_major, tag_minor in versions:
        same = int(tag_major) == major
        if not tag_minor or (abi in ("abi3", "none") and interpreter.startswith("py")):
            fits.append(same and (not tag_minor or int(tag_minor) <= minor))
        elif abi == "abi3":
            fits.append(same and int(tag_minor) <= minor)
        else:
            fits.append(same and int(tag_minor) == minor)
    if versions and not any(fits):
        return f"built for Python {_versions(interpreter)}, the node's is {python}"
    if platform == "any":
        return None
    arch = re.sub(r"^(manylinux(_\d+_\d+|1|2010|2014)|musllinux_\d+_\d+|linux)_", "", platform)
    if arch != machine:
        return f"built for {arch}, the node is {machine}"
    if platform.startswith("musllinux") and glibc:
        return f"built for musl libc (Alpine), the node has glibc {glibc}"
    needed = _glibc_needed(platform)
    if needed and (not glibc or _numbers(glibc) < needed):
        have = glibc or "no glibc"
        return f"needs glibc {'.'.join(map(str, needed))} or newer, the node has {have}"
    return None


def _versions(interpreter: str) -> str:
    return ", ".join(f"{a}.{b}" if b else a for a, b in re.findall(r"(\d)(\d*)", interpreter))


def _glibc_needed(platform: str) -> tuple[int, ...] | None:
    legacy = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
    for name, version in legacy.items():
        if platform.startswith(name + "_"):
            return version
    match = re.match(r"manylinux_(\d+)_(\d+)_", platform)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version))


def driver_too_old(torch_version: str, driver: str | None) -> str | None:
    """Why a node's NVIDIA driver cannot run a CUDA build of torch (`2.5.1+cu124`); None when
    it can, or when the node has no driver (no GPU: nothing to run it on there either)."""
    match = re.search(r"\+cu(\d\d)(\d)", torch_version)
    if not match or not driver or match.group(1) not in MIN_DRIVER:
        return None
    oldest = MIN_DRIVER[match.group(1)]
    if _numbers(driver) >= oldest:
        return None
    cuda = f"{match.group(1)}.{match.group(2)}"
    return (f"torch {torch_version} is built for CUDA {cuda}, which needs NVIDIA driver "
            f"{'.'.join(map(str, oldest))} or newer; the node has {driver}")  # fmt: skip


# ----------------------------------------------------------------------------- wheel files


def pip_find_links() -> list[str]:
    """The wheel directories pip's configuration names (find-links), for wheels already here."""
    argv = isolated.module_argv(sys.executable, "pip", ["config", "list"], version=sys.version_info)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    dirs = []
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".find-links"):
            for word in value.strip().strip("'\"").split():
                path = word.removeprefix("file://")
                if os.path.isdir(path):
                    dirs.append(path)
    return dirs


def find_wheel(dist: Dist, directories: list[str]) -> Path | None:
    """A wheel file of exactly this name and version in one of `directories`."""
    stem = re.sub(r"[-_.]+", "_", dist.name).lower()
    for directory in directories:
        for path in sorted(Path(directory).glob("*.whl")):
            name, _, rest = path.name.partition("-")
            version = rest.split("-")[0]
            if normalize(name) == normalize(stem) and version == dist.version:
                return path
    return None


def repack(dist: Dist, into: Path) -> Path:
    """The installed files of `dist` packed back into a wheel in `into` (written to a temporary
    name first, so a cut-off run leaves no half wheel under the real name)."""
    installed_dist = installed()[dist.name]
    # str(): importlib types it a SimplePath (what a Distribution may give); from the
    # distributions on sys.path (installed()'s) it is a Path.
    site = Path(str(installed_dist.locate_file("")))
    prefix = Path(sys.prefix)
    info_dir = next(p for p in installed_dist.files or [] if str(p).endswith(".dist-info/RECORD"))
    info = str(info_dir.parent)
    data_dir = info.removesuffix(".dist-info") + ".data"
    scripts = {ep.name for ep in installed_dist.entry_points
               if ep.group in ("console_scripts", "gui_scripts")}  # fmt: skip
    into.mkdir(parents=True, exist_ok=True)
    final = into / dist.filename
    partial = into / (dist.filename + ".part")
    record = []
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as wheel:
        for member in installed_dist.files or []:
            source = Path(os.path.normpath(site / member))
            arcname = _arcname(str(member), source, prefix, info, data_dir, scripts)
            if arcname is None or not source.is_file():
                continue
            data = source.read_bytes()
            if arcname.startswith(f"{data_dir}/scripts/") and data.startswith(b"#!"):
                first, _, rest = data.partition(b"\n")
                if b"python" in first:
                    data = b"#!python\n" + rest  # pip writes the node's own python there
            wheel.writestr(_info(arcname, source), data, compresslevel=1)
            record.append((arcname, record_hash(data), str(len(data))))
        record.append((f"{info}/RECORD", "", ""))
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(record)
        wheel.writestr(f"{info}/RECORD", text.getvalue())
    partial.replace(final)
    return final


def _arcname(
    member: str, source: Path, prefix: Path, info: str, data_dir: str, scripts: set[str]
) -> str | None:
    """Where an installed file goes in the wheel; None: not packed (compiled caches, the
    installation's own records, entry-point scripts pip writes anew)."""
    if "__pycache__" in Path(member).parts or member.endswith(".pyc"):
        return None
    if member.startswith(info + "/") and member.split("/")[-1] in _DROPPED:
        return None
    if not member.startswith("../"):
        return member
    try:
        relative = source.relative_to(prefix)
    except ValueError:
        return None  # outside the environment: not the package's to give
    if relative.parts[0] == "bin":
        if relative.name in scripts:
            return None
        return f"{data_dir}/scripts/{relative.name}"
    return f"{data_dir}/data/{relative.as_posix()}"


def _info(arcname: str, source: Path) -> zipfile.ZipInfo:
    entry = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
    entry.external_attr = (source.stat().st_mode & 0o777 | 0o100000) << 16
    entry.compress_type = zipfile.ZIP_DEFLATED
    return entry


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()
