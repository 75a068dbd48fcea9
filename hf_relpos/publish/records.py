"""The typed record of a training run, written by train_translation.py and by every experiment that trains, and
read by the model cards (hf_relpos.publish.hub); and the facts of where and with what a run ran.

An experiment stores the `RunRecord.to_json()` of each of its runs in its result JSON, as a list under `RECORDS`;
`read_run_records` loads them (and, through `legacy_run_record`, the runs of results written before they carried
them)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DATA, OPTIMISATION, DECODING, SETTING = "data", "optimisation", "decoding", "setting"


class RecipeLoader(yaml.SafeLoader):
    """PyYAML's safe loader (YAML 1.1) that also reads YAML 1.2's floats: 1e-3, 1e4, 2E+3 are numbers, not strings,
    and refuses a key given twice in one mapping, as YAML 1.2 does (PyYAML keeps the last one without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """The mapping, after checking its own keys (a merge's, `<<: *base`, may be overridden) for one given twice:
        a `ConstructorError` naming the key and both lines."""
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = self.construct_object(key_node)
            if key in lines:
                raise yaml.constructor.ConstructorError(
                    None, None, f"found the key {key!r} twice in a mapping, on line {lines[key]} and line "
                    f"{key_node.start_mark.line + 1}: give each field once", key_node.start_mark)
            lines[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))

# The numbers YAML 1.1 reads otherwise than YAML 1.2, Python and a command-line flag: an integer with a leading zero,
# octal in YAML 1.1 (010 is 8, elsewhere 10), and numbers joined by ':', base 60 in YAML 1.1 (1:30 is 90, elsewhere
# text)
YAML_1_1_NUMBER = re.compile(r"[-+]?(?:0[0-7_]+|[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?)")


class AmbiguousNumber(str):
    """A plain scalar that `RecipeLoader` keeps as its text, as written, where YAML 1.1 would read a number that YAML
    1.2 reads otherwise (`YAML_1_1_NUMBER`): a field that takes text takes it as it is, a number field refuses it
    (`ambiguous_number_error`)."""

    def yaml_1_1_value(self) -> int | float:
        """What YAML 1.1 (PyYAML's safe loader) reads."""
        return yaml.safe_load(str(self))


def _construct_number(kind: str) -> Any:
    def construct(loader: RecipeLoader, node: yaml.ScalarNode) -> Any:
        if YAML_1_1_NUMBER.fullmatch(node.value):
            return AmbiguousNumber(node.value)
        return getattr(yaml.SafeLoader, f"construct_yaml_{kind}")(loader, node)

    return construct


for _kind in ("int", "float"):
    RecipeLoader.add_constructor(f"tag:yaml.org,2002:{_kind}", _construct_number(_kind))


def ambiguous_number_error(name: str, value: Any) -> str | None:
    """The error for a value of the number field `name` (unnamed: "") that is, or holds, an `AmbiguousNumber`; None
    for any other value."""
    if isinstance(value, (list, tuple)):
        return next(filter(None, (ambiguous_number_error(name, item) for item in value)), None)
    if isinstance(value, dict):
        return next(filter(None, (ambiguous_number_error(name, item) for item in value.values())), None)
    if not isinstance(value, AmbiguousNumber):
        return None
    yaml_1_1 = value.yaml_1_1_value()
    if ":" in value:
        elsewhere, reading, remedy = "text", "base-60", f"write the number as a decimal ({yaml_1_1} or what you meant)"
    else:
        decimal = int(value.replace("_", ""))
        elsewhere, reading, remedy = f"{decimal}", "octal", f"write {yaml_1_1} or {decimal} without a leading zero"
    return (f"{name + ': ' if name else ''}{value} is ambiguous: YAML 1.1 (how recipes and --model.NAME values are "
            f"read) takes it as the {reading} number {yaml_1_1}, YAML 1.2 as {elsewhere}; {remedy}")


def load_yaml(stream: Any) -> Any:
    """A recipe file (or a value of one: a --model.FIELD flag's) read as YAML with `RecipeLoader`."""
    return yaml.load(stream, Loader=RecipeLoader)


