"""HF TrainingArguments names for trainfleet's train settings, in a module of its own so that
the CLI can spell its flags without importing the training code.

    >>> HF_NAMES["per_device_train_batch_size"]
    'micro_batch_size'
"""

HF_NAMES = {
    "model_name_or_path": "model",
    "output_dir": "output",
    "per_device_train_batch_size": "micro_batch_size",
    "lr_scheduler_type": "lr_scheduler",
    "save_total_limit": "keep_checkpoints",
    "deepspeed": "deepspeed_config",
}
"""HF TrainingArguments names that are another setting's here (flags and train.yaml keys).
Names HF and trainfleet share (learning_rate, max_steps, num_train_epochs, warmup_steps,
warmup_ratio, gradient_accumulation_steps, save_steps, logging_steps, weight_decay,
max_grad_norm, seed) are the same."""
