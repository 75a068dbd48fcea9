"""RelPosTransformer: a Marian-shaped encoder-decoder whose self-attention position scheme comes from the registry.

Read top to bottom: masks -> attention -> layers -> stacks -> base model -> heads. The model never tests a scheme's
name: each stack holds one `PositionScheme` (`config.position_scheme`) that embeds (`embed`) and says what each
self-attention layer adds (`terms`); the attention module runs the kernel `config._attn_implementation` names,
through `RELPOS_ATTENTION_FUNCTIONS` (attention_functions.py). Cross-attention has no positions (Shaw et al. 2018,
sec. 3).
"""

from __future__ import annotations

import contextvars
import copy
import inspect
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

import torch
from torch import nn
from transformers import GenerationConfig, GenerationMixin, LogitsProcessorList, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation.utils import GenerateOutput
from transformers.loss.loss_utils import fixed_cross_entropy
from transformers.masking_utils import (
    ALL_MASK_ATTENTION_FUNCTIONS,
    and_masks,
    bidirectional_mask_function,
    causal_mask_function,
    sdpa_mask,
    sliding_window_bidirectional_overlay,
)
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    CausalLMOutputWithPast,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
from transformers.utils import logging as hf_logging
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import can_return_tuple

from .attention_functions import (
    FIXED_SIZE_CACHE_KERNELS,
    HOST_OFFSET_KERNELS,
    PAGED_EAGER,
    RELPOS_ATTENTION_FUNCTIONS,
    RELPOS_KERNELS,
    FlexMask,
    KeyDropout,
    check_dropout_kernel,
    check_kernel_name,
    dense_mask,
    eager_attention_forward,
    kernel_run_for,
    prepare_kernel,
)
from .configuration_relpos import RelPosTransformerConfig
from .generation_limits import (
    DEFAULT_NEW_TOKENS,
    RELATIVE_LIMIT_FIELDS,
    SourceLengthCapLogitsProcessor,
    check_shortest_below_limits,
    keep_relative_limit,
    longest_new_output,
    new_token_limits,
    relative_limit,
    shortest_new_output,
    source_lengths,
)
from .positions import (
    AttentionTerms,
    PositionContext,
    PositionDraw,
    PositionScheme,
    add_sinusoids,
    get_scheme_class,
    random_positions,
    scheme_terms_of,
)
from .validation import require_int

logger = hf_logging.get_logger(__name__)
# generate's positional parameters, in order (transformers' GenerationMixin.generate).
GENERATE_ARGUMENTS = tuple(name for name, parameter in inspect.signature(GenerationMixin.generate).parameters.items()
                           if parameter.kind is parameter.POSITIONAL_OR_KEYWORD)[1:]


def shift_tokens_right(input_ids: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher-forcing decoder inputs: labels shifted one step right behind the start token; -100 becomes pad."""
    if pad_token_id is None or decoder_start_token_id is None:
        raise ValueError("config.pad_token_id and config.decoder_start_token_id must be set to train with labels")
    shifted = input_ids.new_zeros(input_ids.shape)
    shifted[:, 1:] = input_ids[:, :-1].clone()
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


def is_token_id_matrix(ids: torch.Tensor) -> bool:
    """Whether `ids` is a [batch, length] tensor of integers (token ids, or labels with -100)."""
    return ids.dim() == 2 and not ids.dtype.is_floating_point and ids.dtype != torch.bool


def check_labels(labels: torch.Tensor, inputs_shape: Sequence[int] | None, inputs: str) -> None:
    """One ValueError naming `labels` unless they are [batch, length] integer ids with one label per token of
    `inputs`, whose [batch, length] is `inputs_shape` (None: the labels make those inputs)."""
    if not is_token_id_matrix(labels):
        raise ValueError("labels must be a [batch, length] tensor of integer token ids (-100: ignored), got shape "
                         f"{list(labels.shape)} and dtype {labels.dtype}")
    if inputs_shape is not None and tuple(labels.shape) != tuple(inputs_shape):
        raise ValueError(f"labels must hold one id per token of {inputs}: shape {list(inputs_shape)}, got "
                         f"{list(labels.shape)}")


def token_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: torch.Tensor | int | None = None
) -> torch.Tensor:
    """Cross-entropy of `labels` (-100 ignored), in promote_types(logits dtype, float32): the mean over the labelled
    tokens, or, given the Trainer's `num_items_in_batch` (the labelled tokens of all micro-batches of one optimizer
    step, over all processes), their sum divided by it (transformers' `fixed_cross_entropy`), so that gradient
    accumulation and data parallelism weigh every token alike."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return fixed_cross_entropy(
        logits.reshape(-1, logits.size(-1)), labels.reshape(-1).to(logits.device), num_items_in_batch
    )


def is_relpos_kernel(kernel: str | None) -> bool:
    """Whether `kernel` is one of hf_relpos' kernels (None: the default, eager)."""
    return kernel in (None, *RELPOS_KERNELS)


def runs_on_relpos_kernel(config: RelPosTransformerConfig) -> bool:
    """Whether `config._attn_implementation` is one of hf_relpos' kernels."""
    return is_relpos_kernel(config._attn_implementation)


# The model whose generate call in this context (thread, task) cap_by_source_length capped, for
# _prepare_generated_length; a context variable, as the model's generation config is shared between threads
SOURCE_CAPPED_CALL: contextvars.ContextVar[PreTrainedModel | None] = contextvars.ContextVar(
    "SOURCE_CAPPED_CALL", default=None)

KERNEL_ONLY_FIELDS = (("self_attention_window", "null"), ("cross_attention_length_scaling", "false"))


def require_relpos_kernel(config: RelPosTransformerConfig, kernel: str | None, position_scheme: str | None = None,
                          additions: list[str] | tuple = ()) -> None:
    """The kernel-support rule, in one place: hf_relpos' kernels (`RELPOS_KERNELS`) take everything; any other
    kernel (flash_attention_2/3, Hub kernels) takes neither a config field of `KERNEL_ONLY_FIELDS` that is set in
    `config` nor what a scheme adds to attention (`additions`, e.g. "a score bias"; `AttentionTerms.additions`).
    "paged|eager" takes nothing: outside continuous batching transformers gives it no mask at all (it has no mask
    function) and it ignores `is_causal`, so the decoder would attend to later tokens. One ValueError naming the
    field, the scheme or the kernel, and the kernels that take it."""
    if is_relpos_kernel(kernel):
        return
    check_kernel_name(kernel)
    if kernel == PAGED_EAGER:
        raise ValueError(f"attn_implementation {kernel!r} is transformers' kernel for continuous batching, which this "
                         "model does not run: elsewhere it gets no mask, neither padding nor causality (the decoder "
                         f"would attend to later tokens); use one of {list(RELPOS_KERNELS)}")
    for field, off_value in KERNEL_ONLY_FIELDS:
        if getattr(config, field):
            raise ValueError(f"{field} runs with attn_implementation {list(RELPOS_KERNELS)}, got {kernel!r}; set "
                             f"{field} to {off_value} or use one of those")
    if additions:
        raise ValueError(
            f"position_scheme {position_scheme!r} adds {' and '.join(additions)} to attention, which attn_implementation "
            f"{kernel!r} cannot take; this scheme runs with {list(RELPOS_KERNELS)}, and {kernel!r} only with schemes "
            "that add none (e.g. 'absolute')"
        )


def check_padding_mask(name: str, mask: torch.Tensor | None, batch_size: int, length: int,
                       with_cache: int | None = None) -> None:
    """A [batch, length] 1/0 key mask is accepted, and for the decoder (`with_cache`: cached + new tokens) also one of
    at least that width (its last `with_cache` columns count); any other shape is one ValueError naming `name`, never
    a mask zero-padded or cut in silence."""
    if mask is None:
        return
    width = mask.size(-1)
    if mask.dim() != 2 or mask.size(0) != batch_size or not (
            width == length or (with_cache is not None and width >= with_cache)):
        if with_cache is None:
            accepted = f"[{batch_size}, {length}]"
        elif with_cache == length:
            accepted = f"[{batch_size}, {length} or more]"
        else:
            accepted = f"[{batch_size}, {length}] (new tokens) or [{batch_size}, {with_cache} or more] (cached and new)"
        raise ValueError(f"{name} must be a [batch, length] mask of 1 (attend) and 0 (padding): {accepted}, got "
                         f"{list(mask.shape)}")


def output_flags(config: RelPosTransformerConfig, output_attentions: bool | None,
                 output_hidden_states: bool | None) -> tuple[bool, bool]:
    """transformers' rule for the output flags of a forward call: one left None takes the config's
    (`config.output_attentions`, `config.output_hidden_states`, e.g. from `from_pretrained(path,
    output_attentions=True)`), as in Marian and BART."""
    attentions = config.output_attentions if output_attentions is None else output_attentions
    hidden_states = config.output_hidden_states if output_hidden_states is None else output_hidden_states
    return bool(attentions), bool(hidden_states)


def cache_flag(config: RelPosTransformerConfig, use_cache: bool | None) -> bool:
    """transformers' rule for `use_cache` of a forward call: None takes `config.use_cache`, as in Marian and BART."""
    return bool(config.use_cache if use_cache is None else use_cache)


def scheme_terms(config: RelPosTransformerConfig, is_decoder: bool) -> tuple[AttentionTerms, PositionContext]:
    """The self-attention terms (and prepared context) of the encoder's (or the decoder's) position scheme of
    `config`, read off a fresh one-layer copy of the scheme on the CPU over 3 tokens."""
    num_heads = config.decoder_attention_heads if is_decoder else config.encoder_attention_heads
    head_dim = config.d_model // num_heads
    with torch.device("cpu"), torch.no_grad():  # also inside from_pretrained's meta-device construction
        scheme = get_scheme_class(config.position_scheme)(config, 1, num_heads, head_dim, is_causal=is_decoder)
        query = key = torch.zeros(1, num_heads, 3, head_dim)
        context = scheme.prepare(PositionContext(3, 3, 0, None, query.device, query.dtype))
        return scheme_terms_of(scheme, 0, query, key, context), context


def scheme_additions(config: RelPosTransformerConfig, is_decoder: bool) -> list[str]:
    """What the position scheme of the encoder (or the decoder) of `config` adds to attention: its terms'
    `AttentionTerms.additions()` and "an attention mask" for a scheme mask (`scheme_terms`; replaced queries and
    keys, RoPE's, add nothing)."""
    terms, context = scheme_terms(config, is_decoder)
    return terms.additions() + (["an attention mask"] if context.has_mask() else [])


def check_kernel(config: RelPosTransformerConfig, kernel: str | None) -> None:
    """`require_relpos_kernel` when a model is built or its kernel is set, for what `config` adds to attention in
    either stack (`scheme_additions`), on the kernel transformers runs for the name (`kernel_run_for`: "paged|sdpa"
    runs sdpa); the attention module applies the same rule to each call's terms."""
    kernel = kernel_run_for(kernel)
    if is_relpos_kernel(kernel):
        return
    additions = scheme_additions(config, False) + scheme_additions(config, True)
    require_relpos_kernel(config, kernel, config.position_scheme, list(dict.fromkeys(additions)))


