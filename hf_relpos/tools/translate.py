"""Translate a file (or stdin) with a saved model, line by line, optionally scoring against references.

    hf-relpos-translate MODEL_DIR --input SRC.txt --output HYP.txt [--reference REF.txt]
    cat SRC.txt | hf-relpos-translate MODEL_DIR --device cuda --dtype bfloat16 > HYP.txt

(`python -m hf_relpos.tools.translate` is the same program.)

An --input or --reference file compressed with gzip, bzip2 or xz (`test.en.gz`, `.bz2`, `.xz`) is decompressed while
read, as the training app reads its data files (hf_relpos.translation.data); stdin (no --input, or `--input -`; and
`--output -` is stdout, as Unix tools and sacrebleu read "-") is read as it is (`zcat test.en.gz |
hf-relpos-translate MODEL_DIR`), and zstd or zip files are refused with the command that decompresses them.

One output line per input line, in input order; a blank input line gives a blank output line. The input is read,
translated and written `--buffer_lines` lines at a time (as fairseq-interactive's --buffer-size), so memory stays
bounded whatever its length and each chunk's translations appear (stdout is flushed) before the next chunk is read;
`--output` is written beside its destination and renamed there when the job ends, so a failed job leaves no part
of it; a name ending in .gz, .bz2 or .xz is written compressed so (.zst and .zip are refused). A CTranslate2 export's
position table (`absolute`, `alibi`, `none`) bounds the lines it translates: lines beyond it are one error naming
them, their tokens and the table's rows, for an --input file before any line is translated, for stdin before the
chunk that holds them is. A line of several
sentences is translated sentence by sentence and put back together (`--no_split_sentences` translates each line in
one piece; see hf_relpos.tools.sentences). The lines of a chunk are sorted by length and batched by tokens (`--max_tokens`, source tokens per batch, padding included, as fairseq's --max-tokens),
and beam size, length penalty and the length cap (max_len_a x source length + max_len_b, at most max_new_tokens)
default to the model's generation_config.json. A progress bar goes
to stderr. With `--reference` (read whole, as the translations are kept to score them), corpus sacreBLEU and chrF (the sacrebleu library, with signatures) are printed: to
stdout when the translations go to a file, else to stderr; references holding text the tokenizer gives back
otherwise (what its normaliser changes), which no translation can match, are named in a warning before translating.
BLEU is tokenized as `--tokenize` says, by default as
the training run did (the `bleu_tokenize` of the model folder's run record), else as sacreBLEU chooses for the target
language (`--target_lang`, else the run record's): zh, ja-mecab or ko-mecab for zh, ja or ko, else 13a.

`--n_best N` (with `--no_split_sentences`: a line translated sentence by sentence has no n best of its own) writes
each line's N best translations by beam search instead (N <= num_beams), best first, as Moses / Marian n-best lines
`LINE_INDEX ||| HYPOTHESIS ||| F0= SUM_LOGPROB ||| SCORE` (hf_relpos.tools.n_best says what each number is; HYPOTHESIS
has Moses' escapes for "&" and "|", "&amp;" and "&#124;", so a "|||" in a translation cannot read as a separator); a
blank line gives N empty hypotheses scored 0, so every line keeps N entries, and `--reference` scores the best ones.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NoReturn, TextIO

import torch
from tqdm import tqdm
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    BatchEncoding,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

from ..model.attention_functions import check_kernel_device
from ..publish.files import WeightsFileError, expand_home, reading_weights, text_output, writes_in_place
from ..publish.pipeline_relpos import (
    forced_end_limit,
    language_tags,
    reached_length_limit,
    tagged_sentences,
)
from ..publish.records import training_record
from ..translation.arguments import (
    ConfigError,
    add_import_modules_argument,
    attention_implementations,
    check_attn_implementation,
    import_modules_hint,
    import_user_modules,
    short_max_length_error,
)
from ..translation.batching import cut_token_batches
from ..translation.data import (
    COMPRESSION_WRITERS,
    COMPRESSIONS,
    DECOMPRESS_COMMANDS,
    SOURCE_ONLY_FORMATS,
    DatasetSchemaError,
    compression_of,
    data_file_format,
    text_file_line_chunks,
    text_line_chunks,
    uncompressed_name,
    unwritable_references_message,
    unwritable_texts,
)
from ..translation.metrics import BLEU_TOKENIZERS, bleu_metric, decode_translations, score_translations
from ..translation.preflight import check_model_source
from ..translation.safety import OutputDirError, check_output_dir
from .ctranslate2_engine import COMPUTE_TYPES, CTranslate2Model
from .export import MAX_POSITIONS, check_tokenizer_saved, import_ctranslate2, is_ctranslate2_folder
from .n_best import Hypothesis, generate_n_best, n_best_lines
from .sentences import translate_by_sentence

PROGRAM = "hf-relpos-translate"
DTYPES = ("float32", "bfloat16", "float16", "float64")


def token_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices of `lengths` in batches, longest first, whose padded size (count x longest) stays within `max_tokens`;
    a line longer than `max_tokens` forms a batch of its own."""
    order = sorted(range(len(lengths)), key=lambda position: -lengths[position])
    return cut_token_batches(order, [lengths[position] for position in order], max_tokens)


