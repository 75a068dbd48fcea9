"""The Trainer of a translation run and its callbacks: `TranslationTrainer` (a `Seq2SeqTrainer` with token-budget
training batches, generation capped per source, sacreBLEU/chrF against the raw references and a stop on a
non-finite loss), the callbacks that tell the batch sampler the epoch, record the settings that decide the batch order
and fade the absolute positions out, the checkpoint a run resumes from, and the report of each stage: metrics logged
and saved, translations written to `{prefix}_hypotheses.txt`, scores printed."""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import os
import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from datasets import Dataset
from torch.utils.data import DataLoader, SequentialSampler
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter
from transformers import (
    DataCollatorForSeq2Seq,
    EarlyStoppingCallback,
    EvalPrediction,
    PreTrainedTokenizerBase,
    Seq2SeqTrainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from transformers.trainer import SCHEDULER_NAME
from transformers.trainer_callback import ExportableState
from transformers.trainer_jit_checkpoint import JITCheckpointCallback
from transformers.trainer_pt_utils import LabelSmoother
from transformers.trainer_utils import (
    PREFIX_CHECKPOINT_DIR,
    EvalLoopOutput,
    IntervalStrategy,
    PredictionOutput,
    SaveStrategy,
    TrainOutput,
    seed_worker,
    sort_checkpoints,
)

from ..model.attention_functions import length_multiple
from ..model.generation_limits import longest_new_output, new_token_limits, relative_limit
from ..model.modeling_relpos import RelPosTransformerForConditionalGeneration
from ..publish.files import apply_umask_mode_to_weights, atomic_file, write_text_atomic
from ..publish.pipeline_relpos import reached_length_limit
from ..publish.records import ALL_RESULTS_FILE, HYPOTHESES_FILE, RESULTS_FILE, RUN_RECORD_FILE
from .arguments import ConfigError, TranslationTrainingArguments, data_seed, yaml_text
from .batching import TokenBudgetBatchSampler
from .checkpoints import (
    CHECKPOINT_PATTERN,
    TRAINER_STATE_FILE,
    checkpoint_step,
    find_checkpoints,
    is_complete_checkpoint,
    last_complete_checkpoint,
    saved_config,
)
from .data import example_lengths, restore_order
from .metrics import decode_token_ids, generated_lengths, score_translations
from .preflight import finished_model_files
from .safety import NonFiniteLossError, TrainingStoppedError

logger = logging.getLogger(__name__)



def padding_multiple(model: RelPosTransformerForConditionalGeneration) -> int:
    """The multiple the collator pads `model`'s batch lengths to (1: none), which the token budget counts."""
    return length_multiple(model.config._attn_implementation) or 1


def token_budget_sampler(lengths: tuple[np.ndarray, np.ndarray], training_args: TranslationTrainingArguments,
                         model: RelPosTransformerForConditionalGeneration,
                         num_processes: int) -> TokenBudgetBatchSampler:
    """The batches of `max_tokens_per_batch` the trainer draws from training pairs of these (source, target)
    `lengths` under `num_processes` processes (a ValueError where they cannot be shared among them)."""
    return TokenBudgetBatchSampler(*lengths, training_args.max_tokens_per_batch, num_processes=num_processes,
                                   seed=data_seed(training_args), pool_factor=training_args.length_pool_factor,
                                   length_multiple=padding_multiple(model))


def worker_seed_generator(training_args: TranslationTrainingArguments) -> torch.Generator:
    """The generator, seeded with data_seed, that a training loader draws its workers' base seed from each time it
    opens an iterator (torch's `_BaseDataLoaderIter`; without one, from the global generator that dropout draws from).
    With `dataloader_persistent_workers` an uninterrupted run opens the iterator once and reuses it every epoch, a
    resumed run opens one more (its first epoch's batches are those left after the skipped ones): drawn from the
    global generator, that shifted every dropout mask of the resumed run's next epochs against the uninterrupted
    run's."""
    return torch.Generator().manual_seed(data_seed(training_args))


@dataclass
class EvaluationSet:
    """A split to translate and score: tokenized examples sorted by source length (`order[i]` is the file position of
    sorted example i), and the raw source and reference texts in file order."""

    dataset: Dataset
    order: np.ndarray
    references: list[str] | None  # None for a source-only file: translations are written, nothing is scored
    sources: list[str]
    hypotheses: list[str] = field(default_factory=list)


class PromotedLabelSmoother(LabelSmoother):
    """transformers' `LabelSmoother` (the loss of a run with `label_smoothing_factor` > 0): over the labelled tokens
    (`ignore_index` left out of both terms), (1 - epsilon) (-log p_label) + epsilon mean_v (-log p_v), summed and
    divided by `num_items_in_batch` (the labelled tokens of the optimizer step, over its micro-batches and
    processes) or, without it, by this batch's labelled tokens. Computed in promote_types(logits dtype, float32),
    as the model's own loss is: transformers' sums the smoothing term in float32, which made a float64 model's
    loss and gradients float32-exact only."""

    def __call__(self, model_output: Any, labels: torch.Tensor, shift_labels: bool = False,
                 num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
        per_token, _, labelled = self.token_losses(model_output, labels, shift_labels)
        count = labelled.sum() if num_items_in_batch is None else num_items_in_batch
        return per_token.sum() / (count.to(per_token.device) if torch.is_tensor(count) else count)

    def token_losses(self, model_output: Any, labels: torch.Tensor,
                     shift_labels: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per target position: the loss, its -log p_label (both 0 where unlabelled), and whether it is labelled."""
        logits = model_output["logits"] if isinstance(model_output, dict) else model_output[0]
        if shift_labels:
            logits, labels = logits[..., :-1, :], labels[..., 1:]
        log_probs = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        labels = labels.to(log_probs.device)
        labelled = labels != self.ignore_index
        nll = -log_probs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        smoothed = -log_probs.mean(dim=-1)
        per_token = torch.where(labelled, (1 - self.epsilon) * nll + self.epsilon * smoothed, 0.0)
        return per_token, torch.where(labelled, nll, 0.0), labelled


class EvaluationLoss(PromotedLabelSmoother):
    """The loss of an evaluation batch, the training objective (label-smoothed as the run trains, plain NLL without
    smoothing), which also keeps each sentence's summed loss and summed -log p_label beside its number of labelled
    tokens (`sentences`, of its last call), from which `TranslationTrainer` takes the evaluation set's token mean."""

    sentences: tuple[torch.Tensor, torch.Tensor] | None = None

    def token_losses(self, model_output: Any, labels: torch.Tensor,
                     shift_labels: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        per_token, nll, labelled = super().token_losses(model_output, labels, shift_labels)
        self.sentences = (torch.stack([per_token.sum(-1), nll.sum(-1)], dim=-1).detach(), labelled.sum(-1))
        return per_token, nll, labelled


class SamplerEpochCallback(TrainerCallback):
    """Tell the token-budget sampler the epoch, also in an epoch resumed mid-way (where accelerate's batch-skipping
    wrapper hides the sampler from the Trainer's own `set_epoch` call)."""

    def __init__(self, sampler: TokenBudgetBatchSampler) -> None:
        self.sampler = sampler

    def on_epoch_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.sampler.set_epoch(math.floor(state.epoch or 0.0))


def batch_order_settings(args: TranslationTrainingArguments) -> dict[str, int | str | bool | None]:
    """The settings that decide which pairs each training step of a run takes: a resumed run follows the batch order
    of the run that saved its checkpoint only where all of them are unchanged (`BatchOrderRecord` records them,
    `resolve_resume_checkpoint` compares). Always gradient_accumulation_steps and the world size (the batches an
    optimizer step takes, and where in its epoch a resumed run goes on: the Trainer skips (global_step mod steps per
    epoch) x gradient_accumulation_steps batches of each process) and max_tokens_per_batch; with a token budget the
    sampler's seed, data_seed(args), and length_pool_factor; with batches of pairs per_device_train_batch_size,
    dataloader_drop_last (the batches of an epoch) and train_sampling_strategy, whose random order accelerate's
    seedable sampler draws from data_seed(args) and whose group_by_length order the Trainer draws from the global
    generator, seeded with `seed`."""
    settings: dict[str, int | str | bool | None] = {
        "max_tokens_per_batch": args.max_tokens_per_batch,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "world_size": args.world_size,
    }
    if args.max_tokens_per_batch is not None:
        return settings | {"data_seed": data_seed(args), "length_pool_factor": args.length_pool_factor}
    settings |= {"per_device_train_batch_size": args.per_device_train_batch_size,
                 "dataloader_drop_last": args.dataloader_drop_last,
                 "train_sampling_strategy": args.train_sampling_strategy}
    if args.train_sampling_strategy == "random":
        settings["data_seed"] = data_seed(args)
    elif args.train_sampling_strategy == "group_by_length":
        settings["seed"] = args.seed
    return settings


# how a warning names the settings of `batch_order_settings` that are no TrainingArguments field of that name
_SETTING_NAMES = {"data_seed": "data_seed (data_seed if set, else seed)", "world_size": "world_size (the number of "
                  "processes)"}


class BatchOrderRecord(TrainerCallback, ExportableState):
    """Keeps the run's `batch_order_settings` in its trainer state ("stateful_callbacks"), so in each checkpoint's
    trainer_state.json, for a resumed run to compare. Set when training begins, from the run's own arguments: also
    over a record that `restore_callback_states_from_checkpoint` restored from the checkpoint, and where the
    checkpoint's state has none (saving expects an entry for each stateful callback)."""

    def __init__(self, batch_order: dict[str, int | str | bool | None] | None = None) -> None:
        self.batch_order = batch_order

    def state(self) -> dict[str, Any]:
        return {"args": {"batch_order": self.batch_order}, "attributes": {}}

    def on_train_begin(self, args: TranslationTrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        self.batch_order = batch_order_settings(args)
        state.stateful_callbacks[type(self).__name__] = self.state()


class EarlyStopping(EarlyStoppingCallback):
    """`early_stopping_patience`: transformers' EarlyStoppingCallback over the evaluations made during training (not
    those after it: the final model's), which also says when and why it stops. Its start-of-training checks are
    `check_early_stopping`'s, made when the arguments are read; the final weights are chosen as the arguments say
    (last, averaged or best), so its warning about load_best_model_at_end is not given."""

    training = False

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        """On a resumed run, the evaluations without improvement so far still count (the checkpoint's state of this
        callback; a checkpoint saved without early stopping has none, and gets one, which saving expects)."""
        self.training = True
        name = type(self).__name__
        saved = state.stateful_callbacks.get(name)
        if isinstance(saved, dict):
            self.early_stopping_patience_counter = saved["attributes"]["early_stopping_patience_counter"]
        state.stateful_callbacks[name] = self.state()

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        """The run's final state (output_dir/trainer_state.json) keeps the count at its end, also where no checkpoint
        was saved at the stopping step."""
        self.training = False
        state.stateful_callbacks[type(self).__name__] = self.state()

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    metrics: dict[str, float], **kwargs: Any) -> None:
        if not self.training:
            return
        super().on_evaluate(args, state, control, metrics, **kwargs)
        if self.early_stopping_patience_counter >= self.early_stopping_patience:
            metric = args.metric_for_best_model.removeprefix("eval_")
            logger.info("early_stopping_patience=%d: eval_%s has not improved on its best, %g, by more than %g in %d "
                        "evaluations: training stops at step %d", self.early_stopping_patience, metric,
                        state.best_metric, self.early_stopping_threshold, self.early_stopping_patience_counter,
                        state.global_step)


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


def _leave_to_the_step_end(*args: Any, **kwargs: Any) -> None:
    """A JIT checkpoint requested before the optimizer step waits for the step's end (`_note_signal_checkpoints`)."""


def _random_state() -> dict[str, Any]:
    """This process's random state: Python's, numpy's and torch's CPU and CUDA generators (those of
    `Trainer._save_rng_state`, which also saves an XLA, NPU, HPU or MLU generator's, left out here)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.random.get_rng_state_all()
    return state


def _set_random_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.random.set_rng_state(state["cpu"])
    if "cuda" in state:
        torch.cuda.random.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def _random_state_set_to(state: dict[str, Any] | None) -> Iterator[None]:
    """Within the block, this process's random state is `state` (`_random_state`; None: left as it is); after it,
    the state it had before."""
    if state is None:
        yield
        return
    current = _random_state()
    _set_random_state(state)
    try:
        yield
    finally:
        _set_random_state(current)


def _random_state_kept() -> contextlib.AbstractContextManager[None]:
    """Within the block, this process's random state (`_random_state`) is drawn from as usual; after it, it is the
    one it had before."""
    return _random_state_set_to(_random_state())


class _StoppedBetweenSteps(Exception):
    """A SIGTERM checkpoint requested between two training steps, noticed before the next one begins: raised out of
    the Trainer's loop, which has no way to stop before a step; `TranslationTrainer.train` checkpoints and stops."""


class _StopAgreement:
    """Whether any process of a multi-process run has a SIGTERM checkpoint requested, agreed by all of them: each
    process's handler and timer are its own (a scheduler's SIGTERMs reach the ranks at different instants, or one rank
    alone), so without it a process may enter the checkpoint's collectives while another runs the next step's or
    evaluation batch's, and both wait there until ddp_timeout or the scheduler's SIGKILL. One all-reduce (MAX) of a
    flag at each check, on a CPU (gloo) group: no GPU work to wait for, no host-device copy."""

    def __init__(self, group: Any) -> None:
        self.group = group   # None: the default group (gloo already)

    @classmethod
    def among_the_processes(cls) -> _StopAgreement | None:
        """The agreement among this run's processes, its gloo group created here (every process must call this, in
        the same order as its other group creations); None for a single process."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()
                and torch.distributed.get_world_size() > 1):
            return None
        if torch.distributed.get_backend() == "gloo":
            return cls(None)
        return cls(torch.distributed.new_group(backend="gloo"))

    def any(self, requested: bool) -> bool:
        """Whether `requested` holds for any process; every process must call this at the same point."""
        flag = torch.tensor([int(requested)], dtype=torch.int32)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self.group)
        return bool(flag.item())


class TranslationTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` with token-budget training batches, "source length + offset" generation per batch, and
    sacreBLEU/chrF against the raw references, with hypotheses kept in source order."""

    def __init__(self, *args: Any, evaluation_sets: dict[str, EvaluationSet], target_lang: str = "",
                 **kwargs: Any) -> None:
        """`target_lang`: the language of the references, which picks BLEU's tokenization unless `bleu_tokenize`
        names one ("": sacreBLEU's default, 13a). The model's `config.use_cache` is kept: transformers' Trainer sets
        it to the training argument `use_cache` (default False), which every saved model and checkpoint then had,
        so that a forward call of a loaded model returned no cache; a training forward (with labels) builds none
        whatever it says."""
        model = kwargs["model"] if "model" in kwargs else args[0]
        config_use_cache = model.config.use_cache
        super().__init__(*args, **kwargs)
        model.config.use_cache = config_use_cache
        if self.label_smoother is not None:
            self.label_smoother = PromotedLabelSmoother(epsilon=self.args.label_smoothing_factor)
        self.evaluation_loss = EvaluationLoss(epsilon=self.args.label_smoothing_factor)
        self._sentence_losses: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # during an evaluation loop
        self.evaluation_sets = evaluation_sets
        self.target_lang = target_lang
        # scores of generated translations; without generation an evaluation computes the loss alone
        self.compute_metrics = self._compute_translation_metrics if self.args.predict_with_generate else None
        self._active_prefix = "eval"
        self.pairs_trained = 0   # by this process in the current train() call: `log` reports their rate
        self.token_budget_sampler = None
        self.add_callback(BatchOrderRecord())
        if self.args.max_tokens_per_batch is not None and self.train_dataset is not None:
            self.token_budget_sampler = token_budget_sampler(example_lengths(self.train_dataset), self.args,
                                                             self.model, self.accelerator.num_processes)
            self.add_callback(SamplerEpochCallback(self.token_budget_sampler))
        if self.args.fade_absolute_positions is not None:
            self.add_callback(AbsolutePositionFadeCallback(self.args.fade_absolute_positions))
        if self.args.early_stopping_patience is not None:
            self.add_callback(EarlyStopping(self.args.early_stopping_patience, self.args.early_stopping_threshold))
        self.stopped_by_signal = False
        self._steps_per_epoch: int | None = None   # optimizer steps an epoch takes, once train() has counted them
        self._limit_set_aside: tuple[int | None] | None = None   # the run's save_total_limit while the Trainer's
        # _save_checkpoint runs without it (`_save_checkpoint`)
        self._checkpointed_step: int | None = None   # the step of the last checkpoint this train() call saved or
        # resumed from (in output_dir)
        self._jit_checkpoint: JITCheckpointCallback | None = None
        self._epoch_start: tuple[int, dict[str, Any]] | None = None   # the step and random state of the epoch's
        # start, for a SIGTERM checkpoint before its first step (`_checkpoint_the_stop`)
        self._evaluation_start: dict[str, Any] | None = None   # the random state where the evaluation in training
        # under way began (None: none under way), for a SIGTERM checkpoint that stops it (`_checkpoint_the_stop`)
        self._resumed_from: str | None = None   # the checkpoint this train() call resumed from, until its first
        # epoch has settled what the checkpoint owes (`_run_epoch`)
        self._eval_on_start = self.args.eval_on_start   # the run's own, which a resumed train() sets aside
        self._random_state_after_the_owed_evaluation: dict[str, Any] | None = None   # for `_load_rng_state`
        self._stop_agreement: _StopAgreement | None = None   # several processes: they agree on a SIGTERM's stop
        self._note_signal_checkpoints()

    def _note_signal_checkpoints(self) -> None:
        """`enable_jit_checkpoint`: remember when the Trainer's SIGTERM handler has saved a checkpoint and stopped
        training, which `train` then reports as `TrainingStoppedError` (when it stopped before the last step) instead of
        returning as if training had finished. A SIGTERM noticed within a step (before its optimizer step, or at its
        end) is checkpointed as the step's regular checkpoint is, once the step has been taken and logged, so that
        the resumed run goes on as the uninterrupted one: transformers saved one before the optimizer step, with the
        random state past the step's dropout masks (the resumed run redid the step with other masks), or at the
        step's end, before its log entry (which the resumed run then lacked). A step with an evaluation due is
        checkpointed without it (an evaluation, generating translations, may outlast the time a scheduler leaves
        after its SIGTERM), and so is the epoch end the Trainer then runs (where eval_strategy or save_strategy epoch
        would evaluate and save the step again); the resumed run makes that evaluation before its first step
        (`_run_epoch`), as the uninterrupted run did. A SIGTERM noticed between two steps (after an evaluation, a
        checkpoint save or the epoch end) stops before the next step begins (`_StoppedBetweenSteps`): transformers
        saved the previous step's checkpoint again, whole, and trained one more step, thrown away. One noticed during
        an evaluation in training, before the last step, stops it at its next batch (`prediction_step`), for the same
        reason as above, and checkpoints the step with the random state the evaluation began with.
        Under several processes each notices the request by itself (its own handler and timer, its own SIGTERM, when
        it gets one): at each of these checks they agree on it (`_checkpoint_requested`), so that all of them stop at
        the same step or batch and enter the checkpoint's collectives together."""
        jit = next((callback for callback in self.callback_handler.callbacks
                    if isinstance(callback, JITCheckpointCallback) and callback.jit_manager is not None), None)
        if jit is None:
            return
        self._jit_checkpoint = jit
        self._stop_agreement = _StopAgreement.among_the_processes()
        manager = jit.jit_manager
        save_checkpoint = manager.execute_jit_checkpoint

        def save_checkpoint_and_stop() -> None:
            save_checkpoint()
            self.stopped_by_signal = True

        def save_after_the_step_and_stop(args: TrainingArguments, state: TrainerState, control: TrainerControl,
                                         **kwargs: Any) -> None:
            if not self._checkpoint_requested():
                return
            manager.is_checkpoint_requested = False
            # saved as a regular checkpoint, after the step's log entry; not evaluated first, since an evaluation may
            # outlast the scheduler's wait after SIGTERM (so under save_strategy best it saves too)
            control.should_training_stop = control.should_save = True
            control.should_evaluate = False
            self.stopped_by_signal = True

        def nothing_more_at_the_epoch_end(args: TrainingArguments, state: TrainerState, control: TrainerControl,
                                          **kwargs: Any) -> None:
            if self.stopped_early_by_signal():   # broken off mid-epoch: no epoch-end evaluation, no second save
                control.should_evaluate = control.should_save = False
            else:
                save_after_the_step_and_stop(args, state, control)

        def stop_before_the_step(args: TrainingArguments, state: TrainerState, control: TrainerControl,
                                 **kwargs: Any) -> None:
            if self._checkpoint_requested():
                raise _StoppedBetweenSteps

        def note_the_epoch_start(args: TrainingArguments, state: TrainerState, control: TrainerControl,
                                 **kwargs: Any) -> None:
            self._epoch_start = (state.global_step, _random_state())

        manager.execute_jit_checkpoint = save_checkpoint_and_stop
        jit.on_step_begin = stop_before_the_step
        jit.on_pre_optimizer_step = _leave_to_the_step_end
        jit.on_step_end = save_after_the_step_and_stop
        jit.on_epoch_end = nothing_more_at_the_epoch_end
        jit.on_epoch_begin = note_the_epoch_start

    def _checkpoint_requested(self) -> bool:
        """Whether a SIGTERM checkpoint (`_note_signal_checkpoints`) is requested: by this process's handler, or under
        several processes by any process's (`_StopAgreement`; every process must make this call at the same point).
        Not again once the signal has stopped this train() call: a process whose own SIGTERM came later than
        another's would otherwise request a second stop (at the last step's epoch end, a second save)."""
        if self.stopped_by_signal:
            return False
        requested = self._jit_checkpoint.jit_manager.is_checkpoint_requested
        if self._stop_agreement is not None:
            requested = self._stop_agreement.any(requested)
        return requested

    def _stop_requested_before_the_last_step(self) -> bool:
        """Whether a SIGTERM checkpoint (`_note_signal_checkpoints`) is requested while training has steps to go."""
        return (self.is_in_train and self._jit_checkpoint is not None
                and self.state.global_step < self.state.max_steps and self._checkpoint_requested())

    def stopped_early_by_signal(self) -> bool:
        """Whether a SIGTERM checkpoint (`_note_signal_checkpoints`) stopped training before its last step."""
        return self.stopped_by_signal and self.state.global_step < self.state.max_steps

    def set_initial_training_values(self, args: TrainingArguments, dataloader: DataLoader) -> tuple:
        """The Trainer's counts of the run; keeps its optimizer steps per epoch, where `save_strategy` epoch saves
        (`saves_on_schedule`)."""
        values = super().set_initial_training_values(args, dataloader)
        self._steps_per_epoch = values[1]
        return values

    def saves_on_schedule(self, step: int) -> bool:
        """Whether `step` is one at which `save_strategy` saves a checkpoint in a run that no SIGTERM stops: with
        steps, the multiples of save_steps and max_steps (the Trainer's save at the end); with epoch, the epoch ends
        and max_steps; with either, the step at which this run ended its training, unless a SIGTERM stopped it (the
        Trainer saves there too: the epoch end it runs after an early stop). A SIGTERM checkpoint
        (`_note_signal_checkpoints`) at another step is off the schedule: `average_final_weights` does not average
        it and `_rotate_checkpoints` gives it no slot of save_total_limit. Step 0 is off it (the Trainer saves after
        a step, never before the first: checkpoint-0 is a SIGTERM's, of the initial weights), though a multiple of
        every period. Other strategies (no, best): False."""
        if self.args.save_strategy not in (SaveStrategy.STEPS, SaveStrategy.EPOCH):
            return False
        if step == self.state.max_steps or (step == self.state.global_step and not self.stopped_by_signal):
            return True
        return self._on_the_save_period(step)

    def _on_the_save_period(self, step: int) -> bool:
        """Whether save_strategy steps or epoch saves at `step` by its period alone (a multiple of save_steps, an
        epoch's end; never step 0): DefaultFlowCallback's rule, the run's end left out."""
        strategy = self.args.save_strategy
        if strategy not in (SaveStrategy.STEPS, SaveStrategy.EPOCH):
            return False
        period = self.state.save_steps if strategy == SaveStrategy.STEPS else self._steps_per_epoch
        return bool(period) and step > 0 and step % period == 0

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None) -> Any:
        """The Trainer's schedule, with a warning when its warm-up does not end before the run does (a short run on a
        small corpus with a recipe's warm-up): the learning rate then never reaches `learning_rate`. Given by the
        processes that log (one per machine), not by every rank of a launch."""
        warmup_steps = self.args.get_warmup_steps(num_training_steps)
        if self.lr_scheduler is None and 0 < num_training_steps <= warmup_steps and self.args.should_log:
            logger.warning(
                "warmup_steps %d is not below the run's %d training steps: the learning rate never reaches "
                "learning_rate %g. Lower --warmup_steps, or train longer (--max_steps, --num_train_epochs)",
                warmup_steps, num_training_steps, self.args.learning_rate)
        return super().create_scheduler(num_training_steps, optimizer)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """The Trainer's: a resumed run takes the checkpoint's optimizer and learning-rate schedule, with the
        learning_rate it was saved with (each parameter group's `initial_lr`, the base of the schedule), whatever the
        run's learning_rate says. Where they differ, one warning (from the processes that log) names both and how to
        train on at another learning rate; it changed nothing, silently."""
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None or not self.args.should_log:
            return
        saved = sorted({group["initial_lr"] for group in self.optimizer.param_groups if "initial_lr" in group})
        if saved and saved != [self.args.learning_rate]:
            logger.warning(
                "learning_rate is %g in this run, %s in the optimizer and learning-rate schedule of %s, which the "
                "resumed run trains on with: this run's learning_rate does not apply. To train on from its weights at "
                "another learning rate, start a new run with --model_name_or_path %s (a new optimizer and schedule)",
                self.args.learning_rate, ", ".join(f"{value:g}" for value in saved), checkpoint, checkpoint)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> TrainOutput:
        """`resume_from_checkpoint=True` resumes from the newest *complete* checkpoint of output_dir. Training that a
        SIGTERM stopped (`enable_jit_checkpoint`) before its last step raises `TrainingStoppedError` after its
        checkpoint is saved (`_checkpoint_the_stop` for one noticed between steps); one whose checkpoint came in the
        last step has finished and returns as usual."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = str(_last_complete_checkpoint(self.args.output_dir, "True"))
        self.pairs_trained = 0
        self.stopped_by_signal, self._epoch_start, self._evaluation_start = False, None, None
        self._checkpointed_step = _own_checkpoint_step(resume_from_checkpoint, self.args.output_dir)
        self._resumed_from = resume_from_checkpoint or None
        self._random_state_after_the_owed_evaluation = None
        # resumed, the Trainer's eval_on_start would evaluate at the checkpoint's step, which the run evaluated only
        # if it was owed there (`_run_epoch`); at step 0 that is eval_on_start's evaluation
        self.args.eval_on_start = self._eval_on_start and not self._resumed_from
        try:
            result = super().train(resume_from_checkpoint, *args, **kwargs)
        except _StoppedBetweenSteps:
            self._checkpoint_the_stop()
        finally:
            self.args.eval_on_start = self._eval_on_start
        if self.stopped_early_by_signal():
            raise TrainingStoppedError(self.state.global_step, last_complete_checkpoint(self.args.output_dir))
        return result

    def _checkpoint_the_stop(self) -> None:
        """After `_StoppedBetweenSteps`: the step's checkpoint (before an epoch's first step, with the random state
        of the epoch's start; in an evaluation, with the random state it began with, from which the resumed run
        makes it: `_run_epoch`), unless this train() call has saved it already (a SIGTERM during its regular save) or
        resumed from it (a SIGTERM before its first step: rewriting the newest complete checkpoint would leave it
        incomplete until written whole), then every callback's end of training, as
        the Trainer's own end runs it after a stop within a step (the SIGTERM handler of before training back,
        TensorBoard's writer closed, the progress bar ended)."""
        self._jit_checkpoint.jit_manager.is_checkpoint_requested = False
        self.stopped_by_signal, self.is_in_train = True, False
        if self._checkpointed_step != self.state.global_step:
            # before the epoch's first step, the random state of its start, which a run resumed at an epoch start
            # restores before the Trainer opens the epoch's batches, as an uninterrupted run had it there
            epoch_start = (self._epoch_start[1] if self._epoch_start is not None
                           and self._epoch_start[0] == self.state.global_step else None)
            # stopped in an evaluation, the random state where it began: the resumed run makes it from there
            with _random_state_set_to(self._evaluation_start or epoch_start):
                self._save_checkpoint(self.model, trial=None)
        self.control = self.callback_handler.on_train_end(self.args, self.state, self.control)

    def _run_epoch(self, *, trial: Any, ignore_keys_for_eval: list[str] | None, num_update_steps_per_epoch: int,
                   **kwargs: Any) -> None:
        """The Trainer's epoch; in a resumed train() call, first the evaluation its checkpoint owes
        (`_evaluation_owed`), as the uninterrupted run made it after the checkpoint's step and before the next
        (`_make_the_owed_evaluation`). Where early stopping ends training there, the epoch trains no step: the
        uninterrupted run stopped after that evaluation. The run's eval_on_start, which `train` set aside from the
        Trainer's start of a resumed run, is back (for the training arguments the checkpoints save)."""
        self.args.eval_on_start = self._eval_on_start
        checkpoint, self._resumed_from = self._resumed_from, None
        if checkpoint is not None and self._evaluation_owed(num_update_steps_per_epoch):
            self._make_the_owed_evaluation(checkpoint, trial, ignore_keys_for_eval)
            if self.control.should_training_stop:
                return
        super()._run_epoch(trial=trial, ignore_keys_for_eval=ignore_keys_for_eval,
                           num_update_steps_per_epoch=num_update_steps_per_epoch, **kwargs)

    def _evaluation_owed(self, steps_per_epoch: int) -> bool:
        """Whether the checkpoint a train() call resumed from, at step S before the last, owes an evaluation: one
        was due at S (eval_on_start at step 0; eval_strategy steps at a multiple of eval_steps, epoch at an epoch's
        end, from eval_delay on: DefaultFlowCallback's rules) and its log has none at S (a SIGTERM checkpoint
        (`_note_signal_checkpoints`) leaves it out, or stops it)."""
        step, args = self.state.global_step, self.args
        if step >= self.state.max_steps or any(
                entry.get("step") == step and any(name.startswith("eval_") for name in entry)
                for entry in self.state.log_history):
            return False
        if step == 0:
            return self._eval_on_start
        if args.eval_strategy == IntervalStrategy.STEPS:
            return bool(self.state.eval_steps) and step % self.state.eval_steps == 0 and args.eval_delay <= step
        if args.eval_strategy == IntervalStrategy.EPOCH:
            return step % steps_per_epoch == 0 and args.eval_delay <= (self.state.epoch or 0.0)
        return False

    def _make_the_owed_evaluation(self, checkpoint: str, trial: Any, ignore_keys_for_eval: list[str] | None) -> None:
        """The evaluation `checkpoint` owes (`_evaluation_owed`), made as the uninterrupted run made it: from the
        checkpoint's random state (where that run began it), through the Trainer's `_evaluate` (log entry, callbacks'
        on_evaluate: early stopping counts it; ReduceLROnPlateau steps) and, past step 0, `_determine_best_metric`
        (eval_on_start's evaluation, at step 0, takes neither the scheduler step nor the best metric). Where that
        run then saved the step's checkpoint (the save period, or save_strategy best on a new best) and the
        evaluation is the best, the checkpoint resumed from (output_dir's own) becomes `best_model_checkpoint`, as
        that save made it. The random state it leaves is the one the Trainer's `_load_rng_state` then restores
        (the uninterrupted run's after the evaluation); until then, the one of before."""
        step = self.state.global_step
        logger.info("resume_from_checkpoint: %s has no log of the evaluation due at step %d (a SIGTERM checkpoint "
                    "left it out or stopped it): evaluating before step %d, as an uninterrupted run does", checkpoint,
                    step, step + 1)
        before = _random_state()
        super()._load_rng_state(checkpoint)
        try:
            if step == 0:
                self._evaluate(trial, ignore_keys_for_eval, skip_scheduler=True)
            else:
                new_best = self._determine_best_metric(self._evaluate(trial, ignore_keys_for_eval), trial)
                saved = new_best if self.args.save_strategy == SaveStrategy.BEST else self._on_the_save_period(step)
                if saved and self.state.best_global_step == step and self._checkpointed_step == step:
                    self.state.best_model_checkpoint = os.path.join(self._get_output_dir(trial),
                                                                    f"{PREFIX_CHECKPOINT_DIR}-{step}")
            self._random_state_after_the_owed_evaluation = _random_state()
        finally:
            _set_random_state(before)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        """The checkpoint's random state, or, where it owed an evaluation (`_make_the_owed_evaluation`), the state
        that evaluation left (Python's, numpy's, torch's CPU and CUDA generators: `_random_state`)."""
        super()._load_rng_state(checkpoint)
        if self._random_state_after_the_owed_evaluation is not None:
            _set_random_state(self._random_state_after_the_owed_evaluation)
            self._random_state_after_the_owed_evaluation = None

    def training_step(
        self, model: torch.nn.Module, inputs: dict[str, Any], num_items_in_batch: torch.Tensor | int | None = None
    ) -> torch.Tensor:
        """Stop with `NonFiniteLossError` (naming the step) on a NaN/inf loss, before the optimizer applies it. The
        Trainer's `logging_nan_inf_filter` would otherwise leave it out of the logged loss without a word."""
        loss = super().training_step(model, inputs, num_items_in_batch)
        if not torch.isfinite(loss).all():
            raise NonFiniteLossError(float(loss.detach().float().mean()), self.state.global_step + 1,
                                     self.state.epoch or 0.0)
        self.pairs_trained += len(inputs["input_ids"])
        return loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """The training's final metrics get `train_samples_per_second` = the pairs trained on in this train() call,
        summed over the processes, per second of `train_runtime`: the Trainer's own figure assumes
        per_device_train_batch_size pairs a step, which token-budget batches do not hold. Set in `logs` itself (as
        the Trainer sets `epoch`), so the metrics train() returns carry it too."""
        if "train_samples_per_second" in logs:
            pairs = self.accelerator.gather(torch.tensor(self.pairs_trained, device=self.args.device)).sum().item()
            logs["train_samples_per_second"] = round(pairs / logs["train_runtime"], 3)
        super().log(logs, start_time)

    def _save_checkpoint(self, model: torch.nn.Module, trial: Any) -> None:
        """A rewritten checkpoint folder (a resumed run reaching the step of an older attempt) loses its state file
        first, so that it does not count as complete until the Trainer writes the new one, last. Under save_strategy
        steps or epoch the older checkpoints are rotated by `_rotate_checkpoints`, not by the Trainer, and a
        checkpoint off the save schedule (`saves_on_schedule`: a SIGTERM's) never becomes `best_model_checkpoint`,
        which the Trainer made it, at its save or a later one, when its step's evaluation was the best (it then took
        that checkpoint for its final model under load_best_model_at_end, and kept it): the Trainer saves the
        checkpoint's trainer state without best_global_step, and that state is then replaced with one that has it
        (a kill in between leaves it without, which changes no later choice of the best: the Trainer looks for that
        step's checkpoint, which an uninterrupted run does not save)."""
        run_dir = self._get_output_dir(trial)
        if self.args.should_save:
            folder = Path(run_dir) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            (folder / TRAINER_STATE_FILE).unlink(missing_ok=True)
        limit, best_step = self.args.save_total_limit, self.state.best_global_step
        on_schedule = self.args.save_strategy in (SaveStrategy.STEPS, SaveStrategy.EPOCH)
        # The best evaluation's step is off the save schedule: where a checkpoint of it exists (a SIGTERM's, this one
        # or an earlier one) the Trainer would make it best_model_checkpoint, which an uninterrupted run, without it,
        # never has. Decided from the step alone, the same in every process (whether the folder exists is not: on
        # machines without a shared output_dir, processes would disagree on the Trainer's barrier before its check)
        unmade_best = on_schedule and best_step is not None and not self.saves_on_schedule(best_step)
        if on_schedule:
            self.args.save_total_limit = None   # the Trainer's rotation (every checkpoint-* folder) left out
            self._limit_set_aside = (limit,)   # `_save` records the run's own in training_args.bin
        if unmade_best:
            self.state.best_global_step = None
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit, self.state.best_global_step = limit, best_step
            self._limit_set_aside = None
        if unmade_best and self.args.should_save:   # its trainer state as an uninterrupted run's, best_global_step kept
            folder = Path(run_dir) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            with atomic_file(folder / TRAINER_STATE_FILE) as temporary:
                self.state.save_to_json(str(temporary))
        self._checkpointed_step = self.state.global_step
        if on_schedule and self.args.should_save and limit is not None and limit > 0:
            self._rotate_checkpoints(run_dir, limit)

    def _rotate_checkpoints(self, run_dir: str, limit: int) -> None:
        """save_total_limit over the checkpoints on the save schedule (`saves_on_schedule`) alone, so that a SIGTERM
        checkpoint at another step takes no slot of it (it took one, and a checkpoint of the last save_total_limit
        that `average_checkpoints` averages was deleted in its place). The Trainer's rule otherwise: oldest first
        (by modification time, by step where the file system's times do not tell them apart), the newest checkpoint
        (the one a resume takes) and the best (`best_model_checkpoint`) never deleted, the best taking a slot. A
        `checkpoint-<step>` off the schedule is deleted, oldest first, once a later one on it is complete (a resume then
        takes that one) and while the folder holds more than `limit` of them, unless it is the newest or the best; a
        folder of another name (`checkpoint-2-backup`) is never deleted here."""
        ordered = [Path(path) for path in sort_checkpoints(run_dir, use_mtime=True)]
        if not ordered:
            return
        best = self.state.best_model_checkpoint
        protected = {ordered[-1]} | ({Path(best)} if best is not None else set())
        regular = [path for path in ordered if (match := CHECKPOINT_PATTERN.match(path.name))
                   and self.saves_on_schedule(int(match.group(1)))]
        keep = max(limit, len(protected & set(regular)))
        remaining = len(regular)
        for path in regular:
            if remaining <= keep:
                break
            if path not in protected:
                logger.info("save_total_limit=%d: deleting the older checkpoint %s", limit, path)
                shutil.rmtree(path, ignore_errors=True)
                remaining -= 1
        newest_regular = next((path for path in reversed(regular) if path.is_dir() and is_complete_checkpoint(path)),
                              None)
        if newest_regular is None:
            return
        held = sum(1 for path in ordered if CHECKPOINT_PATTERN.match(path.name) and path.is_dir())
        for path in ordered[:ordered.index(newest_regular)]:
            if held <= limit:
                break
            if path not in regular and path not in protected and CHECKPOINT_PATTERN.match(path.name):
                logger.info("save_total_limit=%d: deleting %s, off the save schedule (a SIGTERM's), now that %s "
                            "is saved", limit, path, newest_regular.name)
                shutil.rmtree(path, ignore_errors=True)
                held -= 1

    def _save_rng_state(self, output_dir: str) -> None:
        """Every process saves its random state (`rng_state_RANK.pth`), then waits for the others: the main process
        writes `trainer_state.json`, which marks the checkpoint complete, only after all of them exist (a kill in
        between would leave a "complete" checkpoint that resumes without some process's random state)."""
        super()._save_rng_state(output_dir)
        self.accelerator.wait_for_everyone()

    def save_metrics(self, split: str, metrics: dict[str, Any], combined: bool = True) -> None:
        """The Trainer's `save_metrics` (`{split}_results.json`, merged into all_results.json when `combined`), each
        file replaced atomically (`write_text_atomic`): a process killed while writing leaves the previous file,
        never one cut short that the card (`load_results`) or the next run's merge would fail to read. all_results.json
        takes the metrics alone: `RESUMED_FROM_KEY`, which train_results.json names for `finished_training`, stays out.
        """
        if not self.is_world_process_zero():
            return
        output_dir = Path(self.args.output_dir)
        write_text_atomic(output_dir / RESULTS_FILE.format(prefix=split), json.dumps(metrics, indent=4, sort_keys=True))
        if combined:
            path = output_dir / ALL_RESULTS_FILE
            merged = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
            metrics = {name: value for name, value in metrics.items() if name != RESUMED_FROM_KEY}
            write_text_atomic(path, json.dumps({**merged, **metrics}, indent=4, sort_keys=True))

    def save_state(self) -> None:
        """The Trainer's `save_state` (output_dir/trainer_state.json, which a resumed run reads for early stopping),
        replaced atomically (`atomic_file`): whole or the previous one after a kill."""
        if self.is_world_process_zero():
            with atomic_file(Path(self.args.output_dir) / TRAINER_STATE_FILE) as temporary:
                self.state.save_to_json(str(temporary))

    def _save(self, output_dir: str | None = None, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """The Trainer's save (final model and every checkpoint), with the weights given the modes the umask allows
        (`apply_umask_mode_to_weights`: safetensors writes them owner-only). In a checkpoint's save the training
        arguments it writes (training_args.bin) hold the run's save_total_limit, which `_save_checkpoint` sets aside
        from the Trainer's rotation (they held None)."""
        if self._limit_set_aside is None:
            super()._save(output_dir, state_dict)
        else:
            self.args.save_total_limit = self._limit_set_aside[0]
            try:
                super()._save(output_dir, state_dict)
            finally:
                self.args.save_total_limit = None
        if self.args.should_save:
            apply_umask_mode_to_weights(output_dir if output_dir is not None else self.args.output_dir)

    def end_loader_workers(self) -> None:
        """Stops the worker processes that the loaders this trainer built keep between epochs and evaluations
        (`dataloader_persistent_workers`): the training loader (accelerate's list of prepared loaders) and the
        evaluation loaders the Trainer reuses. Left to the garbage collector (a trainer lives in reference cycles),
        each multiprocessing queue's finalizer stops its feeder thread before the iterator's `__del__` sends its
        workers the stop through it, so each worker waits out torch's join timeout (`MP_STATUS_CHECK_INTERVAL`)
        and is terminated. A loader iterated again starts new workers."""
        loaders = [*self.accelerator._dataloaders, *getattr(self, "_eval_dataloaders", {}).values()]
        for loader in {id(loader): loader for loader in loaders}.values():
            base = getattr(loader, "base_dataloader", loader)   # accelerate's loaders iterate the one they wrap
            iterator, base._iterator = base._iterator, None
            if isinstance(iterator, _MultiProcessingDataLoaderIter):
                iterator._shutdown_workers()

    def get_train_dataloader(self) -> DataLoader:
        """With `max_tokens_per_batch`, a DataLoader over the global token-budget batch list, with the Trainer's own
        loader settings (workers, pinning, persistence, prefetching, start method); accelerate deals the batches
        round-robin to the processes (the sampler itself never shards); its batches are logged once: the Trainer's
        own batch sizes (its log's 'Instantaneous batch size per device' and 'Total train batch size',
        trainer_state.json's train_batch_size) are per_device_train_batch_size, which these batches do not use.
        Without it, the Trainer's loader of batches of pairs. Either draws its workers' seeds from its own generator
        (`worker_seed_generator`)."""
        if self.token_budget_sampler is None:
            loader = super().get_train_dataloader()
            # accelerate's prepared loader iterates the DataLoader it wraps, which is where the generator is read
            getattr(loader, "base_dataloader", loader).generator = worker_seed_generator(self.args)
            return loader
        sampler = self.token_budget_sampler
        logger.info("max_tokens_per_batch=%d: %s batches an epoch, %.1f training pairs each on average; the Trainer's "
                    "batch sizes (its log's 'Instantaneous batch size per device', trainer_state.json's "
                    "train_batch_size) show per_device_train_batch_size=%d, which these batches do not use",
                    sampler.max_tokens, f"{len(sampler):,}", len(sampler.source_lengths) / len(sampler),
                    self.args.per_device_train_batch_size)
        dataset = self._remove_unused_columns(self.train_dataset, description="training")
        loader = DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
            persistent_workers=self.args.dataloader_persistent_workers,
            prefetch_factor=self.args.dataloader_prefetch_factor,
            multiprocessing_context=self.args.dataloader_multiprocessing_context,
            in_order=self.args.dataloader_in_order,
            worker_init_fn=partial(seed_worker, num_workers=self.args.dataloader_num_workers,
                                   rank=self.args.process_index),
            generator=worker_seed_generator(self.args),
        )
        return self.accelerator.prepare(loader)

    def _get_eval_sampler(self, eval_dataset: Dataset) -> torch.utils.data.Sampler | None:
        """Always in dataset order (never length-grouped at random), so predictions can be put back in source order."""
        return SequentialSampler(eval_dataset) if self.args.world_size <= 1 else None

    def get_eval_dataloader(self, eval_dataset: str | Dataset | None = None) -> DataLoader:
        """The Trainer's evaluation loader, keeping its last batch whatever `dataloader_drop_last` says
        (`_every_batch`)."""
        with self._every_batch():
            return super().get_eval_dataloader(eval_dataset)

    def get_test_dataloader(self, test_dataset: Dataset) -> DataLoader:
        """The Trainer's prediction loader, keeping its last batch whatever `dataloader_drop_last` says
        (`_every_batch`)."""
        with self._every_batch():
            return super().get_test_dataloader(test_dataset)

    @contextlib.contextmanager
    def _every_batch(self) -> Iterator[None]:
        """`dataloader_drop_last` off while a loader is built: it drops the last incomplete batch of training pairs,
        but an evaluation or prediction translates and scores every sentence of its split (the Trainer would drop
        the last sentences from BLEU, or leave fewer translations than sources)."""
        drop_last = self.args.dataloader_drop_last
        self.args.dataloader_drop_last = False
        try:
            yield
        finally:
            self.args.dataloader_drop_last = drop_last

    def evaluate(
        self, eval_dataset: Dataset | None = None, ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval", **gen_kwargs: Any,
    ) -> dict[str, float]:
        """The Trainer's evaluation, leaving the random state as it found it (`_random_state`): opening its loader's
        iterator draws the workers' base seed from the global generator, once per evaluation without
        `dataloader_persistent_workers` and only at the first one with it (the Trainer keeps that loader), which in
        a resumed run is another evaluation than in the uninterrupted one, so training's dropout masks after it
        differed. One in training under `enable_jit_checkpoint` notes the random state it begins with, which a
        SIGTERM checkpoint that stops it saves (`_checkpoint_the_stop`)."""
        self._active_prefix = metric_key_prefix
        outermost = self.is_in_train and self._jit_checkpoint is not None and self._evaluation_start is None
        if outermost:
            self._evaluation_start = _random_state()
        with _random_state_kept():
            metrics = super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix,
                                       **gen_kwargs)
        if outermost:
            self._evaluation_start = None
        return metrics

    def predict(
        self, test_dataset: Dataset, ignore_keys: list[str] | None = None, metric_key_prefix: str = "test",
        **gen_kwargs: Any,
    ) -> PredictionOutput:
        self._active_prefix = metric_key_prefix
        return super().predict(test_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix, **gen_kwargs)

    def evaluation_loop(
        self, dataloader: DataLoader, description: str, prediction_loss_only: bool | None = None,
        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval",
    ) -> EvalLoopOutput:
        """`{prefix}_loss` (eval_loss, test_loss) is the mean loss per labelled target token over the whole set, each
        sentence counted once (under several processes too: the copies of the first sentences that pad the last
        step are left out, as they are from the predictions), and `{prefix}_nll_loss` the same mean of
        -log p_label (its exp is the perplexity). The Trainer's own figure is the mean of the batches' token means,
        weighted by their sentences, duplicates included. Sums in float64."""
        self._sentence_losses = []
        try:
            output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys,
                                             metric_key_prefix)
            sentences = self._sentence_losses
        finally:
            self._sentence_losses = None
        if f"{metric_key_prefix}_loss" in output.metrics and sentences:
            losses = torch.cat([loss.to("cpu", torch.promote_types(loss.dtype, torch.float64))
                                for loss, _ in sentences]).sum(0)
            tokens = int(sum(count.sum().item() for _, count in sentences))
            output.metrics[f"{metric_key_prefix}_loss"] = (losses[0] / tokens).item()
            output.metrics[f"{metric_key_prefix}_nll_loss"] = (losses[1] / tokens).item()
        return output

    def prediction_step(
        self, model: torch.nn.Module, inputs: dict[str, Any], prediction_loss_only: bool,
        ignore_keys: list[str] | None = None, **gen_kwargs: Any,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """Generation is capped per source by the model's generation config (max_len_a, max_len_b, and
        max_new_tokens as the ceiling: `build_model`), as generate() and the pipeline cap it after training.
        Seq2SeqTrainer fills generate's defaults (max_length 20, num_beam_groups 1, top_k 50, ...) into the model's
        generation config; it gets a copy to fill, so the config saved with the model and its checkpoints stays the
        one the run set (a max_length beside max_new_tokens would make every generate(max_new_tokens=...) warn that
        both are set, and the exporter would see settings nobody chose).
        The loss is `evaluation_loss`'s, whose per-sentence sums are gathered here (`gather_for_metrics`, which drops
        the padding copies of the last step) for `evaluation_loop`'s token mean. An evaluation in training stops at
        the batch where a SIGTERM checkpoint is requested before the last step (`_note_signal_checkpoints`)."""
        if self._stop_requested_before_the_last_step():
            raise _StoppedBetweenSteps
        if self.args.predict_with_generate and not prediction_loss_only:
            gen_kwargs = dict(gen_kwargs or getattr(self, "_gen_kwargs", {}))
            gen_kwargs.pop("max_length", None)  # generation_max_length, folded into the saved max_new_tokens
            gen_kwargs["num_return_sequences"] = 1   # one translation per source is scored, whatever the model saved
            if (gen_kwargs.get("num_beams") or self.model.generation_config.num_beams) > 1:
                gen_kwargs.setdefault("length_penalty", self.args.generation_length_penalty)
        generation, label_smoother = self.model.generation_config, self.label_smoother
        self.model.generation_config = copy.deepcopy(generation)
        self.label_smoother, self.evaluation_loss.sentences = self.evaluation_loss, None
        try:
            result = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys,
                                             **gen_kwargs)
        finally:
            self.model.generation_config, self.label_smoother = generation, label_smoother
        if self._sentence_losses is not None and self.evaluation_loss.sentences is not None:
            self._sentence_losses.append(self.accelerator.gather_for_metrics(self.evaluation_loss.sentences))
        return result

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
            scores = score_translations(hypotheses, evaluation_set.references, self.args.bleu_tokenize,
                                        self.target_lang)
        lengths = generated_lengths(generated, self.processing_class.eos_token_id, self.processing_class.pad_token_id)
        scores["gen_len"] = float(lengths.mean()) if len(lengths) else 0.0
        self._warn_of_capped_translations(generated, evaluation_set)
        return scores

    def _warn_of_capped_translations(self, generated: np.ndarray, evaluation_set: EvaluationSet) -> None:
        """One warning per evaluation counting the translations (of non-blank sources) that reached their length cap,
        as hf-relpos-translate and the pipeline count them (`reached_length_limit`: no end token, or the end token at
        the source-relative cap min(floor(max_len_a x source tokens + max_len_b), max_new_tokens)): a model that
        repeats itself up to the cap scores near 0 BLEU, and the split's scores alone do not say why."""
        config = self.model.generation_config
        eos_token_id = config.eos_token_id if config.eos_token_id is not None else self.processing_class.eos_token_id
        relative = relative_limit(config)
        limits: list[int | None] = [None] * len(generated)
        if relative is not None:
            sources, _ = example_lengths(evaluation_set.dataset)
            limits = new_token_limits(torch.as_tensor(sources[: len(generated)]), *relative,
                                      longest_new_output(config, prompt_length=1)).tolist()
        capped = sum(reached_length_limit(row, eos_token_id, limit)
                     for row, limit, position in zip(generated, limits, evaluation_set.order, strict=False)
                     if evaluation_set.sources[position].strip())
        if capped and self.args.should_log:
            logger.warning(
                "%s: %d of %d translations reached their length cap (max_len_a x source tokens + max_len_b, at most "
                "max_new_tokens: generation_max_length_ratio, generation_max_length_offset) and may be cut; a "
                "translation that repeats itself up to the cap is the model's loop (too little training, or a source "
                "unlike the training data), not a short cap", self._active_prefix, capped, len(generated))