def attention_mask_for(
    config: RelPosTransformerConfig,
    batch_size: int,
    query_length: int,
    key_length: int,
    query_offset: int,
    padding: torch.Tensor | None,
    causal: bool,
    device: torch.device,
    window: int | None = None,
) -> torch.Tensor | None:
    """The mask of one stack's self- or cross-attention from `transformers.masking_utils`, in the form its kernel
    reads: a `FlexMask` for FlexAttention (from the padding and positions, no dense tensor), a boolean [B, 1, n, m]
    for hf_relpos' other kernels (True = may attend; None when nothing is masked: no padding and, in a causal call,
    `sees_every_key`), else what
    the kernel's registered mask function builds (flash: the 2-D padding mask). Query i sits at absolute position
    `query_offset + i` (cached tokens or Transformer-XL memory before it); `padding` is the [B, m] 1/0 key mask;
    `window` (`config.self_attention_window`) keeps only the keys j with |i - j| <= window."""
    if config._attn_implementation == "flex_attention":
        bounds = {"lowest": None if window is None else -window, "highest": 0 if causal else window}
        if padding is None:
            return FlexMask(batch_size, query_length, key_length, query_offset, **bounds)
        return FlexMask.from_padding(padding.to(device), query_length, query_offset, **bounds)
    build = sdpa_mask if runs_on_relpos_kernel(config) else ALL_MASK_ATTENTION_FUNCTIONS.get(config._attn_implementation)
    if build is None:  # transformers' convention for a kernel without a mask function: it takes no mask
        if padding is not None and not bool(padding.all()):
            logger.warning_once(
                f"attn_implementation {config._attn_implementation!r} has no mask function registered, so it gets no "
                "attention mask and attends to the padding of this batch; register one with "
                f"transformers.AttentionMaskInterface.register({config._attn_implementation!r}, "
                "transformers.masking_utils.sdpa_mask) (a boolean [B, 1, n, m] mask) or the mask your kernel reads")
        return None
    if build is sdpa_mask and causal and padding is None and sees_every_key(query_length, key_length, query_offset,
                                                                            window):
        return None
    mask_function = causal_mask_function if causal else bidirectional_mask_function
    if window is not None:
        mask_function = and_masks(mask_function, sliding_window_bidirectional_overlay(window))
    return build(
        batch_size=batch_size,
        q_length=query_length,
        kv_length=key_length,
        q_offset=query_offset,
        mask_function=mask_function,
        attention_mask=None if padding is None else padding.to(device=device, dtype=torch.bool),
        allow_is_causal_skip=False,
        allow_is_bidirectional_skip=not causal and window is None,
        device=device,
    )


def sees_every_key(query_length: int, key_length: int, query_offset: int | torch.Tensor, window: int | None) -> bool:
    """Whether a causal call without padding masks nothing: one query after all its keys (a cached decoding step,
    key_length = query_offset + 1; not a fixed-size cache, whose unused slots past the query are masked), within
    `window` of each of them. `attention_mask_for` then builds no mask, and the layers neither read nor apply one
    (a mask of every key changes no score), which a decoding step would otherwise pay in every layer."""
    return (query_length == 1 and not torch.is_tensor(query_offset) and key_length == query_offset + 1
            and (window is None or key_length - 1 <= window))


def with_scheme_mask(
    config: RelPosTransformerConfig, scheme: PositionScheme, context: PositionContext, mask: torch.Tensor | None
) -> torch.Tensor | None:
    """A stack's self-attention `mask` (from `attention_mask_for`) and the scheme's mask for every layer
    (`context.mask` or `context.mask_mod`), combined once per forward: into the `FlexMask` as a mask_mod when the
    scheme gives one, else as a dense [1, H, n, m] tensor."""
    if not context.has_mask():
        return mask
    require_relpos_kernel(config, config._attn_implementation, scheme.name, ["an attention mask"])
    if isinstance(mask, FlexMask) and context.mask_mod is not None:
        return mask.with_head_mask(context.mask_mod, scheme.num_heads)
    return and_scheme_mask(mask, context.dense_mask(scheme.num_heads))


def and_scheme_mask(mask: torch.Tensor | FlexMask | None, scheme_mask: torch.Tensor) -> torch.Tensor | FlexMask:
    """A boolean [B, 1, n, m] mask or a `FlexMask` (or None) and a scheme's mask (per head, e.g. DiSAN's): both must
    allow a key."""
    scheme_mask = _as_4d(scheme_mask)
    if isinstance(mask, FlexMask):
        return mask.with_dense(scheme_mask)
    return scheme_mask if mask is None else mask & scheme_mask


def _as_4d(tensor: torch.Tensor) -> torch.Tensor:
    """A mask or bias broadcastable to [B, H, n, m] with its missing leading dimensions made explicit."""
    if tensor.dim() == 4:
        return tensor
    return tensor.reshape((1,) * (4 - tensor.dim()) + tuple(tensor.shape))


