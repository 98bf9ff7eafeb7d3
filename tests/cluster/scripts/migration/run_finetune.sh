#!/bin/bash
# A per-rank wrapper script, as LMFlow's and gpt-neox's scripts set variables and then start
# Python: trainfleet runs it as an executable on every rank, with torchrun's environment.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export FINETUNE_TAG="lmflow-style"
exec "${PYTHON:-python3}" "$here/finetune.py" --lr 2e-5 "$@"
