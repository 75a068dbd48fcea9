"""Training and evaluation of RelPosTransformer translation models with the Hugging Face `Seq2SeqTrainer`.

`main()` is the body of `train_translation.py`: YAML + command-line arguments -> data -> tokenizer -> model ->
`TranslationTrainer` (token-budget batching, per-batch generation length, sacreBLEU) -> results files.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from datasets import Dataset
from safetensors import SafetensorError
from torch.utils.data import DataLoader, SequentialSampler
from transformers import (
    DataCollatorForSeq2Seq,
    EvalPrediction,
    HfArgumentParser,
    PreTrainedConfig,
    PreTrainedTokenizerBase,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
    set_seed,
)
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, PredictionOutput, TrainOutput, seed_worker

from .batching import TokenBudgetBatchSampler, check_examples_fit
from .checkpoints import (
    TRAINER_STATE_FILE,
    WEIGHTS_FILE,
    WEIGHTS_INDEX_FILE,
    is_complete_checkpoint,
    last_complete_checkpoint,
)
from .configuration_relpos import RelPosTransformerConfig
from .data import (
    DEMO_DATA_FOLDER,
    DataArguments,
    DatasetSchemaError,
    example_lengths,
    load_parallel_splits,
    restore_order,
    sort_by_source_length,
    tokenize_evaluation_pairs,
    tokenize_training_pairs,
)
from .hub import HubPushError, push_training_output
from .metrics import decode_token_ids, generated_lengths, score_translations
from .modeling_relpos import RelPosTransformerForConditionalGeneration
from .positions import scheme_config_fields
from .safety import NonFiniteLossError, OutputDirError, check_output_dir, move_folder_contents
from .tokenization import (
    has_saved_tokenizer,
    load_tokenizer,
    special_token_ids,
    train_joint_tokenizer,
)

logger = logging.getLogger(__name__)

MODEL_SECTION = "model"
# Config fields set from the tokenizer or by transformers itself; a YAML `model:` section may not set them.
DERIVED_CONFIG_FIELDS = frozenset({
    "vocab_size", "pad_token_id", "eos_token_id", "bos_token_id", "decoder_start_token_id", "is_encoder_decoder",
})
HYPOTHESES_FILE = "{prefix}_hypotheses.txt"
# The final model is saved here inside output_dir, then moved into output_dir file by file (weights last).
FINAL_MODEL_STAGING = ".final-model-staging"
# Disk needed per checkpoint, in multiples of the weights: weights + Adam's two moment estimates.
CHECKPOINT_SIZE_FACTOR = 3


class ConfigError(ValueError):
    """A YAML file or command-line flag is wrong; raised before anything is trained or written."""


@dataclass
class ModelArguments:
    """Which model and tokenizer to start from. The YAML `model:` section holds `RelPosTransformerConfig` fields."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Saved model folder or Hub id to fine-tune or evaluate; null trains from scratch."},
    )
    tokenizer_name: str | None = field(
        default=None,
        metadata={"help": "Saved tokenizer folder or Hub id; null reuses the model's or output_dir's tokenizer, or "
                          "trains a joint BPE tokenizer on the training split."},
    )
    tokenizer_vocab_size: int = field(default=8000, metadata={"help": "Vocabulary size of a newly trained tokenizer."})
    cache_dir: str | None = field(default=None, metadata={"help": "Cache folder for Hub datasets and models."})
    model_config: dict[str, Any] = field(default_factory=dict, init=False)


@dataclass
class TranslationTrainingArguments(Seq2SeqTrainingArguments):
    """`Seq2SeqTrainingArguments` plus token-budget batching and paper-style decoding."""

    max_tokens_per_batch: int | None = field(
        default=None,
        metadata={"help": "Token budget per device and batch (padded size: examples x longest source and x longest "
                          "target). null batches by per_device_train_batch_size."},
    )
    generation_length_penalty: float = field(
        default=0.6, metadata={"help": "Beam-search length penalty (Vaswani et al.: 0.6)."}
    )
    generation_max_length_offset: int = field(
        default=50,
        metadata={"help": "Generate at most (longest source in the batch, in tokens) + this many tokens "
                          "(Vaswani et al.: input length + 50); generation_max_length, when set, caps it."},
    )
    cpu_threads: int | None = field(
        default=None,
        metadata={"help": "torch.set_num_threads for CPU work; 1 is fastest for tiny models and on busy machines. "
                          "null keeps torch's default."},
    )
    predict_with_generate: bool = field(default=True, metadata={"help": "Score generated translations (BLEU)."})
    generation_num_beams: int | None = field(default=4, metadata={"help": "Beam size (Vaswani et al.: 4)."})


