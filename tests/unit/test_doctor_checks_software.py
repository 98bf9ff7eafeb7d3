"""Doctor software checks on recorded fact sheets: versions, torch, tools, PATH, code, paths."""

from __future__ import annotations

import pytest
from doctor_fixtures import expect_one, make_survey, reparsed, sheets_of, stub_which, with_id

from trainfleet.doctor.checks import software
from trainfleet.doctor.findings import Severity
from trainfleet.remote import Failure, NodeResult

pytestmark = pytest.mark.unit

N1, N2, N3 = "gpu-node-1", "gpu-node-2", "gpu-node-3"
PYTHON = "/work/main/.venv/bin/python"  # as recorded in the fixture's fact sheets


@pytest.fixture(autouse=True)
def _launch_machine_tools(monkeypatch):
    stub_which(monkeypatch, present=("pdsh",))


@pytest.fixture
def survey(tmp_path):
    return make_survey(tmp_path)


def _set_version(facts: dict, name: str, version: str | None) -> None:
    facts["packages"][name] = version
    facts["imports"].pop(f"{name}_error", None)
    facts["imports"][name] = version


# ----------------------------------------------------------------------------- versions


def test_torch_version_differs_on_one_node(survey):
    sheets = sheets_of(survey)
    _set_version(sheets[N3], "torch", "2.12.0+cpu")
    survey = reparsed(survey, sheets)
    expect_one(
        software.check_versions(survey),
        "version-mismatch",
        Severity.ERROR,
        (N3,),
        evidence=["torch 2.12.0+cpu on gpu-node-3", "torch 2.13.0+cpu on gpu-node-[1-2]"],
        fix=["torch"],
    )


def test_transformers_version_differs_is_a_warning(survey):
    sheets = sheets_of(survey)
    for host, version in ((N1, "4.44.0"), (N2, "4.40.1"), (N3, "4.44.0")):
        _set_version(sheets[host], "transformers", version)
    survey = reparsed(survey, sheets)
    expect_one(
        software.check_versions(survey),
        "version-mismatch",
        Severity.WARNING,
        (N2,),
        evidence=["transformers 4.40.1 on gpu-node-2"],
        fix=["transformers"],
    )


def test_python_minor_version_matters_patch_does_not(survey):
    sheets = sheets_of(survey)
    sheets[N2]["python"]["version"] = "3.11.9"
    assert software.check_versions(reparsed(survey, sheets)) == []
    sheets[N1]["python"]["version"] = "3.10.12"
    expect_one(
        software.check_versions(reparsed(survey, sheets)), "version-mismatch", Severity.ERROR, (N1,)
    )


def test_imported_version_wins_over_package_metadata(survey):
    sheets = sheets_of(survey)
    sheets[N2]["packages"]["torch"] = "2.1.0"  # a stale dist-info; the import says 2.13
    survey = reparsed(survey, sheets)
    assert software.check_versions(survey) == []


# ----------------------------------------------------------------------------- torch


def test_torch_missing_on_one_node(survey):
    sheets = sheets_of(survey)
    facts = sheets[N2]
    facts["packages"]["torch"] = None
    facts.pop("imports", None)  # no torch: the stack phase does not run there
    survey = reparsed(survey, sheets)
    expect_one(
        software.check_torch(survey),
        "torch-missing",
        Severity.ERROR,
        (N2,),
        evidence=["other nodes have it", PYTHON],
        fix=[PYTHON, N2],
    )


@pytest.mark.parametrize("key", ["torch_error", "import_error"])
def test_torch_import_error(survey, key):
    sheets = sheets_of(survey)
    error = "ImportError: libcudart.so.12: cannot open shared object file"
    sheets[N3]["imports"] = {key: error}
    survey = reparsed(survey, sheets)
    expect_one(
        software.check_torch(survey),
        "torch-missing",
        Severity.ERROR,
        (N3,),
        evidence=[error],
        fix=[PYTHON, N3],
    )


def test_torch_missing_everywhere_is_a_warning(survey):
    sheets = sheets_of(survey)
    for facts in sheets.values():
        facts["packages"]["torch"] = None
        facts.pop("imports", None)  # no torch: the stack phase does not run there
    survey = reparsed(survey, sheets)
    findings = software.check_torch(survey)
    expect_one(findings, "torch-missing", Severity.WARNING, (N1, N2, N3), nodes_in_evidence=False)
    assert all(f.severity is Severity.WARNING for f in findings)


# ----------------------------------------------------------------------------- tools, PATH


def test_ninja_missing_where_deepspeed_is_installed(survey):
    sheets = sheets_of(survey)
    for facts in sheets.values():
        _set_version(facts, "deepspeed", "0.16.2")
    sheets[N2]["tools"]["ninja"] = None
    survey = reparsed(survey, sheets)
    expect_one(
        software.check_tools(survey),
        "ninja-missing",
        Severity.WARNING,
        (N2,),
        evidence=["Ninja is required"],
        fix=[f"{PYTHON} -m pip install ninja", N2],
    )


def test_ninja_not_needed_without_deepspeed(survey):
    sheets = sheets_of(survey)
    for facts in sheets.values():
        facts["tools"]["ninja"] = None
    survey = reparsed(survey, sheets)
    assert with_id(software.check_tools(survey), "ninja-missing") == []


