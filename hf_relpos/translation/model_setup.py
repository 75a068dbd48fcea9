"""The model a translation run trains or evaluates: built from its config or loaded from `model_name_or_path` for
the run's tokenizer and kernel, checked against the run (beam count, position randomization range, absolute
position fade), given the run's generation settings (beams, length penalty, a length cap relative to each source
under a ceiling), and sized from its config before anything is written (the disk a run needs)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase

from ..model.configuration_relpos import RelPosTransformerConfig
from ..model.generation_limits import new_token_limits, set_relative_limit
from ..model.modeling_relpos import RelPosTransformerForConditionalGeneration, check_num_beams, meta_model
from ..publish.files import reading_weights
from .arguments import (
    MODEL_SECTION,
    ConfigError,
    ModelArguments,
    TranslationTrainingArguments,
    saved_config_with_overrides,
)
from .checkpoints import complete_checkpoints
from .data import DataArguments
from .preflight import fsdp_launch
from .tokenization import special_token_ids

logger = logging.getLogger(__name__)

# Disk needed per checkpoint, in multiples of the weights: weights + Adam's two moment estimates.
CHECKPOINT_SIZE_FACTOR = 3
# Under FSDP with full state dicts (configs/accelerate/fsdp.yaml) a checkpoint holds the weights twice: the Trainer's
# model.safetensors and accelerate's pytorch_model_fsdp.bin (transformers' Trainer saves both).
FSDP_CHECKPOINT_SIZE_FACTOR = CHECKPOINT_SIZE_FACTOR + 1


def generation_ceiling(training_args: TranslationTrainingArguments, max_position_embeddings: int) -> int:
    """New tokens any output may have, whatever its source: generation_max_length - 1 (generate's max_length counts
    the decoder start token) when set, and at most `max_position_embeddings` - 1 (the longest target the model is
    configured for); saved as the generation config's max_new_tokens."""
    limit = max_position_embeddings - 1
    if training_args.generation_max_length is not None:
        limit = min(limit, training_args.generation_max_length - 1)
    return max(1, limit)


def configure_decoding(generation: GenerationConfig, training_args: TranslationTrainingArguments,
                       max_position_embeddings: int) -> None:
    """Beams, length penalty and the ceiling on new tokens of a model's generation config, from the run's arguments.
    The ceiling is max_new_tokens, generate's own knob: a saved max_length would make every
    generate(max_new_tokens=...) call warn that both are set."""
    generation.num_beams = training_args.generation_num_beams or 1
    if generation.num_beams > 1:
        generation.length_penalty = training_args.generation_length_penalty
    generation.max_length = None
    generation.max_new_tokens = generation_ceiling(training_args, max_position_embeddings)


def max_new_tokens_for(source_length: int, training_args: TranslationTrainingArguments,
                       max_position_embeddings: int) -> int:
    """New tokens an output of a `source_length`-token source may have: fairseq's max_len_a * |x| + max_len_b
    (generation_max_length_ratio, generation_max_length_offset; Vaswani et al.: input length + 50), capped by
    `generation_ceiling` (`new_token_limits`, the rule generate applies per row)."""
    return int(new_token_limits(torch.tensor([source_length]), training_args.generation_max_length_ratio,
                                training_args.generation_max_length_offset,
                                generation_ceiling(training_args, max_position_embeddings))[0])


