r"""Translation quality at an equal budget: HF MarianMT (the peer) against hf_relpos recipes on Multi30k En->De.

Rows are named. `peer` is a `MarianMTModel` trained with the plain `Seq2SeqTrainer`:
MarianConfig d_model 256, 3+3 layers, FFN 1024, 4 heads, dropout 0.1, attention dropout 0.1, activation dropout 0,
gelu, Post-LN, scaled and shared+tied embeddings; its own BPE tokenizer (NFKC, Metaspace, 8000 pieces on both sides
of train, `</s>` appended); `Seq2SeqTrainingArguments(max_steps=1500, per_device_train_batch_size=64,
learning_rate=1e-3, warmup_steps=400, lr_scheduler_type="inverse_sqrt", adam_beta2=0.98, label_smoothing_factor=0.1,
weight_decay=0.0, seed=S)` and `DataCollatorForSeq2Seq`; `peer+recipe-tokenizer` is the same with the recipes' own
tokenizer (hf_relpos' BPE, trained as train_translation.py trains it). Every other row is an hf_relpos recipe trained through
`train_translation.py`'s own code path (`hf_relpos.translation.training.run`) with the same budget (`--max_steps 1500
--warmup_steps 400 --max_tokens_per_batch 1024`, about 62 pairs a step) plus the row's own flags; the recipe rows
(one per configs/multi30k_small_*.yaml: `absolute`, `shaw`, `xl`, `directional`, `rope`, `alibi`, `t5`) raise the budget to 1280 tokens, where their pooled batches hold the
peer's 64 pairs; `<recipe>+attention-dropout-0` and `<recipe>+key-dropout-0.1` change its attention dropout (none,
or key dropout instead of dropping probabilities: `--model.attention_dropout_kind keys`). The predefined rows
are listed by `--list`; `--row "NAME=RECIPE --flag value ..."` adds one (RECIPE: a scheme, for
configs/multi30k_small_<scheme>.yaml, or a .yaml path; the flags are train_translation.py's). `--init` on a row is
shorthand for the token-embedding init: `--init hf` draws them N(0, 0.02) as transformers' Marian does
(`--model.embedding_init_std 0.02`), `--init vaswani` N(0, d_model^-0.5) (Vaswani et al., fairseq;
`--model.embedding_init_std null`). Runs before 2026-11-23 16:00 UTC drew the same distribution by re-initialising a
saved starting model instead (a different random stream).

Every trained model is decoded by the same function (beam 4, length penalty 0.6, at most 80 new tokens, batches of
64 sorted by source length) and scored by the same sacreBLEU metric object (cased, 13a) on validation and test2016.
A finished run (`<work>/<row>/seed<S>/run.json`) is reused, so rows can be trained by separate invocations (one per
core) and the table collected afterwards with `--collect-only` (`--row-seeds NAME=1,2,3` where a row has other seeds
than `--seeds`). The table (mean and min-max over seeds) goes to `<out>/vs_marian.{json,md}`, followed by each row
against the `--baseline` row (default `absolute`, when it is among the rows) of the same seed: the BLEU difference and
its paired bootstrap p-value (Koehn 2004, sacreBLEU's test) on the hypotheses each run kept.

  python experiments/vs_marian.py --data ../shared/data/multi30k --work /tmp/vs_marian --out docs/results/vs_marian \
      --rows peer absolute-marian --seeds 1 2 3 --threads 1
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import math
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import torch
from batch_statistics import batch_figures, read_lengths, training_batches
from datasets import Dataset
from settings import adopt_run_settings, json_settings
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    DataCollatorForSeq2Seq,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    MarianConfig,
    MarianMTModel,
    PreTrainedTokenizerBase,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    set_seed,
)

from hf_relpos import POSITION_SCHEMES, RelPosTransformerForConditionalGeneration
from hf_relpos.model.generation_limits import SourceLengthCapLogitsProcessor, new_token_limits, per_scores_row
from hf_relpos.publish import records as run_records
from hf_relpos.publish.files import atomic_file, write_text_atomic
from hf_relpos.publish.records import (
    RunRecord,
    checkout_version,
    cpu_model_name,
    gather_run_records,
    scores_by_weights,
    software_versions,
)
from hf_relpos.translation.arguments import data_seed, parse_arguments
from hf_relpos.translation.data import DataArguments, tokenize_evaluation_pairs, tokenize_training_pairs
from hf_relpos.translation.data_preparation import prepare_evaluation_set
from hf_relpos.translation.metrics import decode_translations, paired_bootstrap, score_translations
from hf_relpos.translation.model_setup import configure_decoding
from hf_relpos.translation.safety import output_folder
from hf_relpos.translation.tokenization import (
    EOS_TOKEN,
    SPECIAL_TOKENS,
    WORD_START,
    load_tokenizer,
    train_joint_tokenizer,
    wrap_tokenizer,
)
from hf_relpos.translation.trainer import TranslationTrainer, resolve_resume_checkpoint
from hf_relpos.translation.training import run

ROOT = Path(__file__).resolve().parents[1]
PEER = "peer"
# The peer trained with the recipes' tokenizer (hf_relpos' BPE: NFC, 256 byte tokens, trained as train_translation.py
# trains it) instead of its own, so that a comparison with the recipes differs in the model and trainer only.
PEER_WITH_RECIPE_TOKENIZER = "peer-with-recipe-tokenizer"
PEER_WITH_RECIPE_TOKENIZER_ROW = "peer+recipe-tokenizer"   # its predefined row, as records name it
# The peer trained by hf_relpos' own trainer as a recipe run trains: the recipes' tokenizer, token-budget batches,
# schedule and number of updates (the training arguments of PEER_TRAINING_RECIPE's run with the row's flags; every
# multi30k recipe trains alike), so that against a recipe row only the model class differs.
PEER_WITH_RECIPE_TRAINING = "peer-with-recipe-training"
PEER_TRAINING_RECIPE = "absolute"
PEER_RECIPES = (PEER, PEER_WITH_RECIPE_TOKENIZER, PEER_WITH_RECIPE_TRAINING)
# train_translation.py flags of each --init choice (the token-embedding init).
EMBEDDING_INIT_FLAGS = {"recipe": (), "hf": ("--model.embedding_init_std", "0.02"),
                        "vaswani": ("--model.embedding_init_std", "null")}
MARIAN_ARCHITECTURE = "--model.layer_norm_position post --model.activation_function gelu --model.attention_dropout 0.1"
SENTENCE_BATCHES = "--max_tokens_per_batch null --per_device_train_batch_size 64"   # the peer's batching
# The recipes' token batches before length pools: sorted by length over the whole corpus (no pools).
CORPUS_SORTED_TOKEN_BATCHES = "--length_pool_factor null"
# The ablation rows start from the recipes' first settings, before matching the peer changed them: Adam epsilon
# 1e-9 and corpus-sorted batches (their token-embedding init is `--init vaswani`).
FIRST_RECIPE_SETTINGS = f"--adam_epsilon 1e-9 {CORPUS_SORTED_TOKEN_BATCHES}"
# Flags a `<scheme>-matched` row adds so that it still trains what its stored runs trained after a default changed:
# shaw-matched ran when the a^K/a^V tables started at init_std (0.02), before Tensor2Tensor's scale became the default.
MATCHED_ROW_PINS = {"shaw": "--model.relative_embedding_init_std 0.02"}
# Every remaining difference to the peer removed (with --init hf): the `<scheme>-matched` rows.
MARIAN_MATCHED = f"{MARIAN_ARCHITECTURE} {SENTENCE_BATCHES} --adam_epsilon 1e-8"
# The registered schemes with a recipe, configs/multi30k_small_<scheme>.yaml.
RECIPE_SCHEMES = tuple(scheme for scheme in POSITION_SCHEMES
                       if (ROOT / "configs" / f"multi30k_small_{scheme}.yaml").is_file())
# The `<scheme>-matched` rows trained from the scheme's own recipe; the others (rope, alibi, t5, none) ran from
# absolute's recipe with --model.position_scheme before those recipes existed, and keep doing so.
MATCHED_FROM_OWN_RECIPE = ("absolute", "shaw", "xl", "directional")
# A row flag value replaced by the folder of the peer's own tokenizer (trained once under --work): the tokenizer row.
PEER_TOKENIZER = "@peer-tokenizer"
# marian-matched with one difference to the peer put back at a time: each row changes one thing.
MATCHED_SINGLE_FACTORS = {
    "pre-ln": "--model.layer_norm_position pre",
    "relu": "--model.activation_function relu",
    "attention-dropout-0": "--model.attention_dropout 0.0",
    "token-batches": f"--max_tokens_per_batch 1024 {CORPUS_SORTED_TOKEN_BATCHES}",   # the recipes' batches before pools
    "peer-tokenizer": f"--tokenizer_name {PEER_TOKENIZER}",   # the peer's NFKC BPE instead of hf_relpos's
}
# Token-budget batches whose lengths are grouped only within random pools (--length_pool_factor), pools sorted by
# the longer side. Pairs per batch with this tokenizer (experiments/batch_statistics.py), against 61.7 for
# token-batches and the peer's 64: random (pools of one batch) 64.0, pooled-1280 (pools of 4) 64.0, and pooled at
# 1536 tokens 76.7 (a fifth more pairs per step: not matched, measured first by mistake and kept as measured).
POOLED_TOKEN_BATCHES = {
    "random-token-batches": "--max_tokens_per_batch 2048 --length_pool_factor 1",
    "pooled-1280-token-batches": "--max_tokens_per_batch 1280 --length_pool_factor 4",
    "pooled-token-batches": "--max_tokens_per_batch 1536 --length_pool_factor 4",
}
# The recipe rows (`absolute`, `shaw`, ...): each recipe as it is (pools of 4) with the token budget that holds the
# peer's 64 pairs per batch; at the shared 1024 tokens its pooled batches would hold about 51.
RECIPE_EQUAL_BUDGET = "--max_tokens_per_batch 1280"
SPLITS = {"validation": "validation.jsonl", "test": "test.jsonl"}


@dataclass(frozen=True)
class Row:
    """One system of the table: the peer, or an hf_relpos recipe with train_translation.py flags (and an init)."""

    name: str
    recipe: str = PEER
    flags: tuple[str, ...] = ()
    init: str = "recipe"

    @property
    def is_peer(self) -> bool:
        return self.recipe in PEER_RECIPES

    def describe(self) -> str:
        if self.recipe == PEER_WITH_RECIPE_TRAINING:
            return " ".join(["HF MarianMTModel, trained as", f"multi30k_small_{PEER_TRAINING_RECIPE}.yaml", *self.flags])
        if self.recipe == PEER_WITH_RECIPE_TOKENIZER:
            return "HF MarianMTModel, plain Seq2SeqTrainer, hf_relpos' tokenizer"
        if self.is_peer:
            return "HF MarianMTModel, plain Seq2SeqTrainer"
        recipe = self.recipe if self.recipe.endswith((".yaml", ".yml")) else f"multi30k_small_{self.recipe}.yaml"
        return " ".join([recipe, *self.flags, *(["--init", self.init] if self.init != "recipe" else [])])


def _row(name: str, recipe: str, flags: str = "", init: str = "recipe") -> Row:
    return Row(name, recipe, tuple(shlex.split(flags)), init)


def _matched_row(scheme: str) -> Row:
    """`<scheme>-matched`: the scheme in the marian-matched setting, from its own recipe where it has one."""
    flags = f"{MARIAN_MATCHED} {MATCHED_ROW_PINS.get(scheme, '')}".strip()
    if scheme in MATCHED_FROM_OWN_RECIPE:
        return _row(f"{scheme}-matched", scheme, flags, init="hf")
    return _row(f"{scheme}-matched", "absolute", f"--model.position_scheme {scheme} {flags}", init="hf")


# The predefined rows: the recipes as they are, and the one-difference-at-a-time ablations of docs/results.md.
ROWS = {row.name: row for row in [
    Row(PEER),
    Row(PEER_WITH_RECIPE_TOKENIZER_ROW, PEER_WITH_RECIPE_TOKENIZER),
    _row("peer+recipe-training", PEER_WITH_RECIPE_TRAINING, RECIPE_EQUAL_BUDGET),
    *(_row(scheme, scheme, RECIPE_EQUAL_BUDGET) for scheme in RECIPE_SCHEMES),
    # the recipe without attention dropout, the setting in which its fused GPU path runs
    *(_row(f"{scheme}+attention-dropout-0", scheme, f"{RECIPE_EQUAL_BUDGET} --model.attention_dropout 0.0")
      for scheme in RECIPE_SCHEMES),
    # the recipe's attention dropout 0.1 as key dropout (scores dropped before the softmax), the
    # dropout FlexAttention can run fused, against the recipe row (probability dropout 0.1) and the row above
    *(_row(f"{scheme}+key-dropout-0.1", scheme,
           f"{RECIPE_EQUAL_BUDGET} --model.attention_dropout 0.1 --model.attention_dropout_kind keys")
      for scheme in RECIPE_SCHEMES),
    # a length-generalization option trained into the recipe, for inputs longer than any in
    # training: cross-attention logits scaled by log m (docs/results.md 5b states the criterion for adopting one)
    *(_row(f"{scheme}+length-scaling", scheme, f"{RECIPE_EQUAL_BUDGET} --model.cross_attention_length_scaling true")
      for scheme in RECIPE_SCHEMES),
    # ... and randomized positions (Ruoss et al. 2023): training places tokens at sorted random positions below 256
    *(_row(f"{scheme}+randomized-positions", scheme, f"{RECIPE_EQUAL_BUDGET} --model.position_randomization_max 256")
      for scheme in RECIPE_SCHEMES),
    # ... and a self-attention window trained into the recipe (local attention, both stacks): each query sees the
    # 2 x 8 + 1 positions around it, about a long training caption (90 % of the training sources have at most 17
    # words), so in an input longer than any in training every query still sees a span of a familiar length
    *(_row(f"{scheme}+window-8", scheme, f"{RECIPE_EQUAL_BUDGET} --model.self_attention_window 8")
      for scheme in RECIPE_SCHEMES),
    # ... and sentence concatenation (Kondo et al. 2021): half as many joined pairs again (two random training pairs
    # in one, `--concatenated_pairs 0.5`), so the model trains on inputs of two captions, up to twice the training
    # lengths; the token budget per step is unchanged, so each step still holds about as many captions. 0.2 (a fifth
    # as many again) was added after 0.5's first seed had cost single-caption BLEU
    *(_row(f"{scheme}+concat-{ratio}", scheme, f"{RECIPE_EQUAL_BUDGET} --concatenated_pairs {ratio}")
      for ratio in ("0.5", "0.2") for scheme in RECIPE_SCHEMES),
    # ... and joins of 2 to 4 captions (`--max_pairs_per_join 4`), whose training sources reach the lengths of 4
    # captions joined into one sentence: an equal-budget probe beside the 20-epoch study of docs/results.md 5b
    *(_row(f"{scheme}+concat-0.5-up-to-4", scheme,
           f"{RECIPE_EQUAL_BUDGET} --concatenated_pairs 0.5 --max_pairs_per_join 4") for scheme in RECIPE_SCHEMES),
    _row("absolute-marian", "absolute", f"{MARIAN_ARCHITECTURE} {FIRST_RECIPE_SETTINGS}", init="vaswani"),
    _row("marian-matched", "absolute", MARIAN_MATCHED, init="hf"),
    _row("marian+hf-init", "absolute", f"{MARIAN_ARCHITECTURE} {FIRST_RECIPE_SETTINGS}", init="hf"),
    _row("marian+sentence-batches", "absolute", f"{MARIAN_ARCHITECTURE} {FIRST_RECIPE_SETTINGS} {SENTENCE_BATCHES}",
         init="vaswani"),
    _row("marian+adam-eps-1e-8", "absolute", f"{MARIAN_ARCHITECTURE} {FIRST_RECIPE_SETTINGS} --adam_epsilon 1e-8",
         init="vaswani"),
    *(_row(f"matched+{change}", "absolute", f"{MARIAN_MATCHED} {flags}", init="hf")
      for change, flags in {**MATCHED_SINGLE_FACTORS, **POOLED_TOKEN_BATCHES}.items()),
    *(_matched_row(scheme) for scheme in POSITION_SCHEMES if scheme != "absolute"),   # absolute: marian-matched
    # shaw-matched with the a^K/a^V tables drawn at tensor2tensor's scale instead of 0.02: its uniform_unit_scaling
    # initialiser is fan-average variance scaling, std sqrt(1 / ((33 + 64) / 2)) = 0.14 for the 33 x 64 tables
    # (measured before that scale became the default, 0.1436 unrounded).
    _row("shaw-matched+t2t-table-init", "shaw", f"{MARIAN_MATCHED} --model.relative_embedding_init_std 0.14", init="hf"),
]}


def parse_row(spec: str) -> Row:
    """`NAME=RECIPE [--init hf|vaswani] [train_translation.py flags]` -> Row; a bare NAME picks a predefined row."""
    if "=" not in spec.split(" ", 1)[0]:
        if spec not in ROWS:
            raise SystemExit(f"vs_marian.py: unknown row {spec!r}; predefined rows: {sorted(ROWS)} "
                             "(or NAME=RECIPE --flag value ...)")
        return ROWS[spec]
    head, *flags = shlex.split(spec)
    name, recipe = head.split("=", 1)
    init = "recipe"
    if "--init" in flags:
        position = flags.index("--init")
        init = flags[position + 1] if position + 1 < len(flags) else ""
        del flags[position : position + 2]
        if init not in EMBEDDING_INIT_FLAGS:
            raise SystemExit(f"vs_marian.py: row {name!r}: --init must be one of {list(EMBEDDING_INIT_FLAGS)}, got {init!r}")
    if recipe in PEER_RECIPES:
        raise SystemExit(f"vs_marian.py: row {name!r}: the peer has no flags; use the predefined row {PEER!r}")
    return Row(name, recipe, tuple(flags), init)


def read_pairs(path: Path, source_lang: str, target_lang: str) -> tuple[list[str], list[str]]:
    """Sources and references of a `{"translation": {...}}` jsonl file, in file order."""
    pairs = [json.loads(line)["translation"] for line in path.open(encoding="utf-8") if line.strip()]
    return [pair[source_lang] for pair in pairs], [pair[target_lang] for pair in pairs]


def train_peer_tokenizer(texts: Sequence[str], vocab_size: int) -> PreTrainedTokenizerBase:
    """The peer's tokenizer: `tokenizers` BPE with an NFKC normaliser, Metaspace pre-tokenizer and decoder, the
    trainer's defaults otherwise, `</s>` appended; the special tokens of hf_relpos (so ids line up)."""
    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS[3]))
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=WORD_START, prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement=WORD_START, prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS_TOKEN}", pair=f"$A {EOS_TOKEN} $B {EOS_TOKEN}",
        special_tokens=[(EOS_TOKEN, tokenizer.token_to_id(EOS_TOKEN))],
    )
    return wrap_tokenizer(tokenizer)


