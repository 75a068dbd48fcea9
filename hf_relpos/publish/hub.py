"""Model cards and Hugging Face Hub uploads for hf_relpos translation models.

    python -m hf_relpos.publish.hub render-cards configs/ --out model_cards/ \\
        --records docs/results/convergence/one_commit_seeds_1_2/convergence.json \\
        docs/results/vs_marian/recipes_one_commit/vs_marian.json \\
        docs/results/vs_marian/alibi_t5_equal_budget/vs_marian.json \\
        docs/results/convergence/seed_3_d34293a/convergence.json     # one card per recipe, with its measurements
    python -m hf_relpos.publish.hub push outputs/NAME USER/NAME      # a training run's folder, carded from its record
    python -m hf_relpos.publish.hub push FOLDER USER/NAME --recipe configs/NAME.yaml   # a folder without a record
    python -m hf_relpos.publish.hub push FOLDER USER/NAME --dry_run    # what would be pushed; no Hub call

`render_model_card` writes a README.md (YAML metadata that `huggingface_hub.ModelCard` parses, then the scheme, the
training recipe, the results, usage, limitations and BibTeX). `push_model_folder` uploads a saved model folder with
its card. `TranslationPipeline` restores `pipeline("translation")`, which transformers 5 removed: it ships with every
pushed model as `pipeline_relpos.py` (remote code). The model code never imports this module.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fnmatch
import importlib.metadata
import inspect
import json
import ntpath
import os
import posixpath
import shlex
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import yaml
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, EvalResult, HfApi, ModelCardData
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError
from huggingface_hub.repocard import metadata_load
from huggingface_hub.utils import HFValidationError, validate_repo_id
from packaging.requirements import Requirement
from safetensors import safe_open
from transformers.dynamic_module_utils import get_relative_import_files
from transformers.models.auto.tokenization_auto import tokenizer_class_from_name
from transformers.tokenization_utils_base import (
    ADDED_TOKENS_FILE,
    FULL_TOKENIZER_FILE,
    SPECIAL_TOKENS_MAP_FILE,
    TOKENIZER_CONFIG_FILE,
)
from transformers.utils import CONFIG_NAME, GENERATION_CONFIG_NAME, SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from ..model.configuration_relpos import RelPosTransformerConfig
from ..model.modeling_relpos import meta_model
from ..model.positions import PositionScheme, SchemeCard, get_scheme_class
from .files import (
    WeightsFileError,
    creation_error,
    expand_home,
    nearest_existing_folder,
    reading_weights,
    write_text_atomic,
)
from .pipeline_relpos import TranslationPipeline
from .records import (
    AVERAGED_CHECKPOINTS_FILE,
    CTRANSLATE2_EXPORT_RECORD,
    DATA,
    DECODING,
    OPTIMISATION,
    PACKAGE_CHECKOUT,
    RECIPE,
    RESULT_SPLITS,
    RESULTS_FILE,
    RUN_RECORD_FILE,
    SAMPLE_CAPS,
    SCHEME_FIELD,
    TRAINED_WEIGHTS,
    ConversionRecord,
    MeasuredScores,
    Measurement,
    RunRecord,
    accelerate_program,
    conversion_record,
    current_model_fields,
    load_card_recipe,
    read_run_records,
    runs_under_python,
    training_record,
)

LICENSE = "apache-2.0"   # hf_relpos' own: the license of a model trained from scratch with it
# The Hub's license id for a license given in the card's text, not by an id: a card names so weights whose license is
# not known (`weights_license`), and says so in its text (`source_license_sentence`).
OTHER_LICENSE = "other"
CARD_FILE = "README.md"
PIPELINE_FILE = "pipeline_relpos.py"
PIPELINE_TASK = "translation"
OPTIONAL_TOKENIZER_FILES = (SPECIAL_TOKENS_MAP_FILE, ADDED_TOKENS_FILE)
RECIPE_TEMPLATE_NAME = "REPO_ID"
# What a card shows for the folder of a local absolute path outside the run's working directory (`shown_path`).
LOCAL_PLACEHOLDER = "<local>"

# ISO 639-1 codes of languages machine translation commonly covers (WMT, FLORES), by the name a card gives them; other
# codes are shown as they are.
LANGUAGE_NAMES = {
    "ar": "Arabic", "bg": "Bulgarian", "bn": "Bengali", "ca": "Catalan", "cs": "Czech", "da": "Danish",
    "de": "German", "el": "Greek", "en": "English", "es": "Spanish", "et": "Estonian", "eu": "Basque",
    "fa": "Persian", "fi": "Finnish", "fr": "French", "ga": "Irish", "gu": "Gujarati", "he": "Hebrew", "hi": "Hindi",
    "hr": "Croatian", "hu": "Hungarian", "id": "Indonesian", "is": "Icelandic", "it": "Italian", "ja": "Japanese",
    "kk": "Kazakh", "km": "Khmer", "ko": "Korean", "lt": "Lithuanian", "lv": "Latvian", "ms": "Malay",
    "nb": "Norwegian Bokmål", "nl": "Dutch", "no": "Norwegian", "pl": "Polish", "ps": "Pashto", "pt": "Portuguese",
    "ro": "Romanian", "ru": "Russian", "sk": "Slovak", "sl": "Slovenian", "sr": "Serbian", "sv": "Swedish",
    "sw": "Swahili", "ta": "Tamil", "th": "Thai", "tr": "Turkish", "uk": "Ukrainian", "ur": "Urdu",
    "vi": "Vietnamese", "zh": "Chinese",
}
# Datasets the recipes use: a display name, what their validation/test splits are, and what a card's limitations
# section says about a model trained on them.
KNOWN_DATASETS = {
    "wmt/wmt14": {"title": "WMT14", "validation": "newstest2013", "test": "newstest2014"},
    "bentrevett/multi30k": {"title": "Multi30k", "validation": "validation", "test": "test2016 (Flickr)",
                            "limitation": "Multi30k holds short image captions; expect poor quality on news, dialogue "
                                          "or technical text."},
    "demo": {"title": "hf_relpos demo corpus",
             "limitation": "The demo corpus is a small generated German-like language, not real German."},
}
# The Transformer itself, cited by every card; each scheme's own citations come from its `SchemeCard`.
VASWANI_BIBTEX = """@inproceedings{vaswani2017attention,
  title     = {Attention Is All You Need},
  author    = {Vaswani, Ashish and Shazeer, Noam and Parmar, Niki and Uszkoreit, Jakob and Jones, Llion and
               Gomez, Aidan N. and Kaiser, {\\L}ukasz and Polosukhin, Illia},
  booktitle = {Advances in Neural Information Processing Systems},
  volume    = {30},
  year      = {2017}
}"""

class HubPushError(RuntimeError):
    """An upload to the Hub failed; the local folder was left as it was."""


def pipeline_source() -> str:
    """The flat `pipeline_relpos.py` that makes `pipeline("translation", trust_remote_code=True)` work."""
    return Path(__file__).with_name(PIPELINE_FILE).read_text(encoding="utf-8")


def with_translation_pipeline(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config.json dict that declares `TranslationPipeline` (from `pipeline_relpos.py`) for the translation task."""
    entry = {"impl": f"{Path(PIPELINE_FILE).stem}.{TranslationPipeline.__name__}", "pt": ["AutoModelForSeq2SeqLM"],
             "type": "text"}
    return {**config, "custom_pipelines": {**config.get("custom_pipelines", {}), PIPELINE_TASK: entry}}


def add_translation_pipeline(folder: str | os.PathLike) -> None:
    """Write `pipeline_relpos.py` into a saved model folder and declare it in its config.json, so that
    `pipeline("translation", model=folder, trust_remote_code=True)` translates."""
    folder = Path(folder)
    config = json.loads((folder / CONFIG_NAME).read_text(encoding="utf-8"))
    config_text = _config_json(with_translation_pipeline(config))
    _write_files(folder, {PIPELINE_FILE: pipeline_source(), CONFIG_NAME: config_text})


# --------------------------------------------------------------------------------------------------- model cards

def config_from_recipe(recipe: Mapping[str, Any]) -> RelPosTransformerConfig:
    """The model config a recipe trains (the vocabulary size is the tokenizer's, taken from the recipe)."""
    return RelPosTransformerConfig(**recipe.get("model", {}), vocab_size=recipe.get("tokenizer_vocab_size", 8000))


def read_experiment_record(path: str | os.PathLike) -> tuple[list[RunRecord], list[str]]:
    """The runs of an experiment record (its .json) and the paragraphs of its Markdown report beside it (the same
    name, .md); ValueError naming the file when either is missing or the JSON does not parse or is no record."""
    path = Path(path)
    if path.suffix != ".json":
        raise ValueError(f"records {str(path)!r}: an experiment record is the .json file that experiments/ writes "
                         "(with its .md report beside it)")
    report = path.with_suffix(".md")
    for needed in (path, report):
        if not needed.is_file():
            raise ValueError(f"records {str(path)!r}: no file {str(needed)!r}" + (
                "" if needed == path else " (the record's report, whose title and setup the card cites)"))
    try:
        runs = read_run_records(path)
    except ValueError as error:   # json.JSONDecodeError is one
        what = f"not valid JSON ({error})" if isinstance(error, json.JSONDecodeError) else str(error)
        raise ValueError(f"records {str(path)!r}: {what}") from None
    return runs, report.read_text(encoding="utf-8").split("\n\n")


def measurements_from_record(path: str | os.PathLike, recipe_name: str, record: RunRecord) -> list[Measurement]:
    """The runs that trained the recipe `recipe_name` (a configs/ file stem) in a committed experiment record (the
    JSON that experiments/vs_marian.py or experiments/convergence.py writes, with its Markdown report beside it), one
    `Measurement` per system of the record; `record` is the recipe's own (for its dataset, batch and scheme). A
    peer's run trained from the recipe's settings is not the recipe's (`RunRecord.role`), nor is a run of the recipe
    that swapped its position scheme for another."""
    path = Path(path)
    runs_of_record, report = read_experiment_record(path)
    scheme = record.model.get(SCHEME_FIELD)
    shown = shown_record(record)   # the labels name its files as its card does
    systems: dict[str, list[RunRecord]] = {}
    for run in runs_of_record:
        if run.role == RECIPE and run.recipe == recipe_name and run.model.get(SCHEME_FIELD, scheme) == scheme:
            systems.setdefault(run.system, []).append(run)
    measurements = []
    for runs in systems.values():
        first = runs[0]
        weights = sorted(first.scores, key=lambda name: name != "averaged")
        scores = []
        for weight in weights:
            for split in ("test", "validation"):
                per_seed = [run.scores[weight][split] for run in runs]
                label = _split_title(shown, split) + _measured_slice(runs, split) + {
                    "averaged": f", average of the last {first.average_checkpoints} checkpoints",
                    "final": ", final weights", TRAINED_WEIGHTS: ""}.get(weight, f", {weight}")
                scores.append(MeasuredScores(label, tuple(score.bleu for score in per_seed),
                                             tuple(score.chrf for score in per_seed), per_seed[0].bleu_signature))
        measurements.append(Measurement(
            record=shown_path(path.as_posix(), str(PACKAGE_CHECKOUT)), title=report[0].removeprefix("# ").strip(),
            setup=" ".join(report[1].split()),
            trained_as=shown_record(first).trained_as,
            code=", ".join(sorted({run.source_version or "not recorded" for run in runs})),
            seeds=tuple(run.seed for run in runs), steps=tuple(run.steps for run in runs),
            hardware=first.hardware, devices=first.devices, batch=_update_size(first, record),
            training_minutes=tuple(run.training_seconds / 60 for run in runs),
            date=max(run.date or "" for run in runs)[:10],
            scores=tuple(scores)))
    return measurements