class RelPosAttention(nn.Module):
    """Multi-head attention. For self-attention the stack's position scheme says what enters (`terms`); the kernel
    `config._attn_implementation` runs it, looked up in `RELPOS_ATTENTION_FUNCTIONS` (hf_relpos' eager, SDPA and
    FlexAttention functions, transformers' for every other name). A kernel of transformers' runs a scheme only when
    the scheme adds no score bias, mask or value term; otherwise it is a ValueError, never a silent substitution."""

    def __init__(
        self, config: RelPosTransformerConfig, num_heads: int, layer_idx: int, is_cross_attention: bool,
        is_causal: bool = False,
    ):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_dim = config.d_model // num_heads
        self.scaling = self.head_dim**-0.5
        self.layer_idx = layer_idx
        self.is_cross_attention = is_cross_attention
        self.is_causal = is_causal and not is_cross_attention  # read by transformers' flash kernels
        self.dropout = config.attention_dropout
        self.q_proj = nn.Linear(config.d_model, config.d_model)
        self.k_proj = nn.Linear(config.d_model, config.d_model)
        self.v_proj = nn.Linear(config.d_model, config.d_model)
        self.out_proj = nn.Linear(config.d_model, config.d_model)

    def _heads(self, states: torch.Tensor) -> torch.Tensor:
        return states.view(*states.shape[:-1], self.num_heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scheme: PositionScheme | None = None,
        key_value_states: torch.Tensor | None = None,
        cache: Cache | None = None,
        output_attentions: bool = False,
        memory: torch.Tensor | None = None,
        position_context: PositionContext | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`attention_mask` comes from `attention_mask_for`; `memory` [B, M, d] (Transformer-XL): keys and values over
        [memory; current segment], queries over the current segment only; `position_context`: the stack call's
        positions, prepared by `scheme` (self-attention only)."""
        query = self._heads(self.q_proj(hidden_states))
        layer_cache = cache
        if isinstance(cache, EncoderDecoderCache):
            layer_cache = cache.cross_attention_cache if self.is_cross_attention else cache.self_attention_cache

        if self.is_cross_attention and layer_cache is not None and cache.is_updated.get(self.layer_idx):
            key, value = layer_cache.layers[self.layer_idx].keys, layer_cache.layers[self.layer_idx].values
        else:
            source = key_value_states if self.is_cross_attention else hidden_states
            if memory is not None:
                source = torch.cat([memory, source], dim=1)
            key, value = self._heads(self.k_proj(source)), self._heads(self.v_proj(source))
            if scheme is not None:
                key = scheme.transform_new_keys(self.layer_idx, key, position_context)
            if layer_cache is not None:
                key, value = layer_cache.update(key, value, self.layer_idx)
                if self.is_cross_attention:
                    cache.is_updated[self.layer_idx] = True

        if self.is_cross_attention and self.config.cross_attention_length_scaling:
            query = query * self.log_key_counts(attention_mask, key.size(-2), query.dtype)
        output, weights = self.attend(query, key, value, attention_mask, scheme, position_context,
                                      output_attentions)
        return self.out_proj(output.reshape(*hidden_states.shape[:-1], -1)), weights

    def log_key_counts(self, attention_mask: torch.Tensor | None, key_length: int, dtype: torch.dtype) -> torch.Tensor:
        """log m per query, m = the keys it may attend to ([B, 1, n, 1] from the boolean mask; every key when there
        is no mask): the factor of `cross_attention_length_scaling` (Chiang & Cholak 2022), in the queries' dtype. The
        count and its log are in promote_types(dtype, float32), rounded once into `dtype` (float16 has no count above
        65504, bfloat16 rounds those above 256)."""
        compute = torch.promote_types(dtype, torch.float32)
        attention_mask = dense_mask(attention_mask, self.q_proj.weight.device)
        if attention_mask is None:
            return torch.tensor(key_length, dtype=compute).log().to(dtype)
        counts = attention_mask.sum(-1, keepdim=True).clamp(min=1)  # a fully padded source: log 1 = 0, not NaN
        return counts.to(compute).log().to(dtype)

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scheme: PositionScheme | None = None,
        position_context: PositionContext | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The scaled dot product of per-head queries [B, H, n, d] and keys/values [B, H, m, d] (keys as
        `scheme.transform_new_keys` left them) with what `scheme` adds given the stack call's
        `position_context`, on the kernel `config._attn_implementation` names; returns [B, n, H, d] and the weights
        (eager)."""
        terms = AttentionTerms()
        if scheme is not None:
            terms = scheme_terms_of(scheme, self.layer_idx, query, key, position_context)
        query = query if terms.query is None else terms.query
        key = key if terms.key is None else terms.key
        value = value if terms.value_bias is None else value + terms.value_bias
        kernel = self.config._attn_implementation
        attention = RELPOS_ATTENTION_FUNCTIONS.get_interface(kernel, eager_attention_forward)
        extra = {}
        dropout = self.dropout if self.training else 0.0
        check_dropout_kernel(kernel, dropout, self.config.attention_dropout_kind)
        if dropout > 0 and self.config.attention_dropout_kind == "keys":
            extra["key_dropout"], dropout = KeyDropout.draw(dropout, query.device), 0.0
        if runs_on_relpos_kernel(self.config):
            if terms.mask is not None:  # per-head masks (DiSAN): masking_utils builds one mask for all heads
                attention_mask = and_scheme_mask(attention_mask, terms.mask)
            extra.update(score_bias=_as_4d(terms.score_bias) if torch.is_tensor(terms.score_bias) else terms.score_bias,
                         value_term=terms.value_term, score_mod=terms.score_mod,
                         fused_attention=terms.fused_attention,
                         kernel_cache=position_context.kernel_cache if position_context is not None else None)
        else:
            require_relpos_kernel(self.config, kernel, getattr(scheme, "name", None), terms.additions())
        return attention(
            self, query, key, value, attention_mask, scaling=self.scaling,
            dropout=dropout, output_attentions=output_attentions, **extra,
        )


class RelPosFeedForward(nn.Module):
    """FFN(x) = act(x W1 + b1) W2 + b2 (Vaswani et al. 2017, eq. 2)."""

    def __init__(self, config: RelPosTransformerConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.activation_fn = ACT2FN[config.activation_function]
        self.activation_dropout = config.activation_dropout

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.activation_fn(self.fc1(hidden_states))
        hidden_states = nn.functional.dropout(hidden_states, p=self.activation_dropout, training=self.training)
        return self.fc2(hidden_states)


def memory_as_input(memory: torch.Tensor, layer_input: torch.Tensor) -> torch.Tensor:
    """A layer's Transformer-XL memory in the dtype and on the device of the layer input it continues (memory given
    on another device, as a stored one, or each layer's on its own device under a `device_map`, is moved there, as
    accelerate's hooks move a layer's other inputs)."""
    return memory.to(device=layer_input.device, dtype=layer_input.dtype)


class RelPosLayer(GradientCheckpointingLayer):
    """One encoder or decoder layer: self-attention, optional cross-attention, feed-forward, each wrapped as
    Post-LN `LN(x + Dropout(f(x)))` (Vaswani et al. 2017) or Pre-LN `x + Dropout(f(LN(x)))` (Xiong et al. 2020)."""

    def __init__(
        self, config: RelPosTransformerConfig, layer_idx: int, num_heads: int, ffn_dim: int, cross: bool,
        is_causal: bool,
    ):
        super().__init__()
        self.pre_norm = config.layer_norm_position == "pre"
        self.dropout = config.dropout
        self.self_attn = RelPosAttention(config, num_heads, layer_idx, is_cross_attention=False, is_causal=is_causal)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.encoder_attn = RelPosAttention(config, num_heads, layer_idx, is_cross_attention=True) if cross else None
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model) if cross else None
        self.feed_forward = RelPosFeedForward(config, ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model)

    def _residual(
        self, hidden_states: torch.Tensor, norm: nn.LayerNorm,
        sublayer: Callable[[torch.Tensor], tuple[torch.Tensor, object]],
    ) -> tuple[torch.Tensor, object]:
        output, extra = sublayer(norm(hidden_states) if self.pre_norm else hidden_states)
        hidden_states = hidden_states + nn.functional.dropout(output, p=self.dropout, training=self.training)
        return (hidden_states if self.pre_norm else norm(hidden_states)), extra

    def forward(
        self,
        hidden_states: torch.Tensor,
        self_mask: torch.Tensor | None,
        scheme: PositionScheme,
        encoder_hidden_states: torch.Tensor | None = None,
        cross_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        output_attentions: bool = False,
        memory: torch.Tensor | None = None,
        position_context: PositionContext | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The cache comes as the keyword `cache`: `GradientCheckpointingLayer` drops it while checkpointing, so the
        backward replay never writes it twice. A Transformer-XL `memory` is taken as `hidden_states`, the layer's input
        it continues (`memory_as_input`)."""
        if memory is not None:
            memory = memory_as_input(memory, hidden_states)
            if self.pre_norm:
                memory = self.self_attn_layer_norm(memory)
        hidden_states, self_weights = self._residual(
            hidden_states,
            self.self_attn_layer_norm,
            lambda x: self.self_attn(
                x, self_mask, scheme, cache=cache, output_attentions=output_attentions, memory=memory,
                position_context=position_context,
            ),
        )
        cross_weights = None
        if self.encoder_attn is not None and encoder_hidden_states is not None:
            hidden_states, cross_weights = self._residual(
                hidden_states,
                self.encoder_attn_layer_norm,
                lambda x: self.encoder_attn(
                    x, cross_mask, key_value_states=encoder_hidden_states, cache=cache,
                    output_attentions=output_attentions,
                ),
            )
        hidden_states, _ = self._residual(
            hidden_states, self.final_layer_norm, lambda x: (self.feed_forward(x), None)
        )
        return hidden_states, self_weights, cross_weights


class RelPosStack(nn.Module):
    """Token embedding -> scheme embedding (+ sinusoids with `keep_absolute_positions`) -> dropout -> layers (-> final
    LayerNorm for Pre-LN).

    The encoder is bidirectional; a decoder (`is_decoder`) is causal, caches keys/values and, with `cross`, attends
    to the encoder output.
    """

    def __init__(self, config: RelPosTransformerConfig, is_decoder: bool, cross: bool):
        super().__init__()
        self.config = config
        self.is_decoder = is_decoder
        num_layers = config.decoder_layers if is_decoder else config.encoder_layers
        num_heads = config.decoder_attention_heads if is_decoder else config.encoder_attention_heads
        ffn_dim = config.decoder_ffn_dim if is_decoder else config.encoder_ffn_dim
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        # the scheme, under the attribute name its parameters are saved by (model.encoder.positions.relative_keys, ...)
        # in every checkpoint and CTranslate2 export: renaming it would orphan their weights
        self.positions = get_scheme_class(config.position_scheme)(
            config, num_layers, num_heads, config.d_model // num_heads, is_causal=is_decoder
        )
        self.layers = nn.ModuleList(
            [RelPosLayer(config, idx, num_heads, ffn_dim, cross=cross, is_causal=is_decoder) for idx in range(num_layers)]
        )
        self.layer_norm = nn.LayerNorm(config.d_model) if config.layer_norm_position == "pre" else None

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def embed(
        self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, past_length: int,
        draw: PositionDraw | None = None, position_ids: torch.Tensor | None = None, counted_positions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The embedded tokens, and the positions of every key of this stack's self-attention [past_length + n]
        (`key_positions`); `position_ids` place the tokens for the embedding-level encodings (`token_positions`;
        `counted_positions`: this model counted them over a mask, so they lie in 0 .. n-1 unchecked)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids and inputs_embeds")
        stack = "decoder" if self.is_decoder else "encoder"
        if input_ids is not None and not is_token_id_matrix(input_ids):
            raise ValueError(f"the {stack}'s input_ids must be a [batch, length] tensor of integer token ids, got "
                             f"shape {list(input_ids.shape)} and dtype {input_ids.dtype}")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if inputs_embeds.dim() != 3 or inputs_embeds.size(1) == 0:
            raise ValueError(f"the {stack}'s inputs must hold at least one token per sequence ([batch, length] ids or "
                             f"[batch, length, d_model] embeddings), got shape {list(inputs_embeds.shape)}")
        key_positions = self.key_positions(past_length, inputs_embeds.size(1), draw, inputs_embeds.device)
        token_positions = self.token_positions(past_length, inputs_embeds, key_positions, position_ids,
                                               counted_positions)
        placed = {} if token_positions is None else {"positions": token_positions}
        hidden_states = self.positions.embed(inputs_embeds * self.embed_scale, past_length, **placed)
        if self.config.keep_absolute_positions:
            hidden_states = add_sinusoids(hidden_states, past_length, **placed,
                                          scale=self.config.absolute_positions_scale)
        return nn.functional.dropout(hidden_states, p=self.config.dropout, training=self.training), key_positions

    @staticmethod
    def token_positions(
        past_length: int, inputs_embeds: torch.Tensor, key_positions: torch.Tensor | None,
        position_ids: torch.Tensor | None, counted_positions: bool = False,
    ) -> torch.Tensor | None:
        """Where the embedding-level encodings place this call's n tokens: None for the ordinary past_length ..
        past_length + n - 1, else [n] or [B, n] positions. Token (b, i) is the sequence's token number
        `position_ids[b, i]` (transformers' causal-LM input, [B or 1, n], counted over the unpadded tokens in
        generate) instead of number past_length + i, and sits at that entry of `key_positions` when they are
        randomized: given ids are checked to index them (a host sync), but those the model counted itself
        (`counted_positions`, 0 .. n-1 by construction)."""
        if position_ids is None:
            return None if key_positions is None else key_positions[past_length:]
        batch_size, length = inputs_embeds.shape[:2]
        if (not torch.is_tensor(position_ids) or position_ids.dim() != 2 or position_ids.size(0) not in (1, batch_size)
                or position_ids.size(1) != length or position_ids.is_floating_point()
                or position_ids.dtype == torch.bool):
            given = (f"shape {list(position_ids.shape)} and dtype {position_ids.dtype}" if torch.is_tensor(position_ids)
                     else type(position_ids).__name__)
            raise ValueError(f"position_ids must be a [batch, length] tensor of integer positions, [{batch_size}, "
                             f"{length}] or [1, {length}], got {given}")
        position_ids = position_ids.to(inputs_embeds.device)
        if key_positions is None:
            return position_ids
        if not counted_positions:
            lowest, highest = (int(bound) for bound in torch.aminmax(position_ids))
            if lowest < 0 or highest >= key_positions.numel():
                raise ValueError(f"with randomized positions, position_ids must index the sequence's "
                                 f"{key_positions.numel()} positions (0 .. {key_positions.numel() - 1}), got {lowest} "
                                 f".. {highest}")
        return key_positions[position_ids]

    def key_positions(
        self, past_length: int, length: int, draw: PositionDraw | None, device: torch.device
    ) -> torch.Tensor | None:
        """The positions of the past_length + n keys: the first ones of `draw` when given; else None (the ordinary
        0 .. m-1) unless `position_randomization_max` is set and the stack is training (or
        `position_randomization_at_inference` is set), then a fresh sorted random subset of
        0 .. position_randomization_max - 1 (Ruoss et al. 2023)."""
        if draw is not None:
            return draw.first(past_length + length).to(device)
        if not self.randomizes_positions(draw):
            return None
        if past_length and not self.training:
            raise ValueError(
                "position_randomization_at_inference: a decoding step after cached positions must reuse the positions "
                "they were computed with; pass the decoder's positions for the whole output (decoder_positions="
                "PositionDraw(...), or positions= for the causal LM), as generate() does itself"
            )
        return random_positions(past_length + length, self.config.position_randomization_max, device=device)

    def randomizes_positions(self, draw: PositionDraw | None) -> bool:
        """Whether a call with `draw` places its tokens at randomized positions (`key_positions`)."""
        randomize = self.training or self.config.position_randomization_at_inference
        return draw is not None or (self.config.position_randomization_max is not None and randomize)

    def run_layers(
        self,
        hidden_states: torch.Tensor,
        self_mask: torch.Tensor | None,
        output_attentions: bool,
        output_hidden_states: bool,
        encoder_hidden_states: torch.Tensor | None = None,
        cross_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        query_offset: int | torch.Tensor = 0,
        memory: list[torch.Tensor] | None = None,
        key_positions: torch.Tensor | None = None,
        key_length: int | None = None,
        padded: bool = True,
    ) -> tuple[torch.Tensor, tuple | None, tuple | None, tuple | None, list[torch.Tensor]]:
        """Prepares the positions once (`PositionScheme.prepare`, its mask combined with `self_mask`; what the layers
        build from it is shared by the layers that are not checkpointed, and a second preparation, whose builds are
        kept by none, serves the checkpointed ones) and what the kernel reads once (`prepare_kernel`), then runs the
        layers. `key_length`: the self-attention keys (None: `query_offset` + n; a fixed-size cache's
        length, with `query_offset` a 0-dim tensor). `padded`: whether `self_mask` was built with padding or a
        window (False: causality alone, unless the scheme adds a mask). Returns the output, optional per-layer hidden
        states / attentions / cross-attentions, and the inputs of every layer (what Transformer-XL keeps as memory)."""
        query_length = hidden_states.size(1)
        if key_length is None:
            key_length = query_offset + query_length
        # a layer checkpointed by transformers (gradient_checkpointing) or wrapped by another module (torch's
        # checkpoint_wrapper, as FSDP's activation checkpointing applies it) may be recomputed in the backward pass:
        # it gets a context that keeps nothing it builds, the other layers one that they share
        shared = [not (torch.is_grad_enabled() and (
            not isinstance(layer, RelPosLayer) or (layer.gradient_checkpointing and layer.training)))
            for layer in self.layers]
        kernel_cache: dict = {}   # what the kernel reads once: from positions and masks only, for both
        contexts = {reuse: self.positions.prepare(PositionContext(
            query_length, key_length, query_offset, key_positions, hidden_states.device, hidden_states.dtype,
            reuse_across_layers=reuse, kernel_cache=kernel_cache,
        )) for reuse in dict.fromkeys(shared or [True])}
        position_context = next(iter(contexts.values()))
        self_mask = with_scheme_mask(self.config, self.positions, position_context, self_mask)
        prepare_kernel(self.config._attn_implementation, self_mask, position_context, hidden_states.size(0),
                       self.is_decoder, only_causality=not padded and not position_context.has_mask())
        all_hidden, all_self, all_cross, layer_inputs = [], [], [], []
        for idx, layer in enumerate(self.layers):
            layer_inputs.append(hidden_states)
            if output_hidden_states:
                all_hidden.append(hidden_states)
            hidden_states, self_weights, cross_weights = layer(
                hidden_states,
                self_mask,
                self.positions,
                encoder_hidden_states,
                cross_mask,
                output_attentions=output_attentions,
                memory=None if memory is None else memory[idx],
                position_context=contexts[shared[idx]],
                cache=cache,
            )
            all_self.append(self_weights)
            all_cross.append(cross_weights)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        if output_hidden_states:
            all_hidden.append(hidden_states)
        return (
            hidden_states,
            tuple(all_hidden) if output_hidden_states else None,
            tuple(all_self) if output_attentions else None,
            tuple(all_cross) if output_attentions and encoder_hidden_states is not None else None,
            layer_inputs,
        )


class RelPosEncoder(RelPosStack):
    def __init__(self, config: RelPosTransformerConfig):
        super().__init__(config, is_decoder=False, cross=False)

    def source_position_ids(self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None,
                            attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        """Where the embedding-level encodings (the scheme's `embed`, as `absolute`'s sinusoids, or
        `keep_absolute_positions`) place a padded batch's source tokens: counted over the tokens the mask keeps
        (cumsum - 1; padding at its index), so that a row padded on the left (a tokenizer with padding_side "left") is
        encoded as alone, as `place_decoder_prompt` places a left-padded decoder prompt; a right-padded row keeps
        every token's index, padding included (no host sync: torch.compile traces it in one graph). None (each token
        at its index) without a mask, with a mask of another shape (named by `check_padding_mask`), or for a scheme
        whose attention sees the same distances either way."""
        if (attention_mask is None or not adds_positions_to_embeddings(self.config, self.positions)
                or attention_mask.dim() != 2):
            return None
        inputs = input_ids if input_ids is not None else inputs_embeds
        if inputs is None or tuple(attention_mask.shape) != tuple(inputs.shape[:2]):
            return None
        index = torch.arange(attention_mask.size(-1), device=attention_mask.device).expand_as(attention_mask)
        return positions_over_mask(attention_mask, padding=index)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> BaseModelOutput | tuple:
        hidden_states, key_positions = self.embed(input_ids, inputs_embeds, past_length=0,
                                                  position_ids=self.source_position_ids(input_ids, inputs_embeds,
                                                                                        attention_mask),
                                                  counted_positions=True)
        batch_size, length = hidden_states.shape[:2]
        check_padding_mask("attention_mask", attention_mask, batch_size, length)
        self_mask = attention_mask_for(self.config, batch_size, length, length, 0, attention_mask, causal=False,
                                       device=hidden_states.device, window=self.config.self_attention_window)
        hidden_states, all_hidden, all_self, _, _ = self.run_layers(
            hidden_states, self_mask, *output_flags(self.config, output_attentions, output_hidden_states),
            key_positions=key_positions,
        )
        return BaseModelOutput(last_hidden_state=hidden_states, hidden_states=all_hidden, attentions=all_self)


def memory_length(config: RelPosTransformerConfig, mem_len: object) -> int:
    """The Transformer-XL memory length of a call: `mem_len`, or `config.mem_len` when None; one ValueError naming
    mem_len unless it is an integer >= 0."""
    mem_len = config.mem_len if mem_len is None else mem_len
    require_int("mem_len", mem_len, minimum=0)
    return mem_len


def check_memory(mems: list[torch.Tensor] | tuple[torch.Tensor, ...], num_layers: int, width: int) -> None:
    """Transformer-XL memory is one floating-point [batch, M, d_model] tensor per layer, with the same batch and M in
    every layer (each layer takes its memory in the dtype and on the device of its input, `memory_as_input`); anything
    else is one ValueError naming mems and the shapes or dtypes it got."""
    shapes = [list(memory.shape) if torch.is_tensor(memory) else type(memory).__name__ for memory in mems]
    first = shapes[0] if shapes else None
    if len(mems) != num_layers or not all(
            isinstance(shape, list) and len(shape) == 3 and shape[2] == width and shape[:2] == first[:2]
            for shape in shapes):
        raise ValueError(f"mems must hold one [batch, M, d_model={width}] tensor per layer ({num_layers}), with the "
                         f"same batch and M in every layer, got {shapes}")
    if not all(memory.is_floating_point() for memory in mems):
        raise ValueError(f"mems must be floating-point tensors (the layers' inputs), got dtype "
                         f"[{', '.join(str(memory.dtype) for memory in mems)}]")


def check_memory_without_kv_cache(cache: Cache | None, mems_given: bool, mem_len: int) -> None:
    """Memory and a KV cache are exclusive: the memory is the cache. A KV cache holding tokens holds their keys and
    values, not the layer inputs a memory is built from, so it continues neither with `mems` nor with `mem_len` > 0
    (whose memory would hold this call's tokens only, the cached ones forgotten from the next call on). One
    ValueError naming both and what continues each; the cache's fill level is read only where a memory is asked for
    (a fixed-size cache's, in a compiled step, is a tensor)."""
    if cache is None or not (mems_given or mem_len > 0):
        return
    cached_tokens = cache.get_seq_length()
    if cached_tokens:
        memory = "mems" if mems_given else f"mem_len={mem_len}"
        raise ValueError(f"a KV cache holding {cached_tokens} tokens cannot be continued with a Transformer-XL memory "
                         f"({memory}): the memory is the cache, and a KV cache holds no layer inputs to build one "
                         "from. Pass mem_len=0 to continue the KV cache, or mems without a cache to continue a memory")


def adds_positions_to_embeddings(config: RelPosTransformerConfig, scheme: PositionScheme) -> bool:
    """Whether a stack adds an encoding of each token's position to its embeddings (the scheme's own `embed`, as
    `absolute`'s sinusoids, or `keep_absolute_positions`): then where a token sits, not only its distances, counts."""
    return scheme.embeds_positions() or config.keep_absolute_positions


def positions_over_mask(mask: torch.Tensor, padding: torch.Tensor | int) -> torch.Tensor:
    """Each kept token's number among its row's kept tokens (cumsum - 1 over the nonzero entries of `mask` [B, n]);
    padding gets `padding` (a [B, n] tensor or a number). No host sync."""
    kept = mask.ne(0)
    return torch.where(kept, kept.long().cumsum(-1) - 1, padding)


def check_memory_positions(config: RelPosTransformerConfig, scheme: PositionScheme, mem_len: int) -> None:
    """Segment recurrence (`mem_len` > 0) needs positions relative to each query: an encoding added to the
    embeddings (a scheme's own `embed`, or `keep_absolute_positions`) would give every segment after the memory fills
    the same positions (Dai et al. 2019, sec. 3.3: temporal confusion). One ValueError naming both fields."""
    if mem_len > 0 and adds_positions_to_embeddings(config, scheme):
        added = ("keep_absolute_positions adds sinusoids" if config.keep_absolute_positions
                 else f"position_scheme {config.position_scheme!r} adds its positions")
        raise ValueError(f"mem_len {mem_len} (Transformer-XL segment memory) needs relative positions: {added} "
                         "to the embeddings, which the memory would repeat for every later segment; use a relative "
                         "scheme (e.g. 'xl') or mem_len 0")


def check_assisted_decoding(config: RelPosTransformerConfig, mem_len: int, drafting: bool) -> None:
    """Assisted decoding crops the cache of the main model and of its draft model back past the draft tokens the main
    model rejects, and calls the draft model's generate once per round. A Transformer-XL memory (`mem_len` > 0) has
    dropped its oldest states to hold the drafts, so it can neither decode nor draft; a draft model with
    `position_randomization_at_inference` would draw new positions each round for the keys its cache holds. One
    ValueError naming the field."""
    role = "draft for another model" if drafting else "decode with an assistant"
    if mem_len > 0:
        refusal = (f"a Transformer-XL memory (mem_len={mem_len}) drops its oldest states and cannot be cropped back past "
                   "rejected draft tokens. Set mem_len to 0 for a KV cache")
    elif drafting and config.position_randomization_at_inference:
        refusal = ("position_randomization_at_inference would draw new positions in each round for the keys its cache "
                   "holds. Set it to false in the draft model")
    else:
        return
    raise ValueError(f"this model cannot {role} in assisted decoding (assistant_model, prompt_lookup_num_tokens, "
                     f"assistant_early_exit): {refusal}")


def check_fixed_size_cache(config: RelPosTransformerConfig, scheme: PositionScheme, with_memory: bool,
                           randomized: bool) -> None:
    """What a fixed-size KV cache (transformers' StaticCache: `generate(..., cache_implementation="static")`) runs
    with, in one place: a scheme that declares it (`PositionScheme.takes_fixed_size_cache`), a kernel of
    `FIXED_SIZE_CACHE_KERNELS`, no Transformer-XL memory (`with_memory`: mem_len > 0 or mems given; the memory is
    generate's cache) and no randomized positions (`randomized`). One ValueError naming cache_implementation and the
    values it may take."""
    refusal = None
    kernel = config._attn_implementation or "eager"
    if not scheme.takes_fixed_size_cache:
        refusal = f"position_scheme {scheme.name!r} does not declare that it takes one (takes_fixed_size_cache)"
    elif with_memory:
        refusal = ("Transformer-XL segment memory (mem_len > 0, or mems) is the cache itself and drops its oldest "
                   "states; set mem_len to 0 for a KV cache")
    elif randomized:
        refusal = ("randomized positions (position_randomization_max in training, or "
                   "position_randomization_at_inference) place the cached keys at drawn positions, not at their slots")
    elif kernel not in FIXED_SIZE_CACHE_KERNELS:
        refusal = f"it runs with attn_implementation {list(FIXED_SIZE_CACHE_KERNELS)}, got {kernel!r}"
    if refusal is not None:
        raise ValueError(f"a fixed-size KV cache (cache_implementation 'static', transformers' StaticCache) is not "
                         f"supported here: {refusal}. Use cache_implementation None or 'dynamic' (the default "
                         "dynamic cache)")


def fixed_size_tokens(mask: torch.Tensor | None, query_offset: torch.Tensor, query_length: int) -> int:
    """The cached and new tokens a decoder `mask` wider than the n new ones must cover on a fixed-size cache
    (`check_padding_mask`'s `with_cache`): `query_offset` + n, the fill level read on the host; n where there is
    nothing to check (no mask, or one of the new tokens), and in a compiled step, which must not read the fill level
    (any width from n up is taken there, `fixed_size_padding`)."""
    if mask is None or mask.size(-1) == query_length or torch.compiler.is_compiling():
        return query_length
    return int(query_offset) + query_length


def fixed_size_padding(mask: torch.Tensor, query_length: int, cache_length: int,
                       query_offset: torch.Tensor) -> torch.Tensor:
    """A decoder's [B, w] 1/0 key mask over the `cache_length` slots of a fixed-size cache, by the dynamic cache's
    rule (`check_padding_mask`: its last columns count): its last column is the last query's slot `query_offset` +
    n - 1, so w = n covers this call's tokens and w >= `query_offset` + n the cached ones too (columns before slot 0
    ignored). The slots it does not cover are taken as tokens (1): past the queries causality masks them. A width
    between n and `query_offset` + n is refused before, as on the dynamic cache (`fixed_size_tokens`), except in a
    compiled step, which does not read the fill level on the host: there it covers the w slots that end with the last
    query's."""
    batch_size, width = mask.shape
    if width > cache_length:
        raise ValueError(f"the decoder's attention_mask must be a [batch, length] mask of at most the fixed-size "
                         f"cache's {cache_length} slots, got {list(mask.shape)}")
    columns = torch.arange(cache_length, device=mask.device) - (query_offset.to(mask.device) + query_length - width)
    covered = (columns >= 0) & (columns < width)
    taken = mask.gather(1, columns.clamp(0, width - 1).expand(batch_size, -1))
    return torch.where(covered, taken, torch.ones_like(taken))


def check_position_ids(scheme: PositionScheme, position_ids: torch.Tensor | None, attention_mask: torch.Tensor | None,
                       query_length: int) -> None:
    """`position_ids` place a stack's tokens for the embedding-level encodings (`RelPosStack.token_positions`); a
    scheme whose attention reads positions (`PositionScheme.attention_reads_positions`) reads each token's place in
    the sequence instead, which is the same only where the ids advance by one per token over each row's attended
    tokens of this call (the last n columns of `attention_mask`): a shift per row, as generate counts a left-padded
    prompt. Other ids are one ValueError, not ignored in silence. Not checked (no host read): a one-token call, ids
    continuing a row after cached tokens, a compiled call."""
    if (position_ids is None or query_length == 1 or not scheme.attention_reads_positions
            or torch.compiler.is_compiling()):
        return
    device = position_ids.device
    attended = (torch.ones(1, query_length, dtype=torch.bool, device=device) if attention_mask is None
                else attention_mask[:, -query_length:].to(device=device, dtype=torch.bool))
    shifts = position_ids - torch.arange(query_length, device=device)
    limit = torch.iinfo(shifts.dtype)
    uneven = (torch.where(attended, shifts, limit.min).amax(-1) > torch.where(attended, shifts, limit.max).amin(-1))
    if bool(uneven.any()):
        row = int(uneven.nonzero()[0, 0])
        raise ValueError(
            f"position_scheme {scheme.name!r} reads each token's place in the sequence in attention (cached tokens "
            "first), where position_ids do not reach: they are taken only as a shift of each row's tokens, advancing "
            "by one per attended token (as generate counts a left-padded prompt), got "
            f"{position_ids[row if position_ids.size(0) > 1 else 0].tolist()} in row {row}; leave position_ids out, "
            "or use a scheme that adds its positions to the embeddings (e.g. 'absolute')")


@dataclass
class RelPosDecoderOutput(BaseModelOutputWithPastAndCrossAttentions):
    """Decoder output plus `mems`: per layer, the last `mem_len` layer inputs, detached (Transformer-XL memory)."""

    mems: tuple[torch.Tensor, ...] | None = None


@dataclass
class RelPosCausalLMOutput(CausalLMOutputWithPast):
    """Causal LM output plus `mems` (Transformer-XL memory); in memory mode `mems` is also the generation cache."""

    mems: tuple[torch.Tensor, ...] | None = None


class RelPosDecoder(RelPosStack):
    """Causal decoder. With a KV cache (`cache`) or a Transformer-XL memory (`mems`, the detached inputs
    of every layer for the previous positions), queries start at position `past_length` and see every earlier key. A
    fixed-size cache (transformers' StaticCache, cache_implementation "static") keeps the token at position t in slot
    t: queries start at its fill level (read as a 0-dim tensor) and the keys are all its slots, those past each query
    masked (`check_fixed_size_cache` says what runs with it, `fixed_size_padding` how a decoder mask covers it)."""

    def __init__(self, config: RelPosTransformerConfig, cross: bool = True):
        super().__init__(config, is_decoder=True, cross=cross)

    def layers_drop_cache(self) -> bool:
        """Whether the layers run without a cache passed to them: transformers' GradientCheckpointingLayer drops it
        in a layer checkpointed in training with gradients enabled (the backward replays the layer)."""
        return torch.is_grad_enabled() and any(
            getattr(layer, "gradient_checkpointing", False) and layer.training for layer in self.layers)

    @deprecate_kwarg("past_key_values", "6.0.0", new_name="cache", raise_if_both_names=True)
    @deprecate_kwarg("positions", "6.0.0", new_name="draw", raise_if_both_names=True)
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        mems: list[torch.Tensor] | tuple[torch.Tensor, ...] | None = None,
        mem_len: int | None = None,
        draw: PositionDraw | None = None,
        position_ids: torch.LongTensor | None = None,
        **kwargs,
    ) -> RelPosDecoderOutput | tuple:
        """`mem_len` (default `config.mem_len`) > 0 returns new `mems`; a longer one at evaluation than in training
        is allowed (Dai et al. 2019, sec. 4). Memory and a KV cache are exclusive: the memory is the cache.
        `use_cache` None takes `config.use_cache` (`cache_flag`, as Marian's decoder), so a cache this call fills is
        returned; with memory none; with gradient checkpointing in training none whatever `use_cache` says, and a
        cache passed is not used (`layers_drop_cache`; Marian's decoder likewise sets use_cache to False).
        `draw`: the positions of the whole output, of which this call's tokens take entries past_length ..
        past_length + n - 1 (None: see `RelPosStack.key_positions`). `position_ids`: see `RelPosStack.token_positions`."""
        mem_len = memory_length(self.config, mem_len)
        if self.layers_drop_cache():   # the keys are this call's tokens only, not a cache's slots
            cache, use_cache = None, False
        elif use_cache is None:
            use_cache = mem_len == 0 and cache_flag(self.config, None)
        check_memory_positions(self.config, self.positions, mem_len)
        if encoder_hidden_states is not None and cache is not None and not isinstance(cache, EncoderDecoderCache):
            # a bare cache given to the translation model holds the self-attention; the encoder's keys get their own
            cache = EncoderDecoderCache(cache, DynamicCache(config=self.config))
        fixed_size = cache is not None and cache.is_compileable
        if fixed_size:
            check_fixed_size_cache(self.config, self.positions, mem_len > 0 or mems is not None,
                                   self.randomizes_positions(draw))
        check_memory_without_kv_cache(cache, mems is not None, mem_len)
        if mems is not None:
            check_memory(mems, len(self.layers), self.config.d_model)
            cache = None
        elif use_cache and cache is None:
            cache = (
                EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
                if encoder_hidden_states is not None
                else DynamicCache(config=self.config)
            )
        if fixed_size:   # the fill level as a tensor (the layers' updates advance the cache's own in place)
            self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
            past_length = torch.as_tensor(self_cache.get_seq_length(), device=self.embed_tokens.weight.device).clone()
        else:
            past_length = cache.get_seq_length() if cache is not None else 0
            past_length += mems[0].size(1) if mems is not None else 0
        hidden_states, key_positions = self.embed(input_ids, inputs_embeds, past_length, draw, position_ids)
        batch_size, query_length = hidden_states.shape[:2]
        key_length = self_cache.get_max_length() if fixed_size else past_length + query_length
        if mems is not None and mems[0].size(0) != batch_size:
            raise ValueError(f"mems hold a batch of {mems[0].size(0)} sequences, the input {batch_size}")
        covered = fixed_size_tokens(attention_mask, past_length, query_length) if fixed_size else key_length
        check_padding_mask("the decoder's attention_mask", attention_mask, batch_size, query_length, with_cache=covered)
        check_position_ids(self.positions, position_ids, attention_mask, query_length)
        if mems is not None and attention_mask is not None and attention_mask.size(1) < key_length:
            raise ValueError(f"with mems the decoder's attention_mask must cover the memory and the input (the memory "
                             f"may hold padding): [{batch_size}, {key_length}] ({key_length - query_length} memory + "
                             f"{query_length} input) or wider, got {list(attention_mask.shape)}")
        if attention_mask is not None and fixed_size:
            attention_mask = fixed_size_padding(attention_mask, query_length, key_length, past_length)
        elif attention_mask is not None and attention_mask.size(1) != key_length:
            if attention_mask.size(1) == query_length:
                attention_mask = torch.cat([attention_mask.new_ones(attention_mask.size(0), past_length), attention_mask], 1)
            else:
                attention_mask = attention_mask[:, -key_length:]
        device = hidden_states.device
        self_mask = attention_mask_for(self.config, batch_size, query_length, key_length, past_length, attention_mask,
                                       causal=True, device=device, window=self.config.self_attention_window)
        cross_mask = None
        if encoder_hidden_states is not None:
            if encoder_hidden_states.size(0) != batch_size:
                raise ValueError(f"the decoder's batch ({batch_size}) and the encoder output's "
                                 f"({encoder_hidden_states.size(0)}) must be the same size")
            check_padding_mask("encoder_attention_mask", encoder_attention_mask, batch_size,
                               encoder_hidden_states.size(1))
            cross_mask = attention_mask_for(self.config, batch_size, query_length, encoder_hidden_states.size(1), 0,
                                            encoder_attention_mask, causal=False, device=device)
        hidden_states, all_hidden, all_self, all_cross, layer_inputs = self.run_layers(
            hidden_states,
            self_mask,
            *output_flags(self.config, output_attentions, output_hidden_states),
            encoder_hidden_states=encoder_hidden_states,
            cross_mask=cross_mask,
            cache=cache,
            query_offset=past_length,
            memory=mems,
            key_positions=key_positions,
            key_length=key_length,
            padded=attention_mask is not None or self.config.self_attention_window is not None,
        )
        new_mems = None
        if mem_len > 0:
            previous = mems if mems is not None else [None] * len(layer_inputs)
            new_mems = tuple(
                (layer_input if old is None else torch.cat([memory_as_input(old, layer_input), layer_input], 1))
                [:, -mem_len:].detach()
                for old, layer_input in zip(previous, layer_inputs, strict=True)
            )
        return RelPosDecoderOutput(
            last_hidden_state=hidden_states,
            hidden_states=all_hidden,
            attentions=all_self,
            cross_attentions=all_cross,
            mems=new_mems,
            cache=cache if use_cache else None,
        )


def places_module(key: str, name: str) -> bool:
    """Whether the `device_map` entry `key` places the module `name`: the entry is the module or one holding it."""
    return not key or name == key or name.startswith(f"{key}.")


def check_schemes_placed(model: nn.Module) -> None:
    """One ValueError for a `device_map` the position schemes cannot run under:

    - a scheme with parameters offloaded (accelerate leaves them on the meta device and loads them only for the
      module's own forward): the attention layers read a scheme's parameters outside its forward, so they would stay
      unloaded (`Cannot copy out of meta tensor`);
    - a stack's layers, or its scheme, run on more than one device: every layer reads the position context its
      stack's scheme builds once per call on the scheme's device (index tables, masks, angles, and the scheme's
      parameters), which accelerate's hooks do not move. A module runs on its map entry's device, or for one
      offloaded ("cpu", "disk") beside accelerators the first of those, as `accelerate.dispatch_model` has it.

    Every scheme is checked for the first before any for the second."""
    device_map = getattr(model, "hf_device_map", None)
    if not device_map:
        return
    schemes = [(name, module) for name, module in model.named_modules() if isinstance(module, PositionScheme)]
    for name, module in schemes:
        if any(parameter.is_meta for parameter in module.parameters()):
            placed = max(((key, device) for key, device in device_map.items() if places_module(key, name)),
                         key=lambda entry: len(entry[0]))[1]
            raise ValueError(
                f"device_map puts {name} (position_scheme {model.config.position_scheme!r}) on {placed!r}: the "
                "attention layers read a scheme's parameters outside its forward, where accelerate never loads an "
                f"offloaded module's weights; give {name} a device in device_map (the layers may stay offloaded) or "
                "raise max_memory")
    accelerators = [device for device in device_map.values() if device not in ("cpu", "disk")]
    main_device = accelerators[0] if accelerators else "cpu"

    def runs_on(device: int | str) -> int | str:
        return main_device if device in ("cpu", "disk") else device

    for name, _ in schemes:
        stack = name.rpartition(".")[0]
        parts = (name, f"{stack}.layers")   # the scheme and every layer of its stack, or a module holding them
        devices = {runs_on(device) for key, device in device_map.items()
                   if any(places_module(key, part) or key.startswith(f"{part}.") for part in parts)}
        if len(devices) > 1:
            raise ValueError(
                f"device_map runs the layers of {stack} and its position scheme ({name}) on more than one device "
                f"({', '.join(map(repr, sorted(devices, key=str)))}): every layer reads the positions the scheme "
                f"builds on its device, which accelerate does not move; give {stack} one device (e.g. a device_map "
                "of whole stacks: model.encoder on one GPU, model.decoder on another)")


class RelPosTransformerPreTrainedModel(PreTrainedModel):
    config: RelPosTransformerConfig
    config_class = RelPosTransformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_flash_attn = True  # for schemes that add nothing to attention (RelPosAttention checks)
    # A forward (training, or a decoding step on a fixed-size cache) traces as one graph on eager and sdpa for every
    # built-in scheme (tests/test_static_cache.py); relpos_triton's padding check reads the mask on the host.
    _can_compile_fullgraph = True
    _no_split_modules = ["RelPosLayer"]

    remote_auto_classes: dict[str, str] = {}

    def __init__(self, config: RelPosTransformerConfig, *inputs, **kwargs) -> None:
        """Validates `config` again (`RelPosTransformerConfig._validate_relpos`): its fields may have been set after
        it was built, and a bad value would otherwise fail deep inside a layer's construction or forward pass. An
        unknown `attn_implementation` is `check_kernel_name`'s error, which lists hf_relpos' kernels too (transformers'
        own lists only its built-in ones)."""
        config._validate_relpos()
        if isinstance(config._attn_implementation, str):
            check_kernel_name(config._attn_implementation)
        super().__init__(config, *inputs, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *model_args,
                        allow_missing_weights: bool = False,
                        **kwargs) -> PreTrainedModel | tuple[PreTrainedModel, dict]:
        """`PreTrainedModel.from_pretrained`, reading safetensors only, that raises instead of filling weights missing
        from the folder with random values (transformers only warns). `allow_missing_weights=True` restores the
        default, e.g. to start a new head from an encoder-decoder checkpoint."""
        kwargs.setdefault("use_safetensors", True)
        return_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(
            pretrained_model_name_or_path, *model_args, output_loading_info=True, **kwargs
        )
        missing = sorted(info["missing_keys"])
        if missing and not allow_missing_weights:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise ValueError(
                f"{pretrained_model_name_or_path} lacks {len(missing)} weight(s) of {cls.__name__} ({shown}): an "
                "incomplete or foreign checkpoint would load with random weights. Pass allow_missing_weights=True "
                "to initialise them on purpose."
            )
        check_schemes_placed(model)
        return (model, info) if return_info else model

    def save_pretrained(self, save_directory: str | os.PathLike, *args, **kwargs) -> None:
        """Records every Auto class this checkpoint loads into (HF records only the saved class) in `auto_map`, so
        `AutoModel` and the head's Auto class both work with `trust_remote_code=True` alone. A pipeline the config
        declares (`custom_pipelines`) stays declared only where its code file is in `save_directory`: the model
        does not write that file, and a declaration without it breaks `pipeline(..., trust_remote_code=True)`. A
        config that its own checks refuse (`RelPosTransformerConfig.validate`: a field set to a bad value after the
        model was built) writes nothing."""
        self.config.validate()
        auto_map = dict(getattr(self.config, "auto_map", None) or {})
        for auto_class, model_class in self.remote_auto_classes.items():
            auto_map.setdefault(auto_class, f"modeling_relpos.{model_class}")
        self.config.auto_map = auto_map
        if getattr(self, "generation_config", None) is not None:
            keep_relative_limit(self.generation_config)
        declared = getattr(self.config, "custom_pipelines", None)
        if declared:
            shipped = {task: entry for task, entry in declared.items()
                       if os.path.isfile(os.path.join(save_directory, entry["impl"].rpartition(".")[0] + ".py"))}
            if shipped:
                self.config.custom_pipelines = shipped
            else:
                del self.config.custom_pipelines
        try:
            return super().save_pretrained(save_directory, *args, **kwargs)
        finally:
            if declared:
                self.config.custom_pipelines = declared

    def _valid_auto_compile_criteria(self, model_kwargs: dict, generation_config: GenerationConfig) -> bool:
        """Whether `generate` compiles its decoding step (on CUDA with a static cache): as transformers decides,
        except on a kernel of `HOST_OFFSET_KERNELS` (relpos_triton), which reads the fill level on the host, so a
        compiled step would recompile at every step: that decodes uncompiled, with a warning naming sdpa."""
        compiles = super()._valid_auto_compile_criteria(model_kwargs, generation_config)
        if compiles and self.config._attn_implementation in HOST_OFFSET_KERNELS:
            logger.warning_once(
                f"generate does not compile the decoding step on attn_implementation "
                f"{self.config._attn_implementation!r}: it reads the static cache's fill level on the host, so a "
                "compiled step would recompile at every step; for compiled decoding use "
                "model.set_attn_implementation('sdpa')")
            return False
        return compiles

    @staticmethod
    def create_masks_for_generate(attention_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor | None:
        """The hook by which `generate` turns the 2-D attention mask into the kernel's 4-D mask for a fixed-size
        cache (transformers' `masking_utils.create_masks_for_generate`): here the mask passes unchanged, since the
        decoder builds its masks itself, over the cache's slots and with the scheme's mask (`fixed_size_padding`,
        `attention_mask_for`)."""
        return attention_mask

    @classmethod
    def _can_set_attn_implementation(cls) -> bool:
        """Every attention call reads `config._attn_implementation`, so `set_attn_implementation` works at any time."""
        return True

    def post_init(self) -> None:
        """transformers' post_init, then `check_kernel`: a kernel that cannot run this model is refused when the
        model is built (or loaded), not at its first forward pass. The tied targets join `_keys_to_ignore_on_save`:
        `save_pretrained` leaves them out anyway (each tied weight is saved once, under its source), and the
        `Trainer`, resuming from a checkpoint that lacks exactly those, ties them again instead of warning that they
        are missing (as it does for Marian and BART: huggingface/transformers#29128)."""
        super().post_init()
        self._keys_to_ignore_on_save.update(self.all_tied_weights_keys)
        check_kernel(self.config, self.config._attn_implementation)

    def init_continuous_batching(self, *args, **kwargs) -> NoReturn:
        """Refuses transformers' continuous batching, which `generate_batch` and `continuous_batching_context_manager`
        start here too: it packs the requests into one sequence on a `PagedAttentionCache`, whose slots this model's
        attention (its scheme's positions, its masks, its cache reads) does not take. One NotImplementedError, before
        any request is queued (else every request failed with an AttributeError from inside the decoder)."""
        raise NotImplementedError(
            f"continuous batching (generate_batch, init_continuous_batching, continuous_batching_context_manager) is "
            f"not supported by {type(self).__name__}: its attention does not read transformers' PagedAttentionCache; "
            "use generate on a padded batch")

    def set_attn_implementation(self, attn_implementation: str | dict, allow_all_kernels: bool = False) -> None:
        """transformers' `set_attn_implementation`, refusing (before any change) a kernel that cannot run this
        model (`check_kernel`)."""
        requested = (attn_implementation if not isinstance(attn_implementation, dict)
                     else attn_implementation.get("", self.config._attn_implementation))
        check_kernel(self.config, requested)
        super().set_attn_implementation(attn_implementation, allow_all_kernels=allow_all_kernels)

    def _initialize_weights(self, module: nn.Module, is_custom_code: bool = False) -> None:
        """transformers' rule, except that a position scheme is initialised (`_init_weights`, its `init_parameters`)
        while any of its parameters, those of its submodules included, is not: for custom code transformers skips a
        module whose own parameters (recurse=False) are all initialised, which a scheme keeping every parameter in
        submodules (T5's nn.Embedding) always is, so its init never ran. A scheme whose parameters were all loaded is
        still skipped (its init may write them in place)."""
        if is_custom_code and isinstance(module, PositionScheme) and any(
                not getattr(parameter, "_is_hf_initialized", False) for parameter in module.parameters()):
            is_custom_code = False
        super()._initialize_weights(module, is_custom_code)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """HF defaults (N(0, init_std) linears, unit LayerNorms), token embeddings N(0, embedding_init_std) or, when
        that is null, N(0, d_model^-0.5) as in Vaswani et al./fairseq (scaled embeddings and tied logits start at
        unit scale), and each position scheme's own parameters. An output layer whose weight is the tied token
        embeddings (`model.apply(model._init_weights)` on a built model) is left to the embeddings' rule, not drawn
        again over them as a linear."""
        input_embeddings = self.get_input_embeddings()
        if (module is self.get_output_embeddings() and input_embeddings is not None
                and module.weight is input_embeddings.weight):
            return
        if isinstance(module, nn.Embedding):
            embedding_std = self.config.embedding_init_std
            init.normal_(module.weight, mean=0.0, std=self.config.d_model**-0.5 if embedding_std is None else embedding_std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        else:
            super()._init_weights(module)
        if isinstance(module, PositionScheme):
            # While a model loads, a scheme with a weight the checkpoint lacks or a non-persistent buffer (which
            # transformers leaves uninitialised) is initialised too: its parameters and persistent buffers that were
            # loaded keep their values, also where init_parameters writes in place (fill_, copy_) rather than
            # through the guarded torch.nn.init / transformers.initialization functions
            loaded = [(tensor, tensor.detach().clone()) for tensor in (*module.parameters(), *module.buffers())
                      if getattr(tensor, "_is_hf_initialized", False)]
            module.init_parameters(self.config.init_std)
            for tensor, value in loaded:
                tensor.copy_(value)
        if isinstance(getattr(module, "final_logits_bias", None), torch.Tensor):
            init.zeros_(module.final_logits_bias)


def check_encoder_decoder_config(config: RelPosTransformerConfig) -> None:
    """What the encoder-decoder classes refuse in a config a causal LM takes, in one ValueError naming the field."""
    if not config.is_encoder_decoder:
        raise ValueError("is_encoder_decoder is false: this is a causal LM's config (RelPosTransformerForCausalLM "
                         "saves it so); build or load it with RelPosTransformerForCausalLM, or set is_encoder_decoder "
                         "true for an encoder-decoder")
    if config.mem_len > 0:
        raise ValueError(f"mem_len must be 0 for the encoder-decoder, got {config.mem_len}: Transformer-XL segment "
                         "memory is RelPosTransformerForCausalLM's")
    if config.decoder_layers == 0:
        raise ValueError("decoder_layers must be at least 1 for the encoder-decoder, got 0: only a decoder layer's "
                         "cross-attention reads the source")


class RelPosTransformerModel(RelPosTransformerPreTrainedModel):
    """Encoder-decoder without a head; with `tie_word_embeddings` both stacks share `shared` (a joint vocabulary),
    without it each stack has its own embeddings (and there is no `shared`, as in Marian)."""

    remote_auto_classes = {
        "AutoModel": "RelPosTransformerModel",
        "AutoModelForSeq2SeqLM": "RelPosTransformerForConditionalGeneration",
    }
    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }

    def __init__(self, config: RelPosTransformerConfig):
        super().__init__(config)
        check_encoder_decoder_config(config)
        tied = config.tie_word_embeddings
        self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id) if tied else None
        if not tied:   # untied checkpoints of earlier versions hold a `shared` matrix that no stack read
            self._keys_to_ignore_on_load_unexpected = [r"(^|\.)shared\.weight$"]
        self.encoder = RelPosEncoder(config)
        self.decoder = RelPosDecoder(config)
        self.post_init()
        if tied:   # after post_init (which ties the weights), so that a seed still draws the weights it drew before
            self.share_embedding_module()

    def share_embedding_module(self) -> None:
        """Tied, both stacks call `shared` itself (one module, as `set_input_embeddings` keeps it), not modules of
        their own that hold its weight: FSDP2 as accelerate applies it shards `shared` with lm_head and refuses the
        weight seen again under another module ('shared with a parameter already managed by another FSDP group')."""
        self.encoder.embed_tokens = self.decoder.embed_tokens = self.shared

    def get_input_embeddings(self) -> nn.Embedding:
        """`shared`, or untied the encoder's embeddings (Marian's choice); the decoder's are
        `decoder.embed_tokens`."""
        return self.encoder.embed_tokens if self.shared is None else self.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        """Tied: `shared` and both stacks' embeddings; untied: the encoder's only."""
        self.encoder.embed_tokens = value
        if self.shared is not None:
            self.shared = value
            self.decoder.embed_tokens = value

    def resize_token_embeddings(self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                                mean_resizing: bool = True) -> nn.Embedding:
        """`PreTrainedModel.resize_token_embeddings`, with the untied decoder's embeddings resized alike (one joint
        vocabulary)."""
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        self.decoder_embeddings_follow(embeddings.weight.size(0), mean_resizing)
        return embeddings

    def decoder_embeddings_follow(self, vocab_size: int, mean_resizing: bool = True) -> None:
        """Untied decoder embeddings resized to `vocab_size` (the joint vocabulary's), the rows kept unchanged."""
        if self.decoder.embed_tokens.weight.size(0) != vocab_size:
            self.decoder.embed_tokens = self._get_resized_embeddings(self.decoder.embed_tokens, vocab_size,
                                                                     mean_resizing=mean_resizing)

    @deprecate_kwarg("past_key_values", "6.0.0", new_name="cache", raise_if_both_names=True)
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        decoder_positions: PositionDraw | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
        **kwargs,
    ) -> Seq2SeqModelOutput | tuple:
        """`decoder_positions`: the decoder's positions for the whole output (`PositionDraw`; None: drawn or ordinary,
        see `RelPosStack.key_positions`); `decoder_position_ids` [B or 1, n] (transformers' name, which generate
        extends step by step): the decoder's `position_ids` (`RelPosStack.token_positions`, `check_position_ids`)."""
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                inputs_embeds=inputs_embeds,
                output_attentions=output_attentions,
                output_hidden_states=output_hidden_states,
                return_dict=True,
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        if (decoder_input_ids is None) == (decoder_inputs_embeds is None):
            raise ValueError(
                "Pass exactly one of decoder_input_ids and decoder_inputs_embeds, or labels to the "
                "ForConditionalGeneration model (which shifts them right into decoder_input_ids). A Trainer that takes "
                "the labels out of the batch (label smoothing) needs decoder_input_ids in it: "
                "DataCollatorForSeq2Seq(tokenizer, model=model) adds them")
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=cache_flag(self.config, use_cache),
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            mem_len=0,   # no segment memory here (check_encoder_decoder_config), whatever config.mem_len became
            draw=decoder_positions,
            position_ids=decoder_position_ids,
            return_dict=True,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
            cache=decoder_outputs.cache,
        )


