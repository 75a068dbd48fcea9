"""The arguments of train_translation.py: three argument dataclasses, the model config fields of the YAML's `model:`
section, and one parser for both.

`python train_translation.py CONFIG.yaml [--FIELD VALUE ...]`: the YAML file is loaded into the defaults of an
`HfArgumentParser` (the pattern of TRL's `TrlParser`), so flags override it and `--help` shows every field with the
value this run would use. Everything that is wrong with the arguments alone is one `ConfigError`, raised before
anything is read, trained or written.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import functools
import importlib
import inspect
import json
import logging
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from huggingface_hub.utils import HFValidationError, validate_repo_id
from transformers import HfArgumentParser, PreTrainedConfig, Seq2SeqTrainingArguments
from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK, get_available_reporting_integrations
from transformers.utils import is_torch_bf16_gpu_available

from ..model.attention_functions import check_dropout_kernel, check_kernel_name, registered_kernels
from ..model.configuration_relpos import (
    DEPRECATED_FIELDS,
    OtherModelTypeError,
    RelPosTransformerConfig,
    refuse_unread_scheme_fields,
    rename_deprecated_fields,
)
from ..model.modeling_relpos import check_encoder_decoder_config, meta_model
from ..model.positions import POSITION_SCHEMES, UnregisteredSchemeError, scheme_config_fields
from ..model.validation import (
    closest_name,
    is_finite_number,
    is_int_at_least,
    is_non_negative_number,
    is_positive_number,
    require_int,
    require_name_or_null,
    require_probability,
)
from ..publish.files import expand_home
from ..publish.hub import CARD_FILE, fine_tuned_base
from ..publish.records import (
    CONVERTED_ARCHITECTURES,
    RunRecord,
    accelerate_program,
    ambiguous_number_error,
    conversion_record,
    load_recipe,
    load_yaml,
    recipe_scalar_texts,
    takes_text,
    type_kinds,
    value_as_written,
)
from .data import DataArguments
from .metrics import BLEU_TOKENIZERS, GENERATED_METRICS, HIGHER_IS_BETTER, bleu_metric, check_bleu_tokenize
from .preflight import check_local_folder, check_model_source
from .tokenization import BYTE_TOKENS, DECODER_START_TOKENS, SPECIAL_TOKENS, require_character_coverage

logger = logging.getLogger(__name__)

MODEL_SECTION = "model"
EARLY_STOPPING_METRIC = "bleu"   # what early_stopping_patience watches unless metric_for_best_model is set
# Config fields set from the tokenizer or by transformers itself; a YAML `model:` section may not set them.
DERIVED_CONFIG_FIELDS = frozenset({
    "vocab_size", "pad_token_id", "eos_token_id", "bos_token_id", "decoder_start_token_id", "is_encoder_decoder",
})
NULL_TOKENS = ("null", "None")
CONSOLE_SCRIPT, SCRIPT = "hf-relpos-train", "train_translation.py"
TRAINING_MODULE = "hf_relpos.translation.training"   # `python -m` runs the same main


def started_program() -> str:
    """The program this process was started as, written as a command in its working directory starts it again: the
    console script by its name (found on PATH), train_translation.py by the path it was given as (`python
    ../train_translation.py`), the training module as `-m MODULE` (`python -m`, `accelerate launch -m`)."""
    given = sys.argv[0]
    if os.path.basename(given) == CONSOLE_SCRIPT:
        return CONSOLE_SCRIPT
    if os.path.basename(given) == SCRIPT:
        return given
    if given and Path(given).resolve() == Path(__file__).with_name("training.py").resolve():
        return f"-m {TRAINING_MODULE}"
    return SCRIPT


def program_name() -> str:
    """The name the help and errors give the program, as a command that starts it (`started_program`): the console
    script's, `python -m MODULE` for the module, else the script's (`train_translation.py`)."""
    started = started_program()
    if started == CONSOLE_SCRIPT:
        return CONSOLE_SCRIPT
    return f"python {started}" if started.startswith("-m ") else SCRIPT


PROGRAM = program_name()
# report_to integrations with an hf_relpos extra that installs their package.
REPORTING_EXTRAS = ("tensorboard", "wandb")


class ConfigError(ValueError):
    """A YAML file or command-line flag is wrong; raised before anything is trained or written."""


IMPORT_MODULES = "import_modules"
IMPORT_MODULES_HELP = ("Python modules imported before anything else (fairseq's --user-dir): each a module name "
                       "importable from the current directory or a .py file. Those that register position schemes "
                       "of your own (@register_position_scheme, docs/extending.md), whose names and fields the "
                       "arguments may then use and whose models may then load.")


def import_modules_hint(error: BaseException) -> str:
    """What the hf_relpos commands add to an error naming a scheme no imported module registered
    (`UnregisteredSchemeError`, also as the cause of another): the flag that imports that module; else nothing."""
    while error is not None:
        if isinstance(error, UnregisteredSchemeError):
            return f"; with this command, name that module with --{IMPORT_MODULES} MODULE (a module or a .py file)"
        error = error.__cause__ or error.__context__
    return ""


def add_import_modules_argument(parser: argparse.ArgumentParser) -> None:
    """`--import_modules MODULE [MODULE ...]` (also dashed), for the commands that load models by scheme."""
    parser.add_argument(f"--{IMPORT_MODULES}", f"--{IMPORT_MODULES.replace('_', '-')}", dest=IMPORT_MODULES,
                        nargs="+", default=[], metavar="MODULE", help=IMPORT_MODULES_HELP)


class _ScanParser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(message)


def import_modules_of(argv: Sequence[str], default: Any = ()) -> list[str]:
    """Import the modules that `--import_modules` names in `argv` (else `default`: a recipe's `import_modules`)
    before the rest of `argv` is parsed, where registered schemes' names and fields must already be known; returns
    their names."""
    scan = _ScanParser(add_help=False, allow_abbrev=False)
    add_import_modules_argument(scan)
    scan.set_defaults(**{IMPORT_MODULES: default})
    names = scan.parse_known_args(argv)[0].import_modules
    import_user_modules(names)
    return names


def import_user_modules(names: Any) -> None:
    """Import each module of `names`: a module name importable from the current directory (put first on sys.path, as
    `python -m` does), or a .py file (imported under its file name, its folder put first on sys.path). A module
    that is not there is one ConfigError naming `import_modules`."""
    if isinstance(names, str) or not isinstance(names, (list, tuple)) or not all(
            isinstance(name, str) and name for name in names):
        raise ConfigError(f"{IMPORT_MODULES} must be a list of module names or .py files, got {names!r}")
    for name in names:
        path = Path(name).resolve() if name.endswith(".py") else None
        if path is not None and not path.is_file():
            raise ConfigError(f"{IMPORT_MODULES}: no such file {name!r}")
        folder, module_name = (str(path.parent), path.stem) if path is not None else (os.getcwd(), name)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name is None or not (module_name + ".").startswith(error.name + "."):
                raise   # a module that the user's module imports
            raise ConfigError(f"{IMPORT_MODULES}: no module named {name!r} in the current directory ({os.getcwd()}) "
                              "or on the Python path: give a module name importable from the current directory or "
                              "the path of a .py file") from None
        if path is not None and Path(module.__file__ or "").resolve() != path:
            raise ConfigError(f"{IMPORT_MODULES}: {name!r} would be imported as the module {module_name!r}, which is "
                              f"{module.__file__} in this process: rename the file")


@dataclass
class ModelArguments:
    """Which model and tokenizer to start from. The YAML `model:` section holds `RelPosTransformerConfig` fields."""

    _argument_group_name = "model: where to start from"

    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Saved model folder or Hub id to fine-tune or evaluate; null trains from scratch. Its saved "
                          "config is the architecture: model: fields that would change the weights' shapes are "
                          "refused, others (e.g. dropout) override it. Without training (do_train false) the "
                          "recipe file's model: fields are ignored (one warning names those that differ); only "
                          "--model.FIELD flags override."},
    )
    tokenizer_name: str | None = field(
        default=None,
        metadata={"help": "Saved tokenizer folder or Hub id, used as it is; null takes the model's tokenizer, or the "
                          "one saved in output_dir when it was trained with this run's settings, or trains a joint "
                          "BPE tokenizer on the training split."},
    )
    tokenizer_vocab_size: int = field(
        default=8000,
        metadata={"help": "Vocabulary size of a newly trained tokenizer, 4 special and 256 byte-fallback tokens "
                          "included (as SentencePiece counts)."},
    )
    tokenizer_character_coverage: float = field(
        default=1.0,
        metadata={"help": "SentencePiece's character_coverage for a newly trained tokenizer, a number in (0, 1]: its "
                          "alphabet keeps the most frequent characters of the training texts that together make up "
                          "this share of all character occurrences; rarer characters get no piece of their own and "
                          "are encoded as their UTF-8 bytes (byte fallback), leaving those vocabulary slots to "
                          "merges. 1.0: every character, as far as the vocabulary has room; below 1 for corpora with "
                          "a long tail of rare characters (web crawl; SentencePiece's default is 0.9995)."},
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Cache folder for Hub datasets and models."})
    import_modules: list[str] = field(default_factory=list, metadata={"help": IMPORT_MODULES_HELP})
    attn_implementation: str | None = field(
        default=None,
        metadata={"help": "Attention kernel, transformers' attn_implementation (passed to from_pretrained or to the "
                          "new model's config; not saved with the model): eager, sdpa, flex_attention or "
                          "relpos_triton (hf_relpos' kernels, which run every scheme; relpos_triton fuses shaw on "
                          "CUDA and runs the rest on sdpa), or a transformers kernel such as flash_attention_2 "
                          "(only for schemes that add no bias, mask or value term to attention, e.g. absolute, "
                          "rope). null: the model's default (sdpa)."},
    )
    decoder_start_token: str | None = field(
        default=None,
        metadata={"help": f"The token a new model's decoder starts from: one of {list(DECODER_START_TOKENS)} (bos: "
                          "the tokenizer's <s>; pad: <pad>, as HF Marian and T5 start; eos: </s>, as fairseq and BART "
                          "start). null: bos for a new model; a model_name_or_path keeps the one it was trained with "
                          "(naming another is an error)."},
    )
    model_config: dict[str, Any] = field(default_factory=dict, init=False)
    # The recipe YAML the arguments came from, as given (None: flags only), and the flags given after it, secrets
    # hidden (`without_secrets`: they go into the run record and the model card).
    recipe_file: str | None = field(default=None, init=False)
    recipe_flags: tuple[str, ...] = field(default=(), init=False)
    # Whether the recipe YAML itself resumes (sets resume_from_checkpoint): a command that trains the run from the start
    # must then say `--resume_from_checkpoint null`.
    recipe_resumes: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        for name, names in (("model_name_or_path", "a saved model folder or a Hub model id"),
                            ("tokenizer_name", "a saved tokenizer folder or a Hub model id"),
                            ("cache_dir", "a folder")):
            require_name_or_null(name, getattr(self, name), names)
            setattr(self, name, expand_home(getattr(self, name)))
        if self.attn_implementation is not None:
            check_attn_implementation(self.attn_implementation)
        if self.decoder_start_token is not None and self.decoder_start_token not in DECODER_START_TOKENS:
            raise ValueError(f"decoder_start_token must be one of {list(DECODER_START_TOKENS)}, got "
                             f"{self.decoder_start_token!r}")


def attention_implementations() -> list[str]:
    """The kernels an `attn_implementation` may name (the model's rule, `check_kernel_name`), for help texts."""
    return registered_kernels()


def check_attn_implementation(name: str) -> str:
    """`name` when the model takes it as a kernel name, else one ValueError naming the allowed values."""
    return check_kernel_name(name)


@dataclass
class TranslationTrainingArguments(Seq2SeqTrainingArguments):
    """`Seq2SeqTrainingArguments` plus token-budget batching, paper-style decoding and safe reruns."""

    _argument_group_name = "training: Seq2SeqTrainingArguments and hf_relpos's additions"

    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Train from scratch in an output_dir that holds a trained model or checkpoints: the "
                          "tokenizer is trained again, and the old model, checkpoints and results are removed once "
                          "the new run starts writing. Without it such a folder is refused (or resume with "
                          "resume_from_checkpoint: last)."},
    )
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata={"help": "Continue a run: a checkpoint folder (it must be a complete checkpoint), or last (true "
                          "alike) for the newest complete checkpoint-<step> in output_dir. Where a training run's "
                          "output_dir has none, last trains from step 0 with a warning, provided that loses nothing "
                          "(output_dir does not exist yet, or holds no finished model: only checkpoints cut short, "
                          "a tokenizer, prepared data), so that a requeued job reruns one command at every start; "
                          "beside a finished model, or in a run that trains nothing, it is an error. Where the run "
                          "has ended its training (all its steps, or early stopping; with or without checkpoints) and "
                          "saved its final model but was stopped before its run record, last finishes it without training (evaluation, prediction, record, push)."},
    )
    push_to_hub: bool = field(
        default=False,
        metadata={"help": "After training, evaluation and prediction, push output_dir once (weights, code, tokenizer "
                          "and the run's model card, no checkpoints) to hub_model_id (docs/hub.md). Needs do_train; "
                          "the Hub login is checked before training. The Trainer's own pushes (hub_strategy) stay "
                          "off."},
    )
    hub_model_id: str | None = field(
        default=None,
        metadata={"help": "The Hub repository push_to_hub pushes to, USER/NAME or NAME (in your namespace). null: "
                          "the name of output_dir's folder."},
    )
    max_tokens_per_batch: int | None = field(
        default=None,
        metadata={"help": "Token budget per device and batch (padded size: examples x longest source and x longest "
                          "target). null batches by per_device_train_batch_size, ordered by train_sampling_strategy "
                          "(which a token budget must leave at random)."},
    )
    length_pool_factor: int | None = field(
        default=None,
        metadata={"help": "With max_tokens_per_batch: sort by length only within random pools of about this many "
                          "batches' worth of tokens, drawn afresh each pass (OpenNMT-py's pool_factor): batches mix "
                          "lengths and change every pass, at the cost of more padding (fewer pairs per batch; raise "
                          "max_tokens_per_batch to keep them). null sorts the whole corpus (fairseq): the least "
                          "padding, one length per batch. Ignored (with a warning) without max_tokens_per_batch."},
    )
    generation_length_penalty: float = field(
        default=0.6, metadata={"help": "Beam-search length penalty (Vaswani et al.: 0.6)."}
    )
    generation_max_length_ratio: float = field(
        default=1.0,
        metadata={"help": "fairseq's max_len_a: each output may have at most this x its source length (in tokens, "
                          "end token included) + generation_max_length_offset new tokens; saved in "
                          "generation_config.json (max_len_a), so generate() and the pipeline apply it per input."},
    )
    generation_max_length_offset: int = field(
        default=50,
        metadata={"help": "fairseq's max_len_b: new tokens beyond generation_max_length_ratio x source length "
                          "(Vaswani et al.: input length + 50); saved in generation_config.json (max_len_b); "
                          "generation_max_length, when set, caps it."},
    )
    generation_max_length: int | None = field(
        default=None,
        metadata={"help": "Cap on the generated length in tokens, the decoder start token included (generate's "
                          "max_length), whatever the source's length. null: max_position_embeddings is the only "
                          "cap beyond the source-relative one. generation_config.json saves it as max_new_tokens = "
                          "min(this - 1, max_position_embeddings - 1) (max_length is left unset there: with both, "
                          "generate(max_new_tokens=...) warns)."},
    )
    average_checkpoints: int | None = field(
        default=None,
        metadata={"help": "After training, make the final model (saved, evaluated and predicted with) the average of "
                          "this run's last N checkpoints (Vaswani et al. 2017: 5 for base, 20 for big models; "
                          "hf_relpos.tools.average does the same afterwards). Needs save_strategy steps or epoch and "
                          "save_total_limit null or >= N; averages fewer, with a warning, if the run saved fewer. "
                          "null: the final weights."},
    )
    fade_absolute_positions: int | None = field(
        default=None,
        metadata={"help": "For a model with keep_absolute_positions (a MarianMT model converted with "
                          "--keep_absolute_positions, docs/conversion.md): fade its sinusoidal absolute positions "
                          "out linearly over the first N optimizer steps, so that it ends on its relative terms alone. "
                          "The config's absolute_positions_scale is s0 (1 - step / N), s0 its value when training "
                          "starts: step 1 trains the model as loaded; checkpoints and the final model save the scale "
                          "they were trained to (0 after the fade). null: the sinusoids stay as they are."},
    )
    early_stopping_patience: int | None = field(
        default=None,
        metadata={"help": "Stop training once metric_for_best_model (default: bleu on the validation set) has gone "
                          "this many evaluations in a row without improving on its best by more than "
                          "early_stopping_threshold (transformers' EarlyStoppingCallback; a resumed run keeps the "
                          "count, and a checkpoint whose count reaches it is not resumed). Needs eval_strategy steps or epoch. The final model is then the last weights, the "
                          "average of the last average_checkpoints checkpoints, or with load_best_model_at_end the "
                          "best checkpoint. null: train for num_train_epochs or max_steps."},
    )
    early_stopping_threshold: float = field(
        default=0.0,
        metadata={"help": "With early_stopping_patience: the least change of metric_for_best_model (in its units, "
                          "BLEU points by default) that counts as an improvement."},
    )
    cpu_threads: int | None = field(
        default=None,
        metadata={"help": "torch.set_num_threads for CPU work; 1 is fastest for tiny models and on busy machines. "
                          "null keeps torch's default."},
    )
    predict_with_generate: bool = field(default=True, metadata={"help": "Score generated translations (BLEU)."})
    bleu_tokenize: str | None = field(
        default=None,
        metadata={"help": f"sacreBLEU's tokenization of BLEU, one of {', '.join(BLEU_TOKENIZERS)} (its --tokenize). "
                          "null: sacreBLEU's choice for target_lang, as its command line chooses: zh for zh, ja-mecab "
                          "for ja, ko-mecab for ko, else 13a. ja-mecab needs pip install 'sacrebleu[ja]', ko-mecab "
                          "'sacrebleu[ko]' (checked before training). The BLEU signature names it (tok:...)."},
    )
    generation_num_beams: int | None = field(
        default=4, metadata={"help": "Beam size (Vaswani et al.: 4; 1 = greedy); saved in generation_config.json."}
    )

    prepare_only: bool = field(
        default=False,
        metadata={"help": "Load the data, train and save the tokenizer in output_dir and tokenize, then stop before "
                          "training: a separate first step (one process, e.g. on a CPU machine) whose tokenizer a "
                          "later run with the same data settings reuses. Needs do_train (the tokenizer is trained "
                          "on the training split)."},
    )
    bf16_if_supported: bool = field(
        default=False,
        metadata={"help": "Train with bf16 autocast (the Trainer's bf16) where the GPU supports it (Ampere or newer), "
                          "in float32 elsewhere (CPU, use_cpu, older GPUs), so one recipe runs on both. bf16: true "
                          "forces bf16 (an error where it is unsupported)."},
    )

    def __post_init__(self) -> None:
        check_bleu_tokenize(self.bleu_tokenize, "bleu_tokenize")
        require_name_or_null("hub_model_id", self.hub_model_id, "a Hub repository, USER/NAME or NAME")
        for name in self._VALID_DICT_FIELDS:   # transformers json.loads these, and its error names no field
            value = getattr(self, name)
            if isinstance(value, str) and value.startswith("{"):
                try:
                    json.loads(value)
                except json.JSONDecodeError as error:
                    raise ValueError(f'{name} must be a JSON object such as {{"key": 1}} (its keys in double '
                                     f"quotes), got {value!r}: {error}") from None
        self.resume_from_checkpoint = expand_home(self.resume_from_checkpoint)   # output_dir: transformers expands it
        if self.bf16_if_supported and not (self.bf16 or self.fp16):
            self.bf16 = not self.use_cpu and is_torch_bf16_gpu_available()
            logger.info("bf16_if_supported: %s", "bf16 autocast on this GPU" if self.bf16 else
                        "float32 (no GPU with bf16 here, or use_cpu)")
        super().__post_init__()
        # transformers takes `accelerate launch`'s mixed_precision (ACCELERATE_MIXED_PRECISION) when bf16 and fp16 are
        # off: the YAML's precision is the run's (docs/training.md, Multi-GPU), whatever the launch config says. Said
        # by the processes that log (one per machine), not by every rank of the launch.
        launched_with = self.mixed_precision
        self.mixed_precision = "bf16" if self.bf16 else "fp16" if self.fp16 else "no"
        if launched_with != self.mixed_precision and self.should_log:
            logger.warning("accelerate's mixed_precision %r is not used: the run trains in %s, as the training YAML "
                           "says (bf16_if_supported, bf16, fp16)", launched_with,
                           "float32" if self.mixed_precision == "no" else self.mixed_precision)
        if not torch.accelerator.is_available():   # use_cpu: transformers turns pinning off itself
            self.dataloader_pin_memory = False   # nothing to pin to: spares torch's warning per DataLoader