def _measured_slice(runs: Sequence[RunRecord], split: str) -> str:
    """", first N pairs" where the runs scored `split` on its first N pairs only (`max_eval_samples`,
    `max_predict_samples`; a record holds no count of the pairs scored, so a cap is taken to have cut the split);
    "" where none was capped."""
    caps = {getattr(run, SAMPLE_CAPS[split]) for run in runs}
    capped = sorted(cap for cap in caps if cap is not None)
    if not capped:
        return ""
    return f", first {' / '.join(map(str, capped))} pairs" + (" in some runs" if len(caps) > len(capped) or
                                                               len(capped) > 1 else "")


def _update_size(run: RunRecord, recipe: RunRecord) -> str:
    """What one update of `run` held: its token budget, else its pairs per device (the recipe's where the run did
    not record them)."""
    pairs = run.per_device_train_batch_size or recipe.per_device_train_batch_size
    return _batch_sentence(run.max_tokens_per_batch, pairs, run.gradient_accumulation_steps or 1, run.devices)


def _batch_sentence(tokens: int | None, pairs: int | None, accumulation: int, devices: int | None) -> str:
    """Effective batch = per-device batch x devices x gradient accumulation, in tokens or in pairs."""
    per_device, unit = (tokens, "tokens (padded, on the source and on the target side each)") if tokens else (
        pairs, "sentence pairs")
    if per_device is None:
        return ""
    if devices is None:
        return (f"{per_device * accumulation} {unit} per update and device ({per_device} per step x {accumulation} "
                "accumulation step(s)), times the number of devices")
    return (f"{per_device * devices * accumulation} {unit} per update ({per_device} per device and step x "
            f"{devices} device(s) x {accumulation} accumulation step(s))")


