"""`hf-relpos-export ctranslate2`: every scheme CTranslate2 can express computes in the engine what it computes in
PyTorch (the same log-probabilities, the same greedy and beam-search translations of padded batches), int8 within 1
BLEU, and everything else is refused before anything is written."""

from __future__ import annotations

import copy
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import GenerationConfig, MarianConfig, MarianMTModel

import hf_relpos
from hf_relpos.tools.convert import marian_to_relpos
from hf_relpos.tools.ctranslate2_engine import CTranslate2Model
from hf_relpos.tools.export import ENGINE_MISSING, ExportError, export_ctranslate2, is_ctranslate2_folder
from hf_relpos.tools.export import main as export_main
from hf_relpos.tools.score import main as score_main
from hf_relpos.tools.score import score_pairs
from hf_relpos.tools.translate import main as translate_main
from hf_relpos.tools.translate import translate_lines
from hf_relpos.translation.demo_corpus import generate_demo_splits
from hf_relpos.translation.metrics import score_translations
from hf_relpos.translation.safety import OutputDirError
from hf_relpos.translation.tokenization import special_token_ids, train_joint_tokenizer

ctranslate2 = pytest.importorskip("ctranslate2")

SPLITS = generate_demo_splits(num_train=12, num_validation=0, num_test=24, seed=5)
TOKENIZER_TEXTS = [text for pair in generate_demo_splits(3000, 0, 0, seed=11)["train"] for text in pair]
TRAIN_PAIRS, TEST_SOURCES = SPLITS["train"], [source for source, _ in SPLITS["test"]]
# Each exportable scheme with architecture options around it, so that every option's mapping is exercised: both LN
# positions, six activations (gelu_python: the erf GELU written in Python; gelu_fast: gelu_new's tanh GELU with
# sqrt(2/pi) written as 0.7978845608), the embedding scale off, untied output projection, Shaw without a^V, partial
# rotary, kept sinusoids at a scale under `none`.
EXPORTABLE = {
    "absolute": dict(layer_norm_position="post", activation_function="gelu"),
    "shaw": dict(layer_norm_position="pre", activation_function="relu"),
    "shaw_keys_only": dict(position_scheme="shaw", use_relative_values=False, tie_word_embeddings=False,
                           activation_function="gelu_fast"),
    "shaw_values_only": dict(position_scheme="shaw", use_relative_keys=False, layer_norm_position="pre",
                             activation_function="gelu_python"),
    "t5": dict(layer_norm_position="post", scale_embedding=False, relative_attention_num_buckets=8,
               relative_attention_max_distance=12),
    "rope": dict(layer_norm_position="pre", rotary_dim=4, activation_function="gelu_new"),
    "none": dict(layer_norm_position="pre", keep_absolute_positions=True, absolute_positions_scale=0.5,
                 activation_function="silu"),
    "alibi": dict(layer_norm_position="post", activation_function="gelu_new"),
    "directional": dict(layer_norm_position="pre", directional_disable_diagonal=False,
                        directional_heads=["forward", "backward", "both"]),   # backward in the decoder: j = i alone
}


@pytest.fixture(scope="module")
def tokenizer():
    """Word-level merges (a vocabulary of 1000 over 3000 demo pairs), so sentences are short enough to learn fast."""
    return train_joint_tokenizer(TOKENIZER_TEXTS, vocab_size=1000)