ARGUMENT_CLASSES = (ModelArguments, DataArguments, TranslationTrainingArguments)
Arguments = tuple[ModelArguments, DataArguments, TranslationTrainingArguments]


def model_config_fields() -> set[str]:
    """The `RelPosTransformerConfig` fields a YAML `model:` section (or a flat key / `--model.NAME` flag) may set,
    including those the registered position schemes declare."""
    inherited = {item.name for item in dataclasses.fields(PreTrainedConfig)}
    own = {item.name for item in dataclasses.fields(RelPosTransformerConfig)} - inherited | set(scheme_config_fields())
    return own - DERIVED_CONFIG_FIELDS


def _argument_fields() -> dict[str, type]:
    """Every init field of the argument dataclasses, by name, with the class that holds it."""
    return {item.name: argument_class for argument_class in ARGUMENT_CLASSES
            for item in dataclasses.fields(argument_class) if item.init}


# --------------------------------------------------------------------------------------------------- help texts

def _backtick_description(docstring: str, name: str) -> str:
    """What a prose docstring says right after `name`: its parenthesis, or the rest of its bullet after a colon."""
    match = re.search(rf"`{name}`(?: \(|: )", docstring)
    if match is None:
        return ""
    rest = docstring[match.end():]
    if match.group(0).endswith("("):
        depth = 1
        for position, character in enumerate(rest):
            depth += {"(": 1, ")": -1}.get(character, 0)
            if depth == 0:
                return " ".join(rest[:position].split())
        return ""
    return " ".join(re.split(r"\n\s*-|\n\n", rest, maxsplit=1)[0].split())


