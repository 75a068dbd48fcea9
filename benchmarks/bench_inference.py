"""Serving cost: sentences/s and BLEU of PyTorch `generate` against CTranslate2 float32 and int8.

One trained model, exported to CTranslate2 (`hf_relpos.tools.export`) as float32 and int8, translates the same test
set in the same run: beam 4 and the model's length penalty and length cap, fixed batches of 32 sentences in
length-sorted order (the same batches for every engine), on the CPU at each --threads count (torch and CTranslate2
both limited to it), or on the GPU (--device cuda: PyTorch bfloat16 autocast against CTranslate2 float16 and
int8_float16). Batches run round-robin: every batch is translated by each engine in turn, the first engine rotating
from batch to batch, so load drift on a shared machine hits all engines alike.

PyTorch runs with early_stopping=True, the beam search CTranslate2 implements (it stops once num_beams hypotheses
have finished), so float32 can give the same lines; `pytorch (early_stopping=False)` is transformers' default search,
as the model's generation config has it, for its BLEU and speed. Goals: on the CPU, int8 >= 4x PyTorch's
sentences/s at <= 0.3 BLEU loss, float32 >= 2x with identical lines; on a GPU, float16 >= 3x PyTorch bf16.

    python -m benchmarks.bench_inference MODEL_DIR --test_file multi30k/test.jsonl --threads 1 2 \
        --out docs/results/inference
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from benchmarks import command_line
from benchmarks.common import environment, markdown_table, positive_int, synchronize, write_report
from hf_relpos.tools.ctranslate2_engine import CTranslate2Model
from hf_relpos.tools.export import export_ctranslate2
from hf_relpos.translation.metrics import decode_translations, score_translations
from hf_relpos.translation.safety import output_folder

BASELINE = "pytorch"
GOALS = {"cpu": {"ct2_int8": 4.0, "ct2_float32": 2.0}, "cuda": {"ct2_float16": 3.0}}
MAX_BLEU_LOSS_INT8 = 0.3


def read_pairs(path: Path, source_lang: str, target_lang: str, limit: int | None) -> tuple[list[str], list[str]]:
    """Sources and references of a WMT-schema JSON-lines file ({"translation": {lang: text}})."""
    pairs = [json.loads(line)["translation"] for line in path.read_text(encoding="utf-8").splitlines() if line]
    pairs = pairs[:limit] if limit else pairs
    return [pair[source_lang] for pair in pairs], [pair[target_lang] for pair in pairs]


def fixed_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices in length-sorted order (longest first), cut into batches of `batch_size` sentences."""
    order = sorted(range(len(lengths)), key=lambda index: -lengths[index])
    return [order[start:start + batch_size] for start in range(0, len(order), batch_size)]


def translate_batch_fn(model: Any, tokenizer: Any, device: str, dtype: str, **settings: Any) -> Callable:
    """batch of token id lists -> their translations (text), with `model.generate` (PyTorch or CTranslate2)."""
    def run(encoded: list[list[int]]) -> list[str]:
        inputs = tokenizer.pad({"input_ids": encoded}, return_tensors="pt").to(device)
        context = (torch.autocast(device_type=device, dtype=torch.bfloat16) if dtype == "bfloat16"
                   else torch.inference_mode())
        with torch.inference_mode(), context:
            output = model.generate(**inputs, **settings)
        return [" ".join(text.splitlines()) for text in decode_translations(output.tolist(), tokenizer)]
    return run


def run_engines(engines: dict[str, Callable], encoded: list[list[int]], batches: list[list[int]],
                device: str) -> tuple[dict[str, list[str]], dict[str, float]]:
    """Every batch through every engine, round-robin; each engine's translations (in input order) and seconds."""
    names = list(engines)
    translations = {name: [""] * len(encoded) for name in names}
    seconds = dict.fromkeys(names, 0.0)
    for name in names:  # warm-up: first-call allocations and lazy initialisation stay out of the timing
        engines[name]([encoded[index] for index in batches[0]])
    for batch_index, batch in enumerate(batches):
        shift = batch_index % len(names)
        for name in names[shift:] + names[:shift]:
            synchronize(device)
            start = time.perf_counter()
            lines = engines[name]([encoded[index] for index in batch])
            synchronize(device)
            seconds[name] += time.perf_counter() - start
            for index, line in zip(batch, lines, strict=True):
                translations[name][index] = line
    return translations, seconds