def peer_config(tokenizer: PreTrainedTokenizerBase, args: argparse.Namespace) -> MarianConfig:
    """The peer's MarianConfig (the module docstring's); the decoder starts from the pad token (Marian's convention), and no `</s>` is forced
    at the length limit (MarianConfig's default forces one; hf_relpos does not, and decoding must be the same)."""
    return MarianConfig(
        vocab_size=len(tokenizer), d_model=args.d_model, encoder_layers=args.layers, decoder_layers=args.layers,
        encoder_attention_heads=args.heads, decoder_attention_heads=args.heads, encoder_ffn_dim=args.ffn_dim,
        decoder_ffn_dim=args.ffn_dim, dropout=0.1, attention_dropout=0.1, activation_dropout=0.0,
        max_position_embeddings=256, scale_embedding=True, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        forced_eos_token_id=None, decoder_start_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )


def logged_losses(history: Sequence[dict]) -> list[list[float]]:
    """[step, training loss] of each logged step of a Trainer's log_history."""
    return [[entry["step"], entry["loss"]] for entry in history if "loss" in entry]


def train_peer(folder: Path, seed: int, args: argparse.Namespace, recipe: str = PEER,
               **training_overrides: object) -> dict:
    """Tokenizer (the peer's own, or the recipes' for PEER_WITH_RECIPE_TOKENIZER), MarianMTModel and a plain
    Seq2SeqTrainer run; the model and tokenizer are saved in `folder`. `training_overrides` replace
    Seq2SeqTrainingArguments fields (experiments/convergence.py: epochs, checkpoints, and `resume_from_checkpoint`,
    the checkpoint the Trainer continues from)."""
    sources, targets = read_pairs(args.data / "train.jsonl", args.source_lang, args.target_lang)
    train_tokenizer = {PEER: train_peer_tokenizer, PEER_WITH_RECIPE_TOKENIZER: train_joint_tokenizer}[recipe]
    tokenizer = train_tokenizer([*sources, *targets], args.vocab_size)
    set_seed(seed)
    model = MarianMTModel(peer_config(tokenizer, args))
    train_dataset = Dataset.from_dict({"source": sources, "target": targets}).map(
        lambda batch: tokenizer(batch["source"], text_target=batch["target"]), batched=True,
        remove_columns=["source", "target"],
    )
    settings = dict(
        output_dir=str(folder / "trainer"), max_steps=args.max_steps, per_device_train_batch_size=args.batch_size,
        learning_rate=1e-3, warmup_steps=args.warmup_steps, lr_scheduler_type="inverse_sqrt", adam_beta2=0.98,
        label_smoothing_factor=0.1, weight_decay=0.0, seed=seed, save_strategy="no", report_to="none",
        logging_steps=args.logging_steps, disable_tqdm=True,
    )
    training_args = Seq2SeqTrainingArguments(**{**settings, **training_overrides})
    trainer = Seq2SeqTrainer(
        model=model, args=training_args, train_dataset=train_dataset, processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
    )
    started = time.perf_counter()
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    seconds = time.perf_counter() - started
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    history = trainer.state.log_history
    return {"train_seconds": seconds, "steps": trainer.state.global_step,
            "train_loss": logged_losses(history)}


