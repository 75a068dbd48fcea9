"""The joint BPE tokenizer: exact detokenization, fixed special ids, save/load through AutoTokenizer."""

import hashlib
import io
import json
import pickle
import unicodedata

import pytest
import sentencepiece
from conftest import run_without_hf_relpos
from tokenizers import Tokenizer
from transformers import AutoTokenizer, MarianTokenizer, NllbTokenizer, PreTrainedTokenizerFast

from hf_relpos import RelPosTokenizer, RelPosTransformerConfig, RelPosTransformerForConditionalGeneration
from hf_relpos.translation.data import batch_encoder, unwritable_texts
from hf_relpos.translation.prepared import tokenizer_sha256
from hf_relpos.translation.tokenization import (
    has_saved_tokenizer,
    load_tokenizer,
    special_token_ids,
    train_joint_tokenizer,
)

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
    return train_joint_tokenizer((GERMAN + ENGLISH) * 20, vocab_size=556)


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
    assert len(tokenizer) == 556
    small = train_joint_tokenizer((GERMAN + ENGLISH) * 20, vocab_size=406)
    assert len(small) == 406


def test_a_word_seen_once_is_not_learnt_as_a_piece():
    """min_frequency 2 (the recorded training recipe): merges come from pairs seen at least twice, so a word that
    occurs once stays in characters while a repeated one becomes a piece."""
    tokenizer = train_joint_tokenizer(["zqxw"] + ["ab cd ab cd"] * 10, vocab_size=300)
    assert tokenizer.tokenize("ab") == ["\u2581ab"]
    assert tokenizer.tokenize("zqxw") == ["\u2581", "z", "q", "x", "w"]


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
    with pytest.raises(ValueError, match=r"tokenizer_vocab_size must be larger than 260 \(4 special and 256 "
                                         r"byte-fallback tokens\), got 260"):
        train_joint_tokenizer(GERMAN, vocab_size=260)


# Characters a German-English training text rarely has: dashes and typographic quotes, emoji (also a modifier
# sequence), other scripts, accents on capitals, fractions, control characters.
RARE_TEXTS = [
    "3,5 km/h — Straße!",
    "Emoji 🙂 👍🏽 and «ñandú» ¿qué? ‰ ½ § ©",
    "Ελληνικά, русский, 中文, עברית, हिन्दी",
    "ÅNGSTRÖM – ‘quoted’ … ™ ǅ",
    "tab\there, line\nbreak, double  space ",
]


@pytest.mark.parametrize("text", RARE_TEXTS)
def test_no_character_is_lost(tokenizer, text):
    """Byte fallback: a character outside the learned alphabet becomes its UTF-8 bytes, so decode(encode(x)) is x
    after normalisation (NFC), never x with characters missing or <unk>."""
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == unicodedata.normalize("NFC", text)


# Text that spells a special token: an HTML strikethrough, a corpus whose unknown words were written as <unk>.
SPECIAL_TOKENS_AS_TEXT = "Er schrieb <s>alt</s> neu, x <unk> y und <pad>."


def test_text_that_spells_a_special_token_is_text(tokenizer, tmp_path):
    """A "<s>", "</s>", "<unk>" or "<pad>" written in a sentence is encoded as its characters, as SentencePiece encodes
    it, not as the control token: a "</s>" inside a training target would teach the model to stop there, and decoding
    would drop it. The one </s> is the one the tokenizer appends, and the saved tokenizer does the same."""
    specials = {tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.unk_token_id}
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    for encoder in (tokenizer, loaded):
        ids = encoder(SPECIAL_TOKENS_AS_TEXT)["input_ids"]
        assert [index for index in ids if index in specials] == [tokenizer.eos_token_id] and ids[-1] == 1
        assert encoder(text_target=SPECIAL_TOKENS_AS_TEXT)["input_ids"] == ids
        assert encoder.decode(ids, skip_special_tokens=True) == SPECIAL_TOKENS_AS_TEXT
        assert encoder.tokenize("x <unk> y")[:1] == encoder.tokenize("x y")[:1]   # its neighbour's pieces unchanged
    assert loaded(SPECIAL_TOKENS_AS_TEXT)["input_ids"] == tokenizer(SPECIAL_TOKENS_AS_TEXT)["input_ids"]


