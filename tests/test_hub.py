"""Model cards, Hub pushes (the Hub client patched at HfApi.create_repo / create_commit: no network), the translation
pipeline, and loading a pushed folder in fresh processes with hf_relpos and with remote code only."""

from __future__ import annotations

import dataclasses
import inspect
import json
import ntpath
import os
import posixpath
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import transformers
from conftest import BUILT_IN_SCHEMES, make_unwritable, run_without_hf_relpos, train_memorising_model
from huggingface_hub import CommitOperationDelete, HfApi, ModelCard
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, RepositoryNotFoundError
from huggingface_hub.hf_api import RepoUrl
from transformers import AutoModelForSeq2SeqLM, TrainerState, pipeline

import hf_relpos
from hf_relpos.publish import hub
from hf_relpos.publish.records import (
    PEER,
    RECIPE,
    RUN_RECORD_FILE,
    TRAINED_WEIGHTS,
    ConversionRecord,
    RunRecord,
    Scores,
    read_run_records,
    scores_from_results,
    source_version,
    training_record,
)
from hf_relpos.tools.average import average_checkpoints
from hf_relpos.translation import preflight
from hf_relpos.translation import training as training_module
from hf_relpos.translation.arguments import ConfigError, parse_arguments
from hf_relpos.translation.metrics import score_translations
from hf_relpos.translation.run_outputs import push_training_output, run_record
from hf_relpos.translation.training import main as training_main
from hf_relpos.translation.training import run

REPO_ROOT = Path(__file__).resolve().parents[1]
PAIRS = [
    ("the cat sleeps", "die Katze schläft"),
    ("the dog sees the cat", "der Hund sieht die Katze"),
    ("the small bird sings", "der kleine Vogel singt"),
    ("the house is red", "das Haus ist rot"),
    ("the tree is big", "der Baum ist groß"),
    ("the cat sees the bird", "die Katze sieht den Vogel"),
]
# the model unit, all of which ships as remote code (its files import each other only)
CODE_FILES = {path.name for path in (REPO_ROOT / "hf_relpos" / "model").glob("*.py") if path.name != "__init__.py"}
MODEL_FILES = {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               *CODE_FILES}
RESULTS = {
    "eval": {"eval_bleu": 27.3456, "eval_bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
             "eval_chrf": 56.789, "eval_chrf_signature": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0",
             "eval_samples": 1000},   # the recipe's max_eval_samples: the first 1000 pairs of newstest2013
    "test": {"test_bleu": 28.4049, "test_bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
             "test_chrf": 57.1234, "test_chrf_signature": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0",
             "test_samples": 3003},
}
SCHEME_SETTINGS = {
    "absolute": {},
    "shaw": {"max_relative_position": 8, "use_relative_values": False,
             "relative_embeddings_shared_across_heads": False},
    "xl": {"clamp_len": 32, "untie_relative_biases": False},
    "directional": {"directional_heads": ["forward", "backward", "both"], "directional_disable_diagonal": False},
    "none": {},
    "alibi": {"encoder_attention_heads": 6, "decoder_attention_heads": 4},
    "t5": {"relative_attention_num_buckets": 16, "relative_attention_max_distance": 64},
    "rope": {"rope_theta": 500.0, "rotary_dim": 6},
}
SCHEME_TEXT = {
    "absolute": ["PE_{(p,\\,i)} = \\sin", "PE_{(p,\\,d/2+i)} = \\cos", "0 \\le i < d/2"],
    "shaw": ["| `max_relative_position` (k) | 8 |", "one table per head", "2k+1 = 17", "a^K_{ij}", "$a^K$ ("],
    "xl": ["| `clamp_len` | 32 |", "clamped to ±32", "shared by all layers of a stack (tied)", "W_{k,R} R_{i-j}"],
    "directional": ["forward, backward, both, forward", "forward: j ≤ i", "M^h_{ij}"],
    "none": ["No position information", "permutation-equivariant"],
    "alibi": ["m_h\\,|i - j|", "encoder 0.25, 0.0625, 0.01562, 0.003906, 0.5, 0.125;",  # 6 heads: 4 + 2 interleaved
              "decoder 0.25, 0.0625, 0.01562, 0.003906."],
    "t5": ["| `relative_attention_num_buckets` | 16 |", "| `relative_attention_max_distance` | 64 |",
           "offsets below 4 (encoder, per sign) or 8 (decoder)", "b_h\\!\\left(\\mathrm{bucket}(j - i)\\right)"],
    "rope": ["| `rope_theta` (θ) | 500.0 |", "| `rotary_dim` | 6 |", "base θ = 500", "the first 6 dimensions",
             "R_{\\Theta,j-i}"],
}
BIBTEX_KEYS = {"absolute": set(), "shaw": {"shaw2018self"}, "xl": {"dai2019transformerxl"},
               "directional": {"shen2018disan"}, "none": {"kazemnejad2023impact"}, "alibi": {"press2022train"},
               "t5": {"raffel2020exploring"}, "rope": {"su2024roformer"}}
UNTAGGED_AS_RELATIVE = {"absolute", "none"}
# The committed experiment records whose runs of a recipe go into its card (`render-cards --records`).
RECIPE_RECORDS = ["docs/results/convergence/one_commit_seeds_1_2/convergence.json",
                  "docs/results/vs_marian/recipes_one_commit/vs_marian.json",
                  "docs/results/vs_marian/alibi_t5_equal_budget/vs_marian.json",
                  "docs/results/convergence/seed_3_d34293a/convergence.json"]


# --------------------------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def trained_folder(tmp_path_factory) -> Path:
    """A tiny Shaw model that has memorised PAIRS, saved with its tokenizer and the results files of an evaluation,
    as train_translation.py leaves them."""
    model, tokenizer, hypotheses = train_memorising_model(PAIRS, steps=100)

    folder = tmp_path_factory.mktemp("trained") / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    scores = score_translations(hypotheses, [target for _, target in PAIRS])
    for prefix in ("eval", "test"):
        metrics = {f"{prefix}_{name}": value for name, value in scores.items()} | {f"{prefix}_samples": len(PAIRS)}
        (folder / f"{prefix}_results.json").write_text(json.dumps(metrics, indent=4, sort_keys=True))
    (folder / "eval_hypotheses.txt").write_text("\n".join(hypotheses) + "\n")
    (folder / "demo_data").mkdir()
    (folder / "demo_data" / "train.jsonl").write_text("{}\n")
    return folder


@pytest.fixture
def output_folder(trained_folder, tmp_path) -> Path:
    """A fresh copy of the trained folder, for tests that push it."""
    return Path(shutil.copytree(trained_folder, tmp_path / "output"))


@pytest.fixture
def fake_hub(monkeypatch) -> SimpleNamespace:
    """Replaces the Hub client's network calls: records each create_repo call and each commit's files (name ->
    bytes); `existing` holds the repositories there are (id -> private), and create_repo of one without exist_ok is
    the Hub's 409; the login check of train_translation.py sees the user "me", whose namespace a repository id without
    one goes to."""
    recorded = SimpleNamespace(repos=[], commits=[], existing={})

    def create_repo(self, repo_id, *, private=None, exist_ok=False, **kwargs):
        recorded.repos.append({"repo_id": repo_id, "private": private, "exist_ok": exist_ok})
        full_id = repo_id if "/" in repo_id else f"me/{repo_id}"
        if full_id in recorded.existing and not exist_ok:
            conflict = SimpleNamespace(status_code=409, headers={}, request=None)   # what HfHubHTTPError reads
            raise HfHubHTTPError("409 Conflict: You already created this model repo", response=conflict)
        recorded.existing.setdefault(full_id, bool(private))
        return RepoUrl(f"https://huggingface.co/{full_id}")

    def repo_info(self, repo_id, **kwargs):
        if repo_id not in recorded.existing:
            missing = SimpleNamespace(status_code=404, headers={}, request=None)
            raise RepositoryNotFoundError(f"404 Client Error: Repository Not Found for {repo_id}", response=missing)
        return SimpleNamespace(id=repo_id, private=recorded.existing[repo_id])

    def delete_repo(self, repo_id, **kwargs):
        del recorded.existing[repo_id]

    def create_commit(self, repo_id, operations, *, commit_message=None, **kwargs):
        files, deleted = {}, []
        for operation in operations:
            if isinstance(operation, CommitOperationDelete):
                deleted.append(operation.path_in_repo)
                continue
            with operation.as_file() as handle:
                files[operation.path_in_repo] = handle.read()
        recorded.commits.append({"repo_id": repo_id, "files": files, "deleted": deleted, "message": commit_message})
        return SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/0123")

    def list_repo_files(self, repo_id, **kwargs):
        """The files the commits recorded left in `repo_id` (added, not deleted since)."""
        present = set()
        for commit in (commit for commit in recorded.commits if commit["repo_id"] == repo_id):
            present = (present | commit["files"].keys()) - set(commit["deleted"])
        return sorted(present)

    def no_remote_card(cls, repo_id_or_path, *args, **kwargs):
        raise EntryNotFoundError(f"{repo_id_or_path} has no README.md")

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "create_commit", create_commit)
    monkeypatch.setattr(HfApi, "list_repo_files", list_repo_files)
    monkeypatch.setattr(HfApi, "repo_info", repo_info)
    monkeypatch.setattr(HfApi, "delete_repo", delete_repo)
    monkeypatch.setattr(HfApi, "whoami", lambda self, *args, **kwargs: {"name": "me"})
    monkeypatch.setattr(preflight, "get_token", lambda: "hf_fake_token")
    monkeypatch.setattr(ModelCard, "load", classmethod(no_remote_card))
    return recorded


