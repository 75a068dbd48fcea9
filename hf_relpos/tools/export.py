"""Export a saved model to a serving engine: `hf-relpos-export ctranslate2 MODEL_DIR OUT_DIR [--quantization int8]`.

CTranslate2's Transformer specification (OpenNMT's engine, what opus-mt / Marian models are served with) expresses
these schemes and options of an hf_relpos translation model, so the same weights compute the same translations there:

- `absolute`: the [sin | cos] sinusoids of `hf_relpos.model.positions.sinusoids` written as the position table of
  both stacks (CTranslate2's built-in sinusoids use the frequencies 10000^(-i / (d/2 - 1)), not Vaswani et al.'s
  10000^(-i / (d/2)), so they are not used); the table has `max_position_embeddings` rows, or `--max_positions`:
  the longest source and translation the export serves (the PyTorch model has no such bound).
- `shaw`: `relative_position` (Shaw et al. 2018 as OpenNMT-py's `max_relative_positions`): per layer one table of
  2k + 1 key and one of value vectors shared by the heads, indexed by clip(j - i, k) + k as here. A model without
  a^K or a^V gets a zero table in its place (which adds exactly nothing).
- `t5`: `relative_attention_bias`, the stack's [buckets, heads] table given to every layer (T5 computes it in the
  first layer and reuses it), with `relative_attention_max_distance`; the scores keep their 1/sqrt(d) scaling.
- `rope`: `rotary_dim` (0: every dimension), `rotary_interleave` (the pairs (2t, 2t+1), as `positions_rope.py`
  rotates), `rotary_base` = `rope_theta`.
- `alibi`: `relative_attention_bias` as well, a table of -m_h |j - i| over T5's buckets, as many as make every
  offset of at most `max_position_embeddings` (or `--max_positions`) positions its own bucket (4 x that in the
  bidirectional encoder, 2 x in the causal decoder), so the bias is the model's exactly up to that length, which
  bounds the sources and translations the export serves (CTranslate2's own ALiBi is for decoder-only models);
  hf-relpos-translate refuses longer ones, CTranslate2 alone does not (offsets beyond get the bias of the nearest
  offset of T5's logarithmic bucket they fall in, an approximation): the card says so.
- `directional` with `directional_disable_diagonal` false: `relative_attention_bias` too, per head 0 at the buckets
  of the offsets its direction allows and `MASKED_BIAS` (-10000) at the others (T5's buckets split offsets below, at
  and above 0).
  DiSAN's diag-disabled masks (the default) are refused: there a head's first or last query has no key and outputs
  zeros, which the engine's softmax cannot give.
- `none`: a zero position table (without a table CTranslate2 would add its own sinusoids); with
  `keep_absolute_positions` the sinusoids times `absolute_positions_scale`.

Pre- or Post-LN (`pre_norm`; the Pre-LN stacks' final LayerNorm), the activation, the sqrt(d_model) embedding scale,
the tied embeddings (one matrix, stored once), `final_logits_bias` (the output projection's bias) and the LayerNorm
epsilon carry over. What the specification cannot express is refused before anything is written, in one line naming
it: `xl`, `directional` with its diagonal disabled (the default), schemes registered elsewhere, Shaw's per-head
tables, `keep_absolute_positions` under a relative scheme (unless faded out to `absolute_positions_scale` 0, where it
adds nothing), `self_attention_window`, `cross_attention_length_scaling`, randomized positions at inference, an
encoder without layers (`encoder_layers` 0).

OUT_DIR holds CTranslate2's model (model.bin, config.json, vocabulary), the tokenizer, the source model's config
(hf_relpos_config.json), generation_config.json where the source model has one (beams, length penalty, length cap:
`hf-relpos-translate OUT_DIR` decodes with them), `ctranslate2_export.json` (what was exported, how, and from which
model: `source_model`, its folder relative to the folder the export ran in, else `<local>/NAME`, as model cards show
local paths, so that the folder can be uploaded as it is) and a README.md (what the folder is, its saved decoding, and
how to translate with it, with and without hf_relpos; the source model's own card, with its training and scores, is not
copied: it names the source folder). It is filled beside its destination and renamed in: never half-written. The source
folder's run record (run_record.json: languages and recipe) comes along, so that hf-relpos-translate scores the export's
BLEU as the run did (its bleu_tokenize, else the choice for its target language), with its local paths as a model card
shows them (`hf_relpos.publish.hub.shown_record`: data files, command, program, prepared data relative to the folder the
run was started in, else `<local>/NAME`; that folder left out). No file of OUT_DIR holds an absolute local path, so the
folder can be uploaded as it is.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from transformers import AutoTokenizer, GenerationConfig

from ..model.configuration_relpos import RelPosTransformerConfig
from ..model.generation_limits import longest_new_output, relative_limit, shortest_new_output
from ..model.modeling_relpos import RelPosStack, RelPosTransformerForConditionalGeneration
from ..model.positions import UnregisteredSchemeError, built_in_schemes, sinusoids
from ..model.positions_t5 import relative_position_bucket
from ..publish.files import WeightsFileError, expand_home, reading_weights, staged_folder
from ..publish.hub import (
    base_license_sentence,
    example_source,
    fine_tuned_base,
    language_name,
    model_conversion,
    shown_path,
    shown_record,
    source_license_sentence,
    weights_license,
)
from ..publish.records import CTRANSLATE2_EXPORT_RECORD as EXPORT_RECORD
from ..publish.records import RUN_RECORD_FILE, RunRecord, training_record
from ..translation.safety import check_new_output_dir
from ..translation.tokenization import SAVED_TOKENIZER_FILES, has_tokenizer_files, without_loading_arguments

PROGRAM = "hf-relpos-export"
ENGINE_MISSING = ("CTranslate2 is not installed: install the export extra (pip install 'hf_relpos[export]', or "
                  "pip install ctranslate2)")
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")
# the most positions `max_positions` sizes a table for: 2^16 rows of d_model values per stack (alibi: 4 x that many
# buckets per head), far beyond a line to translate; more only allocates until the machine runs out of memory
MAX_POSITIONS = 65536
# transformers' ACT2FN names -> CTranslate2's Activation members computing the same function (gelu_python is gelu's
# exact erf GELU, written out in Python; gelu_accurate, gelu_fast and gelu_pytorch_tanh are gelu_new's tanh
# approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), gelu_fast with sqrt(2/pi) as 0.7978845608).
ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "gelu_python": "GELU", "gelu_new": "GELUTanh",
               "gelu_accurate": "GELUTanh", "gelu_fast": "GELUTanh", "gelu_pytorch_tanh": "GELUTanh",
               "silu": "SWISH", "swish": "SWISH", "quick_gelu": "GELUSigmoid", "tanh": "Tanh", "sigmoid": "Sigmoid"}
# Schemes CTranslate2 cannot express, and why.
REFUSED_SCHEMES = {
    "xl": "Transformer-XL's content and position biases u, v over projected sinusoids have no counterpart in "
          "CTranslate2's Transformer specification",
}
# generate() settings CTranslate2's translate_batch has no option for: exported only at their defaults. (The engine
# maps `bad_words_ids` to translate_batch's suppress_sequences, and a `forced_eos_token_id` that is an end token (as
# in MarianMT's generation configs) to the end token it appends at the length cap.)
UNSUPPORTED_GENERATION = ("do_sample", "num_beam_groups", "diversity_penalty", "forced_bos_token_id",
                          "exponential_decay_length_penalty", "encoder_no_repeat_ngram_size", "constraints",
                          "force_words_ids", "suppress_tokens", "begin_suppress_tokens", "sequence_bias",
                          "encoder_repetition_penalty")
# The values generate() uses for a setting left unset, which Seq2SeqTrainer's evaluation also writes into a model's
# generation config (num_beam_groups 1, do_sample false, ...): they change nothing, so they count as unset.
GENERATION_DEFAULTS = GenerationConfig._get_default_generation_params()


class ExportError(ValueError):
    """A model or option the engine cannot express, or an engine that is not installed (one line)."""


def import_ctranslate2() -> Any:
    """The ctranslate2 module, or an ExportError naming the extra that installs it."""
    try:
        import ctranslate2
    except ImportError:
        raise ExportError(ENGINE_MISSING) from None
    return ctranslate2


def check_exportable_scheme(scheme: Any) -> None:
    """Raises ExportError when CTranslate2 cannot express position scheme `scheme`."""
    if scheme in REFUSED_SCHEMES or scheme not in POSITION_EXPORTS:
        reason = REFUSED_SCHEMES.get(scheme, "the exporter has no mapping for this scheme" if scheme in built_in_schemes()
                                     else "it is not one of hf_relpos' own schemes (registered in other code)")
        raise ExportError(f"position_scheme {scheme!r} cannot be exported to CTranslate2: {reason}; it exports "
                          f"{sorted(POSITION_EXPORTS)}, and hf-relpos-translate or the translation pipeline serve "
                          "this model as it is (PyTorch)")


def check_exportable(config: RelPosTransformerConfig, generation: GenerationConfig | None = None) -> None:
    """Raises ExportError naming the first scheme, config field or generation setting CTranslate2 cannot express."""
    scheme = config.position_scheme
    check_exportable_scheme(scheme)
    export = POSITION_EXPORTS[scheme]
    refusal = export.refusal(config)
    if refusal is not None:
        raise ExportError(refusal)
    if config.keep_absolute_positions and not export.added_to_embeddings and config.absolute_positions_scale != 0:
        raise ExportError(f"keep_absolute_positions with position_scheme {scheme!r} cannot be exported to "
                          "CTranslate2: it adds no position table to the embeddings of a model with relative attention "
                          "(a model whose sinusoids are faded out, absolute_positions_scale 0, exports)")
    if config.encoder_layers == 0:
        raise ExportError("encoder_layers 0 cannot be exported to CTranslate2: its Transformer encoder loads only with "
                          "at least one layer")
    if config.eos_token_id is None:
        raise ExportError("eos_token_id None cannot be exported to CTranslate2: the engine decodes up to an end token, "
                          "and the model names none")
    if config.decoder_start_token_id is None and config.bos_token_id is None:
        raise ExportError("decoder_start_token_id None with bos_token_id None cannot be exported to CTranslate2: the "
                          "engine's decoder starts from one of them, and the model names neither")
    if config.activation_function not in ACTIVATIONS:
        raise ExportError(f"activation_function {config.activation_function!r} cannot be exported to CTranslate2, "
                          f"which computes {sorted(ACTIVATIONS)}")
    refused_fields = {
        "self_attention_window": (config.self_attention_window is not None,
                                  "CTranslate2's sliding_window trims the decoder's cache, it is no symmetric window"),
        "cross_attention_length_scaling": (config.cross_attention_length_scaling,
                                           "CTranslate2 does not scale cross-attention logits by log m"),
        "position_randomization_at_inference": (config.position_randomization_at_inference,
                                                "CTranslate2 decodes at the ordinary positions 0 .. n-1"),
    }
    for name, (is_set, reason) in refused_fields.items():
        if is_set:
            raise ExportError(f"{name} {getattr(config, name)!r} cannot be exported to CTranslate2: {reason}")
    if generation is not None:
        unsupported = [f"{name} {value!r}" for name in UNSUPPORTED_GENERATION
                       if (value := getattr(generation, name, None)) not in (None, GENERATION_DEFAULTS.get(name))]
        if unsupported:
            raise ExportError(f"generation_config {', '.join(unsupported)} cannot be exported: CTranslate2's "
                              "translate_batch has no such option; remove them from generation_config.json to "
                              "export")
        try:   # the saved decoding, as the engine will run it
            translate_options(generation)
        except ExportError as error:
            raise ExportError(f"generation_config {error}; remove it from generation_config.json to export") from None
        forced_end, end = generation.forced_eos_token_id, generation.eos_token_id
        if forced_end is not None and forced_end not in (end if isinstance(end, list) else [end]):
            raise ExportError(f"generation_config forced_eos_token_id {forced_end!r} cannot be exported: it is not "
                              f"an end token (eos_token_id {end!r}), which is all the engine can force at the length "
                              "cap")


def _array(tensor: torch.Tensor) -> Any:
    """A float32 numpy copy (CTranslate2 stores float32 at most; quantization happens when it saves)."""
    return tensor.detach().to(device="cpu", dtype=torch.float32).numpy().copy()


def _sinusoid_table(rows: int, config: RelPosTransformerConfig, scale: float = 1.0) -> Any:
    return _array(scale * sinusoids(torch.arange(rows), config.d_model, torch.float64))


def _absolute(spec: Any, stack: RelPosStack, config: RelPosTransformerConfig, rows: int) -> None:
    spec.position_encodings.encodings = _sinusoid_table(rows, config)


def _none(spec: Any, stack: RelPosStack, config: RelPosTransformerConfig, rows: int) -> None:
    kept = config.keep_absolute_positions
    spec.position_encodings.encodings = (_sinusoid_table(rows, config, config.absolute_positions_scale) if kept
                                         else _array(torch.zeros(rows, config.d_model)))


def _shaw(spec: Any, stack: RelPosStack, config: RelPosTransformerConfig, rows: int) -> None:
    scheme = stack.positions
    shape = (2 * scheme.max_relative_position + 1, scheme.head_dim)
    for index, layer in enumerate(spec.layer):
        keys, values = (torch.zeros(shape) if table is None else table[index]
                        for table in (scheme.relative_keys, scheme.relative_values))
        layer.self_attention.relative_position_keys = _array(keys)
        layer.self_attention.relative_position_values = _array(values)


def _set_relative_attention_bias(spec: Any, table: torch.Tensor, max_distance: int) -> None:
    """Every layer's self-attention adds `table` [buckets, heads] at T5's bucket of each offset j - i."""
    import numpy as np

    table, max_distance = _array(table), np.dtype("int32").type(max_distance)   # one copy, given to every layer
    for layer in spec.layer:
        layer.self_attention.relative_attention_bias = table
        layer.self_attention.relative_attention_max_distance = max_distance


def _t5(spec: Any, stack: RelPosStack, config: RelPosTransformerConfig, rows: int) -> None:
    _set_relative_attention_bias(spec, stack.positions.relative_attention_bias.weight,   # [buckets, heads], as T5's
                                 config.relative_attention_max_distance)


def _alibi(spec: Any, stack: RelPosStack, config: RelPosTransformerConfig, rows: int) -> None:
    """-m_h |j - i| in T5's buckets, one bucket per offset of at most `rows` positions: T5 gives the offsets below
    buckets / 4 (bidirectional, the encoder) or buckets / 2 (unidirectional, the decoder) a bucket each. The bias is
    computed in float32 as the model's (`AlibiPositions.prepare`). Beyond, T5's logarithmic buckets (offsets up to
    `buckets`, then the last) get the bias of their nearest offset, an approximation for the longer inputs CTranslate2
    alone does not refuse."""
    causal = stack.positions.is_causal
    buckets = (2 if causal else 4) * rows
    offsets = torch.arange(-buckets, 1 if causal else buckets + 1)
    bucket = relative_position_bucket(offsets, bidirectional=not causal, num_buckets=buckets, max_distance=buckets)
    nearest = torch.full((buckets,), buckets).scatter_reduce(0, bucket, offsets.abs(), "amin")
    slopes = torch.tensor(stack.positions.slopes, dtype=torch.float32)
    _set_relative_attention_bias(spec, -slopes * nearest.to(torch.float32)[:, None], buckets)


# The bias of a key a directional head may not see: its exp underflows to exactly 0 in float32 beside any score within
# about 9,900 of the row's largest, as -inf's does, and it is finite in float16. With -inf a padding query of a
# backward head (no key at or after it) is NaN, which the engine keeps where it does not remove padding (CUDA in
# float16: `Padder::allow_padding_removal`) and which then spreads through the next layer's 0 x NaN to the whole row.
MASKED_BIAS = -1e4


def _directional(spec: Any, stack: RelPosStack, config: RelPosTransformerConfig, rows: int) -> None:
    """Each head's direction mask (j <= i forward, j >= i backward, every j both; the diagonal allowed) as a bias of 0
    or `MASKED_BIAS` over T5's buckets: 4 in the bidirectional encoder (offset 0, below, unused, above), 2 in the causal
    decoder (offset 0, below)."""
    causal = stack.positions.is_causal
    offsets = torch.tensor([-1, 0] if causal else [-1, 0, 1])
    bucket = relative_position_bucket(offsets, bidirectional=not causal, num_buckets=2 if causal else 4,
                                      max_distance=2)
    allowed = {"forward": offsets <= 0, "backward": offsets >= 0, "both": torch.ones_like(offsets, dtype=torch.bool)}
    table = torch.zeros(2 if causal else 4, len(stack.positions.head_directions))
    for head, direction in enumerate(stack.positions.head_directions):
        table[bucket, head] = torch.where(allowed[direction], 0.0, MASKED_BIAS)
    _set_relative_attention_bias(spec, table, 2)


@dataclass(frozen=True)
class SchemeExport:
    """How one scheme enters CTranslate2's specification: `options` of both stacks' specifications (from the config),
    `write` of its tables into a stack's specification (given the positions they cover), whether a table covers a
    number of positions (`max_positions`), which then bound the lengths of sources and translations, whether
    that table is added to the embeddings, and `refusal`: why the engine cannot express a config of this scheme (one
    line naming the field; None where it can)."""

    options: Callable[[RelPosTransformerConfig], dict]
    write: Callable[[Any, RelPosStack, RelPosTransformerConfig, int], None]
    position_table: bool = False
    added_to_embeddings: bool = False
    refusal: Callable[[RelPosTransformerConfig], str | None] = lambda config: None


def _nothing_to_write(spec: Any, stack: RelPosStack, config: RelPosTransformerConfig, rows: int) -> None:
    """rope: the rotation is all in the specification's options."""


