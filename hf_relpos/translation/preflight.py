"""Checks of the environment a training run needs, made before anything is read, trained or written: that every
process of a launched job takes part in training, that a rerun does not silently overwrite a trained model, and that
the Hub login a `push_to_hub` run needs exists. Each failure is one `PreflightError` line."""

from __future__ import annotations

import fnmatch
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from huggingface_hub import HfApi, get_token, is_offline_mode, try_to_load_from_cache
from huggingface_hub.errors import GatedRepoError, HFValidationError, RepositoryNotFoundError
from huggingface_hub.utils import validate_repo_id
from transformers.tokenization_utils_base import TOKENIZER_CONFIG_FILE
from transformers.utils import CONFIG_NAME, GENERATION_CONFIG_NAME, SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from ..model.attention_functions import check_kernel_device
from ..publish.hub import CARD_FILE, public_repository_refusal
from .checkpoints import CHECKPOINT_PATTERN, find_checkpoints, last_complete_checkpoint
from .safety import FINAL_MODEL_DESCRIPTIONS, FINAL_MODEL_STAGING, OutputDirError

logger = logging.getLogger(__name__)

CHECKPOINT_GLOB = "checkpoint-*"
# Files of a finished model: a folder holding one of them loads (or half-loads) as a trained model.
FINISHED_MODEL_FILES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, CONFIG_NAME)
# Seconds the one request of a Hub check (`check_model_source`, `data.check_hub_dataset`) waits for an answer.
HUB_TIMEOUT_SECONDS = 10
# Files of a Hub model of which one in the local Hub cache makes it load without the Hub (a model's, a tokenizer's).
CACHED_MODEL_FILES = (CONFIG_NAME, TOKENIZER_CONFIG_FILE)


class PreflightError(RuntimeError):
    """The environment cannot run this job as asked; raised before anything is written."""


class ProcessGroupError(PreflightError):
    """The processes of a launched job would not train together; every process raises it."""


def missing_local_folder(model: str) -> Path | None:
    """The existing folder that lacks `model` when `model` is meant as a local path (it starts like a path: '.', '/',
    '~'; it has more parts than a Hub id's namespace/name; or it is namespace/name whose namespace is an existing
    folder), so a mistyped folder is one error instead of a Hub lookup; else None (a bare name such as `t5-small`
    stays a Hub id)."""
    path = Path(model).expanduser()
    if path.exists():
        return None
    if model.startswith((".", "/", "~")) or len(path.parts) > 2 or (len(path.parts) == 2 and path.parent.is_dir()):
        return next((parent for parent in path.parents if parent.is_dir()), Path("."))
    return None


def check_local_folder(value: str, setting: str, hub_kind: str = "model") -> None:
    """A ValueError naming `setting` when `value` is meant as a local folder that does not exist
    (`missing_local_folder`); a Hub id passes."""
    if (nearest := missing_local_folder(value)) is not None:
        raise ValueError(f"{setting} {value!r}: no such folder (the nearest existing folder is '{nearest}'); a Hub "
                         f"{hub_kind} id has the form owner/name")


def check_model_source(value: str, setting: str, cache_dir: str | None = None) -> None:
    """A ValueError naming `setting` (one line) unless `value` is an existing folder, a name that is no Hub id (left to
    the loader), a Hub model in the local Hub cache (`cache_dir`, else the default one), or a Hub model that the Hub
    confirms in one request without retries (`HUB_TIMEOUT_SECONDS`): transformers' loaders retry an unreachable Hub
    for half a minute to a minute before their own error. With HF_HUB_OFFLINE the Hub is not asked. A cached model
    loads as before where the Hub cannot be reached (after the loaders' retries, for minutes), with one warning that
    says so. A mistyped folder is `check_local_folder`'s error."""
    check_local_folder(value, setting)
    if Path(value).expanduser().exists():
        return
    try:
        validate_repo_id(value)
    except HFValidationError:
        return
    cached = any(isinstance(try_to_load_from_cache(value, name, cache_dir=cache_dir), str) for name in CACHED_MODEL_FILES)
    if is_offline_mode():
        if cached:
            return
        raise ValueError(f"{setting} {value!r} is neither a local folder nor a Hub model in the local cache, and "
                         "HF_HUB_OFFLINE is set (the Hub is not asked): give a saved model folder, or unset "
                         "HF_HUB_OFFLINE to download it")
    try:
        HfApi().model_info(value, timeout=HUB_TIMEOUT_SECONDS)
    except GatedRepoError:   # a RepositoryNotFoundError too: asked first
        if cached:
            return
        raise ValueError(f"{setting} {value!r} is a gated model on the Hugging Face Hub: accept its conditions on its "
                         "Hub page and log in with `hf auth login`") from None
    except RepositoryNotFoundError:
        if cached:   # the loader decides on a cached copy of a repository the Hub no longer shows this user
            return
        raise ValueError(f"{setting} {value!r} is neither a local folder nor a model on the Hugging Face Hub (or it "
                         "is private: log in with `hf auth login`): give a saved model folder or a Hub model id "
                         "(owner/name)") from None
    except Exception as error:  # noqa: BLE001 - connection, DNS, proxy, timeout: the Hub cannot be used now
        reason = f"the Hugging Face Hub cannot be reached ({type(error).__name__}: {' '.join(str(error).split())})"
        if cached:
            logger.warning("%s %r: %s; it loads from the local cache once the loaders' retries of the Hub give up "
                           "(minutes); set HF_HUB_OFFLINE=1 to load it from there at once", setting, value, reason)
            return
        raise ValueError(f"{setting} {value!r} is neither a local folder nor a Hub model in the local cache, and "
                         f"{reason}: connect to the network, or give a saved model folder (HF_HUB_OFFLINE=1 loads a "
                         "Hub model from the local cache without asking the Hub)") from None


