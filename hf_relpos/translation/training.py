"""The training recipe of a translation model, the body of `train_translation.py` (`hf-relpos-train`): parse the
YAML and command-line arguments, check everything that can fail before writing, prepare the tokenizer, model and
data, train, average the last checkpoints, save the final model, evaluate, predict, and record the run (model card,
run record, Hub push). Each step is a call into the module of its job: `coordination` (the order of the processes),
`data_preparation`, `tokenizer_setup`, `model_setup`, `trainer`, `final_model` and `run_outputs`."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

import torch
from accelerate import PartialState
from transformers import set_seed

from ..publish.hub import HubPushError
from .arguments import (
    PROGRAM,
    ConfigError,
    TranslationTrainingArguments,
    check_resumed_model_config,
    hub_repository,
    local_main_process,
    parse_arguments,
)
from .coordination import main_process_first_without_timeout
from .data import DatasetSchemaError
from .data_preparation import check_evaluation_lengths, prepare_data, splits_to_read
from .final_model import average_final_weights, load_final_model, save_final_model
from .model_setup import estimated_weight_bytes, log_model, required_disk_bytes
from .preflight import (
    PreflightError,
    check_hub_login,
    check_kernel_runs_here,
    check_no_foreign_card,
    check_precision_runs_here,
    check_private_hub_repository,
    check_process_group,
    check_rerun,
    check_run_file_names,
    check_sharding,
    previous_run,
    remove_previous_run,
)
from .prepared import PreparationError, prepared_store
from .run_outputs import check_scoring_in_place, outputs_summary, record_run, record_scores_in_place
from .safety import NonFiniteLossError, OutputDirError, TrainingStoppedError, check_output_dir
from .tokenizer_setup import save_tokenizer
from .trainer import (
    build_trainer,
    finished_training,
    report_split,
    report_training,
    resolve_resume_checkpoint,
)

logger = logging.getLogger(__name__)


def run(argv: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Parse, check, prepare, train (average, save), evaluate, predict, record; returns the metrics of each stage run
    ("train", "eval", "test"). Every check that can fail (arguments, environment, output_dir, data, tokenizer, model)
    runs before anything is written to output_dir. A run given `resume_from_checkpoint: last` whose training ended
    and whose final model was saved, but which was stopped before its record (`finished_training`), is finished
    without training: the saved final model is evaluated, predicted with and recorded, with the stopped run's
    training report ("train")."""
    _set_up_logging()
    model_args, data_args, training_args = parse_arguments(argv)
    # hf_relpos.publish.hub pushes once, after scoring, with the rendered card; the Trainer's own pushes would upload
    # checkpoints and a generic card before evaluation.
    push_to_hub, training_args.push_to_hub = training_args.push_to_hub, False
    _set_up_process(training_args)
    if not training_args.prepare_only:
        check_kernel_runs_here(model_args.attn_implementation, training_args.device, training_args.do_train)
        check_precision_runs_here(training_args.fp16, training_args.device)
    output_dir = training_args.output_dir
    # last/true where training has ended but the run was stopped before its record: finished without training, so
    # it writes no final model or checkpoint and needs no room for them (the stopped run's checkpoints fill it)
    finished = finished_training(training_args)
    check_output_dir(output_dir, 0 if finished is not None else
                     required_disk_bytes(estimated_weight_bytes(model_args) or 0, training_args))
    if data_args.prepared_data_dir is not None:   # its free space is checked by the preparation, for the data's size
        check_output_dir(data_args.prepared_data_dir, setting="prepared_data_dir")
    resume_from = finished.checkpoint if finished is not None else resolve_resume_checkpoint(training_args)
    if finished is not None and resume_from is None:   # no checkpoint saved: the final model is the architecture
        check_resumed_model_config(model_args, output_dir)
    elif resume_from is not None and training_args.do_train:
        check_resumed_model_config(model_args, resume_from)
    fresh_run = training_args.do_train and training_args.overwrite_output_dir
    if training_args.do_train:   # resuming "last" from none: resolve_resume_checkpoint found nothing a run would lose
        check_rerun(output_dir, overwrite=fresh_run, resuming=training_args.resume_from_checkpoint is not None,
                    starts_from={"model_name_or_path": model_args.model_name_or_path,
                                 "tokenizer_name": model_args.tokenizer_name})
    if not fresh_run:
        check_run_file_names(output_dir, training=training_args.do_train and finished is None)
    if training_args.do_train and not fresh_run and resume_from is None and finished is None:   # from step 0
        check_no_foreign_card(output_dir)
    scores_in_place = not training_args.do_train and bool(previous_run(output_dir))   # output_dir's own model
    if scores_in_place:
        check_scoring_in_place(model_args, data_args, training_args)
    if push_to_hub and training_args.should_save:
        user = check_hub_login(training_args.hub_token)
        logger.info("push_to_hub: logged in to the Hugging Face Hub as %s", user)
        if training_args.hub_private_repo:
            check_private_hub_repository(training_args.hub_token,
                                         hub_repository(training_args.hub_model_id, output_dir), user)

    with main_process_first_without_timeout(training_args, desc="data preparation"):
        prepared = prepare_data(model_args, data_args, training_args, splits_to_read(training_args),
                                retrain=fresh_run and training_args.should_save,
                                resuming=finished is not None or resume_from is not None)
        check_evaluation_lengths(prepared.evaluation_sets, training_args, prepared.model)
        if training_args.should_save:  # the first write of the run besides the prepared data: every check has passed
            if fresh_run:
                removed = remove_previous_run(output_dir)
                if removed:
                    logger.info("overwrite_output_dir: removed the previous run from %s (%s)", output_dir,
                                ", ".join(removed))
            if prepared.new_tokenizer_settings is not None:
                save_tokenizer(prepared.tokenizer, output_dir, prepared.new_tokenizer_settings)
    if training_args.prepare_only:
        logger.info("prepare_only: tokenizer in %s, data prepared in %s; stopping before training", output_dir,
                    prepared_store(output_dir, data_args.prepared_data_dir).root)
        return {}

    log_model(prepared.model, model_args, training_args)
    if finished is not None:   # the final model, as saved; no SIGTERM checkpoint: nothing is trained
        load_final_model(prepared.model, output_dir)
        training_args.enable_jit_checkpoint = False
    trainer = build_trainer(prepared.model, prepared.tokenizer, training_args, prepared.train_dataset,
                            prepared.evaluation_sets, data_args.target_lang)
    try:
        results: dict[str, dict[str, Any]] = {}
        best_checkpoint: str | None = None   # load_best_model_at_end's
        if finished is not None:   # the Trainer's state where training ended: evaluations log its epoch
            trainer.state = finished.state
            results["train"], resume_from = finished.metrics, finished.resumed_from
            best_checkpoint = finished.state.best_model_checkpoint
        elif training_args.do_train:
            train_result = trainer.train(resume_from_checkpoint=resume_from)
            averaged = (average_final_weights(trainer, training_args.average_checkpoints)
                        if training_args.average_checkpoints is not None else None)
            save_final_model(trainer, averaged)
            results["train"] = report_training(trainer, train_result, resume_from)
            best_checkpoint = trainer.state.best_model_checkpoint
        if training_args.do_eval:
            results["eval"] = report_split(trainer, "eval", trainer.evaluate(metric_key_prefix="eval"))
        if training_args.do_predict:
            prediction = trainer.predict(prepared.evaluation_sets["test"].dataset, metric_key_prefix="test")
            results["test"] = report_split(trainer, "test", prediction.metrics)
        pushed_to = None
        if training_args.should_save and training_args.do_train:   # check_arguments: no push_to_hub without it
            pushed_to = record_run(prepared.model, model_args, data_args, training_args, results, push_to_hub,
                                   resume_from, best_checkpoint, prepared.prepared_from)
        elif training_args.should_save and scores_in_place:
            record_scores_in_place(prepared.model, model_args, data_args, training_args, results)
        if training_args.should_save:
            logger.info(outputs_summary(output_dir, results, training_args.predict_with_generate, pushed_to))
        return results
    finally:
        trainer.end_loader_workers()


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _set_up_logging() -> None:
    """The run's log on stdout from its start: hf_relpos' own lines at INFO, so that the notes of parsing the
    arguments are seen (`parse_arguments` keeps them to the main process of each machine), other libraries' at
    WARNING until `_set_up_process` knows which processes log."""
    logging.basicConfig(format=LOG_FORMAT, level=logging.WARNING, stream=sys.stdout, force=True)
    logging.getLogger(__name__.split(".")[0]).setLevel(logging.INFO)