def folder_snapshot(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def tiny_config(position_scheme: str) -> hf_relpos.RelPosTransformerConfig:
    values = dict(vocab_size=100, d_model=48, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96, position_scheme=position_scheme)
    return hf_relpos.RelPosTransformerConfig(**values | SCHEME_SETTINGS.get(position_scheme, {}))


# --------------------------------------------------------------------------------------------------- model cards

@pytest.mark.parametrize("position_scheme", BUILT_IN_SCHEMES)
def test_card_metadata_and_body_for_each_scheme(position_scheme):
    recipe = hub.load_card_recipe(REPO_ROOT / "configs" / "wmt14_en_de_base_shaw.yaml")
    text = hub.render_model_card(tiny_config(position_scheme), recipe, RESULTS, repo_id="me/relpos-model")
    card = ModelCard(text)
    data = card.data
    assert data.language == ["en", "de"]
    assert data.license == "apache-2.0"
    assert data.library_name == "transformers"
    assert data.pipeline_tag == "translation"
    assert data.datasets == ["wmt/wmt14"]
    assert data.metrics == ["sacrebleu", "chrf"]
    assert {"translation", position_scheme} <= set(data.tags)
    assert ("relative-position" in data.tags) == (position_scheme not in UNTAGGED_AS_RELATIVE)

    results = {(result.dataset_split, result.metric_type): result for result in data.eval_results}
    # the recipe's max_eval_samples: 1000 scores a slice of newstest2013, and the model-index says which
    assert set(results) == {(split, metric) for split in ("validation[:1000]", "test")
                            for metric in ("sacrebleu", "chrf")}
    test_bleu = results["test", "sacrebleu"]
    assert test_bleu.metric_value == 28.40
    assert test_bleu.metric_args == {"signature": RESULTS["test"]["test_bleu_signature"]}
    assert (test_bleu.task_type, test_bleu.dataset_type) == ("translation", "wmt/wmt14")
    assert test_bleu.dataset_config == "de-en"
    assert test_bleu.dataset_name == "WMT14 newstest2014"
    assert results["test", "chrf"].metric_value == 57.12
    assert results["validation[:1000]", "sacrebleu"].dataset_name == "WMT14 newstest2013, first 1000 pairs"

    body = card.text
    for expected in SCHEME_TEXT.get(position_scheme, ()):
        assert expected in body, expected
    signature_cell = "`" + RESULTS["test"]["test_bleu_signature"].replace("|", "\\|") + "`"  # pipes escaped in tables
    for expected in ("## Training", "| `learning_rate` | 0.0007 |", "| `warmup_steps` | 4000 |", "## Results",
                     f"| WMT14 newstest2014 (3003 pairs) | 28.40 | 57.12 | {signature_cell} |",
                     "| WMT14 newstest2013, first 1000 pairs | 27.35 | 56.79 |",
                     "The validation score covers the first 1000 pairs of the split only (`max_eval_samples`).",
                     "## How to use", 'from_pretrained("me/relpos-model", trust_remote_code=True)',
                     "import hf_relpos", 'pipeline("translation", model="me/relpos-model", trust_remote_code=True)',
                     "## Intended use and limitations", "Post-LN"):
        assert expected in body, expected
    cited = {line.split("{")[1].rstrip(",") for line in body.splitlines() if line.startswith("@")}
    own = {entry.split("{")[1].split(",")[0] for entry in hf_relpos.POSITION_SCHEMES[position_scheme].card.bibtex}
    assert cited == {"vaswani2017attention"} | BIBTEX_KEYS.get(position_scheme, own)


@pytest.mark.parametrize(("source_license", "license", "stated"), [
    ("cc-by-4.0", "cc-by-4.0", "whose model card gives its license as `cc-by-4.0`: that license and the source's "
                               "terms of use apply to them"),
    (None, "other", "whose license is not known (the conversion found none in its model card's metadata; the "
                    "metadata here says `license: other`)"),
])
def test_the_card_of_converted_or_fine_tuned_weights_carries_the_sources_license(source_license, license, stated):
    """Weights converted from a pretrained model (Helsinki-NLP's opus-mt: CC-BY-4.0), or fine-tuned from such a
    conversion, are under the source's license, not hf_relpos' apache-2.0: the metadata carries the license the
    source's card gave (`other` where none is known, the text saying so); a model trained from scratch keeps
    apache-2.0."""
    conversion = ConversionRecord(source="Helsinki-NLP/opus-mt-en-de", source_on_hub=True, source_type="marian",
                                  position_scheme="shaw", reproduces_source=False, source_license=source_license)
    recipe = hub.load_card_recipe(REPO_ROOT / "configs" / "wmt14_en_de_base_shaw.yaml")
    fine_tuned = RunRecord(model_name_or_path="converted", source_lang="en", target_lang="de")
    for record in (None, fine_tuned):
        card = ModelCard(hub.render_model_card(tiny_config("shaw"), record, None, conversion=conversion))
        assert card.data.license == license and "apache-2.0" not in card.content
        assert stated in card.text
    assert ModelCard(hub.render_model_card(tiny_config("shaw"), recipe, RESULTS)).data.license == "apache-2.0"


def test_the_card_of_weights_fine_tuned_from_another_model_carries_that_models_license(tmp_path):
    """A run fine-tuned from a local model folder (no conversion) carries the license its README.md's metadata gives
    (a fine-tune of CC-BY weights stays CC-BY); from a Hub model, whose card is not read, or a folder whose card
    names none, `other`, the text saying that the base model's license applies; from scratch, apache-2.0."""
    base = tmp_path / "base"
    base.mkdir()
    (base / "README.md").write_text("---\nlicense: cc-by-4.0\n---\n\n# base\n", encoding="utf-8")
    (tmp_path / "no-card").mkdir()
    expected = {
        "base": ("cc-by-4.0", "The weights were fine-tuned from `base`, whose model card gives its license as "
                              "`cc-by-4.0`: that license and the terms of use of `base` apply to them."),
        "someone/relpos-base": ("other", "The weights were fine-tuned from `someone/relpos-base`, whose license and "
                                         "terms of use apply to them (the Hub model's card gives it, which this card "
                                         "was written without reading; the metadata here says `license: other`)"),
        "no-card": ("other", "The weights were fine-tuned from `no-card`, whose license and terms of use apply to "
                             "them (its folder has no README.md whose metadata names one; the metadata here says "
                             "`license: other`)"),
        None: ("apache-2.0", None),
    }
    for started_from, (license, stated) in expected.items():
        run = RunRecord(model_name_or_path=started_from, source_lang="en", target_lang="de",
                        working_directory=str(tmp_path))
        card = ModelCard(hub.render_model_card(tiny_config("shaw"), run, None))
        assert card.data.license == license, started_from
        assert stated is None or (stated in card.text and "apache-2.0" not in card.content), started_from


def test_a_run_fine_tuning_a_folder_whose_card_license_cannot_be_read_stops_before_training(tmp_path):
    """The card written after training carries the license the base folder's README.md metadata gives
    (`fine_tuned_base`): metadata that does not name one license id is one ConfigError when the arguments are read,
    not a traceback after the training, with the final model saved and no card or run record."""
    base = tmp_path / "base"
    tiny_config("shaw").save_pretrained(base)
    (base / "README.md").write_text("---\nlicense:\n- mit\n- apache-2.0\n---\n\n# base\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^model_name_or_path .*base.*: the license in its model card's metadata "
                                          r"must be one license id"):
        parse_arguments([str(REPO_ROOT / "configs" / "finetune_marian_en_de_shaw.yaml"), "--model_name_or_path", str(base),
                         "--output_dir", str(tmp_path / "out")])


@pytest.mark.parametrize(("cap", "scored", "label", "split"), [
    (100, 100, "WMT14 newstest2014, first 100 pairs", "test[:100]"),
    (5000, 3003, "WMT14 newstest2014", "test"),   # a cap above the split's size leaves it whole
])
def test_a_capped_test_split_is_labelled_as_its_first_pairs(cap, scored, label, split):
    """max_predict_samples as max_eval_samples: the card's table and model-index name the slice that was scored,
    never the whole set, and a cap that cut nothing is not mentioned."""
    recipe = {**hub.load_card_recipe(REPO_ROOT / "configs" / "wmt14_en_de_base_shaw.yaml"), "max_predict_samples": cap}
    results = {"test": {**RESULTS["test"], "test_samples": scored}}
    card = ModelCard(hub.render_model_card(tiny_config("shaw"), recipe, results))
    assert {(result.dataset_name, result.dataset_split) for result in card.data.eval_results} == {(label, split)}
    row = f"| {label} | 28.40 |" if cap == scored else f"| {label} ({scored} pairs) | 28.40 |"
    assert row in card.text
    assert ("The test score covers the first 100 pairs of the split only" in card.text) == (cap == scored)


@pytest.mark.parametrize(("beams", "decoded"), [(1, "greedy translations"), (4, "beam-search translations (beam 4)")])
def test_the_results_name_the_decoding_that_was_scored(beams, decoded):
    """A run evaluated with greedy decoding (generation_num_beams 1) is not described as beam search."""
    recipe = {**hub.load_card_recipe(REPO_ROOT / "configs" / "wmt14_en_de_base_shaw.yaml"), "generation_num_beams": beams}
    text = hub.render_model_card(tiny_config("shaw"), recipe, RESULTS)
    assert f"Corpus-level sacreBLEU and chrF (the `sacrebleu` library) of {decoded} of this model" in text


@pytest.mark.parametrize(("decoder_heads", "size"), [(4, "d_z = 12 for"), (2, "d_z = 12 in the encoder and 24 in the decoder")])
def test_shaws_card_gives_the_table_size_of_each_stack(decoder_heads, size):
    """Shaw's tables are 2k+1 vectors of the head size d_z = d_model / heads of each stack: a decoder with other heads
    than the encoder learns vectors of another size, which the card names (it gave the encoder's alone before)."""
    config = hf_relpos.RelPosTransformerConfig(vocab_size=100, d_model=48, encoder_attention_heads=4,
                                               decoder_attention_heads=decoder_heads, position_scheme="shaw")
    assert f"vectors of size {size}" in hub.render_model_card(config, {}, None)


def test_the_hub_guide_gives_render_model_cards_signature():
    """docs/hub.md writes render_model_card's signature as the function has it: every parameter with its default, a
    `*` before those that are keyword-only (a call copied from the guide must not pass them by position)."""
    parts = []
    for parameter in inspect.signature(hub.render_model_card).parameters.values():
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and "*" not in parts:
            parts.append("*")
        empty = parameter.default is inspect.Parameter.empty
        parts.append(parameter.name if empty else f"{parameter.name}={parameter.default!r}")
    guide = (REPO_ROOT / "docs" / "hub.md").read_text(encoding="utf-8")
    assert f"`hf_relpos.publish.hub.render_model_card({', '.join(parts)})`" in guide


def test_a_card_without_a_repository_says_what_its_placeholder_stands_for():
    """A training folder's own card (not pushed, no hub_model_id) and a recipe card load from REPO_ID: the card says
    it is the Hub repository or the folder's path; a pushed card names its repository and no placeholder."""
    config = hf_relpos.RelPosTransformerConfig(vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1,
                                               encoder_attention_heads=2, decoder_attention_heads=2)
    local = hub.render_model_card(config, {}, None)
    assert "`REPO_ID` stands for the model's Hub repository, or the path of its folder." in local
    assert 'from_pretrained("REPO_ID")' in local
    pushed = hub.render_model_card(config, {}, None, repo_id="me/relpos-model")
    assert "REPO_ID" not in pushed and 'from_pretrained("me/relpos-model")' in pushed


@pytest.mark.parametrize(("decoder_heads", "warned"), [(None, False), (["forward", "backward"], True)])
def test_directional_card_warns_of_silent_decoder_heads_only_when_there_are_some(decoder_heads, warned):
    """The default decoder heads are all forward; an explicit backward head in the causal decoder outputs zeros."""
    config = hf_relpos.RelPosTransformerConfig(
        vocab_size=100, d_model=48, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96, position_scheme="directional",
        directional_heads=decoder_heads,
    )
    text = hub.render_model_card(config, {}, None)
    assert ("causal mask leaves backward heads without keys" in text) == warned


def test_card_without_results_has_no_model_index():
    recipe = hub.load_card_recipe(REPO_ROOT / "configs" / "multi30k_small_xl.yaml")
    card = ModelCard(hub.render_model_card(hub.config_from_recipe(recipe), recipe, recipe_name="multi30k_small_xl"))
    assert "model-index" not in card.content and card.data.eval_results is None
    assert card.data.datasets == ["bentrevett/multi30k"]
    assert "python train_translation.py configs/multi30k_small_xl.yaml" in card.text
    assert "Never trained in the hf_relpos repository" in card.text  # no record given
    assert "No published checkpoint: hf_relpos publishes no trained weights of this recipe" in card.text


def test_a_card_without_a_run_names_no_languages():
    """A model card from a config alone (a converted or a hand-built model) claims no language pair (not in its
    intended use, nor an English example to translate); a recipe's does."""
    card = ModelCard(hub.render_model_card(hf_relpos.RelPosTransformerConfig(position_scheme="shaw")))
    assert card.data.language is None
    assert "An encoder-decoder Transformer for translation whose self-attention" in card.text
    assert "English" not in card.text and "German" not in card.text and "The dog is sleeping." not in card.text
    assert "Intended for research on position representations and for sentence translation in the training domain" in (
        card.text) and 'translator("...")' in card.text
    recipe = hub.load_card_recipe(REPO_ROOT / "configs" / "multi30k_small_shaw.yaml")
    recipe_card = ModelCard(hub.render_model_card(hub.config_from_recipe(recipe), recipe))
    assert recipe_card.data.language == ["en", "de"] and "English→German translation" in recipe_card.text


@pytest.mark.parametrize(("source", "target", "named"), [("zh", "en", "Chinese→English"), ("ja", "ko", "Japanese→Korean"),
                                                          ("uk", "pt", "Ukrainian→Portuguese"), ("xx", "de", "xx→German"),
                                                          ("en", "zh-Hans", "English→Chinese"),
                                                          ("pt_BR", "xx-Yy", "Portuguese→xx-Yy")])
def test_a_card_names_the_common_translation_languages(source, target, named):
    """By the language code, or its primary subtag where it has a script or region (zh-Hans: Chinese)."""
    recipe = {"train_file": "data/train.jsonl", "source_lang": source, "target_lang": target}
    card = ModelCard(hub.render_model_card(tiny_config("shaw"), recipe))
    assert card.data.language == [source, target] and f"{named} translation" in card.text
    assert f"{named.split('→')[1]} (`{target}`)" in card.text


def test_card_for_local_files_names_them_and_lists_no_hub_dataset():
    recipe = {"train_file": "data/train.jsonl", "test_file": "data/news_test.jsonl", "source_lang": "de",
              "target_lang": "en", "dataset_name": "wmt/wmt14"}
    card = ModelCard(hub.render_model_card(tiny_config("shaw"), recipe, {"test": RESULTS["test"]}))
    assert card.data.language == ["de", "en"] and card.data.datasets is None
    (result, _) = card.data.eval_results
    assert (result.dataset_type, result.dataset_name, result.dataset_split) == ("custom", "news_test.jsonl", "test")


@pytest.mark.parametrize("dataset", ["wmt16", "opus_books", "wmt/wmt14", "{local}"])
def test_a_dataset_name_that_is_no_local_path_is_a_hub_dataset_with_or_without_a_namespace(tmp_path, dataset):
    local = dataset == "{local}"
    dataset = dataset.format(local=tmp_path)
    recipe = {"dataset_name": dataset, "dataset_config_name": "de-en", "source_lang": "de", "target_lang": "en"}
    card = ModelCard(hub.render_model_card(tiny_config("shaw"), recipe, {"test": RESULTS["test"]}))
    assert card.data.datasets == (None if local else [dataset])
    (result, _) = card.data.eval_results
    assert (result.dataset_type, result.dataset_config) == (("custom", None) if local else (dataset, "de-en"))
    assert ("| `dataset_config_name` | de-en |" in card.text) != local


def test_a_card_lists_the_data_the_run_read_and_its_limitation_only_for_that_data():
    """A Multi30k recipe trained on local files: neither the Hub dataset it did not load nor Multi30k's limitation
    appears; trained on Multi30k itself, both do. The Trainer's float warmup_steps shows as an integer."""
    recipe = hub.load_card_recipe(REPO_ROOT / "configs" / "multi30k_small_xl.yaml") | {"warmup_steps": 50.0}
    local = recipe | {"train_file": "data/train.jsonl", "validation_file": "data/valid.jsonl"}
    hub_card, local_card = (hub.render_model_card(hub.config_from_recipe(recipe), values) for values in (recipe, local))
    limitation = "Multi30k holds short image captions"
    assert "| `dataset_name` | bentrevett/multi30k |" in hub_card and limitation in hub_card
    assert "`dataset_name`" not in local_card and "`dataset_config_name`" not in local_card
    assert "| `train_file` | data/train.jsonl |" in local_card and limitation not in local_card
    assert "| `warmup_steps` | 50 |" in local_card and RunRecord.from_recipe(recipe).warmup_steps == 50


def test_a_run_record_names_the_code_that_trained_it(tmp_path, monkeypatch):
    """run_record's source_version: `git describe` of the checkout the package runs from (as the experiments record
    it); run from no checkout, the installed package's version, with the commit pip recorded for an install from a git
    URL; where neither is known, None (no failure)."""
    import importlib.metadata

    from hf_relpos.publish import records

    arguments = parse_arguments([str(REPO_ROOT / "configs" / "demo.yaml"), "--output_dir", str(tmp_path / "run")])
    checkout = source_version(REPO_ROOT)
    assert checkout != "unknown" and run_record(*arguments).source_version == checkout
    monkeypatch.setattr(records, "PACKAGE_CHECKOUT", tmp_path)   # no .git: installed, not a checkout
    assert run_record(*arguments).source_version == importlib.metadata.version("hf_relpos")

    class Installed:
        """An installed hf_relpos 0.1.0 whose direct_url.json (PEP 610) holds `direct_url`."""

        version = "0.1.0"

        def __init__(self, direct_url: dict | None):
            self.direct_url = direct_url

        def read_text(self, name):
            return None if name != "direct_url.json" or self.direct_url is None else json.dumps(self.direct_url)

    commit = "1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b"
    git_install = {"url": "https://github.com/o/hf_relpos", "vcs_info": {"vcs": "git", "commit_id": commit}}
    installs = [  # what pip records: from a git URL, another VCS, a folder, an index (no direct_url.json)
        ("0.1.0+g1a2b3c4", git_install),
        ("0.1.0", {"url": "https://hg.example.org/hf_relpos", "vcs_info": {"vcs": "hg", "commit_id": "a" * 40}}),
        ("0.1.0", {"url": "file:///home/user/hf_relpos", "dir_info": {}}),
        ("0.1.0", None),
    ]
    for expected, direct_url in installs:
        monkeypatch.setattr(importlib.metadata, "distribution", lambda name, url=direct_url: Installed(url))
        assert run_record(*arguments).source_version == expected
    Installed.version = "0.1.0+local"   # one local label only: kept as it is
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: Installed(git_install))
    assert run_record(*arguments).source_version == "0.1.0+local"

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    assert run_record(*arguments).source_version is None


def test_experiment_records_refuse_a_package_imported_from_another_checkout(tmp_path, monkeypatch):
    """The experiments and benchmarks record `checkout_version` of their own checkout: where the environment imports
    hf_relpos from another checkout (an editable install of a second clone), the record would name code that did not
    run, so it is refused with the fix."""
    from hf_relpos.publish import records

    assert records.checkout_version(REPO_ROOT) == source_version(REPO_ROOT)
    monkeypatch.setattr(records, "PACKAGE_CHECKOUT", tmp_path)
    with pytest.raises(SystemExit, match=f"imported from {tmp_path / 'hf_relpos'}, not from .*{REPO_ROOT.name}.*"
                                         f"PYTHONPATH={REPO_ROOT}"):
        records.checkout_version(REPO_ROOT)


@pytest.mark.parametrize(("program_path", "command"), [("/venv/bin/hf-relpos-train", "hf-relpos-train"),
                                                       ("train_translation.py", "python train_translation.py")])
def test_a_run_card_names_the_program_the_run_was_started_by(output_folder, monkeypatch, program_path, command):
    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.setattr(sys, "argv", [program_path, "configs/demo.yaml"])
    arguments = parse_arguments([str(REPO_ROOT / "configs" / "demo.yaml"), "--output_dir", str(output_folder)])
    record = run_record(*arguments)
    assert record.program == Path(program_path).name
    card = hub.render_model_card(tiny_config("shaw"), record)
    assert f"Trained as: `{command} configs/demo.yaml --output_dir '<local>/output'`" in card   # started in REPO_ROOT


@pytest.mark.parametrize(("argv0", "program"), [
    ("../train_translation.py", "../train_translation.py"),
    (str(REPO_ROOT / "hf_relpos" / "translation" / "training.py"), "-m hf_relpos.translation.training"),
])
def test_a_run_card_starts_the_program_as_the_run_started_it(output_folder, monkeypatch, argv0, program):
    """train_translation.py given by a path is started by that path (from the working directory the run record keeps,
    not by its bare name, which is not there); a run of the training module (`python -m`, `accelerate launch -m`) by
    the module, which an installed package has where train_translation.py is not; with one process and under
    `accelerate launch` alike."""
    from accelerate.commands.launch import launch_command_parser

    monkeypatch.setattr(sys, "argv", [argv0, "configs/demo.yaml"])
    record = run_record(*parse_arguments([str(REPO_ROOT / "configs" / "demo.yaml"), "--output_dir", str(output_folder)]))
    shown = hub.shown_command(record.trained_as, record.working_directory)   # configs/demo.yaml, <local>/output
    assert f"Trained as: `python {hub.shown_path(program, record.working_directory)} {shown}`" in hub.render_model_card(
        tiny_config("shaw"), record)
    record.devices, record.hardware = 2, "NVIDIA H100 80GB HBM3"
    card = hub.render_model_card(tiny_config("shaw"), record)
    command = re.search(r"Trained as: `accelerate launch (.*?)`", card).group(1)
    assert command.endswith(f" --num_processes 2 {hub.shown_path(program, record.working_directory)} {shown}")
    launched = launch_command_parser().parse_args(shlex.split(command))
    assert (launched.training_script, bool(launched.module)) == (program.removeprefix("-m "), program.startswith("-m "))


@pytest.mark.parametrize(("program", "devices", "hardware", "sharded", "launch"), [
    ("train_translation.py", 2, "CPU: AMD EPYC", False, "accelerate launch --config_file "
                                                        "configs/accelerate/cpu_2proc.yaml --num_processes 2 "
                                                        "train_translation.py"),
    ("hf-relpos-train", 4, "NVIDIA H100 80GB HBM3", False, "accelerate launch --config_file "
                                                           "configs/accelerate/multi_gpu.yaml --num_processes 4 "
                                                           "--no_python hf-relpos-train"),
    ("train_translation.py", 8, "NVIDIA H100 80GB HBM3", True, "accelerate launch --config_file "
                                                               "configs/accelerate/fsdp.yaml --num_processes 8 "
                                                               "train_translation.py"),
    ("train_translation.py", 1, "CPU: AMD EPYC", False, "python train_translation.py"),
])
def test_a_run_card_starts_as_many_processes_as_the_run_had(program, devices, hardware, sharded, launch):
    """A data-parallel run's command is docs/training.md's `accelerate launch` with its config (FSDP's for a sharded
    run, else the DDP one of its hardware) and process count (`python train_translation.py` would train one process
    at 1/N of the effective batch); its flags follow."""
    flags = "hcfg/tiny.yaml --use_cpu true --max_tokens_per_batch 256"
    record = RunRecord(program=program, devices=devices, hardware=hardware, sharded=sharded, trained_as=flags)
    card = hub.render_model_card(tiny_config("shaw"), record)
    assert f"Trained as: `{launch} {flags}`" in card
    if "--config_file" in launch:
        assert (REPO_ROOT / launch.split()[3]).is_file()


