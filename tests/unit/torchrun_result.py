"""Run a script of tests/unit/scripts under real torchrun on this machine (local ranks,
127.0.0.1, a free port) and return what rank 0 printed on its `RESULT <json>` line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).parent / "scripts"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_result(
    script: str, args: list[str], *, ranks: int, env: dict[str, str], timeout: int = 600
) -> Any:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={ranks}",
            "--master-addr=127.0.0.1",
            f"--master-port={free_port()}",
            str(SCRIPTS / script),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[0][len("RESULT ") :])
