"""tokenizer_character_coverage: SentencePiece's character coverage for the joint BPE tokenizer's alphabet."""

import json
import logging
import random
import unicodedata
from collections import Counter
from pathlib import Path

import pytest
from datasets import Dataset
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from hf_relpos.translation.arguments import ConfigError
from hf_relpos.translation.tokenization import (
    BYTE_TOKENS,
    MIN_FREQUENCY,
    SPECIAL_TOKENS,
    UNK_TOKEN,
    WORD_START,
    character_counts,
    settings_differences,
    tokenizer_settings,
    train_joint_tokenizer,
)
from hf_relpos.translation.training import parse_arguments

DEMO_RECIPE = str(Path(__file__).resolve().parents[1] / "configs" / "demo.yaml")
RESERVED = len(SPECIAL_TOKENS) + len(BYTE_TOKENS)
# Characters a synthetic corpus has once or twice each: CJK, Cyrillic, symbols, emoji (as web-crawled text has).
RARE = [chr(0x4E00 + offset) for offset in range(60)] + [chr(0x0416 + offset) for offset in range(20)] + [
    chr(0x2190 + offset) for offset in range(20)] + [chr(0x1F600 + offset) for offset in range(20)]


def synthetic_corpus() -> list[str]:
    """Sentences over a frequent alphabet (a-z), then one short sentence per rare character (a third of them
    twice), so that the rare characters are about 1.5 % of all character occurrences."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 7))) for _ in range(300)]
    texts = [" ".join(rng.choice(words) for _ in range(8)) for _ in range(400)]
    for index, character in enumerate(RARE):
        texts.append(f"{rng.choice(words)} {character}")
        if index % 3 == 0:
            texts.append(f"{character}{rng.choice(words)}")
    return texts


def reference_counts(texts: list[str]) -> Counter:
    """The characters of the words the trainer sees: NFC, then the Metaspace pre-tokenizer itself."""
    pre_tokenizer = pre_tokenizers.Metaspace(replacement=WORD_START, prepend_scheme="always")
    counts = Counter()
    for text in texts:
        for word, _ in pre_tokenizer.pre_tokenize_str(unicodedata.normalize("NFC", text)):
            counts.update(word)
    return counts


def sentencepiece_alphabet(counts: Counter, coverage: float) -> list[str]:
    """SentencePiece (trainer_interface.cc): characters by descending count, then code point; the shortest such
    prefix whose occurrences are at least `coverage` of all."""
    ranked = sorted(counts, key=lambda character: (-counts[character], ord(character)))
    total = sum(counts.values())
    for size in range(1, len(ranked) + 1):
        if sum(counts[character] for character in ranked[:size]) / total >= coverage:
            return ranked[:size]
    return ranked


def learned_alphabet(tokenizer) -> set[str]:
    return {token for token in tokenizer.get_vocab() if len(token) == 1}


def merges(tokenizer) -> list:
    return json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]


def test_character_counts_are_those_of_the_words_the_trainer_sees():
    texts = [" leading space", "double  space and trailing ", f"{WORD_START}marked", "tab\tand\nnewline",
             unicodedata.normalize("NFD", "Äpfel über Öl"), "", "   ", "中文 😀"]
    assert character_counts(texts) == reference_counts(texts)
    assert character_counts([texts[:3], texts[3:]]) == reference_counts(texts)   # batches count as their texts


@pytest.mark.parametrize("coverage", [0.97, 0.99, 0.995, 0.999])
def test_the_learned_alphabet_is_sentencepieces(coverage):
    texts = synthetic_corpus()
    counts = reference_counts(texts)
    expected = sentencepiece_alphabet(counts, coverage)
    assert WORD_START in expected
    tokenizer = train_joint_tokenizer(texts, vocab_size=1000, character_coverage=coverage)
    assert learned_alphabet(tokenizer) == set(expected)


def test_ties_at_the_cut_are_broken_by_code_point():
    """The coverage ends inside a run of characters seen once: SentencePiece keeps the lowest code points of them
    (the trainer's own limit_alphabet would keep any of them, in hash order)."""
    texts = synthetic_corpus()
    counts = reference_counts(texts)
    expected = sentencepiece_alphabet(counts, 0.998)
    dropped = sorted(set(counts) - set(expected), key=lambda character: (-counts[character], ord(character)))
    assert counts[expected[-1]] == counts[dropped[0]] == 1, "the test needs a tie at the cut"
    tied = [character for character in counts if counts[character] == 1]
    assert 5 < sum(character in expected for character in tied) < len(tied) - 5
    tokenizer = train_joint_tokenizer(texts, vocab_size=1000, character_coverage=0.998)
    assert learned_alphabet(tokenizer) == set(expected)


def test_rare_characters_leave_the_vocabulary_and_their_slots_go_to_merges():
    texts = synthetic_corpus()
    full = train_joint_tokenizer(texts, vocab_size=800)
    covered = train_joint_tokenizer(texts, vocab_size=800, character_coverage=0.98)
    assert set(RARE) <= learned_alphabet(full)
    assert learned_alphabet(covered) == set("abcdefghijklmnopqrstuvwxyz") | {WORD_START}
    assert len(full) == len(covered) == 800
    assert len(merges(covered)) - len(merges(full)) == len(RARE)


def test_no_piece_spans_a_character_left_to_the_bytes():
    """A character outside the alphabet is encoded as byte tokens between the pieces on either side, so a merge across
    it could never apply: every learned piece occurs in a training text as the trainer sees it (spaces as "▁", one
    in front), and the pieces around such a character are those of its neighbours."""
    texts = synthetic_corpus() + [f"qx{RARE[0]}zj"] * 60
    tokenizer = train_joint_tokenizer(texts, vocab_size=800, character_coverage=0.98)
    seen = [WORD_START + text.replace(" ", WORD_START) for text in texts]
    learned = [piece for piece in tokenizer.get_vocab() if piece not in SPECIAL_TOKENS and piece not in BYTE_TOKENS]
    assert [piece for piece in learned if not any(piece in text for text in seen)] == []
    pieces = tokenizer.convert_ids_to_tokens(tokenizer(f"qx{RARE[0]}zj", add_special_tokens=False)["input_ids"])
    assert pieces == ["▁qx", *(f"<0x{byte:02X}>" for byte in RARE[0].encode()), "zj"]


def test_rare_characters_round_trip_through_byte_fallback():
    tokenizer = train_joint_tokenizer(synthetic_corpus(), vocab_size=800, character_coverage=0.98)
    for text in ["abc 中文 und Жук → 😀!", unicodedata.normalize("NFD", "Äpfel über Öl"), f"x {RARE[0]}{RARE[-1]}"]:
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids, skip_special_tokens=True) == unicodedata.normalize("NFC", text)
    pieces = tokenizer.convert_ids_to_tokens(tokenizer(RARE[0], add_special_tokens=False)["input_ids"])
    assert pieces[-3:] == [f"<0x{byte:02X}>" for byte in RARE[0].encode()]