@pytest.mark.parametrize("resume", [["--resume_from_checkpoint", "last"], ["--resume-from-checkpoint=last"]])
def test_a_resumed_runs_card_leaves_the_resume_flag_out_and_labels_the_time_as_its_last_segments(tmp_path, resume):
    """The command in the card trains from the start (resuming in a new folder finds no checkpoint); the card says
    which checkpoint the run resumed from, and that its training time is that last segment's."""
    output_folder = tmp_path / "out"
    arguments = parse_arguments([str(REPO_ROOT / "configs" / "demo.yaml"), "--max_steps", "8", *resume,
                                 "--output_dir", str(output_folder)])
    record = run_record(*arguments, training_seconds=90.0)
    assert record.trained_as == f"{REPO_ROOT / 'configs' / 'demo.yaml'} --max_steps 8 --output_dir {output_folder}"
    record.resumed_from = "checkpoint-5"
    card = hub.render_model_card(tiny_config("shaw"), record)
    assert "--output_dir '<local>/out'`, resumed from `checkpoint-5`" in card
    assert ("Training time: 1.5 minutes (the segment resumed from `checkpoint-5`; the time before it is not "
            "recorded).") in card


STOPPED = ", stopped by early stopping (`early_stopping_patience`)."


@pytest.mark.parametrize(("ended", "sentence"), [
    (dict(max_steps=80, steps=40, early_stopping_patience=1), f"Training ended at step 40 of `max_steps` 80{STOPPED}"),
    (dict(max_steps=80, steps=40), "Training ended at step 40 of `max_steps` 80."),
    (dict(max_steps=80, steps=80, early_stopping_patience=1), None),
    (dict(max_steps=80, early_stopping_patience=1), None),
    (dict(num_train_epochs=20.0, steps=40, epochs=2.5, early_stopping_patience=1),
     f"Training ended at step 40, epoch 2.5 of `num_train_epochs` 20{STOPPED}"),
    (dict(num_train_epochs=20.0, steps=800, epochs=20.0, early_stopping_patience=1), None),
    (dict(num_train_epochs=20.0, steps=40, early_stopping_patience=1), None)])
def test_a_card_says_at_which_step_a_run_that_ended_before_its_steps_or_epochs_ended(ended, sentence):
    """Its Optimisation table names the max_steps (or num_train_epochs, as the Multi30k recipes count) asked for; a
    run that early stopping ended at half of them says so (its record's `steps`, and `epochs` for a run counted in
    epochs), so that the card does not read as all of them trained. A run that reached its end, or a record without
    steps or epochs, adds nothing."""
    card = hub.render_model_card(tiny_config("shaw"), RunRecord(**ended, hardware="CPU: x", devices=1))
    if sentence is None:
        assert "Training ended at step" not in card
    else:
        assert f"Hardware: CPU: x, 1 process(es). {sentence}" in card


def test_the_absolute_cards_equation_has_one_sine_more_than_cosines_at_an_odd_width():
    """At an odd d_model the sines take the (d+1)/2 even dimensions of the paper and the cosines the (d-1)/2 odd ones
    (`positions.sinusoids`, Marian's layout): the card's ranges say so, and an even width keeps the d/2 halves."""
    odd_width = dict(tiny_config("absolute").to_dict(), d_model=15, encoder_attention_heads=3,
                     decoder_attention_heads=3)
    odd = hub.render_model_card(hf_relpos.RelPosTransformerConfig(**odd_width), RunRecord())
    assert "0 \\le i < (d+1)/2" in odd and "PE_{(p,\\,(d+1)/2+i)} = \\cos" in odd and "0 \\le i < (d-1)/2" in odd
    assert "d/2+i" not in odd.replace("(d+1)/2+i", "")
    even = hub.render_model_card(tiny_config("absolute"), RunRecord())
    assert "PE_{(p,\\,d/2+i)} = \\cos" in even and "(d+1)/2" not in even


def test_a_run_evaluated_without_generating_shows_its_losses_and_why_it_has_no_bleu():
    """`predict_with_generate: false` saves eval and test losses and no BLEU: the card shows the losses and says why
    BLEU and chrF are missing, not that the run wrote no scores; the model-index (BLEU and chrF only) stays out."""
    record = RunRecord(max_steps=80, training_seconds=60.0, hardware="CPU: x", devices=1)
    results = {"eval": {"eval_loss": 3.21, "eval_nll_loss": 2.9876, "eval_samples": 6},
               "test": {"test_loss": 3.5, "test_nll_loss": 3.1, "test_samples": 4}}
    card = ModelCard(hub.render_model_card(tiny_config("shaw"), record, results))
    assert "this run wrote no scores" not in card.text
    assert ("Not measured: BLEU and chrF. This run evaluated with `predict_with_generate: false`, so it generated no "
            "translations to score") in card.text
    assert "| unrecorded data validation (6 pairs) | 3.2100 | 2.9876 |" in card.text
    assert "| unrecorded data test (4 pairs) | 3.5000 | 3.1000 |" in card.text
    assert card.data.eval_results is None


def test_a_card_fine_tuned_from_a_hub_model_names_it_as_base_model(output_folder, tmp_path):
    """A run fine-tuned from a Hub model id has it as `base_model` in the card's metadata (the Hub's model tree); a
    run from a local folder (existing, or absolute) or from scratch has none."""
    arguments = parse_arguments([str(REPO_ROOT / "configs" / "demo.yaml"), "--output_dir", str(output_folder)])
    record = dataclasses.replace(run_record(*arguments), working_directory=str(tmp_path))
    (tmp_path / "outputs" / "converted").mkdir(parents=True)
    for start, base_model in [("me/relpos-shaw-en-de", "me/relpos-shaw-en-de"), ("outputs/converted", None),
                              ("/scratch/alice/base", None), (None, None)]:
        card = ModelCard(hub.render_model_card(tiny_config("shaw"), dataclasses.replace(record, model_name_or_path=start)))
        assert card.data.base_model == base_model, start


def test_a_tiny_runs_card_states_no_figure_rounded_to_zero():
    """A model under 50,000 parameters trained in under 3 seconds (a smoke run, a test model): the card gives its
    parameter count exactly and its training time in seconds, not "0.0M" and "0.0 minutes"."""
    model_args, data_args, training_args = parse_arguments([str(REPO_ROOT / "configs" / "demo.yaml")])
    record = run_record(model_args, data_args, training_args, training_seconds=0.54)
    config = hf_relpos.RelPosTransformerConfig(vocab_size=100, d_model=16, encoder_layers=1, decoder_layers=1,
                                               encoder_attention_heads=2, decoder_attention_heads=2,
                                               encoder_ffn_dim=32, decoder_ffn_dim=32)
    text = hub.render_model_card(config, record)
    parameters = hub.meta_model(config).num_parameters()
    assert parameters < 50_000 and f"| parameters | {parameters:,} |" in text and "0.0M" not in text
    assert "Training time: 0.5 seconds." in text and "0.0 minutes" not in text


def test_a_pushed_card_shows_no_absolute_local_path_and_the_run_record_keeps_them(output_folder, fake_hub):
    """A run started in /home/alice/hf_relpos with absolute paths on its command line: its card (pushed to the Hub)
    shows a path under that folder relative to it, as the command runs again from there, and any other absolute path
    as <local>/NAME, in the command, the data table, the opening sentence and the tokenizer line; the folder's
    run_record.json (the local record, not pushed) keeps every path as typed."""
    started_in, data = "/home/alice/hf_relpos", "/home/alice/data/train.jsonl"
    record = RunRecord(
        program=f"{started_in}/train_translation.py", working_directory=started_in, devices=1, hardware="CPU: x",
        trained_as=shlex.join([f"{started_in}/configs/demo.yaml", "--train_file", data, "--validation_file",
                               f"{started_in}/data/valid.jsonl", "--model_name_or_path=/scratch/alice/base",
                               "--run_name", "alice's run", "--output_dir", "/scratch/alice/run 1"]),
        train_file=data, validation_file=f"{started_in}/data/valid.jsonl", model_name_or_path="/scratch/alice/base",
        training_seconds=60.0, resumed_from="/scratch/alice/run 1/checkpoint-100")
    stored = json.dumps(record.to_json())
    (output_folder / RUN_RECORD_FILE).write_text(stored)
    hub.main(["push", str(output_folder), "me/tiny-shaw"])
    card = fake_hub.commits[0]["files"]["README.md"].decode()
    assert ("Trained as: `python train_translation.py configs/demo.yaml --train_file '<local>/train.jsonl' "
            "--validation_file data/valid.jsonl '--model_name_or_path=<local>/base' --run_name 'alice'\"'\"'s run' "
            "--output_dir '<local>/run 1'`, resumed from `<local>/checkpoint-100`") in card
    assert "| `train_file` | <local>/train.jsonl |" in card and "| `validation_file` | data/valid.jsonl |" in card
    assert "| `model_name_or_path` | <local>/base |" in card and "fine-tuned from `<local>/base` on" in card
    assert "Tokenizer: reused from `<local>/base`." in card
    assert "/home/alice" not in card and "/scratch" not in card
    assert (output_folder / RUN_RECORD_FILE).read_text() == stored
    assert RUN_RECORD_FILE not in fake_hub.commits[0]["files"]
    assert (output_folder / "README.md").read_text() == card
    # an older record without its working directory: every absolute path is <local>/NAME
    older = hub.render_model_card(tiny_config("shaw"), dataclasses.replace(record, working_directory=None))
    assert "Trained as: `python '<local>/train_translation.py' '<local>/demo.yaml' --train_file" in older
    assert "/home/alice" not in older and "/scratch" not in older


@pytest.mark.parametrize(("value", "shown"), [
    ("C:\\Users\\alice\\hf_relpos\\configs\\demo.yaml", "configs/demo.yaml"),
    ("c:/users/Alice/hf_relpos/data/train.jsonl", "data/train.jsonl"),   # Windows compares paths in any case
    ("C:\\Users\\alice\\hf_relpos", "."),
    ("C:\\Users\\alice\\hf_relpos\\..\\data\\train.jsonl", "<local>/train.jsonl"),
    ("D:\\Users\\alice\\hf_relpos\\demo.yaml", "<local>/demo.yaml"),
    ("\\\\server\\share\\train.jsonl", "<local>/train.jsonl"),
    ("configs\\demo.yaml", "configs\\demo.yaml"),
])
def test_a_windows_run_shows_its_paths_under_the_folder_it_was_started_in_relative_to_it(value, shown):
    """As on Linux, a path under the working directory of a run started on Windows is shown relative to it (the
    command runs again from there), any other absolute path as <local>/NAME, a relative one as typed."""
    assert hub.shown_path(value, "C:\\Users\\alice\\hf_relpos") == shown
    command = hub.shown_command(shlex.join([value, f"--train_file={value}"]), "C:\\Users\\alice\\hf_relpos")
    assert shlex.split(command) == [shown, f"--train_file={shown}"]   # the command as trained_as records it


@pytest.mark.parametrize("dataset", ["/home/alice/corpora/de-en", "~/corpora/de-en"])
def test_a_local_dataset_folder_by_an_absolute_path_is_no_hub_dataset_and_its_card_names_no_local_folder(dataset):
    """A dataset_name that is an absolute path is a local folder even where the machine writing the card lacks it
    (pushed from another one): no Hub dataset in the metadata, and <local>/NAME in the card's text."""
    recipe = {"dataset_name": dataset, "source_lang": "de", "target_lang": "en"}
    card = ModelCard(hub.render_model_card(tiny_config("shaw"), recipe, {"test": RESULTS["test"]}))
    assert card.data.datasets is None and card.data.eval_results[0].dataset_type == "custom"
    assert "/home/alice" not in str(card) and "~/" not in str(card) and "trained on <local>/de-en" in card.text


@pytest.mark.parametrize("local_files", [True, False], ids=["data-files", "dataset-folder"])
@pytest.mark.parametrize(("started_in", "outside", "join"), [
    ("/home/alice/hf_relpos", "/mnt/offsite", posixpath.join),
    ("C:\\Users\\alice\\hf_relpos", "D:\\offsite", ntpath.join),
], ids=["posix", "windows"])
def test_a_card_shows_no_absolute_path_of_any_path_bearing_field(started_in, outside, join, local_files):
    """Every path-bearing field of a run record absolute, under the folder the run was started in and outside it: the
    card (rendered from `shown_record`, with scores) names none of those folders anywhere (text and metadata), and
    `shown_record` holds no absolute path either; each field still shows, relative to that folder or as
    <local>/NAME."""
    files = {"train_file": join(outside, "train.jsonl"), "validation_file": join(started_in, "data", "valid.jsonl"),
             "test_file": join(outside, "test.jsonl")} if local_files else {}
    record = RunRecord(
        program=join(started_in, "train_translation.py"), working_directory=started_in, devices=1, hardware="CPU: x",
        trained_as=shlex.join([join(started_in, "configs", "demo.yaml"),
                               *(word for name, path in files.items() for word in (f"--{name}", path)),
                               f"--model_name_or_path={join(outside, 'base')}",
                               "--output_dir", join(outside, "run 1")]),
        dataset_name=join(outside, "corpora", "de-en"), **files, model_name_or_path=join(outside, "base"),
        tokenizer_name=join(started_in, "tokenizers", "joint"), resumed_from=join(outside, "run 1", "checkpoint-100"),
        prepared_from={"train": {"folder": join(outside, "prepared", "train"), "key": "k", "reused": False}},
        training_seconds=60.0)
    card = hub.render_model_card(tiny_config("shaw"), record, RESULTS)
    for folder in (started_in, outside, started_in.replace("\\", "/"), outside.replace("\\", "/")):
        assert folder not in card
    assert "alice" not in card and "offsite" not in card
    shown = json.dumps(hub.shown_record(record).to_json())
    assert "alice" not in shown and "offsite" not in shown
    assert "Trained as: `python train_translation.py configs/demo.yaml" in card
    assert "fine-tuned from `<local>/base` on" in card and "Tokenizer: reused from `tokenizers/joint`." in card
    assert "resumed from `<local>/checkpoint-100`" in card and "| `model_name_or_path` | <local>/base |" in card
    if local_files:
        assert "| `train_file` | <local>/train.jsonl |" in card and "| `validation_file` | data/valid.jsonl |" in card
        assert "| valid.jsonl, first 1000 pairs |" not in card and "| valid.jsonl (1000 pairs) |" in card
        assert "| test.jsonl (3003 pairs) |" in card
    else:
        assert "on <local>/de-en. It was built" in card and "| `dataset_name` | <local>/de-en |" in card


@pytest.mark.parametrize(("dataset", "on_hub"), [
    ("corpora/de-en", False),                       # a folder of the run's, relative to where it was started
    ("RUN/corpora/de-en", False),                   # the same folder by its absolute path: shown as corpora/de-en
    ("/mnt/offsite/corpora/de-en", False),          # a folder outside it: shown as <local>/de-en
    ("bentrevett/multi30k", True),                  # a Hub id, no folder of that name where the run started
])
def test_whether_a_cards_dataset_is_on_the_hub_is_decided_from_the_path_the_run_read(tmp_path, monkeypatch, dataset,
                                                                                     on_hub):
    """The card is rendered from `shown_record`, but whether its dataset is a Hub id is decided from the record's
    real path, resolved from the folder the run was started in, not from the folder the card is written in: a local
    dataset folder named relatively or absolutely is no Hub dataset, even where its shown name (corpora/de-en,
    <local>/de-en) could be one."""
    started_in = tmp_path / "run"
    (started_in / "corpora" / "de-en").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)   # the card is written elsewhere: corpora/de-en is not here
    record = RunRecord(dataset_name=dataset.replace("RUN", str(started_in)), working_directory=str(started_in),
                       source_lang="de", target_lang="en", trained_as="configs/x.yaml")
    card = ModelCard(hub.render_model_card(tiny_config("shaw"), record, {"test": RESULTS["test"]}))
    assert card.data.datasets == ([dataset] if on_hub else None)
    assert card.data.eval_results[0].dataset_type == (dataset if on_hub else "custom")
    assert str(tmp_path) not in str(card) and "offsite/" not in str(card)


@pytest.mark.parametrize(("world_size", "use_fsdp", "sharded"), [(2, "true", True), (2, "false", False),
                                                                   (1, "true", False)])
def test_the_run_record_notes_a_sharded_run_from_accelerates_setting(output_folder, monkeypatch, world_size, use_fsdp,
                                                                      sharded):
    """`accelerate launch` with an FSDP config sets ACCELERATE_USE_FSDP in every process: a run of several processes
    records itself as sharded (its card then names fsdp.yaml); one process shards nothing."""
    arguments = parse_arguments([str(REPO_ROOT / "configs" / "demo.yaml"), "--output_dir", str(output_folder)])
    monkeypatch.setattr(type(arguments[2]), "world_size", property(lambda self: world_size))
    monkeypatch.setenv("ACCELERATE_USE_FSDP", use_fsdp)
    record = run_record(*arguments)
    assert record.devices == world_size and record.sharded is sharded