class RelPosTransformerForConditionalGeneration(RelPosTransformerPreTrainedModel, GenerationMixin):
    """Encoder-decoder with a language-model head for translation; `labels` -> cross-entropy loss (-100 ignored)."""

    remote_auto_classes = {
        "AutoModel": "RelPosTransformerModel",
        "AutoModelForSeq2SeqLM": "RelPosTransformerForConditionalGeneration",
    }
    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}
    _keys_to_ignore_on_load_missing = ["final_logits_bias"]  # a checkpoint without it loads it as zeros
    accepts_loss_kwargs = True  # the loss honours the Trainer's num_items_in_batch

    def __init__(self, config: RelPosTransformerConfig):
        super().__init__(config)
        self.model = RelPosTransformerModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.register_buffer("final_logits_bias", torch.zeros(1, config.vocab_size))  # Marian/BART's logit bias
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def resize_token_embeddings(self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                                mean_resizing: bool = True) -> nn.Embedding:
        """`PreTrainedModel.resize_token_embeddings` (the input embeddings and, untied, the output layer), with the
        untied decoder embeddings (the vocabulary is joint) and `final_logits_bias` cut or extended alike; the
        rows kept are unchanged."""
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        new_size = embeddings.weight.size(0)
        self.model.decoder_embeddings_follow(new_size, mean_resizing)
        old_bias = self.final_logits_bias
        new_bias = old_bias.new_zeros(1, new_size)
        new_bias[:, : min(new_size, old_bias.size(1))] = old_bias[:, :new_size]
        self.register_buffer("final_logits_bias", new_bias)
        return embeddings

    @deprecate_kwarg("past_key_values", "6.0.0", new_name="cache", raise_if_both_names=True)
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
        decoder_positions: PositionDraw | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput | tuple:
        """`labels` [B, T] (-100 ignored) give the loss; `num_items_in_batch` (passed by the Trainer) is the number of
        labelled tokens in the whole optimizer step, see `token_cross_entropy`; `decoder_positions` and
        `decoder_position_ids` as in `RelPosTransformerModel.forward`."""
        if labels is not None:
            decoder_inputs = decoder_input_ids if decoder_input_ids is not None else decoder_inputs_embeds
            check_labels(labels, None if decoder_inputs is None else decoder_inputs.shape[:2], "the decoder's inputs")
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = shift_tokens_right(
                    labels, self.config.pad_token_id, self.config.decoder_start_token_id
                )
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            decoder_positions=decoder_positions,
            decoder_position_ids=decoder_position_ids,
            return_dict=True,
        )
        logits = self.lm_head(outputs.last_hidden_state) + self.final_logits_bias
        loss = None
        if labels is not None:
            loss = token_cross_entropy(logits, labels, num_items_in_batch)
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
            cache=outputs.cache,
        )

    def generate(self, *args, **kwargs) -> GenerateOutput | torch.LongTensor:
        """`GenerationMixin.generate`, refusing a beam narrower than 1 or wider than the vocabulary
        (`check_num_beams`); a decoder prompt given with its `decoder_attention_mask` gets positions counted over its
        tokens (`place_decoder_prompt`: a left-padded row decodes as without its padding); with `max_len_b` set (in
        the generation config, or passed with `max_len_a`) each row's output is capped relative to its source
        (`generation_limits`); with `position_randomization_at_inference` it then draws the decoder's positions for
        the whole output unless `decoder_positions` is given, and drafting for another model's assisted decoding it
        drops that model's (`set_output_positions`)."""
        if len(args) > len(GENERATE_ARGUMENTS):
            raise TypeError(f"generate takes at most {len(GENERATE_ARGUMENTS)} positional arguments "
                            f"({', '.join(GENERATE_ARGUMENTS)}), got {len(args)}")
        kwargs.update(zip(GENERATE_ARGUMENTS, args, strict=False))
        generation_config = kwargs.get("generation_config") or self.generation_config
        num_beams = kwargs.get("num_beams")
        check_num_beams((generation_config.num_beams or 1) if num_beams is None else num_beams, self.config.vocab_size)
        decoder_input_ids = kwargs.get("decoder_input_ids")
        prompt_length = 1 if decoder_input_ids is None else decoder_input_ids.size(-1)
        place_decoder_prompt(self, kwargs)
        warn_of_unmasked_padding(self, kwargs)
        capped = cap_by_source_length(self, prompt_length, kwargs)
        set_output_positions(self, kwargs, "decoder_positions", prompt_length, mem_len=0)
        if not capped:
            return super().generate(**kwargs)
        # The cap's max_new_tokens already holds the saved max_length (a ceiling of the cap); transformers would warn
        # at every call that both are set (Seq2SeqTrainer's evaluation writes max_length 20 into the model's
        # generation config, and the model is saved with it). Marked for this call's context only
        # (_prepare_generated_length): the model's generation config, which other threads read, is left alone.
        token = SOURCE_CAPPED_CALL.set(self)
        try:
            return super().generate(**kwargs)
        finally:
            SOURCE_CAPPED_CALL.reset(token)

    def _prepare_generated_length(self, generation_config, has_default_max_length, *args, **kwargs):
        """`GenerationMixin._prepare_generated_length`; in a call that `cap_by_source_length` capped, a saved
        `max_length` counts as a default, folded into the cap's `max_new_tokens` (no warning that both are set)."""
        if SOURCE_CAPPED_CALL.get() is self:
            has_default_max_length = True
        return super()._prepare_generated_length(generation_config, has_default_max_length, *args, **kwargs)

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def new_token_limits(self, inputs: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                         prompt_length: int = 1, **generate_kwargs) -> torch.Tensor | None:
        """Per source row, the most new tokens `generate(inputs, attention_mask=..., **generate_kwargs)` lets it
        produce: min(floor(max_len_a * |x_i| + max_len_b), max_new_tokens) (`generation_limits`), |x_i| the row's
        tokens without padding; None when max_len_b is unset (the batch-wide max_new_tokens alone caps)."""
        config = length_config(self, generate_kwargs)
        limit = relative_limit(config)
        if limit is None:
            return None
        pad_token_id, eos_token_id = generate_special_ids(self, generate_kwargs)
        if eos_token_id is None:
            raise ValueError("max_len_b caps each output by ending it with the end token: set eos_token_id")
        encoder_outputs = generate_kwargs.get("encoder_outputs")
        embedded = generate_kwargs.get("inputs_embeds")
        if embedded is None and encoder_outputs is not None:
            embedded = encoder_outputs[0]
        lengths = source_lengths(inputs if inputs is not None else generate_kwargs.get("input_ids"), attention_mask,
                                 pad_token_id, embedded)
        return new_token_limits(lengths, *limit, longest_new_output(config, prompt_length))


