"""What a finished training run leaves besides its model: the typed record of the run (`RunRecord`: its recipe
fields from the parsed arguments, processes, hardware, training time and scores), written to
output_dir/run_record.json; the model card rendered from it, output_dir/README.md; and, with `push_to_hub`, one push
of output_dir to the Hub with that card."""

from __future__ import annotations

import enum
import json
import logging
import os
import shlex
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from transformers.utils import CONFIG_NAME

from ..model.modeling_relpos import RelPosTransformerForConditionalGeneration
from ..publish.files import write_text_atomic
from ..publish.hub import (
    CARD_FILE,
    averaged_checkpoints,
    load_results,
    model_conversion,
    push_model_folder,
    render_model_card,
)
from ..publish.records import (
    ALL_RESULTS_FILE,
    DECODING,
    HYPOTHESES_FILE,
    RESULT_SPLITS,
    RUN_RECORD_FILE,
    TRAINED_WEIGHTS,
    RunRecord,
    cpu_model_name,
    package_version,
    scores_from_results,
    software_versions,
    training_record,
)
from .arguments import (
    NEW_TOKENIZER_FIELDS,
    ModelArguments,
    TranslationTrainingArguments,
    adam_fields_read,
    flag_field_name,
    hub_repository,
    optimizer_name,
    started_program,
)
from .data import DEMO_CORPUS_FIELDS, DataArguments
from .data_preparation import splits_to_read
from .preflight import finished_model_files, fsdp_launch
from .safety import OutputDirError

logger = logging.getLogger(__name__)


def record_run(model: RelPosTransformerForConditionalGeneration, model_args: ModelArguments, data_args: DataArguments,
               training_args: TranslationTrainingArguments, results: dict[str, dict[str, Any]],
               push_to_hub: bool, resumed_from: str | None = None, best_checkpoint: str | None = None,
               prepared_from: dict[str, dict[str, Any]] | None = None) -> str | None:
    """After training: the run's record with the scores of `results` (and `resumed_from`, the checkpoint a resumed
    run continued from; `prepared_from`, where each split's prepared data came from), written with the model card into output_dir; with `push_to_hub`, output_dir pushed to the
    Hub with that card. `best_checkpoint`: the checkpoint whose weights `load_best_model_at_end` loaded (None: no
    evaluation ran during training, so the weights are the last step's and the record says
    load_best_model_at_end false). Returns the push's commit URL (None without a push)."""
    record = run_record(model_args, data_args, training_args, results.get("train", {}).get("train_runtime"))
    if record.load_best_model_at_end and best_checkpoint is None:
        logger.warning("load_best_model_at_end: no evaluation ran during the %s steps trained, so there is no best "
                       "checkpoint; the final model is the last step's weights", results.get("train", {}).get(
                           "train_steps"))
        record.load_best_model_at_end = False
    record.resumed_from = Path(resumed_from).name if resumed_from is not None else None
    record.prepared_from = prepared_from or {}
    record.steps = results.get("train", {}).get("train_steps")   # where training ended (early stopping: before the end)
    record.epochs = results.get("train", {}).get("epoch")
    record.scores = scores_from_results(results)
    write_model_card(model, record, training_args)
    write_text_atomic(Path(training_args.output_dir) / RUN_RECORD_FILE, json.dumps(record.to_json(), indent=1) + "\n")
    return push_training_output(training_args) if push_to_hub else None


def outputs_summary(output_dir: str | os.PathLike, results: Mapping[str, Any], translations: bool,
                    pushed_to: str | None = None) -> str:
    """The run's closing line: what output_dir holds after the run, each by its file name: the model with its
    tokenizer (where its weights are there), the model card, the metrics of the stages this run ran (`results`:
    "train", "eval", "test"; the Trainer's merge of them) and, with `translations` (predict_with_generate), the
    translations of each evaluation set it scored; and the commit URL of the push that uploaded them (`pushed_to`).
    A run has run at least one stage, so the metrics are always there."""
    folder = Path(output_dir)
    held = []
    if set(finished_model_files(folder)) - {CONFIG_NAME}:
        held.append("the model and its tokenizer")
    if (folder / CARD_FILE).is_file():
        held.append(f"the model card {CARD_FILE}")
    if results:
        held.append(f"the metrics {ALL_RESULTS_FILE}")
    scored = [prefix for prefix in RESULT_SPLITS if prefix in results]
    if translations and scored:
        held.append("the translations " + ", ".join(HYPOTHESES_FILE.format(prefix=prefix) for prefix in scored))
    listed = held[0] if len(held) == 1 else ", ".join(held[:-1]) + " and " + held[-1]
    return f"{folder} holds {listed}" + (f"; pushed to the Hub: {pushed_to}" if pushed_to else "")


