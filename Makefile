# Every target installs what it needs: `make demo` and `make test` work on a fresh machine.
# Three jobs at a time: apt-get beside the first pip install, then the two trainers' venvs and
# DeepSpeed's ops at once (a pip run keeps about one core busy and waits on the disk and the
# index the rest of the time: a sampler read 48 % and 24 % idle in the first two minutes). No
# --output-sync: it would hold back the tests' progress until the whole run ends.
MAKEFLAGS += -j3
PY        ?= python3
VENV      := .venv
BIN       := $(VENV)/bin
STAMP     := $(VENV)/.installed
SYSSTAMP  := $(VENV)/.system-packages
SYSPKGS   := openssh-server openssh-client iproute2 iptables pdsh procps openssl rsync sudo \
             munge slurmctld slurmd slurm-client
# The CPU build of torch comes from a local file here; installing it first keeps pip from
# pulling gigabytes of CUDA wheels for anything that depends on torch.
TORCH_PIN ?= torch==2.13.0
DEEPSPEED_PIN ?= deepspeed==0.19.8
TRANSFORMERS_PIN ?= transformers==5.23.0
ACCELERATE_PIN ?= accelerate==1.15.0
# What `trainfleet train` uses on top (data loading, LoRA, TensorBoard event files).
TRAIN_PINS ?= datasets==5.2.0 peft==0.21.2 tensorboard==2.20.0 py-spy==0.4.3
# Third-party trainers the tests launch through trainfleet as users run them (TRL's sft.py).
THIRD_PARTY_PINS ?= trl==1.16.0
# LLaMA-Factory and axolotl pin other versions of transformers, datasets, accelerate, peft and
# trl than the rest, so each gets its own environment, as its users have one: a venv layered
# over .venv (torch, deepspeed and trainfleet come from there; its pins shadow the rest).
# Installed without dependencies: the package itself and what cannot be resolved here.
LF_VENV   := $(VENV)/llamafactory
LF_STAMP  := $(LF_VENV)/.installed
LF_NODEPS ?= llamafactory==0.9.5 torchaudio==2.11.0
LF_PINS   ?= transformers==5.6.0 datasets==4.0.0 accelerate==1.11.0 peft==0.18.1 trl==0.24.0 \
             fire omegaconf "tyro<0.9" einops tiktoken sentencepiece
AX_VENV   := $(VENV)/axolotl
AX_STAMP  := $(AX_VENV)/.installed
AX_NODEPS ?= axolotl==0.19.0
AX_PINS   ?= transformers==5.16.1 tokenizers==0.23.1 datasets==4.8.4 accelerate==1.13.0 \
             peft==0.20.0 trl==1.9.0 optimum==1.16.2 evaluate==0.4.1 "kernels>=0.16,<0.17" \
             bitsandbytes==0.50.2 triton wandb posthog==6.7.11 typer==0.25.1 \
             "numba>=0.63.1,<1" schedulefree==1.4.1 axolotl-contribs-lgpl==0.0.7 \
             axolotl-contribs-mit==0.0.6 antlr4-python3-runtime==4.13.2 python-dotenv==1.0.1 \
             addict fire einops colorama scipy art zstandard fastcore langdetect immutabledict \
             sentencepiece

.PHONY: all venv third-party system demo test test-unit test-cluster lint format bench clean

all: test

# pip byte-compiles every module it installs: where PYTHONDONTWRITEBYTECODE is set (as on
# this machine, and passed on to every rank like any PYTHON* variable), nothing else would.
PIP_QUIET := -q

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install $(PIP_QUIET) "$(TORCH_PIN)"
	$(BIN)/pip install $(PIP_QUIET) -e ".[dev]"
	# One resolver run for the rest (pins all): the launch tests run DeepSpeed's real runner (the
	# version verified here, see docs/launch.md); the planner's counts are checked against
	# transformers' own models (meta device), and HfDeepSpeedConfig (zero.Init while loading)
	# needs accelerate; then what train uses and the third-party trainers.
	$(BIN)/pip install $(PIP_QUIET) "$(DEEPSPEED_PIN)" "$(TRANSFORMERS_PIN)" "$(ACCELERATE_PIN)" \
	  $(TRAIN_PINS) $(THIRD_PARTY_PINS)
	touch $@

venv: $(STAMP)

# $(call layered_venv,DIR,NODEPS,PINS)
define layered_venv
	rm -rf $(1)
	$(BIN)/python -m venv $(1)
	site='import sysconfig; print(sysconfig.get_paths()["purelib"])'; \
	echo "import site; site.addsitedir('$$($(BIN)/python -c "$$site")')" \
	  > "$$($(1)/bin/python -c "$$site")/zz-trainfleet-venv.pth"
	$(1)/bin/pip install $(PIP_QUIET) --no-deps $(2)
	$(1)/bin/pip install $(PIP_QUIET) --no-warn-conflicts $(3)
