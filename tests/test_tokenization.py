"""The joint BPE tokenizer: exact detokenization, fixed special ids, save/load through AutoTokenizer."""

import unicodedata

import pytest
from transformers import AutoTokenizer

from hf_relpos.tokenization import has_saved_tokenizer, special_token_ids, train_joint_tokenizer

GERMAN = [
    "Die Straße ist 3,5 km lang – sagte Jürgen: „Größer!“",
    "Öl, Äpfel und Übungen kosten 12,99 € (inkl. 19 % MwSt.).",
    "Wie heißt das Mädchen? Sie heißt Anna-Lena, geb. 1999.",
    "Über 1.000 Männer fuhren am 3. Oktober nach Düsseldorf.",
]
ENGLISH = [
    "The street is 3.5 km long, said Jürgen: \"Bigger!\"",
    "Oil, apples and exercises cost €12.99 (incl. 19% VAT).",
    "What's the girl's name? She's called Anna-Lena, born 1999.",
    "Over 1,000 men drove to Düsseldorf on 3 October.",
]


@pytest.fixture(scope="module")
def tokenizer():
    return train_joint_tokenizer((GERMAN + ENGLISH) * 20, vocab_size=300)


def test_round_trip_gives_back_the_detokenized_text(tokenizer):
    for text in GERMAN + ENGLISH:
        ids = tokenizer(text)["input_ids"]
        assert ids[-1] == tokenizer.eos_token_id
        assert tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_round_trip_normalizes_to_nfc(tokenizer):
    decomposed = unicodedata.normalize("NFD", GERMAN[1])
    assert decomposed != GERMAN[1]
    ids = tokenizer(decomposed)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == GERMAN[1]


def test_targets_are_encoded_like_sources(tokenizer):
    assert tokenizer(text_target=GERMAN[0])["input_ids"] == tokenizer(GERMAN[0])["input_ids"]


def test_special_token_ids_are_fixed(tokenizer):
    assert [tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.unk_token_id] == [0, 1, 2, 3]
    assert special_token_ids(tokenizer) == {
        "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2, "decoder_start_token_id": 2,
    }
    assert tokenizer.model_input_names == ["input_ids", "attention_mask"]


def test_vocabulary_size_is_configurable(tokenizer):
    assert len(tokenizer) == 300
    small = train_joint_tokenizer((GERMAN + ENGLISH) * 20, vocab_size=150)
    assert len(small) == 150


def test_saved_tokenizer_loads_with_auto_tokenizer(tokenizer, tmp_path):
    assert not has_saved_tokenizer(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert has_saved_tokenizer(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in GERMAN:
        assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
        assert loaded.decode(loaded(text)["input_ids"], skip_special_tokens=True) == text
    assert loaded.pad_token_id == 0 and loaded.eos_token_id == 1


def test_too_small_vocabulary_is_rejected():
    with pytest.raises(ValueError, match="tokenizer_vocab_size"):
        train_joint_tokenizer(GERMAN, vocab_size=4)