def config_field_help(name: str) -> str:
    """Help for a model config field, read at run time: the declaring position scheme's `SchemeField.help`, else what
    the docstring of RelPosTransformerConfig says of it."""
    scheme_field = scheme_config_fields().get(name)
    if scheme_field is not None:
        return scheme_field.help
    own_docstring = inspect.getdoc(RelPosTransformerConfig) or ""
    described = _backtick_description(own_docstring, name)
    if name == "position_scheme":   # the registry as it is at run time, registered schemes included
        described += f" One of: {', '.join(sorted(POSITION_SCHEMES))}."
    return described


# --------------------------------------------------------------------------------------------------- the parser

class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults after each field's help, an unset one as "null" (how the YAML and the command line write it); the
    description and epilog keep their line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None and action.help and "%(default)" not in action.help:
            return f"{action.help} (default: null)"
        return super()._get_help_string(action)


DESCRIPTION = f"""\
Train, evaluate and score a RelPosTransformer translation model with the Hugging Face Seq2SeqTrainer.

The YAML file (first argument) fills the fields below; flags after it override the YAML: --FIELD VALUE or
--FIELD=VALUE, a bare --FLAG for true, null for an optional field. Model architecture fields go in the YAML's
'{MODEL_SECTION}:' section or on the command line as --{MODEL_SECTION}.FIELD VALUE (or --FIELD VALUE when no other
field has that name). With a YAML file before --help, the defaults shown are the YAML's values."""

EPILOG = f"""\
examples:
  {PROGRAM} configs/demo.yaml --overwrite_output_dir true
  {PROGRAM} configs/wmt14_en_de_base_shaw.yaml --max_steps 1000 --model.dropout 0.2
  {PROGRAM} configs/wmt14_en_de_base_shaw.yaml --resume_from_checkpoint last
  {PROGRAM} configs/demo.yaml --model_name_or_path outputs/demo --do_train false --output_dir outputs/demo_eval
  accelerate launch --config_file configs/accelerate/multi_gpu.yaml {accelerate_program(started_program())} configs/NAME.yaml

See docs/training.md for every recipe."""


