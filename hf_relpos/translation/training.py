"""Training and evaluation of RelPosTransformer translation models with the Hugging Face `Seq2SeqTrainer`.

`main()` is the body of `train_translation.py`: YAML + command-line arguments -> data -> tokenizer -> model ->
`TranslationTrainer` (token-budget batching, per-batch generation length, sacreBLEU) -> results files.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import hashlib
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import PartialState
from datasets import Dataset
from safetensors import SafetensorError
from torch.utils.data import DataLoader, SequentialSampler
from tqdm.auto import tqdm
from transformers import (
    DataCollatorForSeq2Seq,
    EvalPrediction,
    PreTrainedTokenizerBase,
    Seq2SeqTrainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
    set_seed,
)
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, PredictionOutput, TrainOutput, seed_worker
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from ..model.attention_functions import length_multiple
from ..model.configuration_relpos import RelPosTransformerConfig
from ..model.generation_limits import new_token_limits, set_relative_limit
from ..model.modeling_relpos import RelPosTransformerForConditionalGeneration, check_num_beams, meta_model
from ..publish.files import move_folder_contents, write_text_atomic
from ..publish.hub import CARD_FILE, HubPushError, RunRecord, load_results, push_model_folder, render_model_card
from ..publish.records import RUN_RECORD_FILE, cpu_model_name, scores_from_results
from .arguments import (
    MODEL_SECTION,
    PROGRAM,
    ConfigError,
    ModelArguments,
    TranslationTrainingArguments,
    parse_arguments,
)
from .batching import TokenBudgetBatchSampler, check_examples_fit
from .checkpoints import (
    AVERAGED_CHECKPOINTS_FILE,
    TRAINER_STATE_FILE,
    average_weights,
    complete_checkpoints,
    config_differences,
    is_complete_checkpoint,
    last_complete_checkpoint,
    saved_config,
)
from .data import (
    DEMO_DATA_FOLDER,
    DEMO_DATASET_NAME,
    PROGRESS_MIN_BYTES,
    DataArguments,
    DatasetSchemaError,
    LengthReport,
    example_lengths,
    existing_data_files,
    has_references,
    load_parallel_splits,
    local_split_files,
    restore_order,
    sort_by_source_length,
    tokenize_evaluation_pairs,
    tokenize_training_pairs,
)
from .metrics import decode_token_ids, generated_lengths, score_translations
from .preflight import (
    PreflightError,
    ProcessGroupError,
    check_hub_login,
    check_process_group,
    check_rerun,
    remove_previous_run,
)
from .prepared import (
    PreparationError,
    files_sha256,
    load_prepared,
    preparation,
    preparation_key,
    prepared_root,
    publish_prepared,
    tokenizer_sha256,
)
from .safety import (
    FINAL_MODEL_STAGING,
    NonFiniteLossError,
    OutputDirError,
    check_output_dir,
)
from .tokenization import (
    TOKENIZER_FILE,
    has_saved_tokenizer,
    load_tokenizer,
    load_tokenizer_settings,
    save_tokenizer_settings,
    settings_differences,
    special_token_ids,
    tokenizer_settings,
    train_joint_tokenizer,
)

logger = logging.getLogger(__name__)

HYPOTHESES_FILE = "{prefix}_hypotheses.txt"
# Disk needed per checkpoint, in multiples of the weights: weights + Adam's two moment estimates.
CHECKPOINT_SIZE_FACTOR = 3
# Processes waiting for the main one's data loading and tokenizer training look for its marker file this often, and
# say that they still wait this often.
TURN_POLL_SECONDS = 2.0
TURN_LOG_SECONDS = 300.0


def _wait_for_files(paths: Sequence[Path], failed: Path, desc: str, poll_seconds: float) -> None:
    """Return once every file in `paths` exists; `ProcessGroupError` as soon as `failed` does. No time limit."""
    started = last_log = time.monotonic()
    while not all(path.exists() for path in paths):
        if failed.exists():
            raise ProcessGroupError(f"another process failed during {desc}; its error is above")
        if time.monotonic() - last_log >= TURN_LOG_SECONDS:
            last_log = time.monotonic()
            logger.info("still waiting for the main process to finish %s (%.0f min)", desc,
                        (last_log - started) / 60)
        time.sleep(poll_seconds)


def turn_marker(prefix: Path, rank: int) -> Path:
    """The file local rank `rank` writes when it has run a `local_main_first` block."""
    return prefix.with_name(f"{prefix.name}.{rank}.done")


@contextlib.contextmanager
def local_main_first(prefix: Path, local_rank: int, local_world_size: int, desc: str,
                     poll_seconds: float = TURN_POLL_SECONDS) -> Iterator[None]:
    """The block runs on local rank 0 first, then on the other local ranks (which read what it saved or cached), and
    every rank leaves it once all have run it. The turns are marker files `prefix.RANK.done`, polled without a time
    limit, not a collective bounded by `ddp_timeout`: training a tokenizer on WMT's 9M sentences can take longer
    than its 1800 s. A rank whose block raises writes `prefix.failed`, on which the waiting ranks stop."""
    failed = prefix.with_name(f"{prefix.name}.failed")

    def done(rank: int) -> Path:
        return turn_marker(prefix, rank)

    if local_rank != 0:
        _wait_for_files([done(0)], failed, desc, poll_seconds)
    try:
        yield
    except BaseException:
        failed.touch()
        raise
    done(local_rank).touch()
    _wait_for_files([done(rank) for rank in range(local_world_size)], failed, desc, poll_seconds)


@contextlib.contextmanager
def main_process_first_without_timeout(training_args: TranslationTrainingArguments, desc: str) -> Iterator[None]:
    """`TrainingArguments.main_process_first` (the local main process runs the block first: downloads, tokenizer
    training, tokenization caches), with the other processes waiting for it through `local_main_first`'s marker
    files in the temporary folder instead of in a barrier that `ddp_timeout` would end; one barrier follows, when
    every process has run the block."""
    if training_args.world_size <= 1:
        yield
        return
    if not torch.distributed.is_initialized():  # other launchers (XLA): transformers' own turns
        with training_args.main_process_first(desc=desc):
            yield
        return
    state = training_args.distributed_state
    token = [uuid.uuid4().hex]
    torch.distributed.broadcast_object_list(token, src=0)  # one name for this launch's marker files
    prefix = Path(tempfile.gettempdir()) / f"hf_relpos-{token[0]}-{desc.replace(' ', '-')}"
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", state.num_processes))
    with local_main_first(prefix, state.local_process_index, local_world_size, desc):
        yield
    torch.distributed.barrier()
    if state.is_local_main_process:
        for rank in range(local_world_size):
            turn_marker(prefix, rank).unlink(missing_ok=True)


def padding_multiple(model: RelPosTransformerForConditionalGeneration) -> int:
    """The multiple the collator pads `model`'s batch lengths to (1: none), which the token budget counts."""
    return length_multiple(model.config._attn_implementation) or 1