def test_the_word_start_is_always_kept():
    """SentencePiece's rule alone would keep only "a", the most frequent character."""
    texts = ["aaaaaaaaaa aaaaaaaaaa b"] * 10
    counts = reference_counts(texts)
    assert sentencepiece_alphabet(counts, 0.5) == ["a"]
    assert learned_alphabet(train_joint_tokenizer(texts, vocab_size=300, character_coverage=0.5)) == {"a", WORD_START}


@pytest.mark.parametrize("one_shot", [True, False], ids=["one-shot iterator", "list"])
def test_the_word_start_is_kept_at_full_coverage_whatever_fills_the_alphabet(one_shot):
    """Texts in a script without spaces, with more characters than the vocabulary has room for, each more frequent
    than the word start (one a text): the word start is still a piece. As bytes, it joined the byte tokens after it
    into one decoded token, and the decoder drops every "▁" of the first token, so a text that starts with
    characters left to the bytes lost its spaces ("Hello world" -> "Helloworld")."""
    rng = random.Random(0)
    texts = ["".join(rng.choice(RARE[:60]) for _ in range(200)) for _ in range(50)]
    tokenizer = train_joint_tokenizer(iter(texts) if one_shot else texts, vocab_size=RESERVED + 40)
    assert WORD_START in learned_alphabet(tokenizer)
    for text in ("Hello world, this is English.", f"ab {RARE[0]} c"):
        assert tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) == text