def tiny_translation_model(tokenizer, name: str, steps: int, **overrides):
    """A tiny model of variant `name` (config `overrides` on top), trained `steps` full-batch Adam steps on the demo
    training pairs (enough to translate them and give varied, sentence-like guesses for unseen sources), with a random
    final_logits_bias."""
    options = {**EXPORTABLE.get(name, {}), **overrides}
    options.setdefault("position_scheme", name)
    torch.manual_seed(0)
    config = hf_relpos.RelPosTransformerConfig(
        vocab_size=len(tokenizer), d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=48, dropout=0.0, max_position_embeddings=128,
        **special_token_ids(tokenizer), **hf_relpos.RelPosTransformerConfig.held_fields(
            options["position_scheme"], {"max_relative_position": 3}), **options)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(config)
    sources = tokenizer([source for source, _ in TRAIN_PAIRS], padding=True, return_tensors="pt")
    labels = tokenizer([target for _, target in TRAIN_PAIRS], padding=True, return_tensors="pt").input_ids
    labels[labels == tokenizer.pad_token_id] = -100
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = model(**sources, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.final_logits_bias.normal_(0.0, 0.1)
    model.eval()
    model.generation_config.num_beams = 4
    model.generation_config.length_penalty = 1.0
    model.generation_config.early_stopping = True  # the engine's beam search (see test_beam_search_stops_...)
    model.generation_config.max_new_tokens = 60
    return model


def save(model, tokenizer, folder: Path) -> Path:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def exported(tokenizer, tmp_path_factory) -> dict[str, tuple]:
    """name -> (PyTorch model, its folder, the float32 CTranslate2 export)."""
    result = {}
    for name in EXPORTABLE:
        folder = tmp_path_factory.mktemp(name)
        model = tiny_translation_model(tokenizer, name, steps=100)
        save(model, tokenizer, folder / "model")
        result[name] = (model, folder / "model", export_ctranslate2(folder / "model", folder / "ct2"))
    return result


def export_error(argv: list[str], capsys) -> str:
    """hf-relpos-export's refusal of `argv`: exit status 2 and one line on stderr, returned without its newline."""
    capsys.readouterr()   # what the test printed before
    with pytest.raises(SystemExit) as raised:
        export_main(argv)
    assert raised.value.code == 2
    error = capsys.readouterr().err
    assert error.endswith("\n") and error.count("\n") == 1, error
    return error[:-1]


def torch_log_probs(model, tokenizer, sources: list[str], targets: list[str]) -> list[torch.Tensor]:
    """log p(y_t | y_<t, x) of each target token (end token included), from one padded forward pass."""
    inputs = tokenizer(sources, padding=True, return_tensors="pt")
    labels = tokenizer(targets, padding=True, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(**inputs, labels=labels).logits
    log_probs = logits.log_softmax(-1).gather(-1, labels[..., None])[..., 0]
    return [row[label != tokenizer.pad_token_id] for row, label in zip(log_probs, labels, strict=True)]


def engine_log_probs(folder: Path, tokenizer, sources: list[str], targets: list[str]) -> list[torch.Tensor]:
    """The same log-probabilities from CTranslate2's `score_batch` (it appends the end token to each target)."""
    translator = ctranslate2.Translator(str(folder), device="cpu", intra_threads=1)
    scored = translator.score_batch(
        [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(sources)["input_ids"]],
        [tokenizer.convert_ids_to_tokens(ids[:-1]) for ids in tokenizer(targets)["input_ids"]])
    return [torch.tensor(result.log_probs) for result in scored]


@pytest.mark.parametrize("name", list(EXPORTABLE))
def test_the_engine_scores_every_target_token_as_pytorch_does(exported, tokenizer, name):
    """Teacher-forced log-probabilities of padded batches in both stacks: the whole network, positions included,
    agrees to float32 rounding (1e-4), trained or not."""
    model, _, folder = exported[name]
    targets = [target for _, target in SPLITS["test"]]
    expected = torch_log_probs(model, tokenizer, TEST_SOURCES, targets)
    for reference, scored in zip(expected, engine_log_probs(folder, tokenizer, TEST_SOURCES, targets), strict=True):
        assert torch.allclose(scored, reference, atol=1e-4, rtol=0), name


@pytest.mark.parametrize("name", list(EXPORTABLE))
def test_hf_relpos_score_gives_the_engines_scores_as_the_pytorch_folders(exported, tokenizer, name):
    """`hf-relpos-score` over the export (score_batch) and over the PyTorch model: each pair's log p(y | x) and its
    mean per token agree to float32 rounding, in token batches of mixed lengths, a blank source among them."""
    model, _, folder = exported[name]
    engine = CTranslate2Model(folder, threads=1)
    sources = [*TEST_SOURCES, ""]
    targets = [target for _, target in SPLITS["test"]][:len(TEST_SOURCES)] + ["Ein Hund."]
    for normalize in (False, True):
        expected = score_pairs(sources, targets, model, tokenizer, max_tokens=60, normalize=normalize)
        scored = score_pairs(sources, targets, engine, tokenizer, max_tokens=60, normalize=normalize)
        assert scored == pytest.approx(expected, rel=1e-5, abs=1e-4), name
    assert len(set(expected)) == len(expected)


def test_scoring_a_target_longer_than_the_position_table_is_refused(exported, tokenizer):
    engine = CTranslate2Model(exported["absolute"][2], threads=1)
    with pytest.raises(ValueError, match="position table covers 128 positions: it serves sources and targets of at "
                                         "most 128 tokens, .* a target of 201; export again .* or score with the "
                                         "PyTorch folder"):
        score_pairs(["Ein Hund."], [" ".join(["Hund"] * 200)], engine, tokenizer)


@pytest.mark.parametrize("name", list(EXPORTABLE))
@pytest.mark.parametrize("num_beams", [1, 4])
def test_the_engine_translates_padded_batches_exactly_as_generate(exported, tokenizer, name, num_beams):
    """float32: the same lines as PyTorch generate, greedy and beam 4, unseen sources in padded batches of mixed
    lengths (token batches of at most 160 tokens)."""
    model, _, folder = exported[name]
    engine = CTranslate2Model(folder, threads=1)
    settings = dict(num_beams=num_beams, progress=False, max_tokens=160)
    expected = translate_lines(TEST_SOURCES, model, tokenizer, **settings)
    assert len(set(expected)) >= len(expected) // 3, expected  # varied translations, not one degenerate line
    assert translate_lines(TEST_SOURCES, engine, tokenizer, **settings) == expected


def test_beam_search_stops_as_generate_does_with_early_stopping(exported, tokenizer):
    """CTranslate2 ends a beam search once num_beams hypotheses have finished: generate's early_stopping=True. With
    transformers' default (False) generate may search on while a running beam could still win, so a line can
    differ: the engine's line then scores at most as high by PyTorch's own
    length-normalised score (the engine never returns a better translation than generate's)."""
    model, _, folder = exported["shaw"]
    engine = CTranslate2Model(folder, threads=1)
    sources = TEST_SOURCES + [source for source, _ in TRAIN_PAIRS]
    inputs = tokenizer(sources, padding=True, return_tensors="pt")
    with torch.no_grad():
        searched_on = model.generate(**inputs, num_beams=4, early_stopping=False, output_scores=True,
                                     return_dict_in_generate=True)
    lines = tokenizer.batch_decode(searched_on.sequences, skip_special_tokens=True)
    stopped = translate_lines(sources, engine, tokenizer, progress=False)
    assert stopped == translate_lines(sources, model, tokenizer, progress=False)  # early_stopping=True
    differing = [index for index, (line, other) in enumerate(zip(lines, stopped, strict=True)) if line != other]
    assert len(differing) < len(sources) // 2
    normalised = searched_on.sequences_scores.tolist()
    for index in differing:
        target_ids = tokenizer(text_target=[stopped[index]])["input_ids"]
        engine_score = torch_log_probs(model, tokenizer, [sources[index]], [stopped[index]])[0]
        assert engine_score.sum() / len(target_ids[0]) <= normalised[index] + 1e-5


def test_directionals_masks_are_finite_in_every_type_the_engine_stores(exported, tokenizer):
    """Each head's direction as 0 (allowed) or MASKED_BIAS over T5's buckets (encoder: offset 0, below, unused,
    above; decoder: 0, below), finite in float16: with -inf a backward head's padding query, which has no key at or
    after it, is NaN, and CTranslate2 keeps padding positions on the GPU in float16 (no Padder there), where the next
    layer's 0 x NaN spreads it to the whole row. Its exp is still exactly 0 in float32, as the parity tests show."""
    import numpy as np

    from hf_relpos.tools.export import MASKED_BIAS, build_spec, vocabulary

    model = exported["directional"][0]
    spec = build_spec(model, vocabulary(tokenizer, model.config.vocab_size), tokenizer.unk_token)
    allowed = {"forward": [True, True, None, False], "backward": [True, False, None, True]}   # "both": every bucket
    for stack, stack_spec in ((model.get_encoder(), spec.encoder), (model.get_decoder(), spec.decoder)):
        for layer in stack_spec.layer:
            table = layer.self_attention.relative_attention_bias
            assert np.isfinite(table.astype(np.float16)).all() and set(np.unique(table)) <= {0.0, MASKED_BIAS}
            for head, direction in enumerate(stack.positions.head_directions):
                expected = allowed.get(direction, [True] * 4)[:len(table)]
                assert [table[bucket, head] == 0.0 for bucket in range(len(table)) if expected[bucket] is not None] == [
                    flag for flag in expected if flag is not None], (direction, table[:, head])
    assert np.exp(np.float32(MASKED_BIAS + 100.0)) == 0.0


def test_alibis_bias_table_is_exact_within_its_bound_and_the_nearest_offsets_beyond(exported, tokenizer):
    """T5's buckets as CTranslate2 reads them (relative_position_bucket): every offset within the bound (128 positions)
    gets exactly -m_h |j - i|; a farther one, up to the table's max_distance and beyond, the bias of the nearest offset
    of its logarithmic bucket: a penalty between -m_h |j - i| and the bound's, never the 0 an unfilled bucket adds."""
    from hf_relpos.model.positions_t5 import relative_position_bucket
    from hf_relpos.tools.export import build_spec, vocabulary

    model = exported["alibi"][0]
    spec = build_spec(model, vocabulary(tokenizer, model.config.vocab_size), tokenizer.unk_token)
    for stack, stack_spec in ((model.get_encoder(), spec.encoder), (model.get_decoder(), spec.decoder)):
        causal, slopes = stack.positions.is_causal, torch.tensor(stack.positions.slopes)
        for layer in stack_spec.layer:
            table = torch.from_numpy(layer.self_attention.relative_attention_bias)
            distance = int(layer.self_attention.relative_attention_max_distance)
            assert table.shape == ((2 if causal else 4) * 128, slopes.numel()) and distance == table.size(0)
            offsets = torch.arange(-3 * distance, 1 if causal else 3 * distance + 1)
            bias = table[relative_position_bucket(offsets, bidirectional=not causal, num_buckets=table.size(0),
                                                  max_distance=distance)]
            exact = -slopes * offsets.abs()[:, None].float()
            within = offsets.abs() < 128
            assert torch.equal(bias[within], exact[within])
            assert (bias[~within] >= exact[~within]).all() and (bias[~within] <= -slopes * 128).all()


@pytest.mark.parametrize(("name", "overrides"), [("shaw", {}), ("alibi", {}), ("directional", {"directional_heads": None})])
def test_int8_loses_at_most_one_bleu_against_float32(tokenizer, tmp_path, name, overrides):
    """A model trained until it translates its training pairs, exported as int8: corpus BLEU at most 1 below the
    float32 export's on them (the float32 export's is PyTorch's). Rounding may also land on a better translation, so
    the bound is one-sided. alibi's bucket table and directional's -10000 biases (its default heads: encoder half
    forward, half backward) take no part in the quantization."""
    model = tiny_translation_model(tokenizer, name, steps=200, **overrides)
    folder = save(model, tokenizer, tmp_path / "model")
    sources, references = [source for source, _ in TRAIN_PAIRS], [target for _, target in TRAIN_PAIRS]
    pytorch_bleu = score_translations(translate_lines(sources, model, tokenizer, progress=False), references)["bleu"]
    scores = {}
    for quantization in ("float32", "int8"):
        export = export_ctranslate2(folder, tmp_path / quantization, quantization=quantization)
        assert json.loads((export / "ctranslate2_export.json").read_text())["quantization"] == quantization
        hypotheses = translate_lines(sources, CTranslate2Model(export, threads=1), tokenizer, progress=False)
        scores[quantization] = score_translations(hypotheses, references)["bleu"]
    assert pytorch_bleu > 90 and scores["float32"] == pytorch_bleu
    assert scores["int8"] >= scores["float32"] - 1.0, scores
    assert (tmp_path / "int8" / "model.bin").stat().st_size < 0.5 * (tmp_path / "float32" / "model.bin").stat().st_size


def test_the_folder_holds_the_tokenizer_and_generation_settings(exported):
    model, source, folder = exported["shaw"]
    assert is_ctranslate2_folder(folder) and not is_ctranslate2_folder(source)
    for name in ("model.bin", "config.json", "shared_vocabulary.json", "tokenizer.json", "generation_config.json"):
        assert (folder / name).is_file(), name
    generation = json.loads((folder / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["length_penalty"], generation["max_new_tokens"]) == (4, 1.0, 60)
    assert generation["early_stopping"] is True
    # the engine's LayerNorm epsilon is the model's (unset, the engine takes its own default; float32 scores hide it)
    assert json.loads((folder / "config.json").read_text())["layer_norm_epsilon"] == pytest.approx(
        model.get_encoder().layers[0].final_layer_norm.eps, rel=1e-6)
    options = CTranslate2Model(folder, threads=1).decoding_options()
    assert (options["beam_size"], options["length_penalty"], options["max_decoding_length"]) == (4, 1.0, 60)
    assert CTranslate2Model(folder, threads=1).decoding_options(max_length=9, max_new_tokens=None)[
        "max_decoding_length"] == 8  # generate's max_length counts the decoder start token
    assert not [path.name for path in folder.parent.iterdir() if path.name.startswith(".")]  # no staging left
    # without a source-relative cap hf-relpos-translate caps every output at the ceiling, and the card says so (it said
    # "each output capped relative to its own source" whatever the folder saved)
    card = " ".join((folder / "README.md").read_text(encoding="utf-8").split())
    assert "(sentence by sentence, each output capped at 60 new tokens, however long its source)" in card
    assert "relative to its own source" not in card


def test_the_folders_card_says_what_it_is_and_its_plain_ctranslate2_snippet_translates_as_the_engine(
        exported, tokenizer, tmp_path, capsys):
    """README.md of an export: the pair, scheme, quantization and saved decoding; its Python snippet (CTranslate2 and
    transformers alone, FOLDER and the example sentence filled in) prints the engine's translation of the sentence,
    and the card says that it takes one sentence a source (it translates a paragraph in one piece).
    The run record comes along: hf-relpos-translate scores the export's BLEU as the run did (its bleu_tokenize)."""
    from huggingface_hub import ModelCard

    from hf_relpos.model.generation_limits import set_relative_limit
    from hf_relpos.publish.records import RUN_RECORD_FILE, training_record

    model, _, _ = exported["absolute"]
    saved = copy.deepcopy(model.generation_config)
    set_relative_limit(model.generation_config, 0.3, 2)   # shorter than its translations: the cap binds
    try:
        source = save(model, tokenizer, tmp_path / "model")
    finally:
        model.generation_config = saved
    (source / RUN_RECORD_FILE).write_text(json.dumps({"source_lang": "en", "target_lang": "de", "bleu_tokenize": "char"}))
    export_main(["ctranslate2", str(source), str(tmp_path / "ct2"), "--quantization", "int8", "--max_positions", "300"])
    card = ModelCard.load(tmp_path / "ct2" / "README.md")
    assert card.data.language == ["en", "de"] and card.data.library_name == "ctranslate2"
    assert "absolute" in card.data.tags
    for expected in ("(English→German, position scheme `absolute`, Post-LN)", "weights stored as `int8`",
                     "beam 4, length penalty 1, at most 0.3 x source tokens + 2 new tokens (and never more than 60)",
                     "sources and translations of at most 300 tokens", "hf-relpos-translate FOLDER --input",
                     "(sentence by sentence, each output capped relative to its own source)"):
        assert expected in card.text, expected
    # the snippet translates its source in one piece: the card says to give it one sentence a source, as
    # hf-relpos-translate splits a line (a pasted paragraph was translated to about its first sentence)
    assert ("`translate_batch` translates each source in one piece, as given." in card.text
            and "give it one sentence a source and join their translations" in " ".join(card.text.split()))
    snippet = card.text.split("```python\n")[1].split("```")[0]
    assert 'tokenizer("The dog is sleeping.")' in snippet
    assert "max_decoding_length=min(int(0.3 * len(source) + 2), 60) - 1" in snippet
    sentence = TEST_SOURCES[3]
    snippet = snippet.replace('"FOLDER"', repr(str(tmp_path / "ct2"))).replace("The dog is sleeping.", sentence)
    printed = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, check=True).stdout
    engine = CTranslate2Model(tmp_path / "ct2", threads=1)
    inputs = tokenizer([sentence], return_tensors="pt")
    capped, uncapped = engine.generate(**inputs), engine.generate(**inputs, max_len_b=None)
    assert capped.shape[-1] < uncapped.shape[-1]
    assert printed == tokenizer.decode(capped[0], skip_special_tokens=True) + "\n"
    assert training_record(tmp_path / "ct2") == training_record(source)
    (tmp_path / "src.txt").write_text(sentence + "\n", encoding="utf-8")
    capsys.readouterr()
    translate_main([str(tmp_path / "ct2"), str(tmp_path / "src.txt"), "--reference", str(tmp_path / "src.txt"),
                    "--output", str(tmp_path / "hyp.txt"), "--no_progress"])
    assert "|tok:char|" in capsys.readouterr().out


@pytest.mark.parametrize("generation_saved", [True, False])
def test_every_file_the_export_card_names_is_in_the_export_and_the_source_card_is_named_by_its_folder(
        tokenizer, tmp_path, generation_saved):
    """The export's README.md is its own card: each file it names in backticks is in the export folder
    (generation_config.json only where the source model saved one), and the source model's card, which the export
    does not copy, is named by the source folder's name, which ctranslate2_export.json records as `source_model`."""
    source = save(tiny_translation_model(tokenizer, "absolute", steps=0), tokenizer, tmp_path / "my_model")
    (source / "README.md").write_text("# the source model's card\n", encoding="utf-8")
    if not generation_saved:
        (source / "generation_config.json").unlink()
    out = export_ctranslate2(source, tmp_path / "ct2")
    card = (out / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([\w.-]+\.(?:json|md|bin|txt|py|spm))`", card))
    assert ("generation_config.json" in named) == generation_saved
    assert named and all((out / name).is_file() for name in named), named
    assert "README.md` beside its weights" not in card
    assert "the model card (README.md) in the source model's folder `my_model` (`source_model` in" in card
    assert json.loads((out / "ctranslate2_export.json").read_text())["source_model"] == "<local>/my_model"


def test_the_export_record_names_its_source_without_the_machines_folders(tokenizer, tmp_path, monkeypatch):
    """ctranslate2_export.json goes wherever the folder is uploaded (hf-relpos-translate recognises an export by it),
    so `source_model` shows the source folder as a model card shows a local path: relative to the folder the export
    ran in, else <local>/NAME; it held the absolute path, which an `hf upload` of the folder published."""
    source = save(tiny_translation_model(tokenizer, "absolute", steps=0), tokenizer, tmp_path / "runs" / "my_model")
    monkeypatch.chdir(tmp_path)
    export_main(["ctranslate2", str(source), "ct2_inside"])   # run where the source lies under the working folder
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    monkeypatch.chdir(outside)
    export_main(["ctranslate2", str(source), str(tmp_path / "ct2_outside")])
    for name, shown in (("ct2_inside", "runs/my_model"), ("ct2_outside", "<local>/my_model")):
        text = (tmp_path / name / "ctranslate2_export.json").read_text()
        assert json.loads(text)["source_model"] == shown and str(tmp_path) not in text
    with pytest.raises(ExportError, match=r"is already a CTranslate2 export \(of 'runs/my_model'\)"):
        export_ctranslate2(tmp_path / "ct2_inside", tmp_path / "again")


def test_no_file_of_an_export_holds_a_local_absolute_path(tokenizer, tmp_path, monkeypatch):
    """An export is a folder to serve and share (`hf upload REPO_ID FOLDER`, as hub push advises for one): none of its
    files (CTranslate2's, the tokenizer's, the configs, the card, the records) holds the machine's folders. The run
    record comes along with its local paths as a card shows them (relative to the folder the run was started in,
    else <local>/NAME; that folder left out), where it was copied as the run wrote it: the folder it was started in,
    the command with its data files, the program, the prepared-data folders; what hf-relpos-translate reads of it
    (bleu_tokenize, target_lang) and the rest of the recipe are kept."""
    from hf_relpos.publish.hub import export_files_with_local_paths
    from hf_relpos.publish.records import RUN_RECORD_FILE, RunRecord, training_record
    from hf_relpos.tools.translate import recorded_scoring

    work, data = tmp_path / "work", tmp_path / "data"
    source = save(tiny_translation_model(tokenizer, "absolute", steps=0), tokenizer, work / "outputs" / "my_model")
    (source / "README.md").write_text("# the source model's card\n", encoding="utf-8")
    run = RunRecord(
        source_lang="en", target_lang="ja", bleu_tokenize="char", train_file=f"{data}/train.jsonl",
        validation_file="data/dev.jsonl", test_file=f"{work}/data/test.jsonl", tokenizer_name=f"{tmp_path}/tok",
        trained_as=f"{work}/configs/x.yaml --output_dir={work}/outputs/my_model --seed 1", working_directory=str(work),
        program=f"{tmp_path}/src/train_translation.py", resumed_from="checkpoint-30", learning_rate=0.002,
        prepared_from={"train": {"folder": f"{work}/outputs/my_model/prepared_data/train-1", "key": "1",
                                 "reused": False}})
    (source / RUN_RECORD_FILE).write_text(json.dumps(run.to_json(), indent=1), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    out = export_ctranslate2(source, tmp_path / "ct2")
    leaking = [path.name for path in out.iterdir() if str(tmp_path).encode() in path.read_bytes()]
    assert leaking == []
    shown = training_record(out)
    assert (shown.train_file, shown.validation_file, shown.test_file, shown.tokenizer_name) == (
        "<local>/train.jsonl", "data/dev.jsonl", "data/test.jsonl", "<local>/tok")
    assert shown.trained_as == "configs/x.yaml --output_dir=outputs/my_model --seed 1"
    assert (shown.working_directory, shown.program, shown.resumed_from) == (
        None, "<local>/train_translation.py", "checkpoint-30")
    assert shown.prepared_from == {"train": {"folder": "outputs/my_model/prepared_data/train-1", "key": "1",
                                             "reused": False}}
    assert (shown.learning_rate, shown.source_lang) == (0.002, "en")
    assert recorded_scoring(str(out)) == ("char", "ja")
    assert export_files_with_local_paths(out) == []   # hub push's refusal advises uploading it as it is
    assert training_record(source) == run   # the source folder's record, the local one, keeps its paths as typed


def test_shaw_without_either_table_exports_as_zero_tables(tokenizer, tmp_path):
    """use_relative_keys and use_relative_values both false: no position term at all, exported as two zero tables
    (an untrained model: the scores agree all the same)."""
    torch.manual_seed(0)
    config = hf_relpos.RelPosTransformerConfig(
        vocab_size=len(tokenizer), d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, position_scheme="shaw",
        use_relative_keys=False, use_relative_values=False, **special_token_ids(tokenizer))
    model = hf_relpos.RelPosTransformerForConditionalGeneration(config).eval()
    folder = export_ctranslate2(save(model, tokenizer, tmp_path / "model"), tmp_path / "ct2")
    targets = [target for _, target in SPLITS["test"][:4]]
    expected = torch_log_probs(model, tokenizer, TEST_SOURCES[:4], targets)
    for reference, scored in zip(expected, engine_log_probs(folder, tokenizer, TEST_SOURCES[:4], targets), strict=True):
        assert torch.allclose(scored, reference, atol=1e-4, rtol=0)


def test_a_position_table_bounds_the_lengths_with_a_clear_error(exported, tokenizer):
    """absolute and none carry max_position_embeddings (128) rows of positions: a longer cap is refused, not
    truncated or read out of range; under max_len_b each row's own cap counts, not the ceiling above it."""
    engine = CTranslate2Model(exported["absolute"][2], threads=1)
    inputs = tokenizer(TEST_SOURCES[:2], padding=True, return_tensors="pt")
    with pytest.raises(ValueError, match="position table covers 128 positions: .* length cap of 129; export again with "
                                         "hf-relpos-export ctranslate2 --max_positions 129 or more"):
        engine.generate(**inputs, max_new_tokens=129)
    assert engine.generate(**inputs, max_new_tokens=128).size(0) == 2
    assert engine.generate(**inputs, max_new_tokens=500, max_len_a=1.0, max_len_b=5).size(0) == 2
    with pytest.raises(ValueError, match=f"length cap of {int(inputs.attention_mask.sum(-1).max()) + 135};"):
        engine.generate(**inputs, max_new_tokens=500, max_len_a=1.0, max_len_b=135)
    assert CTranslate2Model(exported["shaw"][2], threads=1).position_table_rows is None


@pytest.mark.parametrize("name", ["absolute", "none", "alibi"])
def test_max_positions_exports_a_longer_table_that_translates_beyond_the_models_max_position_embeddings(
        exported, tokenizer, tmp_path, capsys, name):
    """The sinusoids (or zeros, or ALiBi's biases, a bucket per offset) are exact at any length, and the PyTorch
    model has no bound: with --max_positions the export serves a source longer than max_position_embeddings (128)
    with PyTorch's greedy ids; the default export refuses it in one line of hf-relpos-translate, writing no output.
    CTranslate2 alone refuses it for a position table, not for alibi's biases: the card says which."""
    model, source, default_export = exported[name]
    long_source = " ".join(TEST_SOURCES)
    inputs = tokenizer([long_source, TEST_SOURCES[0]], padding=True, return_tensors="pt")
    assert inputs.input_ids.size(1) > 128
    export_main(["ctranslate2", str(source), str(tmp_path / "ct2"), "--max_positions", "400"])
    engine = CTranslate2Model(tmp_path / "ct2", threads=1)
    assert engine.position_table_rows == 400
    with torch.no_grad():
        expected = model.generate(**inputs, num_beams=1, max_new_tokens=30)
    assert torch.equal(engine.generate(**inputs, num_beams=1, max_new_tokens=30), expected)
    (tmp_path / "long.txt").write_text(f"{TEST_SOURCES[1]}\n{long_source}\n")
    with pytest.raises(SystemExit) as raised:
        translate_main([str(default_export), "--input", str(tmp_path / "long.txt"), "--output",
                        str(tmp_path / "out.txt"), "--no_progress", "--no_split_sentences"])
    assert raised.value.code == 2 and not (tmp_path / "out.txt").exists()
    assert re.fullmatch(r"hf-relpos-translate: error: --input '.*long.txt' line 2 \(\d+ tokens\): longer than the 128 "
                        r"positions .* --max_positions \d+ or more, or translate with the PyTorch folder",
                        capsys.readouterr().err.splitlines()[-1])
    # CTranslate2 alone (the card's snippet) refuses a position beyond a position table, but takes any offset into
    # alibi's bucket table: the card says which
    card = " ".join((tmp_path / "ct2" / "README.md").read_text().split())
    translator = ctranslate2.Translator(str(default_export), device="cpu", intra_threads=1)
    long_tokens = [tokenizer.convert_ids_to_tokens(tokenizer(long_source).input_ids)]
    if name == "alibi":
        assert ("Its bias table is exact for sources and translations of at most 400 tokens (`--max_positions` of the "
                "export): `hf-relpos-translate` refuses longer ones, CTranslate2 alone does not") in card
        assert translator.translate_batch(long_tokens, max_input_length=0, max_decoding_length=2)[0].hypotheses
    else:
        assert "Its position table serves sources and translations of at most 400 tokens" in card
        with pytest.raises(RuntimeError, match="No position encodings are defined for positions >= 128"):
            translator.translate_batch(long_tokens, max_input_length=0, max_decoding_length=2)


def test_lines_longer_than_the_position_table_are_named_before_any_is_translated(exported, tokenizer, tmp_path,
                                                                             capsys, monkeypatch):
    """A file's lines beyond the table (their tokens, or their source-relative cap) are one error naming each line,
    its tokens and what to do before the engine decodes a line or anything is written, whatever --buffer_lines;
    stdin, read as it comes, is refused at the chunk that holds such a line (--output not written); a line whose
    sentences each fit is translated sentence by sentence."""
    folder = exported["absolute"][2]
    decoded = []
    decode = CTranslate2Model.generate_n_best
    monkeypatch.setattr(CTranslate2Model, "generate_n_best", lambda self, *args, **kwargs: decoded.append(1) or
                        decode(self, *args, **kwargs))
    long_source, longer_source = " ".join(TEST_SOURCES), " ".join([*TEST_SOURCES, *TEST_SOURCES[:3]])
    long_tokens, longer_tokens = (len(tokenizer(text).input_ids) for text in (long_source, longer_source))
    assert 128 < long_tokens < longer_tokens
    source = write_text(tmp_path / "src.txt", [TEST_SOURCES[0], long_source, TEST_SOURCES[1], longer_source])
    advice = (f": longer than the 128 positions this export's position table covers (its hf-relpos-export "
              f"--max_positions); export again with hf-relpos-export ctranslate2 --max_positions {longer_tokens} or "
              "more, or translate with the PyTorch folder")

    def refused(argv: list[str]) -> tuple[str, str]:
        capsys.readouterr()
        with pytest.raises(SystemExit) as raised:
            translate_main([str(folder), *argv, "--no_progress", "--buffer_lines", "1"])
        assert raised.value.code == 2
        printed = capsys.readouterr()
        assert printed.err.count("\n") == 1, printed.err
        return printed.out, printed.err[:-1]

    for output in (["--output", str(tmp_path / "out.txt")], []):
        out, error = refused(["--input", str(source), "--no_split_sentences", *output])
        assert error == (f"hf-relpos-translate: error: --input {str(source)!r} lines 2 ({long_tokens} tokens), "
                         f"4 ({longer_tokens} tokens){advice}")
        assert out == "" and not decoded and not (tmp_path / "out.txt").exists()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(source.read_bytes())))
    out, error = refused(["--output", str(tmp_path / "out.txt"), "--no_split_sentences"])
    assert error == (f"hf-relpos-translate: error: stdin line 2 ({long_tokens} tokens){advice}".replace(
        f"--max_positions {longer_tokens}", f"--max_positions {long_tokens}"))
    assert len(decoded) == 1 and not (tmp_path / "out.txt").exists()   # line 1's chunk, not written
    capped = " ".join(TEST_SOURCES[:12])   # within the table, but not its cap of 2 x its tokens
    capped_tokens = len(tokenizer(capped).input_ids)
    assert 64 < capped_tokens <= 128
    write_text(tmp_path / "capped.txt", [TEST_SOURCES[0], capped])
    decoded.clear()
    out, error = refused(["--input", str(tmp_path / "capped.txt"), "--no_split_sentences", "--max_length", "400",
                          "--max_len_a", "2", "--max_len_b", "0"])
    assert error.startswith(f"hf-relpos-translate: error: --input {str(tmp_path / 'capped.txt')!r} line 2 "
                            f"({capped_tokens} tokens, a length cap of {2 * capped_tokens}): longer than the 128 ")
    assert not decoded
    translate_main([str(folder), "--input", str(source), "--output", str(tmp_path / "out.txt"), "--no_progress"])
    assert len((tmp_path / "out.txt").read_text().splitlines()) == 4   # sentence by sentence, each within the table


def test_hf_relpos_score_names_the_pairs_longer_than_the_position_table_and_writes_nothing(exported, tokenizer,
                                                                                         tmp_path, capsys):
    long_source = " ".join(TEST_SOURCES)
    long_tokens = len(tokenizer(long_source).input_ids)
    write_text(tmp_path / "src.txt", [TEST_SOURCES[0], long_source])
    write_text(tmp_path / "tgt.txt", ["Ein Hund.", "Ein Hund."])
    target_tokens = len(tokenizer(text_target="Ein Hund.").input_ids)
    capsys.readouterr()
    with pytest.raises(SystemExit) as raised:
        score_main([str(exported["alibi"][2]), "--source", str(tmp_path / "src.txt"), "--target",
                    str(tmp_path / "tgt.txt"), "--output", str(tmp_path / "scores.txt"), "--no_progress"])
    assert raised.value.code == 2 and not (tmp_path / "scores.txt").exists()
    assert capsys.readouterr().err == (
        f"hf-relpos-score: error: --source and --target line 2 (a source of {long_tokens} and a target of "
        f"{target_tokens} tokens): longer than the 128 positions this export's position table covers (its "
        f"hf-relpos-export --max_positions); export again with hf-relpos-export ctranslate2 --max_positions "
        f"{long_tokens} or more, or score with the PyTorch folder\n")


def write_text(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_max_positions_is_refused_where_it_sizes_nothing(exported, tmp_path):
    with pytest.raises(ExportError, match="max_positions sizes the position table of absolute, alibi, none; "
                                          "position_scheme 'shaw' exports no such table"):
        export_ctranslate2(exported["shaw"][1], tmp_path / "ct2", max_positions=400)
    with pytest.raises(ExportError, match="max_positions must be a positive integer, got 0"):
        export_ctranslate2(exported["absolute"][1], tmp_path / "ct2", max_positions=0)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["absolute", "alibi"])
def test_max_positions_beyond_its_bound_is_one_error_before_anything_is_written(exported, tmp_path, capsys, name):
    """A table of 10^8 rows allocates until the process is killed: above MAX_POSITIONS (65536) is refused first."""
    with pytest.raises(ExportError, match=r"max_positions must be between 1 and 65536 \(the rows of the position "
                                          r"table, the longest source and translation in tokens\), got 65537"):
        export_ctranslate2(exported[name][1], tmp_path / "ct2", max_positions=65537)
    error = export_error(["ctranslate2", str(exported[name][1]), str(tmp_path / "ct2"), "--max_positions",
                          str(10**8)], capsys)
    assert error.startswith("hf-relpos-export: error: max_positions must be between 1 and 65536 ")
    assert error.endswith("got 100000000")
    assert list(tmp_path.iterdir()) == []


def test_a_folder_whose_weights_file_is_cut_short_is_one_error_naming_it(exported, tmp_path):
    """A weights file cut short (a copy broken off) was safetensors' traceback; nothing is written."""
    source = Path(shutil.copytree(exported["shaw"][1], tmp_path / "model"))
    weights = source / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ExportError, match=f"MODEL_DIR {re.escape(repr(str(source)))}: its weights file is cut short "
                                          "or corrupt \\("):
        export_ctranslate2(source, tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists()


def test_a_folder_without_a_tokenizer_is_one_error_naming_it(exported, tmp_path, capsys):
    source = tmp_path / "model"
    source.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copyfile(exported["shaw"][1] / name, source / name)
    message = r"has no tokenizer \(tokenizer.json or tokenizer_config.json\): save the tokenizer beside the model"
    with pytest.raises(ExportError, match=message):
        export_ctranslate2(source, tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists()
    (tmp_path / "src.txt").write_text("A dog runs.\n")
    with pytest.raises(SystemExit) as raised:
        translate_main([str(source), "--input", str(tmp_path / "src.txt"), "--no_progress"])
    assert raised.value.code == 2
    assert re.fullmatch(f"hf-relpos-translate: error: .*{message}.*\n", capsys.readouterr().err)


def test_a_minimum_length_beyond_a_rows_cap_is_refused_as_generate_refuses_it(exported, tokenizer):
    model, _, folder = exported["t5"]
    inputs = tokenizer(TEST_SOURCES[:3], padding=True, return_tensors="pt")
    settings = dict(max_len_a=0.0, max_len_b=4, min_new_tokens=4, num_beams=1)
    for decoder in (model, CTranslate2Model(folder, threads=1)):
        with pytest.raises(ValueError, match="at least 4 new tokens .* after 4 new tokens"):
            decoder.generate(**inputs, **settings)


def test_hf_relpos_translate_runs_an_exported_folder_like_the_pytorch_one(exported, tmp_path, capsys):
    _, source, folder = exported["t5"]
    (tmp_path / "src.txt").write_text("".join(line + "\n" for line in [TEST_SOURCES[0], "", *TEST_SOURCES[1:6]]))
    (tmp_path / "ref.txt").write_text("".join(f"{target}\n" for target in
                                              [SPLITS["test"][0][1], "", *(t for _, t in SPLITS["test"][1:6])]))
    printed = {}
    for model_folder, output in ((source, "torch.txt"), (folder, "ct2.txt")):
        translate_main([str(model_folder), "--input", str(tmp_path / "src.txt"), "--output", str(tmp_path / output),
                        "--reference", str(tmp_path / "ref.txt"), "--no_progress", "--max_tokens", "40"])
        printed[output] = capsys.readouterr().out
    assert (tmp_path / "ct2.txt").read_text() == (tmp_path / "torch.txt").read_text()
    assert printed["ct2.txt"] == printed["torch.txt"] and printed["ct2.txt"].startswith("sacreBLEU ")
    for model_folder, output in ((source, "torch_blocked.txt"), (folder, "ct2_blocked.txt")):   # the option too
        translate_main([str(model_folder), "--input", str(tmp_path / "src.txt"), "--output", str(tmp_path / output),
                        "--no_progress", "--no_repeat_ngram_size", "1", "--num_beams", "1"])
    blocked = (tmp_path / "torch_blocked.txt").read_text()
    assert (tmp_path / "ct2_blocked.txt").read_text() == blocked != (tmp_path / "torch.txt").read_text()
    translate_main([str(folder), "--input", str(tmp_path / "src.txt"), "--output", str(tmp_path / "int8.txt"),
                    "--compute_type", "int8", "--no_progress"])
    assert len((tmp_path / "int8.txt").read_text().splitlines()) == 7


@pytest.mark.parametrize(("flag", "which", "advice"), [
    (["--compute_type", "int8"], "torch", "(use --dtype)"),
    (["--dtype", "bfloat16"], "ct2", "(use --compute_type)"),
    (["--attn_implementation", "eager"], "ct2", "own attention kernels: leave the option out"),
])
def test_translate_refuses_the_other_engines_option(exported, tmp_path, capsys, flag, which, advice):
    """Each refusal says what to do instead (rule: one clear error naming the option and the way out)."""
    _, source, folder = exported["absolute"]
    (tmp_path / "src.txt").write_text("A line.\n", encoding="utf-8")
    with pytest.raises(SystemExit) as raised:
        translate_main([str(source if which == "torch" else folder), "--input", str(tmp_path / "src.txt"), *flag])
    assert raised.value.code == 2
    error = capsys.readouterr().err
    assert flag[0] in error and advice in error


def test_a_model_whose_sinusoids_are_faded_out_exports_as_its_relative_scheme(tokenizer, tmp_path):
    """keep_absolute_positions at absolute_positions_scale 0 (the end of fade_absolute_positions) adds nothing: it
    exports as the plain relative scheme, and the engine translates as PyTorch does."""
    model = tiny_translation_model(tokenizer, "shaw", steps=30)
    model.config.keep_absolute_positions, model.config.absolute_positions_scale = True, 0.0
    for stack in (model.get_encoder(), model.get_decoder()):
        stack.config.keep_absolute_positions, stack.config.absolute_positions_scale = True, 0.0
    folder = export_ctranslate2(save(model, tokenizer, tmp_path / "model"), tmp_path / "ct2")
    inputs = tokenizer(TEST_SOURCES[:6], padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = model.generate(**inputs, num_beams=1)
    assert torch.equal(CTranslate2Model(folder, threads=1).generate(**inputs, num_beams=1), expected)


# --- refusals: one line naming what cannot be expressed, nothing written ----------------------------------------


@pytest.mark.parametrize(("options", "message"), [
    (dict(position_scheme="xl"), "position_scheme 'xl' cannot be exported to CTranslate2: Transformer-XL's"),
    (dict(position_scheme="directional"), "directional_disable_diagonal true cannot be exported to CTranslate2: a "
                                          "head's query left without a key"),
    (dict(position_scheme="shaw", relative_embeddings_shared_across_heads=False),
     "relative_embeddings_shared_across_heads false cannot be exported"),
    (dict(position_scheme="shaw", keep_absolute_positions=True),
     "keep_absolute_positions with position_scheme 'shaw' cannot be exported"),
    (dict(position_scheme="rope", self_attention_window=4), "self_attention_window 4 cannot be exported"),
    (dict(position_scheme="t5", cross_attention_length_scaling=True), "cross_attention_length_scaling True cannot"),
    (dict(position_scheme="absolute", position_randomization_max=64, position_randomization_at_inference=True),
     "position_randomization_at_inference True cannot be exported"),
    (dict(position_scheme="absolute", activation_function="mish"), "activation_function 'mish' cannot be exported"),
    (dict(position_scheme="shaw", encoder_layers=0), "encoder_layers 0 cannot be exported to CTranslate2"),
])
def test_what_the_engine_cannot_express_is_refused_before_anything_is_written(tokenizer, tmp_path, capsys, options,
                                                                               message):
    sizes = dict(d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                 encoder_ffn_dim=16, decoder_ffn_dim=16)
    config = hf_relpos.RelPosTransformerConfig(
        vocab_size=len(tokenizer), **special_token_ids(tokenizer), **{**sizes, **options})
    folder = save(hf_relpos.RelPosTransformerForConditionalGeneration(config), tokenizer, tmp_path / "model")
    (tmp_path / "out").mkdir()
    with pytest.raises(ExportError, match="^" + message.replace("(", r"\(")):
        export_ctranslate2(folder, tmp_path / "out" / "ct2")
    error = export_error(["ctranslate2", str(folder), str(tmp_path / "out" / "ct2")], capsys)
    assert error.startswith(f"hf-relpos-export: error: {message}")
    if "position_scheme" in options and message.startswith("position_scheme"):   # names what does export
        assert error.endswith("it exports ['absolute', 'alibi', 'directional', 'none', 'rope', 'shaw', 't5'], and "
                              "hf-relpos-translate or the translation pipeline serve this model as it is (PyTorch)")
    assert list((tmp_path / "out").iterdir()) == []


def test_a_scheme_registered_in_other_code_is_refused_as_such_where_it_is_not_imported(tokenizer, tmp_path, capsys):
    """hf-relpos-export has no --import_modules (CTranslate2 runs hf_relpos' own schemes only): a model of a scheme
    registered elsewhere is one line saying so, not the advice to import the module that registers it."""
    registry = dict(hf_relpos.POSITION_SCHEMES)
    try:
        hf_relpos.register_position_scheme("exported_elsewhere")(type("Elsewhere", (hf_relpos.PositionScheme,), {}))
        config = hf_relpos.RelPosTransformerConfig(
            position_scheme="exported_elsewhere", vocab_size=len(tokenizer), d_model=16, encoder_layers=1,
            decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=16,
            decoder_ffn_dim=16, **special_token_ids(tokenizer))
        folder = save(hf_relpos.RelPosTransformerForConditionalGeneration(config), tokenizer, tmp_path / "model")
    finally:   # as in a process that has not imported the module
        hf_relpos.POSITION_SCHEMES.clear()
        hf_relpos.POSITION_SCHEMES.update(registry)
    (tmp_path / "out").mkdir()
    error = export_error(["ctranslate2", str(folder), str(tmp_path / "out" / "ct2")], capsys)
    assert error.startswith("hf-relpos-export: error: position_scheme 'exported_elsewhere' cannot be exported to "
                            "CTranslate2: it is not one of hf_relpos' own schemes"), error
    assert list((tmp_path / "out").iterdir()) == []


def test_sampling_settings_are_refused(exported, tokenizer, tmp_path):
    """do_sample true is refused; set false, as generate's default, it exports."""
    model, _, _ = exported["absolute"]
    saved = copy.deepcopy(model.generation_config)
    model.generation_config.do_sample = True
    try:
        folder = save(model, tokenizer, tmp_path / "model")
        model.generation_config.do_sample = False
        greedy_folder = save(model, tokenizer, tmp_path / "greedy")
    finally:
        model.generation_config = saved
    with pytest.raises(ExportError, match="^generation_config do_sample True cannot be exported"):
        export_ctranslate2(folder, tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists()
    assert is_ctranslate2_folder(export_ctranslate2(greedy_folder, tmp_path / "ct2_greedy"))


@pytest.mark.parametrize(("settings", "message"), [
    ({"forced_bos_token_id": 5, "encoder_no_repeat_ngram_size": 2},   # every one named, in one line
     r"^generation_config forced_bos_token_id 5, encoder_no_repeat_ngram_size 2 cannot be exported: .*remove them from "
     r"generation_config\.json"),
    ({"forced_eos_token_id": 0}, r"^generation_config forced_eos_token_id 0 cannot be exported: it is not an end token"),
    # logits processors of generate, which the engine would leave out: other translations, exported silently
    ({"suppress_tokens": [5], "begin_suppress_tokens": [5], "sequence_bias": [[[5], -10.0]],
      "encoder_repetition_penalty": 1.5},
     r"^generation_config suppress_tokens \[5\], begin_suppress_tokens \[5\], sequence_bias \[\[\[5\], -10\.0\]\], "
     r"encoder_repetition_penalty 1\.5 cannot be exported: CTranslate2's translate_batch has no such option"),
])
def test_generation_settings_the_engine_lacks_are_refused(exported, tokenizer, tmp_path, settings, message):
    model, _, _ = exported["absolute"]
    assert tokenizer.pad_token_id == 0 != tokenizer.eos_token_id
    saved = copy.deepcopy(model.generation_config)
    model.generation_config.update(**settings)
    try:
        folder = save(model, tokenizer, tmp_path / "model")
    finally:
        model.generation_config = saved
    with pytest.raises(ExportError, match=message):
        export_ctranslate2(folder, tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists()


def test_the_defaults_an_evaluation_fills_in_export_as_unset_and_real_settings_are_still_refused(exported, tokenizer,
                                                                                                 tmp_path):
    """Seq2SeqTrainer's evaluation fills generate's defaults into unset generation settings (num_beam_groups 1,
    diversity_penalty 0.0, do_sample false, top_k 50, ...): a folder saved so exports and translates as the one
    without them; the same settings at other values are still named together and refused."""
    model, _, plain_export = exported["absolute"]
    saved = copy.deepcopy(model.generation_config)
    model.generation_config.update(**GenerationConfig._get_default_generation_params(), defaults_only=True)
    try:
        filled = save(model, tokenizer, tmp_path / "filled")
        model.generation_config.update(num_beam_groups=2, diversity_penalty=0.5)
        diverse = save(model, tokenizer, tmp_path / "diverse")
    finally:
        model.generation_config = saved
    filled_settings = json.loads((filled / "generation_config.json").read_text())
    assert filled_settings["num_beam_groups"] == 1 and filled_settings["top_k"] == 50
    engine = CTranslate2Model(export_ctranslate2(filled, tmp_path / "ct2"), threads=1)
    settings = dict(progress=False, max_tokens=160)
    assert translate_lines(TEST_SOURCES, engine, tokenizer, **settings) == translate_lines(
        TEST_SOURCES, CTranslate2Model(plain_export, threads=1), tokenizer, **settings)
    with pytest.raises(ExportError, match=r"^generation_config num_beam_groups 2, diversity_penalty 0\.5 cannot be "
                                          r"exported: CTranslate2's translate_batch has no such option"):
        export_ctranslate2(diverse, tmp_path / "ct2_diverse")
    assert not (tmp_path / "ct2_diverse").exists()


def test_marians_forced_end_token_and_banned_words_export_and_decode_as_generate(exported, tokenizer, tmp_path):
    """MarianMT's generation configs (kept by a converted model) force the end token at max_length
    (`forced_eos_token_id` = eos) and ban tokens (`bad_words_ids`): the export keeps both, and greedy decoding gives
    generate's ids, rows cut at the ceiling (the end token forced) included; beam search, below the ceiling, gives
    generate's with renormalize_logits=True (the engine bans before the softmax)."""
    model, _, _ = exported["shaw"]
    inputs = tokenizer(TEST_SOURCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        plain = model.generate(**inputs, num_beams=1)
    frequent = torch.bincount(plain[:, 1:].flatten(), minlength=len(tokenizer))
    frequent[[tokenizer.eos_token_id, tokenizer.pad_token_id]] = 0
    banned = int(frequent.argmax())
    saved = copy.deepcopy(model.generation_config)
    model.generation_config.forced_eos_token_id = tokenizer.eos_token_id
    model.generation_config.bad_words_ids = [[banned], [tokenizer.pad_token_id]]
    model.generation_config.max_new_tokens = 8
    try:
        folder = export_ctranslate2(save(model, tokenizer, tmp_path / "model"), tmp_path / "ct2")
        engine = CTranslate2Model(folder, threads=1)
        with torch.no_grad():
            greedy = model.generate(**inputs, num_beams=1)
            beam = model.generate(**inputs, num_beams=4, max_new_tokens=60, renormalize_logits=True)
    finally:
        model.generation_config = saved
    assert banned in plain.flatten().tolist() and banned not in greedy.flatten().tolist()
    assert greedy.size(1) == 1 + 8 and (greedy[:, -1] == tokenizer.eos_token_id).sum() > 0   # forced at the ceiling
    assert torch.equal(engine.generate(**inputs, num_beams=1), greedy)
    assert tokenizer.batch_decode(engine.generate(**inputs, num_beams=4, max_new_tokens=60),
                                  skip_special_tokens=True) == (
        tokenizer.batch_decode(beam, skip_special_tokens=True))


def test_a_converted_marian_model_without_a_bos_token_exports_and_translates_as_generate(tokenizer, tmp_path):
    """MarianConfig's bos_token_id is None (decoding starts with the pad token): the export names the decoder's start
    token as CTranslate2's bos token, and greedy decoding gives generate's ids."""
    ids = special_token_ids(tokenizer)
    torch.manual_seed(0)
    marian = MarianMTModel(MarianConfig(
        vocab_size=len(tokenizer), d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=128,
        scale_embedding=True, pad_token_id=ids["pad_token_id"], eos_token_id=ids["eos_token_id"],
        decoder_start_token_id=ids["pad_token_id"], forced_eos_token_id=ids["eos_token_id"], bos_token_id=None,
        init_std=0.5)).eval()
    model = marian_to_relpos(marian, "absolute")
    model.generation_config.max_new_tokens = 20
    assert model.config.bos_token_id is None
    folder = export_ctranslate2(save(model, tokenizer, tmp_path / "model"), tmp_path / "ct2")
    inputs = tokenizer(TEST_SOURCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = model.generate(**inputs, num_beams=1)
    assert torch.equal(CTranslate2Model(folder, threads=1).generate(**inputs, num_beams=1), expected)


def test_the_export_of_a_converted_marian_model_names_the_marian_model_and_carries_its_license(tokenizer, tmp_path):
    """A converted MarianMT model (opus-mt: CC-BY-4.0, as its card's metadata says) is under the Marian model's
    license: the export's README.md names the Marian model and its license, in the text and the metadata, as does
    the export of a run fine-tuned from it (never hf_relpos' own apache-2.0)."""
    from hf_relpos.publish.records import RUN_RECORD_FILE, RunRecord
    from hf_relpos.tools.convert import convert_marian

    ids = special_token_ids(tokenizer)
    torch.manual_seed(0)
    marian = MarianMTModel(MarianConfig(
        vocab_size=len(tokenizer), d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=128,
        pad_token_id=ids["pad_token_id"], eos_token_id=ids["eos_token_id"], decoder_start_token_id=ids["pad_token_id"],
        forced_eos_token_id=ids["eos_token_id"], bos_token_id=None)).eval()
    marian.generation_config.max_new_tokens = 20
    source = save(marian, tokenizer, tmp_path / "opus-mt-en-de")
    (source / "README.md").write_text("---\ntags:\n- translation\nlicense: cc-by-4.0\n---\n\n### opus-mt-en-de\n")
    converted = convert_marian(source, tmp_path / "converted", "absolute")
    card = (export_ctranslate2(converted, tmp_path / "ct2") / "README.md").read_text()
    assert "\nlicense: cc-by-4.0\n" in card and "apache-2.0" not in card
    assert ("Its weights are the MarianMT model `<local>/opus-mt-en-de`, converted by `hf-relpos-convert marian`. "
            "The weights derive from `<local>/opus-mt-en-de`, whose model card gives its license as `cc-by-4.0`") in card

    fine_tuned = tmp_path / "fine-tuned"
    shutil.copytree(converted, fine_tuned, ignore=shutil.ignore_patterns("conversion.json"))
    run = RunRecord(model_name_or_path="converted", working_directory=str(tmp_path), source_lang="en",
                    target_lang="de")
    (fine_tuned / RUN_RECORD_FILE).write_text(json.dumps(run.to_json()), encoding="utf-8")
    card = (export_ctranslate2(fine_tuned, tmp_path / "ct2-fine-tuned") / "README.md").read_text()
    assert "\nlicense: cc-by-4.0\n" in card and "apache-2.0" not in card
    assert "It was fine-tuned from a conversion of the MarianMT model `<local>/opus-mt-en-de` by" in card


def test_a_model_without_a_decoder_start_token_exports_and_translates_as_generate(tokenizer, tmp_path):
    """decoder_start_token_id None: generate starts from bos_token_id, and so does the export (it once failed with
    `TypeError: list indices must be integers or slices, not NoneType`)."""
    model = tiny_translation_model(tokenizer, "shaw", steps=0)
    model.config.decoder_start_token_id = model.generation_config.decoder_start_token_id = None
    folder = export_ctranslate2(save(model, tokenizer, tmp_path / "model"), tmp_path / "ct2")
    inputs = tokenizer(TEST_SOURCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = model.generate(**inputs, num_beams=1)
    assert expected[0, 0] == model.config.bos_token_id
    assert torch.equal(CTranslate2Model(folder, threads=1).generate(**inputs, num_beams=1), expected)


@pytest.mark.parametrize(("ids", "message"), [
    (dict(eos_token_id=None), "eos_token_id None cannot be exported"),
    (dict(decoder_start_token_id=None, bos_token_id=None), "decoder_start_token_id None with bos_token_id None"),
])
def test_a_model_without_an_end_or_start_token_is_refused_before_anything_is_written(tokenizer, tmp_path, capsys, ids,
                                                                                      message):
    config = hf_relpos.RelPosTransformerConfig(
        vocab_size=len(tokenizer), d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, position_scheme="shaw",
        **{**special_token_ids(tokenizer), **ids})
    folder = save(hf_relpos.RelPosTransformerForConditionalGeneration(config), tokenizer, tmp_path / "model")
    (tmp_path / "out").mkdir()
    with pytest.raises(ExportError, match="^" + message):
        export_ctranslate2(folder, tmp_path / "out" / "ct2")
    assert export_error(["ctranslate2", str(folder), str(tmp_path / "out" / "ct2")], capsys).startswith(
        f"hf-relpos-export: error: {message}")
    assert list((tmp_path / "out").iterdir()) == []


def test_a_missing_engine_names_the_extra_and_writes_nothing(exported, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # importing it now raises ImportError
    assert export_error(["ctranslate2", str(exported["none"][1]), str(tmp_path / "ct2")], capsys) == (
        f"hf-relpos-export: error: {ENGINE_MISSING}")
    assert "hf_relpos[export]" in ENGINE_MISSING
    assert list(tmp_path.iterdir()) == []


def test_an_existing_folder_is_not_overwritten(exported, tmp_path):
    (tmp_path / "ct2").mkdir()
    (tmp_path / "ct2" / "keep.txt").write_text("mine")
    with pytest.raises(OutputDirError, match="OUT_DIR .* exists and is not an empty folder"):
        export_ctranslate2(exported["none"][1], tmp_path / "ct2")
    assert [path.name for path in (tmp_path / "ct2").iterdir()] == ["keep.txt"]


def test_an_out_dir_under_a_file_is_one_error_naming_it(exported, tmp_path, capsys):
    (tmp_path / "file").write_text("mine")
    assert export_error(["ctranslate2", str(exported["none"][1]), str(tmp_path / "file" / "ct2")], capsys) == (
        f"hf-relpos-export: error: OUT_DIR '{tmp_path / 'file' / 'ct2'}': "
                                 f"'{tmp_path / 'file'}' is a file, not a folder")
    assert [path.name for path in tmp_path.iterdir()] == ["file"]


@pytest.mark.parametrize(("umask", "file_mode", "folder_mode"), [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_the_exported_folder_gets_the_modes_the_umask_gives(tokenizer, tmp_path, umask, file_mode, folder_mode):
    """OUT_DIR is staged in a tempfile folder (owner-only): once renamed in, it and its files have the modes mkdir()
    and open() give under the umask."""
    source = save(tiny_translation_model(tokenizer, "shaw", steps=0), tokenizer, tmp_path / "model")
    previous = os.umask(umask)
    try:
        export_main(["ctranslate2", str(source), str(tmp_path / "ct2")])
    finally:
        os.umask(previous)
    paths = [tmp_path / "ct2", *(tmp_path / "ct2").iterdir()]
    assert {path.name: oct(stat.S_IMODE(path.stat().st_mode)) for path in paths} == {
        path.name: oct(folder_mode if path.is_dir() else file_mode) for path in paths}


def test_exporting_an_export_is_one_error_naming_it_and_writes_nothing(tokenizer, tmp_path, capsys):
    source = save(tiny_translation_model(tokenizer, "shaw", steps=0), tokenizer, tmp_path / "model")
    export_ctranslate2(source, tmp_path / "ct2")
    assert export_error(["ctranslate2", str(tmp_path / "ct2"), str(tmp_path / "again")], capsys) == (
        f"hf-relpos-export: error: MODEL_DIR {str(tmp_path / 'ct2')!r} is already a CTranslate2 export (of "
        "'<local>/model'); MODEL_DIR must be a trained model folder (model.safetensors, config.json, "
        "tokenizer), such as that one")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ct2", "model"]


def test_the_inference_benchmark_records_every_engine_on_the_same_lines(exported, tmp_path):
    """benchmarks/bench_inference.py on a tiny model (no timing asserted): every engine's sentences/s, BLEU and lines
    identical to PyTorch's, float32 identical on every line."""
    from benchmarks import bench_inference

    test_file = tmp_path / "test.jsonl"
    test_file.write_text("".join(json.dumps({"translation": {"en": source, "de": target}}) + "\n"
                                 for source, target in SPLITS["test"][:10]), encoding="utf-8")
    threads = torch.get_num_threads()
    try:
        record = bench_inference.main([str(exported["rope"][1]), "--test_file", str(test_file), "--threads", "1",
                                       "--batch_size", "4", "--out", str(tmp_path / "out"), "--model_note", "tiny"])
    finally:
        torch.set_num_threads(threads)
    (run,) = record["runs"]
    assert list(run["engines"]) == ["pytorch", "pytorch (early_stopping=False)", "ct2_float32", "ct2_int8"]
    assert run["engines"]["ct2_float32"]["identical_lines"] == record["sentences"] == 10
    assert run["engines"]["ct2_float32"]["bleu"] == run["engines"]["pytorch"]["bleu"]
    assert all(row["sentences_per_second"] > 0 for row in run["engines"].values())
    assert json.loads((tmp_path / "out" / "inference.json").read_text())["runs"] == record["runs"]


def test_the_source_relative_cap_is_the_pytorch_models(exported, tokenizer):
    """max_len_a / max_len_b (passed, as hf-relpos-translate passes them): the engine's per-row limits are the
    model's, and greedy decoding gives PyTorch's ids on every row, those cut at their limit (where PyTorch forces the
    end token) included; without an attention mask, padding is not counted in the sources' lengths."""
    model, _, folder = exported["t5"]
    engine = CTranslate2Model(folder, threads=1)
    caps = dict(max_len_a=0.8, max_len_b=3, num_beams=1)
    inputs = tokenizer(TEST_SOURCES, padding=True, return_tensors="pt")
    limits = model.new_token_limits(**inputs, **caps)
    assert torch.equal(engine.new_token_limits(**inputs, **caps), limits) and len(set(limits.tolist())) > 3
    assert torch.equal(engine.new_token_limits(inputs.input_ids, **caps), limits)
    other_pad = torch.where(inputs.attention_mask.bool(), inputs.input_ids, 3)   # a pad_token_id passed to generate
    assert torch.equal(engine.new_token_limits(other_pad, pad_token_id=3, **caps),
                       model.new_token_limits(other_pad, pad_token_id=3, **caps))
    assert torch.equal(model.new_token_limits(other_pad, pad_token_id=3, **caps), limits)
    with torch.no_grad():
        expected = model.generate(**inputs, **caps)
    capped = sum(tokenizer.eos_token_id not in row[1:limit].tolist() for row, limit in zip(expected, limits.tolist(),
                                                                                         strict=True))
    assert 0 < capped < len(TEST_SOURCES)
    assert torch.equal(engine.generate(**inputs, **caps), expected)
    assert torch.equal(engine.generate(inputs.input_ids, **caps), expected)


@pytest.mark.parametrize(("option", "value"), [("min_new_tokens", 12), ("no_repeat_ngram_size", 1)])
def test_tokens_banned_by_a_setting_generate_with_renormalised_log_probabilities(exported, tokenizer, option, value):
    """A minimum length (min_new_tokens) or blocked repeated n-grams (no_repeat_ngram_size): greedy lines are
    generate's; in beam search the engine bans the tokens before the softmax, so its lines are generate's with
    renormalize_logits=True (docs/training.md, Deploy with CTranslate2)."""
    model, _, folder = exported["t5"]
    engine = CTranslate2Model(folder, threads=1)
    inputs = tokenizer(TEST_SOURCES, padding=True, return_tensors="pt")

    def lines(generated: torch.Tensor) -> list[str]:
        return tokenizer.batch_decode(generated, skip_special_tokens=True)

    for num_beams in (1, 4):
        settings = {"num_beams": num_beams, option: value}
        with torch.no_grad():
            renormalised = lines(model.generate(**inputs, **settings, renormalize_logits=True))
            unbanned = lines(model.generate(**inputs, **{**settings, option: 0}))
        assert renormalised != unbanned and lines(engine.generate(**inputs, **settings)) == renormalised
        if option == "min_new_tokens":
            with torch.no_grad():   # generate's default: the same greedy lines, other beam-search lines here
                assert (lines(model.generate(**inputs, **settings)) == renormalised) == (num_beams == 1)


def with_decoder_start(model, token_id: int, **generation):
    """A copy of `model` whose decoder starts from `token_id`, with these generation settings saved."""
    copied = copy.deepcopy(model)
    copied.config.decoder_start_token_id = token_id
    copied.generation_config.update(decoder_start_token_id=token_id, **generation)
    return copied


@pytest.mark.parametrize("start", ["bos", "eos"])
@pytest.mark.parametrize("num_beams", [1, 4])
def test_blocking_every_repeated_token_bans_the_decoder_start_token_as_generate_does(exported, tokenizer, tmp_path,
                                                                                      start, num_beams):
    """no_repeat_ngram_size 1: generate's history holds the decoder start token, so it is banned from the first
    step; the engine's holds the generated tokens only and bans it as a suppressed token. A decoder that starts from
    its end token (`decoder_start_token: eos`) then never ends a line before its cap, in both engines (beam search:
    generate's with renormalize_logits=True, as for every banned token)."""
    start_id = getattr(tokenizer, f"{start}_token_id")
    model = with_decoder_start(exported["t5"][0], start_id, max_new_tokens=10)
    folder = export_ctranslate2(save(model, tokenizer, tmp_path / "model"), tmp_path / "ct2")
    inputs = tokenizer(TEST_SOURCES[:8], padding=True, return_tensors="pt")
    settings = dict(num_beams=num_beams, no_repeat_ngram_size=1)
    with torch.no_grad():
        expected = model.generate(**inputs, **settings, renormalize_logits=True)
    assert (tokenizer.eos_token_id in expected[:, 1:].flatten().tolist()) == (start != "eos")   # new tokens
    assert tokenizer.batch_decode(CTranslate2Model(folder, threads=1).generate(**inputs, **settings),
                                  skip_special_tokens=True) == tokenizer.batch_decode(expected,
                                                                                      skip_special_tokens=True)


@pytest.mark.parametrize(("start", "num_beams", "refusal"), [
    ("bos", 1, None),
    ("bos", 4, r"^repetition_penalty 1\.3 with num_beams 4: generate's beam search applies the penalty to the "
               r"log-probabilities"),
    ("eos", 1, r"^repetition_penalty 1\.3 with a decoder that starts from its end token \(decoder_start_token_id 1\)"),
])
def test_a_repetition_penalty_decodes_as_generate_or_is_refused(exported, tokenizer, tmp_path, start, num_beams,
                                                               refusal):
    """repetition_penalty: greedy search penalises the logits in both engines, which give the same lines. generate's
    beam search penalises the log-probabilities, and a decoder starting from its end token has that token penalised
    from the first step (it is in generate's history, not in the engine's): both are refused, when decoding and,
    saved in the generation config, when exporting (nothing written)."""
    settings = dict(num_beams=num_beams, repetition_penalty=1.3)
    model = with_decoder_start(exported["shaw"][0], getattr(tokenizer, f"{start}_token_id"))
    engine = CTranslate2Model(export_ctranslate2(save(model, tokenizer, tmp_path / "model"), tmp_path / "ct2"),
                              threads=1)
    lines = dict(progress=False, max_tokens=160)
    if refusal is None:
        expected = translate_lines(TEST_SOURCES, model, tokenizer, **lines, **settings)
        assert expected != translate_lines(TEST_SOURCES, model, tokenizer, **lines, num_beams=num_beams)
        assert translate_lines(TEST_SOURCES, engine, tokenizer, **lines, **settings) == expected
        return
    with pytest.raises(ExportError, match=refusal):
        translate_lines(TEST_SOURCES, engine, tokenizer, **lines, **settings)
    model.generation_config.update(**settings, early_stopping=num_beams > 1)   # early stopping: beam search only
    with pytest.raises(ExportError, match=refusal.replace("^", "^generation_config ")):
        export_ctranslate2(save(model, tokenizer, tmp_path / "saved"), tmp_path / "ct2_saved")
    assert not (tmp_path / "ct2_saved").exists()


def test_the_engines_ceiling_is_generates(exported):
    """New tokens without max_new_tokens: max_length minus the decoder start token, else generate's default."""
    from hf_relpos.model.generation_limits import DEFAULT_NEW_TOKENS

    engine = CTranslate2Model(exported["t5"][2], threads=1)
    assert engine.decoding_options()["max_decoding_length"] == 60   # the saved max_new_tokens
    assert engine.decoding_options(max_new_tokens=None, max_length=12)["max_decoding_length"] == 11
    assert engine.decoding_options(max_new_tokens=None, max_length=None)["max_decoding_length"] == DEFAULT_NEW_TOKENS


def test_a_saved_source_relative_cap_travels_with_the_export(exported, tokenizer, tmp_path):
    """A generation config saved with max_len_a / max_len_b (as train_translation.py saves it): the exported folder
    keeps them, and the engine caps each row as the model does without being told."""
    from hf_relpos.model.generation_limits import set_relative_limit

    model, _, _ = exported["none"]
    saved = copy.deepcopy(model.generation_config)
    set_relative_limit(model.generation_config, 1.2, 4)
    try:
        folder = export_ctranslate2(save(model, tokenizer, tmp_path / "model"), tmp_path / "ct2")
        inputs = tokenizer(TEST_SOURCES[:6], padding=True, return_tensors="pt")
        assert torch.equal(CTranslate2Model(folder, threads=1).new_token_limits(**inputs),
                           model.new_token_limits(**inputs))
    finally:
        model.generation_config = saved


@pytest.mark.parametrize("length_penalty", [1.0, 0.6])
@pytest.mark.parametrize("num_beams", [1, 4])
def test_the_engines_n_best_lists_are_generates(exported, tokenizer, num_beams, length_penalty):
    """num_hypotheses: the same hypotheses as generate's num_return_sequences (early_stopping=True, length penalty 1
    and 0.6, passed as generate's setting), in the same order, of the same lengths (CTranslate2 normalises its score by the tokens it returns, the end token
    included: transformers' convention). F0 and SCORE agree to the float32 rounding of the two stacks: 1e-4 per token
    (test_the_engine_scores_every_target_token_as_pytorch_does), so F0 within 1e-4 x length and SCORE (F0 / length)
    within 1e-4."""
    from hf_relpos.tools.n_best import generate_n_best

    model, _, folder = exported["shaw"]
    inputs = tokenizer(TEST_SOURCES, padding=True, return_tensors="pt")
    n_best = min(num_beams, 3)
    with torch.no_grad():
        expected = generate_n_best(model, dict(inputs), n_best, num_beams=num_beams, length_penalty=length_penalty)
    scored = CTranslate2Model(folder, threads=1).generate_n_best(**inputs, n_best=n_best, num_beams=num_beams,
                                                                 length_penalty=length_penalty)
    lines = tokenizer.batch_decode(expected.sequences, skip_special_tokens=True)
    assert tokenizer.batch_decode(scored.sequences, skip_special_tokens=True) == lines
    assert len(set(lines)) >= len(lines) // 3 and torch.equal(scored.lengths, expected.lengths)
    assert torch.all((scored.log_probabilities - expected.log_probabilities).abs() <= 1e-4 * expected.lengths)
    assert torch.allclose(scored.scores, expected.scores, atol=1e-4, rtol=0)


def test_the_end_token_the_engine_appends_at_the_source_relative_cap_scores_as_in_greedy_search(exported, tokenizer):
    """Under max_len_b the engine decodes a row to one token short of its cap and appends the end token, unscored:
    it counts in the length and adds 0 to F0, which is what generate's greedy search gives it (the cap leaves the end
    token the only one, and greedy search's F0 is the log-softmax after the processors). (Beam search takes the
    log-softmax before them: generate's F0 keeps the end token's log-probability there, and ranks by it, so a capped
    row can differ in beam search, as its line can: hf_relpos.tools.ctranslate2_engine.)"""
    from hf_relpos.tools.n_best import generate_n_best

    model, _, folder = exported["t5"]
    caps = dict(max_len_a=0.8, max_len_b=3, num_beams=1)
    inputs = tokenizer(TEST_SOURCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = generate_n_best(model, dict(inputs), 1, **caps)
    scored = CTranslate2Model(folder, threads=1).generate_n_best(**inputs, **caps)
    assert torch.equal(scored.sequences, expected.sequences) and torch.equal(scored.lengths, expected.lengths)
    cut = expected.lengths == model.new_token_limits(**inputs, **caps)
    assert 0 < int(cut.sum()) < len(TEST_SOURCES)
    assert torch.all((scored.log_probabilities - expected.log_probabilities).abs() <= 1e-4 * expected.lengths)
    assert torch.allclose(scored.scores, expected.scores, atol=1e-4, rtol=0)


def test_hf_relpos_translate_writes_an_exported_folders_n_best_lists_as_the_pytorch_ones(exported, tmp_path):
    """--n_best 3 through the command on both folders: the same line indices and hypotheses; the scores within the
    tolerance above."""
    _, source, folder = exported["shaw"]
    write = "".join(f"{line}\n" for line in [TEST_SOURCES[0], "", *TEST_SOURCES[1:6]])
    (tmp_path / "src.txt").write_text(write)
    entries = {}
    for model_folder, output in ((source, "torch.txt"), (folder, "ct2.txt")):
        translate_main([str(model_folder), "--input", str(tmp_path / "src.txt"), "--output", str(tmp_path / output),
                        "--n_best", "3", "--no_split_sentences", "--no_progress", "--buffer_lines", "3"])
        entries[output] = [line.split(" ||| ") for line in (tmp_path / output).read_text().splitlines()]
    assert len(entries["torch.txt"]) == 7 * 3
    for (index, text, log_probability, score), (*same, engine_log_probability, engine_score) in zip(
            entries["torch.txt"], entries["ct2.txt"], strict=True):
        assert same == [index, text]
        assert abs(float(engine_score) - float(score)) <= 1e-4
        assert abs(float(engine_log_probability.removeprefix("F0= ")) - float(log_probability.removeprefix("F0= "))) \
            <= 1e-4 * 60


def test_the_cards_plain_ctranslate2_snippet_applies_the_saved_banned_words_and_repeat_limits(
        exported, tokenizer, tmp_path):
    """A converted MarianMT model saves `bad_words_ids` (its pad token), and a generation config may save
    `no_repeat_ngram_size`: the export card's CTranslate2-alone snippet passes them (suppress_sequences by token,
    no_repeat_ngram_size), so it prints the translation hf-relpos-translate gives with the same folder. It passed the
    beam, length penalty and cap only, and printed a translation holding the banned token."""
    from huggingface_hub import ModelCard

    from hf_relpos.publish.records import RUN_RECORD_FILE

    model, _, _ = exported["absolute"]
    sentence = TEST_SOURCES[3]
    inputs = tokenizer([sentence], return_tensors="pt")
    with torch.no_grad():
        unbanned = model.generate(**inputs)
    frequent = torch.bincount(unbanned[0, 1:], minlength=len(tokenizer))
    frequent[[tokenizer.eos_token_id, tokenizer.pad_token_id]] = 0
    banned = int(frequent.argmax())
    saved = copy.deepcopy(model.generation_config)
    model.generation_config.bad_words_ids = [[banned], [tokenizer.pad_token_id]]
    model.generation_config.no_repeat_ngram_size = 3
    try:
        source = save(model, tokenizer, tmp_path / "model")
    finally:
        model.generation_config = saved
    (source / RUN_RECORD_FILE).write_text(json.dumps({"source_lang": "en", "target_lang": "de"}))
    folder = export_ctranslate2(source, tmp_path / "ct2")
    snippet = ModelCard.load(folder / "README.md").text.split("```python\n")[1].split("```")[0]
    assert 'tokenizer("The dog is sleeping.")' in snippet and "no_repeat_ngram_size=3" in snippet
    assert f"suppress_sequences={[[tokenizer.convert_ids_to_tokens(banned)], [tokenizer.pad_token]]!r}" in snippet
    snippet = snippet.replace('"FOLDER"', repr(str(folder))).replace("The dog is sleeping.", sentence)
    printed = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, check=True).stdout
    engine = tokenizer.decode(CTranslate2Model(folder, threads=1).generate(**inputs)[0], skip_special_tokens=True)
    assert engine != tokenizer.decode(unbanned[0], skip_special_tokens=True)   # the ban changes this translation
    assert printed == engine + "\n"


def test_the_export_saves_the_tokenizer_config_it_read(tmp_path):
    """The exported folder's tokenizer_config.json is the source folder's: nothing of how the export loaded it
    (transformers keeps `is_local` and `local_files_only` among a loaded tokenizer's init_kwargs)."""
    fresh = train_joint_tokenizer(TOKENIZER_TEXTS, vocab_size=300)
    source = tmp_path / "model"
    fresh.save_pretrained(source)   # before a padded call sets its backend's padding, which a save would write
    tiny_translation_model(copy.deepcopy(fresh), "shaw", steps=0).save_pretrained(source)
    exported = export_ctranslate2(source, tmp_path / "ct2")
    assert (json.loads((Path(exported) / "tokenizer_config.json").read_text(encoding="utf-8"))
            == json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8")))
