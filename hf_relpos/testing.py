"""Checks that a position scheme honours the contract (docs/extending.md), to call from your own tests.

`check_position_scheme(name)` runs every check below on a tiny float64 model on the CPU and raises AssertionError
naming the scheme, the property and the largest difference at the first one that fails; each check is also a
function of its own. The repository's tests run the same functions on every built-in scheme, so a scheme of your own
package is held to the rules a built-in one is:

- `check_kernels_agree`: eager, sdpa and flex_attention give the same loss and logits, and eager and sdpa the same
  gradients (1e-12), with and without padding: a `score_mod` / `fused_attention` (FlexAttention's form) that
  disagrees with the `score_bias` / `value_term` the other kernels read fails here;
- `check_cached_decoding`: decoding one token at a time, and two a call, with the KV cache gives the logits of
  the whole forward (a two-query call reads a `score_mod` at `query_offset` > 0 on flex_attention);
- `check_causal_lm_decoding`: the same in the causal LM, whose `generate` also gives the same tokens and logits with
  the cache as without (left-padded prompts);
- `check_static_cache` (for a scheme that declares `takes_fixed_size_cache`, on the kernels that take a fixed-size
  cache, `FIXED_SIZE_CACHE_KERNELS`: eager, sdpa, relpos_triton; given none of them, one ValueError): decoding on a
  fixed-size cache (transformers' StaticCache) gives the whole forward's logits, and `generate(...,
  cache_implementation="static")` the dynamic cache's tokens and logits, in the translation model and the causal LM;
- `check_save_load`: `save_pretrained` / `from_pretrained` give the same scheme parameters and buffers and logits;
- `check_gradient_checkpointing`: under gradient checkpointing, reentrant or not, every parameter gets the gradient
  of a run without it (a term computed from a parameter as a tensor in `prepare` fails);
- `check_padding_invariance`: a padded batch gives each sequence's real tokens the outputs of that sequence alone;
- `check_causal_lm_left_padding`: a left-padded batch of prompts gives each prompt's real tokens the causal LM's
  logits, and its generate the tokens, of that prompt alone;
- `check_oracle` (with `oracle=`): one self-attention layer equals your naive float64 form of the equation, in the
  encoder, the decoder and a cached step, padded or not, at randomized positions, on every kernel;
- `check_order_aware`: the encoder tells a sequence from its reversal (skip for a symmetric scheme, as ALiBi's).

Importing this module imports nothing beyond hf_relpos, torch and transformers (no pytest)."""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import EncoderDecoderCache, StaticCache

from .model.attention_functions import FIXED_SIZE_CACHE_KERNELS
from .model.configuration_relpos import RelPosTransformerConfig, builds_encoder_decoder, field_named
from .model.modeling_relpos import (
    RelPosAttention,
    RelPosTransformerForCausalLM,
    RelPosTransformerForConditionalGeneration,
    attention_mask_for,
    with_scheme_mask,
)
from .model.positions import PositionContext, PositionScheme, get_scheme_class

__all__ = [
    "KERNELS",
    "TOLERANCE",
    "check_cached_decoding",
    "check_causal_lm_decoding",
    "check_causal_lm_left_padding",
    "check_gradient_checkpointing",
    "check_kernels_agree",
    "check_oracle",
    "check_oracle_case",
    "check_order_aware",
    "check_padding_invariance",
    "check_position_scheme",
    "check_save_load",
    "check_static_cache",
    "softmax_attention_by_loop",
    "tiny_config",
]

TOLERANCE = 1e-12   # float64: a float32 step anywhere, or a term computed differently, exceeds it
KERNELS = ("eager", "sdpa", "flex_attention")
# The oracle's sizes: q, k, v are [BATCH, HEADS, n, HEAD_DIM]
BATCH, HEADS, HEAD_DIM = 2, 4, 8
# encoder (n = m = 6), decoder (causal, n = m = 6), a cached step (causal, 2 new queries after 5 cached keys), a
# decoding step (causal, 1 query after 6 cached keys)
SHAPES = {"encoder": (False, 6, 6), "decoder": (True, 6, 6), "cached": (True, 2, 7), "step": (True, 1, 7)}
# An oracle: (scheme, layer, q, k, v, allowed, query_at, key_at) -> the attention output [B, H, n, d] (see check_oracle)
Oracle = Callable[..., torch.Tensor]


def fail(name: str, prop: str, difference: float | None, detail: str = "") -> None:
    """Raise the AssertionError every check raises: the scheme, the property, the largest difference."""
    measured = "" if difference is None else f": max difference {difference:.3g}"
    raise AssertionError(f"position scheme {name!r}: {prop}{measured}{detail}")


def max_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return math.inf
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def tiny_config(position_scheme: str = "shaw", **overrides: Any) -> RelPosTransformerConfig:
    """The tiny config every check builds its model from (2 + 2 layers, d_model 32, 4 heads, vocabulary 40, no
    dropout; Shaw's k 3 and XL's clamp_len 50 for those schemes); `overrides` are config fields (your scheme's among
    them), also under a name that stands for one (`field_named`: hidden_size for d_model), which then replaces that
    field's value here."""
    defaults = dict(
        vocab_size=40,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        dropout=0.0,
        max_relative_position=3,
        clamp_len=50,
        position_scheme=position_scheme,
    )
    replaced = {field_named(name, builds_encoder_decoder(overrides)) for name in overrides}
    defaults = RelPosTransformerConfig.held_fields(position_scheme, defaults)   # another scheme's k would be refused
    return RelPosTransformerConfig(**{name: value for name, value in defaults.items() if name not in replaced},
                                   **overrides)


