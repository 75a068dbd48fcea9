"""Writing folders and files so that nothing half-written is ever left: a folder filled beside its destination and
renamed in (`staged_folder`), files moved into a folder with the one that makes it loadable last
(`move_folder_contents`), files replaced atomically (`atomic_file`, `write_text_atomic`), and this process's open
descriptors (/dev/stdout) written through as the shell opened them (`text_output`). What these stage (and the weights
that safetensors writes owner-only) gets the modes an ordinary `open()` / `mkdir()` gives under the process umask
(`apply_umask_mode`), so a serving account or a group can read a saved model when the umask lets them. Each
temporary is named after the process that owns it (`owned_prefix`), so the next write of the same destination
removes those a killed process left (`remove_abandoned`) instead of letting them fill the disk. A weights file that
does not read (a kill cut it short, or it is corrupt) is one `WeightsFileError` wherever it is read (`reading_weights`)."""

from __future__ import annotations

import glob
import io
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import BinaryIO, TextIO

from safetensors import SafetensorError
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME


class WeightsFileError(ValueError):
    """A safetensors weights file that does not read: cut short (a kill while it was written) or corrupt."""


@contextmanager
def reading_weights(name: str | None = None) -> Iterator[None]:
    """Inside, safetensors' error for a weights file cut short or corrupt (from `from_pretrained`, `load_file` or
    `safe_open`) is a `WeightsFileError` saying so, with the file's `name` where the caller reads one file of a
    folder (one shard of several); the caller names the folder and what to do."""
    try:
        yield
    except SafetensorError as error:
        named = "" if name is None else f" {name}"
        raise WeightsFileError(f"its weights file{named} is cut short or corrupt ({error})") from None