def measure(args: argparse.Namespace, threads: int | None, exports: dict[str, Path], sources: list[str],
            references: list[str]) -> dict[str, Any]:
    """One configuration (device, thread count): every engine's sentences/s, BLEU, speed-up and identical lines."""
    if threads is not None:
        torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model, dtype=torch.float32).to(args.device).eval()
    settings = {"num_beams": args.num_beams}
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    engines = {
        BASELINE: translate_batch_fn(model, tokenizer, args.device, dtype, early_stopping=True, **settings),
    }
    if not args.skip_default_search:
        engines["pytorch (early_stopping=False)"] = translate_batch_fn(model, tokenizer, args.device, dtype,
                                                                       early_stopping=False, **settings)
    for name, (folder, compute_type) in exports.items():
        engine = CTranslate2Model(folder, device=args.device, compute_type=compute_type, threads=threads or 0)
        engines[name] = translate_batch_fn(engine, tokenizer, "cpu", "float32", **settings)
    encoded = tokenizer(sources)["input_ids"]
    batches = fixed_batches([len(ids) for ids in encoded], args.batch_size)
    translations, seconds = run_engines(engines, encoded, batches, args.device)
    rows = {}
    for name in engines:
        scores = score_translations(translations[name], references, target_lang=args.target_lang)
        rows[name] = {
            "sentences_per_second": len(sources) / seconds[name],
            "seconds": seconds[name],
            "speedup": seconds[BASELINE] / seconds[name],
            "bleu": scores["bleu"],
            "chrf": scores["chrf"],
            "identical_lines": sum(a == b for a, b in zip(translations[name], translations[BASELINE], strict=True)),
        }
    return {"threads": threads, "device": args.device, "pytorch_dtype": dtype, "engines": rows,
            "bleu_signature": score_translations(translations[BASELINE], references,
                                                 target_lang=args.target_lang)["bleu_signature"]}


def render(record: dict[str, Any]) -> str:
    """The markdown table of a record: one row per configuration and engine."""
    rows = []
    for run in record["runs"]:
        where = f"CPU, {run['threads']} thread(s)" if run["device"] == "cpu" else "GPU"
        for name, row in run["engines"].items():
            rows.append([where, name, f"{row['sentences_per_second']:.1f}", f"{row['speedup']:.2f}x",
                         f"{row['bleu']:.2f}", f"{row['identical_lines']} / {record['sentences']}"])
    return markdown_table(["where", "engine", "sentences/s", "vs PyTorch", "BLEU", "lines identical to PyTorch"],
                          rows)


def render_markdown(record: dict[str, Any]) -> str:
    """The record's report: the table, then the command, code, machine, versions, date, model and notes."""
    run_environment = record["environment"]
    return "\n".join([
        f"# Inference: PyTorch generate vs CTranslate2 ({run_environment['device']})", "", render(record), "",
        f"- command: `{run_environment['command']}`",
        f"- code `{run_environment['code']}`, {run_environment['device_name']}"
        + (f"; {record['hardware_note']}" if record["hardware_note"] else ""),
        f"- torch {run_environment['torch']}, transformers {run_environment['transformers']}, ctranslate2 "
        f"{record['ctranslate2']}, python {run_environment['python']}, {run_environment['date']}",
        f"- model: {record['model']}" + (f" ({record['model_note']})" if record["model_note"] else "")])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="trained model folder (model, tokenizer, generation config)")
    parser.add_argument("--test_file", type=Path, required=True, help="WMT-schema JSON lines (Multi30k test.jsonl)")
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="de")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=positive_int, nargs="+", default=[1, 2],
                        help="CPU thread counts, one run each")
    parser.add_argument("--batch_size", type=positive_int, default=32)
    parser.add_argument("--num_beams", type=positive_int, default=4)
    parser.add_argument("--limit", type=positive_int, help="first N pairs only (smoke runs)")
    parser.add_argument("--skip_default_search", action="store_true",
                        help="leave out PyTorch with early_stopping=False")
    parser.add_argument("--model_note", default="", help="what the record says about the model (e.g. its training)")
    parser.add_argument("--hardware_note", default="", help="what the record says about the machine (e.g. shared)")
    parser.add_argument("--out", type=output_folder, default=Path("benchmarks/results"))
    parser.add_argument("--stem", default="inference")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.model.is_dir():
        parser.error(f"model: no model folder at {args.model}")
    if not args.test_file.is_file():
        parser.error(f"--test_file: no file at {args.test_file}")
    sources, references = read_pairs(args.test_file, args.source_lang, args.target_lang, args.limit)
    quantizations = ("float32", "int8") if args.device == "cpu" else ("float16", "int8_float16")
    with tempfile.TemporaryDirectory() as folder:
        exports = {f"ct2_{name}": (export_ctranslate2(args.model, Path(folder) / name, name), name)
                   for name in quantizations}
        configurations = args.threads if args.device == "cpu" else [None]
        runs = [measure(args, threads, exports, sources, references) for threads in configurations]
    record = {
        "environment": environment(args.device, "float32" if args.device == "cpu" else "bfloat16",
                                   command=command_line("benchmarks.bench_inference", argv)),
        "model": str(args.model), "model_note": args.model_note, "hardware_note": args.hardware_note,
        "test_file": str(args.test_file),
        "sentences": len(sources), "batch_size": args.batch_size, "num_beams": args.num_beams,
        "ctranslate2": __import__("ctranslate2").__version__, "runs": runs,
        "goals": GOALS[args.device], "max_bleu_loss_int8": MAX_BLEU_LOSS_INT8,
    }
    markdown = render_markdown(record)
    print(markdown)
    write_report(args.out, args.stem, markdown, record)
    return record


if __name__ == "__main__":
    main()