ARGUMENT_CLASSES = (ModelArguments, DataArguments, TranslationTrainingArguments)


class _RaisingArgumentParser(HfArgumentParser):
    """argparse reports bad values by printing the whole usage and exiting; raise one `ConfigError` instead."""

    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(message)


def _argument_fields() -> dict[str, tuple[type, dataclasses.Field]]:
    fields = {}
    for argument_class in ARGUMENT_CLASSES:
        for item in dataclasses.fields(argument_class):
            if item.init:
                fields[item.name] = (argument_class, item)
    return fields


def model_config_fields() -> set[str]:
    """The `RelPosTransformerConfig` fields a YAML `model:` section (or a flat key / `--model.NAME` flag) may set,
    including those the registered position schemes declare."""
    inherited = {item.name for item in dataclasses.fields(PreTrainedConfig)}
    own = {item.name for item in dataclasses.fields(RelPosTransformerConfig)} - inherited | set(scheme_config_fields())
    return own - DERIVED_CONFIG_FIELDS


def _split_command_line(argv: Sequence[str]) -> list[tuple[str, list[str]]]:
    """`--name value ...`, `--name=value` and bare `--flag` into (name, values) pairs, in order (`-` in a name
    reads as `_`, as in HfArgumentParser)."""
    pairs: list[tuple[str, list[str]]] = []
    for token in argv:
        if token.startswith("--") and len(token) > 2:
            name, equals, value = token[2:].partition("=")
            pairs.append((name.replace("-", "_"), [value] if equals else []))
        elif not pairs:
            raise ConfigError(f"unexpected argument {token!r}: give one YAML file first, then --name value flags")
        else:
            pairs[-1][1].append(token)
    return pairs


def _suggest(key: str, candidates: set[str]) -> str:
    bare = key.removeprefix("--").removeprefix(f"{MODEL_SECTION}.")
    close = difflib.get_close_matches(bare, sorted(candidates), n=1)
    return f"{key} (did you mean {close[0]}?)" if close else key


def _yaml_value_to_tokens(value: Any) -> list[str]:
    if isinstance(value, bool):
        return [str(value).lower()]
    if isinstance(value, dict):
        return [json.dumps(value)]
    if isinstance(value, list):
        return [str(item) for item in value]
    return [str(value)]


def _is_optional(argument_class: type, name: str) -> bool:
    return type(None) in typing.get_args(typing.get_type_hints(argument_class)[name])