def _shaw_refusal(config: RelPosTransformerConfig) -> str | None:
    """Why CTranslate2 cannot express this Shaw model (None: it can): one table per head."""
    if not config.relative_embeddings_shared_across_heads:
        return ("relative_embeddings_shared_across_heads false cannot be exported to CTranslate2: its "
                "relative_position tables are shared by the heads of a layer (OpenNMT-py's)")
    return None


def _directional_refusal(config: RelPosTransformerConfig) -> str | None:
    """Why CTranslate2 cannot express this directional model (None: it can): queries without a key."""
    if config.directional_disable_diagonal:
        return ("directional_disable_diagonal true cannot be exported to CTranslate2: a head's query left without a "
                "key (the first or last position) outputs zeros, which the engine's softmax cannot give; a "
                "directional model trained with directional_disable_diagonal false exports")
    return None


POSITION_EXPORTS: dict[str, SchemeExport] = {
    "absolute": SchemeExport(lambda config: {}, _absolute, position_table=True, added_to_embeddings=True),
    "none": SchemeExport(lambda config: {}, _none, position_table=True, added_to_embeddings=True),
    "shaw": SchemeExport(lambda config: {"relative_position": True}, _shaw, refusal=_shaw_refusal),
    "t5": SchemeExport(lambda config: {"relative_attention_bias": True}, _t5),
    "rope": SchemeExport(lambda config: {"rotary_dim": config.rotary_dim or 0, "rotary_interleave": True,
                                         "rotary_base": float(config.rope_theta)}, _nothing_to_write),
    "alibi": SchemeExport(lambda config: {"relative_attention_bias": True}, _alibi, position_table=True),
    "directional": SchemeExport(lambda config: {"relative_attention_bias": True}, _directional,
                                refusal=_directional_refusal),
}
BOUNDED_SCHEMES = sorted(name for name, export in POSITION_EXPORTS.items() if export.position_table)


