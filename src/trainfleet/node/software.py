"""The node's training software: versions from package metadata (no import), and, in a full
probe, what importing the stack reports (once per interpreter and installed versions: N nodes
on one shared install import it once).
"""

import hashlib
import json
import os
import sys
import time

from trainfleet.node import stack_imports, system

PACKAGES = ("torch", "deepspeed", "transformers", "accelerate", "datasets", "peft")


def dist_infos():
    """{normalized name: (version, path)} from the *.dist-info dirs on sys.path (no imports)."""
    found = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.endswith(".dist-info"):
                dist, _, version = name[: -len(".dist-info")].partition("-")
                key = dist.lower().replace("_", "-").replace(".", "-")
                found.setdefault(key, (version, os.path.join(entry, name)))
    return found


def package_versions(dists):
    versions = {name: dists[name][0] if name in dists else None for name in PACKAGES}
    for wheel in ("nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-nccl-cu11"):
        if wheel in dists:
            versions["nccl_wheel"] = dists[wheel][0]
    return versions


def _install_key(dists):
    stamp = [sys.executable, os.path.realpath(sys.executable)]
    for name in PACKAGES:
        version, path = dists.get(name, ("-", ""))
        mtime = os.path.getmtime(path) if path else 0
        stamp.append("%s=%s@%s" % (name, version, mtime))
    return hashlib.sha256("|".join(stamp).encode()).hexdigest()[:24]


def imports(timeout, versions, dists):
    """Import the training stack in a subprocess; cached per interpreter + installed versions,
    so N nodes on one shared install (or repeated runs) import it once."""
    if not versions.get("torch") and not versions.get("deepspeed"):
        return {"skipped": "no torch or deepspeed installed"}
    cache_dir = os.path.join(os.path.expanduser("~"), ".cache", "trainfleet")
    key = _install_key(dists)
    cache = os.path.join(cache_dir, "imports-%s.json" % key)
    lock = cache + ".lock"
    deadline = time.time() + timeout + 5
    while time.time() < deadline:
        try:
            with open(cache) as f:
                result = json.load(f)
                result["cached"] = True
                return result
        except (OSError, ValueError):
            pass
        try:
            os.makedirs(cache_dir, exist_ok=True)
            os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            break  # this probe imports; others on the same install wait for its result
        except FileExistsError:
            try:
                if time.time() - os.path.getmtime(lock) > timeout + 10:
                    os.unlink(lock)  # a probe died while importing
            except OSError:
                pass
            time.sleep(0.2)
        except OSError:
            break  # read-only home: import without the cache
    try:
        program = system.own_source(stack_imports) + "\nreport()\n"
        code, out, err = system.run([sys.executable, "-c", program], timeout=timeout)
        if code != 0:
            return {"import_error": (err.strip().splitlines() or ["exit %s" % code])[-1]}
        result = json.loads(out.strip().splitlines()[-1])
        try:
            tmp = "%s.%d" % (cache, os.getpid())
            with open(tmp, "w") as f:
                json.dump(result, f)
            os.replace(tmp, cache)
        except OSError:
            pass  # the cache only saves the next probe an import
        return result
    finally:
        try:
            os.unlink(lock)
        except OSError:
            pass
