"""Corpus-level sacreBLEU and chrF, computed with the `sacrebleu` library on detokenized text, with signatures."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import sacrebleu
from sacrebleu.significance import PairedTest
from transformers import PreTrainedTokenizerBase

from ..publish.hub import primary_subtag

IGNORED_LABEL_ID = -100
# The metrics an evaluation computes from generated translations (predict_with_generate): `score_translations`' and
# the mean generated length.
GENERATED_METRICS = frozenset({"bleu", "chrf", "brevity_penalty", "length_ratio", "gen_len"})
# Whether a higher value is better, for the metrics of an evaluation that have a direction (length_ratio and gen_len
# have none: 1 and the reference length are best).
HIGHER_IS_BETTER = {"bleu": True, "chrf": True, "brevity_penalty": True, "loss": False, "nll_loss": False}
# sacreBLEU's BLEU tokenizations (13a, intl, zh, ja-mecab, ko-mecab, char, none, flores101, ...), in its order.
BLEU_TOKENIZERS = tuple(sacrebleu.metrics.BLEU.TOKENIZERS)


def check_bleu_tokenize(tokenize: str | None, field_name: str = "tokenize") -> None:
    """`tokenize` must be one of sacreBLEU's tokenizations, or None for sacreBLEU's choice by target language; else
    one ValueError naming `field_name` and the allowed values."""
    if tokenize is not None and tokenize not in BLEU_TOKENIZERS:
        raise ValueError(f"{field_name} must be one of {', '.join(BLEU_TOKENIZERS)}, or null for sacreBLEU's choice "
                         f"by target language; got {tokenize!r}")


def bleu_metric(tokenize: str | None = None, target_lang: str = "") -> sacrebleu.metrics.BLEU:
    """sacreBLEU's BLEU with the tokenization `tokenize`, or with None the one sacreBLEU itself chooses for the target
    language (`BLEU(trg_lang=...)`, as its command line does: zh for zh, ja-mecab for ja, ko-mecab for ko, else 13a).
    A tokenization that cannot be set up here (ja-mecab without `sacrebleu[ja]`, ko-mecab without `sacrebleu[ko]`,
    flores* without sentencepiece or the download of their model) is one ValueError line that says what it needs."""
    check_bleu_tokenize(tokenize)
    language = primary_subtag(target_lang)   # the language sacreBLEU chooses a tokenization by
    try:
        return sacrebleu.metrics.BLEU(tokenize=tokenize, trg_lang=language)
    except (ImportError, RuntimeError, OSError) as error:
        chosen = repr(tokenize) if tokenize is not None else f"sacreBLEU's choice for target language {language!r}"
        raise ValueError(f"the BLEU tokenization ({chosen}) cannot be set up: {' '.join(str(error).split())}") from None


def score_translations(hypotheses: Sequence[str], references: Sequence[str], tokenize: str | None = None,
                       target_lang: str = "") -> dict[str, float | str]:
    """sacreBLEU corpus BLEU (tokenized as `bleu_metric(tokenize, target_lang)` says: 13a, as reported in MT papers,
    unless given or chosen for a zh, ja or ko target) and chrF, with their signatures (the BLEU one names the
    tokenization, tok:...)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references; they must pair up line by line")
    bleu_scorer = bleu_metric(tokenize, target_lang)
    chrf_metric = sacrebleu.metrics.CHRF()
    bleu = bleu_scorer.corpus_score(list(hypotheses), [list(references)])
    chrf = chrf_metric.corpus_score(list(hypotheses), [list(references)])
    return {
        "bleu": bleu.score,
        "bleu_signature": str(bleu_scorer.get_signature()),
        "chrf": chrf.score,
        "chrf_signature": str(chrf_metric.get_signature()),
        "brevity_penalty": bleu.bp,
        "length_ratio": bleu.sys_len / max(bleu.ref_len, 1),
    }


def paired_bootstrap(baseline: Sequence[str], system: Sequence[str], references: Sequence[str],
                     resamples: int = 1000, tokenize: str | None = None,
                     target_lang: str = "") -> dict[str, float | str]:
    """`system`'s corpus BLEU minus `baseline`'s on the same references, and the p-value of paired bootstrap
    resampling (Koehn 2004) in the two-sided form of Moses' bootstrap-hypothesis-difference-significance.pl, which
    sacreBLEU's `PairedTest` computes: over `resamples` test sets drawn with replacement, the same sentences for both
    systems, p = (c + 1) / (resamples + 1), c the resampled absolute differences that exceed their mean by more than
    the observed one (an observed difference of 0, as of the same translations, is p = 1). The draws use sacreBLEU's
    seed (`SACREBLEU_SEED`, default 12345; "none" or 0 draw unseeded), so
    a rerun gives the same p-value; the signature names the seed and the resamples. BLEU is tokenized as
    `score_translations` tokenizes it (`bleu_metric(tokenize, target_lang)`)."""
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    for name, hypotheses in (("baseline", baseline), ("system", system)):
        if len(hypotheses) != len(references):
            raise ValueError(f"{len(hypotheses)} {name} hypotheses for {len(references)} references; they must pair "
                             "up line by line")
    test = PairedTest([("baseline", list(baseline)), ("system", list(system))],
                      {"BLEU": bleu_metric(tokenize, target_lang)}, [list(references)], test_type="bs",
                      n_samples=resamples)
    signatures, results = test()
    base, other = results["BLEU"]
    difference = other.score - base.score
    # sacreBLEU counts resampled differences strictly beyond the observed one: where every one is 0 as well (the same
    # translations) it would give 1 / (resamples + 1); an observed difference of 0 is no evidence of one, p = 1
    return {"difference": difference, "p_value": 1.0 if difference == 0 else other.p_value,
            "signature": str(signatures["BLEU"])}


def decode_translations(token_ids: Sequence[Sequence[int]], tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """The text of each row of generated ids, as it is scored and written: special tokens dropped, white space at
    either end dropped, and no `clean_up_tokenization_spaces`, whatever the tokenizer's config says (it deletes the
    space before . , ? ! and in "do n't", which a model generated and a reference holds: French "Quoi ?"; the
    pipeline decodes without it too)."""
    return [tokenizer.decode(list(row), skip_special_tokens=True, clean_up_tokenization_spaces=False).strip()
            for row in token_ids]


def decode_token_ids(token_ids: np.ndarray, tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """Detokenized strings (`decode_translations`) from generated ids padded with -100 (the Trainer's padding) or
    the pad id."""
    token_ids = np.where(token_ids == IGNORED_LABEL_ID, tokenizer.pad_token_id, token_ids)
    return decode_translations(token_ids.tolist(), tokenizer)


def generated_lengths(token_ids: np.ndarray, eos_token_id: int, pad_token_id: int) -> np.ndarray:
    """Tokens generated per row before the first </s>, pad or -100, not counting the decoder start in column 0
    (beam search fills finished rows with </s> or pad, the Trainer pads batches with -100)."""
    body = np.asarray(token_ids)[:, 1:]
    ended = (body == eos_token_id) | (body == pad_token_id) | (body == IGNORED_LABEL_ID)
    return np.where(ended.any(axis=1), ended.argmax(axis=1), body.shape[1])