def generate_special_ids(model: PreTrainedModel, generate_kwargs: dict) -> tuple[int | None, int | list[int] | None]:
    """pad_token_id and eos_token_id as `generate(**generate_kwargs)` resolves them: the keyword argument, else the
    generation config's (the one passed, else the model's), else the model config's."""
    config = generate_kwargs.get("generation_config") or model.generation_config
    resolved = []
    for name in ("pad_token_id", "eos_token_id"):
        value = generate_kwargs.get(name)
        value = getattr(config, name, None) if value is None else value
        resolved.append(getattr(model.config, name, None) if value is None else value)
    return resolved[0], resolved[1]


def warn_of_unmasked_padding(model: RelPosTransformerForConditionalGeneration, generate_kwargs: dict) -> None:
    """Warn (once) when `generate` gets source ids that hold the pad token without an `attention_mask`: transformers 5
    infers no mask for an encoder-decoder model (4 did, from pad_token_id), so the encoder attends to the padding and a
    row's translation depends on the rest of the batch, while the source-relative cap counts the row's tokens without
    it (`source_lengths`). Not where pad_token_id is unset or is the end token (no padding to tell apart)."""
    ids = generate_kwargs.get("input_ids")
    ids = generate_kwargs.get("inputs") if ids is None else ids
    if generate_kwargs.get("attention_mask") is not None or not torch.is_tensor(ids) or not is_token_id_matrix(ids):
        return
    pad, end = generate_special_ids(model, generate_kwargs)
    if pad is None or pad in (end if isinstance(end, list) else [end]) or not bool((ids == pad).any()):
        return
    logger.warning_once(f"generate: input_ids hold the pad token (pad_token_id {pad}) and no attention_mask was "
                        "passed, so the encoder attends to the padding and each row's translation depends on the rest "
                        "of the batch (transformers 5 infers no mask for an encoder-decoder model); pass the "
                        "tokenizer's attention_mask")