def load_results(folder: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """The `{eval,test}_results.json` files that train_translation.py wrote into `folder`, by prefix."""
    results = {}
    for prefix in RESULT_SPLITS:
        path = Path(folder) / RESULTS_FILE.format(prefix=prefix)
        if path.is_file():
            results[prefix] = json.loads(path.read_text(encoding="utf-8"))
    return results


def render_model_card(
    config: RelPosTransformerConfig | Mapping[str, Any],
    record: RunRecord | Mapping[str, Any] | None = None,
    results: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    repo_id: str | None = None,
    recipe_name: str | None = None,
    published: bool = False,
    unscored: str | None = None,
    name: str | None = None,
    without_run_record: bool = False,
    recipe_command: str | None = None,
    conversion: ConversionRecord | None = None,
) -> str:
    """The README.md of a model: YAML metadata (with a model-index when `results` hold BLEU scores) and the body.

    `config` is the model's config (or its config.json dict), `record` the run (`RunRecord`, or a configs/*.yaml dict
    read with `RunRecord.from_recipe`; None: not recorded), `results` maps "eval"/"test" to the dicts of
    `{eval,test}_results.json`; `published`: the card goes with the trained weights to the Hub repository `repo_id`;
    `unscored`: what the Results section says when it has no scores, in place of its own sentence; `name`: the
    model's name in the title and model-index (default: `repo_id`'s, else the recipe's); `without_run_record`: the card
    is of trained weights saved without the record of the run that trained them (a model folder without
    run_record.json), so `record`, if given, is the recipe named `recipe_name` given for them: the card shows its
    settings and says that how the weights were trained is not known, with no training command, and without scores
    it says none were saved with the weights (never that they were not trained); `recipe_command`: the command that
    trains a recipe card's recipe (default: the repository's `python train_translation.py configs/<recipe_name>.yaml`);
    `conversion`: the pretrained model the weights were converted from, or the run started from a conversion of
    (`model_conversion`): a Conversion section names it, and the metadata's `base_model` where it is on the Hub. The
    license is the weights' (`weights_license`): of a run fine-tuned from another model (`fine_tuned_base`), that
    model's, which a paragraph after the title names.

    A card goes to the Hub: every section reads `shown_record(record)`, whose local paths are shown without the
    machine's folders, never the record as typed; the one fact decided from the real paths, whether the run's data is
    a Hub dataset (`_on_hub`), is decided before and handed to the sections that need it.
    """
    if isinstance(config, Mapping):
        config = RelPosTransformerConfig.from_dict(dict(config))
    recorded = record is not None
    if not isinstance(record, RunRecord):
        record = RunRecord.from_recipe(record or {})
    on_hub = _on_hub(record)   # the facts decided from the real paths, before they are shown
    base = fine_tuned_base(record, conversion) if recorded and not without_run_record else None
    base_model = _hub_base_model(record) or (conversion.source if conversion and conversion.source_on_hub else None)
    record = shown_record(record)   # every section reads the record with its paths shown, never the real one
    # evaluated without generating (predict_with_generate false): losses, no BLEU
    losses = {prefix: dict(values) for prefix, values in (results or {}).items()
              if f"{prefix}_bleu" not in values and f"{prefix}_loss" in values}
    results = {prefix: dict(values) for prefix, values in (results or {}).items() if f"{prefix}_bleu" in values}
    recipe_name = recipe_name or record.recipe
    model_name = (name or repo_id or recipe_name or f"relpos-{config.position_scheme}").split("/")[-1]
    metadata = _card_metadata(config, record, results, model_name, recorded, on_hub, base_model,
                              weights_license(conversion, base))
    # saved weights were trained, whether or not a record says how; a recipe is trained where a run of it is recorded
    trained = without_run_record or (recorded and (bool(results) or record.training_seconds is not None))
    if unscored is None and without_run_record:
        unscored = "Not measured: no scores were saved with these weights."
    sections = [
        _title_section(config, record if recorded else None, model_name, recipe_name),
        *([_conversion_section(conversion, fine_tuned=recorded and not without_run_record)] if conversion else []),
        *([base_license_sentence(base)] if base else []),
        _scheme_section(config),
        _architecture_section(config),
        _training_section(config, record if recorded else None, on_hub, recipe_name, without_run_record,
                          recipe_command),
        _results_section(record, results, trained=trained, published_as=repo_id if published else None,
                         unscored=unscored, losses=losses, shows_command=_training_command(
                             record if recorded else None, recipe_name, without_run_record, recipe_command) is not None),
        _usage_section(repo_id or RECIPE_TEMPLATE_NAME, record.source_lang if recorded else None,
                       get_scheme_class(config.position_scheme)),
        _limitations_section(config, record, recorded),
        _citation_section(config),
    ]
    return f"---\n{metadata.to_yaml()}\n---\n\n" + "\n\n".join(sections) + "\n"


def _card_metadata(config: RelPosTransformerConfig, record: RunRecord, results: dict, model_name: str,
                   recorded: bool, on_hub: bool, base_model: str | None = None,
                   license: str = LICENSE) -> ModelCardData:
    """The card's YAML metadata; its languages only from a recorded run (a model without one names none); a Hub
    dataset named where the run's data is one (`on_hub`, `_on_hub` of the real record); `base_model`, the Hub model
    the run was fine-tuned from (`_hub_base_model` of the real record), which the Hub links in the model tree;
    `license`, the weights' (`weights_license`)."""
    scheme = config.position_scheme
    tags = ["translation", *_scheme_card(config).tags, scheme, "hf_relpos"]
    source, target = record.source_lang, record.target_lang
    eval_results = []
    for prefix, values in results.items():
        split = RESULT_SPLITS[prefix]
        common = {
            "task_type": "translation",
            "task_name": f"Translation {source}-{target}",
            "dataset_type": record.dataset_name if on_hub else "custom",
            "dataset_name": _scored_set_title(record, prefix, values),
            "dataset_config": record.dataset_config_name if on_hub else None,
            "dataset_split": _split_name(record, split) if on_hub else split,
        }
        cap = _sample_cap(record, prefix, values)
        if cap is not None:   # datasets' slice syntax: the split's first `cap` pairs
            common["dataset_split"] += f"[:{cap}]"
        eval_results.append(EvalResult(**common, metric_type="sacrebleu", metric_name="sacreBLEU",
                                       metric_value=round(values[f"{prefix}_bleu"], 2),
                                       metric_args={"signature": values.get(f"{prefix}_bleu_signature")}))
        if f"{prefix}_chrf" in values:
            eval_results.append(EvalResult(**common, metric_type="chrf", metric_name="chrF",
                                           metric_value=round(values[f"{prefix}_chrf"], 2),
                                           metric_args={"signature": values.get(f"{prefix}_chrf_signature")}))
    return ModelCardData(
        language=[source, target] if recorded else None,
        license=license,
        library_name="transformers",
        pipeline_tag="translation",
        base_model=base_model,
        tags=tags,
        datasets=[record.dataset_name] if on_hub else None,
        metrics=["sacrebleu", "chrf"],
        model_name=model_name,
        eval_results=eval_results or None,
    )


def _sample_cap(record: RunRecord, prefix: str, values: Mapping[str, Any]) -> int | None:
    """The N of `max_eval_samples` / `max_predict_samples` where the run scored the first N pairs of the split of
    `prefix` ("eval", "test") only, as its results say (`{prefix}_samples`; a split of at most N pairs is whole)."""
    cap = getattr(record, SAMPLE_CAPS[RESULT_SPLITS[prefix]])
    count = values.get(f"{prefix}_samples")
    return cap if cap is not None and (count is None or count >= cap) else None


def _scored_set_title(record: RunRecord, prefix: str, values: Mapping[str, Any]) -> str:
    """What the scores of `prefix` were computed on: the split's title, with the first N pairs where the run capped
    it (the WMT14 recipes' `max_eval_samples: 1000`: a slice of newstest2013, not newstest2013)."""
    title = _split_title(record, RESULT_SPLITS[prefix])
    cap = _sample_cap(record, prefix, values)
    return title if cap is None else f"{title}, first {cap} pairs"


def _split_name(record: RunRecord, split: str) -> str:
    return record.validation_split_name if split == "validation" else record.test_split_name


def _uses_local_files(record: RunRecord) -> bool:
    return any((record.train_file, record.validation_file, record.test_file))


def _on_hub(record: RunRecord) -> bool:
    """Whether the run's data is a Hub dataset: a dataset_name that is neither the demo corpus nor an existing local
    path (as `load_dataset` read it, from the folder the run was started in: `wmt16` is a Hub id too) nor an absolute
    one (a folder of the machine that trained it, which the one pushing it may lack), and no local files. `record` is
    the real one, not `shown_record`'s: `<local>/NAME` would pass for a Hub id, and a path shown relative to the
    run's folder would be looked for in the folder the card is written in."""
    name = record.dataset_name
    return (name not in (None, "demo") and not os.path.exists(os.path.join(record.working_directory or "", name))
            and shown_path(name) == name and not _uses_local_files(record))   # shown as it is: not absolute


def _hub_base_model(record: RunRecord) -> str | None:
    """The Hub model id the run was fine-tuned from: its `model_name_or_path` where that is a repository id
    (`validate_repo_id`) and, as `_on_hub` decides for data, neither an existing local path (from the folder the run
    was started in) nor an absolute one; else None (trained from scratch, or from a local folder, which the Hub
    cannot link). `record` is the real one, not `shown_record`'s."""
    name = record.model_name_or_path
    if name is None or os.path.exists(os.path.join(record.working_directory or "", name)) or shown_path(name) != name:
        return None
    try:
        validate_repo_id(name)
    except HFValidationError:
        return None
    return name


def primary_subtag(code: str) -> str:
    """The language of a language code without its script or region subtags, lower-cased: zh of zh, zh-CN and
    zh_Hans; "" for no language."""
    return code.replace("_", "-").split("-")[0].lower()


def language_name(code: str) -> str:
    """The English name of a language code, by its primary subtag where it has more (zh-Hans, pt_BR: Chinese,
    Portuguese); the code itself where it is unknown."""
    return LANGUAGE_NAMES.get(code) or LANGUAGE_NAMES.get(primary_subtag(code), code)


def _dataset_title(record: RunRecord) -> str:
    if _uses_local_files(record):
        return "local parallel files"
    return KNOWN_DATASETS.get(record.dataset_name, {}).get("title", record.dataset_name or "unrecorded data")


def _split_title(record: RunRecord, split: str) -> str:
    if _uses_local_files(record):
        return Path((record.validation_file if split == "validation" else record.test_file) or split).name
    known = KNOWN_DATASETS.get(record.dataset_name, {})
    return f"{_dataset_title(record)} {known.get(split, split)}"


def _title_section(config: RelPosTransformerConfig, record: RunRecord | None, model_name: str,
                   recipe_name: str | None) -> str:
    scheme = _scheme_card(config).title
    languages = f"{language_name(record.source_lang)}→{language_name(record.target_lang)} " if record else ""
    trained_on = ""
    if record:   # a fine-tuned model says what it started from, not only what this run trained it on
        start = f"fine-tuned from `{record.model_name_or_path}` on" if record.model_name_or_path else "trained on"
        trained_on = f", {start} {_dataset_title(record)}"
    origin = f" with the `{recipe_name}` recipe" if recipe_name else ""
    return (
        f"# {model_name}\n\n"
        f"An encoder-decoder Transformer for {languages}translation whose self-attention "
        f"uses {scheme}{trained_on}. It was built with hf_relpos (`position_scheme: {config.position_scheme}`)"
        f"{origin}: a Hugging Face `PreTrainedModel` + `GenerationMixin` that loads with "
        "`from_pretrained`, generates with a KV cache and is stored as safetensors."
    )


def _conversion_section(conversion: ConversionRecord, fine_tuned: bool) -> str:
    """Which pretrained model the weights come from and what the conversion changed (docs/conversion.md's three
    ways: the same model, the hybrid, a switch of positions); `fine_tuned`: the run fine-tuned a conversion."""
    source, scheme = shown_path(conversion.source), conversion.position_scheme
    settings = [f"`position_scheme: {scheme}`", *(["`keep_absolute_positions: true`"]
                                                  if conversion.keep_absolute_positions else []),
                *(f"`{name}: {value}`" for name, value in conversion.settings.items())]
    if conversion.reproduces_source and not conversion.keep_absolute_positions:
        change = "the converted model is the source model, with its logits and translations"
    elif conversion.reproduces_source:
        change = (f"it keeps the source's sinusoidal positions and adds the `{scheme}` scheme's terms, which started "
                  "neutral: at conversion it gave the source's logits and translations")
    else:
        change = (f"the `{scheme}` scheme replaced the source's sinusoidal positions, its terms starting neutral: at "
                  "conversion it was the source model without its absolute positions")
    start = "The fine-tuning started from" if fine_tuned else "These weights are"
    return (f"## Conversion\n\n{start} the {conversion.architecture} model `{source}`, converted to hf_relpos by "
            f"`hf-relpos-convert {conversion.source_type}` ({', '.join(settings)}): {change}. "
            f"{source_license_sentence(conversion)}")


def weights_license(conversion: ConversionRecord | None, base: FineTunedBase | None = None) -> str:
    """The license id a card's metadata gives weights: hf_relpos' own (`LICENSE`) for a model trained from scratch;
    for weights converted from a pretrained model, or fine-tuned from such a conversion, the source's license
    (`ConversionRecord.source_license`); for weights fine-tuned from another model (`base`, `fine_tuned_base`), the
    license its model card gives. `OTHER_LICENSE` where it is not known (never hf_relpos' own: the weights are not
    hf_relpos' alone)."""
    if conversion is not None:
        return conversion.source_license or OTHER_LICENSE
    if base is not None:
        return base.license or OTHER_LICENSE
    return LICENSE


def source_license_sentence(conversion: ConversionRecord) -> str:
    """What a card's text says of the license of weights derived from the conversion's source: the license its model
    card gave, which the metadata carries (`weights_license`), or that none is known."""
    source = shown_path(conversion.source)
    if conversion.source_license:
        return (f"The weights derive from `{source}`, whose model card gives its license as "
                f"`{conversion.source_license}`: that license and the source's terms of use apply to them.")
    return (f"The weights derive from `{source}`, whose license is not known (the conversion found none in its model "
            f"card's metadata; the metadata here says `license: {OTHER_LICENSE}`): the source's license and terms of "
            "use apply to them, so check them before using or sharing these weights.")


@dataclasses.dataclass(frozen=True)
class FineTunedBase:
    """The model a run fine-tuned where it is no conversion: `name`, its `model_name_or_path` as recorded; `on_hub`,
    whether that is a Hub model id (`_hub_base_model`); `license`, the license id its model card's metadata gives,
    None where not known (a Hub model's card is not read here: that needs the network)."""

    name: str
    on_hub: bool
    license: str | None


def fine_tuned_base(run: RunRecord | None, conversion: ConversionRecord | None) -> FineTunedBase | None:
    """The model `run` fine-tuned, whose license the weights carry, where they derive from no conversion
    (`conversion`, `model_conversion`'s, names the source then): a local folder's license is the one its README.md
    gives (`card_license`; from the folder the run was started in). None for weights trained from scratch."""
    if conversion is not None or run is None or run.model_name_or_path is None:
        return None
    if _hub_base_model(run) is not None:
        return FineTunedBase(run.model_name_or_path, on_hub=True, license=None)
    card = Path(run.working_directory or "", run.model_name_or_path, CARD_FILE)
    return FineTunedBase(run.model_name_or_path, on_hub=False,
                         license=card_license(card, run.model_name_or_path) if card.is_file() else None)


def base_license_sentence(base: FineTunedBase) -> str:
    """What a card's text says of the license of weights fine-tuned from `base`, which the metadata carries
    (`weights_license`)."""
    name = shown_path(base.name)
    if base.license:
        return (f"The weights were fine-tuned from `{name}`, whose model card gives its license as `{base.license}`: "
                f"that license and the terms of use of `{name}` apply to them.")
    known_by = ("the Hub model's card gives it, which this card was written without reading" if base.on_hub else
                f"its folder has no {CARD_FILE} whose metadata names one")
    return (f"The weights were fine-tuned from `{name}`, whose license and terms of use apply to them ({known_by}; "
            f"the metadata here says `license: {OTHER_LICENSE}`): check them before using or sharing these weights.")


def card_license(card: Path, source: str) -> str | None:
    """The license the model card `card` (a README.md) of the model `source` gives in its YAML metadata (`license:`,
    a Hub license id such as cc-by-4.0); None where it names none. Metadata that cannot be read, or a `license` that
    is not one id, is a ValueError naming `source`."""
    try:
        metadata = metadata_load(card) or {}
    except (yaml.YAMLError, ValueError) as error:
        raise ValueError(f"{source}: the YAML metadata of its model card ({CARD_FILE}) cannot be read, so neither can "
                         f"its license: {error}") from None
    license = metadata.get("license")
    if license is not None and not (isinstance(license, str) and license.strip()):
        raise ValueError(f"{source}: the license in its model card's metadata must be one license id (e.g. "
                         f"cc-by-4.0), got {license!r}")
    return license.strip() if license is not None else None


def _scheme_card(config: RelPosTransformerConfig) -> SchemeCard:
    """The scheme's own card text, or a generic one for a scheme registered without it."""
    scheme_class = get_scheme_class(config.position_scheme)
    if scheme_class.card is not None:
        return scheme_class.card
    return SchemeCard(title=f"the `{config.position_scheme}` position scheme")


def _is_packaged(scheme_class: type[PositionScheme]) -> bool:
    """Whether the scheme ships with hf_relpos (and so with a saved model's remote code)."""
    return scheme_class.__module__.split(".")[0] in (PositionScheme.__module__.split(".")[0], "transformers_modules")


def _scheme_section(config: RelPosTransformerConfig) -> str:
    scheme_class = get_scheme_class(config.position_scheme)
    parts = [_scheme_card(config).describe(config)]
    if scheme_class.config_fields:
        rows = [(f"`{field.name}`" + (f" ({field.symbol})" if field.symbol else ""), getattr(config, field.name),
                 field.help) for field in scheme_class.config_fields]
        parts.append(_table(("setting", "value", "meaning"), rows))
    if not _is_packaged(scheme_class):
        parts.append(f"`{config.position_scheme}` is a scheme registered with `hf_relpos.register_position_scheme` "
                     f"(`{scheme_class.__module__}.{scheme_class.__qualname__}`), not one of hf_relpos' own: this model "
                     "loads only where hf_relpos is installed and the module that registers the scheme has been "
                     "imported before `from_pretrained` or `pipeline` (the remote code stored with the model holds "
                     "hf_relpos' own schemes only).")
    if config.layer_norm_position == "pre":
        norm = "Pre-LN blocks: LayerNorm before each sub-layer, x + Sublayer(LayerNorm(x)) (Xiong et al. 2020)."
    else:
        norm = "Post-LN blocks: LayerNorm(x + Sublayer(x)) after each sub-layer (Vaswani et al. 2017)."
    body = "\n\n".join(part for part in parts if part)
    return (
        f"## Position scheme: `{config.position_scheme}`\n\n{body}\n\n"
        "Positions enter self-attention only (encoder and decoder); cross-attention has no position term, as in Shaw "
        f"et al. (2018). {norm}"
    )


def _architecture_section(config: RelPosTransformerConfig) -> str:
    parameters = meta_model(config).num_parameters()
    rows = [
        ("parameters", f"{parameters / 1e6:.1f}M" if round(parameters / 1e6, 1) else f"{parameters:,}"),   # no 0.0M
        ("`d_model`", config.d_model),
        ("layers (encoder / decoder)", f"{config.encoder_layers} / {config.decoder_layers}"),
        ("attention heads (encoder / decoder)", f"{config.encoder_attention_heads} / {config.decoder_attention_heads}"),
        ("feed-forward size (encoder / decoder)", f"{config.encoder_ffn_dim} / {config.decoder_ffn_dim}"),
        ("activation", config.activation_function),
        ("`layer_norm_position`", config.layer_norm_position),
        ("dropout / attention / activation dropout",
         f"{config.dropout} / {config.attention_dropout}"
         f"{' (keys dropped before the softmax)' if config.attention_dropout_kind == 'keys' else ''}"
         f" / {config.activation_dropout}"),
        ("self-attention window", "the whole sequence" if config.self_attention_window is None
         else f"keys within {config.self_attention_window} positions of the query"),
        ("cross-attention logits", "times log(source length)" if config.cross_attention_length_scaling else "unscaled"),
        ("embeddings scaled by √d_model", config.scale_embedding),
        ("token embeddings at initialisation", "N(0, d_model^-0.5)" if config.embedding_init_std is None
         else f"N(0, {config.embedding_init_std})"),
        ("tied source, target and output embeddings", config.tie_word_embeddings),
        ("vocabulary", config.vocab_size),
    ]
    if config.keep_absolute_positions:
        scale = config.absolute_positions_scale
        rows.append(("`keep_absolute_positions`", "sinusoidal absolute positions added to the embeddings as well" +
                     ("" if scale == 1.0 else f", times {scale:g} (`absolute_positions_scale`)")))
    return "## Architecture\n\n" + _table(("", "value"), rows)


def _training_section(config: RelPosTransformerConfig, record: RunRecord | None, on_hub: bool,
                      recipe_name: str | None, without_run_record: bool = False,
                      recipe_command: str | None = None) -> str:
    """`record` with its paths shown (`shown_record`), `on_hub` as `_on_hub` decided it from the real one."""
    if record is None:
        return "## Training\n\nThe training recipe was not recorded with this model."
    # a run says how it trained (the program it was started by, its recipe file and flags; not the folder it was
    # started in, which run_record.json keeps: a card goes to the Hub, local paths stay here, and `shown_record`
    # shows its absolute paths relative to that folder or as <local>/NAME); a recipe card names its configs/ file;
    # weights without their run's record name the recipe given for them (any file: no command of ours trains them),
    # and no more
    given = None
    if without_run_record:
        given = ("These weights were saved without the record of the run that trained them "
                 f"(`{RUN_RECORD_FILE}`), so how they were trained (command, data read, hardware, time) is not known. "
                 "What follows is the recipe given for them when this card was written"
                 + (f" (`{recipe_name}`)." if recipe_name else "."))
    command = _training_command(record, recipe_name, without_run_record, recipe_command)
    source, target = record.source_lang, record.target_lang
    data_fields = RunRecord.recipe_fields(DATA)
    unread = set() if on_hub else {   # the data table lists what the run read: no dataset it did not load
        "dataset_config_name", *(["dataset_name"] if _uses_local_files(record) else [])}
    if _reuses_tokenizer(record):   # no tokenizer trained: the settings a new one would have asked for (in records
        # written before run_record left them out) do not apply
        unread.update(("tokenizer_vocab_size", "tokenizer_character_coverage"))
    data_fields = tuple(name for name in data_fields if name not in unread)
    run_facts = _run_facts(record)
    lines = [
        "## Training",
        "",
        *([given, ""] if given else []),
        f"Data: {_dataset_title(record)}, {language_name(source)} (`{source}`) → {language_name(target)} (`{target}`). "
        + _tokenizer_sentence(config, record),
        "",
        *([command, ""] if command else []),
        _record_table("Data", record, data_fields),
        "",
        _record_table("Optimisation", record, RunRecord.recipe_fields(OPTIMISATION)),
        "",
        _record_table("Decoding for evaluation", record, RunRecord.recipe_fields(DECODING)),
        "",
        "Each output has at most `generation_max_length_ratio` (1 unless set) x its source's tokens + "
        "`generation_max_length_offset` new tokens (fairseq's max_len_a / max_len_b; Vaswani et al.: input length + "
        "50), saved in generation_config.json so that generate() and the pipeline apply it to every input. "
        "`max_tokens_per_batch` is the token budget per device and step (padded, "
        "on the source and on the target side each).",
        *(["", run_facts] if run_facts else []),
    ]
    return "\n".join(lines)


def _training_command(record: RunRecord | None, recipe_name: str | None, without_run_record: bool = False,
                      recipe_command: str | None = None) -> str | None:
    """The Training section's command line: how the run was started ("Trained as"), else the command that trains the
    recipe; None where the card shows none (no record, weights saved without their run's record, an unnamed recipe)."""
    if record is None or without_run_record:
        return None
    if record.trained_as:
        resumed = f", resumed from `{record.resumed_from}`" if record.resumed_from else ""
        return f"Trained as: `{_launch_command(record)} {record.trained_as}`{resumed}"
    if recipe_command:
        return f"Command: `{recipe_command}`"
    return (f"Command (from the hf_relpos repository): `python train_translation.py configs/{recipe_name}.yaml`"
            if recipe_name else None)


def shown_path(value: str, working_directory: str | None = None) -> str:
    """A local path as a card shows it (a card goes to the Hub; run_record.json, the local record, keeps the path as
    typed): an absolute path under `working_directory` (where the run was started) relative to it, as the run's
    command is run again from that folder ("." for the folder itself); any other absolute path (or one from the home
    folder, `~`) as `LOCAL_PLACEHOLDER` and its file name, `<local>/train.jsonl`, which names the file without the
    machine's folders; a relative path, or anything else, as it is. A Windows path (`C:\\...`, `\\\\server\\share\\...`)
    follows the same rule against a Windows working directory (as Windows compares paths: in any case), its relative
    path shown with `/`."""
    windows = PureWindowsPath(value)
    if windows.drive and windows.is_absolute():
        path, base = PureWindowsPath(ntpath.normpath(value)), PureWindowsPath(ntpath.normpath(working_directory or ""))
        if base.drive and base.is_absolute() and path.is_relative_to(base):
            return path.relative_to(base).as_posix()
        return f"{LOCAL_PLACEHOLDER}/{path.name}".rstrip("/")
    if value.startswith("~"):
        return f"{LOCAL_PLACEHOLDER}/{PurePosixPath(value).name}".rstrip("/")
    if not value.startswith("/"):
        return value
    path = PurePosixPath(posixpath.normpath(value))
    if working_directory and path.is_relative_to(posixpath.normpath(working_directory)):
        return str(path.relative_to(posixpath.normpath(working_directory)))
    return f"{LOCAL_PLACEHOLDER}/{path.name}".rstrip("/")


def shown_command(command: str, working_directory: str | None = None) -> str:
    """A recorded command line (`RunRecord.trained_as`) with each local path in it, a word or a `--flag=PATH`
    value, as `shown_path` shows it, quoted as a shell reads it (a placeholder too: `'<local>/train.jsonl'`); a command
    without absolute paths as it was recorded."""
    try:
        words = shlex.split(command)
    except ValueError:   # unbalanced quotes: not a command line shlex wrote
        return " ".join(_shown_word(word, working_directory) for word in command.split())
    shown = [_shown_word(word, working_directory) for word in words]
    return command if shown == words else shlex.join(shown)


def _shown_word(word: str, working_directory: str | None) -> str:
    flag, equals, value = word.partition("=")
    if equals and flag.startswith("-"):
        return f"{flag}={shown_path(value, working_directory)}"
    return shown_path(word, working_directory)


def shown_record(record: RunRecord) -> RunRecord:
    """`record` as a card and a folder meant for sharing hold it (`render_model_card` renders every section from it; a
    CTranslate2 export's run_record.json; run_record.json in the run's own folder, the local record, keeps its paths
    as typed): each local path as a card shows it (`shown_path`: the data files, a model or tokenizer reused, a local
    dataset, the program, the checkpoint resumed from, each split's prepared-data folder; the command by
    `shown_command`), relative to the folder the run was started in, which is left out. Left as they are: `model`
    (config fields, no paths), `hub_model_id` (a Hub repository id) and `measurements` (`measurements_from_record`
    shows their paths against their own bases, the record file against this checkout and each command against its
    run's folder, which this record does not hold)."""
    where = record.working_directory
    recipe = {name: shown_path(value, where) for name in RunRecord.recipe_fields()
              if isinstance(value := getattr(record, name), str)}
    prepared = {split: {**source, "folder": shown_path(source["folder"], where)}
                if isinstance(source.get("folder"), str) else dict(source)
                for split, source in record.prepared_from.items()}
    return dataclasses.replace(
        record, **recipe, prepared_from=prepared, working_directory=None,
        trained_as=record.trained_as and shown_command(record.trained_as, where),
        program=record.program and shown_path(record.program, where),
        resumed_from=record.resumed_from and shown_path(record.resumed_from, where))


def _launch_command(record: RunRecord) -> str:
    """The command a run was started with, as typed (`record`'s paths as `shown_record` shows them): a script or `-m
    MODULE` after `python`, a console script by its name (runs recorded without their program were started as
    train_translation.py). A run of N > 1 processes was started by `accelerate launch` as docs/training.md documents
    data parallelism: `fsdp.yaml` for a sharded run, else the DDP config of its hardware (`cpu_2proc.yaml` on CPUs,
    `multi_gpu.yaml` else) with `--num_processes N`, then the program (a console script after `--no_python`); its
    flags (`--use_cpu true` on CPUs) follow in `trained_as`."""
    program = record.program or "train_translation.py"
    # a script by its path as a shell reads it (`<local>/train_translation.py` quoted, as `trained_as` quotes its own)
    shown = program if program.startswith("-m ") else shlex.quote(program)
    if (record.devices or 1) == 1:
        return f"python {shown}" if runs_under_python(program) else shown
    if record.sharded:
        config = "fsdp"
    else:
        config = "cpu_2proc" if (record.hardware or "").startswith("CPU") else "multi_gpu"
    return (f"accelerate launch --config_file configs/accelerate/{config}.yaml --num_processes {record.devices} "
            f"{accelerate_program(program).removesuffix(program)}{shown}")


def _run_facts(record: RunRecord) -> str:
    """Effective batch, hardware, the step (and for a run counted in epochs, the epoch) a run ended at when it ended
    before its `max_steps` or `num_train_epochs` (early stopping: the Optimisation table names what was asked for) and
    training time, where known."""
    accumulation = record.gradient_accumulation_steps or 1
    batch = _batch_sentence(record.max_tokens_per_batch, record.per_device_train_batch_size, accumulation,
                            record.devices)
    facts = [f"Effective batch: {batch}."] if batch else []
    if record.hardware:
        facts.append(f"Hardware: {record.hardware}" + (f", {record.devices} process(es)." if record.devices else "."))
    cause = ", stopped by early stopping (`early_stopping_patience`)" if record.early_stopping_patience else ""
    if record.steps is not None and (record.max_steps or 0) > 0 and record.steps < record.max_steps:
        facts.append(f"Training ended at step {record.steps} of `max_steps` {record.max_steps}{cause}.")
    elif (record.steps is not None and record.epochs is not None and record.num_train_epochs is not None
          and record.epochs < record.num_train_epochs):
        facts.append(f"Training ended at step {record.steps}, epoch {record.epochs:g} of `num_train_epochs` "
                     f"{record.num_train_epochs:g}{cause}.")
    if record.training_seconds is not None:
        segment = (f" (the segment resumed from `{record.resumed_from}`; the time before it is not recorded)"
                   if record.resumed_from else "")
        minutes = record.training_seconds / 60
        duration = f"{minutes:.1f} minutes" if round(minutes, 1) else f"{record.training_seconds:.1f} seconds"   # no 0.0
        facts.append(f"Training time: {duration}{segment}.")
    return " ".join(facts)


def _reuses_tokenizer(record: RunRecord) -> bool:
    return bool(record.tokenizer_name or record.model_name_or_path)


def _tokenizer_sentence(config: RelPosTransformerConfig, record: RunRecord) -> str:
    """How the run got its tokenizer; the vocabulary size is the model's (a corpus may give fewer pieces than the
    run's `tokenizer_vocab_size` asked for)."""
    if _reuses_tokenizer(record):
        return f"Tokenizer: reused from `{record.tokenizer_name or record.model_name_or_path}`."
    asked = record.tokenizer_vocab_size
    fewer = f" ({asked} asked for)" if asked is not None and asked != config.vocab_size else ""
    return (f"Tokenizer: one joint source+target BPE vocabulary of {config.vocab_size} pieces{fewer} trained "
            "on the training split (NFC, SentencePiece-style ▁ word starts, `<pad>`=0, `</s>`=1, `<s>`=2, `<unk>`=3).")


def _record_table(title: str, record: RunRecord, names: Sequence[str]) -> str:
    rows = [(f"`{name}`", _setting_value(name, getattr(record, name))) for name in names
            if getattr(record, name) is not None]
    return f"**{title}**\n\n" + (_table(("setting", "value"), rows) if rows else "(defaults)")


def _setting_value(name: str, value: Any) -> Any:
    """A recorded setting as the card shows it: warmup_steps below 1 is transformers' fraction of the training
    steps, not a number of steps."""
    if name == "warmup_steps" and 0 < value < 1:
        return f"{value:g} (of the training steps)"
    return value


def _evaluation_decoding(record: RunRecord) -> str:
    """How the scored translations were decoded, from the run's `generation_num_beams` (1: greedy); where the record
    has none (a record written before it held the setting), "translations" alone."""
    beams = record.generation_num_beams
    return ("translations" if beams is None else "greedy translations" if beams == 1 else
            f"beam-search translations (beam {beams})")


def _spread(values: Sequence[float], digits: int = 2) -> str:
    """The mean, with the range over seeds when they differ."""
    mean = sum(values) / len(values)
    if min(values) == max(values):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def _results_section(record: RunRecord, results: dict, trained: bool, published_as: str | None,
                     unscored: str | None = None, shows_command: bool = False, losses: dict | None = None) -> str:
    """The scores (`results`, and a recipe's committed measurements) or why there are none, and whether the weights
    are published; an untrained recipe's card points to its training command where `_training_section` shows one
    (`shows_command`). A run without scores that evaluated without generating (`losses`: the splits whose results
    hold `{prefix}_loss` and no BLEU, as `predict_with_generate: false` saves them) shows those losses."""
    parts = ["## Results"]
    if results:
        rows = []
        for prefix, values in results.items():
            count = values.get(f"{prefix}_samples")
            scored = _scored_set_title(record, prefix, values)
            rows.append((
                scored + (f" ({count} pairs)" if count and _sample_cap(record, prefix, values) is None else ""),
                f"{values[f'{prefix}_bleu']:.2f}",
                f"{values[f'{prefix}_chrf']:.2f}" if f"{prefix}_chrf" in values else "",
                f"`{values.get(f'{prefix}_bleu_signature', '')}`",
            ))
        caveat = "".join(f" The {RESULT_SPLITS[prefix]} score covers the first {cap} pairs of the split only "
                         f"(`{SAMPLE_CAPS[RESULT_SPLITS[prefix]]}`)."
                         for prefix, values in results.items()
                         if (cap := _sample_cap(record, prefix, values)) is not None)
        parts.append(f"Corpus-level sacreBLEU and chrF (the `sacrebleu` library) of {_evaluation_decoding(record)} of "
                     f"this model against the raw, detokenized references.{caveat}\n\n"
                     + _table(("test set", "BLEU", "chrF", "BLEU signature"), rows))
    for measurement in record.measurements:
        several = len(measurement.seeds) > 1
        seeds = f"seed{'s' if several else ''} {', '.join(map(str, measurement.seeds))}"
        rows = [(f"{scores.evaluation_set}, {seeds}", _spread(scores.bleu),
                 _spread(scores.chrf), f"`{scores.signature}`") for scores in measurement.scores]
        parts.append(
            f"**{measurement.title}** (record: `{measurement.record}`, {measurement.date})\n\n"
            f"Trained as `{measurement.trained_as}` from code `{measurement.code}` (the recipe as it was then); "
            f"{_spread(measurement.steps, 0)} steps; effective batch "
            f"{measurement.batch}; hardware: {measurement.hardware}; training time "
            f"{_spread(measurement.training_minutes, 1)} minutes per run. Setup as the record reports it: "
            f"{measurement.setup}\n\n{'Mean over seeds (min-max)' if several else 'One seed'}:\n\n"
            + _table(("test set", "BLEU", "chrF", "BLEU signature"), rows))
    if record.measurements and "multi30k" in (record.dataset_name or "").lower():
        parts.append("Neither set above is an untouched test set: scores on both Multi30k test2016 and validation were "
                     "read before settings this recipe shares with the other Multi30k recipes were adopted (which "
                     "settings, on which set, in which record: docs/results.md, \"Which sets chose which settings\", "
                     "in the hf_relpos repository), so these figures are in part the scores those settings were "
                     "chosen for.")
    if not results and not record.measurements:
        if unscored is not None:
            parts.append(unscored)
        elif trained and losses:
            rows = [(_scored_set_title(record, prefix, values)
                     + (f" ({count} pairs)" if (count := values.get(f"{prefix}_samples")) else ""),
                     f"{values[f'{prefix}_loss']:.4f}",
                     f"{values[f'{prefix}_nll_loss']:.4f}" if f"{prefix}_nll_loss" in values else "")
                    for prefix, values in losses.items()]
            parts.append("Not measured: BLEU and chrF. This run evaluated with `predict_with_generate: false`, so it "
                         "generated no translations to score; it measured the loss of the references instead: the "
                         "token mean of the training objective (label-smoothed where the run trained so) and of the "
                         "negative log-likelihood (nats per target token).\n\n"
                         + _table(("evaluation set", "loss", "NLL"), rows))
        elif trained:
            parts.append("Not measured: this run wrote no scores.")
        elif record.dataset_name == "demo":
            parts.append("Not recorded: `make demo` trains this recipe in minutes and prints its scores; no run of it "
                         "is committed.")
        else:
            parts.append("Never trained in the hf_relpos repository: no record there (docs/results) holds a run of "
                         "this recipe, so this card reports no scores.")
    if published_as:
        parts.append(f"The trained weights are published as [`{published_as}`](https://huggingface.co/{published_as}).")
    else:
        if trained:
            parts.append("No published checkpoint: these weights were not pushed to the Hugging Face Hub with this "
                         "card.")
        else:
            parts.append("No published checkpoint: hf_relpos publishes no trained weights of this "
                         + ("recipe; train them with the command above." if shows_command else "model."))
    return "\n\n".join(parts)


def example_source(language: str | None) -> str:
    """The sentence a card's usage example translates, in the model's source language ("..." where none is known)."""
    return {"de": "Der Hund schläft.", "en": "The dog is sleeping."}.get(language or "", "...")


def _usage_section(repo_id: str, source: str | None, scheme_class: type[PositionScheme]) -> str:
    """Loading and translating with `hf_relpos` imported, and through the remote code stored with the model; for a
    scheme registered outside hf_relpos, which that code lacks, its module is imported too and there is no
    remote-code way."""
    example = example_source(source)
    packaged = _is_packaged(scheme_class)
    module = scheme_class.__module__
    in_a_script = module == "__main__"   # registered by a script or notebook: no module to import
    if in_a_script:
        module = "my_schemes"
    registers = ("`import hf_relpos` registers the model with the Auto classes" if packaged else
                 f"`import hf_relpos` registers the model with the Auto classes, and importing `{module}` registers "
                 "its position scheme (the code stored with the model cannot load it: `trust_remote_code=True` alone "
                 "does not work)" + (f"; `{scheme_class.__qualname__}` was registered by a script, so `{module}` "
                                      "stands for a module that holds it" if in_a_script else ""))
    scheme_import = "" if packaged else f"import {module}  # noqa: F401\n"
    placeholder = (f"`{RECIPE_TEMPLATE_NAME}` stands for the model's Hub repository, or the path of its folder.\n\n"
                   if repo_id == RECIPE_TEMPLATE_NAME else "")
    with_package = f"""## How to use

{placeholder}With the `hf_relpos` package installed, {registers}:

```python
import hf_relpos  # noqa: F401
{scheme_import}from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{repo_id}")
model = AutoModelForSeq2SeqLM.from_pretrained("{repo_id}")
inputs = tokenizer(["{example}"], return_tensors="pt")
output_ids = model.generate(**inputs)  # the saved decoding: beams, and a length cap relative to each source
print(tokenizer.batch_decode(output_ids, skip_special_tokens=True))
```"""
    if not packaged:
        return with_package
    return with_package + f"""

Without it, the modeling code stored in this repository is used (read it first; it needs
`transformers{transformers_requirement()}`):

```python
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{repo_id}", trust_remote_code=True)
model = AutoModelForSeq2SeqLM.from_pretrained("{repo_id}", trust_remote_code=True)
inputs = tokenizer(["{example}"], return_tensors="pt")
output_ids = model.generate(**inputs)
print(tokenizer.batch_decode(output_ids, skip_special_tokens=True))
```

transformers 5 removed the built-in translation pipeline; this repository ships one (`{PIPELINE_FILE}`):

```python
from transformers import pipeline

translator = pipeline("translation", model="{repo_id}", trust_remote_code=True)
translator("{example}")  # [{{"translation_text": "..."}}]
```"""


def _limitations_section(config: RelPosTransformerConfig, record: RunRecord, recorded: bool) -> str:
    """The intended use and limitations; the language pair only from a recorded run or recipe (`recorded`: a model
    without one, such as a converted MarianMT model, has `RunRecord`'s default languages, not its own)."""
    pair = f"{language_name(record.source_lang)}→{language_name(record.target_lang)} " if recorded else ""
    items = [
        f"Intended for research on position representations and for {pair}sentence translation in the training "
        "domain; it is not a general-purpose or production translation system.",
        "Sentence-level: it translates one sentence at a time and never sees document context.",
        "Outputs can be fluent and wrong (omissions, hallucinated content, wrong names and numbers); BLEU and chrF "
        "measure n-gram overlap with one reference, not adequacy. Do not use it where mistranslation causes harm.",
        "It reproduces the biases of its training data (e.g. gender stereotypes in the target language) and has "
        "no content filtering.",
    ]
    if record.max_source_length:
        items.append(f"Training pairs were at most {record.max_source_length} source and "
                     f"{record.max_target_length} target tokens; much longer inputs are out of distribution.")
    read_dataset = None if _uses_local_files(record) else record.dataset_name   # local files: not the named dataset
    if "limitation" in KNOWN_DATASETS.get(read_dataset, {}):
        items.append(KNOWN_DATASETS[read_dataset]["limitation"])
    items += _scheme_card(config).limitations_for(config)
    return "## Intended use and limitations\n\n" + "\n".join(f"- {item}" for item in items)


def _citation_section(config: RelPosTransformerConfig) -> str:
    entries = "\n\n".join(dict.fromkeys((VASWANI_BIBTEX, *_scheme_card(config).bibtex)))
    return f"## Citation\n\n```bibtex\n{entries}\n```"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def render_recipe_cards(paths: Sequence[str | os.PathLike], out: str | os.PathLike,
                        records: Sequence[str | os.PathLike] = ()) -> list[Path]:
    """Render `<out>/<recipe>.md` for each recipe YAML (a folder stands for its *.yaml files), with the runs of the
    recipe found in the experiment `records` (`measurements_from_record`). A recipe that fine-tunes a saved model
    (`model_name_or_path`) has no architecture of its own and gets no card here: its model's config is known only
    when it trains (train_translation.py writes that card). A recipe file outside this checkout's configs/ (the
    user's own, or a copy) is carded as that file, `hf-relpos-train NAME.yaml`, with no runs: the records' runs are of
    configs/ recipes, matched by name (a link into configs/ is carded as the recipe it points to)."""
    recipes = []
    for path in map(Path, paths):
        recipes += sorted(path.glob("*.yaml")) if path.is_dir() else [path]
    # a recipe or record that cannot be read, or an --out that cannot be a folder, leaves no --out folder
    loaded = {path: load_card_recipe(path) for path in recipes}
    for record_path in records:
        read_experiment_record(record_path)
    out = Path(out)
    nearest_existing_folder(out, "out")   # mkdir's bare "File exists" or "Not a directory" named no setting
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path, recipe in loaded.items():
        if recipe.get("model_name_or_path"):
            continue
        record = RunRecord.from_recipe(recipe)
        repository_recipe = path.resolve().parent == PACKAGE_CHECKOUT / "configs"
        stem = path.resolve().stem if repository_recipe else path.stem
        if repository_recipe:
            record.measurements = [measurement for record_path in records
                                   for measurement in measurements_from_record(record_path, stem, record)]
        card = render_model_card(
            config_from_recipe(recipe), record, recipe_name=stem,
            recipe_command=None if repository_recipe else f"hf-relpos-train {path.name}",
            unscored=None if repository_recipe else ("Not measured: no run of this recipe file is recorded in the "
                                                     "hf_relpos repository, so this card reports no scores."))
        target = out / f"{path.stem}.md"
        write_text_atomic(target, card)   # a kill never leaves a card cut short
        written.append(target)
    return written


def folder_record(folder: str | os.PathLike,
                  recipe: RunRecord | Mapping[str, Any] | None = None) -> RunRecord | Mapping[str, Any] | None:
    """What a model folder's card is built from: its run record (`RUN_RECORD_FILE`), else `recipe` (a `RunRecord` or
    a recipe YAML dict). ValueError for a `recipe` given with a folder that has a record, or one whose model section
    names another position scheme than the folder's config.json (the recipe of another model: its card would call the
    weights of one scheme trained by a recipe of another)."""
    record = training_record(folder)
    if record is not None and recipe is not None:
        raise ValueError(f"{folder} has the record of the run that trained it ({RUN_RECORD_FILE}), which its card is "
                         "built from: a recipe is only for a folder without one")
    if recipe is not None:
        recipe_model = recipe.model if isinstance(recipe, RunRecord) else RunRecord.from_recipe(recipe).model
        config = current_model_fields(json.loads((Path(folder) / CONFIG_NAME).read_text(encoding="utf-8")))
        named, held = recipe_model.get(SCHEME_FIELD), config.get(SCHEME_FIELD)
        if named is not None and held is not None and named != held:
            raise ValueError(f"the recipe (--recipe) given for {folder} trains {SCHEME_FIELD} {named!r}, and the folder's model "
                             f"({CONFIG_NAME}) has {SCHEME_FIELD} {held!r}: give the recipe its weights were trained "
                             "with, or push it without a recipe")
    return record if record is not None else recipe


def folder_model_card(folder: str | os.PathLike, record: RunRecord | Mapping[str, Any] | None,
                      results: Mapping[str, Mapping[str, Any]] | None = None, *, repo_id: str | None = None,
                      recipe_name: str | None = None, published: bool = False, name: str | None = None) -> str:
    """The card of a saved model folder (`render_model_card` of its config.json, `record` and `results`, named
    `name`); for a folder that hf-relpos-average wrote, without scores of its own and with a section naming the
    checkpoints it averaged. A folder without its run's record (`RUN_RECORD_FILE`: saved by hand) is carded
    `without_run_record`: `record` is the recipe given for it, named `recipe_name`."""
    folder = Path(folder)
    config = json.loads((folder / CONFIG_NAME).read_text(encoding="utf-8"))
    checkpoints = averaged_checkpoints(folder)
    unscored = (None if checkpoints is None
                else "Not measured: these averaged weights were not evaluated (Checkpoint averaging, below).")
    card = render_model_card(config, record, results, repo_id=repo_id, recipe_name=recipe_name, published=published,
                             unscored=unscored, name=name, without_run_record=training_record(folder) is None,
                             conversion=model_conversion(folder, record if isinstance(record, RunRecord) else None))
    if checkpoints is None:
        return card
    names = ", ".join(f"`{checkpoint.name}`" for checkpoint in checkpoints)
    run_name = averaged_run_folder(checkpoints).name
    return (card.rstrip("\n") + "\n\n## Checkpoint averaging\n\n"
            f"These weights are the parameter average of {len(checkpoints)} checkpoint(s) ({names}) of "
            f"`{run_name}`, written by hf-relpos-average and not evaluated since: the scores the "
            "training run wrote are those of its own final weights. Score these with "
            "`hf-relpos-translate FOLDER --input SOURCES --reference REFERENCES`.\n")


def model_conversion(folder: str | os.PathLike, run: RunRecord | None) -> ConversionRecord | None:
    """The conversion (`ConversionRecord`) the weights in `folder` come from: the one hf-relpos-convert wrote there,
    else that of the folder the `run` fine-tuned (its `model_name_or_path`, from the folder the run was started in);
    None for weights of no conversion, or of a folder no longer there."""
    own = conversion_record(folder)
    if own is not None or run is None or run.model_name_or_path is None:
        return own
    started_from = Path(run.working_directory or "", run.model_name_or_path)
    return conversion_record(started_from) if started_from.is_dir() else None


def averaged_run_folder(checkpoints: Sequence[Path]) -> Path:
    """The training output folder the `checkpoints` averaged come from: the nearest folder holding them all, where a
    run's final model is its output folder itself (saved there beside its `checkpoint-<step>` folders); one
    checkpoint's parent folder."""
    return checkpoints[0].parent if len(checkpoints) == 1 else Path(os.path.commonpath(checkpoints))


def averaged_checkpoints(folder: Path) -> list[Path] | None:
    """The checkpoints hf-relpos-average averaged into `folder` (its `AVERAGED_CHECKPOINTS_FILE` names them by path,
    with `last_n`); None for any other folder, such as a training run's that averaged its own checkpoints (named
    under `average_checkpoints`) and scored the average."""
    path = folder / AVERAGED_CHECKPOINTS_FILE
    provenance = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return [Path(checkpoint) for checkpoint in provenance["checkpoints"]] if "last_n" in provenance else None


# --------------------------------------------------------------------------------------------------- pushing

def transformers_requirement() -> str:
    """The transformers versions hf_relpos requires, which the modeling code stored with a model needs as well: e.g.
    "<6,>=5.24". Read from pyproject.toml: the checkout's where hf_relpos runs from one (installed or only on the
    path, as `PYTHONPATH=. python train_translation.py`), else the installed package's metadata, built from it."""
    pyproject = PACKAGE_CHECKOUT / "pyproject.toml"
    project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {}) if pyproject.is_file() else {}
    if project.get("name") == "hf_relpos":
        texts = project["dependencies"]
    else:
        texts = importlib.metadata.requires("hf_relpos") or ()
    return next(str(requirement.specifier) for requirement in map(Requirement, texts)
                if requirement.name == "transformers" and requirement.marker is None)