def padded_sources(tokenizer: PreTrainedTokenizerBase, source_ids: list[list[int]]) -> BatchEncoding:
    """input_ids and attention_mask of the encoded sources padded on the right, whatever the tokenizer's side, as
    `pipeline_relpos.right_aligned` re-aligns the batches transformers' pipeline padded: no line depends on the lines
    batched beside it."""
    return tokenizer.pad({"input_ids": source_ids}, padding_side="right", return_tensors="pt")


@dataclass
class LengthCapCount:
    """How many translations reached their length cap, over the `translate_lines` calls that share this count,
    whether the cap was the source-relative one (a model with `new_token_limits`), and whether they are the
    hypotheses of n-best lists (`--n_best`: each line's are counted)."""

    translations: int = 0
    relative: bool = False
    n_best: bool = False

    def warn(self) -> None:
        """One warning on stderr where a translation reached its cap."""
        if not self.translations:
            return
        cap = ("the length cap (max_len_a x source tokens + max_len_b, at most max_new_tokens) and may be cut; raise "
               "--max_len_b or --max_length (an output that repeats itself up to the cap is the model's loop, not a "
               "short cap: --no_repeat_ngram_size N ends such loops)" if self.relative else
               "the maximum length (max_new_tokens, else max_length) and may be cut; raise --max_length, or give "
               "--max_len_a and --max_len_b for a cap relative to each source")
        counted = "n-best hypothesis(es)" if self.n_best else "translation(s)"
        print(f"{PROGRAM}: warning: {self.translations} {counted} reached {cap}", file=sys.stderr)