def build_trainer(model: RelPosTransformerForConditionalGeneration, tokenizer: PreTrainedTokenizerBase,
                  training_args: TranslationTrainingArguments, train_dataset: Dataset | None,
                  evaluation_sets: dict[str, EvaluationSet], target_lang: str) -> TranslationTrainer:
    """The run's `TranslationTrainer`: it evaluates on the "eval" set during training, scores BLEU tokenized for
    `target_lang` (unless `bleu_tokenize` names a tokenization), and its collator pads batch lengths to the multiple
    the model's kernel needs."""
    return TranslationTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=evaluation_sets["eval"].dataset if "eval" in evaluation_sets else None,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100,
                                             pad_to_multiple_of=length_multiple(model.config._attn_implementation)),
        evaluation_sets=evaluation_sets,
        target_lang=target_lang,
    )


# The key of train_results.json (`report_training`) naming the checkpoint the training segment resumed from (null: it
# trained from step 0), which a run that finishes a stopped one (`finished_training`) records as it would have.
RESUMED_FROM_KEY = "train_resumed_from"


def report_training(trainer: TranslationTrainer, train_result: TrainOutput,
                    resumed_from: str | None = None) -> dict[str, Any]:
    """Log and save the training metrics (with the number of training pairs and the optimizer steps taken) and the
    Trainer's state; returns the metrics. train_results.json also names the checkpoint training resumed from
    (`RESUMED_FROM_KEY`: its folder name, or null), for `finished_training`; the metrics returned and all_results.json
    (`TranslationTrainer.save_metrics`) do not."""
    metrics = dict(train_result.metrics, train_samples=len(trainer.train_dataset), train_steps=train_result.global_step)
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", {**metrics, RESUMED_FROM_KEY: Path(resumed_from).name if resumed_from else None})
    trainer.save_state()
    return metrics


