"""`python -m hf_relpos.tools.convert marian FOLDER OUT` on a folder laid out as a Hub MarianMT checkpoint (opus-mt-en-de:
config.json with Marian's legacy keys, model.safetensors or pytorch_model.bin, source.spm / target.spm SentencePiece
models, vocab.json, tokenizer_config.json, generation_config.json), built here from two tiny SentencePiece models: the
converted folder's tokenizer works, and the model scores and generates as Marian."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import sentencepiece
import torch
from huggingface_hub.errors import EntryNotFoundError
from test_convert import marian_model
from transformers import AutoConfig, AutoTokenizer, MarianMTModel, MarianTokenizer, pipeline

from hf_relpos import RelPosTransformerForConditionalGeneration, TranslationPipeline
from hf_relpos.model.positions import sinusoids
from hf_relpos.publish.hub import files_to_push, folder_model_card, model_conversion, render_model_card
from hf_relpos.publish.pipeline_relpos import language_tags
from hf_relpos.publish.records import CONVERSION_RECORD_FILE, ConversionRecord, RunRecord, conversion_record
from hf_relpos.tools import convert as convert_module
from hf_relpos.tools.convert import main
from hf_relpos.tools.sentences import translate_by_sentence
from hf_relpos.translation.demo_corpus import write_demo_corpus

REPO = Path(__file__).resolve().parents[1]
# Keys of opus-mt-en-de's config.json that MarianConfig does not use (kept in Hub checkpoints from the Marian port).
LEGACY_CONFIG = {"add_bias_logits": False, "add_final_layer_norm": False, "normalize_before": False,
                 "normalize_embedding": False, "static_position_embeddings": True, "classif_dropout": 0.0,
                 "gradient_checkpointing": False}


def train_sentencepiece(texts: list[str], path: Path) -> None:
    """A 60-piece unigram model, Marian's special ids (<unk> 0, </s> 1, no <s>, no <pad>)."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=60, model_type="unigram", character_coverage=1.0,
        unk_id=0, eos_id=1, bos_id=-1, pad_id=-1, minloglevel=2)
    path.write_bytes(model.getvalue())


