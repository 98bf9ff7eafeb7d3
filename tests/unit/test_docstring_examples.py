"""The runnable examples that open the pure modules' docstrings still run and print what they
say (STYLE.md: each module opens with a short runnable example)."""

from __future__ import annotations

import doctest
import importlib

import pytest

pytestmark = pytest.mark.unit

MODULES = [
    "trainfleet.units",
    "trainfleet.keyscan",
    "trainfleet.catalog",
    "trainfleet.catalog.ids",
    "trainfleet.remote.failures",
    "trainfleet.remote.run",
    "trainfleet.remote.lines",
    "trainfleet.remote.argv",
    "trainfleet.cluster",
    "trainfleet.cluster.dshostfile",
    "trainfleet.cluster.load",
    "trainfleet.cluster.model",
    "trainfleet.cluster.validate",
    "trainfleet.cluster.yaml_spec",
    "trainfleet.sandbox.build",
    "trainfleet.sandbox.daemons",
    "trainfleet.sandbox.state",
    "trainfleet.sandbox.hostile",
    "trainfleet.plan",
    "trainfleet.plan.activations",
    "trainfleet.plan.cpu_memory",
    "trainfleet.plan.estimators",
    "trainfleet.plan.ds_config",
    "trainfleet.plan.hardware",
    "trainfleet.plan.memory",
    "trainfleet.plan.model",
    "trainfleet.plan.search",
    "trainfleet.plan.speed",
    "trainfleet.plan.zero",
    "trainfleet.commtest.formulas",
    "trainfleet.doctor.facts",
    "trainfleet.doctor.facts.parse",
    "trainfleet.doctor.facts.sheet",
    "trainfleet.doctor.netsel",
    "trainfleet.heartbeat",
    "trainfleet.hf_names",
    "trainfleet.launch.backend",
    "trainfleet.launch.backends",
    "trainfleet.launch.backends.deepspeed",
    "trainfleet.launch.backends.over_ssh",
    "trainfleet.launch.backends.ssh",
    "trainfleet.launch.entry",
    "trainfleet.launch.environment",
    "trainfleet.train.preflight",
    "trainfleet.train.user_deepspeed",
    "trainfleet.launch.output",
    "trainfleet.launch.options",
    "trainfleet.launch.masking",
    "trainfleet.launch.sbatch",
    "trainfleet.launch.batch_job",
    "trainfleet.launch.follow_job",
    "trainfleet.untrusted",
    "trainfleet.privatefiles",
    "trainfleet.clusterfile",
    "trainfleet.setup.clusteryaml",
    "trainfleet.setup.pyenv.step",
    "trainfleet.setup.pyenv.wheels",
    "trainfleet.setup.steps",
    "trainfleet.node.pyenv",
    "trainfleet.setup.pyenv.dsops",
    "trainfleet.node.dsops",
    "trainfleet.launch.restarts",
    "trainfleet.launch.rootcause",
    "trainfleet.cluster.slurm",
    "trainfleet.nodeset",
    "trainfleet.node.gpus",
    "trainfleet.doctor.checks.gpus",
    "trainfleet.sandbox.fakegpu",
    "trainfleet.sandbox.slurm",
    "trainfleet.launch.result",
    "trainfleet.launch.runfacts",
    "trainfleet.launch.watchdogs",
    "trainfleet.status.hang",
    "trainfleet.node.answer",
    "trainfleet.localprocs",
    "trainfleet.node",
    "trainfleet.node.files",
    "trainfleet.node.isolated",
    "trainfleet.node.procs",
    "trainfleet.node.sshkeys",
    "trainfleet.node.system",
    "trainfleet.status",
    "trainfleet.status.human",
    "trainfleet.status.rules",
    "trainfleet.status.rundir",
    "trainfleet.status.view",
]


@pytest.mark.parametrize("name", MODULES)
def test_module_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, name
