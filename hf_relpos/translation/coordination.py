"""Process coordination across the ranks of one launch: the process that writes output_dir runs a block first
(downloads, tokenizer training, data preparation) while the others wait for it with no time limit, instead of in a
collective that `ddp_timeout` would end; a rank that fails tells the waiting ones, which stop at once. On one machine
(or with `save_on_each_node`, a folder on each machine) that is each machine's local main process, and the others
poll for its marker file in the temporary folder; on several machines sharing output_dir it is process 0, and the
other processes wait in a gloo group of their own, without a time limit."""

from __future__ import annotations

import contextlib
import datetime
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
# The timeout of the gloo group in which processes on other machines wait for process 0: none in practice (a rank
# that fails or dies ends the wait at once).
NO_TIME_LIMIT = datetime.timedelta(days=365)


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


def _wait_for_work(work: torch.distributed.Work, desc: str, poll_seconds: float) -> None:
    """Return once the collective `work` has ended (no time limit, a log line every `TURN_LOG_SECONDS`);
    `ProcessGroupError` when it failed (a process of the group died)."""
    started = last_log = time.monotonic()
    while not work.is_completed():
        if time.monotonic() - last_log >= TURN_LOG_SECONDS:
            last_log = time.monotonic()
            logger.info("still waiting for the main process to finish %s (%.0f min)", desc,
                        (last_log - started) / 60)
        time.sleep(poll_seconds)
    try:
        work.wait()
    except RuntimeError as error:
        raise ProcessGroupError(f"another process failed or ended during {desc} ({error})") from None


@contextlib.contextmanager
def process_zero_first(group: torch.distributed.ProcessGroup, process_index: int, desc: str,
                       poll_seconds: float = TURN_POLL_SECONDS) -> Iterator[None]:
    """The block runs on process 0 first, then on every other process at once (they read what it saved), and every
    process leaves it once all have run it. The turns are collectives of `group` (gloo, created with
    `NO_TIME_LIMIT`), waited for by polling, not a barrier that `ddp_timeout` bounds: process 0 broadcasts whether
    its block ran, then every process adds whether its own did. A process whose block raises says so, and the
    others raise `ProcessGroupError`."""
    ran = torch.ones(1, dtype=torch.int64)

    def share(op: str) -> bool:
        """Whether every process (op "all") or process 0 (op "first") ran its block."""
        status = ran.clone()
        if op == "first":
            work = torch.distributed.broadcast(status, src=0, group=group, async_op=True)
        else:
            work = torch.distributed.all_reduce(status, op=torch.distributed.ReduceOp.MIN, group=group,
                                                async_op=True)
        _wait_for_work(work, desc, poll_seconds)
        return bool(status.item())

    first = process_index == 0
    if not first and not share("first"):
        raise ProcessGroupError(f"the main process failed during {desc}; its error is in its machine's log")
    try:
        yield
    except BaseException:
        ran.zero_()
        with contextlib.suppress(ProcessGroupError):   # this process's own error is the one to raise
            share("first" if first else "all")
        raise
    if first:
        share("first")
    if not share("all"):
        raise ProcessGroupError(f"another process failed during {desc}; its error is in its machine's log")


@contextlib.contextmanager
def main_process_first_without_timeout(training_args: TranslationTrainingArguments, desc: str) -> Iterator[None]:
    """`TrainingArguments.main_process_first` (the main process runs the block first: downloads, tokenizer
    training, tokenization caches, and it alone writes output_dir) without a barrier that `ddp_timeout` would end;
    one barrier follows, when every process has run the block.

    On one machine, and on several with `save_on_each_node` (an output_dir on each machine, written by its local main
    process), each machine's local main process goes first and the others wait through `local_main_first`'s marker
    files in the temporary folder. On several machines without it, output_dir is one folder they share (the Trainer
    then saves from process 0 alone, and every process reads its checkpoints): process 0, the one that writes it,
    goes first (`process_zero_first`), so that no process of another machine reads, or trains and prepares again,
    what process 0 is still replacing there (a fresh run's previous tokenizer)."""
    if training_args.world_size <= 1:
        yield
        return
    if not torch.distributed.is_initialized():  # other launchers (XLA): transformers' own turns
        with training_args.main_process_first(desc=desc):
            yield
        return
    state = training_args.distributed_state
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", state.num_processes))
    if state.num_processes > local_world_size and not training_args.save_on_each_node:
        group = torch.distributed.new_group(backend="gloo", timeout=NO_TIME_LIMIT)
        with process_zero_first(group, state.process_index, desc):
            yield
        torch.distributed.destroy_process_group(group)
        torch.distributed.barrier()
        return
    token = [uuid.uuid4().hex]
    torch.distributed.broadcast_object_list(token, src=0)  # one name for this launch's marker files
    prefix = Path(tempfile.gettempdir()) / f"hf_relpos-{token[0]}-{desc.replace(' ', '-')}"
    with local_main_first(prefix, state.local_process_index, local_world_size, desc):
        yield
    torch.distributed.barrier()
    if state.is_local_main_process:
        for rank in range(local_world_size):
            turn_marker(prefix, rank).unlink(missing_ok=True)