def _set_up_process(training_args: TranslationTrainingArguments) -> None:
    """Logging (INFO on the processes that log, WARNING on the others), the process group's check, the CPU threads
    and the seed."""
    logging.basicConfig(format=LOG_FORMAT, level=logging.INFO, stream=sys.stdout, force=True)
    logging.getLogger(__name__.split(".")[0]).setLevel(logging.NOTSET)   # the root's level, as for every library
    if not training_args.should_log:
        logging.getLogger().setLevel(logging.WARNING)
    check_process_group(training_args.world_size)
    check_sharding(training_args.world_size, training_args.device)
    logger.info("world size %d, process %d", training_args.world_size, training_args.process_index)
    if training_args.cpu_threads is not None:
        torch.set_num_threads(training_args.cpu_threads)
    set_seed(training_args.seed)


def _prints_errors() -> bool:
    """Whether this process prints the run's one-line error: the main process of its machine (`local_main_process`).
    Every process of a machine that stops on a check stops alike, so its log gets the line once; a process of another
    machine may stop on its own (its local files, its disk, what it read in a shared output_dir), and its line is the
    only word of why."""
    return local_main_process()


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point: `python train_translation.py configs/NAME.yaml [--name value ...]`."""
    try:
        run(sys.argv[1:] if argv is None else argv)
    except (ConfigError, DatasetSchemaError, OutputDirError, HubPushError, PreflightError, PreparationError) as error:
        if _prints_errors():  # one line per machine under accelerate launch
            print(f"{PROGRAM}: error: {error}", file=sys.stderr)
        sys.exit(2)
    except NonFiniteLossError as error:
        print(f"{PROGRAM}: error: {error}", file=sys.stderr)
        sys.exit(1)
    except TrainingStoppedError as error:   # exit status as a process the SIGTERM had ended: 128 + 15
        if _prints_errors():   # the processes agree on the stop (TranslationTrainer): one line per machine
            print(f"{PROGRAM}: error: {error}", file=sys.stderr)
        sys.exit(128 + signal.SIGTERM)
    # Under accelerate launch: no rank may exit (and tear gloo/NCCL down in the interpreter's shutdown, which can
    # abort with SIGABRT) while another still runs.
    state = PartialState()
    state.wait_for_everyone()
    state.destroy_process_group()


if __name__ == "__main__":
    main()
