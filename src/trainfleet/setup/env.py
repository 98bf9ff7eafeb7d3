"""`trainfleet setup env`: what each node needs set, recorded per node in cluster.yaml.

    >>> from trainfleet.doctor.facts import NodeFacts, Python, Route
    >>> facts = NodeFacts(python=Python(executable="/opt/env/bin/python"), tools={"ninja": None},
    ...                   route_to_master=Route(dev="ens14f1"), interfaces=())
    >>> login = {"path": "/opt/env/bin:/usr/bin", "tools": {"ninja": "/opt/env/bin/ninja"}}
    >>> fields, notes = plan_node_env(facts, login, interface=None, env={}, master_addr=None)
    >>> fields["interface"], fields["env"]
    ('ens14f1', {'PATH': '/opt/env/bin:/usr/bin'})

Per node: the interface that routes to the master (launch sets NCCL_SOCKET_IFNAME and
GLOO_SOCKET_IFNAME from it), the python doctor ran there, CUDA_HOME where it can be found, and
PATH where tools such as ninja, deepspeed or nvcc are on the node's login-shell PATH but not on
the PATH that non-interactive ssh gets (seed 004: conda activated in ~/.bashrc only).
Facts come from doctor's probe and from one login shell per node (`bash -lic`).
"""

from __future__ import annotations

import os
from typing import TypedDict

from trainfleet.catalog import FindingId
from trainfleet.cluster import Cluster, parse_cluster_yaml
from trainfleet.clusterfile import NodeEdit
from trainfleet.doctor import netsel
from trainfleet.doctor.facts import NodeFacts
from trainfleet.errors import SetupError
from trainfleet.nodeset import fold_names
from trainfleet.remote import run_on_nodes
from trainfleet.setup import clusteryaml, verify
from trainfleet.setup.result import SetupResult, fold_notes

TOOLS = ("python3", "torchrun", "deepspeed", "ninja", "nvcc")
_LOGIN_SCRIPT = """\
printf 'TRAINFLEET_PATH=%s\\n' "$PATH"
printf 'TRAINFLEET_CUDA_HOME=%s\\n' "${CUDA_HOME:-}"
for t in python3 torchrun deepspeed ninja nvcc; do
  printf 'TRAINFLEET_TOOL=%s=%s\\n' "$t" "$(command -v "$t" 2>/dev/null)"
done
if [ -d /usr/local/cuda ]; then printf 'TRAINFLEET_CUDA_DIR=/usr/local/cuda\\n'; fi
for t in torchrun deepspeed ninja; do
  if [ -n "$1" ] && [ -x "$1/$t" ]; then printf 'TRAINFLEET_BESIDE=%s=%s\\n' "$t" "$1/$t"; fi
done
"""


def login_argv(python_dir: str) -> list[str]:
    """What a person gets after logging in: a login shell that is also interactive reads
    /etc/profile, ~/.profile and ~/.bashrc past its "not interactive: return" guard. It also
    looks beside the node's python (`python_dir`), where an environment's tools live."""
    start = (
        'if command -v bash >/dev/null; then exec bash -lic "$1" sh "$2"; fi; '
        'exec sh -lc "$1" sh "$2"'
    )
    return ["sh", "-c", start, "sh", _LOGIN_SCRIPT, python_dir]


class Login(TypedDict, total=False):
    """What `_LOGIN_SCRIPT` printed (`parse_login`): each key only where it said it."""

    path: str
    """The login shell's PATH."""
    cuda_home: str
    cuda_dir: str
    """/usr/local/cuda, where there is one."""
    tools: dict[str, str | None]
    """{tool: its path on the login PATH, None: not there}."""
    beside_python: dict[str, str | None]
    """{tool: its path beside the node's python}."""


def parse_login(stdout: str) -> Login:
    """The login shell's PATH, CUDA_HOME and tools from its marked lines (other output of a
    chatty ~/.bashrc is ignored)."""
    login: Login = {"tools": {}}
    for line in stdout.splitlines():
        key, _, value = line.partition("=")
        if key == "TRAINFLEET_PATH":
            login["path"] = value
        elif key == "TRAINFLEET_CUDA_HOME" and value:
            login["cuda_home"] = value
        elif key == "TRAINFLEET_CUDA_DIR":
            login["cuda_dir"] = value
        elif key in ("TRAINFLEET_TOOL", "TRAINFLEET_BESIDE"):
            tool, _, path = value.partition("=")
            if key == "TRAINFLEET_TOOL":
                login.setdefault("tools", {})[tool] = path or None
            else:
                login.setdefault("beside_python", {})[tool] = path or None
    return login