def files_to_push(folder: str | os.PathLike) -> dict[str, Path]:
    """The files of a saved model folder that go to the Hub, by name: weights, config, generation config, remote
    code, tokenizer (not `AVERAGED_CHECKPOINTS_FILE`: it names the checkpoints by local path; the card names them).
    Raises ValueError, naming what is missing, for a folder that would not load from the Hub (a CTranslate2 export
    among them: it names the folder to push instead)."""
    folder = Path(folder)
    if (folder / CTRANSLATE2_EXPORT_RECORD).is_file():
        refusal = (f"{folder} is a CTranslate2 export (hf-relpos-export), which loads in CTranslate2, not in "
                   "transformers: push the model folder it was exported from, or ")
        leaking = export_files_with_local_paths(folder)
        if leaking:
            raise ValueError(refusal + f"upload an export of it: {' and '.join(leaking)} of this one hold local "
                             "absolute paths (written by an hf-relpos-export that kept them), which an upload would "
                             "publish; export it again (hf-relpos-export ctranslate2 MODEL_DIR OUT_DIR) and upload "
                             "that (hf upload REPO_ID OUT_DIR)")
        raise ValueError(refusal + f"upload the export as it is (hf upload REPO_ID {folder})")
    config_path = folder / CONFIG_NAME
    if not config_path.is_file():
        raise ValueError(f"{folder} has no {CONFIG_NAME}: save the model there with save_pretrained first")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    auto_map = config.get("auto_map") or {}
    if config.get("model_type") != RelPosTransformerConfig.model_type or "AutoModelForSeq2SeqLM" not in auto_map:
        raise ValueError(f"{config_path} is not a RelPosTransformer config with an auto_map for AutoModelForSeq2SeqLM; "
                         "save the model with hf_relpos imported")
    names = {CONFIG_NAME, *tokenizer_files(folder)}
    if (folder / SAFE_WEIGHTS_INDEX_NAME).is_file():
        index = json.loads((folder / SAFE_WEIGHTS_INDEX_NAME).read_text(encoding="utf-8"))
        names |= {SAFE_WEIGHTS_INDEX_NAME, *index["weight_map"].values()}
    else:
        names.add(SAFE_WEIGHTS_NAME)
    for reference in auto_map.values():
        module_file = folder / f"{reference.split('.')[0]}.py"
        names.add(module_file.name)
        if module_file.is_file():
            names |= {Path(path).name for path in get_relative_import_files(str(module_file))}
    if (folder / GENERATION_CONFIG_NAME).is_file():
        names.add(GENERATION_CONFIG_NAME)
    missing = sorted(name for name in names if not (folder / name).is_file())
    if missing:
        raise ValueError(f"{folder} lacks {', '.join(missing)}: a pushed model needs its weights (safetensors), "
                         "remote code and tokenizer (save the tokenizer next to the model)")
    for name in sorted(name for name in names if name.endswith(".safetensors")):
        try:   # the header: a file cut short no longer spans what it declares
            with reading_weights(name), safe_open(folder / name, framework="pt"):
                pass
        except WeightsFileError as error:
            raise WeightsFileError(f"{folder}: {error}: push a folder whose weights load (save the model again, or "
                                   "copy it whole)") from None
    return {name: folder / name for name in sorted(names)}


