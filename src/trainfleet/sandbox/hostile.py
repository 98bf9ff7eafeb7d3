"""The sandbox's hostile nodes: what root on a node (or whoever writes its shared home) can make
it say and leave in its files. They test trainfleet's trust rules (docs/security.md): a node's
words are data, never names its key is trusted under, never code, never terminal commands.

    >>> claimed_name(["gpu-node-1", "gpu-node-2", "gpu-node-3"], 3)
    'gpu-node-1'
    >>> "\\x1b" in TORCH_ERROR
    True

- `hostname-impostor`: the node's `hostname` answers another node's name;
- `ssh-hostkey-type-changed`: its sshd offers an ECDSA key only, where known_hosts holds an
  Ed25519 one for it (a man in the middle that offers another key type);
- `planted-modules`: the directory its ssh sessions start in (its home) holds modules named
  like the standard library's and pip's, each leaving a mark in MARKS when imported;
- `torch-import-error`: `import torch` fails there with terminal escape sequences in its error.
"""

from __future__ import annotations

from pathlib import Path

PLANTED = (
    "base64",
    "json",
    "socket",
    "subprocess",
    "tempfile",
    "shutil",
    "signal",
    "threading",
    "runpy",
    "pip",
    "venv",
    "compileall",
    "torch",
    "trainfleet",
)
"""What the loader, the node programs, torchrun's agent and pip import first."""

MARKS = "planted-ran"
"""The node directory's subdirectory where a planted module that ran leaves its name."""

TORCH_ERROR = (
    "\x1b]0;owned by gpu-node\x07\x1b[2J\x1b[H\x1b[32mall nodes healthy\x1b[0m"
    " (a real message would name a missing libcudart.so.12)"
)
"""What `import torch` raises on a `torch-import-error` node: set the terminal's title, clear
the screen, print a reassuring line in green."""


def claimed_name(hostnames: list[str], index: int) -> str:
    """The name a `hostname-impostor` node gives: the first other node's (1-based `index`)."""
    return next(name for k, name in enumerate(hostnames, 1) if k != index)


def plant_modules(directory: Path, node_dir: Path) -> Path:
    """PLANTED into `directory`; returns the directory of their marks (empty: none ran)."""
    marks = node_dir / MARKS
    marks.mkdir(exist_ok=True)
    marks.chmod(0o777)  # the password sandbox's user leaves its marks there too
    for name in PLANTED:
        mark = marks / name
        (directory / f"{name}.py").write_text(f"open({str(mark)!r}, 'w').close()\n")
    return marks


def broken_torch(node_dir: Path) -> Path:
    """A directory for the front of PYTHONPATH whose `torch` fails to import with
    TORCH_ERROR."""
    root = node_dir / "broken-torch"
    (root / "torch").mkdir(parents=True, exist_ok=True)
    (root / "torch" / "__init__.py").write_text(f"raise ImportError({TORCH_ERROR!r})\n")
    return root