def test_the_prepared_data_key_of_a_marian_tokenizer_follows_its_sentencepiece_models(tmp_path):
    """Prepared data is keyed by the tokenizer: two Marian tokenizers with one vocab.json and source.spm but other
    target.spm segment the targets into other ids, so their keys differ; a tokenizer saved and loaded again keeps its
    key (a rerun reuses its data)."""
    texts = {"wide": ["das haus ist gross", "ein kleines haus", "the house is big"] * 40,
             "narrow": ["d a s h a u s", "i s t g r o s s", "e i n k l e i n"] * 40}
    models = {}
    for name, lines in texts.items():
        model = io.BytesIO()
        sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=30,
                                                 model_type="bpe", unk_id=0, eos_id=1, bos_id=-1, pad_id=-1,
                                                 minloglevel=2)
        (tmp_path / f"{name}.spm").write_bytes(models.setdefault(name, model.getvalue()))
    vocab = {"</s>": 1, "<unk>": 0}
    for name in models:
        processor = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / f"{name}.spm"))
        for index in range(processor.get_piece_size()):
            vocab.setdefault(processor.id_to_piece(index), len(vocab))
    vocab["<pad>"] = len(vocab)
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    tokenizers = {target: MarianTokenizer(vocab=str(tmp_path / "vocab.json"), source_spm=str(tmp_path / "wide.spm"),
                                          target_spm=str(tmp_path / f"{target}.spm"))
                  for target in models}
    labels = {target: tokenizer(text_target=["das haus ist gross"])["input_ids"]
              for target, tokenizer in tokenizers.items()}
    assert labels["wide"] != labels["narrow"]
    assert tokenizer_sha256(tokenizers["wide"]) != tokenizer_sha256(tokenizers["narrow"])
    tokenizers["wide"].save_pretrained(tmp_path / "saved")
    assert tokenizer_sha256(AutoTokenizer.from_pretrained(tmp_path / "saved")) == tokenizer_sha256(tokenizers["wide"])


def test_the_prepared_data_key_of_a_tokenizer_with_a_target_mode_follows_its_target_language():
    """NLLB's tokenizer puts tgt_lang's token in front of the labels only while it encodes text_target (its target
    mode): two tokenizers that differ in tgt_lang alone (a tokenizer_config.json corrected between runs) give other
    labels, so their keys differ; the key leaves the tokenizer in input mode, its sources encoded as before."""
    tokenizers = {language: NllbTokenizer(src_lang="eng_Latn", tgt_lang=language)
                  for language in ("deu_Latn", "fra_Latn")}
    encoders = {language: batch_encoder(tokenizer) for language, tokenizer in tokenizers.items()}
    assert encoders["deu_Latn"](["hello"], True) != encoders["fra_Latn"](["hello"], True)
    sources = encoders["deu_Latn"](["hello"], False)
    keys = {language: tokenizer_sha256(tokenizer) for language, tokenizer in tokenizers.items()}
    assert keys["deu_Latn"] != keys["fra_Latn"]
    assert tokenizer_sha256(NllbTokenizer(src_lang="eng_Latn", tgt_lang="deu_Latn")) == keys["deu_Latn"]
    assert encoders["deu_Latn"](["hello"], False) == sources


def test_the_prepared_data_key_of_a_tokenizer_says_whether_it_splits_special_token_text(tokenizer):
    """Prepared data is keyed by the tokenizer's ids: a tokenizer that splits "</s>" in the text and one that does
    not (one saved before) encode the same text differently, so their keys differ; the latter's is the key of before."""
    backend = tokenizer.backend_tokenizer
    unsplit = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", pad_token="<pad>")
    assert unsplit(SPECIAL_TOKENS_AS_TEXT)["input_ids"] != tokenizer(SPECIAL_TOKENS_AS_TEXT)["input_ids"]
    assert tokenizer_sha256(unsplit) != tokenizer_sha256(tokenizer)
    before = hashlib.sha256(f"{type(unsplit).__name__}\0{backend.to_str()}".encode()).hexdigest()
    assert tokenizer_sha256(unsplit) == before