def export_files_with_local_paths(folder: Path) -> list[str]:
    """The records of the CTranslate2 export `folder` that hold a local absolute path, which its files have shown as
    model cards show them since hf-relpos-export wrote them so (`shown_path`, `shown_record`): its
    ctranslate2_export.json's `source_model`, its copy of the run record (a record that cannot be read is not
    named: nothing is known of its paths)."""
    def source_leaks() -> bool:
        source = json.loads((folder / CTRANSLATE2_EXPORT_RECORD).read_text(encoding="utf-8")).get("source_model")
        return isinstance(source, str) and shown_path(source) != source

    def run_record_leaks() -> bool:
        run = training_record(folder)
        return run is not None and shown_record(run) != run

    leaking = []
    for name, leaks in ((CTRANSLATE2_EXPORT_RECORD, source_leaks), (RUN_RECORD_FILE, run_record_leaks)):
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):   # not as hf-relpos-export writes it
            if leaks():
                leaking.append(name)
    return leaking


def tokenizer_files(folder: Path) -> set[str]:
    """The files of the tokenizer saved in `folder`, present or not (a missing one is what `files_to_push` names):
    tokenizer_config.json and the vocabulary files of the class it names (`vocab_files_names`), those its __init__
    requires (MarianTokenizer's source.spm, target.spm and vocab.json, for a converted MarianMT model) or else
    tokenizer.json (hf_relpos' tokenizers) when none of them is there; with each other vocabulary, special-tokens and
    added-tokens file that is there."""
    config_path = folder / TOKENIZER_CONFIG_FILE
    class_name = json.loads(config_path.read_text(encoding="utf-8")).get("tokenizer_class") if config_path.is_file() else None
    tokenizer_class = tokenizer_class_from_name(class_name) if class_name else None
    vocabulary = {key: name for key, name in getattr(tokenizer_class, "vocab_files_names", {}).items()
                  if name != TOKENIZER_CONFIG_FILE}
    parameters = inspect.signature(tokenizer_class.__init__).parameters if tokenizer_class is not None else {}
    required = {name for key, name in vocabulary.items()
                if key in parameters and parameters[key].default is inspect.Parameter.empty}
    present = {name for name in (FULL_TOKENIZER_FILE, *vocabulary.values(), *OPTIONAL_TOKENIZER_FILES)
               if (folder / name).is_file()}
    if not required and not present & {FULL_TOKENIZER_FILE, *vocabulary.values()}:
        required = {FULL_TOKENIZER_FILE}
    return {TOKENIZER_CONFIG_FILE, *required, *present}