def load_recipe(path: str | os.PathLike) -> dict[str, Any]:
    """A recipe YAML file (configs/*.yaml) as its mapping of field: value, an empty file as an empty one; one
    ValueError naming the file for text that is not UTF-8, invalid YAML or any other top level (a list, a bare
    value)."""
    with open(path, encoding="utf-8") as handle:
        try:
            recipe = load_yaml(handle)
        except yaml.YAMLError as error:
            raise ValueError(f"{path}: invalid YAML: {error}") from None
        except UnicodeDecodeError as error:
            raise ValueError(f"{path}: not UTF-8 text ({error}): save the recipe as UTF-8") from None
    if recipe is None:
        return {}
    if not isinstance(recipe, dict):
        raise ValueError(f"{path}: a recipe's top level must be a mapping of field: value, got {type(recipe).__name__}")
    return recipe


def recipe_scalar_texts(path: str | os.PathLike) -> dict[str, str]:
    """Each top-level field of a recipe file (`load_recipe`, which checks the file first) whose value is a plain
    (unquoted) scalar -> that value as written: `no`, `010`, `1.10`, `2024-01-01`, which YAML 1.1 reads as false, 8,
    1.1 and a date. Fields merged in (`<<: *base`) count, and one set beside the merge replaces the merged value, as in
    the mapping `load_recipe` returns."""
    with open(path, encoding="utf-8") as handle:
        loader = RecipeLoader(handle)
        try:
            node = loader.get_single_node()
            if isinstance(node, yaml.MappingNode):
                loader.flatten_mapping(node)
        finally:
            loader.dispose()
    if not isinstance(node, yaml.MappingNode):
        return {}
    values = {key.value: value for key, value in node.value if isinstance(key, yaml.ScalarNode)}   # the last wins
    return {key: value.value for key, value in values.items()
            if isinstance(value, yaml.ScalarNode) and value.style is None}