def test_byte_tokens_follow_the_special_tokens(tokenizer):
    assert [tokenizer.convert_ids_to_tokens(index) for index in (4, 5, 259)] == ["<0x00>", "<0x01>", "<0xFF>"]
    dash = tokenizer("—", add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(dash)[-3:] == ["<0xE2>", "<0x80>", "<0x94>"]


def test_text_that_spells_a_byte_token_is_text():
    """A training text that spells a byte token ("<0x41>" after a word, as hex dumps and software strings write it)
    yields no learned piece of that spelling: it took the byte token's id, and the decoder turned it into the byte, so
    "zz<0x41>" came back as "zzA". The learned ids stay contiguous after the byte tokens."""
    words = ["a", "bb", "cc", "dd", "ee", "ff", "gg", "hh"]
    tokenizer = train_joint_tokenizer([f"{word}<0x41>" for word in words] * 60 + ["Guten Tag"] * 20, vocab_size=400)
    for text in ("bb<0x41>", "zz<0x41>", "<0x41>", "x <0xE2> y"):
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert sorted(tokenizer.get_vocab().values()) == list(range(len(tokenizer)))
    assert tokenizer.convert_ids_to_tokens(69) == "<0x41>"


def test_text_that_spells_a_special_token_after_a_word_is_text():
    """A training text with "</s>" or "<unk>" after a word (markup, a corpus's placeholders) yields no learned piece
    of that spelling: it took the control token's id, so "zz</s>" was encoded with an end token inside (what a
    training target must never hold) and decoded as "zz"."""
    words = ["a", "bb", "cc", "dd", "ee", "ff", "gg", "hh"]
    texts = [f"{word}</s>" for word in words] * 60 + [f"{word}<unk>" for word in words[:3]] * 60 + ["Guten Tag"] * 20
    tokenizer = train_joint_tokenizer(texts, vocab_size=400)
    specials = {tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.unk_token_id}
    for text in ("bb</s>", "zz</s>", "qq<unk>", "a<unk>", "<s>x"):
        ids = tokenizer(text)["input_ids"]
        assert [index for index in ids if index in specials] == [tokenizer.eos_token_id]
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert sorted(tokenizer.get_vocab().values()) == list(range(len(tokenizer)))


def test_rare_characters_of_the_training_text_are_left_to_byte_fallback():
    """The learned alphabet is limited to the pieces the vocabulary has room for: a tiny vocabulary still encodes
    every character, the rarest ones as bytes."""
    tokenizer = train_joint_tokenizer((GERMAN + ENGLISH) * 20, vocab_size=280)
    assert len(tokenizer) == 280
    for text in GERMAN + ENGLISH:
        assert tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) == text


def test_the_trainer_says_when_it_goes_on_to_its_merges(caplog):
    """The progress bar counts the texts read; once the trainer has read the last one, a log line says that the
    merges, which show no progress, follow (at 1.5M pairs the bar stood at 100 % for 100 s of silence)."""
    said_before = []

    def texts():
        for text in ENGLISH + GERMAN:
            said_before.append("merges" in caplog.text)
            yield text

    with caplog.at_level("INFO", logger="hf_relpos.translation.tokenization"):
        train_joint_tokenizer(texts(), vocab_size=300)
    assert said_before == [False] * len(ENGLISH + GERMAN)
    assert f"has read the {len(ENGLISH) + len(GERMAN)} texts; it now learns the BPE merges" in caplog.text


TOKENIZER_WITHOUT_HF_RELPOS = """
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained({folder!r}, trust_remote_code=False)
for text in {texts!r}:
    assert tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) == text, text
print("ROUND TRIP OK", type(tokenizer).__name__, len(tokenizer))
"""