# The settings besides the decoding ones that decide a split's scores: for every split, and for each split its own data.
# Not max_source_length / max_target_length: they bound the training pairs only (evaluation pairs are kept whole).
SCORING_FIELDS = ("source_lang", "target_lang", "bleu_tokenize", "dataset_name", "dataset_config_name")
SPLIT_SCORING_FIELDS = {"validation": ("validation_file", "validation_split_name", "max_eval_samples",
                                        *DEMO_CORPUS_FIELDS),
                        "test": ("test_file", "test_split_name", "max_predict_samples", *DEMO_CORPUS_FIELDS)}


def check_scoring_in_place(model_args: ModelArguments, data_args: DataArguments,
                           training_args: TranslationTrainingArguments) -> None:
    """A run that only scores (do_train false) writes its `{eval,test}_results.json` and translations into
    output_dir, where a card and a push take them for the scores of the weights there, under the decoding and data
    settings of the folder's run record. So when output_dir holds a trained model (the caller's test), it must
    be the model scored, and where it has a run record, the settings that decide the scores must be the record's
    (`SCORING_FIELDS`, the decoding fields, and the data of each split the record has scores for); a split the record
    has no scores for may be scored from any data. Raises OutputDirError naming what differs."""
    output_dir = Path(training_args.output_dir)
    scored = Path(model_args.model_name_or_path or "")
    if not scored.is_dir() or scored.resolve() != output_dir.resolve():
        raise OutputDirError(
            f"output_dir {str(output_dir)!r} holds another trained model than the one scored "
            f"({model_args.model_name_or_path!r}): its card and a push would take these scores for its own weights; "
            "choose another output_dir")
    if averaged_checkpoints(output_dir) is not None:
        raise OutputDirError(
            f"output_dir {str(output_dir)!r} was written by hf-relpos-average, and its card says its weights were not "
            "evaluated: score them into another output_dir")
    record = training_record(output_dir)
    if record is None:
        return
    differences = scoring_differences(record, run_record(model_args, data_args, training_args),
                                      splits_to_read(training_args))
    if differences:
        raise OutputDirError(
            f"output_dir {str(output_dir)!r} is the scored model's training folder, whose card and run record state "
            f"the settings of its scores; this run's differ ({'; '.join(differences)}): score into another "
            "output_dir, or with the recorded settings")


def scoring_differences(record: RunRecord, current: RunRecord, splits: Sequence[str]) -> list[str]:
    """`name VALUE (recorded VALUE)` for each setting deciding scores on which `current` differs from `record`: the
    decoding fields and `SCORING_FIELDS`, and the data of each of `splits` that `record` has scores for."""
    recorded = {split for by_split in record.scores.values() for split in by_split}
    names = dict.fromkeys([*RunRecord.recipe_fields(DECODING), *SCORING_FIELDS,
                           *(name for split in splits if split in recorded for name in SPLIT_SCORING_FIELDS[split])])
    # a record written before the demo corpus's settings were recorded has none to compare
    unrecorded = {name for name in DEMO_CORPUS_FIELDS if getattr(record, name) is None}
    return [f"{name} {getattr(current, name)!r} (recorded {getattr(record, name)!r})" for name in names
            if getattr(current, name) != getattr(record, name) and name not in unrecorded]


def record_scores_in_place(model: RelPosTransformerForConditionalGeneration, model_args: ModelArguments,
                           data_args: DataArguments, training_args: TranslationTrainingArguments,
                           results: dict[str, dict[str, Any]]) -> None:
    """After a run that scored output_dir's own model (`check_scoring_in_place`): its run record takes the new
    scores (and the data they were scored on) and its card is rendered again, so that both match the results files
    the run replaced. A folder without a run record has no card of ours to update."""
    output_dir = Path(training_args.output_dir)
    record = training_record(output_dir)
    if record is None:
        return
    current = run_record(model_args, data_args, training_args)
    for prefix in results:
        for name in SPLIT_SCORING_FIELDS.get(RESULT_SPLITS.get(prefix), ()):
            setattr(record, name, getattr(current, name))
    record.scores = {**record.scores, TRAINED_WEIGHTS: {**record.scores.get(TRAINED_WEIGHTS, {}),
                                                        **scores_from_results(results).get(TRAINED_WEIGHTS, {})}}
    record.hub_model_id = training_args.hub_model_id or record.hub_model_id
    write_model_card(model, record, training_args)
    write_text_atomic(output_dir / RUN_RECORD_FILE, json.dumps(record.to_json(), indent=1) + "\n")