def check_process_group(trainer_world_size: int) -> None:
    """A job launched with N processes (an initialised torch.distributed group of N) whose Trainer runs on one
    process would train N independent copies that all write the same output_dir: the case of
    `accelerate launch --multi_gpu` on a machine without GPUs, where the Trainer picks no distributed backend unless
    told `use_cpu: true`."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    group_size = torch.distributed.get_world_size()
    if group_size != trainer_world_size:
        raise ProcessGroupError(
            f"a torch.distributed process group of {group_size} processes is initialised, but the Trainer uses world "
            f"size {trainer_world_size}: each process would train alone and write the same output_dir. On CPU, "
            f"pass --use_cpu true (accelerate launch --config_file configs/accelerate/cpu_2proc.yaml "
            f"train_translation.py CONFIG.yaml --use_cpu true); on GPUs, check that CUDA is available")


def fsdp_launch() -> bool:
    """Whether `accelerate launch` was given an FSDP config (configs/accelerate/fsdp.yaml): it sets
    ACCELERATE_USE_FSDP in every process it starts."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def check_sharding(trainer_world_size: int, device: torch.device) -> None:
    """An FSDP launch whose processes train on the CPU (`--use_cpu true`): accelerate shards only over accelerators
    (its AcceleratorState selects FSDP for multi-GPU-like process groups, never for MULTI_CPU), so each process would
    hold and train the whole model as plain data parallelism (DDP), without a word, and the run would be recorded as
    sharded."""
    if trainer_world_size > 1 and fsdp_launch() and device.type == "cpu":
        raise PreflightError(
            f"an FSDP launch (ACCELERATE_USE_FSDP, e.g. configs/accelerate/fsdp.yaml) of {trainer_world_size} "
            "processes on the CPU (use_cpu): accelerate shards only over GPUs, and these processes would train "
            "unsharded copies of the model (DDP). For a CPU run launch with configs/accelerate/cpu_2proc.yaml; for "
            "FSDP, launch on GPUs without --use_cpu")


def check_kernel_runs_here(kernel: str | None, device: torch.device, training: bool) -> None:
    """The attention kernel the run asks for runs on the device it trains and evaluates on (`check_kernel_device`:
    relpos_triton needs CUDA and triton; a run that trains needs the kernel's backward, which flex_attention lacks
    on the CPU): checked before the tokenizer is trained and the data prepared, not by the model's first forward or
    backward."""
    try:
        check_kernel_device(kernel, device, backward=training)
    except (RuntimeError, ImportError) as error:
        raise PreflightError(str(error)) from None


def check_precision_runs_here(fp16: bool, device: torch.device) -> None:
    """fp16 (float16 autocast with a gradient scaler) on a device accelerate runs it on: on the CPU accelerate leaves
    it off without a word, so the run would train in float32 while its record and card say fp16."""
    if fp16 and device.type == "cpu":
        raise PreflightError("fp16 (float16 autocast) runs on GPUs, not on 'cpu': accelerate would leave it off and "
                             "the run train in float32 while its record and card say fp16; set fp16 false (bf16 "
                             "true with use_cpu true trains in bf16 autocast on a CPU)")


def finished_model_files(output_dir: str | os.PathLike) -> list[str]:
    """The files of a finished model (`FINISHED_MODEL_FILES`) that `output_dir` holds."""
    folder = Path(output_dir)
    return [name for name in FINISHED_MODEL_FILES if (folder / name).is_file()] if folder.is_dir() else []