class PeerTranslationTrainer(TranslationTrainer):
    """`TranslationTrainer` for a MarianMTModel peer: its evaluations during training decode as hf_relpos' models do,
    each source capped at floor(generation_max_length_ratio x its tokens + generation_max_length_offset) new tokens
    under the generation config's max_new_tokens (`SourceLengthCapLogitsProcessor`), which MarianMTModel's generate
    does not read from its generation config."""

    def prediction_step(self, model: torch.nn.Module, inputs: dict, prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None, **gen_kwargs: object) -> tuple:
        if self.args.predict_with_generate and not prediction_loss_only:
            generation = self.model.generation_config
            limits = new_token_limits(inputs["attention_mask"].sum(dim=-1), self.args.generation_max_length_ratio,
                                      self.args.generation_max_length_offset, generation.max_new_tokens)
            cap = SourceLengthCapLogitsProcessor(limits, 1, generation.eos_token_id)
            gen_kwargs = {**(gen_kwargs or getattr(self, "_gen_kwargs", {})), "max_new_tokens": int(limits.max()),
                          "logits_processor": LogitsProcessorList([cap])}
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys, **gen_kwargs)


def train_peer_as_recipe(argv: Sequence[str], args: argparse.Namespace) -> dict:
    """MarianMTModel (the peer's config and init) trained by hf_relpos' `TranslationTrainer` with the training
    arguments of a recipe run, `argv` (train_translation.py's): its tokenizer, token-budget batches, schedule, steps
    or epochs and checkpoints in its output_dir, where the model and tokenizer are saved. With an eval_strategy it is
    evaluated on validation_file as it trains (so that early_stopping_patience applies to it as to the recipes)."""
    model_args, data_args, training_args = parse_arguments(argv)
    if training_args.cpu_threads is not None:
        torch.set_num_threads(training_args.cpu_threads)
    sources, targets = read_pairs(Path(data_args.train_file), data_args.source_lang, data_args.target_lang)
    tokenizer = train_joint_tokenizer([*sources, *targets], model_args.tokenizer_vocab_size,
                                      character_coverage=model_args.tokenizer_character_coverage)
    train_dataset, _ = tokenize_training_pairs(Dataset.from_dict({"source": sources, "target": targets}), tokenizer,
                                               data_args)
    evaluation_sets = {}
    if training_args.eval_strategy != "no":   # evaluated during training (early_stopping_patience) on validation_file
        pairs = read_pairs(Path(data_args.validation_file), data_args.source_lang, data_args.target_lang)
        validation, _ = tokenize_evaluation_pairs(Dataset.from_dict({"source": pairs[0], "target": pairs[1]}),
                                                  tokenizer, data_args, "validation")
        evaluation_sets["eval"] = prepare_evaluation_set(validation)
    set_seed(training_args.seed)
    model = MarianMTModel(peer_config(tokenizer, args))
    # decoded as build_model sets up the recipes' models (the cap per source: PeerTranslationTrainer)
    configure_decoding(model.generation_config, training_args, model.config.max_position_embeddings)
    trainer = PeerTranslationTrainer(
        model=model, args=training_args, train_dataset=train_dataset, processing_class=tokenizer,
        eval_dataset=evaluation_sets["eval"].dataset if evaluation_sets else None,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        evaluation_sets=evaluation_sets, target_lang=data_args.target_lang,
    )
    started = time.perf_counter()
    trainer.train(resolve_resume_checkpoint(training_args))
    seconds = time.perf_counter() - started
    trainer.save_model()
    tokenizer.save_pretrained(training_args.output_dir)
    trainer.save_state()
    history = trainer.state.log_history
    return {"train_seconds": seconds, "steps": trainer.state.global_step, "argv": list(argv),
            "train_loss": logged_losses(history)}