@pytest.fixture(scope="module")
def hub_folder(tmp_path_factory) -> Path:
    """The opus-mt layout: one joint vocab.json over the pieces of both SentencePiece models, </s> = 0, <unk> = 1,
    target-language tokens (>>fra<<, >>deu<<, as in opus-mt-en-ROMANCE), <pad> last, decoding started with <pad>,
    generation_config with beam 4 and <pad> banned."""
    folder = tmp_path_factory.mktemp("opus-mt-en-de-tiny")
    write_demo_corpus(folder / "data", 60, 6, 6, seed=2)
    pairs = [json.loads(line)["translation"] for line in (folder / "data" / "train.jsonl").read_text().splitlines()]
    model_folder = folder / "model"
    model_folder.mkdir()
    train_sentencepiece([pair["en"] for pair in pairs], model_folder / "source.spm")
    train_sentencepiece([pair["de"] for pair in pairs], model_folder / "target.spm")
    vocab = {"</s>": 0, "<unk>": 1, ">>fra<<": 2, ">>deu<<": 3}   # target-language tokens, as a multilingual model's
    for name in ("source.spm", "target.spm"):
        processor = sentencepiece.SentencePieceProcessor(model_file=str(model_folder / name))
        for index in range(processor.get_piece_size()):
            vocab.setdefault(processor.id_to_piece(index), len(vocab))
    vocab["<pad>"] = pad = len(vocab)
    (model_folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    tokenizer = MarianTokenizer(vocab=str(model_folder / "vocab.json"), source_spm=str(model_folder / "source.spm"),
                                target_spm=str(model_folder / "target.spm"), source_lang="en", target_lang="de")
    tokenizer.save_pretrained(model_folder)
    marian = marian_model(vocab_size=len(vocab), pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad,
                          forced_eos_token_id=0, bos_token_id=0, max_position_embeddings=256)
    marian.generation_config.update(num_beams=4, max_length=40, bad_words_ids=[[pad]], forced_eos_token_id=0)
    marian.save_pretrained(model_folder)
    config = json.loads((model_folder / "config.json").read_text())
    (model_folder / "config.json").write_text(json.dumps({**config, **LEGACY_CONFIG}, indent=2))
    assert {"config.json", "model.safetensors", "source.spm", "target.spm", "vocab.json", "tokenizer_config.json",
            "generation_config.json"} <= {path.name for path in model_folder.iterdir()}
    return folder


def convert(source: Path, output: Path, *options: str) -> Path:
    completed = subprocess.run([sys.executable, "-m", "hf_relpos.tools.convert", "marian", str(source), str(output), *options],
                               capture_output=True, text=True, timeout=300, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return output


def float64_marian(folder: Path) -> MarianMTModel:
    """The saved Marian model in float64, its sinusoid tables computed in float64 (stored rounded to float32)."""
    marian = MarianMTModel.from_pretrained(folder).eval().double()
    with torch.no_grad():
        for stack in (marian.model.encoder, marian.model.decoder):
            table = stack.embed_positions.weight
            table.copy_(sinusoids(torch.arange(table.size(0)), table.size(1), torch.float64))
    return marian


def sentences(folder: Path, split: str = "test") -> list[str]:
    return [json.loads(line)["translation"]["en"] for line in (folder / "data" / f"{split}.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("options", [("--position_scheme", "shaw", "--keep_absolute_positions"),
                                     ("--position_scheme", "absolute")])
def test_hub_folder_converts_with_a_working_tokenizer_same_logits_and_same_translations(hub_folder, tmp_path, options):
    source = hub_folder / "model"
    output = convert(source, tmp_path / "converted", *options)
    assert {"source.spm", "target.spm", "vocab.json", "tokenizer_config.json", "generation_config.json",
            "model.safetensors", "config.json"} <= {path.name for path in output.iterdir()}

    # (b) the converted folder's tokenizer is Marian's, and encodes and decodes as the source folder's does
    tokenizer, source_tokenizer = AutoTokenizer.from_pretrained(output), AutoTokenizer.from_pretrained(source)
    assert isinstance(tokenizer, MarianTokenizer)
    english, german = sentences(hub_folder), ["Die alte Frau mag den großen König."]
    encoded = tokenizer(english, text_target=german * len(english))
    assert encoded == source_tokenizer(english, text_target=german * len(english))
    assert tokenizer.batch_decode(encoded["input_ids"], skip_special_tokens=True) == english
    assert tokenizer.decode(encoded["labels"][0], skip_special_tokens=True) == german[0]

    # (a) the same logits as Marian in float64, on a padded batch
    inputs = tokenizer(english[:3], text_target=german * 3, padding=True, return_tensors="pt")
    assert (inputs["attention_mask"] == 0).any()
    labels = inputs.pop("labels")
    decoder_input_ids = torch.cat([torch.full_like(labels[:, :1], tokenizer.pad_token_id), labels[:, :-1]], dim=1)
    loaded = RelPosTransformerForConditionalGeneration.from_pretrained(output).eval()
    with torch.no_grad():
        expected = float64_marian(source)(**inputs, decoder_input_ids=decoder_input_ids).logits
        actual = RelPosTransformerForConditionalGeneration.from_pretrained(output).eval().double()(
            **inputs, decoder_input_ids=decoder_input_ids).logits
    assert (actual - expected).abs().max() < 1e-12

    # (c) the same translations, with the generation config carried over (beam 4, <pad> banned, forced </s>)
    marian = MarianMTModel.from_pretrained(source).eval()
    assert loaded.generation_config.num_beams == 4 and loaded.generation_config.bad_words_ids == [[tokenizer.pad_token_id]]
    for num_beams in (1, 4):
        generated = loaded.generate(**inputs, num_beams=num_beams, no_repeat_ngram_size=2)
        assert len(set(generated[:, 1:].flatten().tolist())) > 4
        assert torch.equal(generated, marian.generate(**inputs, num_beams=num_beams, no_repeat_ngram_size=2))


def test_the_converted_tokenizer_has_no_length_limit_as_the_model_has_none(hub_folder, tmp_path, caplog):
    """Marian's tokenizer keeps its position table's 512 as `model_max_length`, so encoding a longer source warned of
    "indexing errors" and `truncation=True` cut it; the converted model computes positions for any length."""
    output = tmp_path / "converted"
    assert main(["marian", str(hub_folder / "model"), str(output), "--position_scheme", "shaw"]) == 0
    assert AutoTokenizer.from_pretrained(hub_folder / "model").model_max_length == 512
    tokenizer = AutoTokenizer.from_pretrained(output)
    long_source = " ".join(sentences(hub_folder) * 60)
    with caplog.at_level(logging.WARNING):
        encoded = tokenizer(long_source, truncation=True).input_ids
    assert len(encoded) > 512 and encoded == tokenizer(long_source).input_ids
    assert "indexing errors" not in caplog.text


def test_hub_folder_with_pytorch_model_bin_converts(hub_folder, tmp_path):
    """Older Hub checkpoints hold pytorch_model.bin instead of model.safetensors."""
    source = tmp_path / "bin"
    shutil.copytree(hub_folder / "model", source)
    marian = MarianMTModel.from_pretrained(source)
    (source / "model.safetensors").unlink()
    torch.save(marian.state_dict(), source / "pytorch_model.bin")
    output = tmp_path / "converted"
    assert main(["marian", str(source), str(output), "--position_scheme", "xl", "--keep_absolute_positions"]) == 0
    loaded = RelPosTransformerForConditionalGeneration.from_pretrained(output).eval()
    inputs = AutoTokenizer.from_pretrained(output)(sentences(hub_folder)[:2], padding=True, return_tensors="pt")
    assert torch.equal(loaded.generate(**inputs, max_new_tokens=10), marian.eval().generate(**inputs, max_new_tokens=10))


def test_a_converted_folder_pushes_its_marian_tokenizer(hub_folder, tmp_path):
    """What a push of a converted folder uploads (`files_to_push`) holds the MarianTokenizer it kept (its .spm models
    and vocab.json; it has no tokenizer.json): a folder of exactly those files encodes as the converted one. Without
    one of them the push is refused, naming it."""
    output = convert(hub_folder / "model", tmp_path / "converted", "--position_scheme", "shaw",
                     "--keep_absolute_positions")
    uploaded = tmp_path / "uploaded"
    uploaded.mkdir()
    for name, path in files_to_push(output).items():
        shutil.copy(path, uploaded / name)
    english = sentences(hub_folder)
    assert AutoTokenizer.from_pretrained(uploaded)(english) == AutoTokenizer.from_pretrained(output)(english)
    (output / "target.spm").unlink()
    with pytest.raises(ValueError, match=r"lacks target\.spm"):
        files_to_push(output)


def test_the_cards_of_a_converted_folder_and_of_its_fine_tuning_name_the_marian_model(hub_folder, tmp_path):
    """The converted folder records what it was converted from (conversion.json, not uploaded: it may hold a local
    path); its card, and the card of a run that fine-tunes it, name the MarianMT model and the conversion, and link a
    Hub source as `base_model`."""
    source, output = hub_folder / "model", tmp_path / "converted"
    assert main(["marian", str(source), str(output), "--position_scheme", "shaw", "--keep_absolute_positions",
                 "--set", "max_relative_position=4"]) == 0
    assert conversion_record(output) == ConversionRecord(
        source=str(source), source_on_hub=False, source_type="marian", position_scheme="shaw",
        reproduces_source=True, keep_absolute_positions=True, settings={"max_relative_position": 4})
    assert CONVERSION_RECORD_FILE not in files_to_push(output)
    card = folder_model_card(output, None)
    assert (f"## Conversion\n\nThese weights are the MarianMT model `<local>/{source.name}`, converted to hf_relpos by "
            "`hf-relpos-convert marian` (`position_scheme: shaw`, `keep_absolute_positions: true`, "
            "`max_relative_position: 4`): it keeps the source's sinusoidal positions") in card

    run = RunRecord(model_name_or_path=output.name, working_directory=str(tmp_path))
    fine_tuned = tmp_path / "finetuned"
    fine_tuned.mkdir()
    assert model_conversion(fine_tuned, run) == conversion_record(output)
    config = json.loads((output / "config.json").read_text())
    card = render_model_card(config, run, conversion=model_conversion(fine_tuned, run))
    assert f"The fine-tuning started from the MarianMT model `<local>/{source.name}`" in card

    on_hub = dataclasses.replace(conversion_record(output), source="Helsinki-NLP/opus-mt-en-de", source_on_hub=True)
    card = render_model_card(config, None, conversion=on_hub)
    assert "base_model: Helsinki-NLP/opus-mt-en-de" in card and "`Helsinki-NLP/opus-mt-en-de`, converted" in card


def test_a_target_language_token_opening_a_text_reaches_each_of_its_sentences(hub_folder, tmp_path):
    """A multilingual MarianMT model (opus-mt-en-ROMANCE) reads the target language from a >>fra<< token opening its
    source; the pipeline and hf-relpos-translate translate a text sentence by sentence, so each sentence of a text
    that opens with one opens with it too, up to a sentence with a token of its own, which sets the language of the
    sentences after it."""
    output = tmp_path / "converted"
    assert main(["marian", str(hub_folder / "model"), str(output), "--position_scheme", "absolute"]) == 0
    tokenizer = AutoTokenizer.from_pretrained(output)
    french, german = tokenizer.convert_tokens_to_ids([">>fra<<", ">>deu<<"])
    assert tokenizer(">>fra<< The dog.").input_ids[0] == french
    text = ">>fra<< The old woman likes the king. The dog sees a cat!\n>>deu<< The man. A cat."
    translator = pipeline("translation", model=output, pipeline_class=TranslationPipeline, device="cpu")
    assert [chunk["input_ids"][0, 0].item() for chunk in translator.preprocess(text)] == [french, french, german, german]
    seen = []
    translate_by_sentence([text], lambda sentences: seen.extend(sentences) or sentences, language_tags(tokenizer))
    assert seen == [">>fra<< The old woman likes the king.", ">>fra<< The dog sees a cat!", ">>deu<< The man.",
                    ">>deu<< A cat."]


# The front matter of Helsinki-NLP's opus-mt cards (opus-mt-en-de's README.md): their weights are CC-BY-4.0.
OPUS_MT_CARD = "---\ntags:\n- translation\nlicense: cc-by-4.0\n---\n\n### opus-mt-en-de\n\n* source languages: en\n"


def test_the_cards_of_a_conversion_and_of_its_fine_tuning_carry_the_license_of_the_marian_models_card(
        hub_folder, tmp_path):
    """hf-relpos-convert reads the source's license from its model card's metadata (a folder's README.md) into
    conversion.json; the card of the converted folder and of a run fine-tuning it carry it (never hf_relpos' own
    apache-2.0); a source without a card converts with its license named as not known."""
    source = tmp_path / "opus-mt-en-de"
    shutil.copytree(hub_folder / "model", source)
    (source / "README.md").write_text(OPUS_MT_CARD)
    output = tmp_path / "converted"
    assert main(["marian", str(source), str(output), "--position_scheme", "shaw"]) == 0
    assert conversion_record(output).source_license == "cc-by-4.0"
    assert "\nlicense: cc-by-4.0\n" in folder_model_card(output, None)
    run = RunRecord(model_name_or_path=output.name, working_directory=str(tmp_path), source_lang="en",
                    target_lang="de")
    fine_tuned = tmp_path / "finetuned"
    fine_tuned.mkdir()
    card = render_model_card(json.loads((output / "config.json").read_text()), run,
                             conversion=model_conversion(fine_tuned, run))
    assert "\nlicense: cc-by-4.0\n" in card and "apache-2.0" not in card

    (source / "README.md").unlink()
    unknown = tmp_path / "converted-without-card"
    assert main(["marian", str(source), str(unknown), "--position_scheme", "shaw"]) == 0
    assert conversion_record(unknown).source_license is None
    card = folder_model_card(unknown, None)
    assert "\nlicense: other\n" in card and "whose license is not known" in card and "apache-2.0" not in card


def test_a_hub_sources_license_is_read_from_its_model_card_on_the_hub(hub_folder, tmp_path, monkeypatch):
    """For a Hub id the converter downloads the repository's README.md (one `hf_hub_download`; mocked here, as the
    model download is) and records the license its metadata gives."""
    monkeypatch.chdir(tmp_path)
    local = hub_folder / "model"
    card = tmp_path / "downloaded" / "README.md"
    card.parent.mkdir()
    card.write_text(OPUS_MT_CARD)
    downloads = []
    monkeypatch.setattr(convert_module, "hf_hub_download",
                        lambda repo_id, filename: downloads.append((repo_id, filename)) or str(card))
    monkeypatch.setattr(convert_module, "AutoConfig",
                        SimpleNamespace(from_pretrained=lambda source: AutoConfig.from_pretrained(local)))
    monkeypatch.setattr(convert_module, "_load_marian", lambda source: MarianMTModel.from_pretrained(local).eval())
    monkeypatch.setattr(convert_module, "_load_tokenizer", lambda source: AutoTokenizer.from_pretrained(local))
    monkeypatch.setattr(convert_module, "check_model_source", lambda value, setting: None)   # the Hub confirms it
    assert main(["marian", "Helsinki-NLP/opus-mt-en-de", "converted", "--position_scheme", "absolute"]) == 0
    assert downloads == [("Helsinki-NLP/opus-mt-en-de", "README.md")]
    record = conversion_record(tmp_path / "converted")
    assert record.source_on_hub and record.source_license == "cc-by-4.0"
    text = folder_model_card(tmp_path / "converted", None)
    assert "\nlicense: cc-by-4.0\n" in text and "base_model: Helsinki-NLP/opus-mt-en-de" in text

    def no_card(repo_id, filename):
        raise EntryNotFoundError(f"{repo_id} has no {filename}")

    monkeypatch.setattr(convert_module, "hf_hub_download", no_card)
    assert convert_module.source_license("someone/marian-without-card", on_hub=True) is None


def test_a_sources_card_whose_license_is_not_one_id_is_one_error_naming_it(hub_folder, tmp_path, capsys):
    source = tmp_path / "opus-mt-en-de"
    shutil.copytree(hub_folder / "model", source)
    (source / "README.md").write_text("---\nlicense:\n- cc-by-4.0\n- mit\n---\n")
    assert main(["marian", str(source), str(tmp_path / "out"), "--position_scheme", "shaw"]) == 2
    assert "the license in its model card's metadata must be one license id" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
