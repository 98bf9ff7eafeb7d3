"""The `ssh` backend (the default): torchrun on every node, each started by trainfleet's
bootstrap over one ssh per node. The plan is `plan.py`'s; this module runs it.

    >>> BACKEND.name
    'ssh'

Each node's job (environment and secrets included) travels on the bootstrap's stdin, never in
an argv that `ps` shows, never in a file; that stdin then stays open as the node's lifeline
(`bootstrap.py`): closing it, or the launcher's keepalives stopping, ends every process of the
job on that node. Nothing is left on a node to clean up afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from trainfleet import node as node_programs
from trainfleet.cluster import Cluster
from trainfleet.launch.backend import Channel
from trainfleet.launch.plan import (
    Backend,
    LaunchFacts,
    LaunchOptions,
    LaunchPlan,
    plan_launch,
    render_plan,
)
from trainfleet.launch.supervisor import LIFELINE_S
from trainfleet.node import bootstrap
from trainfleet.remote import node_argv


class SshBackend:
    name = Backend.SSH

    def plan(
        self,
        cluster: Cluster,
        facts: Mapping[str, LaunchFacts],
        options: LaunchOptions,
        *,
        master_addr: str,
        launch_env: Mapping[str, str],
        launch_cwd: str,
        run_dir: Path,
    ) -> LaunchPlan:
        return plan_launch(
            cluster,
            facts,
            options,
            master_addr=master_addr,
            launch_env=launch_env,
            launch_cwd=launch_cwd,
        )

    def render(self, plan: LaunchPlan) -> str:
        return render_plan(plan)

    def node_envs(self, plan: LaunchPlan) -> dict[str, Mapping[str, str]]:
        return {node.host: node.env for node in plan.nodes}

    def start(self, plan: LaunchPlan, cluster: Cluster, run_dir: Path) -> list[Channel]:
        """One bootstrap per node."""
        shim_source = node_programs.source("shim")
        channels = []
        for node_plan in plan.nodes:
            node = cluster.node(node_plan.host)
            job: bootstrap.BootstrapJob = {
                "run_id": plan.options.run_id,
                "cwd": node_plan.cwd,
                "env": node_plan.env,
                "argv": node_plan.argv,
                "shim": shim_source,
                "grace": plan.options.grace,
                "lifeline": LIFELINE_S,
            }
            argv = node_argv(node, node_programs.argv(node.python, bootstrap.main), multiplex=False)
            payload = node_programs.line(bootstrap.main, job)
            channels.append(Channel(name=node.host, argv=argv, payload=payload))
        return channels

    def stop(self, plan: LaunchPlan, cluster: Cluster) -> None:
        """Nothing: each bootstrap ends its node's job when its stdin closes."""


BACKEND = SshBackend()
