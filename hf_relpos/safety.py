"""Fault handling for training runs: an output-folder preflight (writable, enough free space), the error raised on a
non-finite training loss, and moving a staged model folder into place so that a kill mid-way never leaves a folder
that loads as if complete; text files written atomically. See docs/reliability.md."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# train_translation.py saves the final model here inside output_dir, then moves it in (`move_folder_contents`).
FINAL_MODEL_STAGING = ".final-model-staging"


class OutputDirError(ValueError):
    """output_dir cannot hold the run's results: not a folder, not writable, or too little free space."""


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; training stops before the weights are updated with it."""

    def __init__(self, value: float, step: int, epoch: float) -> None:
        super().__init__(
            f"training loss is {value} at step {step} (epoch {epoch:.2f}); training stopped and no final model was "
            f"saved (checkpoints written before this step are intact). Lower learning_rate, raise warmup_steps or "
            f"check the data, then resume from the last checkpoint or start again."
        )
        self.value = value
        self.step = step


def format_bytes(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000:
            return f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"


def check_output_dir(output_dir: str | os.PathLike, required_bytes: int = 0) -> None:
    """Raise `OutputDirError` unless `output_dir` (or, if it does not exist yet, its nearest existing parent) is a
    folder in which a file can be created and deleted, on a disk with at least `required_bytes` free.

    Nothing is left behind: the probe is a temporary folder removed again, and `output_dir` itself is not created.
    """
    path = Path(output_dir).absolute()
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise OutputDirError(f"output_dir {str(path)!r}: {str(existing)!r} is a file, not a folder")
    try:
        probe = Path(tempfile.mkdtemp(prefix=".write-test-", dir=existing))
        try:
            (probe / "probe").write_bytes(b"0")
        finally:
            shutil.rmtree(probe, ignore_errors=True)
    except OSError as error:
        raise OutputDirError(
            f"output_dir {str(path)!r} is not writable: cannot create files in {str(existing)!r} ({error.strerror})"
        ) from None
    free = shutil.disk_usage(existing).free
    if required_bytes > free:
        raise OutputDirError(
            f"output_dir {str(path)!r}: only {format_bytes(free)} free on its disk, but the run needs about "
            f"{format_bytes(required_bytes)} (final model and checkpoints with optimizer state); free some space, "
            f"lower save_total_limit or choose another output_dir"
        )


def move_folder_contents(staging: str | os.PathLike, target: str | os.PathLike, last: str) -> None:
    """Move every file of `staging` into `target` (replacing files of the same name), then remove `staging`.

    `target/last` is deleted first and moved in last, each move being an atomic `os.replace`: if the process dies
    mid-way, `target` lacks `last` (for a model folder, its weights: it does not load) instead of mixing old and new
    files into a folder that loads.
    """
    staging, target = Path(staging), Path(target)
    (target / last).unlink(missing_ok=True)
    for item in sorted(staging.iterdir(), key=lambda path: path.name == last):
        if not item.is_file():
            raise ValueError(f"{str(item)!r}: only files can be moved into {str(target)!r}")
        os.replace(item, target / item.name)
    staging.rmdir()


@contextmanager
def staged_folder(output_dir: str | os.PathLike) -> Iterator[Path]:
    """A new temporary folder beside `output_dir` to fill; when the block ends without an error it is renamed to
    `output_dir` (which must not exist, or be an empty folder), else removed: `output_dir` is never half-written."""
    output_dir = Path(output_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", dir=output_dir.parent))
    try:
        yield staging
        if output_dir.exists():
            output_dir.rmdir()
        os.replace(staging, output_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` through a temporary file of its own in the same folder and an atomic `os.replace`: the
    file is either the old one or the whole new one, even with several processes writing it at once; a failed write
    removes its temporary file."""
    path = Path(path)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with open(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