@dataclasses.dataclass
class PushPlan:
    """What `push_model_folder` commits, one rule for a push and its dry run: the folder's files (`files_to_push`)
    and the files it generates, `pipeline_relpos.py`, config.json declaring that pipeline, and README.md (`card`,
    else `folder_model_card` of the folder's run record, or `recipe` for a folder without one, and `results`)."""

    folder: Path
    files: dict[str, Path]                                # the folder's files that go to the Hub, by name
    config: dict[str, Any]
    results: Mapping[str, Mapping[str, Any]]
    record: RunRecord | Mapping[str, Any] | None
    recipe_name: str | None
    card: str | None                                      # a card given as text, pushed as it is

    @classmethod
    def of(cls, folder: str | os.PathLike, *, recipe: RunRecord | Mapping[str, Any] | None = None,
           results: Mapping[str, Mapping[str, Any]] | None = None, recipe_name: str | None = None,
           card: str | None = None) -> PushPlan:
        """The plan of pushing `folder`, checked before anything is sent: ValueError for a folder that would not
        load from the Hub (`files_to_push`) or a `recipe` given for a folder with a run record (`folder_record`);
        `results` default to the folder's `{eval,test}_results.json`."""
        folder = Path(folder)
        files = files_to_push(folder)
        return cls(folder=folder, files=files, config=json.loads(files[CONFIG_NAME].read_text(encoding="utf-8")),
                   results=load_results(folder) if results is None else results,
                   record=folder_record(folder, recipe) if card is None else None, recipe_name=recipe_name, card=card)

    def generated(self, repo_id: str) -> dict[str, str]:
        """The files the push writes, by name, with the card naming the repository `repo_id`."""
        card = self.card if self.card is not None else folder_model_card(
            self.folder, self.record, self.results, repo_id=repo_id, recipe_name=self.recipe_name, published=True)
        return {CONFIG_NAME: _config_json(with_translation_pipeline(self.config)), PIPELINE_FILE: pipeline_source(),
                CARD_FILE: card}

    def uploads(self, repo_id: str) -> dict[str, Path | str]:
        """Every file of the commit by name: a folder's file by its path, a generated one by its text."""
        generated = self.generated(repo_id)
        return dict(sorted({**{name: path for name, path in self.files.items() if name not in generated},
                            **generated}.items()))