def plan_node_env(
    facts: NodeFacts | None,
    login: Login,
    *,
    interface: str | None,
    env: dict[str, str],
    master_addr: str | None,
) -> tuple[NodeEdit, list[str]]:
    """(cluster.yaml fields for the node, notes). `facts`: doctor's facts (None when its
    python could not run); `interface`/`env`: what cluster.yaml says for it already."""
    fields: NodeEdit = {}
    notes: list[str] = []
    tools = facts.tools if facts else {}
    found = login.get("tools") or {}
    if facts:
        chosen = netsel.chosen_interface(facts, master_addr)
        if chosen and chosen != interface:
            fields["interface"] = chosen
        if facts.python.executable:
            fields["python"] = facts.python.executable
    elif login_python := found.get("python3"):
        fields["python"] = login_python
        notes.append(
            f"the configured python does not run there; {login_python} from the "
            "login shell recorded (check that it has the training environment)"
        )
    # Where torch's cpp_extension would look (CUDA_HOME, else nvcc's prefix), on GPU nodes
    # only: DeepSpeed builds its ops there (cuda-home-missing).
    nvcc = found.get("nvcc") or tools.get("nvcc")
    cuda_home = (
        (facts.cuda_home if facts else None)
        or login.get("cuda_home")
        or (os.path.dirname(os.path.dirname(nvcc)) if nvcc else None)
        or login.get("cuda_dir")
    )
    gpus = facts.gpus.devices if facts and facts.gpus else ()
    updates: dict[str, str] = {}
    if gpus and cuda_home and env.get("CUDA_HOME") != cuda_home:
        updates["CUDA_HOME"] = cuda_home
    # Tools the non-interactive PATH lacks: beside the python (an environment not activated
    # over ssh, seed 004), else on the login shell's PATH (activated in ~/.bashrc).
    lacking = [t for t in TOOLS if facts and t in tools and not tools[t]]
    beside = [t for t in lacking if (login.get("beside_python") or {}).get(t)]
    on_login = [t for t in lacking if found.get(t)]
    path = None
    if beside and facts:  # (without facts no tool is lacking)
        python_dir = os.path.dirname(facts.python.executable or "")
        path = f"{python_dir}:{facts.path}".rstrip(":")
        notes.append(f"{', '.join(beside)} beside its python, not on the ssh PATH: PATH recorded")
    elif on_login and login.get("path"):
        path = login["path"]
        notes.append(f"{', '.join(on_login)} only on the login PATH: that PATH recorded")
    if path and env.get("PATH") != path:
        updates["PATH"] = path
    if updates:
        fields["env"] = updates
    return fields, notes


def setup_env(
    cluster: Cluster,
    *,
    cluster_in: str | None = None,
    cluster_out: str | None = None,
    dry_run: bool = False,
) -> SetupResult:
    """Record each node's interface, python, CUDA_HOME and PATH in cluster.yaml."""
    result = SetupResult(step="env", dry_run=dry_run)
    survey = verify.survey(cluster, verify.ENV)
    argv = {
        n.host: login_argv(os.path.dirname(survey.facts[n.host].python.executable or ""))
        if n.host in survey.facts
        else login_argv("")
        for n in cluster.nodes
    }
    logins = {r.node: r for r in run_on_nodes(cluster.nodes, argv, timeout=30)}
    down = [h for h, r in logins.items() if r.failure.is_connection_failure]
    if down:
        raise SetupError(
            f"cannot reach {fold_names(down)}: {logins[down[0]].reason()}",
            "fix ssh first (`trainfleet setup ssh`)",
        )
    fields: dict[str, NodeEdit] = {}
    node_notes: list[str] = []
    for node in cluster.nodes:
        node_fields, notes = plan_node_env(
            survey.facts.get(node.host),
            parse_login(logins[node.host].stdout),
            interface=node.interface,
            env=dict(node.env),
            master_addr=survey.master_addr,
        )
        fields[node.host] = node_fields
        node_notes += [f"{node.host}: {note}" for note in notes]
    result.notes += fold_notes(node_notes)
    out = cluster_out or cluster_in or "cluster.yaml"
    text = clusteryaml.record(cluster, fields, cluster_in=cluster_in, out=out,
                              written_by="trainfleet setup env", result=result)  # fmt: skip
    checked = parse_cluster_yaml(text, out) if not dry_run else cluster
    result.checks = [verify.ENV.label]
    result.findings = verify.findings(verify.survey(checked, verify.ENV), verify.ENV)
    with_path = {n.host for n in checked.nodes if "PATH" in n.env}
    if any(
        f.id is FindingId.REMOTE_ENV_DIFFERS and with_path & set(f.nodes) for f in result.findings
    ):
        result.note(
            "doctor checks the raw non-interactive PATH; `trainfleet launch` sets the "
            "PATH recorded in cluster.yaml on each node"
        )
    return result
