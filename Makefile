# Every target installs what it needs: `make demo` and `make test` work on a fresh machine.
PY        ?= python3
VENV      := .venv
BIN       := $(VENV)/bin
STAMP     := $(VENV)/.installed
SYSSTAMP  := $(VENV)/.system-packages
SYSPKGS   := openssh-server openssh-client iproute2 iptables pdsh procps openssl rsync
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

.PHONY: all venv system demo test test-unit test-cluster lint format bench clean

all: test

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_PIN)"
	$(BIN)/pip install -q -e ".[dev]"
	# The launch tests run DeepSpeed's real runner (the version verified here, see DESIGN.md).
	$(BIN)/pip install -q "$(DEEPSPEED_PIN)"
	# The planner's counts are checked against transformers' own models (meta device);
	# HfDeepSpeedConfig (zero.Init while loading) needs accelerate.
	$(BIN)/pip install -q "$(TRANSFORMERS_PIN)" "$(ACCELERATE_PIN)"
	$(BIN)/pip install -q $(TRAIN_PINS)
	$(BIN)/pip install -q $(THIRD_PARTY_PINS)
	touch $@

venv: $(STAMP)

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

test: $(STAMP) $(SYSSTAMP)
	$(BIN)/python -m pytest -q tests

test-unit: $(STAMP)
	$(BIN)/python -m pytest -q -m "not cluster" tests

test-cluster: $(STAMP) $(SYSSTAMP)
	$(BIN)/python -m pytest -q -m cluster tests

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples

format: $(STAMP)
	$(BIN)/ruff format src tests bench examples
	$(BIN)/ruff check --fix src tests bench examples

bench: $(STAMP) $(SYSSTAMP)
	$(BIN)/python bench/exec_fanout.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache
