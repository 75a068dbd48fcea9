"""Bring a pretrained MarianMT model to hf_relpos: `python -m hf_relpos.tools.convert marian SRC OUT --position_scheme shaw`.

Marian (transformers' `MarianMTModel`) is the architecture hf_relpos generalises: Post-LN blocks, sinusoidal absolute
positions added to the (scaled) token embeddings, one embedding matrix shared by encoder, decoder and output
projection, a `final_logits_bias`. Its field names are already ours; what moves is
`layers.N.fc{1,2}` -> `layers.N.feed_forward.fc{1,2}`, and the sinusoid tables go (they are parameter-free: the
`absolute` scheme computes the same [sin | cos] layout on the fly, checked here against the source's table).

- `position_scheme="absolute"` reproduces the Marian model: same logits (float32 rounding), same beam search.
- Any other scheme removes the sinusoids and starts its own parameters neutral (`PositionScheme.start_neutral`:
  e.g. Shaw's tables and Transformer-XL's u, v, W_kR at zero). Where zero parameters add zero terms (shaw, xl, t5,
  none) the switch costs exactly the absolute positions and adds nothing; rope, alibi and directional change
  attention from the first step (rotations, fixed biases, masks). Fine-tuning (`train_translation.py
  --model_name_or_path OUT`) teaches the new terms.
- `keep_absolute_positions=True` (`--keep_absolute_positions`) keeps the sinusoids and adds the scheme on top of
  them, starting neutral: the converted model is the Marian model (same logits, same beam search) and fine-tuning
  can only add. Only a scheme whose neutral start changes nothing converts so (Shaw, Transformer-XL, T5: zero
  parameters add zero terms); one that still rotates queries and keys, adds fixed biases or masks pairs is refused.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import sys
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import hf_hub_download
from huggingface_hub.errors import EntryNotFoundError
from transformers import (
    AutoConfig,
    AutoTokenizer,
    GenerationConfig,
    MarianConfig,
    MarianMTModel,
    PreTrainedTokenizerBase,
)
from transformers.tokenization_utils_base import VERY_LARGE_INTEGER
from transformers.utils import CONFIG_NAME

from ..model.configuration_relpos import RelPosTransformerConfig, field_named
from ..model.modeling_relpos import RelPosTransformerForConditionalGeneration
from ..model.positions import (
    POSITION_SCHEMES,
    PositionContext,
    PositionScheme,
    get_scheme_class,
    sinusoids,
    warn_renamed,
)
from ..publish.files import apply_umask_mode_to_weights, expand_home, staged_folder
from ..publish.hub import CARD_FILE, add_translation_pipeline, card_license
from ..publish.records import ConversionRecord, ambiguous_number_error, load_yaml
from ..translation.arguments import ConfigError, add_import_modules_argument, import_modules_hint, import_modules_of
from ..translation.preflight import check_model_source
from ..translation.safety import check_new_output_dir
from ..translation.tokenization import without_loading_arguments

logger = logging.getLogger(__name__)

# MarianConfig fields that carry over unchanged (the names are shared).
SHARED_CONFIG_FIELDS = (
    "vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
    "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "activation_function", "dropout",
    "attention_dropout", "activation_dropout", "init_std", "scale_embedding", "max_position_embeddings", "use_cache",
    "pad_token_id", "eos_token_id", "bos_token_id", "decoder_start_token_id", "tie_word_embeddings",
)
# Fields that define Marian's weights and computation: an override would break the mapping or the model.
FIELDS_FROM_MARIAN = (
    *(name for name in SHARED_CONFIG_FIELDS
      if name not in ("dropout", "attention_dropout", "activation_dropout", "init_std", "use_cache")),
    "layer_norm_position",
)
# Fields a conversion may set: how the converted model trains and runs, never what it computes at step 0; beside
# them, the chosen scheme's own fields, and for a plain switch to a relative scheme (which already changes what the
# model computes) the fields that change attention beyond the scheme.
OVERRIDABLE_FIELDS = ("dropout", "attention_dropout", "activation_dropout", "attention_dropout_kind", "init_std",
                      "use_cache", "keep_absolute_positions")
# The attention kernel is not saved with a model: transformers picks it when the model is loaded.
KERNEL_CHOICE = ("attn_implementation is not saved with a model, so a conversion cannot set it: pass it when the "
                 "converted folder is loaded (from_pretrained(..., attn_implementation=...), --attn_implementation of "
                 "hf-relpos-train and hf-relpos-translate), or call set_attn_implementation on the converted model")
SWITCH_ONLY_FIELDS = ("self_attention_window", "cross_attention_length_scaling")
# the files of a MarianMT folder's own tokenizer (MarianTokenizer), which its converted model keeps
MARIAN_TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json")
# Marian's module names that differ from ours.
RENAMED_MODULES = ((".fc1.", ".feed_forward.fc1."), (".fc2.", ".feed_forward.fc2."))


def reproduces_marian(position_scheme: str, keep_absolute_positions: bool) -> bool:
    """Whether the conversion computes the Marian model's logits: Marian's own positions (`absolute`), or the hybrid
    (a scheme added to the kept sinusoids, starting neutral)."""
    return position_scheme == "absolute" or keep_absolute_positions


def check_overridable(config_overrides: dict[str, Any], position_scheme: str) -> None:
    """Each override is one a conversion may set (`OVERRIDABLE_FIELDS`, the scheme's fields, and `SWITCH_ONLY_FIELDS`
    where the model does not keep Marian's computation: a relative scheme without keep_absolute_positions); a
    field defining Marian's weights (also under an alias), a generation setting or any other name is one ValueError
    naming it."""
    fixed = sorted(name if field_named(name) == name else f"{name} (= {field_named(name)})"
                   for name in config_overrides if field_named(name) in FIELDS_FROM_MARIAN)
    if fixed:
        raise ValueError(f"{', '.join(fixed)} come(s) from the Marian model and cannot be overridden; overridable: "
                         f"{', '.join(OVERRIDABLE_FIELDS)} and the position scheme's fields")
    generation_settings = GenerationConfig().to_dict()
    scheme_class = POSITION_SCHEMES.get(position_scheme)
    allowed = {*OVERRIDABLE_FIELDS, *(field.name for field in getattr(scheme_class, "config_fields", ()))}
    if not reproduces_marian(position_scheme, bool(config_overrides.get("keep_absolute_positions"))):
        allowed.update(SWITCH_ONLY_FIELDS)
    for name in config_overrides:
        if name == "attn_implementation":
            raise ValueError(KERNEL_CHOICE)
        if name in generation_settings and field_named(name) not in allowed:   # use_cache is a config field too
            raise ValueError(f"{name} is a generation setting, not a config field: the converted model keeps the "
                             "source's generation config; edit generation_config.json in the output folder")
        if field_named(name) not in allowed:
            why = (f" (it changes what the model computes, and a {position_scheme} conversion"
                   f"{' with keep_absolute_positions' if position_scheme != 'absolute' else ''} reproduces Marian)"
                   if name in SWITCH_ONLY_FIELDS else "")
            raise ValueError(f"{name} cannot be set in a conversion{why}; settable: {', '.join(sorted(allowed))}")


def marian_config_to_relpos(marian_config: MarianConfig, position_scheme: str,
                            **config_overrides: Any) -> RelPosTransformerConfig:
    """The RelPosTransformerConfig of a Marian model with `position_scheme` (Post-LN, as Marian); `config_overrides`
    set any other field (a scheme's settings, dropout, ...). Marian features hf_relpos lacks are errors."""
    if not marian_config.share_encoder_decoder_embeddings:
        raise ValueError("share_encoder_decoder_embeddings must be true: hf_relpos shares one embedding matrix between "
                         "encoder and decoder, this Marian model has separate source and target vocabularies")
    if marian_config.decoder_vocab_size not in (None, marian_config.vocab_size):
        raise ValueError(f"decoder_vocab_size ({marian_config.decoder_vocab_size}) must equal vocab_size "
                         f"({marian_config.vocab_size}): hf_relpos has one joint vocabulary")
    if getattr(marian_config, "normalize_before", False) or getattr(marian_config, "add_final_layer_norm", False):
        raise ValueError("normalize_before / add_final_layer_norm must be false: only Marian's Post-LN blocks convert")
    for layerdrop in ("encoder_layerdrop", "decoder_layerdrop"):
        if getattr(marian_config, layerdrop, 0.0):
            logger.warning("%s=%s is dropped: hf_relpos has no LayerDrop (inference is unchanged)", layerdrop,
                           getattr(marian_config, layerdrop))
    check_overridable(config_overrides, position_scheme)
    fields = {name: getattr(marian_config, name) for name in SHARED_CONFIG_FIELDS}
    if isinstance(fields["eos_token_id"], list):
        raise ValueError(f"eos_token_id must be one id, got {fields['eos_token_id']!r}")
    return RelPosTransformerConfig(**{**fields, "position_scheme": position_scheme, "layer_norm_position": "post",
                                      **config_overrides})


def marian_state_to_relpos(marian_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Marian's weights under our names, without its sinusoid tables (parameter-free, recomputed by `absolute`)."""
    converted = {}
    for name, tensor in marian_state.items():
        if ".embed_positions." in name:
            continue
        for marian_part, own_part in RENAMED_MODULES:
            name = name.replace(marian_part, own_part)
        converted[name] = tensor
    return converted


def check_marian_positions(marian: MarianMTModel) -> None:
    """Marian's sinusoid table must be the [sin | cos] layout `positions.sinusoids` computes (for an odd d_model one
    sine more than cosines, as Marian's), to the rounding of the table's dtype (a float16 or bfloat16 checkpoint
    too)."""
    for stack in (marian.model.encoder, marian.model.decoder):
        table = stack.embed_positions.weight
        expected = sinusoids(torch.arange(table.size(0)), table.size(1), torch.float64)
        if not torch.allclose(table.double(), expected, atol=max(1e-6, torch.finfo(table.dtype).eps), rtol=0.0):
            raise ValueError(f"d_model ({table.size(1)}): this Marian model's sinusoid table differs from "
                             "hf_relpos' [sin | cos] halves (the table is not the sinusoids Marian computes)")


def neutrality_gaps(scheme: PositionScheme) -> list[str]:
    """What `scheme`, as it stands, still changes in the attention of its stack, found on a random float64 probe
    (batch 2, 5 tokens, every layer): an embedding-level encoding, replaced queries or keys, a non-zero score bias, a
    mask, a non-zero value term or value bias. Empty when the scheme leaves every layer plain softmax(q k^T / sqrt(d)) v."""
    probe = copy.deepcopy(scheme).to(torch.float64)
    generator = torch.Generator().manual_seed(0)
    length, heads, head_dim = 5, probe.num_heads, probe.head_dim

    def random(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    embeds = random(2, length, heads * head_dim)
    gaps = [] if torch.equal(probe.embed(embeds, 0), embeds) else ["it adds an embedding-level encoding"]
    query, key = random(2, heads, length, head_dim), random(2, heads, length, head_dim)
    probabilities = random(2, heads, length, length).softmax(-1)
    with torch.no_grad():
        context = probe.prepare(PositionContext(length, length, 0, None, query.device, query.dtype))
        for layer_idx in range(probe.num_layers):
            new_keys = probe.transform_new_keys(layer_idx, key, context)
            terms = probe.terms(layer_idx, query, new_keys, context)
            bias = terms.score_bias
            if bias is not None and not torch.is_tensor(bias):   # a RelativeBias or DenseBias: its dense form
                bias = bias.dense()
            masks = [mask for mask in (context.dense_mask(heads), terms.mask) if mask is not None]
            found = (
                ("it transforms the queries", terms.query is not None and not torch.equal(terms.query, query)),
                ("it transforms the keys", not torch.equal(new_keys, key)
                 or terms.key is not None and not torch.equal(terms.key, key)),
                ("it adds a non-zero score bias", bias is not None and bool(bias.any())),
                ("it masks query-key pairs", any(not bool(mask.all()) for mask in masks)),
                ("it adds a non-zero value term",
                 terms.value_term is not None and bool(terms.value_term(probabilities).any())),
                ("it adds a non-zero value bias", terms.value_bias is not None and bool(terms.value_bias.any())),
            )
            gaps += [gap for gap, present in found if present and gap not in gaps]
    return gaps


def marian_to_relpos(model_or_path: MarianMTModel | str | os.PathLike, position_scheme: str,
                     **config_overrides: Any) -> RelPosTransformerForConditionalGeneration:
    """`RelPosTransformerForConditionalGeneration` with the weights, config and generation config of a
    `MarianMTModel` (an instance, a folder or a Hub id). Every Marian weight is copied (strictly: nothing left
    over, nothing but the position scheme's own parameters new); those start neutral (`start_neutral`). With
    `keep_absolute_positions=True` the sinusoids stay and a scheme that is not exactly neutral then is refused."""
    marian = _load_marian(model_or_path)
    check_marian_positions(marian)
    config = marian_config_to_relpos(marian.config, position_scheme, **config_overrides)
    model = RelPosTransformerForConditionalGeneration(config).to(marian.dtype)
    state = marian_state_to_relpos(marian.state_dict())
    if model.model.shared is None:   # untied: no shared matrix here (Marian's, untied, is read by no stack)
        del state["model.shared.weight"]
    if "final_logits_bias" not in state:
        state["final_logits_bias"] = torch.zeros_like(model.final_logits_bias)
    missing, unexpected = model.load_state_dict(state, strict=False)
    scheme_weights = {name for name in model.state_dict() if ".positions." in name}
    if unexpected or set(missing) - scheme_weights:
        raise ValueError(f"the Marian weights do not map onto {type(model).__name__}: unmapped "
                         f"{sorted(unexpected)[:5]}, missing {sorted(set(missing) - scheme_weights)[:5]}")
    for stack in (model.model.encoder, model.model.decoder):
        stack.positions.start_neutral()
        gaps = neutrality_gaps(stack.positions) if config.keep_absolute_positions else []
        if gaps:
            raise ValueError(
                f"position_scheme {position_scheme!r} cannot be added to the kept absolute positions: after "
                f"start_neutral() {' and '.join(gaps)}, so the converted model would not reproduce the Marian model; "
                "choose a scheme whose terms vanish at its neutral start (learned additive terms at zero: shaw, xl, "
                "t5; or none, which adds no terms), or convert without keep_absolute_positions")
    model.generation_config = copy.deepcopy(marian.generation_config)
    return model.train(marian.training)


def convert_marian(source: str | os.PathLike, output_dir: str | os.PathLike, position_scheme: str,
                   **config_overrides: Any) -> Path:
    """Convert the Marian model in `source` (folder or Hub id) and save it, with its tokenizer, generation config and
    the translation pipeline a trained folder ships (`add_translation_pipeline`) and the `ConversionRecord` that the
    model cards of it and of what is fine-tuned from it name, in `output_dir`, which must not
    exist yet (or be empty). Everything is checked and written in a sibling temporary
    folder first, then renamed into place: an error leaves nothing behind."""
    output_dir = Path(output_dir)
    check_new_output_dir(output_dir)
    check_model_source(str(source), "source")
    model_type = AutoConfig.from_pretrained(str(source)).model_type
    if model_type != "marian":
        raise ValueError(f"{source}: model_type is {model_type!r}; hf_relpos.tools.convert marian needs 'marian'")
    tokenizer = _load_tokenizer(source)
    # Marian's 512 is the length of its position table; every hf_relpos scheme computes positions for any length, so
    # the converted tokenizer has no limit, as hf_relpos' own: no false "indexing errors" warning, nothing truncated
    tokenizer.model_max_length = VERY_LARGE_INTEGER
    model = marian_to_relpos(source, position_scheme, **config_overrides)
    keep_absolute = bool(config_overrides.get("keep_absolute_positions", False))
    on_hub = not Path(source).is_dir()
    license = source_license(str(source), on_hub)
    with staged_folder(output_dir, last=CONFIG_NAME) as staging:
        model.save_pretrained(staging)
        apply_umask_mode_to_weights(staging)
        tokenizer.save_pretrained(staging)
        add_translation_pipeline(staging)
        ConversionRecord(
            source=str(source), source_on_hub=on_hub, source_type=model_type, source_license=license,
            position_scheme=position_scheme, reproduces_source=reproduces_marian(position_scheme, keep_absolute),
            keep_absolute_positions=keep_absolute,
            settings={name: value for name, value in config_overrides.items() if name != "keep_absolute_positions"},
        ).save(staging)
    return output_dir


def source_license(source: str, on_hub: bool) -> str | None:
    """The license of the pretrained model `source` as its model card (README.md) gives it in its YAML metadata
    (`license:`, a Hub license id such as cc-by-4.0, as Helsinki-NLP's opus-mt cards give theirs): the card in the
    folder, or the Hub repository's (`on_hub`: one download). None where there is no card or it names no license
    (warned: the converted model's card then says its license is not known); a card whose metadata cannot be read,
    or whose `license` is not one id, is a ValueError naming it."""
    if on_hub:
        try:
            card = Path(hf_hub_download(source, CARD_FILE))
        except EntryNotFoundError:   # the repository has no card (or, offline, the cache lacks it)
            card = None
    else:
        card = Path(source, CARD_FILE) if Path(source, CARD_FILE).is_file() else None
    license = card_license(card, source) if card is not None else None
    if license is None:
        missing = (f"its {CARD_FILE} names no license" if card is not None else
                   f"no {CARD_FILE} in its Hub repository (or, offline, in the cache)" if on_hub else
                   f"its folder has no {CARD_FILE}")
        logger.warning("%s: %s; the converted model's card will say that its license is not known", source, missing)
    return license


def _load_marian(model_or_path: MarianMTModel | str | os.PathLike) -> MarianMTModel:
    if isinstance(model_or_path, MarianMTModel):
        return model_or_path
    if isinstance(model_or_path, torch.nn.Module):
        raise ValueError(f"model_or_path must be a MarianMTModel or its folder / Hub id, got "
                         f"{type(model_or_path).__name__}")
    return MarianMTModel.from_pretrained(str(model_or_path)).eval()


def _load_tokenizer(source: str | os.PathLike) -> PreTrainedTokenizerBase:
    try:
        return without_loading_arguments(AutoTokenizer.from_pretrained(str(source)))
    except (OSError, ValueError, ImportError, TypeError, RuntimeError) as error:   # RuntimeError: a corrupt .spm
        folder = Path(source)
        missing = [name for name in MARIAN_TOKENIZER_FILES if not (folder / name).is_file()] if folder.is_dir() else []
        if isinstance(error, TypeError) and missing:   # MarianTokenizer given no path for a file it needs
            error = f"MarianTokenizer needs {', '.join(MARIAN_TOKENIZER_FILES)}; the folder lacks {', '.join(missing)}"
        raise ValueError(f"{source}: cannot load its tokenizer, which the converted model needs ({error}); "
                         "Marian's own tokenizer (MarianTokenizer) needs sentencepiece: pip install '.[marian]' in "
                         "the hf_relpos checkout") from None


def _override(text: str) -> tuple[str, Any]:
    """`FIELD=VALUE` with VALUE read as YAML (16, true, 0.1, null, a string), as a --model.FIELD value is (a number
    that YAML 1.1 reads otherwise than YAML 1.2 is refused: `ambiguous_number_error`)."""
    field, separator, value = text.partition("=")
    if not separator or not field:
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE, got {text!r}")
    if field_named(field.strip()) == "position_scheme":
        raise argparse.ArgumentTypeError(f"{field.strip()} is chosen with --position_scheme, not --set")
    parsed = load_yaml(value)
    if ambiguous := ambiguous_number_error(field.strip(), parsed):
        raise argparse.ArgumentTypeError(ambiguous)
    return field.strip(), parsed


class DeprecatedLastOptionString(argparse.Action):
    """Stores the value; given under the action's last option string, its deprecated name, it warns (FutureWarning)
    naming the first one."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if option_string == self.option_strings[-1]:
            warn_renamed(option_string, self.option_strings[0])
        setattr(namespace, self.dest, values)


def program_name() -> str:
    """How the command was started: its console script, or the module."""
    return "hf-relpos-convert" if Path(sys.argv[0]).name == "hf-relpos-convert" else "python -m hf_relpos.tools.convert"


def scheme_name(text: str) -> str:
    """A registered position scheme's name; else the registry's error, naming --import_modules for a scheme of
    one's own."""
    try:
        get_scheme_class(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{error}{import_modules_hint(error)}") from None
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=program_name(),
        description="Convert a pretrained model to hf_relpos (weights, config, tokenizer, generation config).",
    )
    sources = parser.add_subparsers(dest="source_type", required=True, metavar="{marian}")
    marian = sources.add_parser(
        "marian", help="a transformers MarianMTModel (e.g. Helsinki-NLP/opus-mt-en-de)",
        description="Convert a MarianMTModel folder or Hub id. position_scheme absolute reproduces the model exactly; "
                    "any other scheme replaces the sinusoidal positions, its own parameters starting neutral; with "
                    "--keep_absolute_positions the scheme is added to the sinusoids instead, and the converted model "
                    "reproduces the Marian model exactly.",
    )
    marian.add_argument("source", type=expand_home, help="folder or Hub id of a MarianMTModel with its tokenizer")
    marian.add_argument("output_dir", type=expand_home,
                        help="new folder for the converted model (must not exist or be empty)")
    marian.add_argument("--position_scheme", "--attention_type", action=DeprecatedLastOptionString, required=True,
                        type=scheme_name, metavar="SCHEME",
                        help=f"position scheme of the converted model: one of {', '.join(sorted(POSITION_SCHEMES))}, "
                             "or one that --import_modules registers (--attention_type: its deprecated name)")
    add_import_modules_argument(marian)
    marian.add_argument("--keep_absolute_positions", action="store_true",
                        help="keep Marian's sinusoidal positions and add the scheme on top of them, starting neutral "
                             "(the config field keep_absolute_positions; for shaw, xl, t5, none)")
    marian.add_argument("--set", dest="overrides", type=_override, action="append", default=[],
                        metavar="FIELD=VALUE",
                        help="a config field of how the model trains and runs (the scheme's settings, dropout, ...), "
                             "e.g. --set max_relative_position=16 (repeatable; VALUE read as YAML)")
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.INFO)
    try:   # before the parser is built: --position_scheme chooses from the registry
        import_modules_of(sys.argv[1:] if argv is None else argv)
    except ConfigError as error:
        print(f"{program_name()}: error: {error}", file=sys.stderr)
        return 2
    arguments = build_parser().parse_args(argv)
    overrides = dict(arguments.overrides)
    if arguments.keep_absolute_positions:
        overrides["keep_absolute_positions"] = True
    try:
        output_dir = convert_marian(arguments.source, arguments.output_dir, arguments.position_scheme, **overrides)
    except (OSError, ValueError) as error:
        print(f"{program_name()}: error: {error}", file=sys.stderr)
        return 2
    kept = " on top of the kept absolute positions" if overrides.get("keep_absolute_positions") else ""
    print(f"saved {arguments.position_scheme} model{kept}, tokenizer and generation config to {output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