def test_a_run_card_gives_the_vocabulary_the_tokenizer_has(output_folder):
    """A corpus may give fewer BPE pieces than `tokenizer_vocab_size` asks for: the card states the model's size."""
    arguments = parse_arguments([str(REPO_ROOT / "configs" / "demo.yaml"), "--output_dir", str(output_folder)])
    record = run_record(*arguments)
    config = tiny_config("shaw")
    assert record.tokenizer_vocab_size != config.vocab_size
    card = hub.render_model_card(config, record)
    assert (f"BPE vocabulary of {config.vocab_size} pieces ({record.tokenizer_vocab_size} asked for) trained on the "
            "training split") in card
    assert f"| `tokenizer_vocab_size` | {record.tokenizer_vocab_size} |" in card
    assert f"| `tokenizer_character_coverage` | {record.tokenizer_character_coverage} |" in card
    reused = hub.render_model_card(config, dataclasses.replace(record, tokenizer_name="outputs/earlier"))
    assert "Tokenizer: reused from `outputs/earlier`." in reused and "`tokenizer_vocab_size`" not in reused
    assert "`tokenizer_character_coverage`" not in reused
    recipe = hub.load_card_recipe(REPO_ROOT / "configs" / "demo.yaml")
    recipe_card = hub.render_model_card(hub.config_from_recipe(recipe), recipe)
    assert f"BPE vocabulary of {recipe['tokenizer_vocab_size']} pieces trained on the training split" in recipe_card


def test_a_fine_tuned_runs_card_says_what_it_started_from(output_folder):
    """A run from model_name_or_path on new data: the card's opening sentence names the model it was fine-tuned from,
    not only the data this run trained on."""
    arguments = parse_arguments([str(REPO_ROOT / "configs" / "demo.yaml"), "--output_dir", str(output_folder)])
    record = dataclasses.replace(run_record(*arguments), model_name_or_path="outputs/demo",
                                 train_file="data/medical/train")
    card = hub.render_model_card(tiny_config("shaw"), record)
    assert ", fine-tuned from `outputs/demo` on local parallel files. It was built with hf_relpos" in card
    scratch = hub.render_model_card(tiny_config("shaw"), dataclasses.replace(record, model_name_or_path=None))
    assert ", trained on local parallel files. It was built" in scratch and "fine-tuned" not in scratch


def test_a_fractional_warm_up_reads_as_a_fraction_of_the_training_steps(output_folder):
    """transformers 5 reads warmup_steps below 1 as a fraction of the training steps; the card's optimisation table
    said `warmup_steps | 0.5`, half a step."""
    arguments = parse_arguments([str(REPO_ROOT / "configs" / "demo.yaml"), "--output_dir", str(output_folder)])
    record = run_record(*arguments)
    card = hub.render_model_card(tiny_config("shaw"), dataclasses.replace(record, warmup_steps=0.1))
    assert "| `warmup_steps` | 0.1 (of the training steps) |" in card
    card = hub.render_model_card(tiny_config("shaw"), dataclasses.replace(record, warmup_steps=100))
    assert "| `warmup_steps` | 100 |" in card


