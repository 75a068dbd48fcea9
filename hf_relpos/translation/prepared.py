"""Prepared data: each tokenized, filtered split of a run saved once as memory-mapped Arrow under
`output_dir/prepared_data/SPLIT-KEY/` (or `prepared_data_dir/SPLIT-KEY/`, shared by runs), where KEY is the SHA-256
of everything the split depends on (its data files' contents, the tokenizer, the length settings). A rerun, a later
training launch and every other process of a launch load it in seconds and share its pages through the page cache;
a change of any of those inputs gives another KEY, so stale data is never loaded.

A preparation writes into a `.partial-*` folder beside the final ones and renames a split's folder when its data and
manifest (written last) are on disk: an interrupted preparation leaves only a `.partial-*` folder, which no run
loads and the next preparation removes once its process is gone. In a run's own folder a split prepared under another
key is stale (older data or settings): it is renamed to a `.partial-*` name before its files are deleted, for the same
reason. In a shared `prepared_data_dir` every key is data some run uses: none is removed, and a run that finds its
key published by another run while it prepared the same split discards its own copy and loads that one.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datasets import Dataset, load_from_disk
from transformers import PreTrainedTokenizerBase

from ..publish.files import owned_prefix, remove_abandoned

logger = logging.getLogger(__name__)

PREPARED_FOLDER = "prepared_data"
# Raised whenever what a prepared folder holds changes meaning, so older folders are never loaded.
PREPARATION_FORMAT = 1
MANIFEST_FILE = "manifest.json"
PARTIAL_PREFIX = ".partial-"
HASH_CHUNK_BYTES = 8 << 20
# Free disk a preparation needs, in multiples of the text bytes it reads: at its peak the partial folder holds the
# text as Arrow (about 1x), the tokenized copy and the filtered final copy (int32 ids, about one token per 4-5
# characters, with offsets: each well under 1x).
DISK_PER_TEXT_BYTE = 3
# The errors of a write that found no room: a full disk, or the user's disk quota used up (a cluster's home or scratch).
NO_ROOM_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class PreparationError(OSError):
    """The data cannot be prepared in output_dir or prepared_data_dir (not enough free disk, or no quota left), or a
    prepared split there is damaged."""


@dataclass(frozen=True)
class PreparedStore:
    """Where a run's prepared splits are kept: `output_dir/prepared_data`, the run's own, where a split prepared under
    another key is stale and removed; or `prepared_data_dir` (`shared`), where runs with the same data, tokenizer and
    length settings find one preparation, and no run removes another key's split."""

    root: Path
    shared: bool

    @property
    def setting(self) -> str:
        """The argument that names the folder (for messages)."""
        return "prepared_data_dir" if self.shared else "output_dir"

    def folder(self, split: str, key: str) -> Path:
        """Where `split` prepared under `key` is kept."""
        return self.root / f"{split}-{key}"


def prepared_store(output_dir: str | os.PathLike, prepared_data_dir: str | os.PathLike | None) -> PreparedStore:
    """`prepared_data_dir` when given (shared), else `output_dir/prepared_data`."""
    if prepared_data_dir is not None:
        return PreparedStore(Path(prepared_data_dir), shared=True)
    return PreparedStore(Path(output_dir) / PREPARED_FOLDER, shared=False)


