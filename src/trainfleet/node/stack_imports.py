"""Imports the training stack and prints what it reported, as one JSON line. Run by the probe
in a fresh interpreter (`software.imports`), so that a crash or a hang in an import is the
probe's finding, not its end.
"""

import json


def report():
    out = {}
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
    for name in ("deepspeed", "transformers", "accelerate"):
        try:
            module = __import__(name)
            out[name] = getattr(module, "__version__", "?")
        except Exception as exc:
            out[name + "_error"] = "%s: %s" % (type(exc).__name__, exc)
    print(json.dumps(out))
