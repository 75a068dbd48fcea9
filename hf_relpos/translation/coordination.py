"""Process coordination across the ranks of one launch by marker files: the local main process runs a block first
(downloads, tokenizer training, data preparation) while the others poll for its marker file, with no time limit,
instead of waiting in a collective that `ddp_timeout` would end; a rank that fails leaves a marker on which the
waiting ranks stop at once."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from .arguments import TranslationTrainingArguments
from .preflight import ProcessGroupError

logger = logging.getLogger(__name__)

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