def files_sha256(paths: Iterable[str | os.PathLike], on_chunk: Callable[[int], Any] | None = None) -> str:
    """SHA-256 of the files' names and contents, read `HASH_CHUNK_BYTES` at a time (`on_chunk(bytes read)` after
    each: a progress bar)."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(f"{Path(path).name}\0{os.path.getsize(path)}\0".encode())
        with open(path, "rb") as handle:
            while chunk := handle.read(HASH_CHUNK_BYTES):
                digest.update(chunk)
                if on_chunk is not None:
                    on_chunk(len(chunk))
    return digest.hexdigest()


def preparation_key(inputs: dict[str, Any]) -> str:
    """The folder name of the data prepared from `inputs` (JSON-serialisable: digests and settings)."""
    text = json.dumps({"format": PREPARATION_FORMAT, **inputs}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def load_prepared(store: PreparedStore, split: str, key: str) -> tuple[Dataset, dict[str, Any]] | None:
    """(dataset, manifest) of `split` prepared under `key`, memory-mapped; None when there is none (a `.partial-*`
    folder is never one). A folder under the key is published whole (`publish_prepared`), so one whose manifest or
    data does not load was damaged since (files deleted by a scratch purge, an interrupted copy of the folder): one
    `PreparationError` naming it, which no rerun would get past, as a preparation cannot publish over it."""
    folder = store.folder(split, key)
    if not folder.exists():
        return None
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
        return load_from_disk(str(folder / "data")), manifest
    except (OSError, ValueError) as error:   # pyarrow's ArrowInvalid (a truncated file) is a ValueError
        raise PreparationError(f"the {split} data prepared in {folder} is damaged ({type(error).__name__}: "
                               f"{' '.join(str(error).split())}); remove that folder, and the run prepares the "
                               f"{split} split again") from None


@contextlib.contextmanager
def preparation(store: PreparedStore, text_bytes: int) -> Iterator[Path]:
    """A fresh `.partial-*` folder in `store` to prepare data in, removed when the block ends (with the folders it
    created in output_dir, when left empty: a shared folder stays, another run may be about to prepare in it; a full
    disk or a used-up quota, `NO_ROOM_ERRNOS`, becomes one `PreparationError`). Partial folders of preparations on
    this machine whose process is gone are removed first, and a `PreparationError` is raised at once when the disk
    has less than `DISK_PER_TEXT_BYTE * text_bytes` free."""
    root = store.root
    created = [] if store.shared else [folder for folder in (root.parent, root) if not folder.exists()]
    root.mkdir(parents=True, exist_ok=True)
    for stale in remove_abandoned(root, PARTIAL_PREFIX):
        logger.info("Removed %s, left by an interrupted preparation", stale)
    folder = partial_folder(root)
    needed = DISK_PER_TEXT_BYTE * text_bytes
    try:
        free = shutil.disk_usage(root).free
        if needed > free:
            raise PreparationError(errno.ENOSPC, f"preparing the data needs about {needed / 2**30:.1f} GiB free in "
                                   f"{root} ({DISK_PER_TEXT_BYTE} x the {text_bytes / 2**30:.2f} GiB of text), but "
                                   f"only {free / 2**30:.1f} GiB are free; free some space or choose another "
                                   f"{store.setting}")
        folder.mkdir()
        yield folder
    except OSError as error:
        if error.errno in NO_ROOM_ERRNOS and not isinstance(error, PreparationError):
            raise PreparationError(error.errno, f"the disk of {root} filled up (or the quota there ran out) "
                                   f"while preparing the data ({error}); about {needed / 2**30:.1f} GiB are "
                                   f"needed: free some space or choose another {store.setting}") from None
        raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        for made in reversed(created):
            with contextlib.suppress(OSError):
                made.rmdir()   # only when empty


def partial_folder(root: Path) -> Path:
    """A new `.partial-HOST-PID-*` name in `root` (`owned_prefix`): never loaded, and removed by the next preparation
    once this process is gone."""
    return root / f"{owned_prefix(PARTIAL_PREFIX)}{uuid.uuid4().hex[:8]}"


def publish_prepared(store: PreparedStore, folder: Path, split: str, key: str, dataset: Dataset,
                     manifest: dict[str, Any]) -> bool:
    """Save `dataset` into the preparation `folder` (in `store`), its manifest last, and rename that to the split's
    key: the prepared split appears whole or not at all. False when another run published the key meanwhile: its
    split is kept and this one is left in `folder`, to be removed with it. In a run's own store the split prepared
    under other keys (older data or settings) is removed."""
    staged = folder / f"{split}-{key}"
    dataset.save_to_disk(str(staged / "data"))
    manifest = dict(manifest, prepared_at=time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    (staged / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    target = store.folder(split, key)
    try:
        staged.rename(target)
        published = True
    except OSError:   # prepared meanwhile by another run: keep that one
        if not (target / MANIFEST_FILE).is_file():
            raise
        published = False
    if not store.shared:
        for other in store.root.glob(f"{split}-*"):
            if other != target:
                logger.info("Removing %s, prepared for other data or settings", other)
                _remove_prepared(other)
    return published


def _remove_prepared(folder: Path) -> None:
    """Remove a prepared split's folder: renamed to a `.partial-*` name first (atomic), so a kill while its files are
    deleted never leaves a folder under the split's key that a run would load."""
    doomed = partial_folder(folder.parent)
    try:
        folder.rename(doomed)
    except OSError:   # removed meanwhile by another job
        return
    shutil.rmtree(doomed, ignore_errors=True)


def tokenizer_sha256(tokenizer: PreTrainedTokenizerBase) -> str:
    """What identifies a tokenizer's token ids: a fast tokenizer's full serialisation (normaliser, model, post
    processor; and in target mode too where that differs, `target_serialisation`) and, when set, its
    `split_special_tokens` (a "</s>" in the text is its characters, not the control token; not part of that
    serialisation), else its class, vocabulary, special tokens and the files its `save_vocabulary` writes
    (`vocabulary_files_sha256`: Marian's SentencePiece models, which segment the text, and its target vocabulary)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        described = backend.to_str()
        if (target := target_serialisation(tokenizer)) not in (None, described):
            described += f"\0target\0{target}"
    else:
        described = json.dumps([sorted(tokenizer.get_vocab().items()), tokenizer.all_special_tokens,
                                vocabulary_files_sha256(tokenizer)])
    if getattr(tokenizer, "split_special_tokens", False):   # unset: the key of data prepared before the setting
        described += "\0split_special_tokens"
    return hashlib.sha256(f"{type(tokenizer).__name__}\0{described}".encode()).hexdigest()


def vocabulary_files_sha256(tokenizer: PreTrainedTokenizerBase) -> str:
    """`files_sha256` of the files `tokenizer.save_vocabulary` writes (into a temporary folder), in name order: what a
    tokenizer without a backend serialisation encodes with besides its vocabulary (a SentencePiece model per side, a
    target vocabulary)."""
    with tempfile.TemporaryDirectory() as folder:
        saved = tokenizer.save_vocabulary(folder) or ()
        return files_sha256(sorted(saved, key=lambda path: Path(path).name))


def target_serialisation(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The backend serialisation of a fast tokenizer in the mode `tokenizer(text_target=...)` encodes the labels in
    (NLLB's, M2M100's, mBART's: the post processor then adds `tgt_lang`'s token, set only for that call); None for a
    tokenizer without a target mode (this package's own)."""
    if not (hasattr(tokenizer, "_switch_to_target_mode") and hasattr(tokenizer, "_switch_to_input_mode")):
        return None
    tokenizer._switch_to_target_mode()
    try:
        return tokenizer.backend_tokenizer.to_str()
    finally:
        tokenizer._switch_to_input_mode()