def parse_arguments(
    argv: Sequence[str],
) -> tuple[ModelArguments, DataArguments, TranslationTrainingArguments]:
    """Parse `CONFIG.yaml [--name value ...]`: the YAML fills the argument dataclasses, flags override it.

    A `model:` mapping in the YAML (or flat keys / `--model.NAME` flags naming config fields) becomes
    `ModelArguments.model_config`. Unknown keys, bad values and nulls for non-optional fields raise one `ConfigError`.
    """
    argv = list(argv)
    yaml_values: dict[str, Any] = {}
    if argv and not argv[0].startswith("--"):
        yaml_values = _read_yaml(argv.pop(0))
    model_config = yaml_values.pop(MODEL_SECTION, None) or {}
    if not isinstance(model_config, dict):
        raise ConfigError(f"'{MODEL_SECTION}:' must be a mapping of RelPosTransformerConfig fields")
    argument_fields = _argument_fields()
    config_fields = model_config_fields()

    values: dict[str, list[str] | None] = {}
    unknown: list[str] = []
    for name, value in yaml_values.items():
        if name in argument_fields:
            values[name] = None if value is None else _yaml_value_to_tokens(value)
        elif name in config_fields:
            model_config[name] = value
        else:
            unknown.append(name)
    for name, tokens in _split_command_line(argv):
        config_name = name.removeprefix(f"{MODEL_SECTION}.")
        if name in argument_fields:
            values[name] = None if tokens in (["null"], ["None"]) else tokens
        elif config_name in config_fields:
            model_config[config_name] = yaml.safe_load(" ".join(tokens)) if tokens else True
        else:
            unknown.append(f"--{name}")
    unknown += [f"{MODEL_SECTION}.{key}" for key in sorted(set(model_config) - config_fields)]
    if unknown:
        described = [_suggest(key, set(argument_fields) | config_fields) for key in unknown]
        raise ConfigError(
            f"unknown key(s): {', '.join(described)}. Allowed: the fields of "
            f"{', '.join(c.__name__ for c in ARGUMENT_CLASSES)}, and under '{MODEL_SECTION}:' the "
            f"RelPosTransformerConfig fields {sorted(config_fields)}"
        )
    return _build_arguments(values, model_config, argument_fields)


def _read_yaml(path: str) -> dict[str, Any]:
    if not path.endswith((".yaml", ".yml")):
        raise ConfigError(f"the first argument must be a .yaml config file, got {path!r}")
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist")
    try:
        with open(path, encoding="utf-8") as handle:
            content = yaml.safe_load(handle)
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: invalid YAML: {error}") from None
    if content is None:
        return {}
    if not isinstance(content, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of field: value")
    return content


def _build_arguments(
    values: dict[str, list[str] | None], model_config: dict[str, Any], argument_fields: dict[str, tuple[type, Any]]
) -> tuple[ModelArguments, DataArguments, TranslationTrainingArguments]:
    parser = _RaisingArgumentParser(ARGUMENT_CLASSES)
    tokens: list[str] = []
    nulls: set[str] = set()
    for name, value_tokens in values.items():
        if value_tokens is None:
            argument_class = argument_fields[name][0]
            if not _is_optional(argument_class, name):
                raise ConfigError(f"{name} cannot be null")
            nulls.add(name)
        else:
            tokens += [f"--{name}", *value_tokens]
    namespace = vars(parser.parse_args(tokens))
    namespace.update({name: None for name in nulls})
    built = []
    for argument_class in ARGUMENT_CLASSES:
        names = {item.name for item in dataclasses.fields(argument_class) if item.init}
        try:
            built.append(argument_class(**{name: namespace[name] for name in names}))
        except ValueError as error:
            raise ConfigError(str(error)) from None
    model_args, data_args, training_args = built
    model_args.model_config = model_config
    _check_consistency(model_args, data_args, training_args)
    return model_args, data_args, training_args


def _check_consistency(
    model_args: ModelArguments, data_args: DataArguments, training_args: TranslationTrainingArguments
) -> None:
    if not (training_args.do_train or training_args.do_eval or training_args.do_predict):
        raise ConfigError("nothing to do: set at least one of do_train, do_eval, do_predict")
    if not training_args.do_train and model_args.model_name_or_path is None:
        raise ConfigError("do_eval/do_predict without do_train need model_name_or_path (a trained model)")
    if model_args.tokenizer_vocab_size <= 4:
        raise ConfigError(f"tokenizer_vocab_size must be larger than 4, got {model_args.tokenizer_vocab_size}")
    if training_args.max_tokens_per_batch is not None and training_args.max_tokens_per_batch < 1:
        raise ConfigError(f"max_tokens_per_batch must be a positive integer or null, got "
                          f"{training_args.max_tokens_per_batch}")
    if training_args.cpu_threads is not None and training_args.cpu_threads < 1:
        raise ConfigError(f"cpu_threads must be a positive integer or null, got {training_args.cpu_threads}")
    if training_args.generation_max_length_offset < 0:
        raise ConfigError(f"generation_max_length_offset must be >= 0, got {training_args.generation_max_length_offset}")
    try:
        if model_args.model_name_or_path is None:
            RelPosTransformerConfig(**model_args.model_config, vocab_size=model_args.tokenizer_vocab_size)
        else:
            RelPosTransformerConfig.from_pretrained(model_args.model_name_or_path, cache_dir=model_args.cache_dir,
                                                    **model_args.model_config)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"{MODEL_SECTION}: {error}") from None
    except OSError as error:
        raise ConfigError(f"model_name_or_path: {error}") from None


