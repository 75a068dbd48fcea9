"""One joint (source + target) subword tokenizer, trained with the `tokenizers` library.

SentencePiece-like: a Unicode normaliser (`NORMALIZER`), a Metaspace pre-tokenizer that marks word starts with "▁",
BPE merges with byte fallback, and a decoder that joins the bytes back into characters and the pieces into words.
So `decode(encode(text)) == normalised text` for every text that does not start with a space and holds no "▁" (U+2581,
the word-start mark itself, which comes back as a space, as in SentencePiece; what sacreBLEU needs): a character
outside the learned alphabet (a rare dash, an emoji) is encoded as its UTF-8 bytes, `<0xE2><0x80><0x94>`, never
dropped or turned into `<unk>`; a special token written in the text ("<s>", "</s>", "<unk>", "<pad>": an HTML
strikethrough, a corpus's placeholder) is text too, encoded as its characters as SentencePiece encodes it
(`split_special_tokens`), never the control token, also where it follows a word ("x</s>"); so is text that spells a byte
token ("x<0x41>"): no learned piece spells either (`_with_byte_tokens`). Which characters get a piece of their own is
SentencePiece's `character_coverage` (`covered_characters`): every character of the training texts by default, or the
most frequent ones that make up that share of all character occurrences. Every encoding ends with "</s>". Special token
ids are fixed: "<pad>"=0, "</s>"=1, "<s>"=2 (decoder start), "<unk>"=3; the 256 byte tokens follow (4-259), then the
learned pieces.

The normaliser is NFC: it composes characters ("a" + combining diaeresis -> "ä") and changes nothing a reader would
see, so NFC text can be produced by the model; text NFC changes (decomposed text, and 1120 characters such as
U+095B DEVANAGARI LETTER ZA, the Greek question mark, CJK compatibility ideographs) cannot, and a reference holding
it is named in a warning (`data.warn_of_unwritable_references`). NFKC would also fold compatibility characters
("²" -> "2", "…" -> "...", "ﬁ" -> "fi", full-width forms), sharing more pieces but making those characters
impossible to output. The choice is the one line `NORMALIZER = ...`; it is recorded with every trained tokenizer.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from ..tokenization_relpos import RelPosTokenizer

logger = logging.getLogger(__name__)

PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, UNK_TOKEN = "<pad>", "</s>", "<s>", "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, UNK_TOKEN)
BYTE_TOKENS = tuple(f"<0x{value:02X}>" for value in range(256))
WORD_START = "▁"
# Where Metaspace puts a word start that no space gave: in front of the text only ("first"), not in front of each piece
# of text between tokens added with `add_tokens` ("always"), which would make "Die<neu>Straße" "Die<neu> Straße". A
# text without added tokens is one piece, encoded alike either way.
WORD_START_PREPENDED = "first"
TOKENIZER_FILE = "tokenizer.json"
# A folder holds a tokenizer saved by `save_pretrained` when it has one of these (a slow one, Marian's, has no
# tokenizer.json).
SAVED_TOKENIZER_FILES = (TOKENIZER_FILE, "tokenizer_config.json")
# How the tokenizer was trained, written next to it: a saved tokenizer is reused only for the same settings.
TOKENIZER_SETTINGS_FILE = "tokenizer_training.json"
MIN_FREQUENCY = 2
NORMALIZER = normalizers.NFC()


def train_joint_tokenizer(
    texts: Iterable[str] | Iterable[list[str]], vocab_size: int, min_frequency: int = MIN_FREQUENCY,
    character_coverage: float = 1.0,
) -> RelPosTokenizer:
    """Train a BPE tokenizer with byte fallback on `texts` (source and target sentences together: strings, or
    batches of strings, which cross into the Rust trainer a batch at a time) and wrap it for transformers.

    `vocab_size` counts everything, as SentencePiece does: the 4 special tokens, the 256 byte tokens and the learned
    pieces (characters first, then merges; a small corpus may yield fewer pieces than asked for). The characters are
    SentencePiece's `character_coverage` of the texts (`covered_characters`), at most `vocab_size` - 260 of them, the
    word start "▁" always; coverage 1 keeps every character the vocabulary has room for, the rarest left to the byte
    tokens. A coverage below 1 reads `texts` twice (to count the characters, then to train): they must be re-iterable
    (a list, or an object whose every `iter()` reads them afresh), not a one-shot iterator. Characters that take
    every learned piece leave none to merges, which a warning says; at coverage 1 re-iterable texts are then read
    again, so that ties at the cut are broken by code point (the trainer's own order changes from process to process).
    """
    reserved = len(SPECIAL_TOKENS) + len(BYTE_TOKENS)
    if vocab_size <= reserved:
        raise ValueError(f"tokenizer_vocab_size must be larger than {reserved} ({len(SPECIAL_TOKENS)} special and "
                         f"{len(BYTE_TOKENS)} byte-fallback tokens), got {vocab_size}")
    require_character_coverage(character_coverage)
    pieces = vocab_size - len(BYTE_TOKENS)
    room = pieces - len(SPECIAL_TOKENS)
    alphabet = _covered_alphabet(texts, character_coverage, room)[0] if character_coverage < 1 else []
    tokenizer = _trained(texts, alphabet, pieces, room, min_frequency)
    if _alphabet_size(tokenizer) >= room:
        distinct = ""
        if not alphabet and iter(texts) is not texts:
            # Full coverage, and the characters took every learned piece: the trainer kept the `room` most frequent,
            # breaking ties at the cut in hash order (another alphabet in each process); they are chosen as at any
            # other coverage instead (count, then code point), which reads the texts once more.
            alphabet, characters = _covered_alphabet(texts, 1.0, room)
            distinct = f" of the {characters} distinct characters of the training texts"
            tokenizer = _trained(texts, alphabet, pieces, room, min_frequency)
        logger.warning(
            "The tokenizer learnt no merges: its alphabet (the most frequent characters%s that "
            "tokenizer_character_coverage %g keeps) takes all %d learned pieces that tokenizer_vocab_size %d leaves "
            "besides the %d special and %d byte tokens, so words are split into single characters; lower "
            "tokenizer_character_coverage (e.g. 0.9999, as the WMT14 recipes set) to leave the rarest characters to "
            "the byte tokens and their pieces to merges, or raise tokenizer_vocab_size", distinct, character_coverage,
            room, vocab_size, len(SPECIAL_TOKENS), len(BYTE_TOKENS))
    tokenizer.pre_tokenizer = _word_starts()
    tokenizer = _with_byte_tokens(tokenizer)
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS_TOKEN}", pair=f"$A {EOS_TOKEN} $B {EOS_TOKEN}", special_tokens=[(EOS_TOKEN, eos_id)]
    )
    return wrap_tokenizer(tokenizer)


def _trained(texts: Iterable[str] | Iterable[list[str]], alphabet: list[str], pieces: int, room: int,
             min_frequency: int) -> Tokenizer:
    """A BPE tokenizer (byte fallback, `NORMALIZER`, the decoder) trained on `texts`: `pieces` special tokens and
    learned pieces, the characters `alphabet` (given) or the word start and the `room` - 1 most frequent other ones
    (none given); its pre-tokenizer is the training one."""
    tokenizer = Tokenizer(models.BPE(unk_token=UNK_TOKEN, byte_fallback=True))
    tokenizer.normalizer = NORMALIZER
    tokenizer.decoder = decoders.Sequence([
        decoders.ByteFallback(), decoders.Metaspace(replacement=WORD_START, prepend_scheme=WORD_START_PREPENDED),
    ])
    # The trainer counts character occurrences as `character_counts` does and keeps the `limit_alphabet` most
    # frequent, ties broken in hash order; giving it `alphabet` as its initial alphabet, which it ranks above every
    # counted character, makes the kept characters exactly `alphabet`. With none given, the word start is given: left
    # to the bytes (texts whose other characters are each more frequent, a one-shot iterator not chosen again by
    # `_covered_alphabet`), it joins the byte tokens around it into one decoded token, and the Metaspace decoder drops
    # every "▁" of the first token, so "Hello world" in bytes came back as "Helloworld".
    trainer = trainers.BpeTrainer(
        vocab_size=pieces,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        limit_alphabet=len(alphabet) if alphabet else room,
        initial_alphabet=alphabet or [WORD_START],
        show_progress=False,
    )
    tokenizer.pre_tokenizer = _training_pre_tokenizer(alphabet)
    tokenizer.train_from_iterator(_fed_to_trainer(texts), trainer=trainer)
    return tokenizer


def _alphabet_size(tokenizer: Tokenizer) -> int:
    """The characters among a trained tokenizer's pieces (a merge joins two or more)."""
    return sum(len(token) == 1 for token in tokenizer.get_vocab())


def require_character_coverage(value: Any) -> None:
    """Raise ValueError naming tokenizer_character_coverage unless `value` is a number in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError("tokenizer_character_coverage must be a number in (0, 1] (the share of the training texts' "
                         f"character occurrences whose characters get a piece of their own; 1: all), got {value!r}")


def character_counts(texts: Iterable[str] | Iterable[list[str]]) -> Counter[str]:
    """How often each character occurs in `texts` as the BPE trainer sees them: normalised (`NORMALIZER`) and
    pre-tokenized by Metaspace (each space becomes a "▁", and a text that does not then start with "▁" gets one
    prepended)."""
    counts: Counter[str] = Counter()
    for item in _non_empty(texts):
        normalised = [NORMALIZER.normalize_str(text) for text in ([item] if isinstance(item, str) else item)]
        counts.update("".join(normalised))
        counts[WORD_START] += sum(not text.startswith((" ", WORD_START)) for text in normalised)
    counts[WORD_START] += counts.pop(" ", 0)
    return counts


def covered_characters(counts: Counter[str], coverage: float) -> list[str]:
    """SentencePiece's character coverage: the characters by decreasing count (ties by code point), up to the first
    whose cumulative count reaches `coverage` x the total count, with "▁" (word start) first and always kept."""
    total = sum(counts.values())
    kept: list[str] = []
    covered = 0
    for character, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        if covered >= coverage * total:
            break
        kept.append(character)
        covered += count
    return [WORD_START, *(character for character in kept if character != WORD_START)]


def _word_starts() -> pre_tokenizers.PreTokenizer:
    """The tokenizer's pre-tokenizer: Metaspace, a "▁" for every space and one in front of the text
    (`WORD_START_PREPENDED`)."""
    return pre_tokenizers.Metaspace(replacement=WORD_START, prepend_scheme=WORD_START_PREPENDED)


def _training_pre_tokenizer(alphabet: list[str]) -> pre_tokenizers.PreTokenizer:
    """`_word_starts`, and below full coverage (an `alphabet` given) each word then split at the characters outside
    it, which are dropped. Encoded, such a character is byte tokens between the pieces on either side, so no piece can
    span it; the trainer, which drops it from the word, would otherwise count its neighbours as adjacent and learn
    merges across it that never apply (SentencePiece's trainer splits there too)."""
    if not alphabet:
        return _word_starts()
    outside = "[^" + "".join(f"\\x{{{ord(character):04X}}}" for character in sorted(alphabet)) + "]"
    return pre_tokenizers.Sequence([_word_starts(), pre_tokenizers.Split(Regex(outside), behavior="removed")])


def _covered_alphabet(texts: Iterable[str] | Iterable[list[str]], coverage: float, room: int) -> tuple[list[str], int]:
    """The `covered_characters` of `texts`, at most `room` of them (the most frequent), logged, and the number of
    distinct characters in `texts`."""
    if iter(texts) is texts:
        raise TypeError("a character_coverage below 1 reads the texts twice (to count their characters, then to "
                        "train): pass a list or another re-iterable collection, not a one-shot iterator")
    logger.info("Counting the characters of the tokenizer's training texts (tokenizer_character_coverage %g)",
                coverage)
    counts = character_counts(texts)
    alphabet = covered_characters(counts, coverage)[:room]
    total = sum(counts.values())
    logger.info("The tokenizer's alphabet keeps %d of the %d characters of its training texts (%.4f %% of their %d "
                "character occurrences); the rarer ones are encoded as bytes", len(alphabet), len(counts),
                100 * sum(counts[character] for character in alphabet) / max(total, 1), total)
    return alphabet, len(counts)


def _with_byte_tokens(tokenizer: Tokenizer) -> Tokenizer:
    """The trained BPE model with the 256 byte tokens placed after the special tokens (the learned pieces move up by
    256), as byte fallback needs them in the vocabulary. No merge makes a piece spelled as a byte or special token
    (text such as "x<0x41>" or "x</s>" in the training data): such a merge, and those that build on its piece, are
    dropped, and the piece with them. A byte token's spelling took its id and its decoding, so the text came back as
    "xA"; a special token's made the control token out of text ("x</s>" encoded with an end token inside, dropped
    when decoded). Such text is encoded as its characters instead."""
    spec = json.loads(tokenizer.to_str())
    model = spec["model"]
    spelled = set(BYTE_TOKENS).union(SPECIAL_TOKENS)
    dropped: set[str] = set()
    merges = []
    for left, right in model["merges"]:
        if left + right in spelled or {left, right} & dropped:
            dropped.add(left + right)
        else:
            merges.append([left, right])
    kept = [token for token, _ in sorted(model["vocab"].items(), key=lambda item: item[1])
            if token not in dropped or token in SPECIAL_TOKENS]
    special = len(SPECIAL_TOKENS)
    vocab = {token: index if index < special else index + len(BYTE_TOKENS) for index, token in enumerate(kept)}
    vocab.update({token: special + offset for offset, token in enumerate(BYTE_TOKENS)})
    model["vocab"], model["merges"] = vocab, merges
    return Tokenizer.from_str(json.dumps(spec))


def wrap_tokenizer(tokenizer: Tokenizer) -> RelPosTokenizer:
    """A `RelPosTokenizer` around a raw `tokenizers.Tokenizer` with this package's named special tokens, which a text
    that spells them ("</s>" in a sentence) does not produce: `split_special_tokens` encodes such text as its
    characters (saved in tokenizer_config.json, so the saved tokenizer does the same), so of them an encoding holds
    only the ones the tokenizer adds (the final "</s>"). Special tokens added later (language tags such as ">>deu<<")
    are read from text, one id each (`RelPosTokenizer`)."""
    return RelPosTokenizer(
        tokenizer_object=tokenizer,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        bos_token=BOS_TOKEN,
        unk_token=UNK_TOKEN,
        model_input_names=["input_ids", "attention_mask"],
        clean_up_tokenization_spaces=False,
        split_special_tokens=True,
    )


def _non_empty(texts: Iterable[str] | Iterable[list[str]]) -> Iterator[str | list[str]]:
    for text in texts:
        if isinstance(text, list):
            text = [item for item in text if item]
        if text:
            yield text


def _fed_to_trainer(texts: Iterable[str] | Iterable[list[str]]) -> Iterator[str | list[str]]:
    """The non-empty texts, then a log line saying that the trainer, having read them all, goes on to its merges,
    which show no progress."""
    fed = 0
    for item in _non_empty(texts):
        fed += 1 if isinstance(item, str) else len(item)
        yield item
    logger.info("The tokenizer trainer has read the %d texts; it now learns the BPE merges, with no progress shown "
                "(minutes on a large corpus)", fed)


def tokenizer_settings(data_sha256: str, vocab_size: int, character_coverage: float, data: str) -> dict[str, Any]:
    """What determines a trained tokenizer: the training data (`data_sha256`, the SHA-256 of its files and of the
    settings that select its texts), the vocabulary size, the character coverage and the training recipe; `data`
    says in words where the texts came from (for messages only)."""
    return {"tokenizer_vocab_size": vocab_size, "tokenizer_character_coverage": float(character_coverage),
            "min_frequency": MIN_FREQUENCY, "normalizer": type(NORMALIZER).__name__, "byte_fallback": True,
            "training_data_sha256": data_sha256, "data": data}


# Settings recorded only since they became settings, with the value every tokenizer saved before then was trained
# with (a record without them means that value).
SETTINGS_BEFORE_THEY_WERE_RECORDED = {"tokenizer_character_coverage": 1.0}


def save_tokenizer_settings(settings: dict[str, Any], directory: str | os.PathLike) -> None:
    (Path(directory) / TOKENIZER_SETTINGS_FILE).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


def load_tokenizer_settings(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The settings recorded next to a tokenizer trained by this package, or None (not recorded, or unreadable)."""
    try:
        return json.loads((Path(directory) / TOKENIZER_SETTINGS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def settings_differences(saved: dict[str, Any] | None, wanted: dict[str, Any]) -> list[str]:
    """How a saved tokenizer's settings differ from the wanted ones, in words (empty when they match)."""
    if saved is None:
        return ["its training settings are not recorded"]
    differences = []
    for name, value in wanted.items():
        saved_value = saved.get(name, SETTINGS_BEFORE_THEY_WERE_RECORDED.get(name))
        if name == "data" or saved_value == value:
            continue
        if name == "training_data_sha256":
            if saved.get("data") == wanted["data"]:
                differences.append(f"training text differs (the files of {wanted['data']} changed since)")
            else:
                differences.append(f"training text differs (saved: {saved.get('data')}; now: {wanted['data']})")
        else:
            differences.append(f"{name} {saved_value!r} -> {value!r}")
    return differences


def has_saved_tokenizer(directory: str | os.PathLike) -> bool:
    """Whether `directory` already holds a tokenizer saved by `save_pretrained`."""
    return (Path(directory) / TOKENIZER_FILE).is_file()


def has_tokenizer_files(folder: str | os.PathLike) -> bool:
    """Whether `folder` holds one of `SAVED_TOKENIZER_FILES` (where it holds none, AutoTokenizer's own error names a
    missing sentencepiece or tiktoken)."""
    return any((Path(folder) / name).is_file() for name in SAVED_TOKENIZER_FILES)


# The arguments transformers' from_pretrained keeps among a tokenizer's init_kwargs (and so writes into a saved
# tokenizer_config.json) that say how it was loaded: a resumed run's saved tokenizer would differ from an uninterrupted one's
LOADING_ARGUMENTS = ("is_local", "local_files_only")


def without_loading_arguments(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """`tokenizer` (as loaded by from_pretrained) without the `LOADING_ARGUMENTS` among its init_kwargs: how it was
    loaded, not what it is, which a save would write into its tokenizer_config.json."""
    for name in LOADING_ARGUMENTS:
        tokenizer.init_kwargs.pop(name, None)
    return tokenizer


def load_tokenizer(name_or_path: str | os.PathLike, cache_dir: str | None = None) -> PreTrainedTokenizerBase:
    """Load a saved tokenizer (a folder, or a Hub id cached in `cache_dir`, else the default Hub cache) and check it
    has the special tokens translation needs."""
    if Path(name_or_path).is_dir() and not has_tokenizer_files(name_or_path):
        raise ValueError(f"the folder holds no saved tokenizer ({' or '.join(SAVED_TOKENIZER_FILES)}): save one there "
                         "with tokenizer.save_pretrained")
    tokenizer = without_loading_arguments(AutoTokenizer.from_pretrained(str(name_or_path), cache_dir=cache_dir))
    missing = [name for name in ("pad_token", "eos_token") if getattr(tokenizer, name) is None]
    if missing:
        raise ValueError(f"tokenizer {name_or_path!s} has no {' or '.join(missing)}; a translation tokenizer needs both")
    return tokenizer


# The tokens a new model's decoder may start from (special_token_ids' `decoder_start`).
DECODER_START_TOKENS = ("bos", "pad", "eos")


def special_token_ids(tokenizer: PreTrainedTokenizerBase, decoder_start: str = "bos") -> dict[str, int]:
    """The ids the model config needs: pad, eos, bos (bos, or eos when there is no bos) and the decoder start token,
    one of DECODER_START_TOKENS (`bos`: the bos id as above)."""
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    starts = {"bos": bos, "pad": tokenizer.pad_token_id, "eos": tokenizer.eos_token_id}
    return {
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": bos,
        "decoder_start_token_id": starts[decoder_start],
    }