def build_model(
    model_args: ModelArguments, tokenizer: PreTrainedTokenizerBase, data_args: DataArguments,
    training_args: TranslationTrainingArguments,
) -> RelPosTransformerForConditionalGeneration:
    """The run's model, checked against the run and with its generation settings: `model_name_or_path` loaded with
    the `model:` fields as overrides, else a new model of the `model:` config sized to `tokenizer`."""
    kernel = {} if model_args.attn_implementation is None else {"attn_implementation": model_args.attn_implementation}
    token_ids = special_token_ids(tokenizer, model_args.decoder_start_token or "bos")
    if model_args.model_name_or_path is not None:
        try:
            with reading_weights():
                model = RelPosTransformerForConditionalGeneration.from_pretrained(
                    model_args.model_name_or_path, config=saved_config_with_overrides(model_args),
                    cache_dir=model_args.cache_dir, **kernel
                )
        except ImportError as error:  # a transformers kernel whose package is missing (flash_attention_2, ...)
            raise ConfigError(f"attn_implementation {model_args.attn_implementation!r}: {error}") from None
        except (OSError, ValueError, RuntimeError) as error:
            raise ConfigError(f"model_name_or_path {model_args.model_name_or_path!r}: {error}") from None
        if model.config.vocab_size < len(tokenizer):
            raise ConfigError(f"the tokenizer has {len(tokenizer)} tokens but the model only "
                              f"{model.config.vocab_size} embeddings: train with the tokenizer saved with "
                              f"model_name_or_path (leave tokenizer_name null), or give the model an embedding for "
                              "every token first (model.resize_token_embeddings(len(tokenizer)), then save_pretrained)")
        asked = model_args.decoder_start_token
        if asked is not None and token_ids["decoder_start_token_id"] != model.config.decoder_start_token_id:
            raise ConfigError(f"decoder_start_token {asked!r}: {model_args.model_name_or_path!r} was trained to start "
                              f"decoding from token id {model.config.decoder_start_token_id}, which a pretrained model "
                              "keeps; leave decoder_start_token null")
    else:
        try:
            config = RelPosTransformerConfig(
                **model_args.model_config, vocab_size=len(tokenizer), **token_ids, **kernel
            )
        except (ValueError, TypeError) as error:
            raise ConfigError(f"{MODEL_SECTION}: {error}") from None
        try:
            model = RelPosTransformerForConditionalGeneration(config)
        except (ImportError, ValueError) as error:  # a kernel whose package is missing (flash_attention_2, ...)
            if not kernel:
                raise
            raise ConfigError(f"attn_implementation {model_args.attn_implementation!r}: {error}") from None
    _check_num_beams(training_args, model.config.vocab_size)
    _check_position_randomization(model.config, data_args, training_args)
    if training_args.fade_absolute_positions is not None and not model.config.keep_absolute_positions:
        raise ConfigError("fade_absolute_positions fades out the sinusoids of keep_absolute_positions, which this "
                          "model does not have: train a model with keep_absolute_positions true (e.g. a MarianMT model "
                          "converted with --keep_absolute_positions), or leave fade_absolute_positions null")
    generation = model.generation_config
    configure_decoding(generation, training_args, model.config.max_position_embeddings)
    # The length cap relative to each source (max_len_a, max_len_b), under that ceiling.
    set_relative_limit(generation, training_args.generation_max_length_ratio,
                       training_args.generation_max_length_offset)
    # A new model's ids come from its tokenizer; a pretrained one keeps those it was trained with (a converted Marian
    # model starts decoding with pad, not with the tokenizer's bos/eos).
    for name, value in token_ids.items():
        setattr(generation, name, value if model_args.model_name_or_path is None else getattr(model.config, name))
    return model


def _check_position_randomization(config: RelPosTransformerConfig, data_args: DataArguments,
                                  training_args: TranslationTrainingArguments) -> None:
    """`position_randomization_max` must hold every sequence the run gives the model (Ruoss et al. draw n sorted
    positions out of it): the longest source and target in training, and with `position_randomization_at_inference`
    the longest output evaluation may generate; otherwise the run would stop at the first longer batch, hours in."""
    limit = config.position_randomization_max
    if limit is None:
        return
    needed = {}
    if training_args.do_train:
        needed |= {"max_source_length": data_args.max_source_length, "max_target_length": data_args.max_target_length}
    generates = training_args.predict_with_generate and (
        training_args.do_eval or training_args.do_predict or training_args.eval_strategy != "no")
    if config.position_randomization_at_inference and generates:
        needed |= {"max_source_length": data_args.max_source_length,
                   "the longest generated output (decoder start + min(generation_max_length_ratio x "
                   "max_source_length + generation_max_length_offset, generation_max_length - 1, "
                   "max_position_embeddings - 1))":
                   1 + max_new_tokens_for(data_args.max_source_length, training_args, config.max_position_embeddings)}
    too_long = {name: length for name, length in needed.items() if length > limit}
    if too_long:
        raise ConfigError(f"position_randomization_max ({limit}) must be at least the longest sequence the run gives "
                          "the model: " + ", ".join(f"{name} = {length}" for name, length in too_long.items())
                          + f"; raise position_randomization_max to {max(too_long.values())} or shorten them")


