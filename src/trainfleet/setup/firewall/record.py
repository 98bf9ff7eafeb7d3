"""What `setup firewall --apply` added, per node, and `--revert`, which removes exactly that.

    >>> default_state_file("/data/cluster.yaml")
    '/data/cluster.yaml.firewall.json'

The state file lists, per node, each rule that was added and the exact argv that removes it
(for nftables with its handle; with `sudo -n` where the login is not root). It is written
after every single rule, so a failure half way loses nothing; entries leave it only once their
rule is gone, and the file goes when it is empty. Where nft printed no handle as it added a
rule, --revert finds it by its comment and exact match in the chain; where it cannot tell, the
entry stays and the user is told to remove that rule by hand.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any, TypedDict

from trainfleet.cluster import Cluster
from trainfleet.errors import SetupError
from trainfleet.privatefiles import write_private
from trainfleet.remote import NodeResult, run_on_nodes
from trainfleet.setup.firewall.ruleset import TAG, nft_listed, revert_is_ours
from trainfleet.setup.result import SetupResult

TIMEOUT_S = 30


class _Entry(TypedDict):
    backend: str
    text: str
    """The command that added it, as shown."""
    revert: list[str]
    """The argv that removes it (`load_state` checks it is one `setup firewall` makes)."""


class RuleEntry(_Entry, total=False):
    """A rule `setup firewall --apply` added, as the state file lists it under its node."""

    peer: str


def default_state_file(cluster_in: str | None) -> str:
    if cluster_in:
        return f"{cluster_in}.firewall.json"
    return str(Path.home() / ".trainfleet" / "rules.json")


def load_state(path: str, *, must_exist: bool = False) -> dict[str, Any]:
    """The state file, checked: every entry's revert command must be one `setup firewall`
    makes (`revert_is_ours`), so that an edited file cannot make --revert run
    anything else. `must_exist`: a missing file is an error (--revert), not an empty state."""
    try:
        state = json.loads(Path(path).read_text())
    except FileNotFoundError:
        if must_exist:
            raise SetupError(
                f"{path}: no firewall state file, so nothing recorded to revert",
                "pass the --state FILE that --apply used (it names it when it adds a rule); "
                "without it, remove rules by hand: each carries the comment "
                f"`{TAG}`",
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
            if not ok or not revert_is_ours(item.get("backend"), item.get("revert")):
                raise SetupError(
                    f"{path}: entry {i + 1} of {host} is not a rule `setup firewall` added "
                    f"(revert {str(item.get('revert') if isinstance(item, dict) else item)[:120]})",
                    "nothing was run; restore the file --apply wrote, or remove that rule by hand",
                )
    return state


def save_state(path: str, state: dict[str, Any]) -> None:
    """Written whole (private, replaced in one step); gone once it records nothing. `setup
    hosts` keeps its state the same way."""
    if not any(state["nodes"].values()):
        Path(path).unlink(missing_ok=True)
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(f"{path}.tmp")
    tmp.unlink(missing_ok=True)  # one an older version left may have another mode
    write_private(tmp, json.dumps(state, indent=2) + "\n", exclusive=True)
    os.replace(tmp, path)


def run_in_turn(
    cluster: Cluster, argvs: dict[str, list[list[str]]]
) -> Iterator[tuple[int, list[NodeResult]]]:
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
_LISTED = re.compile(r"(.*?)\s*# handle (\d+)")
_NO_CHAIN = "Error: No such file or directory"
"""What `nft list chain` says of a chain that is not there (nor, then, any rule of it)."""


class Found(Enum):
    """Where a recorded nftables rule is, by `nft -a list chain` (`find_nft_rule`).

    HERE: in the chain under the handle found: removed by that handle. GONE: no rule in the
    chain can be it (removed by hand, or the handle now names someone else's rule): noted,
    and its entry leaves the state file. UNSURE: nft printed no handle when it was added and
    the chain holds no single rule that is exactly it, so it may still be there: its entry
    stays, and the user removes the rule by hand (a later --revert then finds it GONE).
    """

    HERE = "here"
    GONE = "gone"
    UNSURE = "unsure"


def _chain(revert: list[str]) -> list[str]:
    """family, table, chain of an nftables revert argv (`nft delete rule F T C handle N`)."""
    where = revert.index("delete")
    return revert[where + 2 : -2]


def find_nft_rule(listing: str, item: RuleEntry, claimed: set[str]) -> tuple[Found, str | None]:
    """Which rule in `listing` (`nft -a list chain` of the entry's chain) the state entry
    `item` added, and its handle. A recorded handle counts only while it still names a rule
    with our comment (handles are reused after a flush; 5 is not 52). Without one ("?": nft
    printed none), the rule with exactly the entry's match and comment, unless another entry
    holds its handle (`claimed`).

        >>> item = {"text": "nft insert rule inet filter input iifname eth0 ip saddr 10.0.0.11"
        ...         " meta l4proto tcp accept comment trainfleet",
        ...         "revert": ["nft", "delete", "rule", "inet", "filter", "input", "handle", "?"]}
        >>> listing = ('iifname "eth0" ip saddr 10.0.0.11 meta l4proto tcp accept '
        ...            'comment "trainfleet" # handle 7')
        >>> find_nft_rule(listing, item, set()), find_nft_rule(listing, item, {"7"})
        ((<Found.HERE: 'here'>, '7'), (<Found.UNSURE: 'unsure'>, None))
        >>> find_nft_rule("tcp dport 22 accept # handle 3", item, set())
        (<Found.GONE: 'gone'>, None)
    """
    rules = [m.groups() for line in listing.splitlines() if (m := _LISTED.fullmatch(line.strip()))]
    ours = f'comment "{TAG}"'
    recorded = item["revert"][-1]
    if recorded.isdigit():
        here = any(handle == recorded and ours in body for body, handle in rules)
        return (Found.HERE, recorded) if here else (Found.GONE, None)
    listed = nft_listed(item["text"], _chain(item["revert"]))
    if listed is None:
        return Found.UNSURE, None
    exact = [handle for body, handle in rules if body == listed and handle not in claimed]
    if len(exact) == 1:
        return Found.HERE, exact[0]
    peer = listed.split()[4]
    # Another rule of ours from that peer (or one nft prints otherwise): it may be this one.
    near = any(ours in body and f" {peer} " in f" {body} " for body, _ in rules)
    return (Found.UNSURE, None) if exact or near else (Found.GONE, None)


def _by_hand(item: RuleEntry) -> str:
    family, table, chain = _chain(item["revert"])
    return (
        f"`{item['text']}` may still be there: nft printed no handle when it was added, and "
        "the chain holds no single rule that is exactly it; remove it by hand (find its handle "
        f"with `nft -a list chain {family} {table} {chain}`, then `nft delete rule {family} "
        f"{table} {chain} handle N`), and --revert then drops its entry"
    )


def _locate(
    cluster: Cluster, host: str, item: RuleEntry, claimed: set[tuple[str, ...]]
) -> tuple[Found, str]:
    """`find_nft_rule` on the node's listing of the entry's chain: (where, handle or why).
    `claimed`: (family, table, chain, handle) of the rules other entries on the node hold."""
    revert, chain = item["revert"], _chain(item["revert"])
    listing = [*revert[: revert.index("delete")], "-a", "list", "chain", *chain]
    [out] = run_on_nodes([cluster.node(host)], listing, timeout=TIMEOUT_S)
    if not out.ok:
        if _NO_CHAIN in out.stderr:  # no chain, no rule in it
            return Found.GONE, ""
        return Found.UNSURE, f"listing its chain to find `{item['text']}`: {out.reason()}"
    taken = {c[-1] for c in claimed if list(c[:-1]) == chain}
    found, handle = find_nft_rule(out.stdout, item, taken)
    return found, handle or (_by_hand(item) if found is Found.UNSURE else "")


def revert_rules(cluster: Cluster, state_file: str, result: SetupResult) -> None:
    state = load_state(state_file, must_exist=True)
    entries = {h: list(reversed(e)) for h, e in state["nodes"].items() if e}
    unknown = [h for h in entries if h not in {n.host for n in cluster.nodes}]
    if unknown:
        raise SetupError(
            f"{state_file} lists {', '.join(unknown)}, not in this cluster",
            "pass the same cluster as with --apply",
        )
    argvs: dict[str, list[list[str]]] = {}
    runs: dict[str, list[tuple[RuleEntry, list[str]]]] = {}
    failed: list[str] = []
    for host, items in entries.items():
        nft = [item["revert"] for item in items if item["backend"] == "nftables"]
        claimed = {(*_chain(r), r[-1]) for r in nft if r[-1].isdigit()}
        runs[host] = []
        for item in items:
            revert = item["revert"]
            if item["backend"] == "nftables":
                found, said = _locate(cluster, host, item, claimed)
                if found is Found.GONE:
                    result.note(f"{host}: already gone: {item['text']}")
                    state["nodes"][host].remove(item)
                    continue
                if found is Found.UNSURE:  # its entry stays: the rule may be there
                    failed.append(f"{host}: {said}")
                    continue
                claimed.add((*_chain(revert), said))
                revert = [*revert[:-1], said]
            runs[host].append((item, revert))
        argvs[host] = [revert for _, revert in runs[host]]
    for i, results in run_in_turn(cluster, argvs):
        for r in results:
            item = runs[r.node][i][0]
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