def _check_token_budget(train_dataset: Dataset, training_args: TranslationTrainingArguments,
                        model: RelPosTransformerForConditionalGeneration) -> None:
    """Every training pair, padded as `model`'s kernel pads it, must fit the token budget on its own; checked before
    the tokenizer is saved."""
    if training_args.max_tokens_per_batch is None:
        return
    try:
        check_examples_fit(*example_lengths(train_dataset), training_args.max_tokens_per_batch,
                           padding_multiple(model))
    except ValueError as error:
        raise ConfigError(str(error)) from None


@dataclass
class EvaluationSet:
    """A split to translate and score: tokenized examples sorted by source length (`order[i]` is the file position of
    sorted example i), and the raw source and reference texts in file order."""

    dataset: Dataset
    order: np.ndarray
    references: list[str] | None  # None for a source-only file: translations are written, nothing is scored
    sources: list[str]
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


class AbsolutePositionFadeCallback(TrainerCallback):
    """`fade_absolute_positions`: the model's `absolute_positions_scale` is s0 (1 - step / N), clipped at 0, where
    s0 is its value when training starts and step the number of optimizer steps taken (resumed runs included); set
    before the first step and after every step, so that evaluations and checkpoints see the scale the weights were
    trained to. With `load_best_model_at_end` the best checkpoint's saved scale comes back with its weights."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.start_scale: float | None = None

    def scale_at(self, step: int) -> float:
        return self.start_scale * max(0.0, 1.0 - step / self.steps)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        self.start_scale = model.config.absolute_positions_scale
        model.config.absolute_positions_scale = self.scale_at(state.global_step)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        model.config.absolute_positions_scale = self.scale_at(state.global_step)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        if args.load_best_model_at_end and state.best_model_checkpoint:
            adopt_saved_absolute_positions_scale(model, state.best_model_checkpoint)


def adopt_saved_absolute_positions_scale(model: torch.nn.Module, checkpoint: str | os.PathLike) -> None:
    """Give `model` the `absolute_positions_scale` that `checkpoint` was saved with, when its weights replace the
    trained ones (best model, average of checkpoints): under `fade_absolute_positions` it was trained to that scale."""
    config = saved_config(checkpoint)
    if config is not None and "absolute_positions_scale" in config:
        model.config.absolute_positions_scale = config["absolute_positions_scale"]


def generation_ceiling(training_args: TranslationTrainingArguments, max_position_embeddings: int) -> int:
    """New tokens any output may have, whatever its source: generation_max_length - 1 (generate's max_length counts
    the decoder start token) when set, and at most `max_position_embeddings` - 1 (the longest target the model is
    configured for); saved as the generation config's max_new_tokens."""
    limit = max_position_embeddings - 1
    if training_args.generation_max_length is not None:
        limit = min(limit, training_args.generation_max_length - 1)
    return max(1, limit)


