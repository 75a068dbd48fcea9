"""Model cards and Hugging Face Hub uploads for hf_relpos translation models.

    python -m hf_relpos.hub render-cards configs/ --out model_cards/             # one card per recipe
    python -m hf_relpos.hub push outputs/NAME USER/NAME --recipe configs/NAME.yaml

`render_model_card` writes a README.md (YAML metadata that `huggingface_hub.ModelCard` parses, then the scheme, the
training recipe, the results, usage, limitations and BibTeX). `push_model_folder` uploads a saved model folder with
its card. `TranslationPipeline` restores `pipeline("translation")`, which transformers 5 removed: it ships with every
pushed model as `pipeline_relpos.py` (remote code). The model code never imports this module.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import CommitOperationAdd, EvalResult, HfApi, ModelCardData
from transformers.dynamic_module_utils import get_relative_import_files
from transformers.tokenization_utils_base import (
    ADDED_TOKENS_FILE,
    FULL_TOKENIZER_FILE,
    SPECIAL_TOKENS_MAP_FILE,
    TOKENIZER_CONFIG_FILE,
)
from transformers.utils import CONFIG_NAME, GENERATION_CONFIG_NAME, SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from .configuration_relpos import RelPosTransformerConfig
from .modeling_relpos import meta_model
from .pipeline_relpos import TranslationPipeline
from .positions import PositionScheme, SchemeCard, get_scheme_class
from .safety import write_text_atomic

LICENSE = "apache-2.0"
CARD_FILE = "README.md"
PIPELINE_FILE = "pipeline_relpos.py"
PIPELINE_TASK = "translation"
REQUIRED_TOKENIZER_FILES = (FULL_TOKENIZER_FILE, TOKENIZER_CONFIG_FILE)
OPTIONAL_TOKENIZER_FILES = (SPECIAL_TOKENS_MAP_FILE, ADDED_TOKENS_FILE)
RESULT_PREFIXES = {"eval": "validation", "test": "test"}  # results-file prefix -> split
RECIPE_TEMPLATE_NAME = "REPO_ID"

LANGUAGE_NAMES = {"en": "English", "de": "German", "fr": "French", "cs": "Czech", "ru": "Russian", "ro": "Romanian"}
# Hub datasets the recipes use: a display name and what their validation/test splits are.
KNOWN_DATASETS = {
    "wmt/wmt14": {"title": "WMT14", "validation": "newstest2013", "test": "newstest2014"},
    "bentrevett/multi30k": {"title": "Multi30k", "validation": "validation", "test": "test2016 (Flickr)"},
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

# Recipe fields shown in the card's training table, in this order (the YAML names, so they map back to a config).
TRAINING_FIELDS = (
    "max_steps", "num_train_epochs", "max_tokens_per_batch", "length_pool_factor", "per_device_train_batch_size",
    "gradient_accumulation_steps", "optim", "adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay",
    "learning_rate", "lr_scheduler_type", "warmup_steps", "label_smoothing_factor", "max_grad_norm", "bf16", "fp16",
    "seed",
)
DATA_FIELDS = (
    "dataset_name", "dataset_config_name", "train_file", "validation_file", "test_file", "max_train_samples",
    "max_eval_samples", "max_predict_samples", "max_source_length", "max_target_length", "overlong_pairs",
    "model_name_or_path", "tokenizer_name", "tokenizer_vocab_size",
)
DECODING_FIELDS = ("generation_num_beams", "generation_length_penalty", "generation_max_length_offset")


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

def load_recipe(path: str | os.PathLike) -> dict[str, Any]:
    """A recipe YAML file (configs/*.yaml) as a dict."""
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle) or {}


def recipe_from_arguments(model_args: Any, data_args: Any, training_args: Any) -> dict[str, Any]:
    """The recipe (YAML field names) of a `train_translation.py` run, from its parsed argument dataclasses."""
    recipe: dict[str, Any] = {"model": dict(model_args.model_config), **dataclasses.asdict(data_args)}
    for name in ("model_name_or_path", "tokenizer_name", "tokenizer_vocab_size"):
        recipe[name] = getattr(model_args, name)
    for name in (*TRAINING_FIELDS, *DECODING_FIELDS):
        value = getattr(training_args, name, None)
        recipe[name] = value.value if isinstance(value, enum.Enum) else value
    recipe.pop("num_train_epochs" if training_args.max_steps > 0 else "max_steps")
    if recipe["max_tokens_per_batch"] is not None:
        recipe.pop("per_device_train_batch_size")
    return recipe


def config_from_recipe(recipe: Mapping[str, Any]) -> RelPosTransformerConfig:
    """The model config a recipe trains (the vocabulary size is the tokenizer's, taken from the recipe)."""
    return RelPosTransformerConfig(**recipe.get("model", {}), vocab_size=recipe.get("tokenizer_vocab_size", 8000))


def load_results(folder: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """The `{eval,test}_results.json` files that train_translation.py wrote into `folder`, by prefix."""
    results = {}
    for prefix in RESULT_PREFIXES:
        path = Path(folder) / f"{prefix}_results.json"
        if path.is_file():
            results[prefix] = json.loads(path.read_text(encoding="utf-8"))
    return results


def render_model_card(
    config: RelPosTransformerConfig | Mapping[str, Any],
    recipe: Mapping[str, Any] | None = None,
    results: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    repo_id: str | None = None,
    recipe_name: str | None = None,
) -> str:
    """The README.md of a model: YAML metadata (with a model-index when `results` hold BLEU scores) and the body.

    `config` is the model's config (or its config.json dict), `recipe` the training recipe (a configs/*.yaml dict or
    `recipe_from_arguments`), `results` maps "eval"/"test" to the dicts of `{eval,test}_results.json`.
    """
    if isinstance(config, Mapping):
        config = RelPosTransformerConfig.from_dict(dict(config))
    recipe = dict(recipe or {})
    results = {prefix: dict(values) for prefix, values in (results or {}).items() if f"{prefix}_bleu" in values}
    model_name = (repo_id or recipe_name or f"relpos-{config.attention_type}").split("/")[-1]
    source, target = recipe.get("source_lang", "en"), recipe.get("target_lang", "de")
    metadata = _card_metadata(config, recipe, results, model_name, source, target)
    sections = [
        _title_section(config, recipe, model_name, source, target, recipe_name),
        _scheme_section(config),
        _architecture_section(config),
        _training_section(recipe, recipe_name),
        _results_section(recipe, results),
        _usage_section(repo_id or RECIPE_TEMPLATE_NAME, source),
        _limitations_section(config, recipe, source, target),
        _citation_section(config),
    ]
    return f"---\n{metadata.to_yaml()}\n---\n\n" + "\n\n".join(sections) + "\n"


def _card_metadata(
    config: RelPosTransformerConfig, recipe: dict, results: dict, model_name: str, source: str, target: str
) -> ModelCardData:
    scheme = config.attention_type
    tags = ["translation", *_scheme_card(config).tags, scheme, "hf_relpos"]
    dataset = recipe.get("dataset_name")
    on_hub = _on_hub(recipe)
    eval_results = []
    for prefix, values in results.items():
        split = RESULT_PREFIXES[prefix]
        common = {
            "task_type": "translation",
            "task_name": f"Translation {source}-{target}",
            "dataset_type": dataset if on_hub else "custom",
            "dataset_name": _split_title(recipe, split),
            "dataset_config": recipe.get("dataset_config_name") if on_hub else None,
            "dataset_split": recipe.get(f"{split}_split_name", split) if on_hub else split,
        }
        eval_results.append(EvalResult(**common, metric_type="sacrebleu", metric_name="sacreBLEU",
                                       metric_value=round(values[f"{prefix}_bleu"], 2),
                                       metric_args={"signature": values.get(f"{prefix}_bleu_signature")}))
        if f"{prefix}_chrf" in values:
            eval_results.append(EvalResult(**common, metric_type="chrf", metric_name="chrF",
                                           metric_value=round(values[f"{prefix}_chrf"], 2),
                                           metric_args={"signature": values.get(f"{prefix}_chrf_signature")}))
    return ModelCardData(
        language=[source, target],
        license=LICENSE,
        library_name="transformers",
        pipeline_tag="translation",
        tags=tags,
        datasets=[dataset] if on_hub else None,
        metrics=["sacrebleu", "chrf"],
        model_name=model_name,
        eval_results=eval_results or None,
    )


def _uses_local_files(recipe: Mapping[str, Any]) -> bool:
    return any(recipe.get(name) for name in ("train_file", "validation_file", "test_file"))


def _on_hub(recipe: Mapping[str, Any]) -> bool:
    """Whether the recipe's data is a Hub dataset (an owner/name id, no local files)."""
    return "/" in (recipe.get("dataset_name") or "") and not _uses_local_files(recipe)


def _without(name: str, fields: Sequence[str]) -> tuple[str, ...]:
    return tuple(field for field in fields if field != name)


def _language(code: str) -> str:
    return LANGUAGE_NAMES.get(code, code)


def _dataset_title(recipe: Mapping[str, Any]) -> str:
    if _uses_local_files(recipe):
        return "local parallel files"
    dataset = recipe.get("dataset_name")
    if dataset == "demo":
        return "hf_relpos demo corpus"
    return KNOWN_DATASETS.get(dataset, {}).get("title", dataset or "unrecorded data")


def _split_title(recipe: Mapping[str, Any], split: str) -> str:
    if _uses_local_files(recipe):
        return Path(recipe.get(f"{split}_file") or split).name
    known = KNOWN_DATASETS.get(recipe.get("dataset_name"), {})
    return f"{_dataset_title(recipe)} {known.get(split, split)}"


def _title_section(
    config: RelPosTransformerConfig, recipe: dict, model_name: str, source: str, target: str, recipe_name: str | None
) -> str:
    scheme = _scheme_card(config).title
    trained_on = f", trained on {_dataset_title(recipe)}" if recipe else ""
    origin = f" with the `{recipe_name}` recipe" if recipe_name else ""
    return (
        f"# {model_name}\n\n"
        f"An encoder-decoder Transformer for {_language(source)}→{_language(target)} translation whose self-attention "
        f"uses {scheme}{trained_on}. It was built with hf_relpos (`attention_type: {config.attention_type}`)"
        f"{origin}: a Hugging Face `PreTrainedModel` + `GenerationMixin` that loads with "
        "`from_pretrained`, generates with a KV cache and is stored as safetensors."
    )


def _scheme_card(config: RelPosTransformerConfig) -> SchemeCard:
    """The scheme's own card text, or a generic one for a scheme registered without it."""
    scheme_class = get_scheme_class(config.attention_type)
    if scheme_class.card is not None:
        return scheme_class.card
    return SchemeCard(title=f"the `{config.attention_type}` position scheme")


def _is_packaged(scheme_class: type[PositionScheme]) -> bool:
    """Whether the scheme ships with hf_relpos (and so with a saved model's remote code)."""
    return scheme_class.__module__.split(".")[0] in (PositionScheme.__module__.split(".")[0], "transformers_modules")


def _scheme_section(config: RelPosTransformerConfig) -> str:
    scheme_class = get_scheme_class(config.attention_type)
    parts = [_scheme_card(config).describe(config)]
    if scheme_class.config_fields:
        rows = [(f"`{field.name}`" + (f" ({field.symbol})" if field.symbol else ""), getattr(config, field.name),
                 field.help) for field in scheme_class.config_fields]
        parts.append(_table(("setting", "value", "meaning"), rows))
    if not _is_packaged(scheme_class):
        parts.append(f"`{config.attention_type}` is a scheme registered with `hf_relpos.register_attention` "
                     f"(`{scheme_class.__module__}.{scheme_class.__qualname__}`); its code must be importable wherever "
                     "this model is loaded.")
    if config.layer_norm_position == "pre":
        norm = "Pre-LN blocks: LayerNorm before each sub-layer, x + Sublayer(LayerNorm(x)) (Xiong et al. 2020)."
    else:
        norm = "Post-LN blocks: LayerNorm(x + Sublayer(x)) after each sub-layer (Vaswani et al. 2017)."
    body = "\n\n".join(part for part in parts if part)
    return (
        f"## Position scheme: `{config.attention_type}`\n\n{body}\n\n"
        "Positions enter self-attention only (encoder and decoder); cross-attention has no position term, as in Shaw "
        f"et al. (2018). {norm}"
    )


def _architecture_section(config: RelPosTransformerConfig) -> str:
    parameters = meta_model(config).num_parameters()
    rows = [
        ("parameters", f"{parameters / 1e6:.1f}M"),
        ("`d_model`", config.d_model),
        ("layers (encoder / decoder)", f"{config.encoder_layers} / {config.decoder_layers}"),
        ("attention heads (encoder / decoder)", f"{config.encoder_attention_heads} / {config.decoder_attention_heads}"),
        ("feed-forward size (encoder / decoder)", f"{config.encoder_ffn_dim} / {config.decoder_ffn_dim}"),
        ("activation", config.activation_function),
        ("`layer_norm_position`", config.layer_norm_position),
        ("dropout / attention / activation dropout",
         f"{config.dropout} / {config.attention_dropout} / {config.activation_dropout}"),
        ("self-attention window", "the whole sequence" if config.self_attention_window is None
         else f"keys within {config.self_attention_window} positions of the query"),
        ("cross-attention logits", "times log(source length)" if config.cross_attention_length_scaling else "unscaled"),
        ("embeddings scaled by √d_model", config.scale_embedding),
        ("token embeddings at initialisation", "N(0, d_model^-0.5)" if config.embedding_init_std is None
         else f"N(0, {config.embedding_init_std})"),
        ("tied source, target and output embeddings", config.tie_word_embeddings),
        ("vocabulary", config.vocab_size),
    ]
    return "## Architecture\n\n" + _table(("", "value"), rows)


def _training_section(recipe: dict, recipe_name: str | None) -> str:
    if not recipe:
        return "## Training\n\nThe training recipe was not recorded with this model."
    command = f"python train_translation.py configs/{recipe_name}.yaml" if recipe_name else None
    source, target = recipe.get("source_lang", "en"), recipe.get("target_lang", "de")
    lines = [
        "## Training",
        "",
        f"Data: {_dataset_title(recipe)}, {_language(source)} (`{source}`) → {_language(target)} (`{target}`). "
        + _tokenizer_sentence(recipe),
        "",
        *([f"Command (from the hf_relpos repository): `{command}`", ""] if command else []),
        _recipe_table("Data", recipe, DATA_FIELDS if _on_hub(recipe) else _without("dataset_config_name", DATA_FIELDS)),
        "",
        _recipe_table("Optimisation", recipe, TRAINING_FIELDS),
        "",
        _recipe_table("Decoding for evaluation", recipe, DECODING_FIELDS),
        "",
        "The maximum output length is the longest source in the batch plus `generation_max_length_offset` tokens "
        "(Vaswani et al.: input length + 50). `max_tokens_per_batch` is the padded source and target token budget "
        "per device and step.",
    ]
    return "\n".join(lines)


def _tokenizer_sentence(recipe: Mapping[str, Any]) -> str:
    if recipe.get("tokenizer_name") or recipe.get("model_name_or_path"):
        return f"Tokenizer: reused from `{recipe.get('tokenizer_name') or recipe.get('model_name_or_path')}`."
    return (f"Tokenizer: one joint source+target BPE vocabulary of {recipe.get('tokenizer_vocab_size')} pieces trained "
            "on the training split (NFC, SentencePiece-style ▁ word starts, `<pad>`=0, `</s>`=1, `<s>`=2, `<unk>`=3).")


def _recipe_table(title: str, recipe: Mapping[str, Any], fields: Sequence[str]) -> str:
    rows = [(f"`{name}`", recipe[name]) for name in fields if recipe.get(name) is not None]
    return f"**{title}**\n\n" + (_table(("setting", "value"), rows) if rows else "(defaults)")


def _results_section(recipe: dict, results: dict) -> str:
    if not results:
        return ("## Results\n\nNo results yet: this card was rendered from the recipe, before training. A model "
                "pushed with `hf_relpos.hub.push_model_folder` carries the scores of its run.")
    rows = []
    for prefix, values in results.items():
        split = RESULT_PREFIXES[prefix]
        count = values.get(f"{prefix}_samples")
        rows.append((
            _split_title(recipe, split) + (f" ({count} pairs)" if count else ""),
            f"{values[f'{prefix}_bleu']:.2f}",
            f"{values[f'{prefix}_chrf']:.2f}" if f"{prefix}_chrf" in values else "",
            f"`{values.get(f'{prefix}_bleu_signature', '')}`",
        ))
    caveat = ""
    if recipe.get("max_eval_samples") and "eval" in results:
        caveat = f" The validation score covers the first {recipe['max_eval_samples']} pairs only."
    return (
        "## Results\n\n"
        "Corpus-level sacreBLEU and chrF (the `sacrebleu` library) of beam-search translations against the raw, "
        f"detokenized references.{caveat}\n\n" + _table(("evaluation set", "sacreBLEU", "chrF", "BLEU signature"), rows)
    )


def _usage_section(repo_id: str, source: str) -> str:
    example = {"de": "Der Hund schläft.", "en": "The dog is sleeping."}.get(source, "...")
    return f"""## How to use

With the `hf_relpos` package installed, `import hf_relpos` registers the model with the Auto classes:

```python
import hf_relpos  # noqa: F401
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{repo_id}")
model = AutoModelForSeq2SeqLM.from_pretrained("{repo_id}")
inputs = tokenizer(["{example}"], return_tensors="pt")
output_ids = model.generate(**inputs, num_beams=4, max_new_tokens=128)
print(tokenizer.batch_decode(output_ids, skip_special_tokens=True))
```

Without it, the modeling code stored in this repository is used (read it first):

```python
tokenizer = AutoTokenizer.from_pretrained("{repo_id}", trust_remote_code=True)
model = AutoModelForSeq2SeqLM.from_pretrained("{repo_id}", trust_remote_code=True)
```

transformers 5 removed the built-in translation pipeline; this repository ships one (`{PIPELINE_FILE}`):

```python
from transformers import pipeline

translator = pipeline("translation", model="{repo_id}", trust_remote_code=True)
translator("{example}")  # [{{"translation_text": "..."}}]
```"""


def _limitations_section(config: RelPosTransformerConfig, recipe: dict, source: str, target: str) -> str:
    items = [
        f"Intended for research on position representations and for {_language(source)}→{_language(target)} "
        "sentence translation in the training domain; it is not a general-purpose or production translation system.",
        "Sentence-level: it translates one sentence at a time and never sees document context.",
        "Outputs can be fluent and wrong (omissions, hallucinated content, wrong names and numbers); BLEU and chrF "
        "measure n-gram overlap with one reference, not adequacy. Do not use it where mistranslation causes harm.",
        "It reproduces the biases of its training data (e.g. gender stereotypes in the target language) and has "
        "no content filtering.",
    ]
    if recipe.get("max_source_length"):
        items.append(f"Training pairs were at most {recipe['max_source_length']} source and "
                     f"{recipe.get('max_target_length')} target tokens; much longer inputs are out of distribution.")
    if recipe.get("dataset_name") == "bentrevett/multi30k":
        items.append("Multi30k holds short image captions; expect poor quality on news, dialogue or technical text.")
    if recipe.get("dataset_name") == "demo":
        items.append("The demo corpus is a small generated German-like language, not real German.")
    items += _scheme_card(config).limitations_for(config)
    return "## Intended use and limitations\n\n" + "\n".join(f"- {item}" for item in items)


def _citation_section(config: RelPosTransformerConfig) -> str:
    entries = "\n\n".join(dict.fromkeys((VASWANI_BIBTEX, *_scheme_card(config).bibtex)))
    return f"## Citation\n\n```bibtex\n{entries}\n```"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def render_recipe_cards(paths: Sequence[str | os.PathLike], out: str | os.PathLike) -> list[Path]:
    """Render `<out>/<recipe>.md` for each recipe YAML (a folder stands for its *.yaml files). A recipe that
    fine-tunes a saved model (`model_name_or_path`) has no architecture of its own and gets no card here: its model's
    config is known only when it trains (train_translation.py writes that card)."""
    recipes = []
    for path in map(Path, paths):
        recipes += sorted(path.glob("*.yaml")) if path.is_dir() else [path]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in recipes:
        recipe = load_recipe(path)
        if recipe.get("model_name_or_path"):
            continue
        card = render_model_card(config_from_recipe(recipe), recipe, recipe_name=path.stem)
        target = out / f"{path.stem}.md"
        target.write_text(card, encoding="utf-8")
        written.append(target)
    return written


# --------------------------------------------------------------------------------------------------- pushing

def files_to_push(folder: str | os.PathLike) -> dict[str, Path]:
    """The files of a saved model folder that go to the Hub, by name: weights, config, generation config, remote
    code, tokenizer. Raises ValueError, naming what is missing, for a folder that would not load from the Hub."""
    folder = Path(folder)
    config_path = folder / CONFIG_NAME
    if not config_path.is_file():
        raise ValueError(f"{folder} has no {CONFIG_NAME}: save the model there with save_pretrained first")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    auto_map = config.get("auto_map") or {}
    if config.get("model_type") != RelPosTransformerConfig.model_type or "AutoModelForSeq2SeqLM" not in auto_map:
        raise ValueError(f"{config_path} is not a RelPosTransformer config with an auto_map for AutoModelForSeq2SeqLM; "
                         "save the model with hf_relpos imported")
    names = {CONFIG_NAME, *REQUIRED_TOKENIZER_FILES}
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
    names |= {name for name in (GENERATION_CONFIG_NAME, *OPTIONAL_TOKENIZER_FILES) if (folder / name).is_file()}
    missing = sorted(name for name in names if not (folder / name).is_file())
    if missing:
        raise ValueError(f"{folder} lacks {', '.join(missing)}: a pushed model needs its weights (safetensors), "
                         "remote code and tokenizer (save the tokenizer next to the model)")
    return {name: folder / name for name in sorted(names)}


def push_model_folder(
    folder: str | os.PathLike,
    repo_id: str,
    *,
    recipe: Mapping[str, Any] | None = None,
    results: Mapping[str, Mapping[str, Any]] | None = None,
    recipe_name: str | None = None,
    card: str | None = None,
    token: str | None = None,
    private: bool | None = None,
    commit_message: str = "Upload hf_relpos translation model",
) -> str:
    """Upload a trained model folder to the Hub repository `repo_id` (created if needed) in one commit; returns the
    commit URL.

    Pushed: the files of `files_to_push`, `pipeline_relpos.py`, config.json declaring that pipeline, and README.md
    (`card`, or rendered from the config, `recipe` and `results`; `results` default to the folder's
    `{eval,test}_results.json`). The folder is only read until the commit succeeds; then README.md,
    pipeline_relpos.py and config.json are written into it, so it matches the repository. A failed upload raises
    `HubPushError` naming the repository and leaves the folder byte-for-byte as it was.
    """
    folder = Path(folder)
    files = files_to_push(folder)
    config = json.loads(files[CONFIG_NAME].read_text(encoding="utf-8"))
    if card is None:
        results = load_results(folder) if results is None else results
        card = render_model_card(config, recipe, results, repo_id=repo_id, recipe_name=recipe_name)
    generated = {
        CONFIG_NAME: _config_json(with_translation_pipeline(config)),
        PIPELINE_FILE: pipeline_source(),
        CARD_FILE: card,
    }
    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(path))
                  for name, path in files.items() if name not in generated]
    operations += [CommitOperationAdd(path_in_repo=name, path_or_fileobj=text.encode("utf-8"))
                   for name, text in generated.items()]
    api = HfApi(token=token)
    try:
        repo_url = api.create_repo(repo_id, private=private, exist_ok=True)
        commit = api.create_commit(repo_url.repo_id, operations=operations, commit_message=commit_message)
    except Exception as error:
        raise HubPushError(f"pushing {folder} to the Hub repository {repo_id!r} failed "
                           f"({type(error).__name__}: {error}); nothing in {folder} was changed") from error
    _write_files(folder, generated)
    return commit.commit_url


def push_training_output(model_args: Any, data_args: Any, training_args: Any) -> str:
    """The `push_to_hub: true` hook of train_translation.py: push `output_dir` (model, tokenizer, results) to
    `hub_model_id` (default: the output folder's name) with a card rendered from the run's arguments."""
    folder = Path(training_args.output_dir)
    return push_model_folder(
        folder,
        training_args.hub_model_id or folder.resolve().name,
        recipe=recipe_from_arguments(model_args, data_args, training_args),
        token=training_args.hub_token,
        private=training_args.hub_private_repo,
    )


def _config_json(config: Mapping[str, Any]) -> str:
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def _write_files(folder: Path, texts: Mapping[str, str]) -> None:
    """Write each file atomically (`write_text_atomic`), so none is ever left half-written."""
    for name, text in texts.items():
        write_text_atomic(folder / name, text)


# --------------------------------------------------------------------------------------------------- command line

def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hf_relpos.hub", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    render = commands.add_parser("render-cards", help="render model_cards/<recipe>.md for recipe YAML files")
    render.add_argument("paths", nargs="+", help="recipe .yaml files or folders of them")
    render.add_argument("--out", default="model_cards", help="output folder (default: model_cards)")
    push = commands.add_parser("push", help="push a trained model folder with its card")
    push.add_argument("folder")
    push.add_argument("repo_id")
    push.add_argument("--recipe", help="the recipe YAML the model was trained with (for the card)")
    push.add_argument("--private", action="store_true", help="create the repository as private")
    args = parser.parse_args(argv)
    if args.command == "render-cards":
        for path in render_recipe_cards(args.paths, args.out):
            print(path)
    else:
        recipe = load_recipe(args.recipe) if args.recipe else None
        recipe_name = Path(args.recipe).stem if args.recipe else None
        print(push_model_folder(args.folder, args.repo_id, recipe=recipe, recipe_name=recipe_name,
                                private=args.private or None))


if __name__ == "__main__":
    main()