# What a dry run's card names for the namespace a repository id without one would be created in (the logged-in
# account's, which only the Hub knows).
NAMESPACE_PLACEHOLDER = "<account>"
GENERATED_FILES = {CARD_FILE: "the model card", CONFIG_NAME: "the folder's config.json, declaring the pipeline",
                   PIPELINE_FILE: "the translation pipeline"}


def push_model_folder(
    folder: str | os.PathLike,
    repo_id: str,
    *,
    recipe: RunRecord | Mapping[str, Any] | None = None,
    results: Mapping[str, Mapping[str, Any]] | None = None,
    recipe_name: str | None = None,
    card: str | None = None,
    token: str | None = None,
    private: bool | None = None,
    commit_message: str = "Upload hf_relpos translation model",
    dry_run: bool = False,
    card_out: str | os.PathLike | None = None,
) -> str:
    """Upload a trained model folder to the Hub repository `repo_id` (created if needed) in one commit; returns the
    commit URL.

    Pushed: the files of `PushPlan`: those of `files_to_push`, `pipeline_relpos.py`, config.json declaring that
    pipeline, and README.md (`card`, or `folder_model_card` of the folder's run record (`recipe`, a `RunRecord` or a
    recipe YAML dict, only for a folder without one) and `results`, which default to the folder's
    `{eval,test}_results.json`; the card names the repository as the Hub created it, a `repo_id` without a namespace
    in the account's); the commit deletes the repository's weights files that it does not replace (`stale_weights`).
    The folder is only read until the commit succeeds; then README.md, pipeline_relpos.py and
    config.json are written into it, so it matches the repository (a folder that cannot be written is a ValueError
    before the Hub is called). A failed upload raises `HubPushError` naming the repository and leaves the folder
    byte-for-byte as it was; a repository that this call created is deleted again (`_hub_errors`), one that existed
    before is left as it was.

    `private`: True pushes into a private repository only: one the push creates is created private, an existing one
    must be private already (`HubPushError` for a public one, before anything is uploaded: the Hub keeps an existing
    repository's visibility, and changing it is left to its owner). None or False: a new repository is created with
    the Hub's default visibility (public, unless the organisation's default is private); an existing one keeps its
    own.

    `dry_run`: no Hub call and nothing written into the folder; returns what the push would do (`dry_run_report`):
    the repository id as given and each file with its size. `card_out` (a dry run only, outside the folder): where
    to write the card that the push would upload.
    """
    if card_out is not None and not dry_run:
        raise ValueError("card_out (--card_out) is for a dry run (dry_run, --dry_run): a push writes its card into "
                         "the folder, as README.md")
    plan = PushPlan.of(folder, recipe=recipe, results=results, recipe_name=recipe_name, card=card)
    if dry_run:
        return dry_run_report(plan, repo_id, private=private, card_out=card_out)
    if (error := creation_error(plan.folder)) is not None:   # checked before the commit, which cannot be undone
        raise ValueError(f"{plan.folder} is not writable ({error.strerror}): a push writes its card, config.json and "
                         f"{PIPELINE_FILE} into the folder once the upload succeeds, so that the folder matches the "
                         "repository; push a writable copy of it (a dry run, --dry_run, writes nothing there)")
    api = HfApi(token=token)
    with _hub_errors(plan.folder, repo_id):
        repo_id, created = created_or_existing_repository(api, repo_id, private)   # with the namespace it went to
    created_by = api if created else None
    with _hub_errors(plan.folder, repo_id, created_by):
        refusal = public_repository_refusal(api, repo_id) if private and not created else None
        present = api.list_repo_files(repo_id)
    if refusal is not None:
        raise HubPushError(f"{refusal} and push again, or push without --private (hub_private_repo: false) to publish "
                           f"them publicly; nothing was pushed and nothing in {plan.folder} was changed")
    with _hub_errors(plan.folder, repo_id, created_by):   # a repository created above is deleted if any of it fails
        uploads = plan.uploads(repo_id)
        operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(content) if isinstance(content, Path)
                                         else content.encode("utf-8")) for name, content in uploads.items()]
        operations += [CommitOperationDelete(path_in_repo=name) for name in stale_weights(present, uploads)]
        commit = api.create_commit(repo_id, operations=operations, commit_message=commit_message)
    _write_files(plan.folder, {name: text for name, text in uploads.items() if isinstance(text, str)})
    return commit.commit_url