def build_spec(model: RelPosTransformerForConditionalGeneration, tokens: list[str], unk_token: str | None,
               position_rows: int | None = None) -> Any:
    """The CTranslate2 `TransformerSpec` of `model` with the vocabulary `tokens` (id order), weights set; a position
    table (`absolute`, `none`, `alibi`) covers `position_rows` positions (None: max_position_embeddings)."""
    from ctranslate2.converters import utils
    from ctranslate2.specs import common_spec, transformer_spec

    config = model.config
    check_exportable(config)
    scheme = POSITION_EXPORTS[config.position_scheme]
    common = {"pre_norm": config.layer_norm_position == "pre",
              "activation": getattr(common_spec.Activation, ACTIVATIONS[config.activation_function]),
              **scheme.options(config)}
    encoder_spec = transformer_spec.TransformerEncoderSpec(
        config.encoder_layers, config.encoder_attention_heads, **common)
    decoder_spec = transformer_spec.TransformerDecoderSpec(
        config.decoder_layers, config.decoder_attention_heads, **common)
    encoder, decoder = model.get_encoder(), model.get_decoder()
    for spec, stack in ((encoder_spec, encoder), (decoder_spec, decoder)):
        spec.scale_embeddings = bool(config.scale_embedding)
        embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
        embeddings.weight = _array(stack.embed_tokens.weight)
        if stack.layer_norm is not None:
            _set_layer_norm(spec.layer_norm, stack.layer_norm)
        for layer_spec, layer in zip(spec.layer, stack.layers, strict=True):
            _set_attention(layer_spec.self_attention, layer.self_attn, layer.self_attn_layer_norm, utils, fused=True)
            if layer.encoder_attn is not None:
                _set_attention(layer_spec.attention, layer.encoder_attn, layer.encoder_attn_layer_norm, utils,
                               fused=False)
            _set_linear(layer_spec.ffn.linear_0, layer.feed_forward.fc1)
            _set_linear(layer_spec.ffn.linear_1, layer.feed_forward.fc2)
            _set_layer_norm(layer_spec.ffn.layer_norm, layer.final_layer_norm)
        if hasattr(spec, "position_encodings") and not scheme.added_to_embeddings:
            del spec.position_encodings  # relative schemes: no table (the engine adds nothing to the embeddings)
        scheme.write(spec, stack, config, position_rows or config.max_position_embeddings)
    _set_linear(decoder_spec.projection, model.lm_head)
    decoder_spec.projection.bias = _array(model.final_logits_bias.reshape(-1))
    spec = transformer_spec.TransformerSpec(encoder_spec, decoder_spec)
    spec.config.layer_norm_epsilon = float(model.get_encoder().layers[0].final_layer_norm.eps)
    spec.config.unk_token = unk_token if unk_token in tokens else tokens[config.pad_token_id]
    # the decoder starts from decoder_start_token_id, else (as generate) from bos_token_id; a model without a bos token
    # (MarianConfig's default) names the start token as the engine's bos token
    start = config.decoder_start_token_id if config.decoder_start_token_id is not None else config.bos_token_id
    spec.config.bos_token = tokens[start if config.bos_token_id is None else config.bos_token_id]
    spec.config.eos_token = tokens[config.eos_token_id]
    spec.config.decoder_start_token = tokens[start]
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    return spec