def run_record(model_args: ModelArguments, data_args: DataArguments, training_args: TranslationTrainingArguments,
               training_seconds: float | None = None) -> RunRecord:
    """This run as its model card describes it: the recipe it trained from (the YAML file's stem) and the flags it added
    (and the program and the folder it was started by and in), each recipe field of `RunRecord` from the argument that
    bears its name, but those the run did not read (steps or epochs, whichever the run counts; the pairs per batch only
    without a token budget, its pools only with one; the adam_* its optimizer takes; the join size only with joined
    pairs; a new tokenizer's settings only when the run trains one; the demo corpus's only when the run reads it) and
    the length ratio where it is 1 and the half-precision evaluations where off, the processes (and whether `accelerate
    launch` sharded them, FSDP: its ACCELERATE_USE_FSDP), the hardware and (after training) the training time, the date,
    the code (`package_version`) and the releases it ran with."""
    omitted = {"num_train_epochs" if training_args.max_steps > 0 else "max_steps"}
    # pairs per batch with a token budget, the budget's pools without one
    omitted.add("per_device_train_batch_size" if training_args.max_tokens_per_batch is not None else "length_pool_factor")
    if training_args.early_stopping_patience is None:
        omitted.add("early_stopping_threshold")
    if not training_args.load_best_model_at_end:
        omitted.add("load_best_model_at_end")
    if not data_args.uses_demo_corpus:
        omitted.update(DEMO_CORPUS_FIELDS)
    if not data_args.concatenated_pairs:   # no joined pairs: their size is unread
        omitted.add("max_pairs_per_join")
    if model_args.tokenizer_name or model_args.model_name_or_path:   # a reused tokenizer: no new one's settings
        omitted.update(NEW_TOKENIZER_FIELDS)
    if training_args.generation_max_length_ratio == 1:   # the card reads it as 1 unless set
        omitted.add("generation_max_length_ratio")
    omitted.update(name for name in ("bf16_full_eval", "fp16_full_eval") if not getattr(training_args, name))
    optimizer_reads = adam_fields_read(optimizer_name(training_args))
    omitted.update(name for name in ("adam_beta1", "adam_beta2", "adam_epsilon") if name not in optimizer_reads)
    recipe = {name: _plain(getattr(next(arguments for arguments in (data_args, model_args, training_args)
                                        if hasattr(arguments, name)), name))
              for name in RunRecord.recipe_fields() if name not in omitted}
    recipe_file = model_args.recipe_file
    sharded = training_args.world_size > 1 and fsdp_launch()   # on GPUs: check_sharding refuses it on the CPU
    return RunRecord(model=dict(model_args.model_config), **recipe, devices=training_args.world_size, sharded=sharded,
                     hardware=_hardware_name(training_args), training_seconds=training_seconds,
                     recipe=Path(recipe_file).stem if recipe_file else None,
                     program=started_program(), hub_model_id=training_args.hub_model_id,
                     trained_as=shlex.join(_from_the_start(model_args)), working_directory=os.getcwd(),
                     date=datetime.now(UTC).isoformat(timespec="seconds"), software=software_versions(),
                     source_version=package_version())


def _from_the_start(model_args: ModelArguments) -> list[str]:
    """The recipe file and flags of a run as a command that trains it from the start (in a new folder there is no
    checkpoint to resume from): without a `--resume_from_checkpoint` flag, and with `--resume_from_checkpoint null`
    where the recipe file itself resumes."""
    return [*([model_args.recipe_file] if model_args.recipe_file else []),
            *_without_resume_flag(model_args.recipe_flags),
            *(["--resume_from_checkpoint", "null"] if model_args.recipe_resumes else [])]


def _without_resume_flag(flags: Sequence[str]) -> list[str]:
    """`flags` without `--resume_from_checkpoint VALUE` (or `=VALUE`, dashed or not)."""
    kept: list[str] = []
    skip_value = False
    for flag in flags:
        if skip_value:
            skip_value = False
        elif flag.startswith("--") and flag_field_name(flag) == "resume_from_checkpoint":
            skip_value = "=" not in flag
        else:
            kept.append(flag)
    return kept


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
    """output_dir/README.md: the model card of this run (recipe, run facts and scores; named as the Hub repository a
    push makes, the record's `hub_model_id`, else the output folder's name), as the Trainer's `create_model_card`
    writes one, so a folder uploaded by hand is documented."""
    path = Path(training_args.output_dir) / CARD_FILE
    card = render_model_card(model.config, record, load_results(training_args.output_dir), repo_id=record.hub_model_id,
                             name=hub_repository(record.hub_model_id, path.parent),
                             conversion=model_conversion(path.parent, record))
    write_text_atomic(path, card)
    return path


def push_training_output(training_args: TranslationTrainingArguments) -> str:
    """`push_to_hub: true`: push output_dir (model, tokenizer, results) to `hub_repository` with the card of the run
    record written there."""
    folder = Path(training_args.output_dir)
    return push_model_folder(folder, hub_repository(training_args.hub_model_id, folder),
                             token=training_args.hub_token, private=training_args.hub_private_repo)