def _check_num_beams(training_args: TranslationTrainingArguments, vocab_size: int) -> None:
    try:
        check_num_beams(training_args.generation_num_beams or 1, vocab_size, name="generation_num_beams")
    except ValueError as error:
        raise ConfigError(str(error)) from None


def estimated_weight_bytes(model_args: ModelArguments) -> int | None:
    """Bytes of the model's weights, from its config (a model built on the meta device, no memory used); None when
    the config cannot be read here (the model loading reports why, later)."""
    try:
        if model_args.model_name_or_path is None:
            config = RelPosTransformerConfig(**model_args.model_config, vocab_size=model_args.tokenizer_vocab_size)
        else:
            config = saved_config_with_overrides(model_args)
    except (OSError, ValueError, TypeError):
        return None
    return sum(parameter.numel() * parameter.element_size() for parameter in meta_model(config).parameters())


def required_disk_bytes(weight_bytes: int, training_args: TranslationTrainingArguments) -> int:
    """Free space a run needs in output_dir, roughly: the final model, plus, when checkpointing, the checkpoints it
    writes before its rotation deletes any, each of weights and optimizer state (and, in an FSDP launch, a second
    copy of the weights). A run holds at most `save_total_limit` + 1 checkpoints (the new one is written before the
    oldest is deleted; 1 without a limit); a resumed run (`resume_from_checkpoint`) counts the complete checkpoints
    already in output_dir against them (they take disk space already), though never less than one new checkpoint:
    with `save_total_limit` N and N or more there (a SIGTERM's checkpoint beside N on the save schedule, which
    `TranslationTrainer._rotate_checkpoints` deletes only once a later one on it is complete), one more is written
    before any is deleted. Tokenizer, results and data files are small next to it."""
    if not training_args.do_train:
        return 0
    checkpoints = 0
    if training_args.save_strategy != "no":
        held = training_args.save_total_limit + 1 if training_args.save_total_limit else 1
        checkpoints = max(1, held - _checkpoints_kept(training_args))
    factor = FSDP_CHECKPOINT_SIZE_FACTOR if fsdp_launch() else CHECKPOINT_SIZE_FACTOR
    return weight_bytes * (1 + factor * checkpoints)


def _checkpoints_kept(training_args: TranslationTrainingArguments) -> int:
    """The complete checkpoints in output_dir that a resumed run goes on from (0 for a run from step 0, which does
    not resume, or an output_dir that is not a folder yet)."""
    output_dir = Path(training_args.output_dir)
    if training_args.resume_from_checkpoint is None or not output_dir.is_dir():
        return 0
    return len(complete_checkpoints(output_dir))


def acts_in_training_only(field: str) -> bool:
    """Whether a config field leaves what trained weights compute unchanged: dropout rates (off in evaluation) and
    initialisation scales (of weights not yet trained)."""
    return "dropout" in field or field.endswith("init_std")


def log_model(model: RelPosTransformerForConditionalGeneration, model_args: ModelArguments,
              training_args: TranslationTrainingArguments) -> None:
    """Log the model's scheme and size, and the `model:` fields overriding the saved config of `model_name_or_path`:
    one warning naming them all when the run does not train (the evaluated model is not the saved one); when it
    trains, a warning naming those that change what the trained weights compute (an activation, an embedding scale)
    and INFO for the others (`acts_in_training_only`)."""
    overrides = model_args.model_config if model_args.model_name_or_path is not None else {}
    if overrides and not training_args.do_train:
        logger.warning("model: overrides of the saved config of %s: %s", model_args.model_name_or_path,
                       _named_values(overrides))
    elif overrides:
        training_only = {name: value for name, value in overrides.items() if acts_in_training_only(name)}
        computing = {name: value for name, value in overrides.items() if name not in training_only}
        if training_only:
            logger.info("model: overrides of the saved config of %s: %s", model_args.model_name_or_path,
                        _named_values(training_only))
        if computing:
            logger.warning("model: overrides of the saved config of %s: %s (these change what its trained weights "
                           "compute, from the first step on)", model_args.model_name_or_path,
                           _named_values(computing))
    logger.info("%s: %s positions, %s parameters", type(model).__name__, model.config.position_scheme,
                f"{model.num_parameters():,}")


def _named_values(fields: dict[str, object]) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in fields.items())