def recipe_path(recipe: str) -> Path:
    if recipe == PEER_WITH_RECIPE_TRAINING:
        recipe = PEER_TRAINING_RECIPE
    return Path(recipe) if recipe.endswith((".yaml", ".yml")) else ROOT / "configs" / f"multi30k_small_{recipe}.yaml"


def recipe_argv(row: Row, folder: Path, seed: int, args: argparse.Namespace) -> list[str]:
    """train_translation.py arguments of one hf_relpos run: the recipe, the shared budget and size, the row's flags
    (last, so they win), training only (the script decodes)."""
    return [
        str(recipe_path(row.recipe)),
        "--train_file", str(args.data / "train.jsonl"), "--source_lang", args.source_lang,
        "--target_lang", args.target_lang, "--output_dir", str(folder / "model"), "--seed", str(seed),
        "--max_steps", str(args.max_steps), "--warmup_steps", str(args.warmup_steps),
        "--max_tokens_per_batch", str(args.max_tokens_per_batch), "--tokenizer_vocab_size", str(args.vocab_size),
        "--model.d_model", str(args.d_model), "--model.encoder_layers", str(args.layers),
        "--model.decoder_layers", str(args.layers), "--model.encoder_attention_heads", str(args.heads),
        "--model.decoder_attention_heads", str(args.heads), "--model.encoder_ffn_dim", str(args.ffn_dim),
        "--model.decoder_ffn_dim", str(args.ffn_dim),
        "--do_eval", "false", "--do_predict", "false", "--eval_strategy", "no", "--save_strategy", "no",
        "--logging_steps", str(args.logging_steps), "--cpu_threads", str(args.threads), "--report_to", "none",
        "--disable_tqdm", "true", *(peer_tokenizer(args) if flag == PEER_TOKENIZER else flag for flag in row.flags),
        *EMBEDDING_INIT_FLAGS[row.init],
    ]


def peer_tokenizer(args: argparse.Namespace) -> str:
    """The folder of the peer's tokenizer under --work, trained and saved on first use (a row's `@peer-tokenizer`)."""
    folder = args.work / "peer_tokenizer"
    if not (folder / "tokenizer.json").is_file():
        sources, targets = read_pairs(args.data / "train.jsonl", args.source_lang, args.target_lang)
        train_peer_tokenizer([*sources, *targets], args.vocab_size).save_pretrained(folder)
    return str(folder)


def train_recipe(row: Row, folder: Path, seed: int, args: argparse.Namespace) -> dict:
    argv = recipe_argv(row, folder, seed, args)
    started = time.perf_counter()
    results = run(argv)
    seconds = time.perf_counter() - started
    history = json.loads((folder / "model" / "trainer_state.json").read_text())["log_history"]
    return {"train_seconds": seconds, "train_runtime": results["train"]["train_runtime"], "argv": argv,
            "train_loss": logged_losses(history)}


def load_trained(folder: Path, is_peer: bool, device: str = "cpu") -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    model_class = MarianMTModel if is_peer else RelPosTransformerForConditionalGeneration
    return model_class.from_pretrained(folder).to(device), load_tokenizer(folder)


@dataclass(frozen=True)
class Decoding:
    """Beam size, length penalty (transformers': log-probability / length^penalty) and the length limit: at most
    `max_new_tokens`, or, with `source_offset`, the longest source of the batch + offset (train_translation.py's
    earlier rule, Vaswani et al.'s input length + 50), or, with `max_len_a` too, each source's own
    floor(max_len_a x its tokens + source_offset) under `max_new_tokens` (fairseq's max_len_a / max_len_b, the rule
    generation_config.json now saves; `SourceLengthCapLogitsProcessor`, the same for every model, the peer included).
    With `min_len_a`, each source's output has at least floor(min_len_a x its tokens) new tokens before its end token
    (`SourceLengthMinimumLogitsProcessor`); with `no_repeat_ngram_size` N, no output repeats an N-gram of tokens
    (transformers' `no_repeat_ngram_size`)."""

    beams: int
    length_penalty: float
    max_new_tokens: int = 80
    source_offset: int | None = None
    max_len_a: float | None = None
    min_len_a: float | None = None
    no_repeat_ngram_size: int | None = None