def place_decoder_prompt(model: RelPosTransformerForConditionalGeneration, generate_kwargs: dict) -> None:
    """A decoder prompt given with a `decoder_attention_mask` that pads it (target prefixes of different lengths,
    left-padded) gets `decoder_position_ids` counted over the tokens the mask keeps (cumsum - 1, 0 on padding), as
    transformers' generate gives a causal LM's prompt its `position_ids`; generate extends them step by step. Only
    where the decoder has an embedding-level encoding (its scheme's `embed`, or `keep_absolute_positions`), which
    without these ids places each row after its padding (as Marian does) and with them as without it; attention that
    reads positions sees the same distances either way, and an unpadded prompt has the positions it gets (none is
    passed: a draft model of assisted decoding that takes no `decoder_position_ids` still runs). Ids passed, and a
    mask of another shape than the prompt's (the decoder's mask check names it), are left alone."""
    prompt, mask = generate_kwargs.get("decoder_input_ids"), generate_kwargs.get("decoder_attention_mask")
    if (not torch.is_tensor(prompt) or not torch.is_tensor(mask) or mask.shape != prompt.shape
            or generate_kwargs.get("decoder_position_ids") is not None):
        return
    if not adds_positions_to_embeddings(model.config, model.model.decoder.positions) or bool(mask.all()):
        return
    generate_kwargs["decoder_position_ids"] = positions_over_mask(mask, padding=0)