def type_kinds(hint: Any) -> set[Any]:
    """The types a type hint admits besides None: each member of a union (`int | None` -> {int})."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    return set(typing.get_args(hint) if union else (hint,)) - {type(None)}


def takes_text(hint: Any) -> bool:
    """Whether a field of this type takes text and, as its type says, neither true/false, a number nor a literal value
    (e.g. `trackio_static_space_id`'s false): such a field reads its flag's text, and a recipe's plain scalar as
    written (`recipe_scalar_texts`), whatever it looks like."""
    kinds = type_kinds(hint)
    return str in kinds and not any(kind in (bool, int, float) or typing.get_origin(kind) is typing.Literal
                                    for kind in kinds)


def value_as_written(value: Any, written: str | None) -> Any:
    """A recipe's value of a field that takes it as text (`takes_text`), as the same text given as a flag is: a plain
    scalar as `written` in the file (`recipe_scalar_texts`; `target_lang: no` is Norwegian, `run_name: 010` keeps its
    digits, where YAML 1.1 reads false and 8); a null, a list, a mapping or a quoted scalar as YAML reads it."""
    return value if value is None or isinstance(value, (list, dict)) or written is None else written


def load_card_recipe(path: str | os.PathLike) -> dict[str, Any]:
    """A recipe file as its card reads it, as the training app does: `load_recipe`'s mapping, with the value of each
    `RunRecord` field that takes text (`takes_text`) `value_as_written`."""
    recipe = load_recipe(path)
    hints = typing.get_type_hints(RunRecord)
    written = recipe_scalar_texts(path)
    return recipe | {name: value_as_written(recipe[name], written.get(name)) for name in RunRecord.recipe_fields()
                     if name in recipe and takes_text(hints[name])}


def _recipe_field(section: str, default: Any = None) -> Any:
    """A field that is also a train_translation.py argument of that name; `section` is the card table it is listed
    in (`SETTING`: used in the text, in no table)."""
    return dataclasses.field(default=default, metadata={"section": section})


RECIPE, PEER = "recipe", "peer"
SCHEME_FIELD = "position_scheme"   # the model config field naming the position scheme
ROLES = (RECIPE, PEER)
# weights of a run whose scores cover one set of weights only (the trained ones)
TRAINED_WEIGHTS = ""
RUN_RECORD_FILE = "run_record.json"   # what train_translation.py writes into its output_dir
AVERAGED_CHECKPOINTS_FILE = "averaged_checkpoints.json"   # which checkpoints an averaged model folder holds
CTRANSLATE2_EXPORT_RECORD = "ctranslate2_export.json"   # marks a folder of hf-relpos-export ctranslate2
CONVERSION_RECORD_FILE = "conversion.json"   # what hf-relpos-convert writes into the folder of a converted model
RECORDS = "records"   # an experiment result's key for the `RunRecord.to_json()` of each of its runs
RESULT_SPLITS = {"eval": "validation", "test": "test"}   # train_translation.py's metric prefix -> split
# split -> the setting that keeps its first N pairs only (a run's preparation, a card naming a scored slice)
SAMPLE_CAPS = {"train": "max_train_samples", "validation": "max_eval_samples", "test": "max_predict_samples"}
# What train_translation.py writes per metric prefix: the Trainer's `save_metrics` file and the translations.
RESULTS_FILE = "{prefix}_results.json"
ALL_RESULTS_FILE = "all_results.json"   # the Trainer's merge of every RESULTS_FILE
HYPOTHESES_FILE = "{prefix}_hypotheses.txt"


@dataclass(frozen=True)
class Scores:
    """Corpus scores of one evaluation set (sacreBLEU's BLEU and chrF, and the hypothesis/reference length ratio
    where measured)."""

    bleu: float
    chrf: float
    bleu_signature: str
    length_ratio: float | None = None

    @classmethod
    def of(cls, scores: Mapping[str, Any]) -> Scores:
        """The scores of `hf_relpos.translation.metrics.score_translations` (or an experiment's copy of them)."""
        return cls(scores["bleu"], scores["chrf"], scores["bleu_signature"], scores.get("length_ratio"))


@dataclass(frozen=True)
class MeasuredScores:
    """One evaluation set's corpus scores over seeds (one value per seed)."""

    evaluation_set: str
    bleu: tuple[float, ...]
    chrf: tuple[float, ...]
    signature: str


@dataclass(frozen=True)
class Measurement:
    """Models trained with a recipe, as a committed record of runs reports them (`measurements_from_record`)."""

    record: str               # the record file, as cited in the card
    title: str                # what the experiment measured
    setup: str                # its settings, as the record's report states them
    trained_as: str           # the recipe and the flags the runs added
    code: str                 # the code versions the runs trained from (`git describe`), as the record has them
    seeds: tuple[int, ...]
    steps: tuple[int, ...]
    hardware: str
    devices: int
    batch: str                # what one optimizer update holds
    training_minutes: tuple[float, ...]
    date: str
    scores: tuple[MeasuredScores, ...]


@dataclass
class RunRecord:
    """A training run, or a recipe before any run, as its model card describes it.

    The fields with a section carry the names of train_translation.py's arguments and are listed in the card's tables
    under those names; `RunRecord.from_recipe` reads them from a recipe YAML, `hf_relpos.translation.run_outputs.run_record` from a
    finished run. The run's own facts (`devices`, `hardware`, `training_seconds`) and the committed measurements of
    its recipe complete the card.
    """

    model: dict[str, Any] = dataclasses.field(default_factory=dict)  # the recipe's `model:` section
    source_lang: str = _recipe_field(SETTING, "en")
    target_lang: str = _recipe_field(SETTING, "de")
    validation_split_name: str = _recipe_field(SETTING, "validation")
    test_split_name: str = _recipe_field(SETTING, "test")
    bleu_tokenize: str | None = _recipe_field(SETTING)   # sacreBLEU's tokenization of its BLEU; None: by target_lang
    dataset_name: str | None = _recipe_field(DATA)
    dataset_config_name: str | None = _recipe_field(DATA)
    demo_train_pairs: int | None = _recipe_field(DATA)
    demo_validation_pairs: int | None = _recipe_field(DATA)
    demo_test_pairs: int | None = _recipe_field(DATA)
    demo_seed: int | None = _recipe_field(DATA)
    train_file: str | None = _recipe_field(DATA)
    validation_file: str | None = _recipe_field(DATA)
    test_file: str | None = _recipe_field(DATA)
    max_train_samples: int | None = _recipe_field(DATA)
    max_eval_samples: int | None = _recipe_field(DATA)
    max_predict_samples: int | None = _recipe_field(DATA)
    max_source_length: int | None = _recipe_field(DATA)
    max_target_length: int | None = _recipe_field(DATA)
    overlong_pairs: str | None = _recipe_field(DATA)
    concatenated_pairs: float | None = _recipe_field(DATA)
    max_pairs_per_join: int | None = _recipe_field(DATA)
    model_name_or_path: str | None = _recipe_field(DATA)
    tokenizer_name: str | None = _recipe_field(DATA)
    tokenizer_vocab_size: int | None = _recipe_field(DATA)
    tokenizer_character_coverage: float | None = _recipe_field(DATA)
    max_steps: int | None = _recipe_field(OPTIMISATION)
    num_train_epochs: float | None = _recipe_field(OPTIMISATION)
    max_tokens_per_batch: int | None = _recipe_field(OPTIMISATION)
    length_pool_factor: int | None = _recipe_field(OPTIMISATION)
    per_device_train_batch_size: int | None = _recipe_field(OPTIMISATION)
    gradient_accumulation_steps: int | None = _recipe_field(OPTIMISATION)
    optim: str | None = _recipe_field(OPTIMISATION)
    adam_beta1: float | None = _recipe_field(OPTIMISATION)
    adam_beta2: float | None = _recipe_field(OPTIMISATION)
    adam_epsilon: float | None = _recipe_field(OPTIMISATION)
    weight_decay: float | None = _recipe_field(OPTIMISATION)
    learning_rate: float | None = _recipe_field(OPTIMISATION)
    lr_scheduler_type: str | None = _recipe_field(OPTIMISATION)
    warmup_steps: int | None = _recipe_field(OPTIMISATION)
    label_smoothing_factor: float | None = _recipe_field(OPTIMISATION)
    max_grad_norm: float | None = _recipe_field(OPTIMISATION)
    bf16: bool | None = _recipe_field(OPTIMISATION)
    fp16: bool | None = _recipe_field(OPTIMISATION)
    seed: int | None = _recipe_field(OPTIMISATION)
    data_seed: int | None = _recipe_field(OPTIMISATION)   # None: the batches and joins are drawn from `seed`
    average_checkpoints: int | None = _recipe_field(OPTIMISATION)
    early_stopping_patience: int | None = _recipe_field(OPTIMISATION)
    early_stopping_threshold: float | None = _recipe_field(OPTIMISATION)
    metric_for_best_model: str | None = _recipe_field(OPTIMISATION)
    load_best_model_at_end: bool | None = _recipe_field(OPTIMISATION)   # the weights are the best checkpoint's
    fade_absolute_positions: int | None = _recipe_field(OPTIMISATION)
    generation_num_beams: int | None = _recipe_field(DECODING)
    generation_length_penalty: float | None = _recipe_field(DECODING)
    generation_max_length_ratio: float | None = _recipe_field(DECODING)   # None: 1, the argument's default
    generation_max_length_offset: int | None = _recipe_field(DECODING)
    generation_max_length: int | None = _recipe_field(DECODING)
    # the final evaluation and prediction in half precision (the Trainer casts the model; the weights stay as trained)
    bf16_full_eval: bool | None = _recipe_field(DECODING)
    fp16_full_eval: bool | None = _recipe_field(DECODING)
    devices: int | None = None            # processes that trained it together (data parallel)
    sharded: bool | None = None           # those processes sharded the parameters (FSDP) instead of each holding all
    hardware: str | None = None           # e.g. the GPU's name
    training_seconds: float | None = None
    role: str = RECIPE                    # RECIPE: hf_relpos trained by a recipe; PEER: a model it is compared with
    recipe: str | None = None             # the recipe it trained from (configs/ file stem), if any
    system: str | None = None             # the experiment's name for what it trained (a row, a system)
    trained_as: str | None = None         # how, in one line: the recipe and the flags the run added
    working_directory: str | None = None  # where it was started: what the relative paths of `trained_as` start from
    resumed_from: str | None = None       # the checkpoint a resumed run continued from (e.g. checkpoint-300)
    # split -> where the run's prepared data came from: its folder, key and whether an earlier run prepared it (reused)
    prepared_from: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    # what the run was started by: hf-relpos-train, train_translation.py (by the path given) or -m MODULE (python -m)
    program: str | None = None
    hub_model_id: str | None = None       # the Hub repository the run's card names (title, usage), if it named one
    steps: int | None = None
    epochs: float | None = None           # the epochs those steps made (the Trainer's `epoch`; early stopping: fewer)
    source_version: str | None = None     # `git describe` of the code that trained it
    date: str | None = None               # ISO 8601, when it was recorded
    software: dict[str, str] = dataclasses.field(default_factory=dict)   # releases it ran with (`software_versions`)
    scores: dict[str, dict[str, Scores]] = dataclasses.field(default_factory=dict)  # weights -> split -> scores
    # what corpus BLEU and chrF do not measure: evaluation -> measure -> value (e.g. "20-30" -> "accuracy" -> 0.9)
    metrics: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    measurements: list[Measurement] = dataclasses.field(default_factory=list)   # runs of its recipe (for a card)

    def __post_init__(self) -> None:
        """Refuse an unknown role; a whole-number float in an integer field (the Trainer's float `warmup_steps`)
        becomes an int, so that 50 is recorded and shown as 50, not 50.0."""
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {list(ROLES)}, got {self.role!r}")
        for name in INTEGER_FIELDS:
            value = getattr(self, name)
            if isinstance(value, float) and value.is_integer():
                setattr(self, name, int(value))

    @classmethod
    def recipe_fields(cls, section: str | None = None) -> tuple[str, ...]:
        """The names of the fields that come from the recipe (of one card section, if given), in card order."""
        return tuple(item.name for item in dataclasses.fields(cls)
                     if "section" in item.metadata and section in (None, item.metadata["section"]))

    @classmethod
    def from_recipe(cls, recipe: Mapping[str, Any]) -> RunRecord:
        """The record of a recipe YAML (its `model:` section, each field under its current name, and the argument
        fields it sets)."""
        return cls(model=current_model_fields(recipe.get("model") or {}),
                   **{name: recipe[name] for name in cls.recipe_fields() if name in recipe})

    def to_json(self) -> dict[str, Any]:
        """This run as JSON values (what an experiment stores under a run's "record"; not its measurements)."""
        values = dataclasses.asdict(self)
        del values["measurements"]
        return values

    @classmethod
    def from_json(cls, values: Mapping[str, Any]) -> RunRecord:
        """The inverse of `to_json`."""
        scores = {weights: {split: Scores(**split_scores) for split, split_scores in by_split.items()}
                  for weights, by_split in values.get("scores", {}).items()}
        return cls(**{**values, "scores": scores, "model": current_model_fields(values.get("model", {}))})


# The fields typed `int | None`, whose values `RunRecord` keeps integers.
INTEGER_FIELDS = tuple(name for name, hint in typing.get_type_hints(RunRecord).items() if hint == int | None)


def cpu_model_name() -> str:
    """The processor's model name (/proc/cpuinfo on Linux, `platform.processor()` elsewhere)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def source_version(checkout: Path) -> str:
    """`git describe --always --dirty` of the git checkout at `checkout` (which code ran; "unknown" outside one, or
    without git)."""
    try:
        described = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=checkout, capture_output=True,
                                   text=True)
    except FileNotFoundError:
        return "unknown"
    return described.stdout.strip() or "unknown"


# The folder above the hf_relpos package: its git checkout where it runs from one (not from site-packages).
PACKAGE_CHECKOUT = Path(__file__).resolve().parents[2]


def checkout_version(checkout: Path) -> str:
    """`source_version` of the checkout whose experiment or benchmark scripts run, which must be the checkout hf_relpos
    is imported from: otherwise the record would name code that did not run (an environment installed from another
    checkout imports that one's package)."""
    if PACKAGE_CHECKOUT != Path(checkout).resolve():
        raise SystemExit(f"hf_relpos is imported from {PACKAGE_CHECKOUT / 'hf_relpos'}, not from the checkout of these "
                         f"scripts ({Path(checkout).resolve()}): a record would name code that did not run; run them "
                         f"with PYTHONPATH={Path(checkout).resolve()}")
    return source_version(checkout)


def runs_under_python(program: str) -> bool:
    """Whether `program` (a run's, `RunRecord.program`) is a script or `-m MODULE`, which python runs, rather than a
    console script."""
    return program.endswith(".py") or program.startswith("-m ")


def accelerate_program(program: str) -> str:
    """`program` (a run's: train_translation.py, -m MODULE or hf-relpos-train) as `accelerate launch` starts it: a
    script by its path, a module after `-m`, a console script after `--no_python` (else accelerate runs `python
    hf-relpos-train`, a file not there)."""
    return program if runs_under_python(program) else f"--no_python {program}"


def package_version() -> str | None:
    """Which hf_relpos code runs, for a run's `source_version`: `source_version` of the git checkout it runs from (a
    commit, `-dirty` with uncommitted changes), else `installed_version()` (None where neither is known)."""
    if (PACKAGE_CHECKOUT / ".git").exists():
        described = source_version(PACKAGE_CHECKOUT)
        if described != "unknown":
            return described
    return installed_version()


def installed_version() -> str | None:
    """The installed package's version; for an install from a git URL (`pip install git+https://...@ref`), with the
    commit pip recorded (PEP 610 `direct_url.json`, `vcs_info.commit_id`) as a local version label, `0.1.0+g1a2b3c4`,
    since a version alone does not say which commit of a branch ran (a version that has a local label already is kept
    as it is). None where hf_relpos is not installed."""
    try:
        distribution = importlib.metadata.distribution("hf_relpos")
    except importlib.metadata.PackageNotFoundError:
        return None
    try:
        vcs = json.loads(distribution.read_text("direct_url.json") or "{}").get("vcs_info", {})
        commit = vcs.get("commit_id") if vcs.get("vcs") == "git" else None
    except (ValueError, AttributeError):
        commit = None
    if not isinstance(commit, str) or not commit or "+" in distribution.version:   # a local label cannot take a second
        return distribution.version
    return f"{distribution.version}+g{commit[:7]}"


def software_versions() -> dict[str, str]:
    """The releases a run trained and was scored with: python, torch, transformers, sacrebleu."""
    import sacrebleu
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "sacrebleu": sacrebleu.__version__}


def read_run_records(path: str | os.PathLike) -> list[RunRecord]:
    """Every run of an experiment's result JSON (`run_records`); ValueError for a JSON with neither `RECORDS` nor
    "runs" (another JSON, e.g. a benchmark's), whose runs would otherwise be none."""
    result = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(result, dict) or not {RECORDS, "runs"} & result.keys():
        raise ValueError(f"not an experiment record (a JSON object with {RECORDS!r} or 'runs', as experiments/ writes)")
    return run_records(result)


def training_record(output_dir: str | os.PathLike) -> RunRecord | None:
    """The record train_translation.py wrote into `output_dir` (`RUN_RECORD_FILE`); None where no run of it trained
    there (a model trained otherwise, e.g. a peer)."""
    path = Path(output_dir) / RUN_RECORD_FILE
    return RunRecord.from_json(json.loads(path.read_text(encoding="utf-8"))) if path.is_file() else None


# the architecture of each model type hf-relpos-convert reads, as its users know it
CONVERTED_ARCHITECTURES = {"marian": "MarianMT"}


@dataclass(frozen=True)
class ConversionRecord:
    """What `hf-relpos-convert` converted into a model folder: the pretrained model (`source`, as given: a Hub id or a
    folder; `source_on_hub`: whether it was read from the Hub), its architecture (`source_type`, e.g. marian), the
    converted model's positions (`position_scheme`, `keep_absolute_positions`) and `--set` fields (`settings`),
    whether the converted model computes the source's logits (`reproduces_source`: the same positions, or the hybrid)
    and the source's license as its model card's metadata gives it (`source_license`, a Hub license id such as
    cc-by-4.0; None: not known, as for a source whose card names none or a record written before it was kept)."""

    source: str
    source_on_hub: bool
    source_type: str
    position_scheme: str
    reproduces_source: bool
    keep_absolute_positions: bool = False
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    source_license: str | None = None

    @property
    def architecture(self) -> str:
        return CONVERTED_ARCHITECTURES.get(self.source_type, self.source_type)

    def save(self, folder: str | os.PathLike) -> None:
        Path(folder, CONVERSION_RECORD_FILE).write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n",
                                                        encoding="utf-8")


def conversion_record(folder: str | os.PathLike) -> ConversionRecord | None:
    """The `ConversionRecord` hf-relpos-convert wrote into `folder`; None for a folder it did not write."""
    path = Path(folder) / CONVERSION_RECORD_FILE
    return ConversionRecord(**json.loads(path.read_text(encoding="utf-8"))) if path.is_file() else None


def run_records(result: Mapping[str, Any]) -> list[RunRecord]:
    """Every run of an experiment's result: its `RECORDS` (`RunRecord.to_json()` of each run); for a result written
    before results carried them, each run of its "runs" (by system) as its "record" says or `legacy_run_record`
    reads it."""
    if RECORDS in result:
        return [RunRecord.from_json(values) for values in result[RECORDS]]
    if isinstance(result.get("runs"), list):
        return legacy_model_runs(result)
    return [RunRecord.from_json(run["record"]) if "record" in run else legacy_run_record(system, run, result)
            for system, runs in result.get("runs", {}).items() for run in runs]


def gather_run_records(result: dict[str, Any]) -> dict[str, Any]:
    """`result` (an experiment's, its runs by system under "runs") with the typed record of each run moved from the
    run's "record" to the result's `RECORDS` (`legacy_run_record` for a run saved before runs carried one)."""
    result[RECORDS] = [record.to_json() for record in run_records(result)]
    for runs in result["runs"].values():
        for run in runs:
            run.pop("record", None)
    return result


# Records written before runs carried a `RunRecord` name the peer's systems so (vs_marian.py's and convergence.py's
# "peer", "peer+recipe-tokenizer", "peer+recipe-training"); every other system trained a recipe.
LEGACY_PEER_PREFIX = "peer"


def legacy_run_record(system: str, run: Mapping[str, Any], data: Mapping[str, Any]) -> RunRecord:
    """The `RunRecord` of a run in a record written before runs carried one: its role from the system's name
    (`LEGACY_PEER_PREFIX`), its recipe and the recipe fields it set from its train_translation.py arguments (the
    recipe file first, then `--name value` flags, the last of a name winning), its batch from what the experiment
    measured of it, its description from the record's rows or settings."""
    settings = data.get("settings", {})
    role = PEER if system.startswith(LEGACY_PEER_PREFIX) else RECIPE
    argv = run.get("argv") or []
    recipe = Path(argv[0]).stem if role == RECIPE and argv else None
    described = data.get("rows", {}).get(system, {}).get("system")
    scores = scores_by_weights(run["scores"])
    batches = run.get("batches", {})
    # (flag, value) for each flag; a flag followed by another flag (or last) is a boolean switch: "true"
    pairs = [(name, "true" if index + 1 == len(argv) or argv[index + 1].startswith("--") else argv[index + 1])
             for index, name in enumerate(argv) if index > 0 and name.startswith("--")]
    flags = {name.removeprefix("--"): _argument_value(name.removeprefix("--"), value) for name, value in pairs
             if name.startswith("--") and name.removeprefix("--") in RunRecord.recipe_fields()}
    model_flags = current_model_fields({name.removeprefix("--model."): value for name, value in pairs
                                        if name.startswith("--model.")})
    flags["model"] = {SCHEME_FIELD: model_flags[SCHEME_FIELD]} if SCHEME_FIELD in model_flags else {}   # other scheme
    measured = {"max_tokens_per_batch": batches["token_budget"],
                "gradient_accumulation_steps": batches["gradient_accumulation_steps"]} if batches else {}
    return RunRecord(**{
        **flags, **measured, "role": role, "recipe": recipe, "system": system, "seed": run["seed"],
        "trained_as": described or " ".join([f"{recipe}.yaml", *settings.get("recipe_flags", [])]),
        "steps": run.get("steps") or settings.get("max_steps"), "source_version": run.get("source_version"),
        "hardware": data["device"], "devices": 1, "training_seconds": run["train_seconds"],
        "date": run.get("date", data["date"]), "software": run.get("versions", {}),
        "average_checkpoints": settings.get("last_n") if "averaged" in scores else None, "scores": scores})


def legacy_model_runs(result: Mapping[str, Any]) -> list[RunRecord]:
    """The runs of a result of experiments/length_generalization.py written before results carried records (its
    "runs" a list): each seed of a trained run ("per_seed", in the order of the settings' seeds), or a saved model it
    scored ("result"), with its exact match and BLEU per bucket as metrics."""
    settings = result["settings"]
    records = []
    for run in result["runs"]:
        scheme = current_model_fields(run).get(SCHEME_FIELD)
        scored = [(None, run["result"])] if "result" in run else zip(settings["seeds"], run["per_seed"], strict=True)
        for seed, by_bucket in scored:
            records.append(RunRecord(
                model={SCHEME_FIELD: scheme, **run["overrides"]} if scheme is not None else {},
                system=run["name"], seed=seed, steps=settings["steps"] if seed is not None else None,
                date=result["date"], metrics={bucket: {"accuracy": values["accuracy"], "bleu": values["bleu"]}
                                              for bucket, values in by_bucket.items()}))
    return records


def current_model_fields(model: Mapping[str, Any]) -> dict[str, Any]:
    """A run's model config fields, each under its current name: records written before a field was renamed hold
    its deprecated name (the config's `DEPRECATED_FIELDS`), read here without a warning; records stay as written."""
    from ..model.configuration_relpos import DEPRECATED_FIELDS  # here: reading records needs no torch otherwise

    return {DEPRECATED_FIELDS.get(name, name): value for name, value in model.items()}


_NULLS = ("null", "None")


def _argument_value(name: str, text: str) -> Any:
    """A train_translation.py flag's value as the type of the `RunRecord` field it sets ("null": None)."""
    kind = next(item.type for item in dataclasses.fields(RunRecord) if item.name == name)
    if text in _NULLS:
        return None
    if kind.startswith("bool"):
        return text.lower() == "true"
    if kind.startswith("int"):
        return int(text)
    if kind.startswith("float"):
        return float(text)
    return text


def scores_from_results(results: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Scores]]:
    """`RunRecord.scores` of train_translation.py's metrics ({"eval": {"eval_bleu": ...}, "test": ...})."""
    by_split = {split: Scores(metrics[f"{prefix}_bleu"], metrics[f"{prefix}_chrf"], metrics[f"{prefix}_bleu_signature"],
                              metrics.get(f"{prefix}_length_ratio"))
                for prefix, split in RESULT_SPLITS.items()
                if (metrics := results.get(prefix)) and f"{prefix}_bleu" in metrics}
    return {TRAINED_WEIGHTS: by_split} if by_split else {}


def scores_by_weights(scores: Mapping[str, Any]) -> dict[str, dict[str, Scores]]:
    """An experiment's scores of a run ({split: {"bleu", "chrf", "bleu_signature", ...}}, or that by weights such
    as "final" and "averaged") as `RunRecord.scores`."""
    by_weights = {TRAINED_WEIGHTS: scores} if "test" in scores else scores
    return {weights: {split: Scores.of(values) for split, values in by_split.items()}
            for weights, by_split in by_weights.items()}