class SourceLengthMinimumLogitsProcessor(LogitsProcessor):
    """While row i has made fewer than `minimums[i]` new tokens, its end token(s) score -inf, so its output has at
    least that many tokens before the end token (transformers' MinNewTokensLengthLogitsProcessor with a minimum per
    source). Rows are matched to the scores' rows by repetition (`per_scores_row`)."""

    def __init__(self, minimums: torch.Tensor, prompt_length: int, eos_token_id: int | list[int]):
        self.minimums = minimums
        self.prompt_length = prompt_length
        self.eos_token_ids = eos_token_id if isinstance(eos_token_id, list) else [eos_token_id]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        generated = input_ids.shape[-1] - self.prompt_length
        minimums = per_scores_row(self.minimums, scores)
        blocked = minimums > generated
        if not bool(blocked.any()):
            return scores
        eos = torch.zeros_like(scores, dtype=torch.bool)
        eos[:, self.eos_token_ids] = True
        return scores.masked_fill(blocked[:, None] & eos, -math.inf)


PIPELINE_DECODING = "train_translation.py --do_train false --do_predict (its own evaluation path, same settings)"


def translate(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, sources: Sequence[str], decoding: Decoding,
              batch_size: int) -> list[str]:
    """Beam search with one explicit GenerationConfig for every model, batches sorted by source length."""
    return translate_marking_caps(model, tokenizer, sources, decoding, batch_size)[0]


def translate_marking_caps(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, sources: Sequence[str],
                           decoding: Decoding, batch_size: int) -> tuple[list[str], list[bool]]:
    """`translate`'s hypotheses, and per source whether its output used every new token its cap allowed (the
    source's own cap, else the batch's `max_new_tokens`): such an output may have been cut there. An output that
    ends naturally on its last allowed token counts too, so the count is an upper bound."""
    model.eval()
    encoded = tokenizer(list(sources))["input_ids"]
    order = sorted(range(len(sources)), key=lambda index: -len(encoded[index]))
    hypotheses, at_cap = [""] * len(sources), [False] * len(sources)
    eos_token_id = model.config.eos_token_id
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            indices = order[start : start + batch_size]
            batch = tokenizer.pad({"input_ids": [encoded[index] for index in indices]}, return_tensors="pt").to(model.device)
            limit, processors = decoding.max_new_tokens, []
            lengths = batch["attention_mask"].sum(dim=-1)   # each source's tokens
            if decoding.max_len_a is not None:
                limits = new_token_limits(lengths, decoding.max_len_a, decoding.source_offset or 0,
                                          decoding.max_new_tokens)
                limit = int(limits.max())
                processors.append(SourceLengthCapLogitsProcessor(limits, 1, eos_token_id))
            else:
                if decoding.source_offset is not None:
                    limit = int(lengths.max()) + decoding.source_offset
                limits = torch.full((len(indices),), limit)
            if decoding.min_len_a is not None:
                minimums = torch.floor(lengths.double() * decoding.min_len_a).long()
                minimums = torch.minimum(minimums, limits.to(minimums.device) - 1)   # the end token at the cap
                processors.append(SourceLengthMinimumLogitsProcessor(minimums, 1, eos_token_id))
            generation = GenerationConfig(
                num_beams=decoding.beams, length_penalty=decoding.length_penalty, max_new_tokens=limit,
                no_repeat_ngram_size=decoding.no_repeat_ngram_size or 0, early_stopping=False, pad_token_id=model.config.pad_token_id, eos_token_id=eos_token_id,
                decoder_start_token_id=model.config.decoder_start_token_id,
            )
            if decoding.max_len_a is not None:  # an hf_relpos model's own cap: the same, not its saved one
                generation.max_len_a, generation.max_len_b = decoding.max_len_a, decoding.source_offset or 0
            generated = model.generate(**batch, generation_config=generation,
                                       logits_processor=LogitsProcessorList(processors))
            ended = generated[:, 1:] == eos_token_id   # the new tokens, after the decoder start token
            # a row ends at its first end token, on its own or forced by its cap at its last allowed token; a row
            # without one stopped at the batch's max_new_tokens (beam search may return it without the end token)
            used = ended.int().argmax(dim=-1) + 1
            reached = (~ended.any(dim=-1) | (used >= limits.to(used.device))).tolist()
            texts = decode_translations(generated.tolist(), tokenizer)
            for index, text, capped in zip(indices, texts, reached, strict=True):
                hypotheses[index], at_cap[index] = text, capped
    return hypotheses, at_cap


def table_decoding(args: argparse.Namespace) -> Decoding:
    return Decoding(args.beams, args.length_penalty, args.max_new_tokens)


def decoding_variants(args: argparse.Namespace) -> dict[str, Decoding]:
    """The decoding study: the table's decoding, then one setting changed at a time."""
    table = table_decoding(args)
    return {
        f"beam {table.beams}, lp {table.length_penalty}, max {table.max_new_tokens} new (the table's)": table,
        "max source + 50 new (train_translation.py's limit)": replace(table, source_offset=50),
        "lp 1.0": replace(table, length_penalty=1.0),
        "lp 0.0": replace(table, length_penalty=0.0),
        "greedy": replace(table, beams=1),
    }


def evaluate(model_folder: Path, is_peer: bool, decoding: Decoding, args: argparse.Namespace,
             hypotheses_folder: Path | None = None) -> dict:
    """BLEU (signature, length ratio) on validation and test, optionally writing the hypotheses."""
    model, tokenizer = load_trained(model_folder, is_peer, args.device)
    scores = {}
    for split, file_name in SPLITS.items():
        sources, references = read_pairs(args.data / file_name, args.source_lang, args.target_lang)
        limit = args.max_eval_samples or len(sources)
        started = time.perf_counter()
        hypotheses = translate(model, tokenizer, sources[:limit], decoding, args.eval_batch_size)
        seconds = time.perf_counter() - started
        if hypotheses_folder is not None:
            write_text_atomic(hypotheses_file(hypotheses_folder, split), "".join(f"{line}\n" for line in hypotheses))
        scores[split] = {**score_translations(hypotheses, references[:limit], target_lang=args.target_lang),
                         "decode_seconds": seconds}
    return scores


def pipeline_scores(model_folder: Path, work: Path, args: argparse.Namespace) -> dict:
    """Validation and test BLEU of a trained hf_relpos model through train_translation.py's own evaluation (batches
    sorted by source length, `TranslationTrainer.prediction_step`), with the table's decoding settings."""
    results = run([
        "--model_name_or_path", str(model_folder),
        "--do_train", "false", "--do_eval", "true", "--do_predict", "true", "--output_dir", str(work),
        "--validation_file", str(args.data / SPLITS["validation"]), "--test_file", str(args.data / SPLITS["test"]),
        "--source_lang", args.source_lang, "--target_lang", args.target_lang,
        "--generation_num_beams", str(args.beams), "--generation_length_penalty", str(args.length_penalty),
        "--generation_max_length", str(args.max_new_tokens), "--generation_max_length_offset", str(args.max_new_tokens),
        "--per_device_eval_batch_size", str(args.eval_batch_size), "--cpu_threads", str(args.threads),
        "--report_to", "none", "--disable_tqdm", "true",
        *(["--max_eval_samples", str(args.max_eval_samples), "--max_predict_samples", str(args.max_eval_samples)]
          if args.max_eval_samples else []),
    ])
    return {split: {"bleu": results[prefix][f"{prefix}_bleu"], "length_ratio": results[prefix][f"{prefix}_length_ratio"]}
            for split, prefix in (("validation", "eval"), ("test", "test"))}


