"""One joint (source + target) subword tokenizer, trained with the `tokenizers` library.

SentencePiece-like: NFC normalisation, a Metaspace pre-tokenizer that marks word starts with "▁", BPE merges, and a
Metaspace decoder, so `decode(encode(text))` gives the detokenized text back (what sacreBLEU needs). Every encoding
ends with "</s>". Special token ids are fixed: "<pad>"=0, "</s>"=1, "<s>"=2 (decoder start), "<unk>"=3.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, UNK_TOKEN = "<pad>", "</s>", "<s>", "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, UNK_TOKEN)
WORD_START = "▁"
TOKENIZER_FILE = "tokenizer.json"


def train_joint_tokenizer(
    texts: Iterable[str], vocab_size: int, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a BPE tokenizer on `texts` (source and target sentences together) and wrap it for transformers.

    `vocab_size` counts the four special tokens; a small corpus may yield fewer pieces than asked for.
    """
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"tokenizer_vocab_size must be larger than {len(SPECIAL_TOKENS)}, got {vocab_size}")
    tokenizer = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=WORD_START, prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement=WORD_START, prepend_scheme="always")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_non_empty(texts), trainer=trainer)
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS_TOKEN}", pair=f"$A {EOS_TOKEN} $B {EOS_TOKEN}", special_tokens=[(EOS_TOKEN, eos_id)]
    )
    return wrap_tokenizer(tokenizer)


def wrap_tokenizer(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """A `PreTrainedTokenizerFast` around a raw `tokenizers.Tokenizer` with this package's special tokens."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        bos_token=BOS_TOKEN,
        unk_token=UNK_TOKEN,
        model_input_names=["input_ids", "attention_mask"],
        clean_up_tokenization_spaces=False,
    )


def _non_empty(texts: Iterable[str]) -> Iterator[str]:
    for text in texts:
        if text:
            yield text


def has_saved_tokenizer(directory: str | os.PathLike) -> bool:
    """Whether `directory` already holds a tokenizer saved by `save_pretrained`."""
    return (Path(directory) / TOKENIZER_FILE).is_file()


def load_tokenizer(name_or_path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """Load a saved tokenizer (a folder or a Hub id) and check it has the special tokens translation needs."""
    tokenizer = AutoTokenizer.from_pretrained(str(name_or_path))
    missing = [name for name in ("pad_token", "eos_token") if getattr(tokenizer, name) is None]
    if missing:
        raise ValueError(f"tokenizer {name_or_path!s} has no {' or '.join(missing)}; a translation tokenizer needs both")
    return tokenizer


def special_token_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    """The ids the model config needs: pad, eos, bos and decoder start (bos, or eos when there is no bos)."""
    decoder_start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    return {
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": decoder_start,
        "decoder_start_token_id": decoder_start,
    }