def tiny_float64_model(name: str, config_overrides: Mapping[str, Any] | None = None, kernel: str = "eager",
                       seed: int = 0) -> RelPosTransformerForConditionalGeneration:
    """A tiny model of scheme `name` in float64 (eval mode), its weights from `seed` (the scheme's own init)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = RelPosTransformerForConditionalGeneration(tiny_config(name, **dict(config_overrides or {})))
    model = model.double().eval()
    model.set_attn_implementation(kernel)
    return model


def tiny_float64_causal_lm(name: str, config_overrides: Mapping[str, Any] | None = None, kernel: str = "eager",
                           seed: int = 0) -> RelPosTransformerForCausalLM:
    """The causal LM of `tiny_config` (its decoder) in float64 (eval mode), its weights from `seed`."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = RelPosTransformerForCausalLM(tiny_config(name, **dict(config_overrides or {})))
    model = model.double().eval()
    model.set_attn_implementation(kernel)
    return model


def left_padded_prompts() -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Three prompts of lengths 7, 4 and 2 (ids 4..39), left-padded with id 0 as a causal LM's batch is, and their
    mask."""
    lengths = [7, 4, 2]
    generator = torch.Generator().manual_seed(2)
    input_ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, length in enumerate(lengths):
        input_ids[row, -length:] = torch.randint(4, 40, (length,), generator=generator)
        attention_mask[row, -length:] = 1
    return input_ids, attention_mask, lengths


def position_ids_of(attention_mask: torch.Tensor) -> torch.Tensor:
    """generate's `position_ids` for a padded batch: each token numbered among its row's unpadded tokens (0 at
    padding)."""
    return (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)


NEW_TOKENS = 5   # what each check's generate produces (greedy, min_new_tokens too: no row stops early)


def generate_greedy(model: PreTrainedModel, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """`model.generate` (greedy, `NEW_TOKENS` new tokens): the sequences [B, length] and every step's logits
    [NEW_TOKENS, B, V]."""
    with torch.no_grad():
        output = model.generate(**inputs, do_sample=False, num_beams=1, max_new_tokens=NEW_TOKENS,
                                min_new_tokens=NEW_TOKENS, pad_token_id=model.config.pad_token_id, output_logits=True,
                                return_dict_in_generate=True)
    return output.sequences, torch.stack(output.logits)


def compare_generations(name: str, prop: str, got: tuple[torch.Tensor, torch.Tensor],
                        want: tuple[torch.Tensor, torch.Tensor], tolerance: float) -> None:
    """Two generations, each (tokens, every step's logits stacked), give the same tokens and logits within
    `tolerance`; else `fail` naming `prop`."""
    if got[0].shape != want[0].shape or not torch.equal(got[0], want[0]):
        fail(name, f"{prop}: different tokens {got[0].tolist()} and {want[0].tolist()}", None)
    difference = max_difference(got[1], want[1])
    if not difference <= tolerance:
        fail(name, f"{prop}: the same tokens, with different logits", difference, f" > {tolerance:g}")


def padded_sources() -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Three sources of lengths 9, 6 and 2 (ids 4..39, no special token), right-padded with id 0, and their mask."""
    lengths = [9, 6, 2]
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, length in enumerate(lengths):
        input_ids[row, :length] = torch.randint(4, 40, (length,), generator=generator)
        attention_mask[row, :length] = 1
    return input_ids, attention_mask, lengths


def decoder_inputs(batch: int, length: int = 6) -> torch.Tensor:
    return torch.randint(4, 40, (batch, length), generator=torch.Generator().manual_seed(1))


# --- (1) every kernel gives the same model -------------------------------------------------------------------------

def check_kernels_agree(name: str, *, config_overrides: Mapping[str, Any] | None = None,
                        kernels: Sequence[str] = KERNELS, tolerance: float = TOLERANCE) -> None:
    """Loss and logits of one float64 model on each of `kernels` equal the first's, with and without a padded
    source; gradients (every parameter's, the scheme's included) too, except on flex_attention (no backward on the
    CPU). FlexAttention reads the scheme's `score_mod` / `fused_attention`, the others its `score_bias` /
    `value_term`: a scheme whose two forms disagree fails here."""
    model = tiny_float64_model(name, config_overrides, kernels[0])
    input_ids, attention_mask, _ = padded_sources()
    for padded in (False, True):
        inputs = dict(input_ids=input_ids, labels=decoder_inputs(len(input_ids)),
                      attention_mask=attention_mask if padded else None)
        reference = None
        for kernel in kernels:
            model.set_attn_implementation(kernel)
            model.zero_grad(set_to_none=True)
            backward = kernel != "flex_attention"
            with torch.set_grad_enabled(backward):
                output = model(**inputs)
                if backward:
                    output.loss.backward()
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
            result = (output.loss.detach(), output.logits.detach(), grads if backward else None)
            if reference is None:
                reference, first = result, kernel
                continue
            where = f"{'padded' if padded else 'unpadded'} batch"
            for what, got, want in (("logits", result[1], reference[1]), ("loss", result[0], reference[0])):
                difference = max_difference(got, want)
                if not difference <= tolerance:
                    fail(name, f"kernels agree: {kernel} and {first} give different {what} ({where})", difference,
                         f" > {tolerance:g}" + (" (flex_attention reads the scheme's score_mod / fused_attention, "
                                                "the other kernels its score_bias / value_term)"
                                                if "flex_attention" in (kernel, first) else ""))
            if result[2] is not None and reference[2] is not None:
                for parameter, want in reference[2].items():
                    got = result[2].get(parameter)
                    difference = math.inf if got is None else max_difference(got, want)
                    if not difference <= tolerance * max(1.0, want.abs().max().item()):
                        fail(name, f"kernels agree: {kernel} and {first} give different gradients of {parameter} "
                                   f"({where})", difference)
    model.zero_grad(set_to_none=True)


# --- (2) cached decoding -------------------------------------------------------------------------------------------

def check_cached_decoding(name: str, *, config_overrides: Mapping[str, Any] | None = None,
                          kernels: Sequence[str] = KERNELS, tolerance: float = TOLERANCE) -> None:
    """Decoding one token at a time, handing back the KV cache, gives the logits of the whole teacher-forced forward
    (float64, padded source) on each kernel: a scheme that places a decoding step's query at 0 instead of at
    `query_offset`, or forgets the cached keys' positions, fails here. So does decoding two tokens a call (a call of
    several queries on the cache, as assisted decoding's): a one-query step runs on sdpa, so only such a call reads
    a `score_mod` at `query_offset` > 0 on flex_attention, and one that forgets the offset fails here."""
    model = tiny_float64_model(name, config_overrides)
    input_ids, attention_mask, _ = padded_sources()
    targets = decoder_inputs(len(input_ids))
    for kernel in kernels:
        model.set_attn_implementation(kernel)
        with torch.no_grad():
            encoded = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
            inputs = dict(encoder_outputs=encoded, attention_mask=attention_mask)
            whole = model(decoder_input_ids=targets, use_cache=False, **inputs).logits
            for width in (1, 2):   # tokens a call
                cache = None
                for first in range(0, targets.size(1), width):
                    out = model(decoder_input_ids=targets[:, first:first + width], use_cache=True, cache=cache, **inputs)
                    cache, last = out.cache, first + out.logits.size(1) - 1
                    difference = max_difference(out.logits, whole[:, first:last + 1])
                    if difference <= tolerance:
                        continue
                    if width == 1:
                        fail(name, f"cached decoding equals the full forward: step {first} ({kernel}) with the KV cache "
                                   f"of {first} tokens differs from the whole forward's logits", difference,
                             " (a step's query sits at position query_offset, its keys at their cached positions)")
                    fail(name, f"cached decoding equals the full forward: tokens {first}..{last} ({kernel}) in one "
                               f"call on the KV cache of {first} tokens differ from the whole forward's logits",
                         difference, " (a call's query q sits at position query_offset + q, in the score_mod too)")


# --- (3) save_pretrained / from_pretrained --------------------------------------------------------------------------

def check_save_load(name: str, *, config_overrides: Mapping[str, Any] | None = None) -> None:
    """A model saved with `save_pretrained` and loaded with `from_pretrained` has the scheme's parameters and buffers
    (persistent or not) of the saved model, bit for bit, and its logits within `TOLERANCE` (a loaded tensor's memory
    alignment can change the rounding of a float64 matrix product: MKL on an AMD EPYC): a scheme whose
    `init_parameters` replaces what was loaded with a new tensor (one written in place gets its loaded values back),
    or whose non-persistent buffer only `__init__` fills (left uninitialised while a model loads, docs/extending.md),
    fails here."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(2)
        model = tiny_float64_model(name, config_overrides, seed=3)
        with torch.no_grad():   # away from the values a fresh init gives, so a re-initialised tensor shows
            for stack in (model.model.encoder, model.model.decoder):
                for parameter in stack.positions.parameters():
                    if parameter.is_floating_point():
                        parameter.add_(0.01 * torch.randn_like(parameter))
    input_ids, attention_mask, _ = padded_sources()
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_inputs(3))
    with torch.no_grad():
        expected = model(**inputs).logits
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        loaded = RelPosTransformerForConditionalGeneration.from_pretrained(folder, dtype=torch.float64).eval()
    loaded.set_attn_implementation(model.config._attn_implementation)
    for stack in ("encoder", "decoder"):
        saved_scheme = getattr(model.model, stack).positions
        loaded_scheme = getattr(loaded.model, stack).positions
        loaded_tensors = dict(loaded_scheme.named_parameters()) | dict(loaded_scheme.named_buffers())
        for kind, tensors in (("parameter", saved_scheme.named_parameters()), ("buffer", saved_scheme.named_buffers())):
            for tensor_name, tensor in tensors:
                got = loaded_tensors.get(tensor_name)
                if got is None or got.shape != tensor.shape or not torch.equal(got.to(tensor.dtype), tensor):
                    difference = math.inf if got is None or got.shape != tensor.shape else max_difference(got, tensor)
                    fail(name, f"save_pretrained / from_pretrained keeps the scheme's {kind} "
                               f"model.{stack}.positions.{tensor_name}", difference,
                         " (a loaded model gets what was saved: init_parameters must not replace it with a new "
                         "tensor, and a non-persistent buffer gets its values in init_parameters, which runs while a "
                         "model loads)")
    with torch.no_grad():
        got = loaded(**inputs).logits
    difference = max_difference(got, expected)
    if not difference <= TOLERANCE:   # the same weights, bit for bit, may round differently in float64 BLAS calls
        fail(name, "save_pretrained / from_pretrained gives the saved model's logits", difference,
             f" > {TOLERANCE:g}")


# --- (4) padding ----------------------------------------------------------------------------------------------------

def check_padding_invariance(name: str, *, config_overrides: Mapping[str, Any] | None = None,
                             kernels: Sequence[str] = KERNELS, tolerance: float = TOLERANCE) -> None:
    """In a right-padded batch of sources, each sequence's real tokens get the encoder states, and its decoder the
    logits, of that sequence run alone (float64, each kernel)."""
    model = tiny_float64_model(name, config_overrides)
    input_ids, attention_mask, lengths = padded_sources()
    targets = decoder_inputs(len(input_ids))
    for kernel in kernels:
        model.set_attn_implementation(kernel)
        with torch.no_grad():
            batched = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=targets)
            for row, length in enumerate(lengths):
                if length == input_ids.size(1):
                    continue   # not padded
                alone = model(input_ids=input_ids[row:row + 1, :length], decoder_input_ids=targets[row:row + 1])
                for what, got, want in (
                        ("encoder states", batched.encoder_last_hidden_state[row, :length],
                         alone.encoder_last_hidden_state[0]),
                        ("decoder logits", batched.logits[row], alone.logits[0])):
                    difference = max_difference(got, want)
                    if not difference <= tolerance:
                        fail(name, f"padding invariance: the {what} of a source of {length} tokens padded to "
                                   f"{input_ids.size(1)} differ from those of the source alone ({kernel})", difference)


# --- (5) the oracle -------------------------------------------------------------------------------------------------

def softmax_attention_by_loop(scores: torch.Tensor, allowed: torch.Tensor,
                              values_for: Callable[[int, int, int, int], torch.Tensor]) -> torch.Tensor:
    """z_i = sum_j alpha_ij values_for(b, h, i, j), alpha = softmax of `scores` [B, H, n, m] over the j `allowed`
    [B, H, n, m]; zeros where no j is allowed. The end of an oracle whose scores you computed term by term
    (`values_for` = lambda b, h, i, j: v[b, h, j], plus a value term of your own)."""
    out = None
    for b in range(scores.size(0)):
        for h in range(scores.size(1)):
            for i in range(scores.size(2)):
                keys = [j for j in range(scores.size(3)) if allowed[b, h, i, j]]
                weights = torch.softmax(torch.stack([scores[b, h, i, j] for j in keys]), dim=0) if keys else []
                for weight, j in zip(weights, keys, strict=True):
                    value = values_for(b, h, i, j)
                    if out is None:
                        out = torch.zeros(*scores.shape[:3], value.size(-1), dtype=torch.float64)
                    out[b, h, i] += weight * value
    return out if out is not None else torch.zeros(*scores.shape[:3], HEAD_DIM, dtype=torch.float64)


def make_attention(position_scheme: str, is_causal: bool, kernel: str,
                   **overrides: Any) -> tuple[RelPosAttention, PositionScheme]:
    """Layer 1's float64 self-attention module and its stack's scheme (two layers, parameters drawn N(0, 0.5))."""
    config = tiny_config(position_scheme, d_model=HEADS * HEAD_DIM, encoder_attention_heads=HEADS, **overrides)
    config._attn_implementation = kernel
    scheme = get_scheme_class(position_scheme)(config, 2, HEADS, HEAD_DIM, is_causal=is_causal).double()
    for parameter in scheme.parameters():
        torch.nn.init.normal_(parameter, std=0.5)
    return RelPosAttention(config, HEADS, 1, is_cross_attention=False, is_causal=is_causal).double(), scheme


def inputs(query_length: int, key_length: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [B, H, n, d], k and v [B, H, m, d], float64 N(0, 1)."""
    generator = torch.Generator().manual_seed(seed)
    make = lambda n: torch.randn(BATCH, HEADS, n, HEAD_DIM, generator=generator, dtype=torch.float64)  # noqa: E731
    return make(query_length), make(key_length), make(key_length)


def key_padding(key_length: int, padded: bool) -> torch.Tensor | None:
    """The [B, m] 1/0 key mask: the second sequence loses its last two keys."""
    if not padded:
        return None
    mask = torch.ones(BATCH, key_length, dtype=torch.long)
    mask[1, -2:] = 0
    return mask


def naive_allowed(query_length: int, key_length: int, offset: int, is_causal: bool, padded: bool) -> torch.Tensor:
    """[B, H, n, m]: key j is real and, in a decoder, not after query i (at absolute position i + offset)."""
    allowed = torch.ones(BATCH, HEADS, query_length, key_length, dtype=torch.bool)
    for b in range(BATCH):
        for i in range(query_length):
            for j in range(key_length):
                if (padded and b == 1 and j >= key_length - 2) or (is_causal and j > i + offset):
                    allowed[b, :, i, j] = False
    return allowed


def fast_attention(attention: RelPosAttention, scheme: PositionScheme, query_length: int, key_length: int,
                   is_causal: bool, padded: bool, output_attentions: bool = False,
                   key_positions: torch.Tensor | None = None,
                   ) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor, torch.Tensor | None]:
    """What the model computes for layer 1: the stack's mask (masking_utils) and `RelPosAttention.attend`; returns
    (q, k, v), the output [B, H, n, d] and the attention weights."""
    q, k, v = inputs(query_length, key_length)
    offset = key_length - query_length
    mask = attention_mask_for(attention.config, BATCH, query_length, key_length, offset,
                              key_padding(key_length, padded), causal=is_causal, device=torch.device("cpu"))
    context = scheme.prepare(PositionContext(query_length, key_length, offset, key_positions, q.device, q.dtype))
    mask = with_scheme_mask(attention.config, scheme, context, mask)
    with torch.no_grad():  # FlexAttention has no CPU backward; gradients are covered at model level
        keys = scheme.transform_new_keys(1, k, context)
        output, weights = attention.attend(q, keys, v, mask, scheme, context, output_attentions)
    return (q, k, v), output.transpose(1, 2), weights