def test_a_recipe_file_outside_configs_is_carded_as_that_file_and_a_link_into_configs_as_its_target(tmp_path,
                                                                                                   monkeypatch):
    """A copy of a configs/ recipe elsewhere (the user's own, perhaps edited) is not the repository's recipe: its card
    names the file and the command that trains it, and takes no runs from the records (they are of configs/ recipes,
    matched by name); a link into configs/ is carded as the recipe it points to."""
    monkeypatch.chdir(REPO_ROOT)
    copy = tmp_path / "recipes" / "multi30k_small_shaw.yaml"
    copy.parent.mkdir()
    copy.write_text((REPO_ROOT / "configs" / "multi30k_small_shaw.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    link = tmp_path / "links" / "mine.yaml"
    link.parent.mkdir()
    link.symlink_to(REPO_ROOT / "configs" / "multi30k_small_shaw.yaml")
    hub.render_recipe_cards([copy, link], tmp_path / "cards", RECIPE_RECORDS)
    card = (tmp_path / "cards" / "multi30k_small_shaw.md").read_text(encoding="utf-8")
    assert "Command: `hf-relpos-train multi30k_small_shaw.yaml`" in card
    assert "hf_relpos repository): `python train_translation.py" not in card and "Never trained" not in card
    assert "Not measured: no run of this recipe file is recorded in the hf_relpos repository" in card
    assert "model-index" not in card and "BLEU" not in card.partition("## Results")[2].partition("## ")[0]
    assert (tmp_path / "cards" / "mine.md").read_text(encoding="utf-8") == \
        (REPO_ROOT / "model_cards" / "multi30k_small_shaw.md").read_text(encoding="utf-8")


def test_recipe_cards_in_model_cards_are_current(tmp_path, monkeypatch):
    """model_cards/ holds `python -m hf_relpos.publish.hub render-cards configs/ --out model_cards/ --records RECORDS...` as
    it renders today."""
    monkeypatch.chdir(REPO_ROOT)  # the cards cite the records by their paths in the repository
    rendered = hub.render_recipe_cards(["configs"], tmp_path, RECIPE_RECORDS)
    names = {path.name for path in rendered}
    assert {"wmt14_en_de_base_shaw.md", "wmt14_en_de_big_shaw.md", "multi30k_small_directional.md"} <= names
    for path in rendered:
        committed = REPO_ROOT / "model_cards" / path.name
        assert committed.is_file() and committed.read_text() == path.read_text(), f"re-render {committed}"
    big = ModelCard((tmp_path / "wmt14_en_de_big_shaw.md").read_text())
    assert "| `max_relative_position` (k) | 8 |" in big.text
    assert "| dropout / attention / activation dropout | 0.3 / 0.0 / 0.0 |" in big.text
    assert "| token embeddings at initialisation | N(0, d_model^-0.5) |" in big.text
    small = ModelCard((tmp_path / "multi30k_small_shaw.md").read_text())
    assert "| token embeddings at initialisation | N(0, 0.02) |" in small.text


def record_runs(record: str, recipe: str) -> dict[str, list[RunRecord]]:
    """The runs that trained a recipe in a committed record, by system."""
    systems: dict[str, list[RunRecord]] = {}
    for trained in read_run_records(REPO_ROOT / record):
        if trained.role == RECIPE and trained.recipe == recipe:
            systems.setdefault(trained.system, []).append(trained)
    return systems


@pytest.mark.parametrize("scheme", ["absolute", "shaw", "xl", "directional", "rope"])
def test_measured_recipe_cards_give_the_records_scores_batch_hardware_and_time(scheme, monkeypatch):
    """A multi30k_small card's results come from the committed records, each table citing its record: mean (min-max)
    test BLEU and chrF over the record's seeds, the BLEU signature, the batch per update, the code version, the device
    and the training minutes per run; and it says that no checkpoint is published."""
    monkeypatch.chdir(REPO_ROOT)
    name = f"multi30k_small_{scheme}"
    recipe = hub.load_card_recipe(REPO_ROOT / "configs" / f"{name}.yaml")
    record = hub.RunRecord.from_recipe(recipe)
    record.measurements = [measurement for path in RECIPE_RECORDS
                           for measurement in hub.measurements_from_record(path, name, record)]
    text = ModelCard(hub.render_model_card(hub.config_from_recipe(recipe), record, recipe_name=name)).text
    convergence = record_runs(RECIPE_RECORDS[0], name)[scheme]
    bleu = [run.scores["averaged"]["test"].bleu for run in convergence]
    chrf = [run.scores["averaged"]["test"].chrf for run in convergence]
    minutes = [run.training_seconds / 60 for run in convergence]
    assert (f"| Multi30k test2016 (Flickr), average of the last 5 checkpoints, seeds 1, 2 | {sum(bleu) / 2:.2f} "
            f"({min(bleu):.2f}-{max(bleu):.2f}) | {sum(chrf) / 2:.2f} ({min(chrf):.2f}-{max(chrf):.2f}) | "
            "`nrefs:1\\|case:mixed\\|eff:no\\|tok:13a\\|smooth:exp\\|version:2.6.0` |") in text
    convergence_record = json.loads((REPO_ROOT / RECIPE_RECORDS[0]).read_text())
    assert f"(record: `{RECIPE_RECORDS[0]}`, {convergence_record['date'][:10]})" in text
    assert (f"effective batch {recipe['max_tokens_per_batch']} tokens (padded, on the source and on the target side "
            f"each) per update ({recipe['max_tokens_per_batch']} per device and step x 1 device(s) x 1 accumulation "
            "step(s)); hardware: NVIDIA H100 80GB HBM3") in text
    assert f"training time {sum(minutes) / 2:.1f} ({min(minutes):.1f}-{max(minutes):.1f}) minutes per run" in text
    equal_budget_record = json.loads((REPO_ROOT / RECIPE_RECORDS[1]).read_text())
    systems = record_runs(RECIPE_RECORDS[1], name)   # xl: the recipe then (attention dropout 0) and now (0.1)
    assert len(systems) == (2 if scheme == "xl" else 1)
    for equal_budget in systems.values():
        test_bleu = [run.scores[TRAINED_WEIGHTS]["test"].bleu for run in equal_budget]
        seeds = ("seeds " if len(equal_budget) > 1 else "seed ") + ", ".join(str(run.seed) for run in equal_budget)
        assert f"| Multi30k test2016 (Flickr), {seeds} | {statistics.mean(test_bleu):.2f}" in text
        (code,) = {run.source_version for run in equal_budget}  # every run from one commit
        (trained_as,) = {run.trained_as for run in equal_budget}
        assert trained_as.startswith(f"{name}.yaml --max_tokens_per_batch 1280")
        assert f"{trained_as}` from code `{code}` (the recipe as it was then)" in text
    assert f"(record: `{RECIPE_RECORDS[1]}`, {equal_budget_record['date'][:10]})" in text
    assert "effective batch 1280 tokens" in text and f"hardware: {equal_budget_record['device']}" in text
    (seed_3,) = record_runs(RECIPE_RECORDS[3], name)[scheme]   # the third 20-epoch seed, later, on an H200
    assert (f"One seed:\n\n| test set | BLEU | chrF | BLEU signature |\n| --- | --- | --- | --- |\n"
            f"| Multi30k test2016 (Flickr), average of the last 5 checkpoints, seed 3 | "
            f"{seed_3.scores['averaged']['test'].bleu:.2f} |") in text
    assert f"`{name}.yaml` from code `{seed_3.source_version}` (the recipe as it was then)" in text
    assert f"(record: `{RECIPE_RECORDS[3]}`, " in text and "hardware: NVIDIA H200" in text
    assert "No published checkpoint" in text and "Never trained" not in text


def test_a_recipe_card_says_no_run_is_committed_only_where_no_committed_record_holds_one():
    """model_cards/multi30k_small_alibi.md and _t5.md said "Never trained in the hf_relpos repository: no record there
    (docs/results) holds a run of this recipe" while docs/results/vs_marian/alibi_t5_equal_budget/vs_marian.json holds
    three seeds of each (the README cites it): its runs were not among the records the cards were rendered from. A
    committed card that says no run of its recipe is committed is checked against every committed experiment record:
    none holds a run of the recipe (with the recipe's position scheme)."""
    runs = []
    for path in sorted((REPO_ROOT / "docs" / "results").rglob("*.json")):
        result = json.loads(path.read_text(encoding="utf-8"))
        # an experiment's record, as render-cards --records takes one: its runs, and its report beside it
        if isinstance(result, dict) and {"records", "runs"} & result.keys() and path.with_suffix(".md").is_file():
            runs += [(path.relative_to(REPO_ROOT).as_posix(), run) for run in hub.read_experiment_record(path)[0]]
    assert len({path for path, _ in runs}) > 60
    unmeasured = []
    for card in sorted((REPO_ROOT / "model_cards").glob("*.md")):
        text = card.read_text(encoding="utf-8")
        if "no record there (docs/results) holds a run of this recipe" in text or "no run of it is committed" in text:
            unmeasured.append(card.stem)
            scheme = hub.config_from_recipe(hub.load_card_recipe(REPO_ROOT / "configs" / f"{card.stem}.yaml")).position_scheme
            held = sorted({path for path, run in runs if run.role == RECIPE and run.recipe == card.stem
                           and run.model.get("position_scheme", scheme) == scheme})
            assert not held, f"{card.name} says no run of its recipe is committed; {held} hold runs of it"
    assert "wmt14_en_de_big_shaw" in unmeasured and "demo" in unmeasured


def test_the_effective_batch_multiplies_the_devices_and_the_accumulation_steps():
    assert hub._batch_sentence(1280, None, 2, 4) == (
        "10240 tokens (padded, on the source and on the target side each) per update (1280 per device and step x 4 "
        "device(s) x 2 accumulation step(s))")
    assert hub._batch_sentence(None, 32, 3, None) == (
        "96 sentence pairs per update and device (32 per step x 3 accumulation step(s)), times the number of devices")


def test_a_measurement_shows_every_seeds_test_and_validation_scores_and_the_runs_own_batch(tmp_path):
    """A recipe's runs in a record: one row per evaluation set (test, then validation) with each seed's scores, and
    the update size of the runs as they recorded it (pairs per device here), the recipe's only where a run has none."""
    recipe = hub.load_card_recipe(REPO_ROOT / "configs" / "multi30k_small_absolute.yaml")
    record = dataclasses.replace(RunRecord.from_recipe(recipe), per_device_train_batch_size=32)
    common = dict(role=RECIPE, recipe="multi30k_small_absolute", system="absolute", trained_as="absolute recipe",
                  steps=100, hardware="CPU", devices=2, training_seconds=60.0, date="2026-11-20T10:00:00+00:00",
                  per_device_train_batch_size=24, max_tokens_per_batch=None)
    runs = [RunRecord(seed=seed, scores={TRAINED_WEIGHTS: {"test": Scores(30.0 + seed, 60.0 + seed, "sig"),
                                                           "validation": Scores(40.0 + seed, 70.0 + seed, "sig")}},
                      **common) for seed in (1, 2)]
    path = tmp_path / "vs_marian.json"
    path.write_text(json.dumps({"records": [run.to_json() for run in runs]}))
    path.with_suffix(".md").write_text("# Recipes\n\nTwo seeds.\n")
    (measurement,) = hub.measurements_from_record(path, "multi30k_small_absolute", record)
    assert [(row.bleu, row.chrf) for row in measurement.scores] == [((31.0, 32.0), (61.0, 62.0)),
                                                                     ((41.0, 42.0), (71.0, 72.0))]
    assert [row.evaluation_set for row in measurement.scores] == [hub._split_title(record, "test"),
                                                                   hub._split_title(record, "validation")]
    assert measurement.batch.startswith("48 sentence pairs per update (24 per device and step x 2 device(s)")
    unrecorded = [dataclasses.replace(run, per_device_train_batch_size=None) for run in runs]
    path.write_text(json.dumps({"records": [run.to_json() for run in unrecorded]}))
    (measurement,) = hub.measurements_from_record(path, "multi30k_small_absolute", record)
    assert measurement.batch.startswith("64 sentence pairs per update (32 per device and step x 2 device(s)")


def test_a_measurement_of_runs_that_scored_a_slice_names_the_slice(tmp_path):
    """Runs with the WMT14 recipes' max_eval_samples: 1000 scored the first 1000 pairs of newstest2013: a recipe
    card's measurement row says so, never 'WMT14 newstest2013' alone; an uncapped split keeps its plain name."""
    recipe = hub.load_card_recipe(REPO_ROOT / "configs" / "wmt14_en_de_base_shaw.yaml")
    record = RunRecord.from_recipe(recipe)
    common = dict(role=RECIPE, recipe="wmt14_en_de_base_shaw", system="shaw", trained_as="shaw recipe", steps=100,
                  hardware="GPU", devices=8, training_seconds=60.0, date="2026-11-20T10:00:00+00:00",
                  max_eval_samples=1000, average_checkpoints=5)
    scores = {"averaged": {"test": Scores(27.0, 57.0, "sig"), "validation": Scores(26.0, 56.0, "sig")}}
    path = tmp_path / "wmt.json"
    path.write_text(json.dumps({"records": [RunRecord(seed=1, scores=scores, **common).to_json()]}))
    path.with_suffix(".md").write_text("# WMT14\n\nOne seed.\n")
    (measurement,) = hub.measurements_from_record(path, "wmt14_en_de_base_shaw", record)
    assert [row.evaluation_set for row in measurement.scores] == [
        "WMT14 newstest2014, average of the last 5 checkpoints",
        "WMT14 newstest2013, first 1000 pairs, average of the last 5 checkpoints"]


def test_a_peer_trained_from_a_recipes_settings_is_not_in_that_recipes_card(monkeypatch):
    """The convergence record's `peer+recipe-training` (HF MarianMT trained with multi30k_small_absolute.yaml's
    settings) is a peer (`RunRecord.role`), so the absolute card shows absolute's runs only."""
    monkeypatch.chdir(REPO_ROOT)
    runs = read_run_records(REPO_ROOT / RECIPE_RECORDS[0])
    (peer_as_recipe,) = {run.system for run in runs if run.role == PEER and run.recipe is None
                         and "recipe" in run.system}
    record = hub.RunRecord.from_recipe(hub.load_card_recipe(REPO_ROOT / "configs" / "multi30k_small_absolute.yaml"))
    (measurement,) = hub.measurements_from_record(RECIPE_RECORDS[0], "multi30k_small_absolute", record)
    absolute = [run for run in runs if run.system == "absolute"]
    assert measurement.trained_as == "multi30k_small_absolute.yaml"
    assert measurement.scores[0].bleu == tuple(run.scores["averaged"]["test"].bleu for run in absolute)
    peer_bleu = statistics.mean(run.scores["averaged"]["test"].bleu for run in runs if run.system == peer_as_recipe)
    card = (REPO_ROOT / "model_cards" / "multi30k_small_absolute.md").read_text()
    assert f"| {peer_bleu:.2f} (" not in card and f"{statistics.mean(measurement.scores[0].bleu):.2f} (" in card


def test_a_recipe_card_shows_the_recipe_runs_of_a_record_and_never_a_peer_trained_from_the_same_recipe(tmp_path):
    """One result holding the absolute recipe's run and HF MarianMT peers, one of them trained from absolute's recipe
    file and settings (its `recipe` names it): the absolute card's results are the recipe run's, because the role
    is the record's field (`RunRecord.role`), whatever else the runs share."""
    recipe = hub.load_card_recipe(REPO_ROOT / "configs" / "multi30k_small_absolute.yaml")
    common = dict(steps=1500, hardware="CPU", devices=1, training_seconds=600.0, date="2026-11-20T10:00:00+00:00",
                  max_tokens_per_batch=1280, seed=1)
    runs = [
        RunRecord(role=RECIPE, recipe="multi30k_small_absolute", system="absolute", trained_as="absolute recipe",
                  scores={TRAINED_WEIGHTS: {"test": Scores(31.25, 60.5, "sig"), "validation": Scores(32.0, 61.0, "sig")}},
                  **common),
        RunRecord(role=PEER, recipe="multi30k_small_absolute", system="peer+recipe-training",
                  trained_as="MarianMT trained as the absolute recipe",
                  scores={TRAINED_WEIGHTS: {"test": Scores(36.75, 64.5, "sig"), "validation": Scores(37.0, 65.0, "sig")}},
                  **common),
        RunRecord(role=PEER, system="peer", trained_as="MarianMT",
                  scores={TRAINED_WEIGHTS: {"test": Scores(35.5, 63.0, "sig"), "validation": Scores(36.0, 64.0, "sig")}},
                  **common),
        RunRecord(role=RECIPE, recipe="multi30k_small_absolute", system="rope-matched", model={"position_scheme": "rope"},
                  trained_as="absolute recipe --model.position_scheme rope",
                  scores={TRAINED_WEIGHTS: {"test": Scores(33.5, 62.0, "sig"), "validation": Scores(34.0, 62.5, "sig")}},
                  **common),
    ]
    path = tmp_path / "vs_marian.json"
    path.write_text(json.dumps({"records": [run.to_json() for run in runs]}))
    path.with_suffix(".md").write_text("# Peers and recipes\n\nOne seed each.\n")
    record = RunRecord.from_recipe(recipe)
    record.measurements = hub.measurements_from_record(path, "multi30k_small_absolute", record)
    assert [measurement.trained_as for measurement in record.measurements] == ["absolute recipe"]
    card = hub.render_model_card(hub.config_from_recipe(recipe), record, recipe_name="multi30k_small_absolute")
    assert "| Multi30k test2016 (Flickr), seed 1 | 31.25 | 60.50 | `sig` |" in card
    assert "36.75" not in card and "35.50" not in card and "MarianMT trained" not in card and "33.50" not in card
    # a run of absolute's recipe file with another scheme is not absolute's, in results written before runs
    # carried records too (the scheme read from the run's --model.position_scheme)
    legacy = {run.system: run for run in read_run_records(REPO_ROOT / "docs" / "results" / "vs_marian" /
                                                          "eight_schemes_three_seeds" / "vs_marian.json")}
    assert (legacy["rope-matched"].recipe, legacy["rope-matched"].model) == ("multi30k_small_absolute",
                                                                             {"position_scheme": "rope"})
    assert legacy["marian-matched"].model == {}


def test_every_committed_experiment_result_loads_as_typed_run_records():
    """The results under docs/results written before results carried records load through the legacy readers: one
    `RunRecord` per run and seed, which round-trips through JSON, with the run's own scores."""
    results = REPO_ROOT / "docs" / "results"
    paths = [path for pattern in ("vs_marian/*/vs_marian.json", "convergence/*/convergence.json",
                                  "length_generalization*/**/length_generalization.json",
                                  "length_generalization*/**/saved_models.json") for path in sorted(results.glob(pattern))]
    assert len(paths) > 60
    for path in paths:
        result = json.loads(path.read_text())
        runs = read_run_records(path)
        if isinstance(result["runs"], dict):   # vs_marian.py and convergence.py: runs by system, a run per seed
            expected = [(system, run["seed"], run["scores"]) for system, by_seed in result["runs"].items()
                        for run in by_seed]
            assert [(run.system, run.seed) for run in runs] == [(system, seed) for system, seed, _ in expected]
            for run, (_, _, scores) in zip(runs, expected, strict=True):
                test = scores["test"] if "test" in scores else scores["averaged"]["test"]
                weights = TRAINED_WEIGHTS if "test" in scores else "averaged"
                assert run.scores[weights]["test"] == Scores.of(test), path
        else:   # length_generalization.py: a run per spec, its seeds in it, or a saved model scored
            per_model = [(run["name"], seed, by_bucket) for run in result["runs"] for seed, by_bucket in (
                [(None, run["result"])] if "result" in run else zip(result["settings"]["seeds"], run["per_seed"],
                                                                    strict=True))]
            assert [(run.system, run.seed) for run in runs] == [(name, seed) for name, seed, _ in per_model]
            for run, (_, _, by_bucket) in zip(runs, per_model, strict=True):
                assert {bucket: metrics["accuracy"] for bucket, metrics in run.metrics.items()} == {
                    bucket: values["accuracy"] for bucket, values in by_bucket.items()}
        for run in runs:
            assert RunRecord.from_json(json.loads(json.dumps(run.to_json()))) == run


def test_a_legacy_run_reads_a_bare_switch_as_true_and_the_flag_after_it_with_its_value():
    """In a run recorded by its command line, `--bf16` followed by another flag (or last) is a switch, not the
    value of the flag before it."""
    from hf_relpos.publish.records import legacy_run_record

    def run(*flags: str) -> RunRecord:
        return legacy_run_record("absolute", {"argv": ["configs/multi30k_small_absolute.yaml", *flags], "seed": 1,
                                              "scores": {"test": {"bleu": 30.0, "chrf": 55.0, "bleu_signature": "s"}},
                                              "train_seconds": 1.0}, {"device": "cpu", "date": "today"})

    switched = run("--bf16", "--seed", "3", "--fp16")
    assert (switched.bf16, switched.seed, switched.fp16) == (True, 1, True)   # the run's own seed wins
    valued = run("--bf16", "false", "--warmup_steps", "400")
    assert (valued.bf16, valued.warmup_steps) == (False, 400)
    assert run("--bf16", "True", "--fp16", "False").bf16 is True   # transformers' flags take Python's spelling too


def test_a_run_record_round_trips_through_json_and_refuses_an_unknown_role():
    record = RunRecord(role=PEER, system="peer", seed=3, steps=10, training_seconds=61.0,
                       scores={"averaged": {"test": Scores(30.5, 55.25, "nrefs:1")}})
    assert RunRecord.from_json(json.loads(json.dumps(record.to_json()))) == record
    with pytest.raises(ValueError, match="role must be one of"):
        RunRecord(role="baseline")


def test_a_runs_scores_keep_their_length_ratio():
    """train_translation.py's metrics become the record's scores of the trained weights, hypothesis/reference length
    ratio included (a split without BLEU has no scores)."""
    from hf_relpos.publish.records import TRAINED_WEIGHTS, scores_from_results

    results = {"eval": {"eval_loss": 2.0},
               "test": {"test_bleu": 30.5, "test_chrf": 55.25, "test_bleu_signature": "nrefs:1", "test_length_ratio": 0.97}}
    assert scores_from_results(results) == {TRAINED_WEIGHTS: {"test": Scores(30.5, 55.25, "nrefs:1", 0.97)}}


def test_unmeasured_recipe_cards_say_they_were_never_trained(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    for name in ("wmt14_en_de_base_shaw", "wmt14_en_de_big_shaw"):
        recipe = hub.load_card_recipe(REPO_ROOT / "configs" / f"{name}.yaml")
        record = hub.RunRecord.from_recipe(recipe)
        record.measurements = [measurement for path in RECIPE_RECORDS
                               for measurement in hub.measurements_from_record(path, name, record)]
        assert record.measurements == []
        text = hub.render_model_card(hub.config_from_recipe(recipe), record, recipe_name=name)
        assert "Never trained in the hf_relpos repository: no record there (docs/results) holds a run" in text
        assert "No published checkpoint: hf_relpos publishes no trained weights of this recipe" in text
        assert (f"Effective batch: {recipe['max_tokens_per_batch']} tokens (padded, on the source and on the target "
                f"side each) per update and device ({recipe['max_tokens_per_batch']} per step x "
                f"{recipe['gradient_accumulation_steps']} accumulation step(s)), times the number of devices.") in text


def test_the_record_fields_are_train_translation_arguments():
    """The card lists a record field under its name as a train_translation.py argument: every recipe field of
    `RunRecord` is one (a renamed argument fails here, not silently on every card), and `run_record` fills them all
    from parsed arguments, with the run's devices and hardware."""
    from hf_relpos.translation.arguments import _argument_fields
    from hf_relpos.translation.run_outputs import run_record

    assert set(hub.RunRecord.recipe_fields()) <= set(_argument_fields())
    model_args, data_args, training_args = parse_arguments([str(REPO_ROOT / "configs" / "demo.yaml"),
                                                            "--gradient_accumulation_steps", "3"])
    record = run_record(model_args, data_args, training_args, training_seconds=90.0)
    assert record.model == model_args.model_config and record.dataset_name == "demo"
    assert (record.max_tokens_per_batch, record.gradient_accumulation_steps, record.devices) == (512, 3, 1)
    assert record.hardware.startswith("CPU: ")
    text = hub.render_model_card(hf_relpos.RelPosTransformerConfig(**model_args.model_config), record)
    assert ("Effective batch: 1536 tokens (padded, on the source and on the target side each) per update (512 per "
            "device and step x 1 device(s) x 3 accumulation step(s)).") in text
    assert f"Hardware: {record.hardware}, 1 process(es). Training time: 1.5 minutes." in text
    assert "No published checkpoint: these weights were not pushed to the Hugging Face Hub" in text


# --------------------------------------------------------------------------------------------------- pushing

@pytest.mark.parametrize(("argv", "message"), [
    (["push", "outputs/nonesuch", "me/x"], "push: error: outputs/nonesuch has no config.json: save the model there"),
    (["push", "{folder}", "me/x", "--recipe", "missing.yaml"], "push: error: [Errno 2] No such file or directory"),
])
def test_the_command_line_gives_one_error_line(output_folder, fake_hub, tmp_path, monkeypatch, capsys, argv,
                                               message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        hub.main([argument.format(folder=output_folder) for argument in argv])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err and fake_hub.commits == []


@pytest.mark.parametrize(("content", "kind"), [("just a note", "str"), ("[]", "list"), ("false", "bool"), ("0", "int")])
def test_a_recipe_that_is_not_a_mapping_is_one_error_line_and_leaves_no_out_folder(tmp_path, monkeypatch, capsys,
                                                                                   content, kind):
    """A YAML file holding a list or a bare value (a file given by mistake) crashed render-cards with a traceback
    (AttributeError: 'str' object has no attribute 'get'), after it had created the --out folder; an empty list,
    false or 0 rendered a card of an empty recipe. Only an empty file is an empty recipe, as for train_translation.py
    (one rule: `load_recipe`)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.yaml").write_text(content + "\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exited:
        hub.main(["render-cards", str(REPO_ROOT / "configs" / "demo.yaml"), "notes.yaml", "--out", "cards"])
    assert exited.value.code == 2
    message = f"notes.yaml: a recipe's top level must be a mapping of field: value, got {kind}"
    assert capsys.readouterr().err == f"python -m hf_relpos.publish.hub render-cards: error: {message}\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.yaml"]
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        parse_arguments(["notes.yaml"])


def test_a_recipe_that_is_not_yaml_is_one_error_line_and_leaves_no_out_folder(tmp_path, monkeypatch, capsys):
    """A malformed YAML file crashed render-cards with a yaml.parser traceback; it is the one line naming the file
    that train_translation.py gives (one rule: `load_recipe`)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.yaml").write_text("a: [\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exited:
        hub.main(["render-cards", "notes.yaml", "--out", "cards"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("python -m hf_relpos.publish.hub render-cards: error: notes.yaml: invalid YAML: ")
    assert error.count("\n") == 1 and sorted(path.name for path in tmp_path.iterdir()) == ["notes.yaml"]
    with pytest.raises(ConfigError, match=r"^notes.yaml: invalid YAML: "):
        parse_arguments(["notes.yaml"])


@pytest.mark.parametrize(("files", "given", "message"), [
    ({"notes.md": "# notes\n"}, "notes.md",
     "records 'notes.md': an experiment record is the .json file that experiments/ writes (with its .md report beside "
     "it)"),
    ({}, "missing.json", "records 'missing.json': no file 'missing.json'"),
    ({"run.json": '{"runs": {}}\n'}, "run.json",
     "records 'run.json': no file 'run.md' (the record's report, whose title and setup the card cites)"),
    ({"run.json": "{runs\n", "run.md": "# Title\n\nSetup.\n"}, "run.json",
     "records 'run.json': not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
    ({"run.json": '{"meta": {}, "training": []}\n', "run.md": "# Title\n\nSetup.\n"}, "run.json",
     "records 'run.json': not an experiment record (a JSON object with 'records' or 'runs', as experiments/ writes)"),
], ids=["report_given", "missing", "no_report", "not_json", "benchmark_json"])
def test_a_record_that_cannot_be_read_is_one_error_line_and_leaves_no_out_folder(tmp_path, monkeypatch, capsys, files,
                                                                                 given, message):
    """render-cards --records takes an experiment's .json with its .md report beside it: the report given instead
    was a bare JSON error naming no file, and a record without its report an error naming only the .md (after the
    --out folder was made)."""
    monkeypatch.chdir(tmp_path)
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    with pytest.raises(SystemExit) as exited:
        hub.main(["render-cards", str(REPO_ROOT / "configs" / "demo.yaml"), "--out", "cards", "--records", given])
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"python -m hf_relpos.publish.hub render-cards: error: {message}\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(files)


@pytest.mark.parametrize(("out", "blocker", "whose"), [
    ("cards.md", "cards.md", "a file, not a folder"),
    ("cards", "cards", "a link to 'missing', which does not exist; create that folder or remove the link"),
    ("notes", "notes", "a file, not a folder"),
    ("cards.md/sub", "cards.md", "a file, not a folder"),
    ("cards/sub", "cards", "a link to 'missing', which does not exist; create that folder or remove the link"),
], ids=["file", "dangling_link", "link_to_a_file", "under_a_file", "under_a_dangling_link"])
def test_an_out_that_is_not_a_folder_is_one_error_line_naming_it(tmp_path, monkeypatch, capsys, out, blocker, whose):
    """Was `[Errno 17] File exists: 'cards'` or `[Errno 20] Not a directory`, naming no setting; a link to a file was
    said to lead nowhere."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cards.md").write_text("kept\n", encoding="utf-8")
    (tmp_path / "cards").symlink_to("missing")
    (tmp_path / "notes").symlink_to("cards.md")
    with pytest.raises(SystemExit) as exited:
        hub.main(["render-cards", str(REPO_ROOT / "configs" / "demo.yaml"), "--out", out])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (f"python -m hf_relpos.publish.hub render-cards: error: out "
                                       f"'{tmp_path / out}': '{tmp_path / blocker}' is {whose}\n")
    assert (tmp_path / "cards.md").read_text(encoding="utf-8") == "kept\n" and (tmp_path / "cards").is_symlink()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["cards", "cards.md", "notes"]


def test_push_model_folder_uploads_model_code_tokenizer_and_card(output_folder, fake_hub):
    before = folder_snapshot(output_folder)
    url = hub.push_model_folder(output_folder, "me/tiny-shaw", private=True)

    assert url == "https://huggingface.co/me/tiny-shaw/commit/0123"
    assert fake_hub.repos == [{"repo_id": "me/tiny-shaw", "private": True, "exist_ok": False}]
    (commit,) = fake_hub.commits
    files = commit["files"]
    assert set(files) == MODEL_FILES | {"README.md", "pipeline_relpos.py"}
    assert files["model.safetensors"] == before["model.safetensors"]
    assert files["tokenizer.json"] == before["tokenizer.json"]
    config = json.loads(files["config.json"])
    assert config["auto_map"] == {
        "AutoConfig": "configuration_relpos.RelPosTransformerConfig",
        "AutoModel": "modeling_relpos.RelPosTransformerModel",
        "AutoModelForSeq2SeqLM": "modeling_relpos.RelPosTransformerForConditionalGeneration",
    }
    assert config["custom_pipelines"]["translation"]["impl"] == "pipeline_relpos.TranslationPipeline"

    card = ModelCard(files["README.md"].decode())
    written = json.loads(before["test_results.json"])
    test_bleu = next(r for r in card.data.eval_results if r.dataset_split == "test" and r.metric_type == "sacrebleu")
    assert test_bleu.metric_value == round(written["test_bleu"], 2) == 100.0
    assert test_bleu.metric_args == {"signature": written["test_bleu_signature"]}
    assert card.data.model_name == "tiny-shaw" and "shaw" in card.data.tags

    after = folder_snapshot(output_folder)  # the folder now matches the repository
    assert {name: after[name] for name in ("README.md", "pipeline_relpos.py", "config.json")} == {
        name: files[name] for name in ("README.md", "pipeline_relpos.py", "config.json")}
    assert {name: data for name, data in after.items() if name not in files} == {
        name: data for name, data in before.items() if name not in files}


@pytest.mark.parametrize("repo_id", ["me/tiny-shaw", "tiny-shaw"])
def test_a_dry_run_lists_what_the_push_would_upload_and_sends_and_changes_nothing(output_folder, fake_hub, monkeypatch,
                                                                                   tmp_path, capsys, repo_id):
    """`push --dry_run` makes no Hub call and leaves the folder byte-for-byte as it was; it prints the repository id as
    given (without a namespace: that the Hub's account namespace is not resolved, and what the card names instead)
    and each file the push uploads with its size, the generated card, config.json and pipeline_relpos.py included;
    `--card_out` writes that card, the push's own (the same files, the same card), elsewhere."""
    hub_calls = {name: getattr(HfApi, name) for name in ("create_repo", "create_commit", "whoami", "repo_info")}
    for name in hub_calls:
        monkeypatch.setattr(HfApi, name, lambda *args, **kwargs: pytest.fail("a dry run called the Hub"))
    before = folder_snapshot(output_folder)
    hub.main(["push", str(output_folder), repo_id, "--dry_run", "--card_out", str(tmp_path / "cards" / "card.md")])
    printed = capsys.readouterr().out
    assert folder_snapshot(output_folder) == before and fake_hub.commits == []
    carded = repo_id if "/" in repo_id else f"<account>/{repo_id}"
    assert f"Repository: {repo_id} (as given" in printed and "nothing was sent to the Hub" in printed
    assert ("which a dry run cannot resolve without the network, so the card names it <account>/tiny-shaw"
            in printed) == ("/" not in repo_id)
    card = (tmp_path / "cards" / "card.md").read_text(encoding="utf-8")
    assert f'from_pretrained("{carded}")' in card
    plan = hub.PushPlan.of(output_folder)
    uploads = plan.uploads(carded)
    assert set(uploads) == MODEL_FILES | {"README.md", "pipeline_relpos.py"} and uploads["README.md"] == card
    listed = dict(re.findall(r"^  (\S+) +(\d+(?:\.\d)? k?M?B)", printed, flags=re.MULTILINE))
    assert set(listed) == set(uploads)
    assert listed["model.safetensors"] == hub._size((output_folder / "model.safetensors").stat().st_size)
    assert listed["README.md"] == hub._size(len(card.encode("utf-8")))
    for generated in ("README.md", "config.json", "pipeline_relpos.py"):
        assert re.search(rf"^  {re.escape(generated)} .*\(written by the push: ", printed, flags=re.MULTILINE)
    assert "Not uploaded from" in printed and "eval_results.json" in printed and "demo_data/" in printed
    # the push itself uploads exactly these files, the card the same but for the repository it names
    for name, call in hub_calls.items():
        monkeypatch.setattr(HfApi, name, call)
    hub.push_model_folder(output_folder, repo_id)
    (commit,) = fake_hub.commits
    assert set(commit["files"]) == set(uploads)
    assert commit["files"]["README.md"].decode() == card.replace("<account>/", "me/")


def test_a_dry_runs_card_goes_only_where_it_is_asked_and_never_into_the_folder(output_folder, fake_hub, capsys):
    """--card_out inside the folder, or without --dry_run, is one error line, and nothing is written or pushed."""
    before = folder_snapshot(output_folder)
    for argv, message in ((["--dry_run", "--card_out", str(output_folder / "card.md")],
                           "which a dry run leaves as it is"),
                          (["--card_out", str(output_folder.parent / "card.md")], "is for a dry run")):
        with pytest.raises(SystemExit) as exited:
            hub.main(["push", str(output_folder), "me/tiny-shaw", *argv])
        error = capsys.readouterr().err
        assert exited.value.code == 2 and message in error and error.count("\n") == 1
    assert folder_snapshot(output_folder) == before and fake_hub.repos == [] and fake_hub.commits == []
    assert not (output_folder.parent / "card.md").exists()


def test_a_dry_runs_card_out_that_is_a_folder_or_under_a_file_is_one_error_naming_card_out(output_folder, tmp_path,
                                                                                           capsys):
    """--card_out naming an existing folder was a bare `[Errno 21] Is a directory`; one under a file named the file as
    card_out itself. Each is one error line naming card_out and what to give, and nothing is written."""
    (tmp_path / "cards").mkdir()
    (tmp_path / "notes.txt").write_text("mine\n")
    for card_out, message in (
            (tmp_path / "cards", f"card_out {str(tmp_path / 'cards')!r} is a folder: give the card's file name (e.g. "
                                 f"{str(tmp_path / 'cards' / 'README.md')!r})"),
            (tmp_path / "notes.txt" / "card.md", f"card_out's folder {str(tmp_path / 'notes.txt')!r}: "
                                                 f"{str(tmp_path / 'notes.txt')!r} is a file, not a folder")):
        with pytest.raises(SystemExit) as exited:
            hub.main(["push", str(output_folder), "me/tiny-shaw", "--dry_run", "--card_out", str(card_out)])
        error = capsys.readouterr().err
        assert exited.value.code == 2 and message in error and error.count("\n") == 1, error
    assert list((tmp_path / "cards").iterdir()) == [] and (tmp_path / "notes.txt").read_text() == "mine\n"


def test_a_push_of_a_folder_it_cannot_write_is_one_error_before_the_hub_is_called(output_folder, fake_hub, capsys,
                                                                                 monkeypatch):
    """A push writes its card, config.json and pipeline_relpos.py into the folder once the commit succeeds: from a
    folder it cannot write (a read-only mount) the commit was made, then the command failed with a bare
    `[Errno 13] Permission denied` and no commit URL, as if nothing had been pushed. Now it is one error naming the
    folder before the Hub is called; a dry run, which writes nothing there, goes through."""
    make_unwritable(monkeypatch, output_folder)
    before = folder_snapshot(output_folder)
    with pytest.raises(SystemExit) as exited:
        hub.main(["push", str(output_folder), "me/tiny-shaw"])
    error = capsys.readouterr().err
    assert exited.value.code == 2 and error.count("\n") == 1
    assert f"error: {output_folder} is not writable (Permission denied): a push writes" in error
    assert fake_hub.repos == [] and fake_hub.commits == [] and folder_snapshot(output_folder) == before
    hub.main(["push", str(output_folder), "me/tiny-shaw", "--dry_run"])
    assert "Dry run: nothing was sent" in capsys.readouterr().out


def test_a_repository_id_without_a_namespace_is_carded_with_the_namespace_it_was_pushed_to(output_folder, fake_hub):
    hub.push_model_folder(output_folder, "tiny-shaw")
    (commit,) = fake_hub.commits
    assert commit["repo_id"] == "me/tiny-shaw"
    card = commit["files"]["README.md"].decode()
    assert "published as [`me/tiny-shaw`](https://huggingface.co/me/tiny-shaw)" in card
    assert 'from_pretrained("me/tiny-shaw")' in card and '"tiny-shaw"' not in card


def with_run_record(folder: Path, *flags: str) -> Path:
    """`folder` with the run record a train_translation.py run of configs/demo.yaml and `flags` writes into it."""
    arguments = parse_arguments([str(REPO_ROOT / "configs" / "demo.yaml"), "--output_dir", str(folder), *flags])
    (folder / RUN_RECORD_FILE).write_text(json.dumps(run_record(*arguments).to_json()))
    return folder


def test_a_folder_is_pushed_with_the_card_of_its_run_record_and_a_recipe_for_it_is_refused(
        output_folder, fake_hub, capsys):
    with_run_record(output_folder, "--warmup_steps", "7", "--max_steps", "33")
    with pytest.raises(SystemExit) as exited:
        hub.main(["push", str(output_folder), "me/tiny-shaw", "--recipe", str(REPO_ROOT / "configs" / "demo.yaml")])
    assert exited.value.code == 2 and fake_hub.repos == []
    error = capsys.readouterr().err
    assert "has the record of the run that trained it (run_record.json)" in error and error.count("\n") == 1
    hub.main(["push", str(output_folder), "me/tiny-shaw"])
    card = fake_hub.commits[0]["files"]["README.md"].decode()
    assert "| `warmup_steps` | 7 |" in card and "| `max_steps` | 33 |" in card
    assert "Trained as: `python " in card and "--warmup_steps 7 --max_steps 33`" in card and "Hardware: CPU" in card


@pytest.mark.parametrize("given", ["own", "link"])
def test_a_folder_saved_by_hand_is_carded_with_the_recipe_file_given_and_no_training_command(
        output_folder, fake_hub, tmp_path, given):
    """A folder without a run record, pushed with --recipe: the card named the training command
    `python train_translation.py configs/<stem>.yaml`, a file that does not exist for the user's own recipe (or a
    link to a repository recipe), as if the weights had been trained by it. It names the file given and shows its
    settings, saying that how the weights were trained is not known."""
    recipe = tmp_path / "my_recipe.yaml"
    if given == "own":
        recipe.write_text((REPO_ROOT / "configs" / "demo.yaml").read_text().replace("warmup_steps: 100",
                                                                                   "warmup_steps: 37"))
    else:
        recipe.symlink_to(REPO_ROOT / "configs" / "demo.yaml")
    assert not (output_folder / RUN_RECORD_FILE).exists()
    hub.main(["push", str(output_folder), "me/tiny-shaw", "--recipe", str(recipe)])
    card = fake_hub.commits[0]["files"]["README.md"].decode()
    training = card[card.index("## Training"):card.index("## Results")]
    assert "train_translation.py" not in card and "configs/my_recipe.yaml" not in card and "Trained as" not in card
    assert ("These weights were saved without the record of the run that trained them (`run_record.json`), so how "
            "they were trained (command, data read, hardware, time) is not known. What follows is the recipe given "
            "for them when this card was written (`my_recipe.yaml`).") in training
    assert f"| `warmup_steps` | {37 if given == 'own' else 100} |" in training
    assert str(tmp_path) not in card   # a local path stays off the card
    assert (output_folder / "README.md").read_text() == card


def test_a_recipe_cards_text_fields_read_as_written_as_the_training_app_reads_them(output_folder, fake_hub, tmp_path):
    """`target_lang: no` is Norwegian to the training app (a text field reads a plain scalar as written); render-cards
    and push --recipe read it as YAML 1.1's false, and the card then failed on a language code that was not text."""
    recipe = tmp_path / "norwegian.yaml"
    recipe.write_text((REPO_ROOT / "configs" / "demo.yaml").read_text().replace("target_lang: de", "target_lang: no"))
    hub.main(["render-cards", str(recipe), "--out", str(tmp_path / "cards")])
    hub.main(["push", str(output_folder), "me/tiny-shaw", "--recipe", str(recipe)])
    for card in ((tmp_path / "cards" / "norwegian.md").read_text(), fake_hub.commits[0]["files"]["README.md"].decode()):
        assert "English→Norwegian" in card and "English (`en`) → Norwegian (`no`)" in card


@pytest.mark.parametrize("recipe", ["multi30k_small_xl.yaml", "wmt14_en_de_base_directional.yaml"])
def test_a_recipe_of_another_position_scheme_than_the_folders_is_refused(output_folder, fake_hub, capsys, recipe):
    """--recipe for a folder without a run record, naming another scheme than the folder's (a Shaw model): its card
    read "uses relation-aware self-attention ... with the `multi30k_small_xl.yaml` recipe". One error line naming
    both schemes, before any Hub call (a dry run too)."""
    scheme = recipe.removesuffix(".yaml").rsplit("_", 1)[1]
    for dry_run in ([], ["--dry_run"]):
        with pytest.raises(SystemExit) as exited:
            hub.main(["push", str(output_folder), "me/tiny-shaw", "--recipe", str(REPO_ROOT / "configs" / recipe),
                      *dry_run])
        error = capsys.readouterr().err
        assert exited.value.code == 2 and error.count("\n") == 1, error
        assert (f"the recipe (--recipe) given for {output_folder} trains position_scheme '{scheme}', and the folder's "
                "model (config.json) has position_scheme 'shaw': give the recipe its weights were trained with, or "
                "push it without a recipe") in error
    assert fake_hub.repos == [] and not (output_folder / "README.md").exists()


@pytest.mark.parametrize("recipe", [None, "demo.yaml", "multi30k_small_shaw.yaml"])
def test_a_folder_saved_by_hand_without_scores_is_carded_as_trained_weights_not_measured(output_folder, fake_hub,
                                                                                          recipe):
    """A folder without a run record or scores, pushed with or without --recipe: its card said "Never trained in the
    hf_relpos repository" (or, for the demo recipe, "Not recorded: `make demo` trains this recipe"), although the
    weights pushed with it were trained. It says no scores were saved with them."""
    for prefix in ("eval", "test"):
        (output_folder / f"{prefix}_results.json").unlink()
    hub.main(["push", str(output_folder), "me/tiny-shaw", *(["--recipe", str(REPO_ROOT / "configs" / recipe)]
                                                             if recipe else [])])
    card = ModelCard(fake_hub.commits[0]["files"]["README.md"].decode())
    results = card.text[card.text.index("## Results"):card.text.index("## How to use")]
    assert results == ("## Results\n\nNot measured: no scores were saved with these weights.\n\n"
                       "The trained weights are published as [`me/tiny-shaw`](https://huggingface.co/me/tiny-shaw).\n\n")
    assert "Never trained" not in card.text and "make demo" not in card.text and card.data.eval_results is None


def test_an_averaged_folder_without_a_run_record_is_carded_as_trained_weights(trained_folder, tmp_path):
    """hf-relpos-average of checkpoints whose run left no record (stopped before it wrote one): the card said "No
    published checkpoint: hf_relpos publishes no trained weights of this recipe; train them with the command above",
    with no recipe and no command above. It says these weights were not pushed."""
    for step in (1, 2):
        shutil.copytree(trained_folder, tmp_path / "run" / f"checkpoint-{step}",
                        ignore=shutil.ignore_patterns("*_results.json"))
        TrainerState(global_step=step).save_to_json(str(tmp_path / "run" / f"checkpoint-{step}" / "trainer_state.json"))
    card = (average_checkpoints(tmp_path / "run", 2, tmp_path / "averaged") / "README.md").read_text()
    results = card[card.index("## Results"):card.index("## How to use")]
    assert results == ("## Results\n\nNot measured: these averaged weights were not evaluated (Checkpoint averaging, "
                       "below).\n\nNo published checkpoint: these weights were not pushed to the Hugging Face Hub "
                       "with this card.\n\n")
    assert "The training recipe was not recorded with this model." in card


def test_the_files_the_hub_guide_says_a_push_leaves_out_are_left_out(output_folder, fake_hub):
    """docs/hub.md names what a push leaves out of a training folder (the run record, the tokenizer's settings, an
    average's checkpoint list, prepared data, checkpoints, scores), and each of them, put in a pushable folder, is
    left out."""
    guide = (REPO_ROOT / "docs" / "hub.md").read_text(encoding="utf-8")
    paragraph = guide[guide.index("Nothing else in the folder is uploaded"):]
    paragraph = paragraph[:paragraph.index("A folder without weights")]
    named = set(re.findall(r"`([^`]+)`", paragraph)) - {"README.md"}
    for name in ("run_record.json", "tokenizer_training.json", "averaged_checkpoints.json", "prepared_data/",
                 "checkpoint-<step>/", "all_results.json", "trainer_state.json", "training_args.bin"):
        assert name in named, name
    for name in named:
        path = output_folder / name.replace("<step>", "100").replace("*", "eval")
        if name.endswith("/"):
            path.mkdir(exist_ok=True)
            (path / "x.json").write_text("{}\n")
        elif not path.exists():
            path.write_text("{}\n")
    hub.push_model_folder(output_folder, "me/tiny-shaw")
    (commit,) = fake_hub.commits
    assert set(commit["files"]) == MODEL_FILES | {"README.md", "pipeline_relpos.py"}


def test_the_hub_guides_push_examples_push_the_folders_they_name(trained_folder, fake_hub, tmp_path, monkeypatch):
    """docs/hub.md's push examples (its Python block and its shell commands) run as written from a folder holding
    configs/: a folder they name that is a recipe's output_dir holds the run record train_translation.py writes
    there, any other is a model saved by hand (model and tokenizer, no record); each example pushes once, but a dry
    run, which pushes nothing and writes the card its --card_out names."""
    guide = (REPO_ROOT / "docs" / "hub.md").read_text(encoding="utf-8")
    (code,) = [block for block in re.findall(r"```python\n(.*?)```", guide, flags=re.DOTALL)
               if "push_model_folder(" in block]
    commands = [shlex.split(line)[4:] for block in re.findall(r"```bash\n(.*?)```", guide, flags=re.DOTALL)
                for line in block.replace("\\\n", " ").splitlines()
                if line.startswith("python -m hf_relpos.publish.hub push ")]
    recipe_outputs = {hub.load_card_recipe(path).get("output_dir") for path in (REPO_ROOT / "configs").glob("*.yaml")}
    folders = {*re.findall(r'push_model_folder\(\s*"([^"]+)"', code), *(argv[0] for argv in commands)}
    assert commands and folders
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(REPO_ROOT / "configs")
    for folder in folders:
        shutil.copytree(trained_folder, tmp_path / folder)
        if folder in recipe_outputs:
            with_run_record(tmp_path / folder)
    exec(compile(code, "docs/hub.md", "exec"), {})
    for argv in commands:
        hub.main(["push", *argv])
    dry_runs = [argv for argv in commands if "--dry_run" in argv]
    assert dry_runs and len(fake_hub.commits) == 1 + len(commands) - len(dry_runs)
    for argv in dry_runs:
        assert (tmp_path / argv[argv.index("--card_out") + 1]).read_text(encoding="utf-8").startswith("---\n")


def test_an_averaged_folder_is_pushed_with_its_averaging_card(trained_folder, fake_hub, tmp_path):
    (tmp_path / "run").mkdir()
    run_dir = with_run_record(tmp_path / "run")
    for step in (1, 2):
        shutil.copytree(trained_folder, run_dir / f"checkpoint-{step}", ignore=shutil.ignore_patterns("*_results.json"))
        TrainerState(global_step=step).save_to_json(str(run_dir / f"checkpoint-{step}" / "trainer_state.json"))
    averaged = average_checkpoints(run_dir, 2, tmp_path / "averaged")
    local_card = (averaged / "README.md").read_text()
    hub.push_model_folder(averaged, "me/tiny-averaged")
    files = fake_hub.commits[0]["files"]
    assert "averaged_checkpoints.json" not in files   # local paths: the card names the checkpoints
    card = ModelCard(files["README.md"].decode())
    assert card.data.language == ["en", "de"] and card.data.eval_results is None
    for expected in ("## Training", "Trained as: `python ", "Not measured: these averaged weights were not evaluated",
                     "## Checkpoint averaging", "(`checkpoint-1`, `checkpoint-2`) of `run`"):
        assert expected in card.text and expected in local_card, expected
    assert "published as [`me/tiny-averaged`]" in card.text


def test_the_averaging_card_names_the_run_folder_when_the_newest_averaged_is_its_final_model(trained_folder, tmp_path):
    """A run's final model is saved in the run folder itself, beside its checkpoint-<step> folders: averaged with
    its last checkpoint, the run is that folder, not its parent."""
    run_dir = with_run_record(Path(shutil.copytree(trained_folder, tmp_path / "runs" / "run")))
    shutil.copytree(trained_folder, run_dir / "checkpoint-4", ignore=shutil.ignore_patterns("*_results.json"))
    TrainerState(global_step=4).save_to_json(str(run_dir / "checkpoint-4" / "trainer_state.json"))
    averaged = average_checkpoints([run_dir / "checkpoint-4", run_dir], None, tmp_path / "averaged")
    assert "(`checkpoint-4`, `run`) of `run`," in (averaged / "README.md").read_text()


def test_an_average_that_fails_mid_way_leaves_none_of_the_folders_it_made(trained_folder, tmp_path, monkeypatch):
    """An average into a new folder under missing parents (p1/p2/averaged) that fails while writing its weights
    leaves nothing: neither the staging folder nor the parents it made; parents that were there stay."""
    from hf_relpos.tools import average as average_module

    checkpoints = [shutil.copytree(trained_folder, tmp_path / "run" / f"checkpoint-{step}") for step in (1, 2)]
    (tmp_path / "out").mkdir()

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(average_module, "save_file", disk_full)
    with pytest.raises(OSError, match="No space left"):
        average_checkpoints(checkpoints, None, tmp_path / "out" / "p1" / "p2" / "averaged")
    assert list((tmp_path / "out").iterdir()) == []


def test_an_average_ending_with_a_final_model_takes_none_of_its_scores_translations_or_card(trained_folder, fake_hub,
                                                                                            tmp_path):
    """hf-relpos-average of folders listed, the newest a training run's final model (with its card, record, scores
    and translations): the average copied that folder's `*_results.json`, `*_hypotheses.txt` and README.md, and its
    push card gave the final weights' scores as the average's own. What describes another model's weights stays
    out; the run record is kept without scores."""
    final = with_run_record(Path(shutil.copytree(trained_folder, tmp_path / "final")))
    (final / "README.md").write_text("the final model's card\n")
    (final / "all_results.json").write_text(json.dumps({"test_bleu": 99.0}))
    shutil.copytree(trained_folder, tmp_path / "checkpoint-1", ignore=shutil.ignore_patterns("*_results.json"))
    averaged = average_checkpoints([tmp_path / "checkpoint-1", final], None, tmp_path / "averaged")
    left_in = sorted(path.name for path in averaged.iterdir()
                     if path.name.endswith(("_results.json", "_hypotheses.txt")))
    assert left_in == [] and training_record(averaged).scores == {}
    assert "Not measured: these averaged weights were not evaluated" in (averaged / "README.md").read_text()
    hub.push_model_folder(averaged, "me/tiny-averaged")
    card = ModelCard(fake_hub.commits[0]["files"]["README.md"].decode())
    assert card.data.eval_results is None and "Not measured: these averaged weights were not evaluated" in card.text


def test_an_averaged_folder_keeps_the_run_record_without_the_scores_of_the_runs_final_weights(trained_folder, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_folder, run_dir)
    record = RunRecord.from_json(json.loads(with_run_record(run_dir).joinpath(RUN_RECORD_FILE).read_text()))
    record.scores = scores_from_results(hub.load_results(run_dir))
    record.metrics = {"long": {"accuracy": 0.5, "bleu": 20.0}}   # measured on the final weights too
    (run_dir / RUN_RECORD_FILE).write_text(json.dumps(record.to_json()))
    for step in (1, 2):
        shutil.copytree(trained_folder, run_dir / f"checkpoint-{step}", ignore=shutil.ignore_patterns("*_results.json"))
        TrainerState(global_step=step).save_to_json(str(run_dir / f"checkpoint-{step}" / "trainer_state.json"))
    averaged = training_record(average_checkpoints(run_dir, 2, tmp_path / "averaged"))
    assert record.scores and averaged.scores == {} and averaged.metrics == {}
    # languages, BLEU tokenization and recipe kept
    assert averaged == dataclasses.replace(record, scores={}, metrics={})


def test_the_hub_guide_lists_every_code_file_a_push_uploads(output_folder):
    import re

    guide = (REPO_ROOT / "docs" / "hub.md").read_text(encoding="utf-8")
    code_row = next(line for line in guide.splitlines() if line.startswith("| `configuration_relpos.py`"))
    listed = set(re.findall(r"`([a-z_]+\.py)`", code_row))
    for braces in re.findall(r"`positions_\{([a-z0-9,]+)\}\.py`", code_row):
        listed |= {f"positions_{name}.py" for name in braces.split(",")}
    pushed = {name for name in hub.files_to_push(output_folder) if name.endswith(".py")} - {"pipeline_relpos.py"}
    assert pushed == listed, pushed ^ listed


def test_a_failed_upload_on_the_command_line_is_one_error_line(output_folder, fake_hub, monkeypatch, capsys):
    def unreachable(self, *args, **kwargs):
        raise ConnectionError("huggingface.co is unreachable")

    monkeypatch.setattr(HfApi, "create_commit", unreachable)
    with pytest.raises(SystemExit) as exited:
        hub.main(["push", str(output_folder), "me/tiny-shaw"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("python -m hf_relpos.publish.hub push: error: pushing ") and "'me/tiny-shaw' failed (ConnectionError" in error
    assert error.count("\n") == 1 and "Traceback" not in error


@pytest.mark.parametrize("failing_call", ["create_repo", "create_commit"])
def test_failed_upload_leaves_folder_intact_and_names_the_repo(output_folder, fake_hub, monkeypatch, failing_call):
    def unreachable(self, *args, **kwargs):
        raise ConnectionError("huggingface.co is unreachable")

    monkeypatch.setattr(HfApi, failing_call, unreachable)
    before = folder_snapshot(output_folder)
    with pytest.raises(hub.HubPushError, match=r"'me/tiny-shaw' failed \(ConnectionError: huggingface.co is unre"):
        hub.push_model_folder(output_folder, "me/tiny-shaw")
    assert folder_snapshot(output_folder) == before
    assert not (output_folder / "README.md").exists()
    assert not list(output_folder.glob(".*"))  # no temporary files either


@pytest.mark.parametrize("visibility", ["public", "private"])
def test_a_private_push_into_an_existing_repository_needs_it_private(output_folder, fake_hub, capsys, visibility):
    """--private into a repository that exists: the Hub keeps its visibility (create_repo with exist_ok ignores
    private), so a public one is refused before anything is uploaded, naming it and the remedy; a private one takes
    the push. Without --private the public repository takes it."""
    fake_hub.existing["me/tiny-shaw"] = visibility == "private"
    before = folder_snapshot(output_folder)
    if visibility == "public":
        with pytest.raises(SystemExit) as exited:
            hub.main(["push", str(output_folder), "me/tiny-shaw", "--private"])
        error = capsys.readouterr().err
        assert exited.value.code == 2 and error.count("\n") == 1, error
        assert ("the Hub repository 'me/tiny-shaw' exists and is public, and a private repository was asked for: a "
                "push does not change an existing repository's visibility, so these weights would be public; make it "
                "private first (its settings page on the Hub, or `hf repos settings me/tiny-shaw --private`) and push "
                "again, or push without --private (hub_private_repo: false) to publish them publicly") in error
        assert fake_hub.commits == [] and fake_hub.existing == {"me/tiny-shaw": False}
        assert folder_snapshot(output_folder) == before
        hub.main(["push", str(output_folder), "me/tiny-shaw"])
    else:
        hub.main(["push", str(output_folder), "me/tiny-shaw", "--private"])
    assert [commit["repo_id"] for commit in fake_hub.commits] == ["me/tiny-shaw"]
    assert fake_hub.existing == {"me/tiny-shaw": visibility == "private"}


def test_the_push_commands_help_says_what_private_does(capsys):
    """--private's help names the rule push_model_folder applies (create private, refuse an existing public one)."""
    with pytest.raises(SystemExit):
        hub.main(["push", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert ("--private push into a private repository only: create it as private if it does not exist; an existing "
            "public repository is refused, not made private") in help_text


@pytest.mark.parametrize("repository", ["new", "existing", "new, not deletable"])
@pytest.mark.parametrize("failing_call", ["list_repo_files", "stale_weights", "create_commit"])
def test_a_failed_push_deletes_the_repository_it_created_and_only_that(output_folder, fake_hub, monkeypatch,
                                                                       repository, failing_call):
    """A push whose call after create_repo fails (a Hub call, or building the commit) leaves no repository it created
    behind (the Hub made it, nothing of the model went in), and says so; a repository that existed before is left as
    it was. Where deleting fails too, the error says the repository is left and how to delete it."""
    def unreachable(self, *args, **kwargs):
        raise ConnectionError("huggingface.co is unreachable")

    monkeypatch.setattr(hub if failing_call == "stale_weights" else HfApi, failing_call, unreachable)
    if repository == "existing":
        fake_hub.existing["me/tiny-shaw"] = False
    if repository == "new, not deletable":
        monkeypatch.setattr(HfApi, "delete_repo", unreachable)
    with pytest.raises(hub.HubPushError) as raised:
        hub.push_model_folder(output_folder, "tiny-shaw")
    message = str(raised.value)
    assert message.startswith(f"pushing {output_folder} to the Hub repository 'me/tiny-shaw' failed (ConnectionError")
    assert message.endswith(f"; nothing in {output_folder} was changed")
    deleted = "; the repository, which this push had created, was deleted again"
    left = ("; the repository this push created is left without the model (deleting it failed: ConnectionError: "
            "huggingface.co is unreachable): push again, or delete it (`hf repos delete me/tiny-shaw`)")
    assert (deleted in message, left in message) == {"new": (True, False), "existing": (False, False),
                                                     "new, not deletable": (False, True)}[repository]
    assert fake_hub.existing == ({} if repository == "new" else {"me/tiny-shaw": False})


def test_a_sharded_model_is_pushed_with_its_index_and_every_shard(output_folder):
    """Weights saved in shards: the index and each shard it names go to the Hub (the folder loads from neither alone)."""
    model = AutoModelForSeq2SeqLM.from_pretrained(output_folder)
    (output_folder / "model.safetensors").unlink()
    model.save_pretrained(output_folder, max_shard_size="50KB")
    shards = {path.name for path in output_folder.glob("model-*-of-*.safetensors")}
    assert len(shards) > 1
    assert {"model.safetensors.index.json", *shards} <= hub.files_to_push(output_folder).keys()


def test_a_push_to_a_repository_with_other_weights_deletes_those_that_would_shadow_its_own(output_folder, fake_hub):
    """The repository of an earlier push keeps its model.safetensors, which transformers loads before an index: a
    sharded model pushed there deletes it in the same commit (and an unsharded one the old shards and index), so the
    repository serves the weights pushed last. Other files of the repository are left as they are."""
    hub.push_model_folder(output_folder, "me/tiny-shaw")
    fake_hub.commits[0]["files"]["notes.txt"] = b"the user's own file"
    model = AutoModelForSeq2SeqLM.from_pretrained(output_folder)
    (output_folder / "model.safetensors").unlink()
    model.save_pretrained(output_folder, max_shard_size="50KB")
    shards = sorted(path.name for path in output_folder.glob("model-*-of-*.safetensors"))
    hub.push_model_folder(output_folder, "me/tiny-shaw")
    assert fake_hub.commits[1]["deleted"] == ["model.safetensors"] and set(shards) <= fake_hub.commits[1]["files"].keys()
    for name in ["model.safetensors.index.json", *shards]:
        (output_folder / name).unlink()
    model.save_pretrained(output_folder)
    hub.push_model_folder(output_folder, "me/tiny-shaw")
    assert fake_hub.commits[2]["deleted"] == sorted(["model.safetensors.index.json", *shards])
    assert "notes.txt" in HfApi().list_repo_files("me/tiny-shaw")


def test_a_weights_file_cut_short_is_refused_before_anything_is_pushed(output_folder):
    """A model.safetensors cut short (a copy broken off) went to the Hub as it was, a model no user could load."""
    weights = output_folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size - 10])
    with pytest.raises(ValueError, match=f"^{re.escape(str(output_folder))}: its weights file model.safetensors is cut "
                                         "short or corrupt"):
        hub.files_to_push(output_folder)


def test_a_shard_cut_short_is_refused_by_its_name(output_folder):
    """A folder of shards names the shard that does not read: "its weights file" alone would leave the user to find
    which of them."""
    model = AutoModelForSeq2SeqLM.from_pretrained(output_folder)
    (output_folder / "model.safetensors").unlink()
    model.save_pretrained(output_folder, max_shard_size="50KB")
    shard = sorted(output_folder.glob("model-*-of-*.safetensors"))[-1]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size - 10])
    with pytest.raises(ValueError, match=f"^{re.escape(str(output_folder))}: its weights file {re.escape(shard.name)} "
                                         "is cut short or corrupt"):
        hub.files_to_push(output_folder)


def test_a_tokenizers_special_and_added_tokens_files_are_pushed_where_it_has_them(output_folder):
    """A tokenizer saved with special_tokens_map.json or added_tokens.json (older transformers, Marian) needs them on
    the Hub too."""
    for name in ("special_tokens_map.json", "added_tokens.json"):
        (output_folder / name).write_text("{}")
    assert {"special_tokens_map.json", "added_tokens.json"} <= hub.files_to_push(output_folder).keys()


def test_a_ctranslate2_export_is_refused_naming_what_to_push_instead(tmp_path, fake_hub):
    """An export of hf-relpos-export was refused as a config to save "with hf_relpos imported", which misleads: it
    loads in CTranslate2 only, so the error names its source folder or a plain upload instead."""
    export = tmp_path / "model_ct2"
    export.mkdir()
    (export / "ctranslate2_export.json").write_text("{}")
    (export / "config.json").write_text('{"add_source_bos": false}')   # CTranslate2's config, not a model's
    with pytest.raises(ValueError, match=rf"^{re.escape(str(export))} is a CTranslate2 export .*: push the model "
                                         rf"folder it was exported from, or upload the export as it is \(hf upload "):
        hub.push_model_folder(export, "me/model-ct2")
    assert fake_hub.repos == [] and fake_hub.commits == []


def test_an_export_that_holds_local_paths_is_refused_advising_a_new_export_not_a_plain_upload(tmp_path, fake_hub):
    """An export written while hf-relpos-export kept local absolute paths (ctranslate2_export.json's source_model, the
    run record as typed) is refused advising to export again and upload that: the advised `hf upload` of the folder
    as it is would publish them. An export without such paths keeps the plain advice; each record is named alone."""
    def export(name: str, source_model: str, run: RunRecord | None) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "ctranslate2_export.json").write_text(json.dumps({"engine": "ctranslate2",
                                                                     "source_model": source_model}))
        if run is not None:
            (folder / RUN_RECORD_FILE).write_text(json.dumps(run.to_json()))
        return folder

    typed = RunRecord(train_file=f"{tmp_path}/train.jsonl", trained_as="configs/demo.yaml",
                      working_directory=str(tmp_path))
    old = export("old_ct2", str(tmp_path / "model"), typed)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(old))} is a CTranslate2 export .*: push the model folder "
                                         r"it was exported from, or upload an export of it: ctranslate2_export\.json "
                                         r"and run_record\.json of this one hold local absolute paths .*export it "
                                         r"again \(hf-relpos-export ctranslate2 MODEL_DIR OUT_DIR\) and upload that "
                                         r"\(hf upload REPO_ID OUT_DIR\)$"):
        hub.push_model_folder(old, "me/model-ct2")
    assert hub.export_files_with_local_paths(export("old_record", "model", typed)) == [RUN_RECORD_FILE]
    assert hub.export_files_with_local_paths(export("old_source", "/data/model", None)) == ["ctranslate2_export.json"]
    new = export("new_ct2", "model", hub.shown_record(typed))
    with pytest.raises(ValueError,
                       match=rf"or upload the export as it is \(hf upload REPO_ID {re.escape(str(new))}\)$"):
        hub.push_model_folder(new, "me/model-ct2")
    unreadable = export("unreadable", "<local>/model", None)
    (unreadable / RUN_RECORD_FILE).write_text("{not json")
    assert hub.export_files_with_local_paths(unreadable) == []
    assert fake_hub.repos == [] and fake_hub.commits == []


def test_incomplete_folder_is_refused_before_any_upload(output_folder, fake_hub):
    (output_folder / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="lacks tokenizer.json"):
        hub.push_model_folder(output_folder, "me/tiny-shaw")
    assert fake_hub.repos == [] and fake_hub.commits == []


def test_training_hook_pushes_output_dir_with_the_run_recipe(output_folder, fake_hub):
    """What train_translation.py calls after evaluation when the YAML says push_to_hub: true."""
    arguments = parse_arguments([str(REPO_ROOT / "configs" / "demo.yaml"), "--output_dir", str(output_folder),
                                 "--push_to_hub", "true", "--hub_model_id", "me/demo-shaw", "--learning_rate", "0.003"])
    (output_folder / RUN_RECORD_FILE).write_text(json.dumps(run_record(*arguments).to_json()))   # as the run writes it
    push_training_output(arguments[2])
    (commit,) = fake_hub.commits
    assert commit["repo_id"] == "me/demo-shaw"
    card = ModelCard(commit["files"]["README.md"].decode())
    assert "| `learning_rate` | 0.003 |" in card.text and "| `max_tokens_per_batch` | 512 |" in card.text
    assert "trained on hf_relpos demo corpus" in card.text and card.data.datasets is None
    assert {r.dataset_split for r in card.data.eval_results} == {"validation", "test"}
    assert "The trained weights are published as [`me/demo-shaw`](https://huggingface.co/me/demo-shaw)." in card.text


def test_train_translation_with_push_to_hub_pushes_the_scored_run(tmp_path, fake_hub, capsys):
    """`push_to_hub: true` in a real (tiny) run: one commit after scoring, with the model, its code, the tokenizer
    and a card whose model-index carries the BLEU that this run's evaluation wrote; the log's last line names the
    commit."""
    output_dir = tmp_path / "run"
    run([str(REPO_ROOT / "configs" / "demo.yaml"), "--output_dir", str(output_dir), "--push_to_hub", "true",
         "--hub_model_id", "me/tiny-demo", "--demo_train_pairs", "60", "--demo_validation_pairs", "6",
         "--demo_test_pairs", "5", "--max_steps", "2", "--model.d_model", "32", "--model.encoder_layers", "1",
         "--model.decoder_layers", "1", "--model.encoder_ffn_dim", "64", "--model.decoder_ffn_dim", "64",
         "--generation_num_beams", "1", "--generation_max_length_offset", "3", "--cpu_threads", "1",
         "--disable_tqdm", "true"])
    (commit,) = fake_hub.commits
    assert commit["repo_id"] == "me/tiny-demo"
    assert capsys.readouterr().out.splitlines()[-1].endswith(
        "test_hypotheses.txt; pushed to the Hub: https://huggingface.co/me/tiny-demo/commit/0123")
    assert set(commit["files"]) == MODEL_FILES | {"README.md", "pipeline_relpos.py"}
    assert commit["files"]["model.safetensors"] == (output_dir / "model.safetensors").read_bytes()
    written = json.loads((output_dir / "test_results.json").read_text())
    card = ModelCard(commit["files"]["README.md"].decode())
    test_bleu = next(r for r in card.data.eval_results if r.dataset_split == "test" and r.metric_type == "sacrebleu")
    assert test_bleu.metric_value == round(written["test_bleu"], 2)
    assert test_bleu.metric_args == {"signature": written["test_bleu_signature"]}
    assert not any(name.startswith("checkpoint-") for name in commit["files"])
    record = RunRecord.from_json(json.loads((output_dir / RUN_RECORD_FILE).read_text()))   # the run's typed record
    assert (record.role, record.max_steps, record.dataset_name) == (RECIPE, 2, "demo")
    assert record.scores[TRAINED_WEIGHTS]["test"] == Scores(written["test_bleu"], written["test_chrf"],
                                                             written["test_bleu_signature"], written["test_length_ratio"])
    # the recipe it trained from, and the flags it added, as given on the command line
    assert record.recipe == "demo"
    assert record.trained_as.startswith(f"{REPO_ROOT / 'configs' / 'demo.yaml'} --output_dir {output_dir} ")
    assert record.software["transformers"] == transformers.__version__ and record.date.startswith("20")
    assert "Trained as: `python train_translation.py " in card.text


def test_push_to_hub_without_training_is_one_error_line_before_anything_runs(output_folder, fake_hub, tmp_path,
                                                                             capsys):
    output_dir = tmp_path / "predicted"
    with pytest.raises(SystemExit) as exited:
        training_main([str(REPO_ROOT / "configs" / "demo.yaml"), "--do_train", "false", "--model_name_or_path",
                       str(output_folder), "--output_dir", str(output_dir), "--push_to_hub", "true"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("train_translation.py: error: push_to_hub publishes the model this run trains") and (
        "it needs do_train" in error and "python -m hf_relpos.publish.hub push FOLDER REPO" in error)
    assert error.count("\n") == 1 and fake_hub.repos == [] and not output_dir.exists()


@pytest.mark.parametrize(("flags", "named"), [
    (["--hub_model_id", "me/my model"], "hub_model_id 'me/my model'"),
    ([], "hub_model_id (null: output_dir's folder name 'run--2')"),
])
def test_push_to_hub_to_an_invalid_repository_id_is_one_error_line_before_training(fake_hub, tmp_path, capsys,
                                                                                    flags, named):
    """A repository id the Hub refuses (hub_model_id, or output_dir's folder name when it is null) is one error line
    naming it before anything runs, not a failed push after the whole training."""
    output_dir = tmp_path / "run--2"
    with pytest.raises(SystemExit) as exited:
        training_main([str(REPO_ROOT / "configs" / "demo.yaml"), "--output_dir", str(output_dir), "--push_to_hub",
                       "true", *flags])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith(f"train_translation.py: error: push_to_hub: {named} is not a Hub repository id")
    assert error.count("\n") == 1 and fake_hub.repos == [] and not output_dir.exists()


@pytest.mark.parametrize("visibility", ["public", "private", "none"])
def test_push_to_hub_into_an_existing_public_repository_with_hub_private_repo_stops_before_training(
        fake_hub, tmp_path, capsys, monkeypatch, visibility):
    """hub_private_repo: true with a hub_model_id (here without a namespace: the login's) that exists and is public
    is one error line before anything runs (the push after training would be refused, `public_repository_refusal`);
    a private or missing repository passes the check (the run then fails on purpose at its first step)."""
    if visibility != "none":
        fake_hub.existing["me/relpos-run"] = visibility == "private"
    monkeypatch.setattr(training_module, "prepare_data", lambda *args, **kwargs: pytest.fail("got past the checks"))
    output_dir = tmp_path / "out"
    arguments = [str(REPO_ROOT / "configs" / "demo.yaml"), "--output_dir", str(output_dir), "--push_to_hub", "true",
                 "--hub_model_id", "relpos-run", "--hub_private_repo", "true"]
    if visibility == "public":
        with pytest.raises(SystemExit) as exited:
            training_main(arguments)
        assert exited.value.code == 2
        error = capsys.readouterr().err
        assert error.startswith("train_translation.py: error: push_to_hub: the Hub repository 'me/relpos-run' exists "
                                "and is public, and a private repository was asked for") and error.count("\n") == 1
        assert error.endswith("before training, or set hub_private_repo: false to publish the model publicly\n")
    else:
        with pytest.raises(pytest.fail.Exception, match="got past the checks"):
            training_main(arguments)
    assert fake_hub.repos == [] and not output_dir.exists()


def test_model_push_to_hub_carries_code_files_and_auto_map(fake_hub):
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("xl"))
    model.push_to_hub("me/plain-push")
    (commit,) = fake_hub.commits
    assert set(commit["files"]) == {"model.safetensors", "config.json", "generation_config.json", "README.md",
                                    *CODE_FILES}
    assert json.loads(commit["files"]["config.json"])["auto_map"]["AutoModelForSeq2SeqLM"] == (
        "modeling_relpos.RelPosTransformerForConditionalGeneration")


# --------------------------------------------------------------------------------------------------- pipeline, loading

def test_translation_pipeline_translates_a_saved_folder(trained_folder, tmp_path):
    folder = Path(shutil.copytree(trained_folder, tmp_path / "model"))
    plain = pipeline("translation", model=str(folder), device="cpu")  # the task hf_relpos restores on import
    assert plain(PAIRS[1][0]) == [{"translation_text": PAIRS[1][1]}]
    hub.add_translation_pipeline(folder)
    with pytest.raises(ValueError, match="trust_remote_code"):
        pipeline("translation", model=str(folder))
    translator = pipeline("translation", model=str(folder), pipeline_class=hub.TranslationPipeline, device="cpu")
    assert translator(PAIRS[1][0]) == [{"translation_text": PAIRS[1][1]}]
    by_pair = pipeline("translation_en_to_de", model=str(folder), device="cpu")   # not the declared task's name
    assert type(by_pair) is hub.TranslationPipeline and by_pair(PAIRS[1][0]) == [{"translation_text": PAIRS[1][1]}]
    assert translator([source for source, _ in PAIRS], batch_size=3) == [
        {"translation_text": target} for _, target in PAIRS]
    assert translator(PAIRS[0][0], num_beams=2, num_return_sequences=2)[0] == {"translation_text": PAIRS[0][1]}


def test_a_resaved_model_declares_its_pipeline_only_where_the_pipeline_code_is(trained_folder, tmp_path):
    """A model loaded from a folder that declares `pipeline_relpos.py` and saved elsewhere (fine-tuning, Trainer
    checkpoints, push_to_hub) does not write that file: the new folder declares no pipeline, and the plain translation
    pipeline serves it. Saved over a folder that has the file, the declaration stays; the loaded model keeps it."""
    folder = Path(shutil.copytree(trained_folder, tmp_path / "model"))
    hub.add_translation_pipeline(folder)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    model.save_pretrained(tmp_path / "resaved")
    assert "custom_pipelines" not in json.loads((tmp_path / "resaved" / "config.json").read_text())
    assert not (tmp_path / "resaved" / hub.PIPELINE_FILE).exists()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(folder / name, tmp_path / "resaved" / name)
    translator = pipeline("translation", model=str(tmp_path / "resaved"), trust_remote_code=True, device="cpu")
    assert translator(PAIRS[1][0]) == [{"translation_text": PAIRS[1][1]}]
    assert model.config.custom_pipelines["translation"]["impl"] == "pipeline_relpos.TranslationPipeline"
    model.save_pretrained(folder)
    assert json.loads((folder / "config.json").read_text())["custom_pipelines"] == model.config.custom_pipelines


LOAD_SCRIPT = """
import sys
if {block}:
    sys.modules["hf_relpos"] = None  # importing hf_relpos now raises ImportError
else:
    import hf_relpos
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

folder, remote = {folder!r}, {block}
tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=remote or None)
model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=remote or None).eval()
print("MODULE", type(model).__module__)
inputs = tokenizer({sources!r}, padding=True, return_tensors="pt")
print("GENERATE", tokenizer.batch_decode(model.generate(**inputs), skip_special_tokens=True))
translator = pipeline("translation", model=folder, trust_remote_code=True, device="cpu")
print("PIPELINE", [output["translation_text"] for output in translator({sources!r})])
print("PIPELINE_CLASS", type(translator).__module__, type(translator).__name__)
if not remote:
    by_pair = pipeline("translation_en_to_de", model=folder, device="cpu")
    print("PAIR_PIPELINE", [output["translation_text"] for output in by_pair({sources!r})])
    print("PAIR_PIPELINE_CLASS", type(by_pair).__module__, type(by_pair).__name__)
"""


@pytest.mark.parametrize("remote_only", [False, True], ids=["hf_relpos_installed", "trust_remote_code_only"])
def test_fresh_process_loads_and_translates(trained_folder, tmp_path, remote_only):
    folder = Path(shutil.copytree(trained_folder, tmp_path / "model"))
    hub.add_translation_pipeline(folder)
    sources = [source for source, _ in PAIRS]
    script = LOAD_SCRIPT.format(block=remote_only, folder=str(folder), sources=sources)
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Do you wish to run the custom code" not in result.stdout
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if line.split(" ")[0].isupper())
    expected = str([target for _, target in PAIRS])
    assert lines["GENERATE"] == expected
    # transformers 5 has no translation pipeline of its own: a declaring folder with trust_remote_code runs its copy
    # of hf_relpos' (installed or not), a language pair's task name the installed class
    assert lines["PIPELINE"] == expected
    assert re.fullmatch(r"transformers_modules\.\S+\.pipeline_relpos TranslationPipeline", lines["PIPELINE_CLASS"])
    if remote_only:
        assert lines["MODULE"].startswith("transformers_modules")
    else:
        assert lines["MODULE"] == "hf_relpos.model.modeling_relpos"
        assert lines["PAIR_PIPELINE"] == expected
        assert lines["PAIR_PIPELINE_CLASS"] == "hf_relpos.publish.pipeline_relpos TranslationPipeline"


def test_each_block_of_a_pushed_cards_usage_runs_as_written_where_hf_relpos_is_not_installed(
        output_folder, fake_hub, tmp_path):
    """The card's blocks for a machine without hf_relpos (all but the first, which imports it), each copied alone
    into a fresh Python: the remote-code block used AutoTokenizer and AutoModelForSeq2SeqLM without importing them
    (NameError) and translated nothing. Its example sentence is replaced by one the model knows."""
    hub.push_model_folder(output_folder, "me/tiny-shaw")
    card = fake_hub.commits[0]["files"]["README.md"].decode()
    first, *without_hf_relpos = re.findall(r"```python\n(.*?)```", card[card.index("## How to use"):], re.S)
    assert "import hf_relpos" in first and len(without_hf_relpos) == 2
    example = re.search(r"tokenizer\(\[(\".*?\")\]", first).group(1)   # the sentence the card translates
    outputs = []
    for block in without_hf_relpos:
        assert "import hf_relpos" not in block
        script = block.replace('"me/tiny-shaw"', repr(str(output_folder))).replace(example, repr(PAIRS[1][0]))
        result = run_without_hf_relpos(script, tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        outputs.append(result.stdout.splitlines())
    assert outputs[0][-1] == str([PAIRS[1][1]])   # the remote-code block generates and prints the translation


@pytest.mark.parametrize("kind, shown", [("probabilities", "| 0.1 / 0.2 / 0.0 |"),
                                         ("keys", "| 0.1 / 0.2 (keys dropped before the softmax) / 0.0 |")])
def test_card_says_what_attention_dropout_drops(kind, shown):
    config = tiny_config("xl")
    config.attention_dropout, config.attention_dropout_kind = 0.2, kind
    config._validate_relpos()
    assert f"| dropout / attention / activation dropout {shown}" in hub._architecture_section(config)


@pytest.mark.parametrize(("record", "recipe_name", "command"), [
    (None, None, None),
    ({"source_lang": "en", "target_lang": "de"}, None, None),
    ({"source_lang": "en", "target_lang": "de"}, "multi30k_small_shaw", "python train_translation.py configs/"),
])
def test_an_untrained_card_points_to_a_training_command_only_where_it_shows_one(record, recipe_name, command):
    """A card of weights nobody trained says that no checkpoint is published, and 'train them with the command above'
    only where its Training section shows a command (a recipe's): a card of a config alone, or of a recipe dict
    without a name, shows none."""
    card = hub.render_model_card(tiny_config("shaw"), record, recipe_name=recipe_name)
    assert "No published checkpoint: hf_relpos publishes no trained weights of this" in card
    assert ("train them with the command above" in card) is (command is not None)
    if command is not None:
        assert command in card[card.index("## Training"):card.index("## Results")]