class TranslationArgumentParser(HfArgumentParser):
    """`HfArgumentParser` over the three argument dataclasses plus the model config fields (`--model.NAME`), whose
    errors are one `ConfigError` (argparse would print the usage and exit) and whose `--help` exits 0."""

    def __init__(self, model_values: dict[str, Any] | None = None) -> None:
        super().__init__(prog=PROGRAM, usage=f"{PROGRAM} CONFIG.yaml [--FIELD VALUE ...] [--{MODEL_SECTION}.FIELD "
                                             "VALUE ...]", description=DESCRIPTION, epilog=EPILOG,
                         formatter_class=_HelpFormatter, allow_abbrev=False)
        self.dataclass_types = list(ARGUMENT_CLASSES)
        model_arguments, data_arguments, training_arguments = ARGUMENT_CLASSES
        self._add_dataclass_arguments(model_arguments)
        self._add_model_config_arguments(model_values or {})
        self._add_dataclass_arguments(data_arguments)
        self._add_dataclass_arguments(training_arguments)
        self._accept_null_for_optional_fields()

    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(message)

    def _add_model_config_arguments(self, model_values: dict[str, Any]) -> None:
        group = self.add_argument_group(
            f"model: architecture (RelPosTransformerConfig; the YAML's '{MODEL_SECTION}:' section, or "
            f"--{MODEL_SECTION}.FIELD VALUE; values are read as YAML, e.g. [forward, backward])")
        defaults = RelPosTransformerConfig()   # a scheme's fields are on the config of that scheme only
        scheme_defaults = {name: field.default for name, field in scheme_config_fields().items()}
        argument_fields = _argument_fields()
        for name in sorted(model_config_fields()):
            plain = name not in argument_fields  # a training field of the same name (use_cache) keeps the plain flag
            value = model_values.get(name, scheme_defaults[name] if name in scheme_defaults else getattr(defaults, name))
            help_text = config_field_help(name).replace("%", "%%")
            common = dict(dest=f"{MODEL_SECTION}.{name}", type=_yaml_value, nargs="?", const=True,
                          default=argparse.SUPPRESS, metavar="VALUE")
            group.add_argument(f"--{MODEL_SECTION}.{name}", *[f"--{name}"] * plain, **common,
                               help=f"{help_text} (default: {yaml_text(value)})".lstrip())
            dashed = name.replace("_", "-")
            if dashed != name:  # --model.d-model as HfArgumentParser accepts --max-train-samples; not listed
                group.add_argument(f"--{MODEL_SECTION}.{dashed}", *[f"--{dashed}"] * plain, **common,
                                   help=argparse.SUPPRESS)
        for old_name in DEPRECATED_FIELDS:   # --model.OLD_NAME (and --OLD_NAME) still set the field; not listed
            group.add_argument(f"--{MODEL_SECTION}.{old_name}", f"--{old_name}", dest=f"{MODEL_SECTION}.{old_name}",
                               type=_yaml_value, nargs="?", const=True, default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    def _accept_null_for_optional_fields(self) -> None:
        """`--name null` (or None) sets an optional field to None, as `name: null` does in the YAML."""
        optional = {name for name, argument_class in _argument_fields().items() if _is_optional(argument_class, name)}
        for action in self._actions:
            if action.dest in optional and action.type is not None:
                action.type = _or_null(action.type)


def _or_null(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert_or_null(text: str) -> Any:
        return None if text in NULL_TOKENS else convert(text)

    convert_or_null.__name__ = getattr(convert, "__name__", "value")  # argparse names it in "invalid int value"
    return convert_or_null


def _yaml_value(text: str) -> Any:
    try:
        value = load_yaml(text)
    except yaml.YAMLError as error:
        raise argparse.ArgumentTypeError(f"{text!r} is not a YAML value ({error.problem})") from None
    if ambiguous := ambiguous_number_error("", value):   # argparse names the flag
        raise argparse.ArgumentTypeError(ambiguous)
    return value


def yaml_text(value: Any) -> str:
    """`value` as YAML writes it in flow style (null, true, 400, [a, b]): how messages name a setting's value."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


@functools.cache
def _type_hints(argument_class: type) -> Mapping[str, Any]:
    """The argument class's field types, its annotations (text under `from __future__ import annotations`) evaluated
    once per class: typing.get_type_hints evaluates all of them on every call, and a call per field made that most of
    building the parser."""
    return types.MappingProxyType(typing.get_type_hints(argument_class))


def _is_optional(argument_class: type, name: str) -> bool:
    return type(None) in typing.get_args(_type_hints(argument_class)[name])


# transformers' fields declared as text that it also takes as a list
LIST_TAKING_TEXT_FIELDS = {"fsdp"}


def _field_kinds(argument_class: type, name: str) -> set[Any]:
    """The types a field's type admits besides None (`type_kinds`)."""
    return type_kinds(_type_hints(argument_class)[name])


def _is_single_value(argument_class: type, name: str) -> bool:
    """Whether the field holds one value, never a list or a mapping, as its type says: a number, true/false or text
    (but `LIST_TAKING_TEXT_FIELDS`)."""
    kinds = _field_kinds(argument_class, name)
    return kinds <= {int, float, bool} or (kinds == {str} and name not in LIST_TAKING_TEXT_FIELDS)


def _takes_text(argument_class: type, name: str) -> bool:
    """Whether the field takes text, as its type says (`takes_text`): its flag is its text, whatever it looks like."""
    return takes_text(_type_hints(argument_class)[name])


def _check_single_values(values: dict[str, Any]) -> None:
    """A YAML list or mapping left for a single-valued field (a flag of the field replaces it) is one ConfigError."""
    for name, argument_class in _argument_fields().items():
        value = values.get(name)
        if isinstance(value, (list, dict)) and _is_single_value(argument_class, name):
            shape = "a list" if isinstance(value, list) else "a mapping"
            raise ConfigError(f"{name} must be a single value, got {shape} {value!r}")


def _check_choices(parser: argparse.ArgumentParser, values: dict[str, Any]) -> None:
    """A recipe's value of a field with choices (`eval_strategy`, `optim`, `log_level`, ...) outside them is one
    ConfigError naming the field, as argparse names a flag's: argparse checks the command line only, not the defaults
    the recipe fills (transformers' enums then named the enum, not the field, and some fields took any value)."""
    for action in parser._actions:
        value = values.get(action.dest)
        if action.choices is not None and value is not None and value not in action.choices:
            raise ConfigError(f"{action.dest} must be one of {', '.join(map(str, action.choices))}, got {value!r}")


# transformers 4 training fields that transformers 5 removed, where no similar name leads to their replacement (or
# the similar name does not say how it takes the old value).
TRANSFORMERS_4_FIELDS = {
    "group_by_length": "train_sampling_strategy group_by_length",
    "warmup_ratio": "warmup_steps below 1, a fraction of the training steps (warmup_steps 0.1)",
    "no_cuda": "use_cpu",
    "logging_dir": "the TENSORBOARD_LOGGING_DIR environment variable",
}


def flag_field_name(flag: str) -> str:
    """The field a `--name` or `--name=value` flag sets, as the parser also takes it with dashes (--no-cuda for
    no_cuda); `--model.NAME` gives `model.NAME`."""
    return flag.removeprefix("--").partition("=")[0].replace("-", "_")


def given_fields(argv: Sequence[str]) -> set[str]:
    """The fields that flags of the command line `argv` set (`flag_field_name` of each `--name`), not the recipe."""
    return {flag_field_name(flag) for flag in argv if flag.startswith("--")}


def _suggest(key: str, candidates: set[str]) -> str:
    bare = flag_field_name(key).removeprefix(f"{MODEL_SECTION}.")
    if bare in TRANSFORMERS_4_FIELDS:
        return f"{key} (a transformers 4 field; transformers 5 has {TRANSFORMERS_4_FIELDS[bare]} instead)"
    close = closest_name(bare, candidates)
    return f"{key} (did you mean {close}?)" if close else key


def _read_yaml(path: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The recipe file's mapping (`load_recipe`) and its plain scalars as written (`recipe_scalar_texts`)."""
    if not path.endswith((".yaml", ".yml")):
        raise ConfigError(f"the first argument must be a .yaml config file, got {path!r} (see --help)")
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} " + ("is a folder" if os.path.isdir(path) else "does not exist"))
    try:
        return load_recipe(path), recipe_scalar_texts(path)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def _as_default(value: Any, written: str | None = None, takes_text: bool = False) -> Any:
    """A YAML scalar as argparse would read it from the command line (so it is converted and checked by the field's
    type, as a flag is): for a field that takes text (`_takes_text`), its `value_as_written` (`source_lang: no` is
    Norwegian, `hub_model_id: 1.10` and `run_name: 010` keep their digits, where YAML 1.1 reads false, 1.1 and 8); for
    another field, YAML's true/false or number as text (`do_train: yes`, `learning_rate: 1e-4`), and any other scalar
    YAML reads (a date) as written, for the field's type to convert or refuse. Nulls, lists and mappings stay as they
    are."""
    if value is None or isinstance(value, (list, dict)):
        return value
    if takes_text or not isinstance(value, (bool, int, float, str)):
        value = value_as_written(value, written)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return str(value)
    return value


def _key_text(key: Any) -> str:
    """A recipe's key as errors name it: a key YAML 1.1 reads as another value than text (`on:` as true, `~:` as
    null, `1:` as a number) as YAML writes that value."""
    return key if isinstance(key, str) else yaml_text(key)


def _split_yaml(yaml_values: dict[str, Any], imported: Sequence[str] = (),
                written: Mapping[str, str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(argument field defaults, model config) from a YAML mapping; unknown keys, nulls of required fields and a
    config field given both in the `model:` section and as a flat key (the file gives it twice, as a key repeated in
    one mapping, which `load_recipe` refuses) are one ConfigError (`imported`: the modules `import_modules` named,
    `_raise_unknown`; `written`: the file's plain scalars as written, `_as_default`)."""
    written = written or {}
    model_config = yaml_values.pop(MODEL_SECTION, None) or {}
    if not isinstance(model_config, dict):
        raise ConfigError(f"'{MODEL_SECTION}:' must be a mapping of RelPosTransformerConfig fields")
    model_config = _current_field_names(model_config)
    argument_fields = _argument_fields()
    config_fields = model_config_fields()
    defaults: dict[str, Any] = {}
    unknown = [f"{MODEL_SECTION}.{_key_text(key)}" for key in model_config if key not in config_fields]
    for name, value in model_config.items():
        if ambiguous := ambiguous_number_error(f"{MODEL_SECTION}.{_key_text(name)}", value):
            raise ConfigError(ambiguous)
    for name, value in yaml_values.items():
        if name in argument_fields:
            if value is None and not _is_optional(argument_fields[name], name):
                raise ConfigError(f"{name} cannot be null")
            if not _takes_text(argument_fields[name], name) and (ambiguous := ambiguous_number_error(name, value)):
                raise ConfigError(ambiguous)
            defaults[name] = _as_default(value, written.get(name), _takes_text(argument_fields[name], name))
        elif name in config_fields:   # a model field given as a top-level key
            if ambiguous := ambiguous_number_error(name, value):
                raise ConfigError(ambiguous)
            if name in model_config:
                raise ConfigError(f"{name} is given twice: in the '{MODEL_SECTION}:' section ({name}: "
                                  f"{yaml_text(model_config[name])}) and as a top-level key ({name}: "
                                  f"{yaml_text(value)}); give each field once")
            model_config[name] = value
        else:
            unknown.append(_key_text(name))
    if unknown:
        _raise_unknown(unknown, imported)
    return defaults, dict(model_config)


SECRET_SUFFIX = "_token"   # the arguments whose values are secrets (hub_token), as TrainingArguments.to_dict hides them


def without_secrets(flags: Sequence[str]) -> tuple[str, ...]:
    """`flags` with the value of each secret argument (`--NAME value` or `--NAME=value`, NAME ending in
    `SECRET_SUFFIX`, dashed or not) replaced by `<NAME>`, as transformers' `TrainingArguments.to_dict` writes it."""
    shown: list[str] = []
    secret = None
    for flag in flags:
        if secret is not None:
            shown.append(f"<{secret.upper()}>")
            secret = None
            continue
        option, equals, _ = flag.partition("=")
        name = flag_field_name(flag)
        if not (flag.startswith("--") and name.endswith(SECRET_SUFFIX)):
            shown.append(flag)
        elif equals:
            shown.append(f"{option}=<{name.upper()}>")
        else:
            shown.append(flag)
            secret = name
    return tuple(shown)


def _current_field_names(model_config: dict[str, Any]) -> dict[str, Any]:
    """`rename_deprecated_fields` with its error as a ConfigError."""
    try:
        return rename_deprecated_fields(model_config)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def _raise_unknown(keys: Sequence[str], imported: Sequence[str] = ()) -> typing.NoReturn:
    """One ConfigError naming the unknown `keys`; where no module was imported (`imported`, from `import_modules`),
    it says that a scheme's fields are known once the module that registers the scheme is."""
    candidates = set(_argument_fields()) | model_config_fields()
    described = [_suggest(key, candidates) for key in keys]
    own_scheme = "" if imported else (
        f"; the fields of a position scheme registered in your own code are known once --{IMPORT_MODULES} MODULE (a "
        f"recipe's '{IMPORT_MODULES}:') names the module that registers it")
    raise ConfigError(f"unknown key(s): {', '.join(described)}; {PROGRAM} --help lists every field (the config "
                      f"fields under '{MODEL_SECTION}:'){own_scheme}")


def local_main_process() -> bool:
    """Whether this is the main process of its machine: LOCAL_RANK 0 (which `accelerate launch` (torchrun) gives each
    process), or a process not launched at all (rank 0 of an initialized process group, else RANK 0 or unset)."""
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"]) == 0
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank() == 0
    return int(os.environ.get("RANK", "0")) == 0


def parse_arguments(argv: Sequence[str]) -> Arguments:
    """Parse `CONFIG.yaml [--name value ...]`: the YAML fills the argument dataclasses, flags override it.

    A `model:` mapping in the YAML (or flat keys / `--model.NAME` flags naming config fields) becomes
    `ModelArguments.model_config`. No arguments, `-h` or `--help` print the usage and exit 0. Unknown keys, bad values
    and nulls for non-optional fields raise one `ConfigError`. Every process of a launch parses the same arguments:
    the warnings of parsing (said before the run's logging is set up) come from the main process of each machine
    (`local_main_process`) only.
    """
    package_logger = logging.getLogger(__name__.split(".")[0])
    level = package_logger.level
    if not local_main_process():
        package_logger.setLevel(logging.ERROR)
    try:
        return _parse_arguments(argv)
    finally:
        package_logger.setLevel(level)


def _parse_arguments(argv: Sequence[str]) -> Arguments:
    argv = list(argv) or ["--help"]
    recipe_file = argv.pop(0) if not argv[0].startswith("-") else None
    yaml_values, written = _read_yaml(recipe_file) if recipe_file is not None else ({}, {})
    # their schemes' names and fields are arguments
    imported = import_modules_of(argv, yaml_values.get(IMPORT_MODULES, []))
    recipe_flags = without_secrets(argv)
    defaults, model_config = _split_yaml(yaml_values, imported, written)
    parser = TranslationArgumentParser(model_config)
    parser.set_defaults(**defaults)
    namespace, remaining = parser.parse_known_args(argv)
    if remaining:
        flags = [token for token in remaining if token.startswith("-")]
        if not flags:
            raise ConfigError(f"unexpected argument {remaining[0]!r}: give one YAML file first, then --name value "
                              "flags")
        _raise_unknown(flags, imported)
    values = vars(namespace)
    _check_single_values(values)
    _check_choices(parser, values)
    if values.get("early_stopping_patience") is not None and values.get("metric_for_best_model") is None:
        values["metric_for_best_model"] = EARLY_STOPPING_METRIC   # greater_is_better follows from the name
    if not values.get("do_train") and values.get("eval_strategy", "no") != "no":
        # A run that trains nothing: the recipe's evaluations during training (and keeping the best of them) apply to
        # nothing; left on, transformers would turn do_eval on and a predict-only run would need a validation split.
        # (Here, not in TranslationTrainingArguments: a script of one's own may train with do_train left false.)
        logger.info("do_train is false: eval_strategy %r (evaluations during training) does not apply",
                    values["eval_strategy"])
        values["eval_strategy"], values["load_best_model_at_end"] = "no", False
    warn_overridden_do_eval(values, argv)
    if (not values.get("do_train") and values.get("average_checkpoints") is not None
            and "average_checkpoints" not in given_fields(argv)):
        # The recipe's choice of a training run's final model (the WMT14 recipes average their last checkpoints):
        # a run that only scores or translates a saved model with the recipe has nothing to average. Given as a
        # flag, it stays an error (check_checkpoint_averaging).
        logger.info("do_train is false: the recipe's average_checkpoints %d (the final model of a training run) "
                    "does not apply", values["average_checkpoints"])
        values["average_checkpoints"] = None
    if not values.get("do_train") and values.get("enable_jit_checkpoint"):
        # Nothing to checkpoint: the Trainer's SIGTERM handler, restored only when training ends, would leave the
        # signal ignored for the rest of the run.
        logger.info("do_train is false: enable_jit_checkpoint (a checkpoint of training on SIGTERM) does not apply")
        values["enable_jit_checkpoint"] = False
    command_line = _current_field_names({dest.removeprefix(f"{MODEL_SECTION}."): values.pop(dest)
                                         for dest in [dest for dest in values if dest.startswith(f"{MODEL_SECTION}.")]})
    model_config.update(command_line)
    from_command_line = set(command_line)
    built = []
    for argument_class in ARGUMENT_CLASSES:
        names = {item.name for item in dataclasses.fields(argument_class) if item.init}
        try:
            built.append(argument_class(**{name: values[name] for name in names}))
        except (ValueError, TypeError, ImportError) as error:   # ImportError: a flag's package (deepspeed) missing
            raise ConfigError(str(error)) from None
    model_args, data_args, training_args = built
    model_args.model_config = model_config
    model_args.recipe_file, model_args.recipe_flags = recipe_file, recipe_flags
    model_args.recipe_resumes = yaml_values.get("resume_from_checkpoint") not in (None, *NULL_TOKENS)
    check_arguments(model_args, training_args)
    check_model_sources(model_args)
    warn_training_without_recipe(model_args, training_args, argv)
    warn_unread_tokenizer_flags(model_args, argv)
    check_bleu_tokenizer(data_args, training_args)
    model_args.model_config = check_model_config(model_args, from_command_line, training=training_args.do_train)
    if training_args.do_train:   # a model of this package, its config read (`check_model_config`)
        check_fine_tuned_base_license(model_args)
    check_training_kernel(model_args, training_args)
    check_every_parameter_trains(model_args, training_args)
    return model_args, data_args, training_args


# --------------------------------------------------------------------------------------------------- checks

# Settings of a tokenizer the run trains, which a run that uses the tokenizer of tokenizer_name or model_name_or_path
# does not read.
NEW_TOKENIZER_FIELDS = ("tokenizer_vocab_size", "tokenizer_character_coverage", "tokenizer_training_pairs")


# What a recipe sets for a model trained from scratch (by the fields that set it), left without one at transformers'
# defaults for fine-tuning.
RECIPE_TRAINING_FIELDS = (("learning_rate",), ("warmup_steps",), ("max_tokens_per_batch", "per_device_train_batch_size"),
                          ("label_smoothing_factor",))


def warn_training_without_recipe(model_args: ModelArguments, training_args: TranslationTrainingArguments,
                                 flags: Sequence[str]) -> None:
    """One warning when a new model trains without a recipe YAML and the flags leave some of `RECIPE_TRAINING_FIELDS`
    at transformers' defaults (learning rate 5e-5, no warm-up, 8 sentences a batch, no label smoothing: settings for
    fine-tuning a pretrained model), naming them and the recipe to start from."""
    if model_args.recipe_file is not None or model_args.model_name_or_path is not None or not training_args.do_train:
        return
    given = given_fields(flags)
    defaults = [f"{names[-1]} {getattr(training_args, names[-1])}" for names in RECIPE_TRAINING_FIELDS
                if not given.intersection(names)]
    if defaults:
        logger.warning("training a new model without a recipe YAML: %s %s transformers' default%s for fine-tuning a "
                       "pretrained model, with which a model trained from scratch learns little; start from a recipe "
                       "and override what differs, e.g. %s configs/multi30k_small_directional.yaml --train_file ... "
                       "(docs/training.md)", ", ".join(defaults), "is" if len(defaults) == 1 else "are",
                       "" if len(defaults) == 1 else "s", PROGRAM)


def warn_unread_tokenizer_flags(model_args: ModelArguments, flags: Sequence[str]) -> None:
    """One warning naming the `NEW_TOKENIZER_FIELDS` given as flags when the run trains no tokenizer (the recipe's
    values are left unread without a word: a recipe of a model trained from scratch sets them)."""
    source = model_args.tokenizer_name or model_args.model_name_or_path
    given = given_fields(flags)
    unread = [name for name in NEW_TOKENIZER_FIELDS if name in given]
    if source is not None and unread:
        logger.warning("%s: the run uses the tokenizer of %r and trains none, so %s (a setting of a newly trained "
                       "tokenizer) does not apply", ", ".join(f"--{name}" for name in unread), source,
                       "this" if len(unread) == 1 else "each")


def warn_overridden_do_eval(values: Mapping[str, Any], flags: Sequence[str]) -> None:
    """One warning for `--do_eval false` given to a run that evaluates during training (`eval_strategy` not "no"):
    transformers' `TrainingArguments` turns `do_eval` back on there, so the run still scores the validation split at
    its end; `--eval_strategy no` is what skips every evaluation (the recipe's own values pass without a word)."""
    given = given_fields(flags)
    evaluates_during_training = values.get("do_train") and values.get("eval_strategy", "no") != "no"
    if "do_eval" in given and not values.get("do_eval") and evaluates_during_training:
        logger.warning("--do_eval false does not apply: eval_strategy %r evaluates during training, with which "
                       "transformers sets do_eval, so the run also scores the validation split at its end; add "
                       "--eval_strategy no to skip every evaluation", values["eval_strategy"])


def hub_repository(hub_model_id: str | None, output_dir: str | os.PathLike) -> str:
    """The Hub repository a run's push goes to: `hub_model_id`, else the output folder's name (as the Trainer's)."""
    return hub_model_id or Path(output_dir).resolve().name


def short_max_length_error(name: str, max_length: int | None) -> str | None:
    """The error for a total-length cap `name` of 1: generate's max_length counts the decoder start token, so 1 leaves
    no new token; None for any other value."""
    if max_length == 1:
        return f"{name} must be at least 2 (it counts the decoder start token), got 1"
    return None


def check_hub_repository(hub_model_id: str | None, output_dir: str | os.PathLike) -> None:
    """ConfigError naming `hub_model_id` (or output_dir's folder name that stands in for it) where `hub_repository`
    is not a repository id the Hub accepts (huggingface_hub's `validate_repo_id`)."""
    repository = hub_repository(hub_model_id, output_dir)
    try:
        validate_repo_id(repository)
    except HFValidationError as error:
        named = (f"hub_model_id {repository!r}" if hub_model_id
                 else f"hub_model_id (null: output_dir's folder name {repository!r})")
        raise ConfigError(f"push_to_hub: {named} is not a Hub repository id ({error}): set hub_model_id to USER/NAME "
                          "or NAME") from None


def check_model_sources(model_args: ModelArguments) -> None:
    """model_name_or_path and tokenizer_name, where set, each a folder or a Hub model in the local cache or on the Hub
    (`check_model_source`: one request, no retries), before any of them loads; else one ConfigError naming the
    field."""
    for name in ("model_name_or_path", "tokenizer_name"):
        value = getattr(model_args, name)
        try:
            if value is not None:
                check_model_source(value, name, model_args.cache_dir)
        except ValueError as error:
            raise ConfigError(str(error)) from None


def check_fine_tuned_base_license(model_args: ModelArguments) -> None:
    """The license of the local model folder a training run fine-tunes, which the run's model card carries
    (`fine_tuned_base`: its README.md's metadata, for a folder of no conversion), read now: metadata that cannot be
    read, or a license that is not one id, is one ConfigError before training rather than an error after it (the
    model saved, its card and run record not)."""
    name = model_args.model_name_or_path
    if name is None or not Path(name).is_dir():
        return
    try:
        fine_tuned_base(RunRecord(model_name_or_path=name, working_directory=os.getcwd()), conversion_record(name))
    except ValueError as error:
        raise ConfigError(f"model_name_or_path {error}; correct its {CARD_FILE}'s metadata") from None


def check_arguments(model_args: ModelArguments, training_args: TranslationTrainingArguments) -> None:
    """What can be wrong with the arguments alone (no files, no network), as one ConfigError."""
    if not (training_args.do_train or training_args.do_eval or training_args.do_predict):
        raise ConfigError("nothing to do: set at least one of do_train, do_eval, do_predict")
    if not training_args.do_train and model_args.model_name_or_path is None:
        raise ConfigError("do_eval/do_predict without do_train need model_name_or_path (a trained model)")
    for name in ("model_name_or_path", "tokenizer_name"):
        value = getattr(model_args, name)
        try:
            if value is not None:
                check_local_folder(value, name)
        except ValueError as error:
            raise ConfigError(str(error)) from None
    reserved = len(SPECIAL_TOKENS) + len(BYTE_TOKENS)
    if model_args.tokenizer_vocab_size <= reserved:
        raise ConfigError(f"tokenizer_vocab_size must be larger than {reserved} ({len(SPECIAL_TOKENS)} special and "
                          f"{len(BYTE_TOKENS)} byte-fallback tokens), got {model_args.tokenizer_vocab_size}")
    try:
        require_character_coverage(model_args.tokenizer_character_coverage)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if training_args.overwrite_output_dir and training_args.resume_from_checkpoint is not None:
        raise ConfigError("overwrite_output_dir (train from scratch) and resume_from_checkpoint (continue a run) "
                          "contradict each other: choose one")
    if not training_args.output_dir.strip():   # Path("") is the current folder
        raise ConfigError(f"output_dir must name a folder, got {training_args.output_dir!r}")
    for name in ("max_tokens_per_batch", "length_pool_factor", "cpu_threads", "generation_num_beams",
                 "generation_max_length", "average_checkpoints", "fade_absolute_positions", "early_stopping_patience",
                 "save_total_limit",   # transformers keeps every checkpoint at save_total_limit 0
                 "eval_accumulation_steps"):   # transformers divides by it in each evaluation, after training
        try:
            require_int(name, getattr(training_args, name), minimum=1, null_means="not set")
        except ValueError as error:
            raise ConfigError(str(error)) from None
    # transformers' own fields that it leaves unchecked until training fails on them, after output_dir is written
    minimums = {"per_device_train_batch_size": 1, "per_device_eval_batch_size": 1, "gradient_accumulation_steps": 1,
                "dataloader_num_workers": 0}
    try:
        for name, minimum in minimums.items():
            require_int(name, getattr(training_args, name), minimum)
        require_probability("label_smoothing_factor", training_args.label_smoothing_factor)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    for name in ("seed", "data_seed"):   # set_seed seeds numpy too, which takes [0, 2**32 - 1] only
        value = getattr(training_args, name)
        if not (value is None and name == "data_seed") and not (is_int_at_least(value, 0) and value < 2**32):
            raise ConfigError(f"{name} must be an integer in [0, 2**32 - 1], got {value!r}")
    for kind in ("logging", "eval", "save"):
        strategy, interval = getattr(training_args, f"{kind}_strategy"), getattr(training_args, f"{kind}_steps")
        if choice(strategy) == "steps" and not is_positive_number(interval):
            raise ConfigError(f"{kind}_steps must be a number of steps >= 1, or a fraction of the training steps in "
                              f"(0, 1), with {kind}_strategy steps, got {interval!r}"
                              + (" (0 would never save: for no checkpoints use save_strategy no)"
                                 if kind == "save" and interval == 0 else ""))
    optimizer = optimizer_name(training_args)
    fields_read = adam_fields_read(optimizer)
    for name in ("adam_beta1", "adam_beta2"):
        if name in fields_read:
            try:
                require_probability(name, getattr(training_args, name))
            except ValueError as error:
                raise ConfigError(f"{error} (optim {optimizer!r})") from None
    for name, meaning_of_zero in (("learning_rate", "no update"), ("weight_decay", "no decay"),
                                  ("max_grad_norm", "no clipping"), ("warmup_steps", "no warm-up")):
        if not is_non_negative_number(getattr(training_args, name)):
            raise ConfigError(f"{name} must be a finite number >= 0 (0: {meaning_of_zero}), got "
                              f"{getattr(training_args, name)!r}")
    if "adam_epsilon" in fields_read and not is_positive_number(training_args.adam_epsilon):
        raise ConfigError(f"adam_epsilon must be a finite number > 0 (optim {optimizer!r} divides by sqrt(v) + "
                          f"epsilon), got {training_args.adam_epsilon!r}")
    # transformers trains num_train_epochs only for a negative max_steps: at 0 its loop ends after one step
    if training_args.do_train and training_args.max_steps == 0:
        raise ConfigError("max_steps must be an integer >= 1, or -1 (not set: train num_train_epochs), got 0 "
                          "(transformers' Trainer trains one step at 0)")
    if training_args.do_train and training_args.max_steps <= 0 and not is_positive_number(training_args.num_train_epochs):
        raise ConfigError(f"num_train_epochs must be a positive number when max_steps is not set, got "
                          f"{training_args.num_train_epochs!r}: the run would train no step")
    if training_args.prepare_only and not training_args.do_train:
        raise ConfigError("prepare_only trains the tokenizer on the training split: it needs do_train")
    if training_args.push_to_hub and not training_args.do_train:
        raise ConfigError("push_to_hub publishes the model this run trains, with its card: it needs do_train (push an "
                          "existing model folder with `python -m hf_relpos.publish.hub push FOLDER REPO`)")
    if training_args.push_to_hub:   # the push comes after the whole training: its repository id is checked now
        check_hub_repository(training_args.hub_model_id, training_args.output_dir)
    error = short_max_length_error("generation_max_length", training_args.generation_max_length)
    if error is not None:
        raise ConfigError(error)
    if training_args.length_pool_factor is not None and training_args.max_tokens_per_batch is None:
        logger.warning("length_pool_factor=%d has no effect without max_tokens_per_batch: batches of "
                       "per_device_train_batch_size pairs drawn at random", training_args.length_pool_factor)
    check_train_sampling_strategy(training_args)
    check_auto_find_batch_size(training_args)
    check_corpus_level_scoring(training_args)
    if training_args.average_checkpoints is not None:
        check_checkpoint_averaging(training_args)
    if training_args.early_stopping_patience is not None:
        check_early_stopping(training_args)
    save_strategy = choice(training_args.save_strategy)
    if save_strategy == "best" and training_args.metric_for_best_model is None:
        raise ConfigError("save_strategy best saves a checkpoint whenever metric_for_best_model improves: set "
                          f"metric_for_best_model, one of {', '.join(best_model_metrics(training_args))}")
    eval_strategy = choice(training_args.eval_strategy)
    if save_strategy == "best" and eval_strategy == "no" and training_args.do_train:   # untrained: nothing to save
        raise ConfigError("save_strategy best saves a checkpoint when an evaluation during training improves "
                          "metric_for_best_model, and eval_strategy no evaluates only after training: the run would "
                          "save no checkpoint; set eval_strategy steps or epoch")
    if training_args.metric_for_best_model is not None:
        check_metric_for_best_model(training_args)
    fade = training_args.fade_absolute_positions
    if fade is not None and not training_args.do_train:
        raise ConfigError("fade_absolute_positions changes the model step by step during training: it needs do_train")
    if fade is not None and 0 < training_args.max_steps < fade:
        logger.warning("fade_absolute_positions=%d is longer than max_steps=%d: the run ends with the sinusoids at "
                       "%g of their starting scale, not faded out", fade, training_args.max_steps,
                       1 - training_args.max_steps / fade)
    if training_args.generation_max_length_offset < 0:
        raise ConfigError(f"generation_max_length_offset must be >= 0, got {training_args.generation_max_length_offset}")
    if not is_finite_number(training_args.generation_length_penalty):   # nan, inf: beam scores / length^p
        raise ConfigError(f"generation_length_penalty must be a finite number (beam search ranks a hypothesis by its "
                          f"score / length^penalty), got {training_args.generation_length_penalty!r}")
    ratio = training_args.generation_max_length_ratio
    if not is_non_negative_number(ratio):
        raise ConfigError(f"generation_max_length_ratio must be a finite number >= 0, got {ratio!r}")
    check_reporting_integrations(training_args.report_to)


def choice(value: enum.Enum | str) -> str:
    """A TrainingArguments choice (a strategy, `optim`) as its string: transformers turns the YAML's string into its
    enum (`IntervalStrategy`, `OptimizerNames`, ...) in __post_init__."""
    return str(value.value if isinstance(value, enum.Enum) else value)


def optimizer_name(training_args: TranslationTrainingArguments) -> str:
    """The run's `optim` as transformers names it (`OptimizerNames` value), e.g. "adamw_torch"."""
    return choice(training_args.optim)


def adam_fields_read(optimizer: str) -> tuple[str, ...]:
    """The adam_* training arguments that transformers' optimizer `optimizer` (TrainingArguments.optim) takes: the
    Adam family, m / (sqrt(v) + epsilon) with moment decays beta1 and beta2, all three; Lion its betas; SGD, Adagrad,
    RMSprop and Adafactor none."""
    if "adam" in optimizer or "ademamix" in optimizer:
        return ("adam_beta1", "adam_beta2", "adam_epsilon")
    return ("adam_beta1", "adam_beta2") if "lion" in optimizer else ()


def check_bleu_tokenizer(data_args: DataArguments, training_args: TranslationTrainingArguments) -> None:
    """A run that scores generated translations sets up its BLEU tokenization (`bleu_tokenize`, else sacreBLEU's
    choice for target_lang) now, so that a missing package (sacrebleu[ja] for ja-mecab, sacrebleu[ko] for ko-mecab)
    is one ConfigError before training, not a failure at its first evaluation."""
    if training_args.predict_with_generate and (training_args.do_eval or training_args.do_predict):
        try:
            bleu_metric(training_args.bleu_tokenize, data_args.target_lang)
        except ValueError as error:
            raise ConfigError(f"bleu_tokenize: {error}; or set bleu_tokenize to another tokenization (e.g. char, "
                              "which needs no package)") from None


def check_train_sampling_strategy(training_args: TranslationTrainingArguments) -> None:
    """The Trainer's `train_sampling_strategy` (transformers 4's `group_by_length`) orders batches of
    per_device_train_batch_size pairs; a training run with max_tokens_per_batch draws its batches from the token-budget
    sampler instead, which would leave any strategy but the default, random, without effect: one ConfigError."""
    strategy = training_args.train_sampling_strategy
    if training_args.do_train and training_args.max_tokens_per_batch is not None and strategy != "random":
        raise ConfigError(f"train_sampling_strategy={strategy!r} orders batches of per_device_train_batch_size pairs, "
                          f"but max_tokens_per_batch={training_args.max_tokens_per_batch} batches by tokens (sorted "
                          "by length, batch order shuffled from data_seed; length_pool_factor mixes lengths): set "
                          "max_tokens_per_batch null to batch by pairs, or leave train_sampling_strategy random")


def check_auto_find_batch_size(training_args: TranslationTrainingArguments) -> None:
    """The Trainer's `auto_find_batch_size` retries a step that ran out of memory with a smaller
    per_device_train_batch_size; a training run with max_tokens_per_batch never reads that size, so every retry
    would run the same batches out of memory again: one ConfigError."""
    if training_args.do_train and training_args.auto_find_batch_size and training_args.max_tokens_per_batch is not None:
        raise ConfigError(f"auto_find_batch_size lowers per_device_train_batch_size after an out-of-memory error, but "
                          f"max_tokens_per_batch={training_args.max_tokens_per_batch} batches by tokens and never "
                          "reads it: lower max_tokens_per_batch to fit memory, or set max_tokens_per_batch null to "
                          "batch by pairs")


def check_corpus_level_scoring(training_args: TranslationTrainingArguments) -> None:
    """BLEU and chrF are corpus-level (sacreBLEU sums n-gram counts over the whole split): a run that scores generated
    translations needs them all at once, in one array, to put them back in source order. The Trainer's
    `batch_eval_metrics` (metrics per batch) and `eval_do_concat_batches` false (a list of per-batch arrays) would
    fail at the first evaluation, after training: one ConfigError naming the field."""
    if not (training_args.predict_with_generate and (training_args.do_eval or training_args.do_predict)):
        return
    for name, wanted in (("batch_eval_metrics", False), ("eval_do_concat_batches", True)):
        if getattr(training_args, name) != wanted:
            raise ConfigError(f"{name} must be {str(wanted).lower()} with predict_with_generate: corpus BLEU and "
                              f"chrF are scored over all the split's translations at once, put back in source "
                              f"order; got {getattr(training_args, name)!r} (or set predict_with_generate false to "
                              "evaluate the loss alone)")


def check_early_stopping(training_args: TranslationTrainingArguments) -> None:
    """early_stopping_patience needs training evaluated as it goes, and a metric to watch (`check_metric_for_best_model`
    checks that evaluation computes it)."""
    patience = training_args.early_stopping_patience
    strategy = choice(training_args.eval_strategy)
    if not training_args.do_train:
        raise ConfigError(f"early_stopping_patience={patience} stops training: it needs do_train")
    if strategy not in ("steps", "epoch"):
        raise ConfigError(f"early_stopping_patience={patience} needs evaluations during training: eval_strategy must "
                          f"be 'steps' or 'epoch', got {strategy!r}")
    threshold = training_args.early_stopping_threshold
    if not is_non_negative_number(threshold):
        raise ConfigError(f"early_stopping_threshold must be a finite number >= 0, got {threshold!r}")
    if training_args.metric_for_best_model is None:   # parse_arguments sets EARLY_STOPPING_METRIC
        raise ConfigError(f"early_stopping_patience={patience} needs metric_for_best_model, the metric it watches")


def best_model_metrics(training_args: TranslationTrainingArguments) -> list[str]:
    """The metrics this app's evaluations compute, which metric_for_best_model may name: the loss (and its -log p_label
    part, nll_loss), and with predict_with_generate the scores of the generated translations."""
    losses = {"loss", "nll_loss"}
    return sorted(GENERATED_METRICS | losses) if training_args.predict_with_generate else sorted(losses)


def check_metric_for_best_model(training_args: TranslationTrainingArguments) -> None:
    """metric_for_best_model must be one that this app's evaluations compute (`best_model_metrics`). A
    greater_is_better against the metric's direction (`HIGHER_IS_BETTER`; transformers defaults it to that
    direction, so only a recipe or flag sets it so) makes the worst evaluation the best: one warning saying so. It
    stays allowed, as transformers allows it (the tests use it to make an early checkpoint the best)."""
    metric = training_args.metric_for_best_model.removeprefix("eval_")
    allowed = best_model_metrics(training_args)
    if metric in GENERATED_METRICS and not training_args.predict_with_generate:
        raise ConfigError(f"metric_for_best_model={metric!r} is scored on generated translations: it needs "
                          "predict_with_generate true (or metric_for_best_model: loss)")
    if metric not in allowed:
        raise ConfigError(f"metric_for_best_model must be one of {', '.join(allowed)}, got {metric!r}")
    higher_is_better = HIGHER_IS_BETTER.get(metric)
    if higher_is_better is not None and training_args.greater_is_better != higher_is_better:
        logger.warning("greater_is_better %s with metric_for_best_model %r, whose %s values are better: the worst "
                       "evaluation counts as the best (load_best_model_at_end, early stopping, the checkpoint kept "
                       "as best); leave greater_is_better unset to follow the metric",
                       yaml_text(training_args.greater_is_better), metric, "higher" if higher_is_better else "lower")


def check_checkpoint_averaging(training_args: TranslationTrainingArguments) -> None:
    """average_checkpoints needs a training run that keeps that many checkpoints, and no other choice of final
    weights."""
    count = training_args.average_checkpoints
    strategy = choice(training_args.save_strategy)
    if not training_args.do_train:
        raise ConfigError("average_checkpoints averages the checkpoints of this run's training: it needs do_train")
    if strategy not in ("steps", "epoch"):
        raise ConfigError(f"average_checkpoints={count} needs checkpoints: save_strategy must be 'steps' or 'epoch', "
                          f"got {strategy!r}")
    if training_args.load_best_model_at_end:   # before the limits: no save_total_limit resolves it
        raise ConfigError("average_checkpoints and load_best_model_at_end both choose the final weights: set one")
    limit = training_args.save_total_limit
    if limit is not None and limit < count:
        raise ConfigError(f"average_checkpoints={count} needs the last {count} checkpoints: save_total_limit must be "
                          f"null or >= {count}, got {limit}")
    if limit is not None and limit == count and training_args.metric_for_best_model is not None:
        set_by = " (early_stopping_patience)" if training_args.early_stopping_patience is not None else ""
        raise ConfigError(f"average_checkpoints={count} needs the last {count} checkpoints, and with "
                          f"metric_for_best_model={training_args.metric_for_best_model!r}{set_by} "
                          "transformers keeps the best checkpoint besides the save_total_limit newest: "
                          f"save_total_limit must be null or >= {count + 1}, got {limit}")


def conversion_hint(model_type: str, model_name_or_path: str) -> str:
    """How a model of `model_type` becomes one a run can load, where hf-relpos-convert reads that type (docs/conversion.md)."""
    if model_type not in CONVERTED_ARCHITECTURES:
        return ""
    return (f"; a {CONVERTED_ARCHITECTURES[model_type]} model is fine-tuned here once converted: hf-relpos-convert "
            f"{model_type} {model_name_or_path} OUT --position_scheme SCHEME, then model_name_or_path OUT "
            "(docs/conversion.md)")


def without_unread_scheme_fields(model_config: dict[str, Any], position_scheme: Any,
                                 refused: set[str]) -> dict[str, Any]:
    """`model_config` without the fields that only other schemes than the run's `position_scheme` read. One of
    `refused` given another value than its default (`refuse_unread_scheme_fields`) is one ConfigError: the callers
    refuse a `--model.NAME` flag's, and the recipe file's where the file also chose the scheme (or left it at the
    default). The others (a recipe written for one scheme, run with another chosen by a flag or by the saved model of
    `model_name_or_path`) are dropped with one warning naming them."""
    try:
        refuse_unread_scheme_fields(position_scheme, {name: value for name, value in model_config.items()
                                                      if name in refused})
    except ValueError as error:
        raise ConfigError(f"{MODEL_SECTION}: {error}") from None
    held = RelPosTransformerConfig.held_fields(position_scheme, model_config)
    fields = scheme_config_fields()
    unread = {name: value for name, value in model_config.items()
              if name not in held and value != fields[name].default}
    if unread:
        logger.warning("%s: %s, set by the recipe file, only other schemes than this run's position_scheme %r read: "
                       "ignored", MODEL_SECTION, ", ".join(f"{name}={yaml_text(value)}" for name, value in
                                                           unread.items()), position_scheme)
    return held


def check_model_config(model_args: ModelArguments, from_command_line: set[str] | None = None,
                       training: bool = True) -> dict[str, Any]:
    """The `model:` section as it applies to this run, checked: the fields of a new config, or, with
    `model_name_or_path`, the overrides of its saved config; either without the fields of other schemes
    (`without_unread_scheme_fields`). The saved config is the architecture: fields equal to the saved value are
    dropped; fields that would change the shapes of its weights are refused, and so is another `position_scheme`
    (rope, alibi, absolute, ... have no parameters: the shapes alone do not tell them apart). Without training
    (`training=False`) only the `--model.*` flags of `from_command_line` override the saved config: the recipe file's
    differing fields are ignored, with one warning that names them."""
    from_command_line = from_command_line or set()
    model_config = model_args.model_config
    # the fields whose source also chose the scheme: the flags, and the recipe file unless a flag chose it
    chosen_with_scheme = from_command_line if "position_scheme" in from_command_line else set(model_config)
    if model_args.model_name_or_path is None:
        model_config = without_unread_scheme_fields(
            model_config, model_config.get("position_scheme", RelPosTransformerConfig.position_scheme),
            chosen_with_scheme)
    try:
        if model_args.model_name_or_path is None:
            check_encoder_decoder_config(
                RelPosTransformerConfig(**model_config, vocab_size=model_args.tokenizer_vocab_size))
            return model_config
        saved = RelPosTransformerConfig.from_pretrained(model_args.model_name_or_path, cache_dir=model_args.cache_dir)
    except OtherModelTypeError as error:
        raise ConfigError(f"model_name_or_path {model_args.model_name_or_path!r}: {error}"
                          f"{conversion_hint(error.model_type, model_args.model_name_or_path)}") from None
    except (ValueError, TypeError) as error:
        raise ConfigError(f"{MODEL_SECTION}: {error}{import_modules_hint(error)}") from None
    except OSError as error:
        raise ConfigError(f"model_name_or_path: {error}") from None
    if training:   # a recipe file without position_scheme runs under the saved model's
        position_scheme = model_config.get("position_scheme", saved.position_scheme)
        requested = without_unread_scheme_fields(
            model_config, position_scheme, chosen_with_scheme if "position_scheme" in model_config else
            from_command_line)
    else:   # the flags alone apply
        flags = {name: value for name, value in model_config.items() if name in from_command_line}
        position_scheme = flags.get("position_scheme", saved.position_scheme)
        without_unread_scheme_fields(flags, position_scheme, from_command_line)
        requested = RelPosTransformerConfig.held_fields(position_scheme, model_config)
    if not training:
        ignored = {name: value for name, value in requested.items()
                   if name not in from_command_line and getattr(saved, name, None) != value}
        if ignored:
            logger.warning(
                "model_name_or_path %r: its saved config is the architecture; the recipe's %s: %s differ from it and "
                "are ignored", model_args.model_name_or_path, MODEL_SECTION,
                ", ".join(f"{name}={yaml_text(value)} (saved: {yaml_text(getattr(saved, name, None))})"
                          for name, value in ignored.items()))
        requested = {name: value for name, value in requested.items() if name in from_command_line}
    try:
        check_encoder_decoder_config(RelPosTransformerConfig.from_dict({**saved.to_dict(), **requested}))
    except (ValueError, TypeError) as error:
        raise ConfigError(f"{MODEL_SECTION}: {error}") from None
    overrides = {name: value for name, value in requested.items() if getattr(saved, name, None) != value}
    _check_same_architecture(saved, overrides, f"model_name_or_path {model_args.model_name_or_path!r}")
    return overrides


def check_resumed_model_config(model_args: ModelArguments, checkpoint: str) -> None:
    """A resumed run trains on the checkpoint's weights: the model it builds (`run_model_config`: a field the `model:`
    section leaves out takes its default) must keep their shapes and their `position_scheme`, as for
    `model_name_or_path`. Otherwise the Trainer failed to load them after the data was prepared or, for schemes
    without parameters (alibi, rope), trained them on under the other scheme without a word."""
    try:
        saved = RelPosTransformerConfig.from_pretrained(checkpoint)
    except (OSError, ValueError, TypeError) as error:
        raise ConfigError(f"resume_from_checkpoint {checkpoint!r}: {error}") from None
    fields = model_config_fields()
    overrides = {name: value for name, value in run_model_config(model_args).to_dict().items()
                 if name in fields and getattr(saved, name, None) != value}
    _check_same_architecture(saved, overrides, f"resume_from_checkpoint {checkpoint!r}")


def _check_same_architecture(saved: RelPosTransformerConfig, overrides: dict[str, Any], source: str) -> None:
    """ConfigError naming the fields of `overrides` that would change the shapes of the weights saved with `saved`
    (those of `source`), or their `position_scheme` (rope, alibi, absolute, ... have no parameters: the shapes alone
    do not tell them apart)."""
    saved_shapes = weight_shapes(saved)
    if weight_shapes(_with_overrides(saved, overrides)) != saved_shapes:
        reshaping = [name for name in overrides if _changes_shapes(saved, name, overrides[name], saved_shapes)]
        described = ", ".join(f"{name}={yaml_text(overrides[name])} (saved: {yaml_text(getattr(saved, name))})"
                              for name in reshaping or overrides)
        raise ConfigError(
            f"{source}: its saved config is the architecture, but {MODEL_SECTION}: {described} would change the "
            f"shapes of its weights; remove them from the '{MODEL_SECTION}:' section or the flags (or set the saved "
            "values)")
    if "position_scheme" in overrides:
        raise ConfigError(
            f"{source}: its weights were trained with position_scheme {saved.position_scheme}, but {MODEL_SECTION}: "
            f"position_scheme={overrides['position_scheme']} would run them under another scheme; remove it from the "
            f"'{MODEL_SECTION}:' section or the flags (or set the saved value)")


def check_training_kernel(model_args: ModelArguments, training_args: TranslationTrainingArguments) -> None:
    """The kernel the run trains on takes the model's attention dropout (`check_dropout_kernel`: flex_attention
    drops no probabilities, relpos_triton no keys): checked here, not by the model at the first training step, after
    the tokenizer is trained and the data saved."""
    if not training_args.do_train or model_args.attn_implementation is None:
        return
    config = run_model_config(model_args)
    try:
        check_dropout_kernel(model_args.attn_implementation, config.attention_dropout, config.attention_dropout_kind)
    except ValueError as error:
        raise ConfigError(f"{MODEL_SECTION}: {error}") from None


def check_every_parameter_trains(model_args: ModelArguments, training_args: TranslationTrainingArguments) -> None:
    """`ddp_find_unused_parameters: false` (every recipe) tells DDP that every trainable parameter gets a gradient
    in each step; one that gets none stops a launch of several processes at its second step ("Expected to have
    finished reduction in the prior iteration"). The model leaves parameters out in one case (every recipe, and the
    options a recipe may add, give each a gradient: tests/test_train_configs.py): an encoder without layers
    (`encoder_layers` 0), whose position scheme's parameters no step reads. That case is one ConfigError, when the
    arguments are read, in a launch of one process too (the recipe's claim is false for that model)."""
    if not training_args.do_train or training_args.ddp_find_unused_parameters is not False:
        return
    config = run_model_config(model_args)
    if config.encoder_layers > 0:
        return
    left_out = [f"model.encoder.positions.{name}"
                for name, _ in meta_model(config).model.encoder.positions.named_parameters()]
    if left_out:
        raise ConfigError(
            f"ddp_find_unused_parameters false says every parameter takes part in each training step, but "
            f"{MODEL_SECTION}: encoder_layers 0 leaves the encoder's position parameters out of every step "
            f"({', '.join(left_out)}): DDP would stop a launch of several processes at its second step; set "
            "ddp_find_unused_parameters true, or encoder_layers 1 or more")


def _with_overrides(config: RelPosTransformerConfig, overrides: dict[str, Any]) -> RelPosTransformerConfig:
    return RelPosTransformerConfig.from_dict({**config.to_dict(), **overrides})


def run_model_config(model_args: ModelArguments) -> RelPosTransformerConfig:
    """The config a training run builds its model from (its vocabulary aside): `saved_config_with_overrides` with
    `model_name_or_path`, else a new config of the `model:` section."""
    if model_args.model_name_or_path is not None:
        return saved_config_with_overrides(model_args)
    return RelPosTransformerConfig(**model_args.model_config)


def saved_config_with_overrides(model_args: ModelArguments) -> RelPosTransformerConfig:
    """The config a run with `model_name_or_path` builds its model from: the saved one with the overrides that
    `check_model_config` left in `model_args.model_config`, built whole (a scheme's fields with its defaults)."""
    saved = RelPosTransformerConfig.from_pretrained(model_args.model_name_or_path, cache_dir=model_args.cache_dir)
    return _with_overrides(saved, model_args.model_config)


def _changes_shapes(saved: RelPosTransformerConfig, name: str, value: Any,
                    saved_shapes: dict[str, tuple[int, ...]]) -> bool:
    """Whether overriding this one field changes the weights' shapes (a value valid only together with other shape
    changes, such as a head count that divides only the new d_model, counts as changing them)."""
    try:
        return weight_shapes(_with_overrides(saved, {name: value})) != saved_shapes
    except ValueError:
        return True


def weight_shapes(config: RelPosTransformerConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in the model's state dict, from a model built on the meta device (no memory)."""
    return {name: tuple(tensor.shape) for name, tensor in meta_model(config).state_dict().items()}


def check_reporting_integrations(report_to: Sequence[str]) -> None:
    """Each `report_to` integration must exist and have its package installed (the Trainer would only fail when it is
    built, after the tokenizer is written)."""
    available = set(get_available_reporting_integrations())
    for name in report_to:
        if name not in INTEGRATION_TO_CALLBACK:
            raise ConfigError(f"report_to {name!r} is not an integration; choose from "
                              f"{sorted(INTEGRATION_TO_CALLBACK)} or none")
        if name not in available:
            install = (f"pip install '.[{name}]' in the hf_relpos checkout" if name in REPORTING_EXTRAS
                       else f"install the {name} package")
            raise ConfigError(f"report_to {name} needs the {name} package, which is not installed: {install}, or "
                              f"set report_to: none")


def data_seed(training_args: TranslationTrainingArguments) -> int:
    """The seed of what a run draws from its data (the batches, the joined pairs): `data_seed`, else `seed`."""
    return training_args.data_seed if training_args.data_seed is not None else training_args.seed