def set_output_positions(model: PreTrainedModel, generate_kwargs: dict, positions_argument: str, prompt_length: int,
                         mem_len: int) -> None:
    """The positions `generate(**generate_kwargs)` decodes at, in `generate_kwargs[positions_argument]`. Drafting for
    another model's assisted decoding (transformers passes a generation config marked `is_assistant`): refused where
    it cannot draft (`check_assisted_decoding`), and the main model's drawn positions are dropped. Then, with
    `position_randomization_at_inference` and none given, one draw for the whole output (`draw_output_positions`);
    not with a Transformer-XL memory (`mem_len` > 0), which drops its oldest positions."""
    if getattr(generate_kwargs.get("generation_config") or model.generation_config, "is_assistant", False):
        check_assisted_decoding(model.config, mem_len, drafting=True)
        generate_kwargs.pop(positions_argument, None)
    if model.config.position_randomization_at_inference and generate_kwargs.get(positions_argument) is None:
        if mem_len > 0:
            raise ValueError("position_randomization_at_inference does not work with a Transformer-XL memory "
                             f"(mem_len={mem_len}) in generate: set mem_len to 0")
        generate_kwargs[positions_argument] = draw_output_positions(model, prompt_length, generate_kwargs)


def draw_output_positions(model: PreTrainedModel, prompt_length: int, generate_kwargs: dict) -> PositionDraw:
    """One sorted random subset of 0 .. position_randomization_max - 1 (Ruoss et al. 2023) for the longest sequence
    that `generate(**generate_kwargs)` may produce: the prompt plus `max_new_tokens`, else `max_length` (as
    transformers resolves them). Every decoding step reads its first entries, so a shorter output sits at the first
    positions of this draw."""
    length = prompt_length + longest_new_output(length_config(model, generate_kwargs), prompt_length)
    position_range = model.config.position_randomization_max
    if length > position_range:
        raise ValueError(f"position_randomization_max ({position_range}) must be at least the longest output generate "
                         f"may produce ({length} tokens): raise it or lower max_new_tokens / max_length")
    return PositionDraw(random_positions(length, position_range, device=model.device))


