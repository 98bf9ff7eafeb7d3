"""Doctor's Slurm checks on recorded node answers, the nodes made steps of a Slurm job. The
GPUs are the recorded H200's (test_doctor_checks_gpus.py): no GPU exists on the machines
these tests run on. The same findings on a real Slurm: tests/cluster/test_slurm_sandbox.py."""

from __future__ import annotations

import dataclasses

import pytest
from doctor_fixtures import make_survey, reparsed, sheets_of
from test_doctor_checks_gpus import h200_node

from trainfleet.cluster.model import SlurmStep
from trainfleet.doctor.checks import resources, slurm
from trainfleet.doctor.findings import Severity

pytestmark = pytest.mark.unit

N1, N2 = "gpu-node-1", "gpu-node-2"


def _in_job(survey, **env):
    nodes = tuple(dataclasses.replace(n, slurm=SlurmStep(job="42")) for n in survey.cluster.nodes)
    cluster = dataclasses.replace(survey.cluster, nodes=nodes)
    return dataclasses.replace(survey, cluster=cluster, launch_env={"SLURM_JOB_ID": "42", **env})


def _gpus(survey, counts: dict[str, int]):
    sheets = sheets_of(survey)
    for host, count in counts.items():
        sheets[host]["gpus"] = h200_node(count)
    return reparsed(survey, sheets)


def test_a_node_showing_fewer_gpus_than_the_job_has_there_is_an_error_naming_exclude(tmp_path):
    survey = _in_job(_gpus(make_survey(tmp_path, nodes=(N1, N2), slots={N1: 8, N2: 8}),
                           {N1: 8, N2: 6}))  # fmt: skip
    (finding,) = slurm.check_gpus(survey)
    assert (finding.id, finding.severity, finding.nodes) == (
        "slurm-gpus-differ", Severity.ERROR, (N2,)
    )  # fmt: skip
    assert "8 GPU slot(s) on gpu-node-2" in finding.evidence[0] and "sees 6" in finding.evidence[0]
    assert "--gpus-per-node=6" in finding.fix and "--exclude=gpu-node-2" in finding.fix
    assert resources.check_gpus(survey) == []  # not also a hostfile's slots=8 to fix


def test_a_node_showing_more_gpus_than_the_job_has_does_not_confine_jobs(tmp_path):
    survey = _in_job(_gpus(make_survey(tmp_path, nodes=(N1, N2), slots={N1: 4, N2: 4}),
                           {N1: 4, N2: 8}))  # fmt: skip
    (finding,) = slurm.check_gpus(survey)
    assert finding.severity is Severity.WARNING and "ConstrainDevices" in finding.fix


def test_outside_a_job_the_count_is_the_hostfile_s_to_fix(tmp_path):
    survey = _gpus(make_survey(tmp_path, nodes=(N1, N2), slots={N1: 8, N2: 8}), {N1: 8, N2: 6})
    assert slurm.check_gpus(survey) == []
    assert [f.id for f in resources.check_gpus(survey)] == ["gpu-count-mismatch"]


def test_several_tasks_of_one_step_and_an_environment_not_exported(tmp_path):
    env = {"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "16", "SLURM_PROCID": "9",
           "SLURM_EXPORT_ENV": "NONE"}  # fmt: skip
    survey = _in_job(make_survey(tmp_path, nodes=(N1, N2)), **env)
    (layout,) = slurm.check_task_layout(survey)
    assert "task 9 of the 16 of step 42.0" in layout.evidence[0]
    (export,) = slurm.check_export(survey)
    assert export.severity is Severity.WARNING
    one_task = _in_job(make_survey(tmp_path, nodes=(N1,)), SLURM_STEP_ID="0",
                       SLURM_STEP_NUM_TASKS="1", SLURM_EXPORT_ENV="ALL,HF_HOME=/d")  # fmt: skip
    assert slurm.check_task_layout(one_task) == [] and slurm.check_export(one_task) == []
