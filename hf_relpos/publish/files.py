"""Writing folders and files so that nothing half-written is ever left: a folder filled beside its destination and
renamed in (`staged_folder`), files moved into a folder with the one that makes it loadable last
(`move_folder_contents`), text files replaced atomically (`write_text_atomic`)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


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
