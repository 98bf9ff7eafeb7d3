"""Bytes a Hugging Face causal LM saves for backward, per micro batch, from its shape alone.

    >>> shape = ModelShape.from_config({"model_type": "llama", "vocab_size": 128256,
    ...     "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    ...     "num_attention_heads": 32, "num_key_value_heads": 8})
    >>> layer_activation_bytes(shape, seq_len=4096, micro_batch=1) / (4096 * 1 * 4096)
    49.033203125
    >>> [round(activation_bytes(shape, seq_len=4096, micro_batch=1, grad_ckpt=ckpt) / 2**30, 2)
    ...  for ckpt in (False, True)]
    [24.61, 1.86]
    >>> round(logits_bytes(shape, seq_len=4096, micro_batch=1) / 2**30, 2)  # fp32 over 128k vocab
    6.88

The model is cast to 16-bit the way DeepSpeed's bf16 mode does it (`model.to(bfloat16)`, no
autocast), trained by transformers 5.23 with `attn_implementation="sdpa"`. Every term is one
tensor that autograd keeps from the forward to the backward, read from the modeling files and
checked storage by storage with `saved_tensors_hooks` (tests/unit/test_plan_activations.py holds
the measured points). Per token and per layer (p = dtype_bytes, fp32 = 4):

- each RMSNorm over a width w: its fp32 upcast of the input (4w, saved by `pow` and by the
  multiply with rsqrt), the fp32 rsqrt per row (4), and the normalized tensor the weight multiplies
  (p·w for llama-style norms, which cast back before the weight; 4w for gemma-style norms, which
  multiply `1 + weight` in fp32 and also keep that fp32 `1 + weight`: 4w per call, not per token).
  Layers have 2 norms over hidden (gemma2/gemma3: 4); qwen3 and gemma3 add q_norm and k_norm,
  one norm over head_dim per head.
- the inputs of the projections, which keep them for their weight gradients: the attention input
  (p·h, shared by q/k/v) and the MLP input (p·h, shared by gate/up). The outputs of the norms that
  feed a residual add (gemma's post-attention and post-feed-forward norms) are not kept.
- rotary embeddings: `q * cos + rotate_half(q) * sin` keeps only cos and sin (the same two
  tables for every layer: a model-level term), not q or k.
- attention, by `attention`:
  "sdpa": no explicit mask (no padding, no packing, seq_len below gemma3's sliding window), so
  transformers passes `is_causal=True` and `enable_gqa=True` and torch runs its flash kernel: it
  keeps q after rotary (p·q), k and v with the kv heads only (2·p·kv), the output (p·q, also
  o_proj's input) and the fp32 logsumexp per head (4·heads). Nothing seq². This is the GPU
  flash case: SDPA's CUDA flash kernel accepts grouped kv heads and `flash_attention_2` keeps
  q, k, v, output and logsumexp too (from their backward signatures; no GPU measured here).
  "sdpa_masked": an explicit mask (padding, packed sequences, gemma3's sliding layers at seq_len
  at or above the window): transformers repeats k and v to all heads (2·p·q instead of 2·p·kv) and
  torch converts the boolean mask to p bytes per (query, key) pair, one copy kept by each layer
  (p·seq_len per token). On CUDA the memory-efficient kernel runs instead and keeps the same
  tensors by its signature (its logsumexp padded to 32 positions; not measured here).
  "eager": `attn_implementation="eager"`: q, k and v repeated to all heads, the fp32 softmax
  output (4·heads·seq_len) and its p-byte cast for the matmul with v (p·heads·seq_len); gemma2
  also keeps the tanh of its logit softcapping (p·heads·seq_len).
- the SwiGLU/GeGLU MLP: the gate output (the activation's input), the activation output, the up
  output (both factors of the product) and the product (down_proj's input): 4·p·intermediate.
Biases add nothing: `addmm` keeps the same input `mm` does.

Model-level terms: the int64 token ids the embedding keeps (8 per token), cos and sin (2 tables of
seq_len x head_dim, batch-independent; gemma3 has one pair per layer type), and the final norm.
The final norm's output belongs to the head (`logits_bytes`): lm_head keeps it.

Not counted: gradients and their buckets (separate terms), the transient buffers of one layer's
backward, and the k/v that `use_cache=True` would keep referenced in the returned output (set
`use_cache=False` when training; on the "sdpa" path they are the same storages as the saved ones).
Explicit `position_ids` of shape (batch, seq) make cos/sin per sample (x micro_batch, small).
"""