def previous_run(output_dir: str | os.PathLike) -> list[str]:
    """What a finished or interrupted training run left in `output_dir`: model files and checkpoint folders."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    return finished_model_files(folder) + [path.name for path in find_checkpoints(folder)]


def check_rerun(output_dir: str | os.PathLike, overwrite: bool, resuming: bool,
                starts_from: dict[str, str | None] | None = None) -> None:
    """A training run into a folder that holds a trained model or checkpoints must say what it means: resume, or
    start again (`overwrite_output_dir`). Silently training from step 0 over them loses them. A fresh run never starts
    from what it removes (`starts_from`: setting -> the model or tokenizer folder it names)."""
    if overwrite:
        check_fresh_run_keeps(output_dir, starts_from or {})
    if overwrite or resuming:
        return
    found = previous_run(output_dir)
    if found:
        shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        if last_complete_checkpoint(output_dir) is not None:
            resume = "continue from its newest checkpoint with --resume_from_checkpoint last"
        else:
            resume = ("it has no complete checkpoint to continue from with --resume_from_checkpoint last "
                      "(save_strategy: steps keeps some); train on from its model with --model_name_or_path")
        raise OutputDirError(
            f"output_dir {str(output_dir)!r} already holds a trained model or checkpoints ({shown}): {resume}, train "
            f"from scratch with --overwrite_output_dir true (the old model and checkpoints are removed when the new "
            f"run starts writing), or choose another output_dir")


def check_hub_login(token: str | None) -> str:
    """The Hub user a `push_to_hub` run will push as, checked before training (the push happens after it); raises
    PreflightError when there is no valid login or the Hub cannot be reached."""
    token = token or get_token()
    if token is None:
        raise PreflightError("push_to_hub needs a Hugging Face login and none was found: run `hf auth login` (or set "
                             "HF_TOKEN, or hub_token) before training, or set push_to_hub: false")
    try:
        return HfApi(token=token).whoami()["name"]
    except Exception as error:  # noqa: BLE001 - any failure here means the push after training would fail too
        raise PreflightError(f"push_to_hub: the Hugging Face login could not be checked ({type(error).__name__}: "
                             f"{' '.join(str(error).split())}); fix it before training, or set push_to_hub: "
                             f"false") from None


def check_private_hub_repository(token: str | None, repository: str, user: str) -> None:
    """PreflightError, before training, where a push_to_hub run asks for a private repository (hub_private_repo:
    true) and its `repository` (`hub_repository`; one without a namespace is `user`'s) exists and is public: the push
    after training would be refused (`public_repository_refusal`)."""
    repo_id = repository if "/" in repository else f"{user}/{repository}"
    try:
        refusal = public_repository_refusal(HfApi(token=token or get_token()), repo_id)
    except Exception as error:  # noqa: BLE001 - any failure here means the push after training would fail too
        raise PreflightError(f"push_to_hub: the Hub repository {repo_id!r} could not be looked up "
                             f"({type(error).__name__}: {' '.join(str(error).split())}); fix it before training, or "
                             "set push_to_hub: false") from None
    if refusal is not None:
        raise PreflightError(f"push_to_hub: {refusal} before training, or set hub_private_repo: false to publish the "
                             "model publicly")


# What a run of train_translation.py writes into output_dir and a fresh run (overwrite_output_dir) removes first (its
# record too, which hf-relpos-average would otherwise take for the new run's checkpoints); the generated demo corpus
# stays (it is regenerated identically from demo_seed).
PREVIOUS_RUN_PATTERNS = (
    CHECKPOINT_GLOB, "model*.safetensors", SAFE_WEIGHTS_INDEX_NAME, CONFIG_NAME, GENERATION_CONFIG_NAME,
    "tokenizer*.json", "special_tokens_map.json", "added_tokens.json", "training_args.bin", FINAL_MODEL_STAGING,
    *FINAL_MODEL_DESCRIPTIONS,
)


# The files among them (a run writes each at its end): checkpoints and the staging are folders.
RUN_FILE_PATTERNS = tuple(pattern for pattern in PREVIOUS_RUN_PATTERNS
                          if pattern not in (CHECKPOINT_GLOB, FINAL_MODEL_STAGING))


# what to do with an entry of output_dir under a name the run writes to, which is not what the run writes there
MISPLACED_ENTRY_REMEDY = ("move it elsewhere, choose another output_dir, or start afresh with --overwrite_output_dir "
                          "true (which removes it with the previous run)")


def check_run_file_names(output_dir: str | os.PathLike, training: bool) -> None:
    """OutputDirError when output_dir holds a folder (or a pipe, a link to nothing, ...) under a name the run writes
    a file to (`RUN_FILE_PATTERNS`: config.json, test_results.json, README.md, ...): writing it would fail after the
    whole training, or the final model's replacement of its old record and scores would delete the folder; or, for a
    `training` run, a file (or a link to nothing) under a name it writes a folder to (`checkpoint-<step>`,
    `FINAL_MODEL_STAGING`), where its first save would fail after training. A fresh run (overwrite_output_dir) removes
    such entries with the rest of the previous run instead."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return
    for path in matching_entries(folder, RUN_FILE_PATTERNS):
        if not path.is_file():   # through links: a link to a file is written through as before
            kind = "a folder" if path.is_dir() else "an entry that is not a file"
            raise OutputDirError(f"output_dir {str(output_dir)!r} holds {kind} {path.name!r} where the run writes a "
                                 f"file: {MISPLACED_ENTRY_REMEDY}")
    for path in sorted(folder.iterdir()) if training else []:
        if (CHECKPOINT_PATTERN.match(path.name) or path.name == FINAL_MODEL_STAGING) and not path.is_dir():
            kind = "a file" if path.is_file() else "an entry that is not a folder"
            raise OutputDirError(f"output_dir {str(output_dir)!r} holds {kind} {path.name!r} where the run writes a "
                                 f"folder: {MISPLACED_ENTRY_REMEDY}")


def check_no_foreign_card(output_dir: str | os.PathLike) -> None:
    """OutputDirError when output_dir holds a README.md (`CARD_FILE`) but no trained model or checkpoints
    (`previous_run`): no run's model card but the folder's own (output_dir '.' in a project, a folder of notes), which
    a run training from step 0 deletes for its model card when it saves its final model. A fresh run
    (overwrite_output_dir) removes it with the rest of the previous run instead."""
    if (Path(output_dir) / CARD_FILE).is_file() and not previous_run(output_dir):
        raise OutputDirError(
            f"output_dir {str(output_dir)!r} holds a {CARD_FILE} but no trained model or checkpoints: it is no model "
            "card of a run there, and the run would replace it with its own when it saves its final model; move it "
            "elsewhere, choose another output_dir, or start afresh with --overwrite_output_dir true (which removes it)")


def check_fresh_run_keeps(output_dir: str | os.PathLike, starts_from: dict[str, str | None]) -> None:
    """OutputDirError when a folder of `starts_from` (setting -> path, e.g. model_name_or_path) is output_dir or in
    what `remove_previous_run` deletes from it (a checkpoint): the fresh run would delete the model or tokenizer it
    starts from, before training on it, and lose it for good if the run then failed."""
    folder = Path(output_dir).resolve()
    for setting, given in starts_from.items():
        path = None if given is None else Path(given).expanduser().resolve()
        if path is None or not path.is_relative_to(folder):
            continue
        inside = path.relative_to(folder).parts
        if not inside or any(fnmatch.fnmatch(inside[0], pattern) for pattern in PREVIOUS_RUN_PATTERNS):
            raise OutputDirError(
                f"{setting} {given!r} is {'in ' if inside else ''}output_dir {str(output_dir)!r}: a fresh run "
                f"(overwrite_output_dir) deletes the previous run there before training, and with it the "
                f"{setting.partition('_')[0]} it starts from; choose another output_dir, or copy {given!r} elsewhere "
                "first")


def remove_previous_run(output_dir: str | os.PathLike) -> list[str]:
    """Delete what an earlier run left in `output_dir` (model, checkpoints, tokenizer, results, card); returns the
    names removed. Called by a fresh run only when every check has passed and it starts writing."""
    return remove_matching(output_dir, PREVIOUS_RUN_PATTERNS)


def remove_matching(folder: str | os.PathLike, patterns: Sequence[str]) -> list[str]:
    """Delete the files and folders of `folder` that match `patterns` (globs), pattern by pattern; returns their
    names."""
    removed = []
    for path in matching_entries(folder, patterns):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        removed.append(path.name)
    return removed


def matching_entries(folder: str | os.PathLike, patterns: Sequence[str]) -> list[Path]:
    """The entries of `folder` whose names match `patterns` (globs), pattern by pattern, each once, links to nothing
    included (`Path.glob` leaves out such a link when the pattern is a plain name, such as README.md)."""
    folder = Path(folder)
    entries = sorted(folder.iterdir()) if folder.is_dir() else []
    return list(dict.fromkeys(path for pattern in patterns for path in entries
                              if fnmatch.fnmatchcase(path.name, pattern)))
