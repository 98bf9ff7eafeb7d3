"""Imports torch and returns what it reported: doctor's stack phase (`collective`), in the
process that then joins the all_reduce, so a node imports torch once. The other packages'
versions come from their metadata (`software.package_versions`): no import needed.
"""

from typing import Any, Dict


def report() -> Dict[str, Any]:
    """{torch, torch_cuda, nccl, torch_distributed, gloo} or {torch_error}."""
    out: Dict[str, Any] = {}
    try:
        import torch

        out["torch"] = torch.__version__
        out["torch_cuda"] = torch.version.cuda
        try:
            nccl = torch.cuda.nccl.version() if torch.version.cuda else None
            out["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
        except Exception as exc:
            out["nccl_error"] = repr(exc)
        out["torch_distributed"] = torch.distributed.is_available()
        out["gloo"] = torch.distributed.is_available() and torch.distributed.is_gloo_available()
    except Exception as exc:
        out["torch_error"] = "%s: %s" % (type(exc).__name__, exc)
    return out
