"""The node's own facts that need no network: commands run with a bound, files read, memory,
disk, limits, InfiniBand ports, a hash of the code in the workdir.

    >>> run(["true"])[0], run(["no-such-command-here"])[0]
    (0, 127)
"""

import glob
import hashlib
import os
import resource
import subprocess
from typing import Dict, Optional


def run(argv, timeout=5.0, env=None):
    """(returncode, stdout, stderr) of argv; 127 when missing, 124 on timeout."""
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL
        )
        return proc.returncode, proc.stdout, proc.stderr
    except FileNotFoundError:
        return 127, "", "not found"
    except subprocess.TimeoutExpired:
        return 124, "", "timed out after %s s" % timeout
    except OSError as exc:
        return 126, "", str(exc)


def read_first(path, default=None):
    try:
        return open(path).read().strip()
    except OSError:
        return default


def memory():
    info = {}
    for line in (read_first("/proc/meminfo", "") or "").splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            info[key] = int(rest.split()[0]) * 1024
    return info


def statvfs(path):
    try:
        st = os.statvfs(path)
        return {"total": st.f_blocks * st.f_frsize, "free": st.f_bavail * st.f_frsize}
    except OSError as exc:
        return {"error": str(exc)}


def limits():
    out = {}
    for key, which in (("memlock", resource.RLIMIT_MEMLOCK), ("nofile", resource.RLIMIT_NOFILE)):
        soft, _ = resource.getrlimit(which)
        out[key] = None if soft == resource.RLIM_INFINITY else soft
    return out


def infiniband() -> Dict[str, Dict[str, Dict[str, Optional[str]]]]:
    """{device: {port: {state, link_layer, rate}}} (None: a file that could not be read)."""
    devices: Dict[str, Dict[str, Dict[str, Optional[str]]]] = {}
    for port_dir in glob.glob("/sys/class/infiniband/*/ports/*"):
        parts = port_dir.split("/")
        devices.setdefault(parts[4], {})[parts[6]] = {
            "state": read_first(port_dir + "/state"),
            "link_layer": read_first(port_dir + "/link_layer"),
            "rate": read_first(port_dir + "/rate"),
        }
    return devices


def code_hash(workdir, limit=2000):
    digest = hashlib.sha256()
    count = 0
    for root, dirs, files in os.walk(workdir):
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".")
            and d not in ("__pycache__", "node_modules", "venv", "runs", "outputs", "wandb")
        )
        for name in sorted(files):
            if name.endswith((".py", ".sh", ".yaml", ".yml", ".json", ".toml")):
                path = os.path.join(root, name)
                try:
                    if os.path.getsize(path) > 1 << 20:
                        continue
                    digest.update(path.encode() + b"\0" + open(path, "rb").read())
                except OSError:
                    continue
                count += 1
                if count >= limit:
                    return {"sha256": digest.hexdigest(), "files": count, "truncated": True}
    return {"sha256": digest.hexdigest(), "files": count}


def own_source(module):
    """A node module's text: kept by the loader on a node (`__source__`), read from its file
    elsewhere."""
    text = getattr(module, "__source__", None)
    if text:
        return text
    with open(module.__file__) as f:
        return f.read()