def hypotheses_archive(out: Path, stem: str) -> Path:
    """Beside a collection's record `<stem>.json`: the translations it scores, {"SYSTEM seed S[ WEIGHTS]: SET": lines}."""
    return out / f"{stem}_hypotheses.json.gz"


def write_results(out: Path, stem: str, results: dict, table: str,
                  hypotheses: dict[str, list[str]] | None = None) -> None:
    """Print the Markdown table and write it and the results to `<out>/<stem>.md` and `<out>/<stem>.json`, and the
    `hypotheses` the results score to `<out>/<stem>_hypotheses.json.gz` (gzip without a name or timestamp: the same
    translations give the same bytes), so that its BLEU, chrF and paired tests can be recomputed from the references;
    an archive of an earlier collection of `stem` without them is removed. Each file is replaced whole or not at all."""
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / f"{stem}.json", json.dumps(results, indent=1) + "\n")
    write_text_atomic(out / f"{stem}.md", table)
    archive = hypotheses_archive(out, stem)
    if hypotheses:
        compressed = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=compressed, mtime=0) as writer:
            writer.write(json.dumps(hypotheses, ensure_ascii=False, indent=0, sort_keys=True).encode("utf-8"))
        with atomic_file(archive) as temporary:   # whole or not at all, as the record's .json and .md
            temporary.write_bytes(compressed.getvalue())
    else:
        archive.unlink(missing_ok=True)


def read_hypotheses(path: Path) -> list[str] | None:
    """The lines of a hypotheses file `evaluate` wrote (one each, ended by "\n": a hypothesis may hold a bare "\r",
    which splitlines would cut); None when there is none."""
    return path.read_bytes().decode("utf-8").split("\n")[:-1] if path.is_file() else None


def kept_hypotheses(seeds: dict[str, list[int]], hypotheses_of: Callable[[str, int, str], Path],
                    weights: str | None = None) -> dict[str, list[str]]:
    """Every kept hypotheses file `hypotheses_of(system, seed, split)` of the runs `seeds` ({system: seeds}), keyed as
    `write_results` archives them: "SYSTEM seed S: SPLIT", or "SYSTEM seed S WEIGHTS: SPLIT" for `weights`."""
    label = "" if weights is None else f" {weights}"
    kept = {}
    for system, system_seeds in seeds.items():
        for seed in system_seeds:
            for split in SPLITS:
                lines = read_hypotheses(hypotheses_of(system, seed, split))
                if lines is not None:
                    kept[f"{system} seed {seed}{label}: {split}"] = lines
    return kept


def run_batches(folder: Path, seed: int, args: argparse.Namespace, argv: Sequence[str] | None,
                steps: int | None = None) -> dict:
    """Pairs and padding of a run's first `steps` updates (default: its max_steps), from its own tokenizer and
    settings (experiments/batch_statistics.py): a run with train_translation.py arguments `argv` (a recipe, or the
    peer trained as one) drew the very token-budget batches computed here; the plain peer's batches of
    `--batch-size` pairs are a draw of the same random distribution."""
    if argv is None:
        data_args = DataArguments(train_file=str(args.data / "train.jsonl"), source_lang=args.source_lang,
                                  target_lang=args.target_lang)
        steps = args.max_steps if steps is None else steps
        budget, pool_factor, batch_size, accumulation = None, None, args.batch_size, 1
    else:
        _, data_args, training_args = parse_arguments(argv)
        steps = training_args.max_steps if steps is None else steps
        budget, pool_factor = training_args.max_tokens_per_batch, training_args.length_pool_factor
        batch_size, accumulation = training_args.per_device_train_batch_size, training_args.gradient_accumulation_steps
    sources, targets = read_lengths(Path(data_args.train_file), str(folder / "model"), args.source_lang,
                                    args.target_lang, data_args, seed if argv is None else data_seed(training_args))
    batches = training_batches(sources, targets, steps * accumulation, seed, budget, pool_factor, batch_size)
    figures = batch_figures(batches, sources, targets)
    return {"pairs_per_update": figures["pairs"] * accumulation, "padded_tokens_per_batch": figures["padded_tokens"],
            "padding": figures["padding"], "batches": figures["batches"], "token_budget": budget,
            "length_pool_factor": pool_factor, "gradient_accumulation_steps": accumulation}


def typed_record(system: str, is_peer: bool, recipe: str, trained_as: str, seed: int, version: str, hardware: str,
                 steps: int, training: dict, batches: dict, scores: dict, date: str,
                 average_checkpoints: int | None = None, trained: RunRecord | None = None) -> dict:
    """The run as hf_relpos' typed run record (`RunRecord.to_json()`, what the model cards read): its role (a peer,
    or hf_relpos trained from `recipe`), how it trained, its batch, time, releases and scores; `trained` is the
    record train_translation.py wrote of it (its every recipe field), if it trained through it."""
    return replace(
        trained or RunRecord(),
        role=run_records.PEER if is_peer else run_records.RECIPE, recipe=None if is_peer else recipe, system=system,
        trained_as=trained_as, seed=seed, steps=steps, source_version=version, hardware=hardware, devices=1,
        training_seconds=training["train_seconds"], date=date, software=software_versions(),
        max_tokens_per_batch=batches["token_budget"], gradient_accumulation_steps=batches["gradient_accumulation_steps"],
        average_checkpoints=average_checkpoints, scores=scores_by_weights(scores)).to_json()


def device_description(args: argparse.Namespace) -> str:
    return f"CPU: {cpu_model_name()}, {os.cpu_count()} cores, {args.threads} thread(s) per run"


def row_record(row: Row) -> dict:
    """The row as stored in run.json (JSON types: the flags as a list)."""
    return json.loads(json.dumps(asdict(row)))


def run_one(row: Row, seed: int, args: argparse.Namespace) -> dict:
    """Train (unless `run.json` already exists), decode and score one row and seed; returns the run record."""
    folder = args.work / row.name / f"seed{seed}"
    record_path = folder / "run.json"
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        if record["row"] != row_record(row):
            raise SystemExit(f"vs_marian.py: {record_path} was trained as {record['row']}, not {row_record(row)}; "
                             "rename the row or delete the folder")
        return record
    if args.collect_only:
        raise SystemExit(f"vs_marian.py: --collect-only: {row.name} seed {seed} has no {record_path}")
    folder.mkdir(parents=True, exist_ok=True)
    print(f"{row.name} seed {seed}: training ({row.describe()})", flush=True)
    version, started = checkout_version(ROOT), time.perf_counter()   # the code that trains, not the code at the end
    if row.recipe == PEER_WITH_RECIPE_TRAINING:
        training = train_peer_as_recipe(recipe_argv(row, folder, seed, args), args)
    elif row.is_peer:
        training = train_peer(folder, seed, args, row.recipe)
    else:
        training = train_recipe(row, folder, seed, args)
    scores = evaluate(folder / "model", row.is_peer, table_decoding(args), args, hypotheses_folder=folder)
    wall_seconds = time.perf_counter() - started
    batches, date = run_batches(folder, seed, args, training.get("argv")), datetime.now(UTC).isoformat(
        timespec="seconds")
    typed = typed_record(row.name, row.is_peer, recipe_path(row.recipe).stem, row.describe(), seed, version,
                         device_description(args), training.get("steps") or args.max_steps, training, batches,
                         scores, date, trained=run_records.training_record(folder / "model"))
    record = {"row": row_record(row), "seed": seed, "source_version": version, "versions": software_versions(),
              "wall_seconds": wall_seconds, **training, "batches": batches, "scores": scores, "date": date,
              "record": typed, **{name: vars(args)[name] for name in RUN_SETTINGS}}
    write_text_atomic(record_path, json.dumps(record, indent=1) + "\n")
    print(f"{row.name} seed {seed}: test BLEU {scores['test']['bleu']:.2f}, validation BLEU "
          f"{scores['validation']['bleu']:.2f}", flush=True)
    return record