def translate_lines(
    lines: Sequence[str], model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, max_tokens: int = 4096,
    progress: bool | tqdm = True, unit: str = " lines", capped: LengthCapCount | None = None,
    n_best: int | None = None, **generate_kwargs,
) -> list[str] | list[list[Hypothesis]]:
    """One translation per line, in order; blank lines give "" (nothing is generated for them). With `n_best`, each
    line's `n_best` best hypotheses instead, with their scores (hf_relpos.tools.n_best), best first; a blank line's
    are `n_best` empty ones scored 0. The progress bar counts `unit`s: the lines given (sentences, when they are the
    sentences of the input's lines); given a bar (`progress`), its total grows by them and it counts on. Translations
    that reach their length cap are counted in `capped`, else in a warning when this call ends."""
    wanted = [index for index, line in enumerate(lines) if line.strip()]
    translations = [""] * len(lines) if n_best is None else [[Hypothesis("", 0.0, 0.0)] * n_best for _ in lines]
    if not wanted:
        return translations
    warn_here = capped is None
    capped = LengthCapCount() if capped is None else capped
    encoded = tokenizer([lines[index] for index in wanted])["input_ids"]
    eos_token_id = model.generation_config.eos_token_id
    fixed_limit = forced_end_limit(model.generation_config, **generate_kwargs)   # None unless an end token is forced
    if isinstance(progress, tqdm):
        progress.total += len(wanted)
        progress.refresh()
    shown = (contextlib.nullcontext(progress) if isinstance(progress, tqdm) else
             tqdm(total=len(wanted), desc="translating", unit=unit, file=sys.stderr, disable=not progress))
    with shown as bar:
        for batch in token_batches([len(ids) for ids in encoded], max_tokens):
            inputs = padded_sources(tokenizer, [encoded[position] for position in batch]).to(model.device)
            with torch.inference_mode():
                if n_best is None:   # one row per line, whatever the saved generation config returns
                    output_ids = model.generate(**inputs, **generate_kwargs, num_return_sequences=1)
                else:
                    scored = generate_n_best(model, inputs, n_best, **generate_kwargs)
                    output_ids = scored.sequences
            limits = (model.new_token_limits(**inputs, **generate_kwargs) if hasattr(model, "new_token_limits")
                      else None)
            capped.relative, capped.n_best = limits is not None, n_best is not None
            per_line = n_best or 1   # generate's rows: each source's hypotheses in a row
            texts = []
            for row, ids in enumerate(output_ids):
                capped.translations += reached_length_limit(
                    ids, eos_token_id, fixed_limit if limits is None else int(limits[row // per_line]))
                texts.append(" ".join(decode_translations([ids.tolist()], tokenizer)[0].splitlines()))
            for row, position in enumerate(batch):
                translations[wanted[position]] = texts[row] if n_best is None else sorted(
                    (Hypothesis(texts[index], float(scored.log_probabilities[index]), float(scored.scores[index]))
                     for index in range(row * n_best, (row + 1) * n_best)), key=lambda hypothesis: -hypothesis.score)
            bar.update(len(batch))
    if warn_here:
        capped.warn()
    return translations


def translate_stream(chunks: Iterable[list[str]],
                     translate: Callable[[list[str]], list[str]] | Callable[[list[str]], list[list[Hypothesis]]],
                     sink: TextIO, keep: bool) -> tuple[int, list[str]]:
    """Each chunk of lines translated and its translations written to `sink` (in order, flushed) before the next
    chunk is read: one a line, or a line's hypotheses in the n-best format, indexed over the whole input. Returns the
    number of lines, and their (best) translations where `keep` (else [])."""
    count, kept = 0, []
    for chunk in chunks:
        translations = translate(chunk)
        sink.write("".join(line + "\n" if isinstance(line, str) else n_best_lines(count + index, line)
                           for index, line in enumerate(translations)))
        sink.flush()
        count += len(chunk)
        if keep:
            kept.extend(line if isinstance(line, str) else line[0].text for line in translations)
    return count, kept


# The files a saved model folder is made of (weights, config, tokenizer, remote code, records; a CTranslate2 export's
# model.bin): --output never replaces one of those in the folder of the model it runs.
MODEL_FOLDER_FILES = ("*.json", "*.safetensors", "*.bin", "*.py", "*.spm", "*.model", "*.pt", "*.pth")
SHOWN_LINES = 5   # the overlong lines an error names; the rest are counted


def overlong_lines(lines: Sequence[str], first_number: int, tokenizer: PreTrainedTokenizerBase,
                   model: PreTrainedModel | CTranslate2Model, split_sentences: bool,
                   **generate_kwargs) -> list[tuple[int, int, str]]:
    """(line number, positions needed, how the error names it) of each of `lines` (numbered from `first_number`)
    that a CTranslate2 export's position table (`position_table_rows`) cannot serve: its tokens as `translate_lines`
    encodes them (its longest sentence's where translated `split_sentences`), or its source-relative cap
    (`CTranslate2Model.positions_needed`); [] for a model without such a table."""
    rows = getattr(model, "position_table_rows", None)
    if rows is None:
        return []
    tags = language_tags(tokenizer)
    pieces = [[sentence for sentence, _ in tagged_sentences(line, tags)] if split_sentences
              else [line] for line in lines]
    units = [(number, piece) for number, line_pieces in enumerate(pieces, first_number) for piece in line_pieces
             if piece.strip()]   # blank ones are not translated
    if not units:
        return []
    lengths = [len(ids) for ids in tokenizer([piece for _, piece in units])["input_ids"]]
    worst: dict[int, tuple[int, int]] = {}
    for (number, _), length, needed in zip(units, lengths, model.positions_needed(lengths, **generate_kwargs),
                                           strict=True):
        if needed > rows and needed > worst.get(number, (0, 0))[0]:
            worst[number] = (needed, length)
    return [(number, needed, f"{number} ({'a sentence of ' if split_sentences else ''}{length} tokens"
                             f"{'' if needed == length else f', a length cap of {needed}'})")
            for number, (needed, length) in sorted(worst.items())]


def overlong_lines_message(overlong: Sequence[tuple[int, int, str]], rows: int, where: str,
                           work: str = "translate") -> str:
    """One error naming the first SHOWN_LINES `overlong` lines of `where` (as `overlong_lines` gives them), the
    position table's rows and what to do (a table of more than MAX_POSITIONS rows is not exported)."""
    more = f" and {len(overlong) - SHOWN_LINES} more" if len(overlong) > SHOWN_LINES else ""
    needed = max(needed for _, needed, _ in overlong)
    export = (f"export again with hf-relpos-export ctranslate2 --max_positions {needed} or more, or "
              if needed <= MAX_POSITIONS else "")
    return (f"{where} line{'s' if len(overlong) > 1 else ''} "
            f"{', '.join(named for _, _, named in overlong[:SHOWN_LINES])}{more}: longer than the {rows} positions "
            f"this export's position table covers (its hf-relpos-export --max_positions); {export}{work} with the "
            "PyTorch folder")


def line_count_error(source_lines: int, references: Sequence[str], source_name: str, reference_name: str) -> str | None:
    """Why a source of `source_lines` lines cannot be scored against `references` (each named as the user gave it);
    None where it can."""
    if source_lines != len(references):
        return (f"{source_lines} source lines ({source_name}) but {len(references)} reference lines "
                f"(--reference {reference_name!r}): each source line needs its reference on the same line")
    if not source_lines:
        return "nothing to score: the source and --reference have no lines"
    return None


class DefaultsWhereSetFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" only to options that take a value and have a default; the others (and on/off flags)
    say in their help what happens instead."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.nargs == 0:
            return action.help or ""
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.split("\n\n")[0],
                                     formatter_class=DefaultsWhereSetFormatter)
    parser.add_argument("model", type=expand_home,
                        help="saved model folder (model and tokenizer, e.g. a train_translation.py output_dir), or a "
                             "CTranslate2 folder written by hf-relpos-export ctranslate2")
    parser.add_argument("input_file", nargs="?", type=expand_home, metavar="INPUT",
                        help="source text file (the same as --input; -: stdin)")
    parser.add_argument("--input", type=expand_home,
                        help="source text, one sentence per line; a .gz, .bz2 or .xz file is decompressed while read; "
                             "- is stdin (default: stdin)")
    parser.add_argument("--output", type=expand_home,
                        help="where the translations go, one per line; a name ending in .gz, .bz2 or .xz is written "
                             "compressed so; - is stdout (default: stdout)")
    parser.add_argument("--reference", type=expand_home,
                        help="reference translations, one per line (a .gz, .bz2 or .xz file decompressed while "
                             "read): print sacreBLEU and chrF")
    parser.add_argument("--tokenize", choices=BLEU_TOKENIZERS,
                        help="sacreBLEU's tokenization of BLEU for --reference (its --tokenize; ja-mecab needs pip "
                             "install 'sacrebleu[ja]', ko-mecab 'sacrebleu[ko]'; default: the bleu_tokenize of the "
                             "run_record.json train_translation.py saved in the model folder, else sacreBLEU's choice "
                             "for the target language: zh, ja-mecab, ko-mecab for zh, ja, ko, else 13a)")
    parser.add_argument("--target_lang", metavar="LANG",
                        help="language of the translations (e.g. zh), which picks --tokenize's default where the run "
                             "record names no bleu_tokenize (default: the "
                             "target_lang of the run_record.json train_translation.py saved in the model folder; none "
                             "in a converted, exported or Hub model: 13a)")
    parser.add_argument("--num_beams", type=int, help="beam size (default: the model's generation config)")
    parser.add_argument("--length_penalty", type=float,
                        help="beam-search length penalty (default: the model's generation config)")
    parser.add_argument("--max_length", type=int,
                        help="longest translation in tokens, decoder start included (default: the model's generation "
                             "config)")
    parser.add_argument("--max_len_a", type=float,
                        help="length cap per source token: a translation has at most max_len_a x its source's tokens "
                             "+ max_len_b new tokens (fairseq's; default: the model's generation config)")
    parser.add_argument("--max_len_b", type=int,
                        help="length cap beyond max_len_a x source tokens; setting it gives a folder saved without "
                             "the relative cap one (default: the model's generation config)")
    parser.add_argument("--no_repeat_ngram_size", type=int, metavar="N",
                        help="no translation repeats an N-gram of tokens, which stops a translation that loops on a "
                             "word or phrase (transformers' and CTranslate2's option; default: the model's generation "
                             "config, which sets none)")
    parser.add_argument("--n_best", type=int, metavar="N",
                        help="write each line's N best translations by beam search (N <= --num_beams; needs "
                             "--no_split_sentences), best first, as n-best lists: LINE_INDEX ||| HYPOTHESIS ||| F0= "
                             "SUM_LOGPROB ||| SCORE, the line index counted from 0, HYPOTHESIS with Moses' escapes "
                             "for & and | (&amp; and &#124;), F0 the summed token "
                             "log-probability and SCORE = F0 / length ** length_penalty (beam search's score); a blank "
                             "line gives N empty hypotheses scored 0, and --reference scores the best (default: one "
                             "translation per line, no scores)")
    parser.add_argument("--no_split_sentences", dest="split_sentences", action="store_false",
                        help="translate each line in one piece (default: sentence by sentence, joined back)")
    parser.add_argument("--max_tokens", type=int, default=4096, help="source tokens per batch, padding included")
    parser.add_argument("--buffer_lines", type=int, default=10000, metavar="N",
                        help="input lines read, translated and written at a time (fairseq-interactive's "
                             "--buffer-size): memory holds one such chunk, and its translations are written before "
                             "the next is read. A chunk is sorted by length and cut into --max_tokens batches: the "
                             "default makes many batches of like-length lines at the default --max_tokens, so little "
                             "padding; a smaller chunk shows output sooner and holds less (1: each line as it "
                             "comes)")
    add_loading_arguments(parser)
    parser.add_argument("--no_progress", action="store_true",
                        help="no progress bars on stderr (translation, and transformers' while loading)")
    return parser


def add_loading_arguments(parser: argparse.ArgumentParser) -> None:
    """--device, --import_modules, --dtype, --attn_implementation and --compute_type: how `load_model` loads a
    PyTorch or CTranslate2 folder."""
    parser.add_argument("--device", default="auto", type=device_name, metavar="{auto,cpu,cuda,cuda:N}",
                        help="where the model runs; auto: the first CUDA GPU when there is one, else the CPU")
    add_import_modules_argument(parser)
    parser.add_argument("--dtype", choices=DTYPES,
                        help="dtype of the weights and computation (default: the dtype the weights were saved in, "
                             "float32 for a trained folder)")
    parser.add_argument("--attn_implementation", type=attn_implementation, metavar="KERNEL",
                        help=f"attention kernel, one of {attention_implementations()} (default: the model's, sdpa); "
                             "flash kernels only run schemes that add nothing to attention (e.g. absolute, rope)")
    parser.add_argument("--compute_type", choices=COMPUTE_TYPES,
                        help="for a CTranslate2 folder (hf-relpos-export ctranslate2): the engine's computation type "
                             "(default: the type the weights were exported in)")


def device_name(text: str) -> str:
    """cpu, cuda, cuda:N, or auto (the first CUDA GPU when there is one, else the CPU); a GPU that is not there is
    one error."""
    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    match = re.fullmatch(r"cuda(?::(\d+))?", text)
    if text != "cpu" and match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of auto, cpu, cuda, cuda:N")
    if match is not None:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(match.group(1) or 0)
        if index >= count:
            raise argparse.ArgumentTypeError(f"{text!r}: this machine has {count} CUDA GPU(s)"
                                             + (f" (cuda:0 to cuda:{count - 1})" if count else "; use cpu or auto"))
    return text


def attn_implementation(text: str) -> str:
    try:
        return check_attn_implementation(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


@contextlib.contextmanager
def hidden_progress_bars() -> Iterator[None]:
    """transformers' progress bars (loading weights) hidden while inside, as they were after."""
    was_shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_shown:
            hf_logging.enable_progress_bar()


# The options a CTranslate2 folder refuses, each with what to do instead.
PYTORCH_ONLY_OPTIONS = {"dtype": "use --compute_type",
                        "attn_implementation": "the engine picks its own attention kernels: leave the option out"}


def load_model(parser: argparse.ArgumentParser, args: argparse.Namespace) -> PreTrainedModel | CTranslate2Model:
    """The PyTorch model of a saved folder, or CTranslate2 over an exported one (each refuses the other's options)."""
    if is_ctranslate2_folder(args.model):
        for name, advice in PYTORCH_ONLY_OPTIONS.items():
            if getattr(args, name) is not None:
                parser.exit(2, f"{parser.prog}: error: --{name} is for PyTorch model folders; {args.model!r} is a "
                               f"CTranslate2 export ({advice})\n")
        check_compute_type(parser, args.compute_type, args.device)
        return CTranslate2Model(args.model, device=args.device, compute_type=args.compute_type or "default")
    if args.compute_type is not None:
        parser.exit(2, f"{parser.prog}: error: --compute_type is for CTranslate2 folders (hf-relpos-export "
                       f"ctranslate2); {args.model!r} is a PyTorch model folder (use --dtype)\n")
    try:
        check_kernel_device(args.attn_implementation, torch.device(args.device))
    except (RuntimeError, ImportError) as error:
        parser.exit(2, f"{parser.prog}: error: --attn_implementation: {error}\n")
    loading = {name: value for name in ("dtype", "attn_implementation") if (value := getattr(args, name)) is not None}
    return AutoModelForSeq2SeqLM.from_pretrained(args.model, **loading).to(args.device).eval()


def check_compute_type(parser: argparse.ArgumentParser, compute_type: str | None, device: str) -> None:
    """One error (exit 2) naming --compute_type and --device where CTranslate2 does not run `compute_type` on `device`
    (`ctranslate2.get_supported_compute_types`: e.g. no float16 on a CPU), with the types it runs there; "default" and
    "auto" (the engine's own choice) always pass."""
    if compute_type in (None, "default", "auto"):
        return
    kind, _, index = device.partition(":")
    supported = import_ctranslate2().get_supported_compute_types(kind, int(index or 0))
    if compute_type not in supported:
        parser.exit(2, f"{parser.prog}: error: --compute_type {compute_type}: CTranslate2 does not run it on --device "
                       f"{device}, which runs {', '.join(sorted(supported))}; give one of them, or leave "
                       "--compute_type out (the type the weights were exported in)\n")


def check_model_and_files(parser: argparse.ArgumentParser, args: argparse.Namespace,
                          text_files: dict[str, str | None]) -> None:
    """Before anything loads: --import_modules imported, the model a local folder or a Hub model in the local cache or
    on the Hub (`check_model_source`: one request, no retries), `text_files` (flag -> path) text files
    (`check_text_files`) and --output's name one that is written
    (`check_output_name`); else one error (exit 2)."""
    try:
        import_user_modules(args.import_modules)
    except ConfigError as error:
        parser.error(str(error))
    try:
        check_model_source(args.model, "model")
    except ValueError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    check_text_files(parser, text_files)
    check_output_name(parser, args.output)


def check_text_files(parser: argparse.ArgumentParser, paths: dict[str, str | None]) -> None:
    """One error (exit 2) naming the flag where a file of `paths` (flag -> path, None: not given) is compressed in a
    kind that is not read (.zst, .zip) or is a file of records (.jsonl, .tsv, .parquet), not text of one sentence a
    line."""
    for flag, path in paths.items():
        if path is not None and (command := DECOMPRESS_COMMANDS.get(Path(path).suffix.lower())) is not None:
            parser.exit(2, f"{parser.prog}: error: {flag} {path!r} is compressed in a kind that is not read "
                           f"({', '.join(DECOMPRESS_COMMANDS)}): decompress first ({command} {path}) and give the text "
                           f"file, uncompressed or compressed with gzip, bzip2 or xz ({', '.join(COMPRESSIONS)})\n")
        if path is not None and data_file_format(path) not in (None, *SOURCE_ONLY_FORMATS):
            parser.exit(2, f"{parser.prog}: error: {flag} {path!r} is a {uncompressed_name(Path(path)).suffix} file "
                           f"of records, not plain text: {parser.prog} reads one sentence per line; write each "
                           "language's side to a text file (docs/training.md#data shows how), or give the file to "
                           "train_translation.py as --test_file with --do_predict true\n")


def check_output_name(parser: argparse.ArgumentParser, output: str | None) -> None:
    """One error (exit 2) where --output names a compression that is not written (.zst, .zip)."""
    if output is not None and Path(output).suffix.lower() in DECOMPRESS_COMMANDS:
        parser.exit(2, f"{parser.prog}: error: --output {output!r} names a compression that is not written "
                       f"({', '.join(DECOMPRESS_COMMANDS)}): give a name ending in {', '.join(COMPRESSIONS)} (written "
                       "compressed with gzip, bzip2 or xz) or a plain-text name, and compress it after\n")


def checked_output(parser: argparse.ArgumentParser, output_name: str | None, inputs: dict[str, str | None],
                   what: str, model: str) -> Path | None:
    """--output as a Path (None: stdout) once it can be written: not a folder, in a folder that exists and is
    writable (a link's file is replaced in its own folder), not one of the `inputs` files (flag -> path) nor a file
    of the folder of `model` that the saved model is made of (`MODEL_FOLDER_FILES`), which `what` it receives would
    replace; else one error (exit 2)."""
    if output_name is None:
        return None
    output = Path(output_name)
    folder = (output.resolve() if output.is_symlink() else output).parent   # a link: its file's
    reasons = {"is a folder": output.is_dir(), f"no folder '{folder}' to write it in": not folder.is_dir(),
               "ends in '/', which names a folder; give a file name": output_name.endswith(("/", os.sep))}
    reason = next((reason for reason, applies in reasons.items() if applies), None)
    if reason is not None:
        parser.exit(2, f"{parser.prog}: error: --output {output_name!r}: {reason}\n")
    if output.is_file():   # a plain file, through a link or not (a terminal may be both)
        for flag, path in inputs.items():
            if path is not None and output.samefile(path):
                parser.exit(2, f"{parser.prog}: error: --output {output_name!r} is the {flag} file: {what} "
                               f"would replace it; write them to another file\n")
        replaced = output.resolve()
        if replaced.parent == Path(model).resolve() and any(fnmatch.fnmatchcase(replaced.name, pattern)
                                                            for pattern in MODEL_FOLDER_FILES):
            parser.exit(2, f"{parser.prog}: error: --output {output_name!r} is {replaced.name} of the model folder "
                           f"{model!r}: {what} would replace a file of the saved model (weights, config, tokenizer, "
                           "code or record); write them to another file\n")
    if not writes_in_place(output):   # a pipe, a device or /dev/stdout is written through
        try:
            check_output_dir(folder, setting="--output's folder")
        except OutputDirError as error:
            parser.exit(2, f"{parser.prog}: error: {error}\n")
    return output


def load_tokenizer_and_model(parser: argparse.ArgumentParser, args: argparse.Namespace,
                             ) -> tuple[PreTrainedTokenizerBase, PreTrainedModel | CTranslate2Model]:
    """The saved folder's tokenizer and model (`load_model`); a folder that cannot be loaded is one error (exit 2)."""
    try:
        with hidden_progress_bars() if args.no_progress else contextlib.nullcontext():
            if Path(args.model).is_dir():
                check_tokenizer_saved(args.model)
            tokenizer = AutoTokenizer.from_pretrained(args.model)
            with reading_weights():
                model = load_model(parser, args)
    except WeightsFileError as error:
        parser.exit(2, f"{parser.prog}: error: the model folder {args.model!r}: {error}\n")
    except (OSError, ValueError, ImportError, RuntimeError) as error:
        parser.exit(2, f"{parser.prog}: error: {' '.join(str(error).split())}{import_modules_hint(error)}\n")
    return tokenizer, model


def recorded_scoring(model: str) -> tuple[str | None, str]:
    """(bleu_tokenize, target_lang) of the run record train_translation.py saved in the model folder (or an export
    of it); (None, "") where it has none, and None for a record written before it held bleu_tokenize."""
    record = training_record(model) if Path(model).is_dir() else None
    return (record.bleu_tokenize, record.target_lang) if record is not None else (None, "")


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_intermixed_args(argv)   # the input file may come after options
    if args.input_file is not None:
        if args.input is not None and args.input != args.input_file:
            parser.error(f"two source files: INPUT {args.input_file!r} and --input {args.input!r}; give one")
        args.input = args.input_file
    args.input, args.output = stdio_name(args.input), stdio_name(args.output)
    for name in ("num_beams", "max_length", "max_tokens", "no_repeat_ngram_size", "buffer_lines", "n_best"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be a positive integer, got {value}")
    error = short_max_length_error("--max_length", args.max_length)
    if error is not None:
        parser.error(error)
    for name in ("max_len_a", "max_len_b"):
        value = getattr(args, name)
        if value is not None and not 0 <= value < float("inf"):
            parser.error(f"--{name} must be a number >= 0, got {value}")
    if args.length_penalty is not None and not math.isfinite(args.length_penalty):   # NaN scores rank beams at random
        parser.error(f"--length_penalty must be a finite number, got {args.length_penalty}")
    if args.n_best is not None and args.split_sentences:
        parser.error("--n_best lists a line's best translations by beam search, which a line translated sentence by "
                     "sentence does not have: give --no_split_sentences with --n_best")
    for name in ("tokenize", "target_lang"):
        if getattr(args, name) is not None and args.reference is None:
            parser.error(f"--{name} sets how --reference is scored: give --reference")
    check_model_and_files(parser, args, {"--input": args.input, "--reference": args.reference})
    try:
        source = sys.stdin.buffer if args.input is None else open(args.input, "rb")  # noqa: SIM115 (closed below)
    except OSError as error:
        exit_unreadable(parser, "--input", args.input, error)
    with contextlib.nullcontext(source) if args.input is None else source:
        translate_source(parser, args, source)


def stdio_name(path: str | None) -> str | None:
    """None (stdin or stdout) for "-", as Unix tools and sacrebleu read it; else `path`."""
    return None if path == "-" else path


def exit_unreadable(parser: argparse.ArgumentParser, flag: str, path: str,
                    error: OSError | DatasetSchemaError) -> NoReturn:
    """One error naming `flag`: the file `path` cannot be read, does not decompress, or a line of it is not UTF-8 text
    (the error names the file and line)."""
    reason = (error if isinstance(error, DatasetSchemaError) else
              f"{path!r}: {' '.join(str(error.strerror or error).split())}")
    parser.exit(2, f"{parser.prog}: error: {flag} {reason}\n")


def exit_unwritable(parser: argparse.ArgumentParser, output: Path | None, error: OSError) -> NoReturn:
    """One error (exit 2) naming --output (or stdout) where writing it failed (a full disk, a lost mount): a regular
    --output file is not written (its temporary is removed; the file there before stays), a device or pipe kept what
    reached it."""
    reason = " ".join(str(error.strerror or error).split())
    if output is None:
        parser.exit(2, f"{parser.prog}: error: writing stdout: {reason}\n")
    kept = "what reached it before the error stays" if writes_in_place(output) else "it is not written"
    parser.exit(2, f"{parser.prog}: error: writing --output '{output}': {reason}; {kept}\n")


class _SourceReadError(Exception):
    """An OSError of reading the source (--input or stdin) while it is translated, told apart from the errors of
    writing --output or stdout (a BrokenPipeError is an OSError too)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error

    @classmethod
    def raised_by(cls, chunks: Iterator[list[str]]) -> Iterator[list[str]]:
        """`chunks`, an OSError while reading them raised as this error."""
        try:
            yield from chunks
        except OSError as error:
            raise cls(error) from error


def translate_source(parser: argparse.ArgumentParser, args: argparse.Namespace, source: BinaryIO) -> None:
    """`main` once its flags are checked: `source` (the opened --input, or stdin) read, translated and written
    `--buffer_lines` lines at a time, then scored against --reference."""
    references = None
    if args.reference is not None:
        try:
            with open(args.reference, "rb") as file:
                references = [line for chunk in text_file_line_chunks(file, args.reference, args.buffer_lines)
                              for line in chunk]
        except (OSError, DatasetSchemaError) as error:
            exit_unreadable(parser, "--reference", args.reference, error)
        if args.input is not None and source.seekable():  # counted now: a mismatch stops the job before it starts
            try:
                mismatch = line_count_error(sum(map(len, text_file_line_chunks(source, args.input, args.buffer_lines))),
                                            references, f"--input {args.input!r}", args.reference)
                source.seek(0)
            except (OSError, DatasetSchemaError) as error:
                exit_unreadable(parser, "--input", args.input, error)
            if mismatch is not None:
                parser.exit(2, f"{PROGRAM}: error: {mismatch}\n")
    recorded_tokenize, recorded_target = recorded_scoring(args.model)
    target_lang = args.target_lang if args.target_lang is not None else recorded_target
    tokenize = args.tokenize if args.tokenize is not None else recorded_tokenize
    if references is not None:   # set up before translating: a missing sacrebleu extra is an error now, not after it
        try:
            bleu_metric(tokenize, target_lang)
        except ValueError as error:
            parser.exit(2, f"{PROGRAM}: error: --tokenize: {error}; or name another tokenization with --tokenize "
                           "(e.g. char)\n")
    output = checked_output(parser, args.output, {"--input": args.input, "--reference": args.reference},
                            "the translations", args.model)
    tokenizer, model = load_tokenizer_and_model(parser, args)
    if references is not None:   # said before translating: text in them that no translation can hold
        decoded = decode_translations(tokenizer(text_target=references)["input_ids"], tokenizer)
        message = unwritable_references_message("--reference", *unwritable_texts(references, decoded),
                                                len(references), tokenizer)
        if message is not None:
            print(f"{PROGRAM}: warning: {message}", file=sys.stderr)
    generate_kwargs = {name: value for name in ("num_beams", "length_penalty", "max_length", "max_len_a", "max_len_b",
                                                "no_repeat_ngram_size") if (value := getattr(args, name)) is not None}
    if args.max_length is not None:
        generate_kwargs["max_new_tokens"] = None  # the saved cap is max_new_tokens, which would win over max_length
    if args.max_len_a is not None and args.max_len_b is None and getattr(model.generation_config, "max_len_b",
                                                                          None) is None:
        parser.exit(2, f"{PROGRAM}: error: --max_len_a needs --max_len_b: {args.model}'s generation config has no "
                       "source-relative cap\n")

    num_beams = args.num_beams or model.generation_config.num_beams or 1
    if args.n_best is not None and args.n_best > num_beams:
        whose = "" if args.num_beams else " (the model's generation config)"
        parser.exit(2, f"{PROGRAM}: error: --n_best {args.n_best} is more than --num_beams {num_beams}{whose}: beam "
                       "search keeps --num_beams hypotheses; give --n_best at most --num_beams, or raise --num_beams\n")
    rows = getattr(model, "position_table_rows", None)   # a CTranslate2 export's position table
    where = "stdin" if args.input is None else f"--input {args.input!r}"

    def overlong_chunks(chunks: Iterable[list[str]]) -> Iterator[tuple[list[str], list[tuple[int, int, str]]]]:
        """Each chunk with its lines the position table cannot serve (`overlong_lines`)."""
        first = 1
        for chunk in chunks:
            yield chunk, overlong_lines(chunk, first, tokenizer, model, args.split_sentences, **generate_kwargs)
            first += len(chunk)

    def checked_chunks(chunks: Iterable[list[str]]) -> Iterator[list[str]]:
        """`chunks`, a ValueError naming the lines of a chunk the position table cannot serve before it is
        translated (stdin: --output is not written)."""
        for chunk, overlong in overlong_chunks(chunks):
            if overlong:
                raise ValueError(overlong_lines_message(overlong, rows, where))
            yield chunk

    checked_ahead = rows is not None and args.input is not None and source.seekable()
    if checked_ahead:   # a file: every line checked before any is translated or written
        try:
            overlong = [line for _, lines in overlong_chunks(text_file_line_chunks(source, args.input,
                                                                                   args.buffer_lines))
                        for line in lines]
            source.seek(0)
        except (OSError, DatasetSchemaError) as error:
            exit_unreadable(parser, "--input", args.input, error)
        if overlong:
            parser.exit(2, f"{PROGRAM}: error: {overlong_lines_message(overlong, rows, where)}\n")
    unit = " sentences" if args.split_sentences else " lines"   # tqdm writes "12 sentences [..., 3.4 sentences/s]"
    capped = LengthCapCount()
    bar = tqdm(total=0, desc="translating", unit=unit, file=sys.stderr, disable=args.no_progress)

    def translate(lines: list[str]) -> list[str] | list[list[Hypothesis]]:
        return translate_lines(lines, model, tokenizer, args.max_tokens, bar, unit, capped, args.n_best,
                               **generate_kwargs)

    tags = language_tags(tokenizer)

    def translate_chunk(lines: list[str]) -> list[str] | list[list[Hypothesis]]:
        return translate_by_sentence(lines, translate, tags) if args.split_sentences else translate(lines)

    chunks = _SourceReadError.raised_by(text_line_chunks(source, "stdin", args.buffer_lines) if args.input is None
                                        else text_file_line_chunks(source, args.input, args.buffer_lines))
    if rows is not None and not checked_ahead:
        chunks = checked_chunks(chunks)
    try:
        with bar, contextlib.ExitStack() as outputs:
            compression = None if output is None else compression_of(output)
            sink = sys.stdout if output is None else outputs.enter_context(
                text_output(output, None if compression is None else COMPRESSION_WRITERS[compression]))
            source_lines, translations = translate_stream(chunks, translate_chunk, sink, keep=references is not None)
            mismatch = None if references is None else line_count_error(
                source_lines, references, "stdin" if args.input is None else f"--input {args.input!r}", args.reference)
            if mismatch is not None:   # stdin, counted as it ends: --output is not written
                parser.exit(2, f"{PROGRAM}: error: {mismatch}\n")
    except BrokenPipeError:   # what reads stdout stopped (`| head`): stop translating, without a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # nor one from the exit's flush
        parser.exit(1)
    except _SourceReadError as failure:   # the source's own read (EIO): --output is not written
        if args.input is None:
            reason = " ".join(str(failure.error.strerror or failure.error).split())
            parser.exit(2, f"{PROGRAM}: error: stdin: {reason}\n")
        exit_unreadable(parser, "--input", args.input, failure.error)
    except DatasetSchemaError as error:   # a line that is not UTF-8: --output is not written
        parser.exit(2, f"{PROGRAM}: error: {'' if args.input is None else '--input '}{error}\n")
    except ValueError as error:   # settings the model refuses for this input: --output is not written
        parser.exit(2, f"{PROGRAM}: error: {' '.join(str(error).split())}\n")
    except OSError as error:   # writing --output or stdout (the source's errors are _SourceReadError)
        exit_unwritable(parser, output, error)
    capped.warn()
    if references is not None:
        scores = score_translations(translations, references, tokenize, target_lang)
        report = sys.stderr if output is None else sys.stdout
        print(f"sacreBLEU {scores['bleu']:.2f}  ({scores['bleu_signature']})\n"
              f"chrF {scores['chrf']:.2f}  ({scores['chrf_signature']})", file=report, flush=True)


if __name__ == "__main__":
    main()
