"""`trainfleet plan` (in progress): memory per GPU and CPU RAM per node for a model and config.

Today: exact parameter counts from a config (`model.py`) and DeepSpeed's own model-state
estimators reproduced to compare against (`deepspeed_estimates.py`).
"""