from __future__ import annotations

from trainfleet.errors import TrainfleetError
from trainfleet.plan.model import ModelShape

ATTENTIONS = ("sdpa", "sdpa_masked", "eager")
FP32 = 4
INT64 = 8
# Same families as model.py: which norms a layer has.
_GEMMA_NORM = {"gemma", "gemma2", "gemma3_text"}
_QK_NORM = {"qwen3", "gemma3_text"}
_FOUR_NORMS = {"gemma2", "gemma3_text"}
# gemma2's config defaults: attn_logit_softcapping=50, final_logit_softcapping=30 (gemma3: None).
_SOFTCAPPED = {"gemma2"}
# gemma3 layers alternate sliding/full attention (1 full in 6), each type with its own rotary table.
_GEMMA3_SLIDING_PATTERN = 6


def _check_sizes(seq_len: int, micro_batch: int) -> None:
    if seq_len < 1 or micro_batch < 1:
        raise TrainfleetError(
            f"seq_len={seq_len}, micro_batch={micro_batch}: both must be positive",
            "pass the training sequence length and the per-GPU micro batch",
        )


def _check_attention(attention: str) -> None:
    if attention not in ATTENTIONS:
        raise TrainfleetError(
            f"attention {attention!r} is not modelled", f"use one of: {', '.join(ATTENTIONS)}"
        )


def _norm_bytes_per_row(shape: ModelShape, width: int, dtype_bytes: int) -> int:
    """One RMSNorm call over `width`, per row: HF's norms compute in fp32 and keep fp32 copies."""
    upcast_input = FP32 * width
    rsqrt = FP32
    # Llama-style norms cast back before `weight *`, which keeps that cast for the weight's grad;
    # gemma-style norms multiply `1 + weight` in fp32, keeping the fp32 normalized tensor.
    normalized = (FP32 if shape.family in _GEMMA_NORM else dtype_bytes) * width
    return upcast_input + rsqrt + normalized


def _norm_constant_bytes(shape: ModelShape, width: int) -> int:
    """Gemma-style norms keep the fp32 `1 + weight` of each call: per call, not per token."""
    return FP32 * width if shape.family in _GEMMA_NORM else 0


def _attention_bytes_per_token(
    shape: ModelShape, seq_len: int, dtype_bytes: int, attention: str
) -> int:
    p, heads = dtype_bytes, shape.num_heads
    q_width = heads * shape.head_dim
    kv_width = shape.num_kv_heads * shape.head_dim
    query_after_rotary = p * q_width
    output = p * q_width  # the kernel's output is also o_proj's input: one storage
    if attention == "sdpa":
        key_value = 2 * p * kv_width
        return query_after_rotary + key_value + output + FP32 * heads  # + logsumexp
    # With a mask, or in eager, transformers' repeat_kv copies k and v to all heads.
    key_value = 2 * p * q_width
    if attention == "sdpa_masked":
        mask = p * seq_len  # the boolean mask converted to the query dtype, kept per layer
        return query_after_rotary + key_value + output + FP32 * heads + mask
    probabilities = (FP32 + p) * heads * seq_len  # fp32 softmax output and its p-byte cast
    softcap = p * heads * seq_len if shape.family in _SOFTCAPPED else 0  # tanh output
    return query_after_rotary + key_value + output + probabilities + softcap


def layer_activation_bytes(
    shape: ModelShape,
    *,
    seq_len: int,
    micro_batch: int,
    dtype_bytes: int = 2,
    attention: str = "sdpa",
) -> int:
    """Bytes one decoder layer keeps for backward (the module docstring lists each tensor)."""
    _check_sizes(seq_len, micro_batch)
    _check_attention(attention)
    p, h, d = dtype_bytes, shape.hidden_size, shape.head_dim
    tokens = seq_len * micro_batch
    hidden_norms = 4 if shape.family in _FOUR_NORMS else 2
    per_token = (
        hidden_norms * _norm_bytes_per_row(shape, h, p)
        + 2 * p * h  # inputs of q/k/v and of gate/up
        + _attention_bytes_per_token(shape, seq_len, p, attention)
        + 4 * p * shape.intermediate_size  # gate out, activation out, up out, product
    )
    constant = hidden_norms * _norm_constant_bytes(shape, h)
    if shape.family in _QK_NORM:
        heads = shape.num_heads + shape.num_kv_heads
        per_token += heads * _norm_bytes_per_row(shape, d, p)
        constant += 2 * _norm_constant_bytes(shape, d)
    return tokens * per_token + constant