def max_new_tokens_for(source_length: int, training_args: TranslationTrainingArguments,
                       max_position_embeddings: int) -> int:
    """New tokens an output of a `source_length`-token source may have: fairseq's max_len_a * |x| + max_len_b
    (generation_max_length_ratio, generation_max_length_offset; Vaswani et al.: input length + 50), capped by
    `generation_ceiling` (`new_token_limits`, the rule generate applies per row)."""
    return int(new_token_limits(torch.tensor([source_length]), training_args.generation_max_length_ratio,
                                training_args.generation_max_length_offset,
                                generation_ceiling(training_args, max_position_embeddings))[0])


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
                pool_factor=self.args.length_pool_factor,
                length_multiple=padding_multiple(self.model),
            )
            self.add_callback(SamplerEpochCallback(self.token_budget_sampler))
        if self.args.fade_absolute_positions is not None:
            self.add_callback(AbsolutePositionFadeCallback(self.args.fade_absolute_positions))

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
        """With `max_tokens_per_batch`, a DataLoader over the global token-budget batch list, with the Trainer's own
        loader settings (workers, pinning, persistence, prefetching, start method); accelerate deals the batches
        round-robin to the processes (the sampler itself never shards)."""
        if self.token_budget_sampler is None:
            return super().get_train_dataloader()
        dataset = self._remove_unused_columns(self.train_dataset, description="training")
        loader = DataLoader(
            dataset,
            batch_sampler=self.token_budget_sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
            persistent_workers=self.args.dataloader_persistent_workers,
            prefetch_factor=self.args.dataloader_prefetch_factor,
            multiprocessing_context=self.args.dataloader_multiprocessing_context,
            in_order=self.args.dataloader_in_order,
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

    def prediction_step(
        self, model: torch.nn.Module, inputs: dict[str, Any], prediction_loss_only: bool,
        ignore_keys: list[str] | None = None, **gen_kwargs: Any,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """Generation is capped per source by the model's generation config (max_len_a, max_len_b, and
        max_new_tokens as the ceiling: `_build_model`), as generate() and the pipeline cap it after training."""
        if self.args.predict_with_generate and not prediction_loss_only:
            gen_kwargs = dict(gen_kwargs or getattr(self, "_gen_kwargs", {}))
            gen_kwargs.pop("max_length", None)  # generation_max_length, folded into the saved max_new_tokens
            if (gen_kwargs.get("num_beams") or self.model.generation_config.num_beams) > 1:
                gen_kwargs.setdefault("length_penalty", self.args.generation_length_penalty)
        # Seq2SeqTrainer writes generate's defaults (max_length 20) into the model's generation config; a max_length
        # saved next to its max_new_tokens would make every generate(max_new_tokens=...) warn that both are set.
        generation = self.model.generation_config
        max_length = generation.max_length
        try:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs)
        finally:
            generation.max_length = max_length

    def _compute_translation_metrics(self, prediction: EvalPrediction) -> dict[str, float | str]:
        evaluation_set = self.evaluation_sets[self._active_prefix]
        # Under data parallelism the gathered predictions end with repeats of the first examples: drop them.
        generated = np.asarray(prediction.predictions)[: len(evaluation_set.order)]
        hypotheses = restore_order(decode_token_ids(generated, self.processing_class), evaluation_set.order)
        # An empty source translates to nothing (the model would invent a sentence after </s> alone).
        hypotheses = [hypothesis if source.strip() else "" for hypothesis, source in
                      zip(hypotheses, evaluation_set.sources, strict=True)]
        evaluation_set.hypotheses = hypotheses
        scores: dict[str, float | str] = {}
        if evaluation_set.references is not None:
            scores = score_translations(hypotheses, evaluation_set.references)
        lengths = generated_lengths(generated, self.processing_class.eos_token_id, self.processing_class.pad_token_id)
        scores["gen_len"] = float(lengths.mean()) if len(lengths) else 0.0
        return scores


def _prepare_evaluation_set(tokenized: Dataset) -> EvaluationSet:
    """An `EvaluationSet` of a tokenized split that kept its text columns."""
    sorted_dataset, order = sort_by_source_length(tokenized)
    return EvaluationSet(sorted_dataset, order, list(tokenized["target"]) if has_references(tokenized) else None,
                         sources=list(tokenized["source"]))


def describe_training_data(data_args: DataArguments) -> str:
    """Where the training pairs come from, in words (recorded with a trained tokenizer)."""
    if data_args.train_file:
        origin = f"train_file {str(Path(data_args.train_file).resolve())!r}"
    elif data_args.dataset_name == DEMO_DATASET_NAME:
        origin = f"demo corpus (demo_seed {data_args.demo_seed}, {data_args.demo_train_pairs} pairs)"
    else:
        origin = f"dataset {data_args.dataset_name!r} ({data_args.dataset_config_name})"
    cap = f", first {data_args.max_train_samples} pairs" if data_args.max_train_samples else ""
    sample = (f", a sample of {data_args.tokenizer_training_pairs} pairs" if data_args.tokenizer_training_pairs
              else "")
    return f"{origin}{cap}, {data_args.source_lang}+{data_args.target_lang}{sample}"


# The seed of the sample of training pairs a tokenizer is trained on (`tokenizer_training_pairs`).
TOKENIZER_SAMPLE_SEED = 0


def tokenizer_training_sample(train: Dataset, pairs: int | None) -> Dataset:
    """The training pairs a new tokenizer learns from: all, or a random sample of `pairs` (in corpus order, drawn
    with `TOKENIZER_SAMPLE_SEED`)."""
    if pairs is None or pairs >= len(train):
        return train
    chosen = np.random.default_rng(TOKENIZER_SAMPLE_SEED).choice(len(train), size=pairs, replace=False)
    return train.select(np.sort(chosen))


SAMPLE_CAPS = {"train": "max_train_samples", "validation": "max_eval_samples", "test": "max_predict_samples"}
# Texts per batch handed to the tokenizer trainer.
TOKENIZER_TRAINING_BATCH = 10_000


class RawSplits:
    """The run's splits as read from their files or the Hub, each read once and only when needed (a tokenizer to
    train, data to prepare); local files are read into memory-mapped Arrow files in the preparation folder, whose disk
    budget counts the splits in `to_prepare` (all of them until the run knows which need preparing)."""

    def __init__(self, data_args: DataArguments, splits: tuple[str, ...], output_dir: str, cache_dir: str | None,
                 stack: contextlib.ExitStack) -> None:
        self.data_args, self.splits, self.output_dir, self.cache_dir, self.stack = (
            data_args, splits, output_dir, cache_dir, stack)
        self.demo_directory = Path(output_dir) / DEMO_DATA_FOLDER
        self.files = local_split_files(data_args, splits, self.demo_directory)
        self.to_prepare = splits
        self.loaded: dict[str, Dataset] = {}
        self.folder: Path | None = None

    def data_files(self, split: str) -> list[Path]:
        return existing_data_files(self.files[split], self.data_args.source_lang, self.data_args.target_lang)

    def identities(self) -> dict[str, str]:
        """Per split, what its texts depend on: the SHA-256 of its files and the settings that select its texts (the
        languages, the sample cap); for a Hub dataset, the `datasets` fingerprint of the loaded split."""
        if self.files is None:
            return {split: self.get(split)._fingerprint for split in self.splits}
        identities = {}
        started, size = time.monotonic(), self.text_bytes(self.splits)
        with tqdm(total=size, unit="B", unit_scale=True, desc="Hashing the data files",
                  disable=size < PROGRESS_MIN_BYTES) as bar:
            for split in self.splits:
                selection = {"files": files_sha256(self.data_files(split), bar.update),
                             "sample_cap": getattr(self.data_args, SAMPLE_CAPS[split]),
                             "languages": [self.data_args.source_lang, self.data_args.target_lang]}
                identities[split] = hashlib.sha256(json.dumps(selection, sort_keys=True).encode()).hexdigest()
        logger.info("Hashed the data files (%.0f MiB) in %.1f s", size / 2**20, time.monotonic() - started)
        return identities

    def text_bytes(self, splits: tuple[str, ...]) -> int:
        """The size of what `splits` are read from: their files, or the loaded Hub splits' Arrow tables."""
        if self.files is None:
            return sum(self.get(split).data.nbytes for split in splits)
        return sum(path.stat().st_size for split in splits for path in self.data_files(split))

    def workdir(self) -> Path:
        """The preparation folder of this run (created at the first call, with the disk budget of the splits in
        `to_prepare`; removed when the run's preparation ends)."""
        if self.folder is None:
            self.folder = self.stack.enter_context(preparation(self.output_dir, self.text_bytes(self.to_prepare)))
        return self.folder

    def get(self, split: str) -> Dataset:
        """The texts of `split` (a Hub dataset loads all its splits at once)."""
        if split not in self.loaded:
            splits = self.splits if self.files is None else (split,)
            workdir = None if self.files is None else self.workdir() / "raw"
            started = time.monotonic()
            loaded = load_parallel_splits(self.data_args, splits, self.demo_directory, cache_dir=self.cache_dir,
                                          workdir=workdir)
            logger.info("Read %s in %.1f s", ", ".join(f"{name} ({len(dataset)} pairs)" for name, dataset in
                                                        loaded.items()), time.monotonic() - started)
            self.loaded.update(loaded)
        return self.loaded[split]


def text_batches(dataset: Dataset) -> Iterator[list[str]]:
    """The source texts, then the target texts, `TOKENIZER_TRAINING_BATCH` at a time, read as Arrow columns."""
    columns = dataset.with_format("arrow")
    with tqdm(total=2 * len(dataset), desc="Training the tokenizer", unit=" texts") as bar:
        for column in ("source", "target"):
            for batch in columns.iter(TOKENIZER_TRAINING_BATCH):
                bar.update(batch.num_rows)
                yield batch[column].to_pylist()


@dataclass
class PreparedData:
    """What a run trains and evaluates on."""

    tokenizer: PreTrainedTokenizerBase
    new_tokenizer_settings: dict[str, Any] | None  # to save with a newly trained tokenizer
    model: RelPosTransformerForConditionalGeneration
    train_dataset: Dataset | None
    evaluation_sets: dict[str, EvaluationSet]


def prepare_data(model_args: ModelArguments, data_args: DataArguments, training_args: TranslationTrainingArguments,
                 splits: tuple[str, ...], retrain: bool, resuming: bool) -> PreparedData:
    """The tokenizer, the model (built, and so checked, before any data is written) and the tokenized splits: each
    split is loaded (memory-mapped) from output_dir/prepared_data when it was prepared from the same files, tokenizer
    and settings, else read, tokenized, filtered and saved there (see `hf_relpos.translation.prepared`); the texts
    are read only for a split to prepare or a tokenizer to train."""
    output_dir = training_args.output_dir
    with contextlib.ExitStack() as stack:
        raw = RawSplits(data_args, splits, output_dir, model_args.cache_dir, stack)
        identities = raw.identities()
        tokenizer, new_settings = _obtain_tokenizer(model_args, data_args, training_args, identities.get("train"), raw,
                                                    retrain=retrain, resuming=resuming)
        model = _build_model(model_args, tokenizer, data_args, training_args)
        token_ids = tokenizer_sha256(tokenizer)
        keys, prepared = {}, {}
        for split in splits:
            inputs = {"split": split, "data": identities[split], "tokenizer": token_ids,
                      **{name: getattr(data_args, name) for name in ("max_source_length", "max_target_length")}}
            if split == "train":
                inputs["overlong_pairs"] = data_args.overlong_pairs
            keys[split] = inputs
            loaded = load_prepared(output_dir, split, preparation_key(inputs))
            if loaded is not None:
                report = LengthReport(**loaded[1]["report"])
                logger.info(report.describe(data_args.overlong_pairs if split == "train" else "truncate"))
                prepared[split] = loaded[0]
        raw.to_prepare = tuple(split for split in splits if split not in prepared)
        for split in raw.to_prepare:
            inputs, key = keys[split], preparation_key(keys[split])
            started = time.monotonic()
            workdir = raw.workdir() / "work"
            if split == "train":
                dataset, report = tokenize_training_pairs(raw.get(split), tokenizer, data_args, workdir,
                                                          keep_text=False)
            else:
                dataset, report = tokenize_evaluation_pairs(raw.get(split), tokenizer, data_args, split, workdir)
            publish_prepared(raw.workdir(), split, key, dataset, {"inputs": inputs, "report": vars(report)})
            logger.info("Prepared the %s data in %.1f s", split, time.monotonic() - started)
            prepared[split] = load_prepared(output_dir, split, key)[0]
    evaluation_sets = {prefix: _prepare_evaluation_set(prepared[split])
                       for prefix, split in (("eval", "validation"), ("test", "test")) if split in prepared}
    return PreparedData(tokenizer, new_settings, model, prepared.get("train"), evaluation_sets)


def _obtain_tokenizer(
    model_args: ModelArguments, data_args: DataArguments, training_args: TranslationTrainingArguments,
    train_data_sha256: str | None, raw: RawSplits, retrain: bool, resuming: bool,
) -> tuple[PreTrainedTokenizerBase, dict[str, Any] | None]:
    """(tokenizer, settings to save with it when newly trained): tokenizer_name, else the model's, else the one in
    output_dir if it was trained with this run's settings (any when resuming), else a new one trained on the training
    split. `retrain` ignores the one in output_dir (a fresh run)."""
    for field_name in ("tokenizer_name", "model_name_or_path"):
        name_or_path = getattr(model_args, field_name)
        if name_or_path is not None:
            try:
                return load_tokenizer(name_or_path), None
            except (OSError, ValueError) as error:
                raise ConfigError(f"{field_name} {name_or_path!r}: cannot load its tokenizer: {error}") from None
    if train_data_sha256 is None:
        raise ConfigError("no tokenizer_name or model_name_or_path, and no training split to train a tokenizer on")
    output_dir = training_args.output_dir
    if data_args.tokenizer_training_pairs is not None:
        sample = f"{train_data_sha256}\0sample {data_args.tokenizer_training_pairs} seed {TOKENIZER_SAMPLE_SEED}"
        train_data_sha256 = hashlib.sha256(sample.encode()).hexdigest()
    settings = tokenizer_settings(train_data_sha256, model_args.tokenizer_vocab_size, describe_training_data(data_args))
    if has_saved_tokenizer(output_dir) and not retrain:
        differences = settings_differences(load_tokenizer_settings(output_dir), settings)
        if differences and not resuming:
            raise ConfigError(
                f"output_dir {output_dir!r} holds a tokenizer trained with other settings than this run's "
                f"({'; '.join(differences)}): train a new one with --overwrite_output_dir true (a fresh run), use "
                f"it as it is with --tokenizer_name {output_dir}, or choose another output_dir")
        if differences:
            logger.warning("Resuming with the tokenizer saved in %s (the checkpoints need it), although %s",
                           output_dir, "; ".join(differences))
        else:
            logger.info("Reusing the tokenizer saved in %s (trained with this run's settings)", output_dir)
        return load_tokenizer(output_dir), None
    logger.info("Training a joint BPE tokenizer (vocabulary %d) on the training split", model_args.tokenizer_vocab_size)
    started = time.monotonic()
    texts = tokenizer_training_sample(raw.get("train"), data_args.tokenizer_training_pairs)
    tokenizer = train_joint_tokenizer(text_batches(texts), model_args.tokenizer_vocab_size)
    release_freed_memory()
    logger.info("Trained the tokenizer in %.1f s", time.monotonic() - started)
    return tokenizer, settings


def release_freed_memory() -> None:
    """Hand the memory the tokenizer trainer freed (Rust, through the C allocator, which keeps it) back to the system,
    so that this process, and the tokenization workers forked from it next, do not keep the trainer's peak."""
    with contextlib.suppress(OSError, AttributeError):   # not glibc
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, output_dir: str | os.PathLike,
                   settings: dict[str, Any] | None = None) -> None:
    """Save next to the model with its training settings; files are staged and moved in, tokenizer.json (the reuse
    marker) last."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tokenizer.", dir=output_dir))
    try:
        tokenizer.save_pretrained(staging)
        if settings is not None:
            save_tokenizer_settings(settings, staging)
        move_folder_contents(staging, output_dir, last=TOKENIZER_FILE)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _build_model(
    model_args: ModelArguments, tokenizer: PreTrainedTokenizerBase, data_args: DataArguments,
    training_args: TranslationTrainingArguments,
) -> RelPosTransformerForConditionalGeneration:
    kernel = {} if model_args.attn_implementation is None else {"attn_implementation": model_args.attn_implementation}
    if model_args.model_name_or_path is not None:
        try:
            model = RelPosTransformerForConditionalGeneration.from_pretrained(
                model_args.model_name_or_path, cache_dir=model_args.cache_dir, **kernel, **model_args.model_config
            )
        except SafetensorError as error:
            raise ConfigError(f"model_name_or_path {model_args.model_name_or_path!r}: its weights file is corrupt or "
                              f"incomplete ({error})") from None
        except ImportError as error:  # a transformers kernel whose package is missing (flash_attention_2, ...)
            raise ConfigError(f"attn_implementation {model_args.attn_implementation!r}: {error}") from None
        except (OSError, ValueError, RuntimeError) as error:
            raise ConfigError(f"model_name_or_path {model_args.model_name_or_path!r}: {error}") from None
        if model.config.vocab_size < len(tokenizer):
            raise ConfigError(f"the tokenizer has {len(tokenizer)} tokens but the model only "
                              f"{model.config.vocab_size} embeddings")
    else:
        try:
            config = RelPosTransformerConfig(
                **model_args.model_config, vocab_size=len(tokenizer), **special_token_ids(tokenizer), **kernel
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
    generation.num_beams = training_args.generation_num_beams or 1
    if generation.num_beams > 1:
        generation.length_penalty = training_args.generation_length_penalty
    # The length cap relative to each source (max_len_a, max_len_b), under a ceiling as max_new_tokens, generate's
    # own knob: a saved max_length would make every generate(max_new_tokens=...) call warn that both are set.
    generation.max_length = None
    generation.max_new_tokens = generation_ceiling(training_args, model.config.max_position_embeddings)
    set_relative_limit(generation, training_args.generation_max_length_ratio,
                       training_args.generation_max_length_offset)
    # A new model's ids come from its tokenizer; a pretrained one keeps those it was trained with (a converted Marian
    # model starts decoding with pad, not with the tokenizer's bos/eos).
    for name, value in special_token_ids(tokenizer).items():
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
    return sum(parameter.numel() * parameter.element_size() for parameter in meta_model(config).parameters())


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


def average_final_weights(trainer: TranslationTrainer, count: int) -> None:
    """`average_checkpoints`: load the mean of the run's last `count` complete checkpoints (fewer, with a warning, if
    it saved fewer; none: the trained weights stay) into the trained model, in every process, so that the model
    saved, evaluated and predicted with is the average (Vaswani et al. 2017). Only checkpoints saved with the newest
    one's config are averaged (the others are named in a warning; under `fade_absolute_positions` they were trained
    to another `absolute_positions_scale`), and the model takes that checkpoint's scale.
    output_dir/averaged_checkpoints.json names the checkpoints."""
    trainer.accelerator.wait_for_everyone()   # the main process wrote the checkpoints
    output_dir = Path(trainer.args.output_dir)
    checkpoints = complete_checkpoints(output_dir)[-count:]
    if not checkpoints:
        logger.warning("average_checkpoints=%d: the run saved no checkpoint; the final model is the trained weights",
                       count)
        return
    if len(checkpoints) < count:
        logger.warning("average_checkpoints=%d: the run saved only %d checkpoint(s); averaging those", count,
                       len(checkpoints))
    differing = {path: config_differences(path, checkpoints[-1]) for path in checkpoints[:-1]}
    differing = {path: differences for path, differences in differing.items() if differences}
    if differing:
        logger.warning("average_checkpoints=%d: %s; averaging the %d checkpoint(s) saved with the config of %s only "
                       "(weights trained for another config do not average into this model)", count,
                       "; ".join(f"{path.name} saved another config than {checkpoints[-1].name} "
                                 f"({', '.join(differences)})" for path, differences in differing.items()),
                       len(checkpoints) - len(differing), checkpoints[-1].name)
        checkpoints = [path for path in checkpoints if path not in differing]
    averaged = average_weights(checkpoints)
    model = trainer.accelerator.unwrap_model(trainer.model)
    adopt_saved_absolute_positions_scale(model, checkpoints[-1])
    state = model.state_dict()   # shares storage with the parameters
    unknown = sorted(averaged.keys() - state.keys())
    if unknown:
        raise RuntimeError(f"average_checkpoints: the checkpoints hold tensors the model lacks: {unknown[:10]}")
    with torch.no_grad():
        for name, tensor in averaged.items():
            state[name].copy_(tensor)
    if trainer.args.should_save:
        provenance = {"average_checkpoints": count, "checkpoints": [path.name for path in checkpoints]}
        write_text_atomic(output_dir / AVERAGED_CHECKPOINTS_FILE, json.dumps(provenance, indent=2) + "\n")
    logger.info("average_checkpoints: the final model is the average of %s", ", ".join(path.name for path in checkpoints))


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
        weights = SAFE_WEIGHTS_INDEX_NAME if (staging / SAFE_WEIGHTS_INDEX_NAME).is_file() else SAFE_WEIGHTS_NAME
        for name in (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME):
            (output_dir / name).unlink(missing_ok=True)
        move_folder_contents(staging, output_dir, last=weights)


def _write_hypotheses(path: Path, hypotheses: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for hypothesis in hypotheses:
            handle.write(" ".join(hypothesis.splitlines()) + "\n")


def _report(trainer: TranslationTrainer, prefix: str, metrics: dict[str, Any]) -> None:
    evaluation_set = trainer.evaluation_sets[prefix]
    if evaluation_set.references is None:
        metrics.pop(f"{prefix}_loss", None)  # against no reference: meaningless
    trainer.log_metrics(prefix, metrics)
    trainer.save_metrics(prefix, metrics)
    if not trainer.is_world_process_zero() or not trainer.args.predict_with_generate:
        return
    path = Path(trainer.args.output_dir) / HYPOTHESES_FILE.format(prefix=prefix)
    _write_hypotheses(path, evaluation_set.hypotheses)
    if evaluation_set.references is None:
        print(f"{prefix}: the source-only file has no references, so BLEU and chrF are skipped; "
              f"{len(evaluation_set.hypotheses)} translations written to {path}", flush=True)
    else:
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
    """Parse, check, prepare, train/evaluate/predict; returns the metrics of each stage run ("train", "eval",
    "test"). Every check that can fail (arguments, environment, output_dir, data, tokenizer, model) runs before
    anything is written to output_dir."""
    model_args, data_args, training_args = parse_arguments(argv)
    # hf_relpos.publish.hub pushes once, after scoring, with the rendered card; the Trainer's own pushes would upload
    # checkpoints and a generic card before evaluation.
    push_to_hub, training_args.push_to_hub = training_args.push_to_hub, False
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO,
                        stream=sys.stdout, force=True)
    if not training_args.should_log:
        logging.getLogger().setLevel(logging.WARNING)
    check_process_group(training_args.world_size)
    logger.info("world size %d, process %d", training_args.world_size, training_args.process_index)
    if training_args.cpu_threads is not None:
        torch.set_num_threads(training_args.cpu_threads)
    set_seed(training_args.seed)
    output_dir = training_args.output_dir
    check_output_dir(output_dir, required_disk_bytes(_estimated_weight_bytes(model_args) or 0, training_args))
    resume_from = _resolve_resume_checkpoint(training_args)
    fresh_run = training_args.do_train and training_args.overwrite_output_dir
    if training_args.do_train:
        check_rerun(output_dir, overwrite=fresh_run, resuming=resume_from is not None)
    if push_to_hub and training_args.should_save:
        logger.info("push_to_hub: logged in to the Hugging Face Hub as %s", check_hub_login(training_args.hub_token))

    needs_validation = training_args.do_eval or (training_args.do_train and training_args.eval_strategy != "no")
    splits = tuple(split for split, wanted in (("train", training_args.do_train), ("validation", needs_validation),
                                               ("test", training_args.do_predict)) if wanted)
    with main_process_first_without_timeout(training_args, desc="data preparation"):
        prepared = prepare_data(model_args, data_args, training_args, splits,
                                retrain=fresh_run and training_args.should_save, resuming=resume_from is not None)
        tokenizer, model, train_dataset, evaluation_sets = (prepared.tokenizer, prepared.model, prepared.train_dataset,
                                                            prepared.evaluation_sets)
        if train_dataset is not None:
            _check_token_budget(train_dataset, training_args, model)
        if training_args.should_save:  # the first write of the run besides the prepared data: every check has passed
            if fresh_run:
                removed = remove_previous_run(output_dir)
                if removed:
                    logger.info("overwrite_output_dir: removed the previous run from %s (%s)", output_dir,
                                ", ".join(removed))
            if prepared.new_tokenizer_settings is not None:
                save_tokenizer(tokenizer, output_dir, prepared.new_tokenizer_settings)
    if training_args.prepare_only:
        logger.info("prepare_only: tokenizer in %s, data prepared in %s; stopping before training", output_dir,
                    prepared_root(output_dir))
        return {}
    if model_args.model_config and model_args.model_name_or_path is not None:
        log = logger.info if training_args.do_train else logger.warning
        log("model: overrides of the saved config of %s: %s", model_args.model_name_or_path,
            ", ".join(f"{name}={value!r}" for name, value in model_args.model_config.items()))
    logger.info("%s: %s positions, %.1fM parameters", type(model).__name__, model.config.position_scheme,
                model.num_parameters() / 1e6)
    trainer = TranslationTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=evaluation_sets["eval"].dataset if "eval" in evaluation_sets else None,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100,
                                             pad_to_multiple_of=length_multiple(model.config._attn_implementation)),
        evaluation_sets=evaluation_sets,
    )

    results: dict[str, dict[str, Any]] = {}
    if training_args.do_train:
        train_result = trainer.train(resume_from_checkpoint=resume_from)
        if training_args.average_checkpoints is not None:
            average_final_weights(trainer, training_args.average_checkpoints)
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
    if training_args.should_save and (training_args.do_train or push_to_hub):
        record = run_record(model_args, data_args, training_args, results.get("train", {}).get("train_runtime"))
        record.scores = scores_from_results(results)
        if training_args.do_train:
            write_model_card(model, record, training_args)
            write_text_atomic(Path(training_args.output_dir) / RUN_RECORD_FILE,
                              json.dumps(record.to_json(), indent=1) + "\n")
        if push_to_hub:
            push_training_output(record, training_args)
    return results


def run_record(model_args: ModelArguments, data_args: DataArguments, training_args: TranslationTrainingArguments,
               training_seconds: float | None = None) -> RunRecord:
    """This run as its model card describes it: each recipe field of `RunRecord` from the argument that bears its
    name (steps or epochs, whichever the run counts; the pairs per batch only without a token budget), the
    processes, the hardware and (after training) the training time."""
    omitted = {"num_train_epochs" if training_args.max_steps > 0 else "max_steps"}
    if training_args.max_tokens_per_batch is not None:
        omitted.add("per_device_train_batch_size")
    recipe = {name: _plain(getattr(next(arguments for arguments in (data_args, model_args, training_args)
                                        if hasattr(arguments, name)), name))
              for name in RunRecord.recipe_fields() if name not in omitted}
    return RunRecord(model=dict(model_args.model_config), **recipe, devices=training_args.world_size,
                     hardware=_hardware_name(training_args), training_seconds=training_seconds)


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def _hardware_name(training_args: TranslationTrainingArguments) -> str:
    """The accelerator this process trained on (its name), else the CPU's."""
    device = training_args.device
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type.upper() if device.type != "cpu" else f"CPU: {cpu_model_name()}"