def test_saved_tokenizer_loads_without_hf_relpos_and_without_custom_code(tokenizer, tmp_path):
    """Next to a model whose config.json declares remote code, in a process without hf_relpos and with stdin closed:
    AutoTokenizer loads the tokenizer without running (or being asked about) any custom code."""
    folder = tmp_path / "model"
    RelPosTransformerForConditionalGeneration(RelPosTransformerConfig(
        vocab_size=len(tokenizer), d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    assert "AutoConfig" in json.loads((folder / "config.json").read_text())["auto_map"]
    texts = [unicodedata.normalize("NFC", text) for text in RARE_TEXTS + GERMAN + [SPECIAL_TOKENS_AS_TEXT]]
    completed = run_without_hf_relpos(TOKENIZER_WITHOUT_HF_RELPOS.format(folder=str(folder), texts=texts), tmp_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "ROUND TRIP OK" in completed.stdout and str(len(tokenizer)) in completed.stdout
    assert "custom code" not in completed.stdout + completed.stderr
    assert not (tmp_path / "modules").exists(), "no remote code was copied into the module cache"


@pytest.mark.parametrize("text", ["Die<neu>Straße", "<neu>Straße ist lang", "Die <neu> Straße", "<neu> x<neu>y",
                                  "ein <2de>Satz"])
def test_an_added_token_next_to_a_word_leaves_the_word_as_it_is_written(tokenizer, tmp_path, text):
    """Tokens added with `add_tokens` (a placeholder, a tag): the text after one is not a new word unless a space
    starts it, so decoding gives the text back. With a word start in front of every piece of text between added
    tokens, "Die<neu>Straße" was encoded as "▁Die", "<neu>", "▁Straße" and decoded as "Die<neu> Straße"."""
    tokenizer.save_pretrained(tmp_path)
    added = AutoTokenizer.from_pretrained(tmp_path)
    added.add_tokens(["<neu>", "<2de>"])
    added.save_pretrained(tmp_path / "added")
    for encoder in (added, AutoTokenizer.from_pretrained(tmp_path / "added")):
        assert encoder.decode(encoder(text)["input_ids"], skip_special_tokens=True) == text
    assert not any(piece.startswith("\u2581") for piece in added.tokenize("Die<neu>Straße")[2:])


LANGUAGE_TAGS = [">>deu<<", ">>fra<<"]
TAGGED_TEXT = ">>deu<< Er schrieb </s> und <pad>, >>fra<<x."


def _tagged(tokenizer, folder, how):
    """The tokenizer saved to and loaded from `folder`, with `LANGUAGE_TAGS` added as special tokens `how`."""
    tokenizer.save_pretrained(folder)
    tagged = AutoTokenizer.from_pretrained(folder)
    if how == "add_special_tokens":
        tagged.add_special_tokens({"additional_special_tokens": LANGUAGE_TAGS})
    else:
        tagged.add_tokens(LANGUAGE_TAGS, special_tokens=True)
    return tagged


@pytest.mark.parametrize("how", ["add_special_tokens", "add_tokens"])
def test_a_language_tag_added_as_a_special_token_is_one_id_and_skipped_when_decoding(tokenizer, tmp_path, how):
    """Language tags added as special tokens (`add_special_tokens({"additional_special_tokens": [...]})`, or
    `add_tokens(..., special_tokens=True)`) are one id each wherever the text spells them, and
    `decode(..., skip_special_tokens=True)` drops them, as in any Hugging Face tokenizer; a "</s>" or "<pad>" written
    in the same text is still its characters. With `split_special_tokens`, the tags were encoded as their characters
    too. The saved tokenizer, loaded with AutoTokenizer, does the same."""
    tagged = _tagged(tokenizer, tmp_path, how)
    tag_ids = tagged.convert_tokens_to_ids(LANGUAGE_TAGS)
    assert tag_ids == [len(tokenizer), len(tokenizer) + 1]
    controls = {tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.unk_token_id}
    tagged.save_pretrained(tmp_path / "tagged")
    for encoder in (tagged, AutoTokenizer.from_pretrained(tmp_path / "tagged")):
        ids = encoder(TAGGED_TEXT)["input_ids"]
        assert [index for index in ids if index in tag_ids] == tag_ids and ids[0] == tag_ids[0]
        assert [index for index in ids if index in controls] == [tokenizer.eos_token_id]
        assert encoder(text_target=TAGGED_TEXT)["input_ids"] == ids
        assert encoder.decode(ids) == TAGGED_TEXT + "</s>"
        assert encoder.decode(ids, skip_special_tokens=True) == "Er schrieb </s> und <pad>, x."
        assert encoder.decode([ids], skip_special_tokens=True) == ["Er schrieb </s> und <pad>, x."]
        assert encoder(SPECIAL_TOKENS_AS_TEXT)["input_ids"] == tokenizer(SPECIAL_TOKENS_AS_TEXT)["input_ids"]
        assert set(LANGUAGE_TAGS) <= set(encoder.all_special_tokens)


def test_a_tokenizer_saved_by_another_class_reads_its_language_tags_from_text_once_loaded_as_relpos(tokenizer, tmp_path):
    """A tokenizer saved as a plain `TokenizersBackend` with tags added as special tokens (special in its
    tokenizer.json, so never read from text under `split_special_tokens`): `RelPosTokenizer.from_pretrained` reads them
    from text, and saved again it names its class."""
    plain = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, pad_token="<pad>", eos_token="</s>",
                                    bos_token="<s>", unk_token="<unk>", split_special_tokens=True)
    plain.add_special_tokens({"additional_special_tokens": LANGUAGE_TAGS})
    plain.save_pretrained(tmp_path)
    assert plain(TAGGED_TEXT)["input_ids"][0] != plain.convert_tokens_to_ids(LANGUAGE_TAGS[0])
    loaded = RelPosTokenizer.from_pretrained(tmp_path)
    ids = loaded(TAGGED_TEXT)["input_ids"]
    assert ids[0] == loaded.convert_tokens_to_ids(LANGUAGE_TAGS[0])
    assert loaded.decode(ids, skip_special_tokens=True) == "Er schrieb </s> und <pad>, x."
    assert loaded.extra_special_tokens == LANGUAGE_TAGS
    loaded.save_pretrained(tmp_path / "again")
    assert type(AutoTokenizer.from_pretrained(tmp_path / "again")) is RelPosTokenizer


def test_the_training_data_path_encodes_a_language_tag_as_its_id(tokenizer, tmp_path):
    """The app's encoder of training pairs (`batch_encoder`, straight from the Rust backend for this package's
    tokenizer), also in a copy pickled into a preprocessing worker, gives a tag prefixed to a source its one id, and
    "</s>" in the text its characters, as `tokenizer(texts)` does."""
    tagged = _tagged(tokenizer, tmp_path, "add_special_tokens")
    texts = [TAGGED_TEXT, ">>fra<< " + GERMAN[0]]
    for encoder in (tagged, pickle.loads(pickle.dumps(tagged))):
        ids = batch_encoder(encoder)(texts, False)
        assert ids == tagged(texts)["input_ids"] == batch_encoder(encoder)(texts, True)
        assert [row[0] for row in ids] == tagged.convert_tokens_to_ids([">>deu<<", ">>fra<<"])


TAGGED_TOKENIZER_WITHOUT_HF_RELPOS = """
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained({folder!r}, trust_remote_code=False)
print("IDS", tokenizer({text!r})["input_ids"])
print("DECODED", repr(tokenizer.decode(tokenizer({text!r})["input_ids"], skip_special_tokens=True)))
"""


def test_a_language_tag_is_one_id_in_the_saved_tokenizer_loaded_without_hf_relpos(tokenizer, tmp_path):
    """Where hf_relpos is not installed, AutoTokenizer loads the saved tokenizer as a plain `TokenizersBackend`: the
    tags are still one id each and "</s>" in the text is still text; only skip_special_tokens keeps the tags."""
    tagged = _tagged(tokenizer, tmp_path, "add_special_tokens")
    tagged.save_pretrained(tmp_path / "tagged")
    script = TAGGED_TOKENIZER_WITHOUT_HF_RELPOS.format(folder=str(tmp_path / "tagged"), text=TAGGED_TEXT)
    completed = run_without_hf_relpos(script, tmp_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    ids = tagged(TAGGED_TEXT)["input_ids"]
    assert ids[0] == tagged.convert_tokens_to_ids(LANGUAGE_TAGS[0]) and f"IDS {ids}" in completed.stdout
    assert f"DECODED {TAGGED_TEXT!r}" in completed.stdout


def test_a_text_without_added_tokens_is_encoded_as_with_a_word_start_before_every_piece(tokenizer):
    """The word start is put in front of the text only, not in front of each piece between added tokens: a text
    without added tokens is one piece, so its ids are those of a word start in front of every piece (the
    pre-tokenizer of the tokenizers saved before)."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    assert spec["pre_tokenizer"]["prepend_scheme"] == "first"
    spec["pre_tokenizer"]["prepend_scheme"] = "always"
    before = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), split_special_tokens=True)
    texts = GERMAN + ENGLISH + RARE_TEXTS + [SPECIAL_TOKENS_AS_TEXT, "  two spaces first", "", " "]
    assert tokenizer(texts)["input_ids"] == before(texts)["input_ids"]
    assert tokenizer(GERMAN, ENGLISH)["input_ids"] == before(GERMAN, ENGLISH)["input_ids"]


def test_the_word_start_mark_written_in_a_text_comes_back_as_a_space_and_is_named_in_a_reference(tokenizer):
    """The one character besides a leading space that the round trip does not give back (as in SentencePiece):
    "▁" itself, which a reference warning names."""
    text = "x\u2581y"
    decoded = tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True)
    assert decoded == "x y"
    assert unwritable_texts([text], [decoded]) == ([0], ["\u2581"])


def test_a_loaded_tokenizer_saves_the_files_it_was_loaded_from(tmp_path):
    """A tokenizer the app loads (a resumed run's, a fine-tuning run's) and saves again writes the same
    tokenizer_config.json: nothing of how it was loaded (transformers keeps `is_local` and `local_files_only`)."""
    tokenizer = train_joint_tokenizer(["a small dog", "ein kleiner Hund", "a big cat", "eine große Katze"] * 20, 300)
    tokenizer.save_pretrained(tmp_path / "trained")
    load_tokenizer(tmp_path / "trained").save_pretrained(tmp_path / "saved_again")
    for name in ("tokenizer_config.json", "tokenizer.json"):
        assert (json.loads((tmp_path / "saved_again" / name).read_text(encoding="utf-8"))
                == json.loads((tmp_path / "trained" / name).read_text(encoding="utf-8"))), name