def check_oracle_case(name: str, oracle: Oracle, config_overrides: Mapping[str, Any] | None = None, *,
                      kernel: str = "eager", shape: str = "encoder", padded: bool = False,
                      key_positions: torch.Tensor | None = None, tolerance: float = TOLERANCE) -> None:
    """One case of `check_oracle`: layer 1's self-attention on `kernel` for one of `SHAPES`, padded or not, at the
    keys' `key_positions` (None: key j at j) against `oracle`."""
    is_causal, query_length, key_length = SHAPES[shape]
    with torch.random.fork_rng(devices=[]):   # the same parameters at every call, the caller's generator untouched
        torch.manual_seed(0)
        attention, scheme = make_attention(name, is_causal, kernel, **dict(config_overrides or {}))
    (q, k, v), fast, _ = fast_attention(attention, scheme, query_length, key_length, is_causal, padded,
                                        key_positions=key_positions)
    offset = key_length - query_length
    allowed = naive_allowed(query_length, key_length, offset, is_causal, padded)
    positions = list(range(key_length)) if key_positions is None else key_positions.tolist()
    with torch.no_grad():
        expected = oracle(scheme, 1, q, k, v, allowed, positions[offset:], positions)
    difference = max_difference(fast, expected)
    if not difference <= tolerance:
        where = (f"{shape}, {'padded' if padded else 'unpadded'}, {kernel}"
                 + (", randomized positions" if key_positions is not None else "")
                 + (f", config {dict(config_overrides)}" if config_overrides else ""))
        fail(name, f"self-attention matches the oracle ({where})", difference, f" > {tolerance:g}")


