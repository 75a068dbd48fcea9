"""Corpus-level sacreBLEU and chrF, computed with the `sacrebleu` library on detokenized text, with signatures."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import sacrebleu
from transformers import PreTrainedTokenizerBase

IGNORED_LABEL_ID = -100
# The metrics an evaluation computes from generated translations (predict_with_generate): `score_translations`' and
# the mean generated length.
GENERATED_METRICS = frozenset({"bleu", "chrf", "brevity_penalty", "length_ratio", "gen_len"})


def score_translations(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float | str]:
    """sacreBLEU corpus BLEU (default 13a tokenisation, as reported in MT papers) and chrF, with their signatures."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references; they must pair up line by line")
    bleu_metric = sacrebleu.metrics.BLEU()
    chrf_metric = sacrebleu.metrics.CHRF()
    bleu = bleu_metric.corpus_score(list(hypotheses), [list(references)])
    chrf = chrf_metric.corpus_score(list(hypotheses), [list(references)])
    return {
        "bleu": bleu.score,
        "bleu_signature": str(bleu_metric.get_signature()),
        "chrf": chrf.score,
        "chrf_signature": str(chrf_metric.get_signature()),
        "brevity_penalty": bleu.bp,
        "length_ratio": bleu.sys_len / max(bleu.ref_len, 1),
    }


def decode_token_ids(token_ids: np.ndarray, tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """Detokenized strings from generated ids padded with -100 (the Trainer's padding) or the pad id."""
    token_ids = np.where(token_ids == IGNORED_LABEL_ID, tokenizer.pad_token_id, token_ids)
    return [text.strip() for text in tokenizer.batch_decode(token_ids.tolist(), skip_special_tokens=True)]


def generated_lengths(token_ids: np.ndarray, eos_token_id: int, pad_token_id: int) -> np.ndarray:
    """Tokens generated per row before the first </s>, pad or -100, not counting the decoder start in column 0
    (beam search fills finished rows with </s> or pad, the Trainer pads batches with -100)."""
    body = np.asarray(token_ids)[:, 1:]
    ended = (body == eos_token_id) | (body == pad_token_id) | (body == IGNORED_LABEL_ID)
    return np.where(ended.any(axis=1), ended.argmax(axis=1), body.shape[1])