@dataclass(frozen=True)
class FinishedTraining:
    """A training run whose training has ended but whose record and card were never written (the process was ended
    in its final evaluation, prediction or record writing: a SIGTERM after the last step ends it at once), as
    `report_training` saved it: the newest complete checkpoint (at or before the step training ended at; None where
    the run saved none before it ended: `save_strategy: no`, or early stopping before the first save), the training
    metrics, the checkpoint the training segment resumed from (a folder name, or None) and the Trainer's state where
    training ended (output_dir/trainer_state.json, as judged: the epoch the evaluations log, the best checkpoint of
    `load_best_model_at_end`)."""
    checkpoint: str | None
    metrics: dict[str, Any]
    resumed_from: str | None
    state: TrainerState


def _saved_training_report(output_dir: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """train_results.json and trainer_state.json of output_dir, where `report_training` wrote both whole (the results
    name the checkpoint resumed from; the state is the one training ended with): `save_final_model` removes both
    before it moves the new final model in, weights last, and `report_training` writes them after, so their presence
    says the final model is whole. None otherwise (a kill while saving the final model or its report, or a report
    written by an earlier version without `RESUMED_FROM_KEY`: `_report_of_an_earlier_version`)."""
    report = _training_report(output_dir)
    return report if report is not None and RESUMED_FROM_KEY in report[0] else None


def _training_report(output_dir: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """train_results.json and trainer_state.json of output_dir, both whole JSON objects; None otherwise."""
    try:
        metrics = json.loads((Path(output_dir) / RESULTS_FILE.format(prefix="train")).read_text(encoding="utf-8"))
        state = json.loads((Path(output_dir) / TRAINER_STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return (metrics, state) if isinstance(metrics, dict) and isinstance(state, dict) else None


def _report_of_an_earlier_version(output_dir: str, step: int) -> bool:
    """Whether output_dir's training report of `step` is whole but was written by an hf_relpos version before
    `RESUMED_FROM_KEY`: the final model is whole, but `finished_training` cannot say what the training resumed from."""
    report = _training_report(output_dir)
    return report is not None and report[1].get("global_step") == step and RESUMED_FROM_KEY not in report[0]


def _trained_all_steps(training_args: TranslationTrainingArguments, state: dict[str, Any]) -> tuple[str, str, bool]:
    """The setting that ends the run (max_steps or num_train_epochs), its value, and whether a checkpoint of trainer
    state `state` has reached it."""
    step, epoch = state.get("global_step", 0), state.get("epoch") or 0.0
    if training_args.max_steps > 0:
        return "max_steps", f"{training_args.max_steps}", step >= training_args.max_steps
    return "num_train_epochs", f"{training_args.num_train_epochs:g}", epoch >= training_args.num_train_epochs


def finished_training(training_args: TranslationTrainingArguments) -> FinishedTraining | None:
    """`resume_from_checkpoint: last/true` in a training run whose final model and training report were written
    whole (`_saved_training_report`) where its training ended (the report's trainer state trained all the run's
    steps, or early stopping ended it there: `_early_stopping_end`; no checkpoint is newer than that step, and there
    may be none: `save_strategy: no`, or early stopping before the first save), without a run record (written last:
    the run was ended after training, before or while it wrote its record): what is needed to finish it without
    training (evaluate, predict, record, push), as the same command run uninterrupted would have; None for every other
    run (`resolve_resume_checkpoint` decides those)."""
    setting = training_args.resume_from_checkpoint
    output_dir = training_args.output_dir
    if (not training_args.do_train or setting is None or setting.lower() not in ("true", "last")
            or not os.path.isdir(output_dir) or (Path(output_dir) / RUN_RECORD_FILE).exists()):
        return None
    report = _saved_training_report(output_dir)
    if report is None:
        return None
    metrics, final_state = report
    step = final_state.get("global_step", 0)
    if _trained_all_steps(training_args, final_state)[2]:
        how = "all its steps"
    elif _early_stopping_end(training_args, final_state) is not None:
        how = f"stopped by early_stopping_patience={training_args.early_stopping_patience}"
    else:
        return None
    checkpoint = last_complete_checkpoint(output_dir)
    if checkpoint is not None and checkpoint_step(checkpoint) > step:
        return None   # trained on past the report (resumed with more steps), whose final model is not there yet
    resumed_from = metrics.pop(RESUMED_FROM_KEY)
    if training_args.process_index == 0:
        logger.warning("resume_from_checkpoint=%s: the run in output_dir %s finished training (%s; step %d, %s) and "
                       "saved its final model, but was stopped before it wrote its run record: finishing it without "
                       "training (evaluation, prediction and record of the final model there)", setting, output_dir,
                       how, step, f"newest checkpoint {checkpoint.name}" if checkpoint else "no checkpoint saved")
    return FinishedTraining(str(checkpoint) if checkpoint else None, metrics, resumed_from,
                            TrainerState(**final_state))   # as TrainerState.load_from_json builds it


def _ended_training_state(output_dir: str) -> dict[str, Any] | None:
    """output_dir/trainer_state.json, the state `report_training` saved where training ended, if whole."""
    try:
        ended = json.loads((Path(output_dir) / TRAINER_STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return ended if isinstance(ended, dict) else None


def _early_stopping_end(training_args: TranslationTrainingArguments, ended: dict[str, Any]) -> tuple[int, int] | None:
    """(the step, the evaluations without improvement) at which early stopping ended a run's training, where `ended`
    (the trainer state saved where training ended, `_ended_training_state`) says it did: those evaluations reach this
    run's early_stopping_patience, under the same early_stopping_threshold. None otherwise."""
    patience = training_args.early_stopping_patience
    if patience is None:
        return None
    saved = ended.get("stateful_callbacks", {}).get(EarlyStopping.__name__)
    threshold = saved.get("args", {}).get("early_stopping_threshold") if isinstance(saved, dict) else None
    stale = _evaluations_without_improvement(ended)
    if stale >= patience and threshold == training_args.early_stopping_threshold:
        return ended.get("global_step", 0), stale
    return None


def _write_hypotheses(path: Path, hypotheses: list[str]) -> None:
    """One translation a line, written atomically (`write_text_atomic`): a kill never leaves a file cut short."""
    write_text_atomic(path, "".join(" ".join(hypothesis.splitlines()) + "\n" for hypothesis in hypotheses))


def report_split(trainer: TranslationTrainer, prefix: str, metrics: dict[str, Any]) -> dict[str, Any]:
    """Log and save the metrics of the evaluation set `prefix` ("eval", "test") with its number of pairs; write its
    translations, in source order, to `{prefix}_hypotheses.txt` and print its scores. Returns the metrics."""
    evaluation_set = trainer.evaluation_sets[prefix]
    metrics = {**metrics, f"{prefix}_samples": len(evaluation_set.order)}
    if evaluation_set.references is None:   # against no reference: meaningless
        metrics.pop(f"{prefix}_loss", None)
        metrics.pop(f"{prefix}_nll_loss", None)
    trainer.log_metrics(prefix, metrics)
    trainer.save_metrics(prefix, metrics)
    if not trainer.is_world_process_zero() or not trainer.args.predict_with_generate:
        return metrics
    path = Path(trainer.args.output_dir) / HYPOTHESES_FILE.format(prefix=prefix)
    _write_hypotheses(path, evaluation_set.hypotheses)
    if evaluation_set.references is None:
        print(f"{prefix}: the source-only file has no references, so BLEU and chrF are skipped; "
              f"{len(evaluation_set.hypotheses)} translations written to {path}", flush=True)
    else:
        print(f"{prefix}: sacreBLEU {metrics[f'{prefix}_bleu']:.2f}  chrF {metrics[f'{prefix}_chrf']:.2f}  "
              f"({metrics[f'{prefix}_bleu_signature']})", flush=True)
    return metrics


def _own_checkpoint_step(checkpoint: str | None, output_dir: str) -> int | None:
    """The step of `checkpoint` where it is output_dir's own `checkpoint-<step>`, the folder a save at that step
    writes; None for another folder or none."""
    if not checkpoint:
        return None
    folder = Path(checkpoint)
    match = CHECKPOINT_PATTERN.match(folder.name)
    return int(match.group(1)) if match and folder.resolve().parent == Path(output_dir).resolve() else None


def _last_complete_checkpoint(output_dir: str, setting: str) -> Path:
    last = last_complete_checkpoint(output_dir) if os.path.isdir(output_dir) else None
    if last is None:
        raise ConfigError(f"resume_from_checkpoint={setting}: no checkpoint-<step> folder in {output_dir} is complete")
    return last


def _evaluations_without_improvement(state: dict[str, Any]) -> int:
    """The count of evaluations without improvement that a checkpoint's trainer state saved for `EarlyStopping`
    (0 for a checkpoint saved without early stopping)."""
    saved = state.get("stateful_callbacks", {}).get(EarlyStopping.__name__)
    if not isinstance(saved, dict):
        return 0
    return saved.get("attributes", {}).get("early_stopping_patience_counter", 0)


def _check_not_stopped_later(training_args: TranslationTrainingArguments, resume_from: str, step: int) -> None:
    """The run in output_dir did not go on from `resume_from`, one of its checkpoints, to a stop by early stopping
    with the same threshold: resumed, it would train the same steps again and stop at the same evaluation."""
    if Path(resume_from).resolve().parent != Path(training_args.output_dir).resolve():
        return
    ended = _ended_training_state(training_args.output_dir)
    end = _early_stopping_end(training_args, ended) if ended is not None else None
    if end is not None and end[0] > step:
        stopped_at, stale = end
        raise ConfigError(f"resume_from_checkpoint: the run in {training_args.output_dir} went on from "
                          f"{resume_from!r} (step {step}) and stopped at step {stopped_at}, where early_stopping_patience="
                          f"{training_args.early_stopping_patience} was reached ({stale} evaluations without improvement); "
                          "resumed, it would train those steps again and stop there: raise early_stopping_patience to "
                          "train on, or score the run's model with --do_train false")


def _check_optimizer_and_schedule_saved(training_args: TranslationTrainingArguments, resume_from: str,
                                        step: int) -> None:
    """The checkpoint holds the optimizer and learning-rate schedule (scheduler.pt, which the Trainer saves with them
    but for DeepSpeed, inside its own checkpoint): one saved with save_only_model holds the weights alone, and the
    Trainer resumed from it with a new optimizer state and schedule (the warm-up again from a learning rate of 0 at
    the checkpoint's step) and without its random state, silently."""
    if training_args.deepspeed is None and not (Path(resume_from) / SCHEDULER_NAME).is_file():
        raise ConfigError(f"resume_from_checkpoint: {resume_from!r} holds the weights without the optimizer and "
                          f"learning-rate schedule (no {SCHEDULER_NAME}: saved with save_only_model); resumed, the run "
                          f"would start a new optimizer state and the schedule's warm-up again at step {step}. Train "
                          f"on from its weights in a new run (--model_name_or_path {resume_from}), or save whole "
                          "checkpoints (save_only_model: false) to resume from")


def _warn_of_another_batch_order(training_args: TranslationTrainingArguments, resume_from: str,
                                 state: dict[str, Any]) -> None:
    """One warning (main process) per `batch_order_settings` field whose value differs from the one recorded in the
    checkpoint's trainer state: legitimate, but the resumed run no longer goes on as the recorded run did. A
    checkpoint saved without the record (an earlier version) is not compared."""
    if training_args.process_index != 0:
        return
    saved = state.get("stateful_callbacks", {}).get(BatchOrderRecord.__name__)
    recorded = saved.get("args", {}).get("batch_order") if isinstance(saved, dict) else None
    if not isinstance(recorded, dict):
        logger.info("resume_from_checkpoint: %s has no record of the settings that decide the batch order (saved by "
                    "an earlier version): not compared with this run's", resume_from)
        return
    for name, value in batch_order_settings(training_args).items():
        if name in recorded and recorded[name] != value:
            logger.warning("resume_from_checkpoint: %s is %s in this run, %s in the run that saved %s: the resumed "
                           "run no longer follows the recorded run's batch order", _SETTING_NAMES.get(name, name),
                           yaml_text(value), yaml_text(recorded[name]), resume_from)


def _last_or_none(training_args: TranslationTrainingArguments, setting: str) -> Path | None:
    """"last"/"true": the newest complete checkpoint of output_dir; in a training run whose output_dir holds none and
    nothing that a run from step 0 would lose (no finished model: `finished_model_files`; it may not exist yet, or
    hold only checkpoints whose writing was cut short, or what a run stopped before training leaves, its tokenizer
    and prepared data, which a fresh run takes up), None, with one warning: the run trains from step 0, so that a
    requeued job reruns the same command on its first start as on later ones (a `prepare_only` run, which stops
    before training, says nothing of it). Where a finished model is there, or the run trains nothing, one error.
    Under several processes each decides by itself, alike: what the main process may write meanwhile (output_dir,
    tokenizer, prepared data) changes none of it."""
    output_dir = training_args.output_dir
    if (last := last_complete_checkpoint(output_dir) if os.path.isdir(output_dir) else None) is not None:
        return last
    error = f"resume_from_checkpoint={setting}: no checkpoint-<step> folder in {output_dir} is complete"
    if not training_args.do_train:
        raise ConfigError(error)
    if found := finished_model_files(output_dir):
        raise ConfigError(f"{error}, and it holds a trained model ({', '.join(found)}), which a run from step 0 would "
                          f"replace: score it with --do_train false, train on from it with --model_name_or_path "
                          f"{output_dir} (into another output_dir), or train from scratch with --overwrite_output_dir "
                          "true (without --resume_from_checkpoint)")
    if training_args.process_index == 0 and not training_args.prepare_only:
        if not os.path.isdir(output_dir):
            found_there = "it does not exist yet"
        elif incomplete := [path.name for path in find_checkpoints(output_dir)]:
            found_there = f"incomplete, their writing cut short: {', '.join(incomplete)}"
        else:
            found_there = "it holds none"
        logger.warning("resume_from_checkpoint=%s: no checkpoint to resume from was found in output_dir %s (%s): "
                       "training from step 0", setting, output_dir, found_there)
    return None


def _stopped_while_saving_the_final_model(output_dir: str, checkpoint: str, step: int) -> bool:
    """Whether output_dir's run, whose newest checkpoint `checkpoint` (output_dir's own) trained all its steps, has
    no run record and no whole training report of that step (`_saved_training_report`): it was ended after training,
    before or while it saved its final model and report, which `finished_training` cannot finish."""
    return (Path(checkpoint).resolve().parent == Path(output_dir).resolve()
            and not (Path(output_dir) / RUN_RECORD_FILE).exists()
            and ((report := _saved_training_report(output_dir)) is None or report[1].get("global_step") != step))


def resolve_resume_checkpoint(training_args: TranslationTrainingArguments) -> str | None:
    """`resume_from_checkpoint`: a checkpoint folder, or "last"/"true" for the newest complete one in output_dir
    (a checkpoint whose writing was cut short is skipped; none there: `_last_or_none`). A training run refuses a
    checkpoint that has already trained all the run's steps, or whose evaluations without improvement already reach
    the run's early_stopping_patience (the Trainer would train on and replace the final model), or that holds no
    optimizer and schedule (`_check_optimizer_and_schedule_saved`), and warns of each
    setting that changes the checkpoint run's batch order (`_warn_of_another_batch_order`)."""
    resume_from = training_args.resume_from_checkpoint
    if resume_from is None:
        return None
    if resume_from.lower() in ("true", "last"):
        last = _last_or_none(training_args, resume_from)
        if last is None:
            return None
        resume_from = str(last)
    elif not os.path.isdir(resume_from):
        raise ConfigError(f"resume_from_checkpoint: {resume_from!r} is not a folder; it takes a checkpoint folder, "
                          "last (or true) for output_dir's newest complete checkpoint, or null to train from step 0")
    elif not is_complete_checkpoint(resume_from):
        raise ConfigError(f"resume_from_checkpoint: {resume_from!r} is not a complete checkpoint (its "
                          f"{TRAINER_STATE_FILE}, written last, is missing or cut short); use an older checkpoint")
    if training_args.do_train:
        state = json.loads((Path(resume_from) / TRAINER_STATE_FILE).read_text(encoding="utf-8"))
        step, epoch = state.get("global_step", 0), state.get("epoch") or 0.0
        field, goal, reached = _trained_all_steps(training_args, state)
        if reached:
            trained = (f"resume_from_checkpoint: {resume_from!r} has already trained {field}={goal} (step {step}, "
                       f"epoch {epoch:g})")
            results = Path(training_args.output_dir) / RESULTS_FILE.format(prefix="train")
            if (_stopped_while_saving_the_final_model(training_args.output_dir, resume_from, step)
                    and _report_of_an_earlier_version(training_args.output_dir, step)):
                raise ConfigError(
                    f"{trained}, and the run's final model and training report of step {step} in "
                    f"{training_args.output_dir} are there, but its {results.name} was written by an earlier version "
                    f"of hf_relpos, without \"{RESUMED_FROM_KEY}\" (the checkpoint its training resumed from, which "
                    f"the record of the finished run names), so the run cannot be finished from it: add "
                    f"\"{RESUMED_FROM_KEY}\": null (its training started at step 0) or the checkpoint's name "
                    f"(\"checkpoint-<step>\") to {results} and run the same command again, or score the final model "
                    f"with --do_train false --model_name_or_path {training_args.output_dir} (no run record is "
                    "written)")
            if _stopped_while_saving_the_final_model(training_args.output_dir, resume_from, step):
                raise ConfigError(
                    f"{trained}, and the run's final model or its training report in {training_args.output_dir} was "
                    f"not written to the end (no {RESULTS_FILE.format(prefix='train')} and {TRAINER_STATE_FILE} of "
                    f"step {step} there: the run was ended while saving them), so the run cannot be finished from "
                    f"them: train it again with --overwrite_output_dir true (without --resume_from_checkpoint), raise "
                    f"{field} to train on, or score {resume_from!r} with --do_train false --model_name_or_path "
                    f"{resume_from} into another output_dir")
            raise ConfigError(f"{trained}: raise {field} to train on, or score the run's model with --do_train false")
        patience = training_args.early_stopping_patience
        stale = _evaluations_without_improvement(state)
        if patience is not None and stale >= patience:
            raise ConfigError(f"resume_from_checkpoint: {resume_from!r} has already reached early_stopping_patience="
                              f"{patience} ({stale} evaluations without improvement; step {step}, epoch {epoch:g}): "
                              "raise early_stopping_patience to train on, or score the run's model with --do_train "
                              "false")
        _check_not_stopped_later(training_args, resume_from, step)
        _check_optimizer_and_schedule_saved(training_args, resume_from, step)
        _warn_of_another_batch_order(training_args, resume_from, state)
        logger.info("resume_from_checkpoint: training on from %s (step %d, epoch %g)", resume_from, step, epoch)
    return resume_from