def check_oracle(name: str, oracle: Oracle, *, config_overrides: Mapping[str, Any] | None = None,
                 kernels: Sequence[str] = KERNELS, tolerance: float = TOLERANCE) -> None:
    """Layer 1's self-attention (the scheme's parameters drawn N(0, 0.5)) equals `oracle`, your naive float64 form
    of the scheme's equation, in the encoder (6 queries, 6 keys), the decoder (causal), a cached step (2 queries
    after 5 cached keys) and a decoding step (1 query after 6), with and without padding, and (padded) at
    randomized positions, on each kernel.

    `oracle(scheme, layer, q, k, v, allowed, query_at, key_at)` gets the scheme instance (read its parameters), the
    layer index, q [B, H, n, d] and k, v [B, H, m, d] (float64), `allowed` [B, H, n, m] (padding and causality:
    True where query i may attend to key j), and the absolute positions of the queries (`query_at[i]`) and keys
    (`key_at[j]`); it returns the attention output [B, H, n, d] (softmax over the allowed keys, zero for a query with
    none): compute the scores term by term and end with `softmax_attention_by_loop`."""
    for shape in SHAPES:
        for padded in (False, True):
            for kernel in kernels:
                check_oracle_case(name, oracle, config_overrides, kernel=kernel, shape=shape, padded=padded,
                                  tolerance=tolerance)
        key_positions = torch.randperm(40, generator=torch.Generator().manual_seed(5))[:SHAPES[shape][2]].sort().values
        for kernel in kernels:
            check_oracle_case(name, oracle, config_overrides, kernel=kernel, shape=shape, padded=True,
                              key_positions=key_positions, tolerance=tolerance)