# The generation fields besides max_length that `length_config` merges.
LENGTH_FIELDS = ("max_new_tokens", "min_new_tokens", "min_length", *RELATIVE_LIMIT_FIELDS)


def length_config(model: PreTrainedModel, generate_kwargs: dict) -> GenerationConfig:
    """The length settings `generate(**generate_kwargs)` runs with: the passed generation config (its unset
    max_new_tokens / min_new_tokens / min_length / max_len_a / max_len_b taken from the model's, as transformers
    merges them) or the model's, updated with the keyword arguments (`max_len_b=None` switches the source-relative cap
    off, `max_new_tokens=None` lets `max_length` be the ceiling)."""
    passed = generate_kwargs.get("generation_config")
    config = copy.deepcopy(passed or model.generation_config)
    if passed is not None:
        for name in LENGTH_FIELDS:
            if getattr(config, name, None) is None:
                setattr(config, name, getattr(model.generation_config, name, None))
    if generate_kwargs.get("max_length") is not None:
        config.max_length = generate_kwargs["max_length"]
    for name in LENGTH_FIELDS:   # max_new_tokens=None: max_length caps instead
        if name in generate_kwargs:
            setattr(config, name, generate_kwargs[name])
    return config


def cap_by_source_length(model: RelPosTransformerForConditionalGeneration, prompt_length: int,
                         generate_kwargs: dict) -> bool:
    """With max_len_b set, rewrite `generate_kwargs` so that row i ends after its `new_token_limits` entry
    (`SourceLengthCapLogitsProcessor`) and the batch after the largest; otherwise (a folder saved without max_len_b,
    or `max_len_b=None` passed) leave it alone. `max_len_a` / `max_len_b` keyword arguments are consumed here.
    Whether the cap applies: then `max_new_tokens` (the largest row's limit, under every ceiling) is the batch's
    length, and a passed generation config's `max_length` is cleared, as generate would warn of both."""
    limits = model.new_token_limits(prompt_length=prompt_length, **generate_kwargs)
    config = length_config(model, generate_kwargs)
    for name in RELATIVE_LIMIT_FIELDS:
        generate_kwargs.pop(name, None)
    if limits is None:
        return False
    ceiling = longest_new_output(config, prompt_length)
    check_shortest_below_limits(limits, shortest_new_output(config, prompt_length), ceiling)
    if generate_kwargs.get("max_length") is not None and config.max_new_tokens is not None:
        logger.warning_once(f"max_length={generate_kwargs['max_length']} is ignored: max_new_tokens "
                            f"({config.max_new_tokens}) is the ceiling of the max_len_a / max_len_b cap; pass "
                            "max_new_tokens=None as well to make max_length the ceiling")
    if config.max_new_tokens is None and config.max_length is None:
        logger.warning_once(f"max_len_a / max_len_b cap each translation under generate's default ceiling of "
                            f"{DEFAULT_NEW_TOKENS} new tokens, since neither max_new_tokens nor max_length is set: "
                            "pass (or save in generation_config.json) max_new_tokens for a higher ceiling")
    passed = generate_kwargs.get("generation_config")
    if passed is not None:
        generate_kwargs["generation_config"] = copy.deepcopy(passed)
        generate_kwargs["generation_config"].max_new_tokens = int(limits.max())
        generate_kwargs["generation_config"].max_length = None
    else:
        generate_kwargs["max_new_tokens"] = int(limits.max())
    generate_kwargs.pop("max_length", None)  # folded into the ceiling; with both set, generate warns
    eos_token_id = config.eos_token_id if config.eos_token_id is not None else model.config.eos_token_id
    generate_kwargs["logits_processor"] = LogitsProcessorList(
        [*(generate_kwargs.get("logits_processor") or []),
         SourceLengthCapLogitsProcessor(limits, prompt_length, eos_token_id, ceiling)])
    return True


class RelPosTransformerForCausalLM(RelPosTransformerPreTrainedModel, GenerationMixin):
    """Decoder-only language model with the same blocks and registry (decoder_* config fields).

    With `config.mem_len` M > 0 it runs Transformer-XL's segment-level recurrence: `forward` takes and returns
    `mems` (per layer, the last M layer inputs, detached: SG(h_tau) in Dai et al. 2019, eq. in sec. 3.2), keys and
    values span [mems; segment], queries the segment, and positions are offset by the memory length. In `generate`
    the memory is the cache (and is reordered for beam search): it equals uncached generation while prompt plus new
    tokens fit in M, and beyond that each step sees the last M states only (XL's bounded context). With M = 0 it is a
    plain causal LM with a KV cache.
    """

    remote_auto_classes = {"AutoModelForCausalLM": "RelPosTransformerForCausalLM"}
    _tied_weights_keys = {"lm_head.weight": "decoder.embed_tokens.weight"}
    accepts_loss_kwargs = True  # the loss honours the Trainer's num_items_in_batch

    def __init__(self, config: RelPosTransformerConfig):
        config = copy.deepcopy(config)
        config.is_encoder_decoder = False
        config.is_decoder = True
        super().__init__(config)
        self.decoder = RelPosDecoder(config, cross=False)
        check_memory_positions(config, self.decoder.positions, config.mem_len)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.decoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.decoder.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    @deprecate_kwarg("past_key_values", "6.0.0", new_name="cache", raise_if_both_names=True)
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | list[torch.Tensor] | tuple[torch.Tensor, ...] | None = None,
        mems: list[torch.Tensor] | tuple[torch.Tensor, ...] | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        mem_len: int | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
        positions: PositionDraw | None = None,
        position_ids: torch.LongTensor | None = None,
        **kwargs,
    ) -> RelPosCausalLMOutput | tuple:
        """`labels` are the input ids (shifted inside, -100 ignored; `num_items_in_batch` as in the seq2seq model);
        `mems` continue the previous segment; `positions` those of the whole sequence (`PositionDraw`, see
        `RelPosDecoder.forward`); `position_ids` [B or 1, n]: each token's number in its sequence for the
        embedding-level encodings (`RelPosStack.token_positions`; None: past_length + i), which `generate` counts
        over the tokens the attention mask keeps (cumsum - 1), as for transformers' causal LMs, so a left-padded
        prompt is encoded as without its padding; a scheme whose attention reads positions takes them only as such
        a shift of each row's tokens (`check_position_ids`). In memory mode (`mem_len` > 0) the returned cache is `mems`, and
        a tuple passed as `cache` is taken as `mems` (how `generate` hands it back)."""
        if labels is not None:
            inputs = input_ids if input_ids is not None else inputs_embeds
            check_labels(labels, None if inputs is None else inputs.shape[:2], "the inputs")
        if isinstance(cache, (list, tuple)):
            mems, cache = cache, None
        use_cache = cache_flag(self.config, use_cache)
        memory_mode = memory_length(self.config, mem_len) > 0
        if memory_mode and isinstance(cache, Cache) and not cache.is_compileable and cache.get_seq_length() == 0:
            cache = None
        outputs = self.decoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache and not memory_mode and labels is None,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            mems=mems,
            mem_len=mem_len,
            draw=positions,
            position_ids=position_ids,
            return_dict=True,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = token_cross_entropy(logits[:, :-1], labels[:, 1:], num_items_in_batch)
        return RelPosCausalLMOutput(
            loss=loss,
            logits=logits,
            mems=outputs.mems,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            cache=outputs.mems if memory_mode else outputs.cache,
        )

    def generate(self, *args, **kwargs) -> GenerateOutput | torch.LongTensor:
        """`GenerationMixin.generate`; with `position_randomization_at_inference` it first draws the positions of the
        whole sequence unless `positions` is given, and drafting for another model's assisted decoding it drops that
        model's (`set_output_positions`). It continues a Transformer-XL memory given as `mems` (the `mems` a forward
        returned), or as `cache` (a tuple, as `forward` takes it; transformers refuses tuple caches): the prompt is
        then the tokens after the memory, and every beam or sample of a sequence starts from its memory."""
        for name in ("cache", "past_key_values"):
            if isinstance(kwargs.get(name), (list, tuple)):
                if kwargs.get("mems") is not None:
                    raise ValueError(f"pass the Transformer-XL memory once, as mems or as {name}, not both")
                kwargs["mems"] = kwargs.pop(name)
        prompts = (kwargs.get("input_ids"), kwargs.get("inputs", args[0] if args else None), kwargs.get("inputs_embeds"))
        prompt = next((value for value in prompts if value is not None), None)   # generate's first parameter: inputs
        set_output_positions(self, kwargs, "positions", 0 if prompt is None else prompt.size(1),
                             memory_length(self.config, kwargs.get("mem_len")))
        return super().generate(*args, **kwargs)

    def _expand_inputs_for_generation(self, expand_size: int = 1, is_encoder_decoder: bool = False,
                                      input_ids: torch.LongTensor | None = None, **model_kwargs) -> tuple:
        """transformers' expansion of each sequence's inputs to its `expand_size` beams or samples, `mems` included
        (a tuple of tensors, which transformers leaves as it is)."""
        if model_kwargs.get("mems") is not None and expand_size > 1:
            model_kwargs["mems"] = tuple(memory.repeat_interleave(expand_size, dim=0)
                                         for memory in model_kwargs["mems"])
        return super()._expand_inputs_for_generation(expand_size, is_encoder_decoder, input_ids, **model_kwargs)

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, inputs_embeds: torch.Tensor | None = None,
                                      **kwargs) -> dict:
        """`generate` stores returned `mems` as the cache even with `use_cache=False`; drop them then, so an uncached
        step really recomputes the whole sequence. `inputs_embeds` (a prompt given embedded) is named here, since
        `generate` takes it only from a model whose signature names it, and feeds the first step (transformers')."""
        if not kwargs.get("use_cache", True):
            kwargs.pop("cache", None)
        return super().prepare_inputs_for_generation(input_ids, inputs_embeds=inputs_embeds, **kwargs)

    def _assisted_decoding(self, *args, **model_kwargs):
        """Assisted decoding (`assistant_model`, `prompt_lookup_num_tokens`, `assistant_early_exit`): not with a
        Transformer-XL memory (`check_assisted_decoding`)."""
        check_assisted_decoding(self.config, memory_length(self.config, model_kwargs.get("mem_len")), drafting=False)
        return super()._assisted_decoding(*args, **model_kwargs)

    def _reorder_cache(self, past, beam_idx: torch.Tensor):
        """Beam search: reorder the memory (a tuple of tensors) or the KV cache along the batch."""
        if isinstance(past, Cache):
            past.reorder_cache(beam_idx)
            return past
        return tuple(memory.index_select(0, beam_idx.to(memory.device)) for memory in past)


def check_num_beams(num_beams: int, vocab_size: int, name: str = "num_beams") -> None:
    """Refuse a beam narrower than 1 or wider than the vocabulary (beam search would fail deep inside `generate`:
    a division by zero, or its top-k)."""
    if not isinstance(num_beams, int) or isinstance(num_beams, bool) or num_beams < 1:
        raise ValueError(f"{name} must be a positive integer, got {num_beams!r}")
    if num_beams > vocab_size:
        raise ValueError(f"{name} ({num_beams}) is larger than the vocabulary ({vocab_size} tokens)")


def meta_model(config: RelPosTransformerConfig) -> RelPosTransformerForConditionalGeneration:
    """The translation model of `config` on the meta device: its parameter shapes and count, no memory used."""
    with torch.device("meta"):
        return RelPosTransformerForConditionalGeneration(config)


def name_the_causal_lm_for_the_trainer() -> None:
    """transformers' `Trainer` scores a label-smoothed loss (`label_smoothing_factor` > 0) with the labels shifted
    one step, as a causal LM's own loss does, only for a model whose class name is a value of its table
    `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`; registering with `AutoModelForCausalLM` does not put it there, and a plain
    `Trainer` scored `RelPosTransformerForCausalLM`'s logits at token t against label t (a copying objective, far
    below the model's own loss). Named here, at import, for the installed package and its remote code alike."""
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.setdefault(RelPosTransformerConfig.model_type,
                                                 RelPosTransformerForCausalLM.__name__)


name_the_causal_lm_for_the_trainer()
