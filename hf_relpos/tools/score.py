"""Score parallel text with a saved model: each target line's log-probability given its source line.

    hf-relpos-score MODEL_DIR --source SRC.txt --target TGT.txt [--output SCORES.txt] [--normalize]
    hf-relpos-score MODEL_DIR --source SRC.txt --n_best NBEST.txt [--n_best_feature NAME] [--n_best_backward] > OUT.txt
    zcat nbest.txt.gz | hf-relpos-score MODEL_DIR --source SRC.txt --n_best - > OUT.txt

(`python -m hf_relpos.tools.score` is the same program.)

One score per line pair, in order: log p(y | x) = sum_t log p(y_t | y_<t, x), natural log, over the target's tokens
as the tokenizer encodes a label (its end token included), by teacher forcing (one forward pass over the whole
target, as in training, with dropout off); with `--normalize`, that sum divided by the target's token count (the mean
log-probability per token: Marian's scorer's --normalize, CTranslate2's score_batch). What it is for: filtering
parallel data by the model's cross-entropy (dual conditional cross-entropy filtering, Junczys-Dowmunt 2018: a
forward and a backward model's normalized scores), another model's feature for n-best rescoring (a larger or
differently trained model's log p(hypothesis | source), or with `--n_best_backward` a model of the other direction's
log p(source | hypothesis)), a test set's perplexity. At the end the corpus cross-entropy per target token and its
perplexity go to stderr. A blank line is scored as the tokenizer encodes it (its end token alone).

`--n_best` scores the hypotheses of an n-best list instead of --target (`hf-relpos-translate --n_best`'s, Marian's or
Moses' format, `LINE_INDEX ||| HYPOTHESIS ||| FEATURES ||| ...`, in the order of --source's lines), each given its
source line, and writes the list back with the score appended to each entry's features (the field before its total
score, wherever the list's other fields are) as `NAME= SCORE`
(`--n_best_feature`, by default the first of F0, F1, ... the list does not have yet): a reranker's feature, as
Marian's scorer's --n-best. The hypothesis is read with its escapes undone (`html.unescape`: Moses' &amp;, &#124;,
&lt;, ...), as `hf_relpos.tools.n_best` writes them; with `--n_best_raw` it is read as it is (marian-nmt's lists escape
nothing, so a translation holding "&amp;" is that text). With `--n_best_backward` the model translates the other
way (a de-en model rescoring an en-de list): each entry is scored as log p(source line | hypothesis), the hypothesis
its input, the backward (channel) model's feature.

The inputs are read and scored `--buffer_lines` pairs at a time (memory holds one chunk), and a chunk's pairs are
sorted by length and batched by tokens (`--max_tokens`); compressed inputs (.gz, .bz2, .xz) are read as
`hf-relpos-translate` reads them, and `--output` is written as it writes it (beside its destination, renamed there
when the job ends, so a failed job leaves no part of it; a .gz, .bz2 or .xz name compressed). "-" is stdin as one of
--source, --target and --n_best (read as it is, as a file is, its errors naming "stdin"; stdin is read once, so two of
them "-" is an error) and stdout as --output, as Unix tools and sacrebleu read "-". A CTranslate2 folder
(`hf-relpos-export ctranslate2`) scores through the engine's score_batch, the same numbers to float32 rounding.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import math
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..publish.files import expand_home, text_output
from ..translation.data import COMPRESSION_WRITERS, DatasetSchemaError, compression_of, text_file_line_chunks
from .ctranslate2_engine import CTranslate2Model
from .translate import (
    DefaultsWhereSetFormatter,
    add_loading_arguments,
    check_model_and_files,
    checked_output,
    exit_unreadable,
    exit_unwritable,
    load_tokenizer_and_model,
    overlong_lines_message,
    padded_sources,
    stdio_name,
    token_batches,
)

PROGRAM = "hf-relpos-score"


def target_log_probabilities(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, source_ids: list[list[int]],
                             target_ids: list[list[int]]) -> list[torch.Tensor]:
    """log p(y_t | y_<t, x) of each target token, one tensor per pair, from one padded teacher-forced forward pass:
    sources and targets padded on the right, whatever the tokenizer's side (`padded_sources`; the causal decoder's
    padding comes after every real position), the decoder's inputs the labels shifted right as in training;
    log-softmax in the logits' dtype promoted to at least float32."""
    inputs = padded_sources(tokenizer, source_ids).to(model.device)
    longest = max(map(len, target_ids))
    pad = model.config.pad_token_id
    labels = torch.tensor([ids + [pad] * (longest - len(ids)) for ids in target_ids], device=model.device)
    with torch.inference_mode():
        logits = model(**inputs, decoder_input_ids=model.prepare_decoder_input_ids_from_labels(labels=labels),
                       use_cache=False).logits
    log_probabilities = logits.to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(-1)
    picked = log_probabilities.gather(-1, labels[..., None])[..., 0]
    return [row[:len(ids)] for row, ids in zip(picked, target_ids, strict=True)]