# --- (6) order ------------------------------------------------------------------------------------------------------

def check_order_aware(name: str, *, config_overrides: Mapping[str, Any] | None = None,
                      threshold: float = 1e-8) -> None:
    """The encoder tells a sequence from its reversal: without positions (or with a symmetric bias such as ALiBi's
    -m |i - j|) a reversed source gives the reversed encoder states, which cross-attention cannot tell apart. The
    states of the reversed source must differ from the reversed states by more than `threshold`."""
    model = tiny_float64_model(name, config_overrides)
    source = torch.randint(4, 40, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        states = model.get_encoder()(input_ids=source).last_hidden_state
        mirrored = model.get_encoder()(input_ids=source.flip(1)).last_hidden_state
    difference = max_difference(mirrored, states.flip(1))
    if not difference > threshold:
        fail(name, "order awareness: the encoder's states of a reversed source are the reversed states, so it cannot "
                   "tell a sequence from its reversal", difference,
             f" <= {threshold:g} (pass order_aware=False for a scheme symmetric in i - j)")


# --- (7) the causal LM -----------------------------------------------------------------------------------------------

def left_padded_sequences() -> tuple[torch.Tensor, torch.Tensor, int]:
    """`left_padded_prompts` continued by 5 tokens each: ids [3, 12], their mask and the prompts' length (7)."""
    prompts, prompt_mask, _ = left_padded_prompts()
    continuation = decoder_inputs(len(prompts), 5)
    input_ids = torch.cat([prompts, continuation], 1)
    return input_ids, torch.cat([prompt_mask, torch.ones_like(continuation)], 1), prompts.size(1)


def causal_lm_in_steps(model: RelPosTransformerForCausalLM, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       prompt_length: int, cache: Any = None) -> torch.Tensor:
    """What generate runs: the prompt, then one token at a time on the KV cache it returns (`cache`: a fixed-size one
    to fill; None: the dynamic cache), each call given the mask of the cached and new tokens and the new tokens'
    position_ids (`position_ids_of`). Returns the logits of every token [B, length, V]."""
    position_ids = position_ids_of(attention_mask)
    steps, first = [], 0
    with torch.no_grad():
        for last in range(prompt_length, input_ids.size(1) + 1):
            out = model(input_ids=input_ids[:, first:last], attention_mask=attention_mask[:, :last],
                        position_ids=position_ids[:, first:last], use_cache=True, cache=cache)
            cache, first, _ = out.cache, last, steps.append(out.logits)
    return torch.cat(steps, 1)


CACHE_HINT = " (a step's query sits at position query_offset, its keys at their cached positions)"
FIXED_SIZE_HINT = (" (a step's query sits at position query_offset, a 0-dim tensor on a fixed-size cache, whose keys are "
                   "all its slots, the unused ones masked)")


def compare_steps(name: str, prop: str, stepped: torch.Tensor, whole: torch.Tensor, attention_mask: torch.Tensor | None,
                  first_step: int, tolerance: float, hint: str = CACHE_HINT) -> None:
    """The logits of decoding in steps equal those of the whole forward at every token the mask keeps (all when
    None); the first `first_step` tokens are one call (a prompt), each later token one step. Else `fail` naming
    `prop` and the first step that differs."""
    for position in range(stepped.size(1)):
        rows = slice(None) if attention_mask is None else attention_mask[:, position].bool()
        difference = max_difference(stepped[rows, position], whole[rows, position])
        if not difference <= tolerance:
            step = (f"the prompt's token {position}" if position < first_step
                    else f"step {position - first_step + 1} after a prompt of {first_step} tokens" if first_step
                    else f"step {position}")
            fail(name, prop.format(step=step), difference, hint)


def check_causal_lm_decoding(name: str, *, config_overrides: Mapping[str, Any] | None = None,
                             kernels: Sequence[str] = KERNELS, tolerance: float = TOLERANCE) -> None:
    """The causal LM (`RelPosTransformerForCausalLM`, float64), on each kernel, over a left-padded batch of prompts:
    the prompt, then one token at a time with the KV cache (`cache`, transformers' `past_key_values`), each call
    given the mask and `position_ids` that generate gives it, gives the logits of the whole forward; and `generate`
    (greedy) gives the same tokens, and every step's logits within `tolerance`, with the cache as without. A
    scheme's `embed` gets the position_ids as `positions`: one that counts them from `past_length` (adds it to them)
    fails here."""
    model = tiny_float64_causal_lm(name, config_overrides)
    input_ids, attention_mask, prompt_length = left_padded_sequences()
    prompts, prompt_mask = input_ids[:, :prompt_length], attention_mask[:, :prompt_length]
    for kernel in kernels:
        model.set_attn_implementation(kernel)
        with torch.no_grad():
            whole = model(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids_of(attention_mask), use_cache=False).logits
        stepped = causal_lm_in_steps(model, input_ids, attention_mask, prompt_length)
        compare_steps(name, f"causal LM cached decoding equals the full forward: {{step}} ({kernel}, left-padded "
                            "prompts) differs from the whole forward's logits", stepped, whole, attention_mask,
                      prompt_length, tolerance)
        compare_generations(
            name, f"causal LM generate gives the same with and without the KV cache (left-padded prompts, {kernel})",
            generate_greedy(model, input_ids=prompts, attention_mask=prompt_mask, use_cache=True),
            generate_greedy(model, input_ids=prompts, attention_mask=prompt_mask, use_cache=False), tolerance)


def check_causal_lm_left_padding(name: str, *, config_overrides: Mapping[str, Any] | None = None,
                                 kernels: Sequence[str] = KERNELS, tolerance: float = TOLERANCE) -> None:
    """The causal LM (float64), on each kernel: in a left-padded batch of prompts, given its attention mask and the
    `position_ids` generate computes (each token's number among its row's unpadded tokens), each row's real tokens
    get the logits of the prompt alone; and `generate` (greedy, with the KV cache) gives each row the tokens and
    logits of its prompt alone. A scheme's `embed` gets those ids as `positions` ([B, n]): one that ignores them
    encodes a padded prompt's tokens after its padding and fails here."""
    model = tiny_float64_causal_lm(name, config_overrides)
    input_ids, attention_mask, lengths = left_padded_prompts()
    position_ids = position_ids_of(attention_mask)
    for kernel in kernels:
        model.set_attn_implementation(kernel)
        with torch.no_grad():
            batched = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        generated = generate_greedy(model, input_ids=input_ids, attention_mask=attention_mask)
        for row, length in enumerate(lengths):
            if length == input_ids.size(1):
                continue   # not padded
            prompt = input_ids[row:row + 1, -length:]
            with torch.no_grad():
                alone = model(input_ids=prompt).logits
            difference = max_difference(batched[row, -length:], alone[0])
            if not difference <= tolerance:
                fail(name, f"causal LM left padding: the logits of a prompt of {length} tokens left-padded to "
                           f"{input_ids.size(1)} differ from those of the prompt alone ({kernel})", difference,
                     " (embed gets the tokens' position_ids as positions, [B, n])")
            generated_alone = generate_greedy(model, input_ids=prompt)
            compare_generations(
                name, f"causal LM left padding: generate from a prompt of {length} tokens left-padded to "
                      f"{input_ids.size(1)} differs from generate from the prompt alone ({kernel})",
                (generated[0][row:row + 1, -(length + NEW_TOKENS):], generated[1][:, row:row + 1]), generated_alone,
                tolerance)


# --- (8) a fixed-size KV cache --------------------------------------------------------------------------------------

def check_static_cache(name: str, *, config_overrides: Mapping[str, Any] | None = None,
                       kernels: Sequence[str] = KERNELS, tolerance: float = TOLERANCE) -> None:
    """A fixed-size KV cache (transformers' `StaticCache`, `generate(..., cache_implementation="static")`), for a
    scheme that declares it takes one (`takes_fixed_size_cache`), on each of `kernels` that runs with one (eager,
    sdpa): the decoding step's `query_offset` is then a 0-dim tensor and its keys are all the cache's slots, the
    unused ones masked. In the translation model (padded source) and in the causal LM, decoding one token at a time
    on a cache of more slots than tokens gives the logits of the whole forward; and `generate` with
    cache_implementation "static" gives the tokens, and every step's logits within `tolerance`, of the dynamic
    cache (padded sources; left-padded prompts). A scheme that places a step's queries at the last keys
    (key_length - n) instead of at `query_offset` passes the dynamic cache and fails here. `kernels` none of which
    takes a fixed-size cache (flex_attention alone) would check nothing: one ValueError naming them and those that do.
    """
    if not get_scheme_class(name).takes_fixed_size_cache:
        raise ValueError(f"position scheme {name!r} does not declare that it takes a fixed-size KV cache "
                         "(takes_fixed_size_cache = True): generate refuses cache_implementation 'static' for it")
    kernels = tuple(kernels)
    if not any(kernel in FIXED_SIZE_CACHE_KERNELS for kernel in kernels):
        raise ValueError(f"check_static_cache: none of kernels {list(kernels)} takes a fixed-size KV cache, so it "
                         f"would check nothing; it checks {list(FIXED_SIZE_CACHE_KERNELS)}")
    translation = tiny_float64_model(name, config_overrides)
    causal_lm = tiny_float64_causal_lm(name, config_overrides)
    source, source_mask, _ = padded_sources()
    targets = decoder_inputs(len(source), 7)
    input_ids, attention_mask, prompt_length = left_padded_sequences()
    prompts, prompt_mask = input_ids[:, :prompt_length], attention_mask[:, :prompt_length]
    slots = 16   # more than any sequence here: the last slots stay unused
    for kernel in (kernel for kernel in kernels if kernel in FIXED_SIZE_CACHE_KERNELS):
        translation.set_attn_implementation(kernel)
        causal_lm.set_attn_implementation(kernel)
        with torch.no_grad():
            inputs = dict(encoder_outputs=translation.get_encoder()(input_ids=source, attention_mask=source_mask),
                          attention_mask=source_mask)
            whole = translation(decoder_input_ids=targets, use_cache=False, **inputs).logits
            cache = EncoderDecoderCache(StaticCache(config=translation.config, max_cache_len=slots),
                                        StaticCache(config=translation.config, max_cache_len=source.size(1)))
            stepped = torch.cat([translation(decoder_input_ids=targets[:, step:step + 1], use_cache=True, cache=cache,
                                             **inputs).logits for step in range(targets.size(1))], 1)
        compare_steps(name, f"static cache decoding equals the full forward: translation model {{step}} ({kernel}, a "
                            f"fixed-size cache of {slots} slots) differs from the whole forward's logits",
                      stepped, whole, None, 0, tolerance, FIXED_SIZE_HINT)
        with torch.no_grad():
            whole = causal_lm(input_ids=input_ids, attention_mask=attention_mask,
                              position_ids=position_ids_of(attention_mask), use_cache=False).logits
        stepped = causal_lm_in_steps(causal_lm, input_ids, attention_mask, prompt_length,
                                     StaticCache(config=causal_lm.config, max_cache_len=slots))
        compare_steps(name, f"static cache decoding equals the full forward: causal LM {{step}} ({kernel}, left-padded "
                            f"prompts, a fixed-size cache of {slots} slots) differs from the whole forward's logits",
                      stepped, whole, attention_mask, prompt_length, tolerance, FIXED_SIZE_HINT)
        for model_name, model, batch in (
                ("translation model", translation, dict(input_ids=source, attention_mask=source_mask)),
                ("causal LM", causal_lm, dict(input_ids=prompts, attention_mask=prompt_mask))):
            compare_generations(
                name, f"static cache generate gives the dynamic cache's: {model_name} ({kernel}), "
                      "cache_implementation 'static' and the dynamic cache",
                generate_greedy(model, **batch, cache_implementation="static"), generate_greedy(model, **batch),
                tolerance)


# --- gradient checkpointing ---------------------------------------------------------------------------------------

def check_gradient_checkpointing(name: str, *, config_overrides: Mapping[str, Any] | None = None,
                                 tolerance: float = TOLERANCE) -> None:
    """Under gradient checkpointing (`activation_checkpointing_enable`), non-reentrant and reentrant, every parameter
    gets the gradient of a run without it (float64, padded source, eager, training mode): a term computed from a
    parameter as a tensor in `prepare`, shared by the layers, fails here (its reentrant backward runs through the
    shared graph a second time)."""
    input_ids, attention_mask, _ = padded_sources()
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, labels=decoder_inputs(len(input_ids)))
    reference = None
    for reentrant in (None, False, True):
        model = tiny_float64_model(name, config_overrides).train()
        how = "without" if reentrant is None else "reentrant" if reentrant else "non-reentrant"
        if reentrant is not None:
            model.activation_checkpointing_enable({"use_reentrant": reentrant})
        try:
            model(**inputs).loss.backward()
        except RuntimeError as error:
            fail(name, f"gradient checkpointing ({how}) gives the gradients of a run without it: the backward fails "
                       f"({str(error).splitlines()[0]})", None,
                 " (a term computed from a parameter is built in `terms`, or when a kernel reads it, not as a tensor "
                 "in `prepare`)")
        grads = {n: p.grad.detach() for n, p in model.named_parameters() if p.grad is not None}
        if reference is None:
            reference = grads
            continue
        for parameter, want in reference.items():
            got = grads.get(parameter)
            difference = math.inf if got is None else max_difference(got, want)
            if not difference <= tolerance * max(1.0, want.abs().max().item()):
                fail(name, f"gradient checkpointing ({how}) gives the gradients of a run without it: {parameter} "
                           "differs", difference)