def write_model_card(model: RelPosTransformerForConditionalGeneration, record: RunRecord,
                     training_args: TranslationTrainingArguments) -> Path:
    """output_dir/README.md: the model card of this run (recipe, run facts and scores), as run_translation's
    `create_model_card` writes one, so a folder uploaded by hand is documented."""
    path = Path(training_args.output_dir) / CARD_FILE
    card = render_model_card(model.config, record, load_results(training_args.output_dir),
                             repo_id=training_args.hub_model_id)
    write_text_atomic(path, card)
    return path


def push_training_output(record: RunRecord, training_args: TranslationTrainingArguments) -> str:
    """`push_to_hub: true`: push output_dir (model, tokenizer, results) to `hub_model_id` (default: the output
    folder's name) with the card of this run."""
    folder = Path(training_args.output_dir)
    return push_model_folder(folder, training_args.hub_model_id or folder.resolve().name, recipe=record,
                             token=training_args.hub_token, private=training_args.hub_private_repo)


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point: `python train_translation.py configs/NAME.yaml [--name value ...]`."""
    try:
        run(sys.argv[1:] if argv is None else argv)
    except ProcessGroupError as error:
        if torch.distributed.get_rank() == 0:  # all processes stop here: one line is enough
            print(f"{PROGRAM}: error: {error}", file=sys.stderr)
        sys.exit(2)
    except (ConfigError, DatasetSchemaError, OutputDirError, HubPushError, PreflightError, PreparationError) as error:
        print(f"{PROGRAM}: error: {error}", file=sys.stderr)
        sys.exit(2)
    except NonFiniteLossError as error:
        print(f"{PROGRAM}: error: {error}", file=sys.stderr)
        sys.exit(1)
    # Under accelerate launch: no rank may exit (and tear gloo/NCCL down in the interpreter's shutdown, which can
    # abort with SIGABRT) while another still runs.
    state = PartialState()
    state.wait_for_everyone()
    state.destroy_process_group()