@dataclass
class ScoreTotals:
    """Pairs, target tokens and their summed log-probability over everything scored (the corpus figures)."""

    pairs: int = 0
    tokens: int = 0
    log_probability: float = 0.0
    unit: str = "pairs"

    def summary(self) -> str:
        """The corpus cross-entropy per target token (nats) and its perplexity (inf beyond a float's range)."""
        cross_entropy = -self.log_probability / self.tokens
        perplexity = math.exp(cross_entropy) if cross_entropy < math.log(sys.float_info.max) else math.inf
        return (f"{self.pairs} {self.unit}, {self.tokens} target tokens: cross-entropy {cross_entropy:.4f} nats per "
                f"token, perplexity {perplexity:.2f}")


def score_pairs(sources: Sequence[str], targets: Sequence[str], model: PreTrainedModel | CTranslate2Model,
                tokenizer: PreTrainedTokenizerBase, max_tokens: int = 4096, normalize: bool = False,
                totals: ScoreTotals | None = None, progress: tqdm | None = None) -> list[float]:
    """log p(target | source) of each pair, in order (the mean per target token with `normalize`), batched by
    `max_tokens` (the rows times the longer of their longest source and longest target, padding included); the
    pairs, tokens and summed log-probabilities are added to `totals`."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    source_ids = tokenizer(list(sources))["input_ids"]
    target_ids = tokenizer(text_target=list(targets))["input_ids"]
    scores = [0.0] * len(sources)
    for batch in token_batches([max(len(source_ids[i]), len(target_ids[i])) for i in range(len(sources))],
                               max_tokens):
        batch_sources, batch_targets = [source_ids[i] for i in batch], [target_ids[i] for i in batch]
        if isinstance(model, CTranslate2Model):
            per_token = model.target_log_probabilities(batch_sources, batch_targets)
        else:
            per_token = [row.tolist() for row in target_log_probabilities(model, tokenizer, batch_sources,
                                                                          batch_targets)]
        for position, token_scores in zip(batch, per_token, strict=True):
            total = math.fsum(token_scores)
            scores[position] = total / len(token_scores) if normalize else total
            if totals is not None:
                totals.pairs += 1
                totals.tokens += len(token_scores)
                totals.log_probability += total
        if progress is not None:
            progress.update(len(batch))
    return scores


def overlong_pairs(sources: Sequence[str], targets: Sequence[str], first_number: int,
                   model: PreTrainedModel | CTranslate2Model,
                   tokenizer: PreTrainedTokenizerBase) -> list[tuple[int, int, str]]:
    """(line number, positions needed, how the error names it) of each pair (numbered from `first_number`) whose
    source or target, as `score_pairs` encodes them, is longer than a CTranslate2 export's position table
    (`position_table_rows`); [] for a model without such a table."""
    rows = getattr(model, "position_table_rows", None)
    if rows is None or not sources:
        return []
    source_lengths = [len(ids) for ids in tokenizer(list(sources))["input_ids"]]
    target_lengths = [len(ids) for ids in tokenizer(text_target=list(targets))["input_ids"]]
    return [(number, max(source, target), f"{number} (a source of {source} and a target of {target} tokens)")
            for number, (source, target) in enumerate(zip(source_lengths, target_lengths, strict=True), first_number)
            if max(source, target) > rows]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.split("\n\n")[0],
                                     formatter_class=DefaultsWhereSetFormatter)
    parser.add_argument("model", type=expand_home,
                        help="saved model folder (model and tokenizer, e.g. a train_translation.py output_dir), or a "
                             "CTranslate2 folder written by hf-relpos-export ctranslate2")
    parser.add_argument("--source", type=expand_home, required=True,
                        help="source text, one sentence per line (a .gz, .bz2 or .xz file is decompressed while read; "
                             "- is stdin)")
    scored = parser.add_mutually_exclusive_group(required=True)
    scored.add_argument("--target", type=expand_home,
                        help="target text to score, one sentence per line, each the translation of the same line of "
                             "--source (a .gz, .bz2 or .xz file is decompressed while read; - is stdin)")
    scored.add_argument("--n_best", type=expand_home, metavar="NBEST",
                        help="an n-best list to score instead of --target (LINE_INDEX ||| HYPOTHESIS ||| FEATURES "
                             "..., as hf-relpos-translate --n_best writes it): written back with each hypothesis' "
                             "score appended to its features (- is stdin)")
    parser.add_argument("--n_best_feature", metavar="NAME",
                        help="--n_best: the feature's name (default: the first of F0, F1, ... the list's first "
                             "entry does not have)")
    parser.add_argument("--n_best_raw", action="store_true",
                        help="--n_best: read each hypothesis as it is, no escape undone (marian-nmt's lists, which "
                             "escape nothing; default: Moses' escapes &amp; &#124; &lt; ... undone, as "
                             "hf-relpos-translate --n_best and Moses write them)")
    parser.add_argument("--n_best_backward", action="store_true",
                        help="--n_best: the model translates the other way (the list's target language into its "
                             "source language): score log p(source line | hypothesis), the hypothesis as the model's "
                             "input (default: log p(hypothesis | source line))")
    parser.add_argument("--output", type=expand_home,
                        help="where the scores go, one per line; a name ending in .gz, .bz2 or .xz is written "
                             "compressed so; - is stdout (default: stdout)")
    parser.add_argument("--normalize", action="store_true",
                        help="score each pair by its mean log-probability per target token (default: the sum)")
    parser.add_argument("--max_tokens", type=int, default=4096,
                        help="tokens per batch: the pairs times the longer of their longest source and longest "
                             "target, padding included")
    parser.add_argument("--buffer_lines", type=int, default=10000, metavar="N",
                        help="line pairs read, scored and written at a time (memory holds one such chunk)")
    add_loading_arguments(parser)
    parser.add_argument("--no_progress", action="store_true",
                        help="no progress bars on stderr (scoring, and transformers' while loading)")
    return parser


class _LineCountError(Exception):
    """--source and --target have different line counts (both counted to their ends)."""

    def __init__(self, sources: int, targets: int) -> None:
        super().__init__(sources, targets)
        self.sources, self.targets = sources, targets


class _ReadError(Exception):
    """An input file that cannot be read, does not decompress or holds a line that is not UTF-8, with its flag."""

    def __init__(self, flag: str, error: OSError | DatasetSchemaError) -> None:
        super().__init__(flag, error)
        self.flag, self.error = flag, error


def read_as(flag: str, chunks: Iterator[list[str]]) -> Iterator[list[str]]:
    """`chunks`, an error of reading them raised as a `_ReadError` naming `flag`."""
    try:
        yield from chunks
    except (OSError, DatasetSchemaError) as error:
        raise _ReadError(flag, error) from error


def paired_chunks(sources: Iterator[list[str]], targets: Iterator[list[str]]) -> Iterator[tuple[list[str], list[str]]]:
    """The chunks of both files side by side; a `_LineCountError` with both files' line counts where they differ
    (the rest of both read to count them)."""
    read = [0, 0]
    for source_chunk, target_chunk in zip_longest(sources, targets, fillvalue=[]):
        read[0] += len(source_chunk)
        read[1] += len(target_chunk)
        if len(source_chunk) != len(target_chunk):
            raise _LineCountError(read[0] + sum(map(len, sources)), read[1] + sum(map(len, targets)))
        yield source_chunk, target_chunk


class _NBestError(Exception):
    """An n-best line that cannot be scored, with its line number in the list."""

    def __init__(self, line_number: int, reason: str) -> None:
        super().__init__(line_number, reason)
        self.line_number, self.reason = line_number, reason


N_BEST_SEPARATOR = " ||| "
FEATURE_NAME = re.compile(r"[^\s=|]+")
LINE_INDEX = re.compile(r"[0-9]+")   # ASCII digits: str.isdigit also takes "²", which int() refuses


def feature_names(features: str) -> set[str]:
    """The names of an n-best entry's features ("F0= -1.5 LM= -3" -> {"F0", "LM"})."""
    return set(re.findall(r"(\S+)=", features))