def process_umask() -> int:
    """The process umask: read from /proc/self/status where Linux gives it, else by setting it (to the restrictive
    0o077 for that instant, which another thread creating a file then would get) and restoring it."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0o077)
    os.umask(umask)
    return umask


def apply_umask_mode(path: str | os.PathLike) -> None:
    """Give the file or folder `path` the mode `open()` (0o666) or `mkdir()` (0o777) would have created it with
    under the process umask; for what `tempfile` (always owner-only) or safetensors staged."""
    path = Path(path)
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~process_umask())


def apply_umask_mode_to_weights(folder: str | os.PathLike) -> None:
    """`apply_umask_mode` on the safetensors weights (and shard index) of a model folder just saved: safetensors
    writes them through an owner-only temporary file whatever the umask."""
    folder = Path(folder)
    for path in [*folder.glob("*.safetensors"), folder / SAFE_WEIGHTS_INDEX_NAME]:
        if path.is_file():
            apply_umask_mode(path)


def process_alive(pid: int) -> bool:
    """Whether process `pid` of this machine still runs (one of another user counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owned_prefix(tag: str) -> str:
    """How the name of a temporary begins: `tag` (`.NAME.` for one that stands in for NAME), then `HOST-PID-`,
    naming this process."""
    return f"{tag}{socket.gethostname()}-{os.getpid()}-"


def abandoned_temporaries(folder: str | os.PathLike, tag: str) -> list[Path]:
    """The temporaries `owned_prefix(tag)` names in `folder` whose process on this machine is gone: what a write
    killed part-way (SIGKILL, out of memory) left. Those of running processes and other machines are not."""
    host_prefix = f"{tag}{socket.gethostname()}-"
    abandoned = []
    for temporary in Path(folder).glob(f"{glob.escape(host_prefix)}*"):
        pid = temporary.name[len(host_prefix):].split("-")[0]
        if pid.isdigit() and not process_alive(int(pid)):
            abandoned.append(temporary)
    return abandoned


def remove_abandoned(folder: str | os.PathLike, tag: str) -> list[Path]:
    """Remove the `abandoned_temporaries` of `tag` in `folder`. Returns the paths removed."""
    removed = abandoned_temporaries(folder, tag)
    for abandoned in removed:
        if abandoned.is_dir() and not abandoned.is_symlink():
            shutil.rmtree(abandoned, ignore_errors=True)
        else:
            abandoned.unlink(missing_ok=True)
    return removed


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


def nearest_existing_folder(path: str | os.PathLike, setting: str) -> Path:
    """The nearest of `path` (made absolute) and its parents that exists, which must be a folder for `path` to be made
    or filled: ValueError naming `setting` when it is a file, or a link to nothing (no folder can be made through it)."""
    path = Path(path).absolute()
    existing = path
    while not existing.exists():
        if existing.is_symlink():
            raise ValueError(f"{setting} {str(path)!r}: {str(existing)!r} is a link to {os.readlink(existing)!r}, "
                             "which does not exist; create that folder or remove the link")
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{setting} {str(path)!r}: {str(existing)!r} is a file, not a folder")
    return existing


def creation_error(folder: str | os.PathLike) -> OSError | None:
    """The OSError that creating a file in the existing folder `folder` gives (no permission, a read-only mount), or
    None where one can be created and deleted. Nothing is left behind: the probe is a temporary folder removed again."""
    try:
        probe = Path(tempfile.mkdtemp(prefix=".write-test-", dir=folder))
        try:
            (probe / "probe").write_bytes(b"0")
        finally:
            shutil.rmtree(probe, ignore_errors=True)
    except OSError as error:
        return error
    return None


def staging_tag(output_dir: str | os.PathLike) -> str:
    """How the names of `staged_folder`'s temporaries for `output_dir` begin (before `owned_prefix`'s HOST-PID-)."""
    return f".{Path(output_dir).resolve().name}."


def unfilled_entries(output_dir: str | os.PathLike) -> list[Path]:
    """What the existing folder `output_dir` holds besides what `staged_folder` would remove before filling it: the
    staging of a fill that was killed (SIGKILL, out of memory) on this machine. Empty: the folder can be filled."""
    abandoned = set(abandoned_temporaries(output_dir, staging_tag(output_dir)))
    return sorted(entry for entry in Path(output_dir).iterdir() if entry not in abandoned)


@contextmanager
def staged_folder(output_dir: str | os.PathLike, last: str) -> Iterator[Path]:
    """A new temporary folder to fill for `output_dir` (which must not exist, or be an empty folder); removed if the
    block raises, with the missing parents it made (`make_missing_folders`) that are still empty. A new `output_dir`
    is staged beside it and renamed to it: never half-written. An existing empty folder is kept, as a mount point or a
    working folder must be: staged inside it and filled file by file with `last` moved in last
    (`move_folder_contents`), so a fill cut short lacks `last` (for a model folder, a file it cannot load without).
    `output_dir` is the folder it names (`Path.resolve`): a link to it stays a link, and `.` or `a/b/..` is the folder
    meant."""
    output_dir = Path(output_dir).resolve()
    fill_in_place = output_dir.is_dir()
    beside = output_dir if fill_in_place else output_dir.parent
    made = make_missing_folders(beside)
    try:
        tag = staging_tag(output_dir)
        remove_abandoned(beside, tag)
        staging = Path(tempfile.mkdtemp(prefix=owned_prefix(tag), dir=beside))
        try:
            apply_umask_mode(staging)
            yield staging
            if fill_in_place:
                move_folder_contents(staging, output_dir, last)
            else:
                os.replace(staging, output_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        remove_empty_folders(made)
        raise


def make_missing_folders(folder: Path) -> list[Path]:
    """Create `folder` and its missing parents, as `mkdir(parents=True, exist_ok=True)` does; returns the folders this
    call created, outermost first (one that another process created meanwhile is not among them). If a creation
    fails, those this call made are removed again (`remove_empty_folders`)."""
    missing = []
    for path in (folder, *folder.parents):
        if path.exists():
            break
        missing.append(path)
    if not missing:
        folder.mkdir(exist_ok=True)   # a file there: mkdir's FileExistsError
        return []
    made: list[Path] = []
    try:
        for path in reversed(missing):
            try:
                path.mkdir()
            except FileExistsError:
                if not path.is_dir():
                    raise
                continue
            made.append(path)
    except BaseException:
        remove_empty_folders(made)
        raise
    return made


def remove_empty_folders(made: list[Path]) -> None:
    """Remove the folders `make_missing_folders` made, innermost first, each only while it is empty: one that holds
    something (another process wrote there meanwhile) is kept, and so are the folders above it."""
    for path in reversed(made):
        try:
            path.rmdir()
        except OSError:
            return


def expand_home(path: str | None) -> str | None:
    """`path` with a leading `~` or `~user` expanded to that home folder (`os.path.expanduser`), as a shell expands
    it; None stays None. For paths a shell never saw: recipe values, quoted flags, Python arguments."""
    return None if path is None else os.path.expanduser(path)


def named_descriptor(path: str | os.PathLike) -> int | None:
    """The open file descriptor of this process that `path` names, itself or through links (/dev/stdout, /dev/fd/3,
    /proc/self/fd/1), else None."""
    path = Path(os.path.abspath(path))
    descriptors = Path(f"/proc/{os.getpid()}/fd")
    for _ in range(40):   # the kernel's limit on links followed
        folder = Path(os.path.realpath(path.parent))
        if folder == descriptors and path.name.isdigit():
            return int(path.name)
        if not (folder / path.name).is_symlink():
            return None
        path = folder / os.readlink(folder / path.name)
    return None


def writes_in_place(path: str | os.PathLike) -> bool:
    """Whether `path` is written through rather than replaced: one of this process's open descriptors
    (`named_descriptor`: /dev/stdout, which the shell may have opened on a file with `>>`), or an existing file that
    is not a regular one, named itself or through links (a pipe, a terminal, a device), which a rename would replace
    by a plain file."""
    path = Path(path)
    return named_descriptor(path) is not None or (path.exists() and not path.is_file())


@contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """A new empty file beside `path` (with the mode `open()` gives under the umask) for the block to write; when the
    block ends without an error it replaces `path` in one atomic `os.replace`, else it is removed: `path` is the old
    file or the whole new one, never a part of it, even with several processes writing it at once. A link stays a
    link: the file it leads to is the one replaced. A path that `writes_in_place` is given to the block itself."""
    if writes_in_place(path):
        yield Path(path)
        return
    path = Path(os.path.realpath(path))
    tag = f".{path.name}."
    remove_abandoned(path.parent, tag)
    descriptor, temporary = tempfile.mkstemp(prefix=owned_prefix(tag), suffix=".partial", dir=path.parent)
    os.close(descriptor)
    try:
        apply_umask_mode(temporary)
        yield Path(temporary)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


@contextmanager
def text_output(path: str | os.PathLike,
                compressor: Callable[[BinaryIO], BinaryIO] | None = None) -> Iterator[TextIO]:
    """A UTF-8 text file to write `path` through: this process's descriptor that `path` names, as it is open (`>>`
    appends, `>` writes on from where it is: nothing earlier is cut); else an existing file that is not a regular one
    (a pipe), opened; else `atomic_file`'s temporary, which replaces `path` only when the block ends without an
    error. With `compressor` (a writer over the file's bytes, as `gzip.GzipFile`), the text is compressed by it as
    it is written, and the compressed stream ended (closed) before the temporary replaces `path`."""
    descriptor = named_descriptor(path)
    if compressor is not None:
        with ExitStack() as stack:
            if descriptor is not None:
                file = stack.enter_context(os.fdopen(os.dup(descriptor), "wb"))
            else:
                file = stack.enter_context(open(stack.enter_context(atomic_file(path)), "wb"))
            yield stack.enter_context(io.TextIOWrapper(stack.enter_context(compressor(file)), encoding="utf-8"))
        return
    if descriptor is not None:
        with os.fdopen(os.dup(descriptor), "w", encoding="utf-8") as output:
            yield output
        return
    with atomic_file(path) as temporary, open(temporary, "w", encoding="utf-8") as output:
        yield output


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` (UTF-8) to `path` through `atomic_file`: the file is either the old one or the whole new one; a
    failed write removes its temporary file."""
    with atomic_file(path) as temporary:
        temporary.write_text(text, encoding="utf-8")