def test_tool_on_other_nodes_but_not_on_this_ones_path(survey):
    sheets = sheets_of(survey)
    sheets[N2]["tools"]["nvcc"] = None
    survey = reparsed(survey, sheets)
    expect_one(
        software.check_tools(survey),
        "remote-env-differs",
        Severity.WARNING,
        (N2,),
        evidence=["`nvcc`", "gpu-node-[1,3]"],
        fix=["~/.bashrc"],
    )


def test_tool_only_on_the_launch_machine(survey, monkeypatch):
    stub_which(monkeypatch, present=("pdsh", "torchrun"))
    expect_one(
        software.check_tools(survey),
        "remote-env-differs",
        Severity.WARNING,
        (N1, N2, N3),
        evidence=["`torchrun`", "this machine"],
        nodes_in_evidence=False,
    )


def test_path_lacking_directories_the_others_have(survey):
    sheets = sheets_of(survey)
    path = sheets[N3]["path"].split(":")
    sheets[N3]["path"] = ":".join(d for d in path if "pyenv" not in d)
    survey = reparsed(survey, sheets)
    expect_one(
        software.check_tools(survey),
        "remote-env-differs",
        Severity.WARNING,
        (N3,),
        evidence=["/root/.pyenv/shims", "/root/.pyenv/bin"],
    )


def test_tools_silent_on_the_recording(survey):
    assert software.check_tools(survey) == []


# ----------------------------------------------------------------------------- paths, code


def _failed(node: str, returncode: int, stderr: str) -> NodeResult:
    return NodeResult(
        node=node,
        returncode=returncode,
        stdout="",
        stderr=stderr,
        duration_s=0.2,
        failure=Failure.COMMAND_FAILED,
    )


@pytest.mark.parametrize(
    ("returncode", "stderr"),
    [
        (127, f"bash: line 1: {PYTHON}: No such file or directory"),
        (1, "bash: line 1: cd: /data/run: No such file or directory"),
    ],
)
def test_python_or_directory_missing_on_a_node(tmp_path, returncode, stderr):
    survey = make_survey(tmp_path, failed={N3: _failed(N3, returncode, stderr)})
    configured = survey.cluster.node(N3).python  # the cluster's python for that node
    expect_one(
        software.check_paths(survey),
        "remote-path-missing",
        Severity.ERROR,
        (N3,),
        evidence=[configured, "No such file or directory"],
        fix=[configured, N3],
    )


def test_a_probe_that_crashed_is_not_a_missing_path(tmp_path):
    failed = {N3: _failed(N3, 1, "Traceback ...\nKeyError: 'x'")}
    assert software.check_paths(make_survey(tmp_path, failed=failed)) == []


def test_workdir_missing_on_a_node(survey):
    sheets = sheets_of(survey)
    sheets[N2]["workdir"] = {"path": "/data/run", "exists": False, "disk": {"error": "x"}}
    survey = reparsed(survey, sheets)
    expect_one(
        software.check_paths(survey),
        "remote-path-missing",
        Severity.ERROR,
        (N2,),
        evidence=["/data/run"],
        fix=["workdir"],
    )


def test_code_differs_on_one_node(survey):
    sheets = sheets_of(survey)
    sheets[N2]["code"]["sha256"] = "0" * 64
    survey = reparsed(survey, sheets)
    expect_one(
        software.check_code(survey),
        "code-differs",
        Severity.ERROR,
        (N2,),
        evidence=["/tmp"],
        fix=["rsync"],
    )


def test_code_not_hashed_in_quick_mode(survey):
    sheets = sheets_of(survey)
    sheets[N2]["code"] = None
    survey = reparsed(survey, sheets)
    assert software.check_code(survey) == []


# ----------------------------------------------------------------------------- GPU software


def test_cuda_home_missing_on_a_gpu_node(survey):
    sheets = sheets_of(survey)
    sheets[N3]["gpus"] = {"devices": [{"index": 0, "name": "H100"}], "processes": []}
    sheets[N3]["tools"]["nvcc"] = None
    expect_one(
        software.check_gpu_software(reparsed(survey, sheets)),
        "cuda-home-missing",
        Severity.WARNING,
        (N3,),
        evidence=["CUDA_HOME"],
        fix=["CUDA_HOME", N3],
    )
    sheets[N3]["cuda_home"] = "/usr/local/cuda"
    assert software.check_gpu_software(reparsed(survey, sheets)) == []


def test_pdsh_missing_on_the_launch_machine(survey, monkeypatch):
    stub_which(monkeypatch, present=())
    expect_one(
        software.check_launcher(survey),
        "pdsh-missing",
        Severity.INFO,
        (),
        evidence=["pdsh"],
        fix=["apt-get install pdsh"],
    )


def test_pdsh_not_needed_for_one_node_or_when_installed(tmp_path, monkeypatch, survey):
    assert software.check_launcher(survey) == []  # stubbed: pdsh is installed
    stub_which(monkeypatch, present=())
    assert software.check_launcher(make_survey(tmp_path, nodes=[N1])) == []