def first_free_feature(features: str) -> str:
    """F0, F1, ...: the first such name an n-best entry's `features` do not hold."""
    names = feature_names(features)
    return next(f"F{index}" for index in range(len(names) + 1) if f"F{index}" not in names)


def features_field(fields: list[str]) -> int:
    """The index of an n-best entry's features among its `fields`: the field before its total score, which is the
    first field from the fourth on that is one number (Moses and hf-relpos-translate write the features third and
    may follow the score with alignments; marian-nmt writes --alignment, --word-scores and --word-counts fields
    between the hypothesis and the features); the third field where no field is one number."""
    return next((index - 1 for index in range(3, len(fields)) if is_number(fields[index])), 2)


def is_number(text: str) -> bool:
    """Whether `text` is one number (an n-best entry's total score), not a list of features or alignments."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def n_best_chunks(entries: Iterator[list[str]], sources: Iterator[list[str]], feature: str | None,
                  escaped: bool = True) -> Iterator[tuple[list[str], list[str], Callable[[list[float]], str]]]:
    """Per chunk of n-best lines: each entry's source line (by its LINE_INDEX, counted from 0, in the order of the
    sources), its hypothesis (its escapes undone where `escaped`, else as it is), and how to write the chunk back with
    the scores appended to the features (`features_field`) as `feature= SCORE` (None: `first_free_feature` of the
    first entry). A line that is not an n-best entry, an index that goes back or past the sources, or a feature the
    list has already is a `_NBestError`."""
    source_lines = (line for chunk in sources for line in chunk)
    source_index, source = -1, ""
    number = 0
    for chunk in entries:
        sources_of_chunk, hypotheses, entry_fields = [], [], []
        for line in chunk:
            number += 1
            fields = line.split(N_BEST_SEPARATOR)
            if len(fields) < 3 or not LINE_INDEX.fullmatch(fields[0].strip()):
                raise _NBestError(number, f"not an n-best entry (LINE_INDEX ||| HYPOTHESIS ||| FEATURES ...): "
                                          f"{line[:80]!r}")
            index = int(fields[0])
            if index < source_index:
                raise _NBestError(number, f"line index {index} after {source_index}: the entries must come in the "
                                          "order of --source's lines")
            while source_index < index:
                source = next(source_lines, None)
                if source is None:
                    raise _NBestError(number, f"line index {index}, but --source has {source_index + 1} lines")
                source_index += 1
            features = features_field(fields)
            if feature is None:
                feature = first_free_feature(fields[features])
            if feature in feature_names(fields[features]):
                raise _NBestError(number, f"the entry has a feature {feature!r} already: name another with "
                                          "--n_best_feature")
            sources_of_chunk.append(source)
            hypotheses.append(html.unescape(fields[1].strip()) if escaped else fields[1].strip())
            entry_fields.append((fields, features))

        def written(scores: list[float], entry_fields: list[tuple[list[str], int]] = entry_fields,
                    name: str | None = feature) -> str:
            return "".join(N_BEST_SEPARATOR.join([*fields[:features], f"{fields[features].rstrip()} {name}= {score!r}",
                                                  *fields[features + 1:]]) + "\n"
                           for (fields, features), score in zip(entry_fields, scores, strict=True))

        yield sources_of_chunk, hypotheses, written


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("max_tokens", "buffer_lines"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if args.n_best_feature is not None and args.n_best is None:
        parser.error("--n_best_feature names the feature --n_best appends: give --n_best")
    for name in ("n_best_raw", "n_best_backward"):
        if getattr(args, name) and args.n_best is None:
            parser.error(f"--{name} says how --n_best's hypotheses are scored: give --n_best")
    if args.n_best_feature is not None and not FEATURE_NAME.fullmatch(args.n_best_feature):
        parser.error(f"--n_best_feature must be a name without spaces, '=' or '|', got {args.n_best_feature!r}")
    given = {"--source": args.source, **({"--target": args.target} if args.n_best is None else
                                         {"--n_best": args.n_best})}
    inputs = {flag: stdio_name(path) for flag, path in given.items()}   # None: stdin
    from_stdin = [flag for flag, path in inputs.items() if path is None]
    if len(from_stdin) > 1:
        parser.error(f"{' and '.join(from_stdin)} are both - (stdin), which is read once: give one of them as a file")
    args.output = stdio_name(args.output)
    check_model_and_files(parser, args, inputs)
    output = checked_output(parser, args.output, inputs, "the scores", args.model)
    tokenizer, model = load_tokenizer_and_model(parser, args)
    files = {}
    with contextlib.ExitStack() as opened:
        for flag, path in inputs.items():
            try:
                files[flag] = sys.stdin.buffer if path is None else opened.enter_context(open(path, "rb"))
            except OSError as error:
                exit_unreadable(parser, flag, path, error)
        totals = score_files(parser, args, files, inputs, output, model, tokenizer)
    if totals.tokens:
        print(f"{PROGRAM}: {totals.summary()}", file=sys.stderr)


def score_files(parser: argparse.ArgumentParser, args: argparse.Namespace, files: dict, inputs: dict[str, str | None],
                output: Path | None, model: PreTrainedModel | CTranslate2Model,
                tokenizer: PreTrainedTokenizerBase) -> ScoreTotals:
    """The opened --source and --target (or --n_best) read, scored and written `--buffer_lines` lines at a time; one
    error (exit 2, --output not written) where they cannot be read or are empty, their line counts differ, an n-best
    line cannot be scored or the model refuses a pair. `inputs` maps each flag to its path, None for stdin ("-"),
    which errors name "stdin"."""
    names = {flag: "stdin" if path is None else path for flag, path in inputs.items()}   # as in "NAME:LINE"
    shown = {flag: "stdin" if path is None else repr(path) for flag, path in inputs.items()}   # as in "--flag NAME"
    chunks = {flag: read_as(flag, text_file_line_chunks(file, names[flag], args.buffer_lines))
              for flag, file in files.items()}
    if args.n_best is None:
        scored = ((sources, targets, lambda scores: "".join(f"{score!r}\n" for score in scores))
                  for sources, targets in paired_chunks(chunks["--source"], chunks["--target"]))
    else:
        scored = n_best_chunks(chunks["--n_best"], chunks["--source"], args.n_best_feature, not args.n_best_raw)
    totals = ScoreTotals(unit="pairs" if args.n_best is None else "hypotheses")
    where = "--source and --target" if args.n_best is None else f"--n_best {shown['--n_best']}"
    first = 1
    try:
        with tqdm(total=0, desc="scoring", unit=f" {totals.unit}", file=sys.stderr, disable=args.no_progress) as bar, \
                contextlib.ExitStack() as outputs:
            compression = None if output is None else compression_of(output)
            sink = sys.stdout if output is None else outputs.enter_context(
                text_output(output, None if compression is None else COMPRESSION_WRITERS[compression]))
            for sources, targets, written in scored:
                bar.total += len(sources)
                bar.refresh()
                if args.n_best_backward:   # the hypotheses are the model's inputs (main: only with --n_best)
                    sources, targets = targets, sources
                overlong = overlong_pairs(sources, targets, first, model, tokenizer)
                if overlong:   # named before the chunk is scored: --output is not written
                    raise ValueError(overlong_lines_message(overlong, model.position_table_rows, where, "score"))
                first += len(sources)
                scores = score_pairs(sources, targets, model, tokenizer, args.max_tokens, args.normalize, totals, bar)
                sink.write(written(scores))
                sink.flush()
            if not totals.pairs:
                empty = "--source and --target have no lines" if args.n_best is None else "--n_best has no entries"
                parser.exit(2, f"{PROGRAM}: error: nothing to score: {empty}\n")
    except BrokenPipeError:   # what reads stdout stopped (`| head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        parser.exit(1)
    except _LineCountError as error:
        parser.exit(2, f"{PROGRAM}: error: {error.sources} source lines (--source {shown['--source']}) but "
                       f"{error.targets} target lines (--target {shown['--target']}): each source line needs its "
                       "target on the same line\n")
    except _NBestError as error:
        parser.exit(2, f"{PROGRAM}: error: --n_best {names['--n_best']}:{error.line_number}: {error.reason}\n")
    except _ReadError as failure:
        exit_unreadable(parser, failure.flag, names[failure.flag], failure.error)
    except ValueError as error:   # a pair the model refuses (e.g. longer than a position table)
        parser.exit(2, f"{PROGRAM}: error: {' '.join(str(error).split())}\n")
    except OSError as error:   # writing --output or stdout (the inputs' errors are _ReadError)
        exit_unwritable(parser, output, error)
    return totals


if __name__ == "__main__":
    main()
