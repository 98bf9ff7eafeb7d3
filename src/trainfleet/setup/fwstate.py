"""What `setup firewall --apply` added, per node, and `--revert`, which removes exactly that.

    >>> default_state_file("/data/cluster.yaml")
    '/data/cluster.yaml.firewall.json'

The state file lists, per node, each rule that was added and the exact argv that removes it
(for nftables with its handle; with `sudo -n` where the login is not root). It is written
after every single rule, so a failure half way loses nothing; entries leave it only once their
rule is gone, and the file goes when it is empty.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from trainfleet.cluster import Cluster
from trainfleet.errors import SetupError
from trainfleet.files import write_private
from trainfleet.remote import run_on_nodes
from trainfleet.setup import firewall
from trainfleet.setup.result import SetupResult

TIMEOUT_S = 30


def default_state_file(cluster_in: str | None) -> str:
    if cluster_in:
        return f"{cluster_in}.firewall.json"
    return str(Path.home() / ".trainfleet" / "firewall.json")


def load_state(path: str, *, must_exist: bool = False) -> dict:
    """The state file, checked: every entry's revert command must be one `setup firewall`
    makes (`firewall.revert_is_ours`), so that an edited file cannot make --revert run
    anything else. `must_exist`: a missing file is an error (--revert), not an empty state."""
    try:
        state = json.loads(Path(path).read_text())
    except FileNotFoundError:
        if must_exist:
            raise SetupError(
                f"{path}: no firewall state file, so nothing recorded to revert",
                "pass the --state FILE that --apply used (it names it when it adds a rule); "
                "without it, remove rules by hand: each carries the comment "
                f"`{firewall.TAG}`",
            ) from None
        return {"version": 1, "nodes": {}}
    except ValueError as exc:
        raise SetupError(f"{path} is not a firewall state file ({exc})", "check the path") from None
    nodes = state.get("nodes") if isinstance(state, dict) else None
    if not isinstance(nodes, dict) or not all(isinstance(v, list) for v in nodes.values()):
        raise SetupError(
            f"{path} is not a firewall state file (no `nodes` mapping of lists)", "check the path"
        )
    for host, items in nodes.items():
        for i, item in enumerate(items):
            ok = isinstance(item, dict) and isinstance(item.get("text"), str)
            if not ok or not firewall.revert_is_ours(item.get("backend"), item.get("revert")):
                raise SetupError(
                    f"{path}: entry {i + 1} of {host} is not a rule `setup firewall` added "
                    f"(revert {str(item.get('revert') if isinstance(item, dict) else item)[:120]})",
                    "nothing was run; restore the file --apply wrote, or remove that rule by hand",
                )
    return state


def save_state(path: str, state: dict) -> None:
    if not any(state["nodes"].values()):
        Path(path).unlink(missing_ok=True)
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(f"{path}.tmp")
    tmp.unlink(missing_ok=True)  # one an older version left may have another mode
    write_private(tmp, json.dumps(state, indent=2) + "\n", exclusive=True)
    os.replace(tmp, path)


def run_in_turn(cluster: Cluster, argvs: dict[str, list[list[str]]]):
    """Each node's argvs one after another, nodes at once; yields (round, results)."""
    for i in range(max((len(a) for a in argvs.values()), default=0)):
        hosts = [h for h, a in argvs.items() if i < len(a)]
        yield (
            i,
            run_on_nodes(
                [cluster.node(h) for h in hosts], {h: argvs[h][i] for h in hosts}, timeout=TIMEOUT_S
            ),
        )


_GONE = ("Bad rule", "does a matching rule exist", "non-existent rule", "NOT_ENABLED")


def _nft_still_ours(cluster: Cluster, host: str, revert: list[str]) -> bool:
    """The handle still names a rule of ours (handles are reused after a flush)."""
    where = revert.index("delete")
    listing = [*revert[:where], "-a", "list", "chain", *revert[where + 2 : -2]]
    [out] = run_on_nodes([cluster.node(host)], listing, timeout=TIMEOUT_S)
    handle = re.compile(rf"# handle {re.escape(revert[-1])}$")  # 5 is not 52
    return any(
        handle.search(line.rstrip()) and f'comment "{firewall.TAG}"' in line
        for line in out.stdout.splitlines()
    )


def revert_rules(cluster: Cluster, state_file: str, result: SetupResult) -> None:
    state = load_state(state_file, must_exist=True)
    entries = {h: list(reversed(e)) for h, e in state["nodes"].items() if e}
    unknown = [h for h in entries if h not in {n.host for n in cluster.nodes}]
    if unknown:
        raise SetupError(
            f"{state_file} lists {', '.join(unknown)}, not in this cluster",
            "pass the same cluster as with --apply",
        )
    argvs = {}
    for host, items in entries.items():
        keep = []
        for item in items:
            if item["backend"] == "nftables" and not _nft_still_ours(cluster, host, item["revert"]):
                result.note(f"{host}: already gone: {item['text']}")
                state["nodes"][host].remove(item)
                continue
            keep.append(item)
        entries[host] = keep
        argvs[host] = [item["revert"] for item in keep]
    failed = []
    for i, results in run_in_turn(cluster, argvs):
        for r in results:
            item = entries[r.node][i]
            gone = not r.ok and any(text in r.stdout + r.stderr for text in _GONE)
            if r.ok or gone:
                state["nodes"][r.node].remove(item)
                save_state(state_file, state)
                if gone:
                    result.note(f"{r.node}: already gone: {item['text']}")
                else:
                    result.add(r.node, f"removed ({item['backend']}): {item['text']}")
            else:
                failed.append(f"{r.node}: {r.reason()}")
    save_state(state_file, state)
    if failed:
        raise SetupError("; ".join(failed), f"the rules not removed stay in {state_file}")