def _check_token_budget(train_dataset: Dataset, training_args: TranslationTrainingArguments) -> None:
    """Every training pair must fit the token budget on its own; checked before the tokenizer is saved."""
    if training_args.max_tokens_per_batch is None:
        return
    try:
        check_examples_fit(*example_lengths(train_dataset), training_args.max_tokens_per_batch)
    except ValueError as error:
        raise ConfigError(str(error)) from None


@dataclass
class EvaluationSet:
    """A split to translate and score: tokenized examples sorted by source length (`order[i]` is the file position of
    sorted example i), and the raw reference texts in file order."""

    dataset: Dataset
    order: np.ndarray
    references: list[str]
    hypotheses: list[str] = field(default_factory=list)


class SamplerEpochCallback(TrainerCallback):
    """Tell the token-budget sampler the epoch, also in an epoch resumed mid-way (where accelerate's batch-skipping
    wrapper hides the sampler from the Trainer's own `set_epoch` call)."""

    def __init__(self, sampler: TokenBudgetBatchSampler) -> None:
        self.sampler = sampler

    def on_epoch_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.sampler.set_epoch(math.floor(state.epoch or 0.0))


class TranslationTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` with token-budget training batches, "source length + offset" generation per batch, and
    sacreBLEU/chrF against the raw references, with hypotheses kept in source order."""

    def __init__(self, *args: Any, evaluation_sets: dict[str, EvaluationSet], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.evaluation_sets = evaluation_sets
        self.compute_metrics = self._compute_translation_metrics
        self._active_prefix = "eval"
        self.token_budget_sampler = None
        if self.args.max_tokens_per_batch is not None and self.train_dataset is not None:
            source_lengths, target_lengths = example_lengths(self.train_dataset)
            self.token_budget_sampler = TokenBudgetBatchSampler(
                source_lengths, target_lengths, self.args.max_tokens_per_batch,
                num_processes=self.accelerator.num_processes,
                seed=self.args.data_seed if self.args.data_seed is not None else self.args.seed,
            )
            self.add_callback(SamplerEpochCallback(self.token_budget_sampler))

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> TrainOutput:
        """`resume_from_checkpoint=True` resumes from the newest *complete* checkpoint of output_dir."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = str(_last_complete_checkpoint(self.args.output_dir, "True"))
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def training_step(
        self, model: torch.nn.Module, inputs: dict[str, Any], num_items_in_batch: torch.Tensor | int | None = None
    ) -> torch.Tensor:
        """Stop with `NonFiniteLossError` (naming the step) on a NaN/inf loss, before the optimizer applies it. The
        Trainer's `logging_nan_inf_filter` would otherwise leave it out of the logged loss without a word."""
        loss = super().training_step(model, inputs, num_items_in_batch)
        if not torch.isfinite(loss).all():
            raise NonFiniteLossError(float(loss.detach().float().mean()), self.state.global_step + 1,
                                     self.state.epoch or 0.0)
        return loss

    def _save_checkpoint(self, model: torch.nn.Module, trial: Any) -> None:
        """A rewritten checkpoint folder (a resumed run reaching the step of an older attempt) loses its state file
        first, so that it does not count as complete until the Trainer writes the new one, last."""
        if self.args.should_save:
            folder = Path(self._get_output_dir(trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            (folder / TRAINER_STATE_FILE).unlink(missing_ok=True)
        super()._save_checkpoint(model, trial)

    def get_train_dataloader(self) -> DataLoader:
        """With `max_tokens_per_batch`, a DataLoader over the global token-budget batch list; accelerate deals the
        batches round-robin to the processes (the sampler itself never shards)."""
        if self.token_budget_sampler is None:
            return super().get_train_dataloader()
        dataset = self._remove_unused_columns(self.train_dataset, description="training")
        loader = DataLoader(
            dataset,
            batch_sampler=self.token_budget_sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
            worker_init_fn=partial(seed_worker, num_workers=self.args.dataloader_num_workers,
                                   rank=self.args.process_index),
        )
        return self.accelerator.prepare(loader)

    def _get_eval_sampler(self, eval_dataset: Dataset) -> torch.utils.data.Sampler | None:
        """Always in dataset order (never length-grouped at random), so predictions can be put back in source order."""
        return SequentialSampler(eval_dataset) if self.args.world_size <= 1 else None

    def evaluate(
        self, eval_dataset: Dataset | None = None, ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval", **gen_kwargs: Any,
    ) -> dict[str, float]:
        self._active_prefix = metric_key_prefix
        return super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix, **gen_kwargs)

    def predict(
        self, test_dataset: Dataset, ignore_keys: list[str] | None = None, metric_key_prefix: str = "test",
        **gen_kwargs: Any,
    ) -> PredictionOutput:
        self._active_prefix = metric_key_prefix
        return super().predict(test_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix, **gen_kwargs)

    def max_new_tokens(self, longest_source: int) -> int:
        """Vaswani et al.: output length <= input length + 50, here per batch; capped by generation_max_length and
        by `max_position_embeddings` (the longest target the model is configured for)."""
        limit = longest_source + self.args.generation_max_length_offset
        if self.args.generation_max_length is not None:
            limit = min(limit, self.args.generation_max_length)
        return max(1, min(limit, self.model.config.max_position_embeddings - 1))

    def prediction_step(
        self, model: torch.nn.Module, inputs: dict[str, Any], prediction_loss_only: bool,
        ignore_keys: list[str] | None = None, **gen_kwargs: Any,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        if self.args.predict_with_generate and not prediction_loss_only:
            gen_kwargs = dict(gen_kwargs or getattr(self, "_gen_kwargs", {}))
            longest_source = int(inputs["attention_mask"].sum(dim=-1).max())
            gen_kwargs["max_length"] = self.max_new_tokens(longest_source) + 1  # + the decoder start token
            if (gen_kwargs.get("num_beams") or self.model.generation_config.num_beams) > 1:
                gen_kwargs.setdefault("length_penalty", self.args.generation_length_penalty)
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs)

    def _compute_translation_metrics(self, prediction: EvalPrediction) -> dict[str, float | str]:
        evaluation_set = self.evaluation_sets[self._active_prefix]
        # Under data parallelism the gathered predictions end with repeats of the first examples: drop them.
        generated = np.asarray(prediction.predictions)[: len(evaluation_set.order)]
        hypotheses = restore_order(decode_token_ids(generated, self.processing_class), evaluation_set.order)
        evaluation_set.hypotheses = hypotheses
        scores = score_translations(hypotheses, evaluation_set.references)
        lengths = generated_lengths(generated, self.processing_class.eos_token_id, self.processing_class.pad_token_id)
        scores["gen_len"] = float(lengths.mean()) if len(lengths) else 0.0
        return scores


def _prepare_evaluation_set(
    dataset: Dataset, tokenizer: PreTrainedTokenizerBase, data_args: DataArguments, split: str
) -> EvaluationSet:
    tokenized, _ = tokenize_evaluation_pairs(dataset, tokenizer, data_args, split)
    sorted_dataset, order = sort_by_source_length(tokenized)
    return EvaluationSet(sorted_dataset, order, list(dataset["target"]))


def _obtain_tokenizer(
    model_args: ModelArguments, training_args: TranslationTrainingArguments, train_split: Dataset | None
) -> tuple[PreTrainedTokenizerBase, bool]:
    """(tokenizer, newly trained?): tokenizer_name, else the model's, else output_dir's, else train one."""
    for field_name in ("tokenizer_name", "model_name_or_path"):
        name_or_path = getattr(model_args, field_name)
        if name_or_path is not None:
            try:
                return load_tokenizer(name_or_path), False
            except (OSError, ValueError) as error:
                raise ConfigError(f"{field_name} {name_or_path!r}: cannot load its tokenizer: {error}") from None
    if has_saved_tokenizer(training_args.output_dir):
        logger.info("Reusing the tokenizer saved in %s", training_args.output_dir)
        return load_tokenizer(training_args.output_dir), False
    if train_split is None:
        raise ConfigError("no tokenizer_name or model_name_or_path, and no training split to train a tokenizer on")
    logger.info("Training a joint BPE tokenizer (vocabulary %d) on the training split", model_args.tokenizer_vocab_size)
    texts = (text for column in ("source", "target") for text in train_split[column])
    return train_joint_tokenizer(texts, model_args.tokenizer_vocab_size), True


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, output_dir: str | os.PathLike) -> None:
    """Save next to the model; files are staged and moved in, tokenizer.json (the reuse marker) last."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tokenizer.", dir=output_dir))
    try:
        tokenizer.save_pretrained(staging)
        for item in sorted(staging.iterdir(), key=lambda path: path.name == "tokenizer.json"):
            os.replace(item, output_dir / item.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _build_model(
    model_args: ModelArguments, tokenizer: PreTrainedTokenizerBase, data_args: DataArguments,
    training_args: TranslationTrainingArguments,
) -> RelPosTransformerForConditionalGeneration:
    if model_args.model_name_or_path is not None:
        try:
            model = RelPosTransformerForConditionalGeneration.from_pretrained(
                model_args.model_name_or_path, cache_dir=model_args.cache_dir, **model_args.model_config
            )
        except SafetensorError as error:
            raise ConfigError(f"model_name_or_path {model_args.model_name_or_path!r}: its weights file is corrupt or "
                              f"incomplete ({error})") from None
        except (OSError, ValueError, RuntimeError) as error:
            raise ConfigError(f"model_name_or_path {model_args.model_name_or_path!r}: {error}") from None
        if model.config.vocab_size < len(tokenizer):
            raise ConfigError(f"the tokenizer has {len(tokenizer)} tokens but the model only "
                              f"{model.config.vocab_size} embeddings")
    else:
        try:
            config = RelPosTransformerConfig(
                **model_args.model_config, vocab_size=len(tokenizer), **special_token_ids(tokenizer)
            )
        except (ValueError, TypeError) as error:
            raise ConfigError(f"{MODEL_SECTION}: {error}") from None
        model = RelPosTransformerForConditionalGeneration(config)
    _check_num_beams(training_args, model.config.vocab_size)
    generation = model.generation_config
    generation.num_beams = training_args.generation_num_beams or 1
    if generation.num_beams > 1:
        generation.length_penalty = training_args.generation_length_penalty
    # Lengths as max_length (decoder start token included), never max_new_tokens, which would override the
    # per-batch max_length of TranslationTrainer.prediction_step.
    generation.max_new_tokens = None
    generation.max_length = data_args.max_source_length + training_args.generation_max_length_offset + 1
    for name, value in special_token_ids(tokenizer).items():
        setattr(generation, name, value)
    return model


def _check_num_beams(training_args: TranslationTrainingArguments, vocab_size: int) -> None:
    if (training_args.generation_num_beams or 1) > vocab_size:
        raise ConfigError(f"generation_num_beams ({training_args.generation_num_beams}) is larger than the "
                          f"vocabulary ({vocab_size} tokens)")


def _estimated_weight_bytes(model_args: ModelArguments) -> int | None:
    """Bytes of the model's weights, from its config (a model built on the meta device, no memory used); None when
    the config cannot be read here (the model loading reports why, later)."""
    try:
        if model_args.model_name_or_path is None:
            config = RelPosTransformerConfig(**model_args.model_config, vocab_size=model_args.tokenizer_vocab_size)
        else:
            config = RelPosTransformerConfig.from_pretrained(model_args.model_name_or_path,
                                                             cache_dir=model_args.cache_dir, **model_args.model_config)
    except (OSError, ValueError, TypeError):
        return None
    with torch.device("meta"):
        model = RelPosTransformerForConditionalGeneration(config)
    return sum(parameter.numel() * parameter.element_size() for parameter in model.parameters())


def required_disk_bytes(weight_bytes: int, training_args: TranslationTrainingArguments) -> int:
    """Free space a run needs in output_dir, roughly: the final model, plus, when checkpointing, `save_total_limit`
    + 1 checkpoints (the new one is written before the oldest is deleted; 1 without a limit) of weights and optimizer
    state. Tokenizer, results and data files are small next to it."""
    if not training_args.do_train:
        return 0
    checkpoints = 0
    if training_args.save_strategy != "no":
        checkpoints = training_args.save_total_limit + 1 if training_args.save_total_limit else 1
    return weight_bytes * (1 + CHECKPOINT_SIZE_FACTOR * checkpoints)


def save_final_model(trainer: TranslationTrainer) -> None:
    """`trainer.save_model()`, written to a staging folder inside output_dir and moved in file by file with the
    weights (model.safetensors, or the shard index) removed first and moved last: a kill mid-way leaves a folder
    without weights, which `from_pretrained` refuses, never one that mixes old and new files."""
    output_dir = Path(trainer.args.output_dir)
    staging = output_dir / FINAL_MODEL_STAGING
    if trainer.args.should_save:
        shutil.rmtree(staging, ignore_errors=True)
    trainer.save_model(str(staging))
    if trainer.args.should_save:
        weights = WEIGHTS_INDEX_FILE if (staging / WEIGHTS_INDEX_FILE).is_file() else WEIGHTS_FILE
        for name in (WEIGHTS_FILE, WEIGHTS_INDEX_FILE):
            (output_dir / name).unlink(missing_ok=True)
        move_folder_contents(staging, output_dir, last=weights)


def _write_hypotheses(path: Path, hypotheses: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for hypothesis in hypotheses:
            handle.write(" ".join(hypothesis.splitlines()) + "\n")


def _report(trainer: TranslationTrainer, prefix: str, metrics: dict[str, Any]) -> None:
    trainer.log_metrics(prefix, metrics)
    trainer.save_metrics(prefix, metrics)
    if trainer.is_world_process_zero() and f"{prefix}_bleu" in metrics:
        _write_hypotheses(Path(trainer.args.output_dir) / HYPOTHESES_FILE.format(prefix=prefix),
                          trainer.evaluation_sets[prefix].hypotheses)
        print(f"{prefix}: sacreBLEU {metrics[f'{prefix}_bleu']:.2f}  chrF {metrics[f'{prefix}_chrf']:.2f}  "
              f"({metrics[f'{prefix}_bleu_signature']})", flush=True)


def _last_complete_checkpoint(output_dir: str, setting: str) -> Path:
    last = last_complete_checkpoint(output_dir) if os.path.isdir(output_dir) else None
    if last is None:
        raise ConfigError(f"resume_from_checkpoint={setting}: no checkpoint-<step> folder in {output_dir} is complete")
    return last


def _resolve_resume_checkpoint(training_args: TranslationTrainingArguments) -> str | None:
    """`resume_from_checkpoint`: a checkpoint folder, or "last"/"true" for the newest complete one in output_dir
    (a checkpoint whose writing was cut short is skipped)."""
    resume_from = training_args.resume_from_checkpoint
    if resume_from is None:
        return None
    if resume_from.lower() in ("true", "last"):
        return str(_last_complete_checkpoint(training_args.output_dir, resume_from))
    if not os.path.isdir(resume_from):
        raise ConfigError(f"resume_from_checkpoint: {resume_from!r} is not a folder")
    if not is_complete_checkpoint(resume_from):
        raise ConfigError(f"resume_from_checkpoint: {resume_from!r} is not a complete checkpoint (its "
                          f"{TRAINER_STATE_FILE}, written last, is missing or cut short); use an older checkpoint")
    return resume_from


def run(argv: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Parse, prepare, train/evaluate/predict; returns the metrics of each stage run ("train", "eval", "test")."""
    model_args, data_args, training_args = parse_arguments(argv)
    # hf_relpos.hub pushes once, after scoring, with the rendered card; the Trainer's own pushes would upload
    # checkpoints and a generic card before evaluation.
    push_to_hub, training_args.push_to_hub = training_args.push_to_hub, False
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO,
                        stream=sys.stdout, force=True)
    if not training_args.should_log:
        logging.getLogger().setLevel(logging.WARNING)
    logger.info("world size %d, process %d", training_args.world_size, training_args.process_index)
    if training_args.cpu_threads is not None:
        torch.set_num_threads(training_args.cpu_threads)
    set_seed(training_args.seed)
    check_output_dir(training_args.output_dir, required_disk_bytes(_estimated_weight_bytes(model_args) or 0,
                                                                   training_args))

    needs_validation = training_args.do_eval or (training_args.do_train and training_args.eval_strategy != "no")
    splits = tuple(split for split, wanted in (("train", training_args.do_train), ("validation", needs_validation),
                                               ("test", training_args.do_predict)) if wanted)
    resume_from = _resolve_resume_checkpoint(training_args)
    with training_args.main_process_first(desc="loading data"):
        raw = load_parallel_splits(data_args, splits, Path(training_args.output_dir) / DEMO_DATA_FOLDER,
                                   cache_dir=model_args.cache_dir)

    with training_args.main_process_first(desc="tokenizer"):
        tokenizer, newly_trained = _obtain_tokenizer(model_args, training_args, raw.get("train"))
        train_dataset = tokenize_training_pairs(raw["train"], tokenizer, data_args)[0] if "train" in raw else None
        if train_dataset is not None:
            _check_token_budget(train_dataset, training_args)
        evaluation_sets = {prefix: _prepare_evaluation_set(raw[split], tokenizer, data_args, split)
                           for prefix, split in (("eval", "validation"), ("test", "test")) if split in raw}
        if newly_trained:
            _check_num_beams(training_args, len(tokenizer))  # the new model's vocabulary; before anything is saved
            if training_args.should_save:
                save_tokenizer(tokenizer, training_args.output_dir)

    model = _build_model(model_args, tokenizer, data_args, training_args)
    logger.info("%s: %s positions, %.1fM parameters", type(model).__name__, model.config.attention_type,
                model.num_parameters() / 1e6)
    trainer = TranslationTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=evaluation_sets["eval"].dataset if "eval" in evaluation_sets else None,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        evaluation_sets=evaluation_sets,
    )

    results: dict[str, dict[str, Any]] = {}
    if training_args.do_train:
        train_result = trainer.train(resume_from_checkpoint=resume_from)
        save_final_model(trainer)
        metrics = dict(train_result.metrics, train_samples=len(train_dataset))
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
        results["train"] = metrics
    if training_args.do_eval:
        metrics = trainer.evaluate(metric_key_prefix="eval")
        metrics["eval_samples"] = len(evaluation_sets["eval"].order)
        _report(trainer, "eval", metrics)
        results["eval"] = metrics
    if training_args.do_predict:
        prediction = trainer.predict(evaluation_sets["test"].dataset, metric_key_prefix="test")
        metrics = dict(prediction.metrics, test_samples=len(evaluation_sets["test"].order))
        _report(trainer, "test", metrics)
        results["test"] = metrics
    if push_to_hub and training_args.should_save:
        push_training_output(model_args, data_args, training_args)
    return results


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point: `python train_translation.py configs/NAME.yaml [--name value ...]`."""
    try:
        run(sys.argv[1:] if argv is None else argv)
    except (ConfigError, DatasetSchemaError, OutputDirError, HubPushError) as error:
        print(f"train_translation.py: error: {error}", file=sys.stderr)
        sys.exit(2)
    except NonFiniteLossError as error:
        print(f"train_translation.py: error: {error}", file=sys.stderr)
        sys.exit(1)
    close_process_group()


def close_process_group() -> None:
    """Under `accelerate launch`: wait for every rank, then destroy the process group, so that no rank exits (and
    tears gloo/NCCL down in the interpreter's shutdown, which can abort with SIGABRT) while another still runs."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