def test_an_empty_corpus_gives_a_tokenizer_that_keeps_spaces():
    tokenizer = train_joint_tokenizer([], vocab_size=300)
    assert learned_alphabet(tokenizer) == {WORD_START}
    assert tokenizer.decode(tokenizer("ab c")["input_ids"], skip_special_tokens=True) == "ab c"


def test_the_alphabet_is_capped_at_the_room_of_the_vocabulary():
    texts = synthetic_corpus()
    counts = reference_counts(texts)
    room = 10
    tokenizer = train_joint_tokenizer(texts, vocab_size=RESERVED + room, character_coverage=0.999)
    ranked = sorted(counts, key=lambda character: (-counts[character], ord(character)))
    assert ranked[0] == WORD_START and learned_alphabet(tokenizer) == set(ranked[:room])


def old_trainer_vocabulary(texts: list[str], vocab_size: int) -> tuple[dict, list]:
    """The vocabulary and merges of the trainer call before tokenizer_character_coverage: limit_alphabet = every slot
    of the vocabulary, no initial alphabet."""
    tokenizer = Tokenizer(models.BPE(unk_token=UNK_TOKEN, byte_fallback=True))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=WORD_START, prepend_scheme="always")
    pieces = vocab_size - len(BYTE_TOKENS)
    tokenizer.train_from_iterator(texts, trainer=trainers.BpeTrainer(
        vocab_size=pieces, min_frequency=MIN_FREQUENCY, special_tokens=list(SPECIAL_TOKENS),
        limit_alphabet=pieces - len(SPECIAL_TOKENS), show_progress=False))
    model = json.loads(tokenizer.to_str())["model"]
    return model["vocab"], model["merges"]


def test_full_coverage_trains_the_tokenizer_of_before():
    texts = synthetic_corpus()
    tokenizer = train_joint_tokenizer(texts, vocab_size=800, character_coverage=1.0)
    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    vocab, old_merges = old_trainer_vocabulary(texts, 800)
    special = len(SPECIAL_TOKENS)
    assert {token: index for token, index in model["vocab"].items() if token not in BYTE_TOKENS} == {
        token: index if index < special else index + len(BYTE_TOKENS) for token, index in vocab.items()}
    assert model["merges"] == old_merges


def test_a_one_shot_iterator_is_refused_below_full_coverage():
    texts = synthetic_corpus()
    with pytest.raises(TypeError, match="reads the texts twice"):
        train_joint_tokenizer(iter(texts), vocab_size=800, character_coverage=0.99)
    assert len(train_joint_tokenizer(iter(texts), vocab_size=800)) == 800   # one pass at full coverage


def test_a_re_iterable_dataset_reader_trains_like_a_list():
    from hf_relpos.translation.tokenizer_setup import TextBatches

    texts = synthetic_corpus()
    half = len(texts) // 2
    batches = TextBatches(Dataset.from_dict({"source": texts[:half], "target": texts[half:2 * half]}))
    assert list(batches) == list(batches) == [texts[:half], texts[half:2 * half]]
    from_batches = train_joint_tokenizer(batches, vocab_size=800, character_coverage=0.99)
    from_list = train_joint_tokenizer(texts[:2 * half], vocab_size=800, character_coverage=0.99)
    assert from_batches.backend_tokenizer.to_str() == from_list.backend_tokenizer.to_str()


@pytest.mark.parametrize("value", [0, 1.5, -1, True, "0.9", float("nan")])
def test_bad_coverages_are_refused_naming_the_field(value):
    message = r"tokenizer_character_coverage must be a number in \(0, 1\]"
    with pytest.raises(ValueError, match=message):
        train_joint_tokenizer(["a b"], vocab_size=300, character_coverage=value)
    if not isinstance(value, bool | str) and value == value:
        with pytest.raises(ConfigError, match=message + rf".*got {float(value)!r}$"):
            parse_arguments([DEMO_RECIPE, "--tokenizer_character_coverage", str(value)])