# The setting that shapes what a run scores: each run records it, and a collection states the runs'.
RUN_SETTINGS = ("max_eval_samples",)
PAIRED_RESAMPLES = 1000   # paired bootstrap resamples of each system against the baseline (sacreBLEU's default)


def hypotheses_file(folder: Path, split: str) -> Path:
    """Where `evaluate` writes a split's hypotheses in `folder` (one line each)."""
    return folder / f"{split}_hypotheses.txt"


def run_hypotheses(work: Path) -> Callable[[str, int, str], Path]:
    """Where each run of this script keeps its hypotheses of a split."""
    return lambda row, seed, split: hypotheses_file(work / row / f"seed{seed}", split)


def paired_test_results(seeds: dict[str, list[int]], baseline: str, references: dict[str, list[str]],
                        hypotheses_of: Callable[[str, int, str], list[str] | None], script: str,
                        mismatch_hint: str = "", target_lang: str = "") -> tuple[dict, str | None]:
    """Each system of `seeds` against `baseline` of the same seed on each named set of `references`, from
    `hypotheses_of(system, seed, name)` (None: not kept): the BLEU difference and its paired bootstrap p-value
    (`paired_bootstrap`), as system -> name -> seed -> result, and the test's signature (None when nothing was
    tested). BLEU is tokenized for `target_lang` as `score_translations` tokenizes it. Hypotheses that do not pair up
    with the references line by line are left out with one line on stderr."""
    systems, signature = {}, None
    for system in seeds:
        if system == baseline:
            continue
        for seed in seeds[system]:
            for name, wanted in references.items():
                baseline_lines, system_lines = (hypotheses_of(side, seed, name) for side in (baseline, system))
                if baseline_lines is None or system_lines is None:
                    continue
                if not len(baseline_lines) == len(system_lines) == len(wanted):
                    print(f"{script}: no paired test of {system} seed {seed} on {name}: {len(baseline_lines)} and "
                          f"{len(system_lines)} hypothesis lines for {len(wanted)} references{mismatch_hint}",
                          file=sys.stderr)
                    continue
                result = paired_bootstrap(baseline_lines, system_lines, wanted, PAIRED_RESAMPLES,
                                          target_lang=target_lang)
                signature = result.pop("signature")
                systems.setdefault(system, {}).setdefault(name, {})[str(seed)] = result
    return systems, signature


def paired_tests(seeds: dict[str, list[int]], baseline: str, weights: str,
                 hypotheses_of: Callable[[str, int, str], Path], args: argparse.Namespace, script: str) -> dict | None:
    """Each system against `baseline` of the same seed on validation and test2016 (`paired_test_results`), from the
    hypotheses files `hypotheses_of(system, seed, split)`, for the seeds whose hypotheses both runs kept; None when
    the baseline is not among the systems or no pair was tested."""
    if baseline not in seeds:
        return None
    references = {split: read_pairs(args.data / file_name, args.source_lang, args.target_lang)[1][
        :args.max_eval_samples] for split, file_name in SPLITS.items()}

    def read(system: str, seed: int, split: str) -> list[str] | None:
        return read_hypotheses(hypotheses_of(system, seed, split))

    systems, signature = paired_test_results(seeds, baseline, references, read, script, " (another "
                                             "--max-eval-samples, or a translation holding a line break)",
                                             args.target_lang)
    if signature is None:
        return None
    return {"baseline": baseline, "weights": weights, "resamples": PAIRED_RESAMPLES, "signature": signature,
            "systems": systems}


def paired_tests_table(tests: dict) -> list[str]:
    """Each system against the baseline, seed by seed: BLEU difference (paired bootstrap p-value)."""
    lines = [
        f"Against `{tests['baseline']}` of the same seed, {tests['weights']} weights: BLEU difference (p-value of "
        f"paired bootstrap resampling, Koehn 2004, {tests['resamples']} resamples), per seed. Signature: "
        f"`{tests['signature']}`.",
        "",
        "| system | test2016 | validation |",
        "| --- | --- | --- |",
    ]
    for system, splits in tests["systems"].items():
        cells = [paired_cell(splits.get(split, {})) for split in ("test", "validation")]
        lines.append(f"| {system} | {' | '.join(cells)} |")
    return lines


def paired_cell(by_seed: dict[str, dict]) -> str:
    """One table cell of paired tests, seed by seed: `seed S: difference (p p-value)`; "-" when none was tested."""
    return "; ".join(f"seed {seed}: {result['difference']:+.2f} (p {result['p_value']:.3f})"
                     for seed, result in by_seed.items()) or "-"


def spread(values: Sequence[float], digits: int = 2) -> str:
    """`mean (min-max)`, or the value alone for one seed."""
    mean = f"{statistics.mean(values):.{digits}f}"
    return mean if len(values) == 1 else f"{mean} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def batch_summary(runs: Sequence[dict]) -> dict[str, list[float]]:
    """Pairs per update and padding share of the runs that recorded their batches (run_batches)."""
    return {"pairs_per_update": [run["batches"]["pairs_per_update"] for run in runs if "batches" in run],
            "padding": [run["batches"]["padding"] for run in runs if "batches" in run]}


def batch_columns(row: dict) -> str:
    """The `pairs/update | padding %` table cells of a summarized row ("not recorded" for older records)."""
    pairs = spread(row["pairs_per_update"], 1) if row.get("pairs_per_update") else "not recorded"
    padding = spread([100 * share for share in row["padding"]], 1) if row.get("padding") else "not recorded"
    return f"{pairs} | {padding}"


def summarize(rows: list[Row], records: dict[str, list[dict]]) -> dict:
    summary = {}
    for row in rows:
        runs = records[row.name]
        summary[row.name] = {
            "system": row.describe(), "seeds": [run["seed"] for run in runs],
            **{f"{split}_{key}": [run["scores"][split][key] for run in runs]
               for split in SPLITS for key in ("bleu", "length_ratio")},
            "wall_minutes": [run["wall_seconds"] / 60 for run in runs], **batch_summary(runs),
        }
    return summary


def scored_pairs(settings: dict) -> str:
    """A caption's note on the pairs a record scored where `--max-eval-samples` cut the sets (else nothing: every
    pair)."""
    limit = settings.get("max_eval_samples")
    return (f" BLEU and hyp/ref of the first {limit} pairs of test2016 and of validation only (`--max-eval-samples "
            f"{limit}`)." if limit else "")