# --- all of them ----------------------------------------------------------------------------------------------------

def check_position_scheme(name: str, *, config_overrides: Mapping[str, Any] | None = None,
                          oracle: Oracle | None = None, order_aware: bool = True,
                          kernels: Iterable[str] = KERNELS) -> None:
    """Every check of this module for the registered scheme `name` (its module imported first), on tiny float64
    models on the CPU: kernels agree, cached decoding, the causal LM's cached decoding, a fixed-size cache (when the
    scheme declares `takes_fixed_size_cache` and one of `kernels` takes one: not flex_attention), save/load, gradient
    checkpointing (eager), padding invariance, the causal LM's left padding, the
    oracle (when given) and order awareness (when `order_aware`). `config_overrides`: config fields of the tiny model
    (your scheme's own); `kernels`: those the scheme runs on (flex_attention runs unfused on the CPU). Raises
    AssertionError naming the scheme, the property and the largest difference at the first check that fails."""
    scheme_class = get_scheme_class(name)   # an unregistered name: one error saying to import the module that registers it
    kernels = tuple(kernels)
    check_kernels_agree(name, config_overrides=config_overrides, kernels=kernels)
    check_cached_decoding(name, config_overrides=config_overrides, kernels=kernels)
    check_causal_lm_decoding(name, config_overrides=config_overrides, kernels=kernels)
    if scheme_class.takes_fixed_size_cache and any(kernel in FIXED_SIZE_CACHE_KERNELS for kernel in kernels):
        check_static_cache(name, config_overrides=config_overrides, kernels=kernels)   # none such: nothing to check
    check_save_load(name, config_overrides=config_overrides)
    check_gradient_checkpointing(name, config_overrides=config_overrides)
    check_padding_invariance(name, config_overrides=config_overrides, kernels=kernels)
    check_causal_lm_left_padding(name, config_overrides=config_overrides, kernels=kernels)
    if oracle is not None:
        check_oracle(name, oracle, config_overrides=config_overrides, kernels=kernels)
    if order_aware:
        check_order_aware(name, config_overrides=config_overrides)