def test_a_tokenizer_saved_before_coverage_was_recorded_is_reused_only_at_full_coverage():
    """tokenizer_training.json of a tokenizer trained before the setting existed has no coverage: it was trained
    with every character, so it matches coverage 1 and no other."""
    old = tokenizer_settings("sha", 8000, 1.0, "train.jsonl")
    del old["tokenizer_character_coverage"]
    assert settings_differences(old, tokenizer_settings("sha", 8000, 1.0, "train.jsonl")) == []
    assert settings_differences(old, tokenizer_settings("sha", 8000, 0.9995, "train.jsonl")) == [
        "tokenizer_character_coverage 1.0 -> 0.9995"]
    recorded = tokenizer_settings("sha", 8000, 0.9995, "train.jsonl")
    assert settings_differences(recorded, tokenizer_settings("sha", 8000, 0.9995, "train.jsonl")) == []
    assert settings_differences(recorded, tokenizer_settings("sha", 8000, 1.0, "train.jsonl")) == [
        "tokenizer_character_coverage 0.9995 -> 1.0"]


def test_a_run_reuses_an_old_tokenizer_at_full_coverage_and_retrains_at_another(tmp_path):
    """obtain_tokenizer with a tokenizer in output_dir saved without the coverage key (as before the setting)."""
    from hf_relpos.translation.tokenizer_setup import obtain_tokenizer, save_tokenizer

    texts = synthetic_corpus()
    half = len(texts) // 2
    train = Dataset.from_dict({"source": texts[:half], "target": texts[half:2 * half]})

    def obtain(coverage: str, retrain: bool = False):
        arguments = parse_arguments([DEMO_RECIPE, "--output_dir", str(tmp_path), "--tokenizer_vocab_size", "600",
                                     "--tokenizer_character_coverage", coverage])
        return obtain_tokenizer(*arguments, "sha", lambda: train, retrain=retrain, resuming=False)

    tokenizer, settings = obtain("1.0")
    assert settings["tokenizer_character_coverage"] == 1.0
    del settings["tokenizer_character_coverage"]
    save_tokenizer(tokenizer, tmp_path, settings)
    reused, new_settings = obtain("1")
    assert new_settings is None and reused.get_vocab() == tokenizer.get_vocab()
    with pytest.raises(ConfigError, match=r"tokenizer_character_coverage 1\.0 -> 0\.9995"):
        obtain("0.9995")
    retrained, new_settings = obtain("0.9995", retrain=True)
    assert new_settings["tokenizer_character_coverage"] == 0.9995
    assert learned_alphabet(retrained) < learned_alphabet(tokenizer)


def test_characters_that_fill_the_vocabulary_are_kept_by_count_then_code_point_and_said(caplog):
    """At full coverage, training texts with more characters than the vocabulary has room for: the alphabet is the
    most frequent characters, ties broken by code point as at any other coverage, so every training (another process,
    another node of a launch) gives the same tokenizer (the trainer alone broke the ties in hash order: another
    alphabet each time), and a warning says that no merge was learnt and what to set."""
    greek = "".join(chr(0x3B1 + offset) for offset in range(20))   # 20 characters, 3 occurrences each: a tie at the cut
    texts = ["abc abc abc"] * 50 + [greek] * 3
    room = 10
    with caplog.at_level("WARNING", logger="hf_relpos.translation.tokenization"):
        alphabets = [learned_alphabet(train_joint_tokenizer(texts, vocab_size=RESERVED + room)) for _ in range(4)]
    assert alphabets == [{WORD_START, "a", "b", "c", *greek[:6]}] * 4
    assert "the most frequent characters of the 24 distinct characters of the training texts" in caplog.text
    assert "learnt no merges" in caplog.text and "lower tokenizer_character_coverage" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="hf_relpos.translation.tokenization"):
        assert learned_alphabet(train_joint_tokenizer(texts, vocab_size=RESERVED + room, character_coverage=0.999)) \
            == alphabets[0]
    assert "learnt no merges" in caplog.text and "tokenizer_character_coverage 0.999 keeps" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="hf_relpos.translation.tokenization"):
        roomy = train_joint_tokenizer(texts, vocab_size=RESERVED + 30)   # room for the 24 characters and merges
    assert learned_alphabet(roomy) == {WORD_START, "a", "b", "c", *greek} and merges(roomy)
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING] == []