def created_or_existing_repository(api: HfApi, repo_id: str, private: bool | None) -> tuple[str, bool]:
    """(the repository's id with its namespace, whether this call created it): `create_repo` of `repo_id` (`private`
    sets the visibility of a repository it creates only), and where the Hub refuses because the repository exists
    (409) or the token may not create one (401, 402, 403: the repository may exist), `create_repo` with `exist_ok`,
    which returns an existing repository and raises the Hub's error for any other."""
    try:
        return api.create_repo(repo_id, private=private).repo_id, True
    except HfHubHTTPError as error:
        if error.response.status_code not in (401, 402, 403, 409):
            raise
    return api.create_repo(repo_id, private=private, exist_ok=True).repo_id, False


def public_repository_refusal(api: HfApi, repo_id: str) -> str | None:
    """Why a push that asks for a private repository (--private, hub_private_repo: true) must not go to `repo_id`
    (with its namespace), or None: it exists and is not private, and the Hub keeps an existing repository's
    visibility (`create_repo` ignores `private` for it), so the weights would be public. Making it private is left to
    its owner: that cuts off everyone who downloads it."""
    try:
        if api.repo_info(repo_id).private is True:
            return None
    except RepositoryNotFoundError:
        return None
    return (f"the Hub repository {repo_id!r} exists and is public, and a private repository was asked for: a push "
            "does not change an existing repository's visibility, so these weights would be public; make it private "
            f"first (its settings page on the Hub, or `hf repos settings {repo_id} --private`)")


def stale_weights(present: Sequence[str], uploads: Mapping[str, Any]) -> list[str]:
    """The weights files of the repository (`present`, its files) at its top level that the commit of `uploads` does
    not replace: an earlier push's model.safetensors, which transformers loads before an index of shards, or its
    shards, index or pytorch_model*.bin. The push deletes them, so the repository serves the weights pushed last."""
    weights = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "pytorch_model*.bin.index.json")
    return sorted(name for name in present if "/" not in name and name not in uploads
                  and any(fnmatch.fnmatch(name, pattern) for pattern in weights))


def dry_run_report(plan: PushPlan, repo_id: str, *, private: bool | None = None,
                   card_out: str | os.PathLike | None = None) -> str:
    """What pushing `plan` to `repo_id` would do, without the Hub (no login, no repository looked up): the repository
    id as given, each file with its size, the folder's files left out, and `card_out` written with the card (a path
    outside the folder, which a dry run leaves as it is). A `repo_id` without a namespace goes to the logged-in
    account's, which only the Hub knows: its card names it `NAMESPACE_PLACEHOLDER`/NAME."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise ValueError(f"repository id {repo_id!r}: {error}") from None
    if "/" in repo_id:
        carded, where = repo_id, f"{repo_id} (as given)"
    else:
        carded = f"{NAMESPACE_PLACEHOLDER}/{repo_id}"
        where = (f"{repo_id} (as given, without a namespace: the Hub creates it in the namespace of the account that "
                 f"is logged in, which a dry run cannot resolve without the network, so the card names it {carded})")
    if card_out is not None:
        card_out = Path(card_out)
        if card_out.resolve().is_relative_to(plan.folder.resolve()):
            raise ValueError(f"card_out {str(card_out)!r} is in {plan.folder}, which a dry run leaves as it is: write "
                             "the card elsewhere")
        if card_out.is_dir():
            raise ValueError(f"card_out {str(card_out)!r} is a folder: give the card's file name (e.g. "
                             f"{str(card_out / CARD_FILE)!r})")
        nearest_existing_folder(card_out.parent, "card_out's folder")
    uploads = plan.uploads(carded)
    sizes = {name: content.stat().st_size if isinstance(content, Path) else len(content.encode("utf-8"))
             for name, content in uploads.items()}
    width = max(map(len, uploads))
    lines = [f"Dry run: nothing was sent to the Hub (login not checked) and nothing in {plan.folder} was changed.",
             f"Repository: {where}; a push creates it if it does not exist"
             + (", as private (an existing one must be private already: a public one is refused, not made private)."
                if private else "."),
             f"Files that would be uploaded ({len(uploads)}, {_size(sum(sizes.values()))} in all):"]
    lines += [f"  {name:<{width}}  {_size(sizes[name]):>9}"
              + (f"  (written by the push: {GENERATED_FILES[name]})" if name in GENERATED_FILES else "")
              for name in uploads]
    left_out = sorted(path.name + ("/" if path.is_dir() else "") for path in plan.folder.iterdir()
                      if path.name not in uploads)
    if left_out:
        lines.append(f"Not uploaded from {plan.folder}: {', '.join(left_out)}")
    if card_out is not None:
        card_out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(card_out, uploads[CARD_FILE])
        lines.append(f"Card written to {card_out}")
    return "\n".join(lines)


def _size(size: int) -> str:
    """A file size in bytes, kB, MB or GB (powers of 1000, as the Hub shows them)."""
    for unit in ("B", "kB", "MB"):
        if size < 1000:
            return f"{size} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


@contextlib.contextmanager
def _hub_errors(folder: Path, repo_id: str, created_by: HfApi | None = None) -> Iterator[None]:
    """A failed Hub call as `HubPushError`, naming the repository and the cause. `created_by`: the client whose push
    created the repository, which then holds nothing of the model: it deletes it, so that a failed push leaves no
    repository behind (or the error says that the repository is left, and how to delete it)."""
    try:
        yield
    except Exception as error:
        left = ""
        if created_by is not None:
            try:
                created_by.delete_repo(repo_id)
                left = "; the repository, which this push had created, was deleted again"
            except Exception as deleting:
                left = (f"; the repository this push created is left without the model (deleting it failed: "
                        f"{type(deleting).__name__}: {deleting}): push again, or delete it (`hf repos delete "
                        f"{repo_id}`)")
        raise HubPushError(f"pushing {folder} to the Hub repository {repo_id!r} failed "
                           f"({type(error).__name__}: {error}){left}; nothing in {folder} was changed") from error


def _config_json(config: Mapping[str, Any]) -> str:
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def _write_files(folder: Path, texts: Mapping[str, str]) -> None:
    """Write each file atomically (`write_text_atomic`), so none is ever left half-written."""
    for name, text in texts.items():
        write_text_atomic(folder / name, text)


# --------------------------------------------------------------------------------------------------- command line

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hf_relpos.publish.hub", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    render = commands.add_parser("render-cards", help="render model_cards/<recipe>.md for recipe YAML files")
    render.add_argument("paths", nargs="+", type=expand_home, help="recipe .yaml files or folders of them")
    render.add_argument("--out", default="model_cards", type=expand_home, help="output folder (default: model_cards)")
    render.add_argument("--records", nargs="*", default=[], type=expand_home,
                        help="experiment records (JSON) whose runs of a recipe go into its card's results")
    push = commands.add_parser("push", help="push a trained model folder with its card")
    push.add_argument("folder", type=expand_home)
    push.add_argument("repo_id")
    push.add_argument("--recipe", type=expand_home,
                      help="the recipe YAML the model was trained with (for the card of a folder without "
                           "run_record.json: it shows the file's name and settings, and says how the weights were "
                           "trained is not known)")
    push.add_argument("--private", action="store_true",
                      help="push into a private repository only: create it as private if it does not exist; an "
                           "existing public repository is refused, not made private (the push never changes a "
                           "repository's visibility)")
    push.add_argument("--dry_run", action="store_true",
                      help="push nothing and change nothing in the folder: print the repository id as given and each "
                           "file the push would upload, with its size (the card, config.json and pipeline_relpos.py "
                           "as the push would write them)")
    push.add_argument("--card_out", type=expand_home, metavar="PATH",
                      help="with --dry_run: write the card the push would upload to PATH (outside the folder)")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "render-cards":
            for path in render_recipe_cards(args.paths, args.out, args.records):
                print(path)
        else:
            recipe = load_card_recipe(args.recipe) if args.recipe else None
            recipe_name = Path(args.recipe).name if args.recipe else None   # the file given, not a local path
            print(push_model_folder(args.folder, args.repo_id, recipe=recipe, recipe_name=recipe_name,
                                    private=args.private or None, dry_run=args.dry_run, card_out=args.card_out))
    except (OSError, ValueError, HubPushError) as error:  # a missing or unsaved folder, a bad recipe, a failed upload
        parser.exit(2, f"{parser.prog} {args.command}: error: {' '.join(str(error).split())}\n")


if __name__ == "__main__":
    main()