def _rotary_tables(shape: ModelShape) -> int:
    if shape.family == "gemma3_text" and shape.num_layers >= _GEMMA3_SLIDING_PATTERN:
        return 2
    return 1


def activation_bytes(
    shape: ModelShape,
    *,
    seq_len: int,
    micro_batch: int,
    dtype_bytes: int = 2,
    grad_ckpt: bool,
    attention: str = "sdpa",
) -> int:
    """Bytes the whole model keeps for backward for one micro batch, at the backward's peak,
    without lm_head and the loss (`logits_bytes`).

    Without checkpointing: every layer, plus the token ids, cos/sin and the final norm. With HF
    gradient checkpointing (`gradient_checkpointing_enable()`, non-reentrant): each layer keeps
    only its input (p·hidden per token; cos/sin stay referenced by the recompute), the
    non-checkpointed parts stay as above, and ONE layer's full activations are added: the
    backward recomputes one layer at a time, and that layer's activations are live at its peak.
    """
    one_layer = layer_activation_bytes(
        shape,
        seq_len=seq_len,
        micro_batch=micro_batch,
        dtype_bytes=dtype_bytes,
        attention=attention,
    )
    tokens = seq_len * micro_batch
    h = shape.hidden_size
    token_ids = INT64 * tokens
    # position_ids default to (1, seq): one cos and one sin table shared by the batch and layers.
    rotary = _rotary_tables(shape) * 2 * seq_len * shape.head_dim * dtype_bytes
    final_norm = tokens * _norm_bytes_per_row(shape, h, dtype_bytes) + _norm_constant_bytes(
        shape, h
    )
    outside_layers = token_ids + rotary + final_norm
    if grad_ckpt:
        layer_inputs = shape.num_layers * dtype_bytes * h * tokens
        return outside_layers + layer_inputs + one_layer
    return outside_layers + shape.num_layers * one_layer


def logits_bytes(shape: ModelShape, *, seq_len: int, micro_batch: int, dtype_bytes: int = 2) -> int:
    """Peak bytes of lm_head and HF's causal-LM loss, at the start of the backward.

    HF's `ForCausalLMLoss` upcasts the logits to fp32 and calls `cross_entropy`, i.e.
    `log_softmax` then `nll_loss`. Counted, per token (V = vocab_size):
    - lm_head's input, the final norm's output (p·hidden), kept for lm_head's weight gradient;
    - the p-byte logits the returned output holds (p·V): a loop that keeps `outputs` across
      `backward()` (the usual DeepSpeed loop) holds them; HF Trainer drops them first, so for it
      this is p·V per token too much;
    - log_softmax's fp32 output (4·V), kept by log_softmax and nll_loss (one storage);
    - the two fp32 gradients live while log_softmax's backward runs: nll_loss's gradient of the
      log-probabilities and the gradient of the fp32 logits it produces (2 x 4·V). That moment is
      the head's peak: afterwards only the fp32 gradient and its p-byte cast remain;
    - gemma2 only: the tanh of its final-logit softcapping (p·V).
    Not counted: the fp32 copy of the logits (log_softmax's backward needs only its output; the
    copy is freed when the loss returns) and the shifted int64 labels (nll_loss's backward, which
    runs first, releases them). The forward's own peak in the head, p + 4 + 4 bytes per V with the
    fp32 copy live, is below this one.
    """
    _check_sizes(seq_len, micro_batch)
    p, vocab = dtype_bytes, shape.vocab_size
    tokens = seq_len * micro_batch
    per_token = (
        p * shape.hidden_size  # lm_head's input
        + p * vocab  # logits held by the output
        + FP32 * vocab  # log_softmax output
        + 2 * FP32 * vocab  # gradients at log_softmax's backward
        + (p * vocab if shape.family in _SOFTCAPPED else 0)
    )
    return tokens * per_token