endef

# LLaMA-Factory's web UI, API and media dependencies (gradio, av, torchvision, modelscope...)
# are left out: training on text does not import them. torchaudio is imported, but the
# registry's newest (2.11) is built for torch 2.11 and its compiled ops do not load against
# 2.13: its Python part is kept without them (LLaMA-Factory uses it for audio inputs only).
$(LF_STAMP): $(STAMP)
	$(call layered_venv,$(LF_VENV),$(LF_NODEPS),$(LF_PINS))
	rm -f $(LF_VENV)/lib/python*/site-packages/torchaudio/lib/*.so
	touch $@

# axolotl's cloud, evaluation and GPU-kernel extras (modal, lm_eval, s3fs/gcsfs/adlfs, xformers,
# liger-kernel, torchao, flash-linear-attention, mistral-common...) are left out: training a
# text model on CPU does not import them. triton, bitsandbytes and wandb are imported.
$(AX_STAMP): $(STAMP)
	$(call layered_venv,$(AX_VENV),$(AX_NODEPS),$(AX_PINS))
	touch $@

third-party: $(LF_STAMP) $(AX_STAMP)

# DeepSpeed's CPU ops (fused_adam and the CPU accelerator's shared-memory collectives), built
# into this machine's torch_extensions cache while the venvs above install: else the unit tier
# builds them in the background (tests/conftest.py), which took it from 89 s to 200 s here.
# With the venv's ninja, as the tests' ranks use (tests/conftest.py: ONE_NINJA); the same
# node job as `setup pyenv`'s, given the whole OpsJob (node/dsops.py: no key has a default).
DS_OPS_STAMP := $(VENV)/.deepspeed-ops
DS_OPS_JOB   := {"target": "$(abspath $(VENV))", "ops": ["fused_adam", "deepspeed_shm_comm"], "env": {}}
$(DS_OPS_STAMP): $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -c \
	  'import sys; from trainfleet.node import dsops; sys.exit(dsops.build($(DS_OPS_JOB)))'
	touch $@

# System tools the sandbox and the deepspeed backend use (root only; skipped otherwise).
$(SYSSTAMP):
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  missing=""; for p in $(SYSPKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -n "$$missing" ]; then \
	    echo "installing:$$missing"; apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi; \
	else echo "not root or no apt-get: skipping system packages ($(SYSPKGS))"; fi
	@mkdir -p $(VENV) && touch $@

system: $(SYSSTAMP)

demo: $(STAMP) $(SYSSTAMP)
	$(BIN)/python -m trainfleet.demo

# The unit tier runs on both cores (pytest-xdist). The cluster tier runs on two workers, each
# checking and cleaning up only its own sandboxes and processes (tests/session_scope.py), each
# with its share of whole test files (--cluster-bins: tests/cluster_schedule.py puts on one
# worker the files that run DeepSpeed's runner, since a failed runner job ends every DeepSpeed
# launcher on the machine, and balances the rest by their measured times). Then alone the
# tests marked `serial`, which compare speeds and would read the other worker's load as a slow
# node. Each tier collects only its own directory (tests/conftest.py refuses a test whose marks
# and directory disagree): collecting all of tests/ took 4.9 s, tests/cluster alone 1.6 s.
CLUSTER_PARALLEL = -n 2 --cluster-bins -m "cluster and not serial" tests/cluster
CLUSTER_SERIAL   = -m "cluster and serial" tests/cluster
UNIT             = -n 2 -m "not cluster" tests/unit
test: $(STAMP) $(SYSSTAMP) $(DS_OPS_STAMP) $(LF_STAMP) $(AX_STAMP)
	$(BIN)/python -m pytest -q $(UNIT)
	$(BIN)/python -m pytest -q $(CLUSTER_PARALLEL)
	$(BIN)/python -m pytest -q $(CLUSTER_SERIAL)

test-unit: $(STAMP)
	$(BIN)/python -m pytest -q $(UNIT)

test-cluster: $(STAMP) $(SYSSTAMP) $(DS_OPS_STAMP) $(LF_STAMP) $(AX_STAMP)
	$(BIN)/python -m pytest -q $(CLUSTER_PARALLEL)
	$(BIN)/python -m pytest -q $(CLUSTER_SERIAL)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format src tests bench examples
	$(BIN)/ruff check --fix src tests bench examples

bench: $(STAMP) $(SYSSTAMP)
	$(BIN)/python bench/exec_fanout.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache .mypy_cache
