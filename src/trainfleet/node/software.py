"""The node's training software: versions from package metadata (no import: what importing
the stack reports comes from doctor's stack phase, `collective`, which imports it once).
"""

import os
import sys
from typing import Dict, Tuple

PACKAGES = ("torch", "deepspeed", "transformers", "accelerate", "datasets", "peft")


def dist_infos() -> Dict[str, Tuple[str, str]]:
    """{normalized name: (version, path)} from the *.dist-info dirs on sys.path (no imports)."""
    found: Dict[str, Tuple[str, str]] = {}
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