def markdown(results: dict) -> str:
    settings = results["settings"]
    lines = [
        "# HF MarianMT (peer) against hf_relpos at an equal budget, Multi30k En->De",
        "",
        f"{settings['max_steps']} steps ({settings['warmup_steps']} warm-up), peer batches of "
        f"{settings['batch_size']} pairs, hf_relpos `--max_tokens_per_batch {settings['max_tokens_per_batch']}` "
        "(a row's own flags, in its system column, win); "
        f"beam {settings['beams']}, length penalty {settings['length_penalty']}, at most "
        f"{settings['max_new_tokens']} new tokens. Mean over seeds (min-max).{scored_pairs(settings)} Device: "
        f"{results['device']}.",
        f"sacreBLEU signature: `{results['signature']}`.",
        "",
        "| row | system | seeds | test2016 BLEU | validation BLEU | test hyp/ref | validation hyp/ref | pairs/update "
        "| padding % | wall min |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in results["rows"].items():
        lines.append(
            f"| {name} | {row['system']} | {', '.join(map(str, row['seeds']))} | {spread(row['test_bleu'])} | "
            f"{spread(row['validation_bleu'])} | {spread(row['test_length_ratio'], 3)} | "
            f"{spread(row['validation_length_ratio'], 3)} | {batch_columns(row)} | {spread(row['wall_minutes'], 0)} |"
        )
    if "paired_tests" in results:
        lines += ["", *paired_tests_table(results["paired_tests"])]
    return "\n".join(lines) + "\n"


def decoding_study(rows: list[Row], args: argparse.Namespace) -> dict:
    """Every decoding variant (and, for hf_relpos rows, the pipeline's own evaluation) on the finished runs."""
    study: dict[str, dict] = {}
    for row in rows:
        for seed in seeds_of(row, args):
            folder = args.work / row.name / f"seed{seed}"
            if not (folder / "run.json").is_file():
                raise SystemExit(f"vs_marian.py: --decoding-study needs the finished run {folder}")
            variants = {name: evaluate(folder / "model", row.is_peer, decoding, args)
                        for name, decoding in decoding_variants(args).items()}
            if not row.is_peer:
                variants[PIPELINE_DECODING] = pipeline_scores(folder / "model", folder / "pipeline_evaluation", args)
            study[f"{row.name} seed {seed}"] = variants
    lines = ["# Decoding study: the same trained models, decoded differently", "",
             "| run | decoding | test2016 BLEU | validation BLEU | test hyp/ref | validation hyp/ref |",
             "| --- | --- | --- | --- | --- | --- |"]
    for run_name, variants in study.items():
        for name, scores in variants.items():
            lines.append(f"| {run_name} | {name} | {scores['test']['bleu']:.2f} | {scores['validation']['bleu']:.2f} | "
                         f"{scores['test']['length_ratio']:.3f} | {scores['validation']['length_ratio']:.3f} |")
    write_results(args.out, "decoding", study, "\n".join(lines) + "\n")
    return study


def build_parser() -> argparse.ArgumentParser:
    """vs_marian.py's options (report.py writes a record's command line from their defaults)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "multi30k",
                        help="folder with train/validation/test.jsonl")
    parser.add_argument("--work", type=output_folder, default=Path("/tmp/vs_marian"),
                        help="run folders (not committed)")
    parser.add_argument("--out", type=output_folder, default=ROOT / "docs" / "results" / "vs_marian")
    parser.add_argument("--rows", nargs="+", default=[PEER, "absolute-marian"], help="predefined row names")
    parser.add_argument("--row", action="append", default=[], metavar="'NAME=RECIPE [--flag value ...]'",
                        help="an extra hf_relpos row (RECIPE: scheme or .yaml; --init hf|vaswani: token-embedding init)")
    parser.add_argument("--list", action="store_true", help="print the predefined rows and exit")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--row-seeds", action="append", default=[], metavar="NAME=S[,S...]",
                        help="the seeds of one row, instead of --seeds (e.g. to collect rows trained to different seeds)")
    parser.add_argument("--collect-only", action="store_true", help="only read finished runs under --work")
    parser.add_argument("--baseline", default="absolute",
                        help="row every other one is compared with, seed by seed (paired bootstrap), when present")
    parser.add_argument("--decoding-study", action="store_true",
                        help="decode the finished runs of the rows with every variant (no training); decoding.md")
    parser.add_argument("--source-lang", default="en")
    parser.add_argument("--target-lang", default="de")
    parser.add_argument("--max-steps", type=int, default=1500)
    parser.add_argument("--warmup-steps", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=64, help="peer: pairs per step")
    parser.add_argument("--max-tokens-per-batch", type=int, default=1024, help="hf_relpos: token budget per step")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn-dim", type=int, default=1024)
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--length-penalty", type=float, default=0.6)
    parser.add_argument("--max-new-tokens", type=int, default=80)
    parser.add_argument("--eval-batch-size", type=int, default=64)
    parser.add_argument("--max-eval-samples", type=int, default=None, help="score only the first N pairs (smoke)")
    parser.add_argument("--logging-steps", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--device", default="cpu", help="where the models decode (training: the Trainer's choice)")
    return parser


def parse_command_line(argv: Sequence[str]) -> tuple[argparse.Namespace, list[Row]]:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list:
        for row in ROWS.values():
            print(f"{row.name}: {row.describe()}")
        raise SystemExit(0)
    rows = [parse_row(name) for name in args.rows] + [parse_row(spec) for spec in args.row]
    names = [row.name for row in rows]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise SystemExit(f"vs_marian.py: row name(s) {duplicates} given twice")
    args.row_seeds = parse_row_seeds(args.row_seeds, names)
    missing = [name for name in ("train.jsonl", *SPLITS.values()) if not (args.data / name).is_file()]
    if missing:
        raise SystemExit(f"vs_marian.py: --data {args.data} lacks {', '.join(missing)}")
    return args, rows


def parse_row_seeds(specs: list[str], row_names: list[str]) -> dict[str, list[int]]:
    """`--row-seeds NAME=S[,S...]` of rows among `row_names` -> {NAME: [S, ...]}."""
    by_row: dict[str, list[int]] = {}
    for spec in specs:
        name, _, seeds = spec.partition("=")
        if name not in row_names:
            raise SystemExit(f"vs_marian.py: --row-seeds {spec!r}: {name!r} is not among the rows {row_names}")
        try:
            by_row[name] = [int(seed) for seed in seeds.split(",")]
        except ValueError:
            raise SystemExit(f"vs_marian.py: --row-seeds {spec!r}: give NAME=S[,S...] with integer seeds") from None
    return by_row


def seeds_of(row: Row, args: argparse.Namespace) -> list[int]:
    """The row's seeds: its `--row-seeds`, else `--seeds`."""
    return args.row_seeds.get(row.name, args.seeds)


def main(argv: Sequence[str] | None = None) -> dict:
    args, rows = parse_command_line(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(args.threads)
    if args.decoding_study:
        return decoding_study(rows, args)
    records = {row.name: [run_one(row, seed, args) for seed in seeds_of(row, args)] for row in rows}
    first = records[rows[0].name][0]
    adopt_run_settings(args, [run for runs in records.values() for run in runs], RUN_SETTINGS, "vs_marian.py")
    settings = json_settings(args)
    results = {
        "settings": settings,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": device_description(args),
        "signature": first["scores"]["test"]["bleu_signature"],
        "rows": summarize(rows, records),
        "runs": records,
    }
    seeds = {row.name: seeds_of(row, args) for row in rows}
    tests = paired_tests(seeds, args.baseline, "final", run_hypotheses(args.work), args, "vs_marian.py")
    if tests is not None:
        results["paired_tests"] = tests
    gather_run_records(results)
    write_results(args.out, "vs_marian", results, markdown(results),
                  kept_hypotheses(seeds, run_hypotheses(args.work)))
    return results


if __name__ == "__main__":
    main()