def _set_linear(spec: Any, linear: torch.nn.Linear) -> None:
    spec.weight = _array(linear.weight)
    if linear.bias is not None:
        spec.bias = _array(linear.bias)


def _set_layer_norm(spec: Any, norm: torch.nn.LayerNorm) -> None:
    spec.gamma = _array(norm.weight)
    spec.beta = _array(norm.bias)


def _set_attention(spec: Any, attention: torch.nn.Module, norm: torch.nn.LayerNorm, utils: Any, fused: bool) -> None:
    """CTranslate2's attention linears: [QKV, out] for self-attention, [Q, KV, out] for cross-attention."""
    from ctranslate2.specs import common_spec

    split = [common_spec.LinearSpec() for _ in range(3)]
    for linear_spec, linear in zip(split, (attention.q_proj, attention.k_proj, attention.v_proj), strict=True):
        _set_linear(linear_spec, linear)
    if fused:
        utils.fuse_linear(spec.linear[0], split)
    else:
        utils.fuse_linear(spec.linear[0], split[:1])
        utils.fuse_linear(spec.linear[1], split[1:])
    _set_linear(spec.linear[-1], attention.out_proj)
    _set_layer_norm(spec.layer_norm, norm)


def vocabulary(tokenizer: Any, vocab_size: int) -> list[str]:
    """The tokens of ids 0 .. vocab_size - 1; ids the tokenizer lacks (a vocabulary padded to a multiple) get unique
    placeholder tokens, which the tokenizer never produces."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(min(len(tokenizer), vocab_size))))
    taken = set(tokens)
    for index in range(len(tokens), vocab_size):
        token = f"<hf_relpos_unused_{index}>"
        if token in taken:
            raise ExportError(f"the tokenizer already has a token {token!r}; cannot pad the vocabulary")
        tokens.append(token)
    if len(set(tokens)) != len(tokens):
        raise ExportError("the tokenizer maps two ids to the same token: CTranslate2 needs distinct tokens")
    return tokens


def check_tokenizer_saved(folder: str | Path) -> None:
    """One error when the model folder `folder` holds no saved tokenizer (`has_tokenizer_files`)."""
    if not has_tokenizer_files(folder):
        raise ExportError(f"the model folder {str(folder)!r} has no tokenizer ({' or '.join(SAVED_TOKENIZER_FILES)}): "
                          "save the tokenizer beside the model (tokenizer.save_pretrained(folder))")


def is_ctranslate2_folder(folder: str | Path) -> bool:
    """Whether `folder` is an export of `hf-relpos-export ctranslate2` (it holds its record)."""
    return (Path(folder) / EXPORT_RECORD).is_file()


def export_ctranslate2(model_dir: str | Path, out_dir: str | Path, quantization: str | None = None,
                       max_positions: int | None = None) -> Path:
    """Export the translation model saved in `model_dir` (model, tokenizer, generation config) to a CTranslate2
    folder `out_dir` (which must not exist, or be empty), weights stored as `quantization` (one of QUANTIZATIONS;
    None: float32). A scheme exported as a position table (`absolute`, `none`, `alibi`) covers `max_positions`
    positions (None: max_position_embeddings; at most MAX_POSITIONS), which bound the sources and translations the
    export serves.
    Everything that could refuse is checked before anything is written; returns `out_dir`."""
    if is_ctranslate2_folder(model_dir):
        source = json.loads((Path(model_dir) / EXPORT_RECORD).read_text(encoding="utf-8")).get("source_model")
        raise ExportError(f"MODEL_DIR {str(model_dir)!r} is already a CTranslate2 export (of {source!r}); MODEL_DIR "
                          "must be a trained model folder (model.safetensors, config.json, tokenizer), such as that one")
    ctranslate2 = import_ctranslate2()
    out_dir = Path(out_dir)
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ExportError(f"quantization must be one of {list(QUANTIZATIONS)}, got {quantization!r}")
    check_new_output_dir(out_dir, setting="OUT_DIR")
    try:
        config = RelPosTransformerConfig.from_pretrained(model_dir)
    except UnregisteredSchemeError as error:   # a scheme registered in code this process has not imported
        check_exportable_scheme(error.scheme)
        raise
    generation = _generation_config(model_dir)
    check_exportable(config, generation)
    position_table = POSITION_EXPORTS[config.position_scheme].position_table
    if max_positions is not None:
        if isinstance(max_positions, bool) or not isinstance(max_positions, int) or max_positions < 1:
            raise ExportError(f"max_positions must be a positive integer, got {max_positions!r}")
        if max_positions > MAX_POSITIONS:
            raise ExportError(f"max_positions must be between 1 and {MAX_POSITIONS} (the rows of the position table, "
                              f"the longest source and translation in tokens), got {max_positions}")
        if not position_table:
            raise ExportError(f"max_positions sizes the position table of {', '.join(BOUNDED_SCHEMES)}; "
                              f"position_scheme {config.position_scheme!r} exports no such table and has no length "
                              "bound")
    check_tokenizer_saved(model_dir)
    tokenizer = without_loading_arguments(AutoTokenizer.from_pretrained(model_dir))   # saved with the export
    try:
        with reading_weights():
            model = RelPosTransformerForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    except WeightsFileError as error:
        raise ExportError(f"MODEL_DIR {str(model_dir)!r}: {error}") from None
    rows = max_positions or config.max_position_embeddings
    spec_tokens = vocabulary(tokenizer, config.vocab_size)
    spec = build_spec(model, spec_tokens, tokenizer.unk_token, rows)
    spec.validate()
    spec.optimize(quantization=quantization)
    run = training_record(model_dir)
    record = {
        "engine": "ctranslate2",
        "ctranslate2_version": ctranslate2.__version__,
        "quantization": quantization or "float32",
        # the source folder as a card shows a path (`shown_path`): relative to the folder the export runs in, else
        # <local>/NAME, so that an upload of the folder as it is publishes no local folders
        "source_model": shown_path(Path(model_dir).resolve().as_posix(), Path.cwd().resolve().as_posix()),
        "position_scheme": config.position_scheme,
        "position_table_rows": rows if position_table else None,
    }
    with staged_folder(out_dir, last="model.bin") as staging:   # what CTranslate2 loads
        spec.save(str(staging))
        tokenizer.save_pretrained(staging)
        (staging / "hf_relpos_config.json").write_text(config.to_json_string(), encoding="utf-8")
        if generation is not None:
            generation.save_pretrained(staging)
        (staging / EXPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        if run is not None:   # languages and recipe of the run, for its scoring; its local paths as a card shows them
            (staging / RUN_RECORD_FILE).write_text(json.dumps(shown_record(run).to_json(), indent=1) + "\n",
                                                   encoding="utf-8")
        (staging / "README.md").write_text(export_card(Path(model_dir), out_dir, config, generation, record, run,
                                                       spec_tokens),
                                           encoding="utf-8")
    return out_dir


def start_and_end_tokens(config: GenerationConfig) -> tuple[int | None, list[int | None]]:
    """The token the decoder starts from (decoder_start_token_id, else bos_token_id) and the end tokens (eos_token_id,
    one or a list) of the generation settings `config`."""
    start = config.decoder_start_token_id if config.decoder_start_token_id is not None else config.bos_token_id
    return start, config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]


def banned_sequences(config: GenerationConfig) -> list[list[int]]:
    """The token-id sequences the engine must suppress (translate_batch's `suppress_sequences`) to decode as generate
    does with `config`: its `bad_words_ids` and, under `no_repeat_ngram_size` 1, the decoder start token, which
    generate's history holds from the first step (the engine's holds the generated tokens only)."""
    banned = [list(ids) for ids in config.bad_words_ids or []]
    if (config.no_repeat_ngram_size or 0) == 1:
        banned.append([start_and_end_tokens(config)[0]])
    return banned


def translate_options(config: GenerationConfig) -> dict[str, Any]:
    """CTranslate2's `translate_batch` options for the generation settings `config` (greedy or beam search): beam,
    length penalty, the most and fewest new tokens after the decoder start token, repetition penalty, blocked
    n-grams. Banned words need the vocabulary (`CTranslate2Model.decoding_options` adds them). A repetition penalty
    the engine would apply otherwise than generate (beam search; a decoder starting from its end token) is an
    ExportError."""
    if config.do_sample:
        raise ExportError("do_sample: this exported model decodes with greedy or beam search only")
    beams, penalty = config.num_beams or 1, float(config.repetition_penalty or 1.0)
    if beams > 1 and penalty != 1.0:
        raise ExportError(f"repetition_penalty {penalty:g} with num_beams {beams}: generate's beam search applies the "
                          "penalty to the log-probabilities, CTranslate2's to the logits before the softmax, so their "
                          "translations differ; decode with num_beams 1 (greedy search penalises the logits in both) "
                          "or without repetition_penalty")
    start, ends = start_and_end_tokens(config)
    if penalty != 1.0 and start is not None and start in ends:
        raise ExportError(f"repetition_penalty {penalty:g} with a decoder that starts from its end token "
                          f"(decoder_start_token_id {start}): generate penalises the end token from the first step, as "
                          "the start token is in the history it penalises, and CTranslate2's history holds the "
                          "generated tokens only, so their translations differ; decode without repetition_penalty")
    return {
        "beam_size": beams,
        "length_penalty": 1.0 if config.length_penalty is None else float(config.length_penalty),
        "max_decoding_length": max(1, longest_new_output(config, prompt_length=1)),
        "min_decoding_length": shortest_new_output(config, prompt_length=1),
        "repetition_penalty": penalty,
        "no_repeat_ngram_size": config.no_repeat_ngram_size or 0,
    }


def export_card(model_dir: Path, out_dir: Path, config: RelPosTransformerConfig, generation: GenerationConfig | None,
                record: dict[str, Any], run: RunRecord | None, tokens: list[str]) -> str:
    """README.md of an exported folder: what it is, the decoding it saves (`run`: the source folder's run record, for
    its languages), and how to translate with it, through hf-relpos-translate and with CTranslate2 and transformers
    alone (`FOLDER` standing for its path; `tokens`: the engine's vocabulary, which names the banned tokens). Its
    license is the model's (`weights_license`): hf_relpos' own, for weights converted from a pretrained model or
    fine-tuned from such a conversion (`model_conversion`) the pretrained model's, for weights fine-tuned from
    another model (`fine_tuned_base`) that model's (`other` where its card is not read); the text names it."""
    languages = [run.source_lang, run.target_lang] if run is not None else []
    conversion = model_conversion(model_dir, run)
    base = fine_tuned_base(run, conversion)
    metadata = {"language": languages, "library_name": "ctranslate2", "license": weights_license(conversion, base),
                "pipeline_tag": "translation",
                "tags": ["translation", "ctranslate2", "hf_relpos", config.position_scheme]}
    if not languages:
        del metadata["language"]
    pair = (f"{language_name(languages[0])}→{language_name(languages[1])}, "
            if languages else "")
    saved = ("Saved decoding (`generation_config.json`)" if generation is not None else
             "Decoding (the source model saved no generation_config.json, so neither does this folder: transformers' "
             "defaults)")
    generation = generation or GenerationConfig()
    options = translate_options(generation)
    beams, length_penalty, ceiling = (options[name] for name in ("beam_size", "length_penalty", "max_decoding_length"))
    limit = relative_limit(generation)
    cap = (f"at most {limit[0]:g} x source tokens + {limit[1]} new tokens (and never more than {ceiling})"
           if limit is not None else f"at most {ceiling} new tokens")
    # the engine decodes one token short of a source-relative cap and ends the row there (CTranslate2Model.generate)
    # and, with forced_eos_token_id, one short of the ceiling
    forced_end = generation.forced_eos_token_id is not None
    # what hf-relpos-translate caps each output by: the source-relative cap where one is saved, else the ceiling alone
    capped = ("each output capped relative to its own source" if limit is not None else
              f"each output capped at {ceiling} new tokens, however long its source")
    longest = (f"min(int({limit[0]:g} * len(source) + {limit[1]}), {ceiling}) - 1" if limit is not None
               else str(ceiling - 1 if forced_end else ceiling))
    # the saved settings beyond beam, length penalty and cap, as CTranslate2Model.decoding_options passes them
    banned = [[tokens[token] for token in ids] for ids in banned_sequences(generation)]
    saved_settings = [
        ("minimum length", options["min_decoding_length"] > 0,
         f"min_decoding_length=min({options['min_decoding_length']}, {longest})"),
        ("repetition penalty", options["repetition_penalty"] != 1.0,
         f"repetition_penalty={options['repetition_penalty']:g}"),
        ("blocked n-grams", options["no_repeat_ngram_size"] > 0,
         f"no_repeat_ngram_size={options['no_repeat_ngram_size']}"),
        ("banned tokens", bool(banned), f"suppress_sequences={banned!r}")]
    extra = {what: option for what, saved, option in saved_settings if saved}
    extra_options = "".join(f",\n                                    {option}" for option in extra.values())
    extra_text = f", and the saved {', '.join(extra)}" if extra else ""
    rows = record["position_table_rows"]
    table = "" if rows is None else (
        f" Its position table serves sources and translations of at most {rows} tokens (`--max_positions` of the "
        "export)." if POSITION_EXPORTS[config.position_scheme].added_to_embeddings else
        # CTranslate2 refuses a position beyond its position table, but not an offset beyond T5's exact buckets
        f" Its bias table is exact for sources and translations of at most {rows} tokens (`--max_positions` of the "
        "export): `hf-relpos-translate` refuses longer ones, CTranslate2 alone does not (tokens farther apart get the "
        "bias of T5's logarithmic bucket they fall in, an approximation), so keep the sources and "
        "`max_decoding_length` of the call below within it.")
    # this README.md is the export's own: the source model's card (its training and scores) stays in the source
    # folder, named here by its folder name (the export record's `source_model`: its path as `shown_path` shows it)
    source_card = (f" How it was trained and what it scored: the model card (README.md) in the source model's folder "
                   f"`{model_dir.resolve().name}` (`source_model` in `{EXPORT_RECORD}`); this folder does not hold "
                   "that card." if (model_dir / "README.md").is_file() else "")
    norm = "Pre-LN" if config.layer_norm_position == "pre" else "Post-LN"
    fine_tuned = run is not None and run.model_name_or_path is not None
    converted = "" if conversion is None else (
        f" {'It was fine-tuned from a conversion of' if fine_tuned else 'Its weights are'} the "
        f"{conversion.architecture} model `{shown_path(conversion.source)}`"
        f"{'' if fine_tuned else ', converted'} by `hf-relpos-convert {conversion.source_type}`. "
        f"{source_license_sentence(conversion)}") + (f" {base_license_sentence(base)}" if base else "")
    return f"""---
{yaml.safe_dump(metadata, sort_keys=False, allow_unicode=True)}---

# {out_dir.resolve().name}

The hf_relpos translation model `{model_dir.resolve().name}` ({pair}position scheme `{config.position_scheme}`, {norm}) exported to
[CTranslate2](https://github.com/OpenNMT/CTranslate2) {record["ctranslate2_version"]} by `hf-relpos-export ctranslate2`,
weights stored as `{record["quantization"]}`.{converted}{source_card}

{saved}: beam {beams}, length penalty {length_penalty:g}, {cap}.{table}

## How to use

`FOLDER` stands for the path of this folder. With hf_relpos installed, `hf-relpos-translate` applies the saved
tokenization and decoding (sentence by sentence, {capped}):

```bash
hf-relpos-translate FOLDER --input source.txt --output translations.txt
```

With CTranslate2 and transformers alone (the saved beam and length penalty, the cap as the longest decoding{extra_text}):

```python
import ctranslate2
from transformers import AutoTokenizer

translator = ctranslate2.Translator("FOLDER")
tokenizer = AutoTokenizer.from_pretrained("FOLDER")
source = tokenizer.convert_ids_to_tokens(tokenizer("{example_source(languages[0] if languages else None)}").input_ids)
result = translator.translate_batch([source], beam_size={beams}, length_penalty={length_penalty:g}, max_input_length=0,
                                    max_decoding_length={longest}{extra_options})
print(tokenizer.decode(tokenizer.convert_tokens_to_ids(result[0].hypotheses[0]), skip_special_tokens=True))
```

`translate_batch` translates each source in one piece, as given. A model trained on single sentences (as the recipes
train) tends to translate a text of several sentences given in one piece only up to about its first sentence: give it
one sentence a source and join their translations, as `hf-relpos-translate` does with each line (unless
`--no_split_sentences`).
"""


def _generation_config(model_dir: str | Path) -> GenerationConfig | None:
    if not (Path(model_dir) / "generation_config.json").is_file():
        return None
    return GenerationConfig.from_pretrained(model_dir)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.split("\n\n")[0])
    engines = parser.add_subparsers(dest="engine", required=True, metavar="ENGINE")
    engine = engines.add_parser("ctranslate2", help="CTranslate2 (OpenNMT's inference engine)",
                                description="Export a saved hf_relpos translation model to a CTranslate2 folder.")
    engine.add_argument("model_dir", type=expand_home, metavar="MODEL_DIR",
                        help="saved model folder (model, tokenizer, generation config; e.g. a train_translation.py "
                             "output_dir)")
    engine.add_argument("out_dir", type=expand_home, metavar="OUT_DIR",
                        help="the CTranslate2 folder to write (new or empty)")
    engine.add_argument("--quantization", choices=QUANTIZATIONS,
                        help="weight type in the engine (default: float32); int8: about 4x smaller and faster on CPU")
    engine.add_argument("--max_positions", type=int, metavar="N",
                        help=f"{', '.join(BOUNDED_SCHEMES)} only: positions the position table covers, the longest "
                             f"source and translation (in tokens) the export serves, 1 to {MAX_POSITIONS} (default: the "
                             "model's max_position_embeddings); the PyTorch model has no such bound")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not Path(args.model_dir).is_dir():
        parser.exit(2, f"{PROGRAM}: error: no model folder {args.model_dir!r}\n")
    try:
        out_dir = export_ctranslate2(args.model_dir, args.out_dir, args.quantization, args.max_positions)
    except (ValueError, OSError) as error:  # ExportError, and a folder that is no hf_relpos model
        parser.exit(2, f"{PROGRAM}: error: {' '.join(str(error).split())}\n")
    print(f"{PROGRAM}: wrote {out_dir} (CTranslate2, {args.quantization or 'float32'}); translate with: "
          f"hf-relpos-translate {out_dir} --input SRC.txt")


if __name__ == "__main__":
    main()
