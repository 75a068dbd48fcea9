"""sacreBLEU/chrF scoring and decoding of generated ids."""

import importlib.util
import os

import numpy as np
import pytest
from sacrebleu.metrics import BLEU, CHRF

from hf_relpos.translation.metrics import decode_token_ids, generated_lengths, paired_bootstrap, score_translations
from hf_relpos.translation.tokenization import train_joint_tokenizer


def test_scores_match_sacrebleu_and_carry_signatures():
    references = ["Der Hund sieht die Katze.", "Heute macht die Frau die Tür auf.", "Zwei Männer „spielen“ Fußball."]
    perfect = score_translations(references, references)
    assert perfect["bleu"] == pytest.approx(100.0) and perfect["chrf"] == pytest.approx(100.0)
    hypotheses = ["Der Hund sieht die Maus.", "Die Frau macht die Tür auf.", "Zwei Männer spielen Fussball."]
    partial = score_translations(hypotheses, references)
    bleu, chrf = BLEU(), CHRF()   # sacreBLEU's defaults: cased, 13a tokenization, exponential smoothing; chrF2
    expected_bleu, expected_chrf = bleu.corpus_score(hypotheses, [references]), chrf.corpus_score(hypotheses, [references])
    assert 0.0 < expected_bleu.score < 100.0 and 0.0 < expected_chrf.score < 100.0
    assert partial["bleu"] == pytest.approx(expected_bleu.score, abs=1e-9)
    assert partial["chrf"] == pytest.approx(expected_chrf.score, abs=1e-9)
    assert partial["brevity_penalty"] == pytest.approx(expected_bleu.bp, abs=1e-9)
    assert partial["length_ratio"] == pytest.approx(expected_bleu.sys_len / expected_bleu.ref_len, abs=1e-9)
    assert (partial["bleu_signature"], partial["chrf_signature"]) == (str(bleu.get_signature()),
                                                                      str(chrf.get_signature()))
    assert partial["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    swapped = score_translations(references[::-1], references)
    assert swapped["bleu"] == pytest.approx(bleu.corpus_score(references[::-1], [references]).score, abs=1e-9)
    with pytest.raises(ValueError, match="pair up line by line"):
        score_translations(["a"], references)


def test_decoding_ignores_padding_and_special_tokens():
    tokenizer = train_joint_tokenizer(["Der Hund sieht die Katze."] * 5, vocab_size=316)
    ids = tokenizer(["Der Hund", "die Katze."])["input_ids"]
    rows = np.full((2, 8), -100)
    rows[0, : len(ids[0]) + 1] = [2] + ids[0]
    rows[1, : len(ids[1]) + 1] = [2] + ids[1]
    assert decode_token_ids(rows, tokenizer) == ["Der Hund", "die Katze."]


def test_decoding_strips_the_space_of_a_lone_word_boundary_piece():
    """A generated lone "▁" first or last decodes to a leading or trailing space, which the scored text drops."""
    tokenizer = train_joint_tokenizer(["Der Hund sieht die Katze."] * 5, vocab_size=316)
    space = tokenizer.convert_tokens_to_ids("▁")
    words = tokenizer("Der Hund", add_special_tokens=False)["input_ids"]
    rows = np.array([[0, space, *words, 1, -100], [0, *words, space, 1, -100]])
    assert tokenizer.batch_decode(rows[:, :-1].tolist(), skip_special_tokens=True) == [" Der Hund", "Der Hund "]
    assert decode_token_ids(rows, tokenizer) == ["Der Hund", "Der Hund"]


def test_generated_lengths_stop_at_the_first_end_token():
    rows = np.array([[2, 7, 8, 1, 1, 1], [2, 7, 1, 0, 0, 0], [2, 7, 8, 9, -100, -100], [2, 7, 8, 9, 10, 11],
                     [2, 7, 8, 0, 0, 0]])   # the last: a finished row filled with pad, no end token
    assert generated_lengths(rows, eos_token_id=1, pad_token_id=0).tolist() == [2, 1, 3, 5, 2]


def moses_paired_bootstrap(baseline, system, references, resamples):
    """Paired bootstrap resampling as Moses' bootstrap-hypothesis-difference-significance.pl tests, written out: corpus
    BLEU of each resampled test set (the same sentences for both systems) by sacreBLEU's metric object, drawn with
    sacreBLEU's seed, p = (c + 1) / (resamples + 1) over the centred absolute differences."""
    indices = np.random.default_rng(int(os.environ.get("SACREBLEU_SEED", "12345"))).choice(len(references), size=(resamples, len(references)), replace=True)

    def bleu(hypotheses, rows):
        return BLEU().corpus_score([hypotheses[i] for i in rows], [[references[i] for i in rows]]).score
    differences = np.array([abs(bleu(system, rows) - bleu(baseline, rows)) for rows in indices])
    observed = abs(BLEU().corpus_score(system, [references]).score - BLEU().corpus_score(baseline, [references]).score)
    return (np.sum(differences - differences.mean() > observed) + 1) / (resamples + 1)


def test_paired_bootstrap_is_the_moses_test_on_sacrebleus_draws():
    rng = np.random.default_rng(0)
    words = ["Hund", "Katze", "Mann", "Frau", "Kind", "Ball", "Tür", "Haus", "spielt", "sieht", "öffnet", "läuft"]
    references = [" ".join(rng.choice(words, size=8)) for _ in range(60)]

    def degraded(share):   # a system that gets `share` of the sentences right and the rest half wrong
        return [reference if rng.random() < share else " ".join(reference.split()[:4] + ["Baum"] * 4)
                for reference in references]
    weak, strong = degraded(0.2), degraded(0.8)
    result = paired_bootstrap(weak, strong, references, resamples=200)
    assert result["difference"] == pytest.approx(
        BLEU().corpus_score(strong, [references]).score - BLEU().corpus_score(weak, [references]).score, abs=1e-9)
    assert result["difference"] > 10 and result["p_value"] < 0.01
    assert result["p_value"] == moses_paired_bootstrap(weak, strong, references, 200)
    one_sentence_apart = [*weak[:-1], references[-1]]
    close = paired_bootstrap(weak, one_sentence_apart, references, resamples=200)
    assert close["p_value"] == moses_paired_bootstrap(weak, one_sentence_apart, references, 200) > 0.05
    one_word = [*weak[:-1], " ".join(weak[-1].split()[:-1] + references[-1].split()[-1:])]
    tiny = paired_bootstrap(weak, one_word, references, resamples=200)   # only an observed 0 is p = 1
    assert 0 < tiny["difference"] < 0.1 and tiny["p_value"] == moses_paired_bootstrap(weak, one_word, references, 200)
    assert paired_bootstrap(weak, strong, references, resamples=200) == result   # sacreBLEU's fixed seed
    assert f"|bs:200|seed:{os.environ.get('SACREBLEU_SEED', '12345')}|" in result["signature"]
    same = paired_bootstrap(weak, list(weak), references, resamples=200)   # every resampled difference is 0 too
    assert (same["difference"], same["p_value"]) == (0.0, 1.0)
    with pytest.raises(ValueError, match="59 system hypotheses for 60 references"):
        paired_bootstrap(weak, strong[:-1], references)
    with pytest.raises(ValueError, match="resamples must be at least 1, got 0"):
        paired_bootstrap(weak, strong, references, resamples=0)


# Chinese without spaces: under 13a each sentence is one token, so a single wrong character scores 0.
CHINESE_REFERENCES = ["他看见狗。", "她打开门。", "孩子喜欢猫。"]
CHINESE_HYPOTHESES = ["他看见的。", "她打开门。", "孩子喜欢的。"]


@pytest.mark.parametrize("target_lang", ["zh", "zh-CN", "zh_Hans"])
def test_a_chinese_target_is_scored_with_sacrebleus_chinese_tokenization(target_lang):
    scores = score_translations(CHINESE_HYPOTHESES, CHINESE_REFERENCES, target_lang=target_lang)
    expected = BLEU(tokenize="zh").corpus_score(CHINESE_HYPOTHESES, [CHINESE_REFERENCES])
    assert 0.0 < scores["bleu"] < 100.0
    assert scores["bleu"] == pytest.approx(expected.score, abs=1e-9)
    assert "|tok:zh|" in scores["bleu_signature"]
    untokenized = score_translations(CHINESE_HYPOTHESES[:1] + CHINESE_HYPOTHESES[2:],
                                     CHINESE_REFERENCES[:1] + CHINESE_REFERENCES[2:], tokenize="13a")
    assert untokenized["bleu"] == 0.0 and "|tok:13a|" in untokenized["bleu_signature"]


def test_an_explicit_tokenization_wins_over_the_target_language():
    scores = score_translations(CHINESE_HYPOTHESES, CHINESE_REFERENCES, tokenize="char", target_lang="zh")
    expected = BLEU(tokenize="char").corpus_score(CHINESE_HYPOTHESES, [CHINESE_REFERENCES])
    assert scores["bleu"] == pytest.approx(expected.score, abs=1e-9)
    assert "|tok:char|" in scores["bleu_signature"]
    assert "|tok:13a|" in score_translations(["Der Hund."], ["Der Hund."], target_lang="de")["bleu_signature"]
    test = paired_bootstrap(CHINESE_HYPOTHESES, CHINESE_REFERENCES, CHINESE_REFERENCES, resamples=10,
                            target_lang="zh")
    assert "|tok:zh|" in test["signature"]


def test_an_unknown_tokenization_is_one_error_naming_the_allowed_ones():
    with pytest.raises(ValueError, match=r"^tokenize must be one of none, zh, 13a, .*ja-mecab, ko-mecab.*; "
                                         r"got 'mecab'$"):
        score_translations(CHINESE_HYPOTHESES, CHINESE_REFERENCES, tokenize="mecab")


@pytest.mark.skipif(importlib.util.find_spec("MeCab") is not None, reason="sacrebleu[ja] is installed")
def test_japanese_without_its_extra_is_one_line_naming_it():
    with pytest.raises(ValueError) as raised:
        score_translations(["猫です。"], ["猫です。"], target_lang="ja")
    assert "sacrebleu[ja]" in str(raised.value) and "\n" not in str(raised.value)


def test_the_paired_bootstrap_scores_with_the_tokenization_it_is_given():
    """An explicit tokenization wins over the target language in the paired test too: the difference is that of
    character-tokenized BLEU, and the signature says tok:char."""
    test = paired_bootstrap(CHINESE_HYPOTHESES, CHINESE_REFERENCES, CHINESE_REFERENCES, resamples=10, tokenize="char",
                            target_lang="zh")
    scored = {name: BLEU(tokenize="char").corpus_score(hypotheses, [CHINESE_REFERENCES]).score
              for name, hypotheses in (("baseline", CHINESE_HYPOTHESES), ("system", CHINESE_REFERENCES))}
    assert test["difference"] == pytest.approx(scored["system"] - scored["baseline"], abs=1e-9)
    assert "|tok:char|" in test["signature"]


# French spaces before ? ! : and ; a reference holds them as the model may generate them.
SPACED_PUNCTUATION = "Quoi ? Il ne vient pas , dit-il !"


def word_level_tokenizer_that_cleans_up_spaces():
    """A non-BPE tokenizer (word level, as Marian's SentencePiece ones are not BPE either) whose config asks for
    `clean_up_tokenization_spaces`, as tokenizer folders saved by transformers 4.x do; transformers applies it to such
    tokenizers on decoding unless told otherwise."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "</s>", "<s>", "<unk>", *dict.fromkeys(SPACED_PUNCTUATION.split())]
    backend = Tokenizer(models.WordLevel({word: index for index, word in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer, backend.decoder = pre_tokenizers.WhitespaceSplit(), decoders.WordPiece(cleanup=False)
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", bos_token="<s>",
                                   unk_token="<unk>", clean_up_tokenization_spaces=True)


def test_decoding_keeps_the_space_before_punctuation_whatever_the_tokenizer_config_says():
    """The translation of a model that generates the reference exactly is the reference, scored 100, even where the
    tokenizer's config asks to clean up tokenization spaces (which would write "Quoi? ... pas, dit-il!")."""
    tokenizer = word_level_tokenizer_that_cleans_up_spaces()
    ids = tokenizer(SPACED_PUNCTUATION, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) != SPACED_PUNCTUATION   # the config's cleanup applies
    rows = np.array([[tokenizer.pad_token_id, *ids, tokenizer.eos_token_id, -100]])
    assert decode_token_ids(rows, tokenizer) == [SPACED_PUNCTUATION]
    assert score_translations(decode_token_ids(rows, tokenizer), [SPACED_PUNCTUATION])["bleu"] == pytest.approx(100)
