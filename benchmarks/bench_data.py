"""Data preparation at WMT scale: wall time and peak memory of each phase of `train_translation.py --prepare_only true`
on a synthetic WMT-like corpus, for the first run (which prepares) and for a second run (which loads what the first
prepared), plus one epoch of pooled token-budget batches over the prepared training split.

The corpus is in the plain-text layout (train.en/train.de, valid.*, test.*): each line joins 1-3 Multi30k sentences
(about 130-150 characters a side) and one novel compound word a side (two random nouns of the corpus glued
together), so that the vocabulary keeps growing with the corpus as a real one does. The run uses a WMT base recipe
(vocabulary 32768, lengths 256, filtering), with `preprocessing_num_workers` set to the cores given.

Phases are cut at the log lines the run writes (hashing, reading, tokenizer training, each split prepared or
loaded). For each: the wall time, the CPU time (user + system) of the run's process tree, which a busy machine does
not inflate as it does the wall time, and the peak memory, sampled every 0.1 s over the process tree: the largest
resident set of one process (RSS, with the file pages of memory-mapped data it touched) and the same less
file-backed pages (anonymous memory).

  python -m benchmarks.bench_data --pairs 400000 1000000 --work /tmp/bench_data --record docs/results/...json
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import random
import re
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks import command_line
from hf_relpos.publish.files import write_text_atomic
from hf_relpos.publish.records import checkout_version, cpu_model_name
from hf_relpos.translation.safety import output_folder

ROOT = Path(__file__).resolve().parents[1]
MULTI30K = Path("/work/shared/data/multi30k")
RECIPE = ROOT / "configs" / "wmt14_en_de_base_directional.yaml"
SAMPLE_SECONDS = 0.1
# Log lines that end a phase (the phase is named after what the run did up to that line).
PHASE_MARKERS = (
    ("start-up (imports, checks), hash the files", re.compile(r"Hashed the data files")),
    ("read the texts into Arrow", re.compile(r"\bRead train \(")),
    ("train the tokenizer", re.compile(r"Trained the tokenizer in")),
    ("build model, prepare train (tokenize, filter, save)", re.compile(r"Prepared the train data in")),
    ("load tokenizer, build model, map prepared train", re.compile(r"Reusing the train data prepared")),
    ("prepare validation + test", re.compile(r"Prepared the test data in")),
    ("map prepared validation + test", re.compile(r"Reusing the test data prepared")),
    ("model, checks, tokenizer saved", re.compile(r"prepare_only: ")),
)


def generate_corpus(folder: Path, pairs: int, seed: int = 1) -> dict[str, Path]:
    """The plain-text corpus (train of `pairs` lines, validation and test of Multi30k's own) in `folder`; reused
    when already written for the same size and seed (the stamp is removed before the files are rewritten, so an
    interrupted regeneration is never taken for a finished one)."""
    stamp = folder / "corpus.json"
    prefixes = {split: folder / split for split in ("train", "valid", "test")}
    if stamp.is_file() and json.loads(stamp.read_text()) == {"pairs": pairs, "seed": seed}:
        return prefixes
    folder.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    corpus = {split: [json.loads(line)["translation"] for line in open(MULTI30K / f"{name}.jsonl", encoding="utf-8")]
              for split, name in (("train", "train"), ("valid", "validation"), ("test", "test"))}
    rng = random.Random(seed)
    english = sorted({word.strip(".,!?\"'") for pair in corpus["train"] for word in pair["en"].split()} - {""})
    german = sorted({word.strip(".,!?\"'") for pair in corpus["train"] for word in pair["de"].split()
                     if word[:1].isupper()} - {""})
    train = corpus["train"]
    with open(f"{prefixes['train']}.en", "w", encoding="utf-8") as en, \
            open(f"{prefixes['train']}.de", "w", encoding="utf-8") as de:
        for _ in range(pairs):
            chosen = [train[rng.randrange(len(train))] for _ in range(rng.randint(1, 3))]
            compound_en = rng.choice(english).lower() + rng.choice(english).lower()
            compound_de = rng.choice(german) + rng.choice(german).lower()
            en.write(" ".join(pair["en"] for pair in chosen) + f" {compound_en}\n")
            de.write(" ".join(pair["de"] for pair in chosen) + f" {compound_de}\n")
    for split in ("valid", "test"):
        for lang in ("en", "de"):
            Path(f"{prefixes[split]}.{lang}").write_text("".join(pair[lang] + "\n" for pair in corpus[split]),
                                                         encoding="utf-8")
    write_text_atomic(stamp, json.dumps({"pairs": pairs, "seed": seed}))
    return prefixes


def measure(command: list[str], env: dict[str, str], log_path: Path) -> dict[str, Any]:
    """Run `command`, cutting its time into phases at `PHASE_MARKERS` and sampling its process tree's memory."""
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                               cwd=ROOT)
    root = psutil.Process(process.pid)
    phases: list[dict[str, Any]] = []
    current = {"rss": 0, "anonymous": 0}
    lock = threading.Lock()
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for member in tree:
                try:
                    memory = member.memory_info()
                except psutil.NoSuchProcess:
                    continue
                with lock:
                    current["rss"] = max(current["rss"], memory.rss)
                    current["anonymous"] = max(current["anonymous"], memory.rss - memory.shared)
            time.sleep(SAMPLE_SECONDS)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    phase_start, cpu_start = started, 0.0

    def end_phase(name: str, cpu: float) -> None:
        now = time.monotonic()
        with lock:
            phases.append({"phase": name, "seconds": round(now - phase_start, 1), "cpu_seconds": round(cpu - cpu_start, 1),
                           "peak_rss_gib": round(current["rss"] / 2**30, 2),
                           "peak_anonymous_gib": round(current["anonymous"] / 2**30, 2)})
            current.update(rss=0, anonymous=0)

    with open(log_path, "w", encoding="utf-8") as log:
        for line in process.stdout:
            log.write(line)
            name = next((name for name, marker in PHASE_MARKERS if marker.search(line)), None)
            if name is None:
                continue
            cpu = tree_cpu_seconds(root)
            end_phase(name, cpu)
            phase_start, cpu_start = time.monotonic(), cpu
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    returncode = process.wait()
    done.set()
    sampler.join()
    if returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({returncode}); its log: {log_path}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_total = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
    end_phase("exit", cpu_total)
    return {"wall_seconds": round(time.monotonic() - started, 1), "cpu_seconds": round(cpu_total, 1),
            "peak_rss_gib": max(phase["peak_rss_gib"] for phase in phases),
            "peak_anonymous_gib": max(phase["peak_anonymous_gib"] for phase in phases), "phases": phases}


def tree_cpu_seconds(root: psutil.Process) -> float:
    """CPU seconds (user + system) the process tree has used so far: the root's, its finished children's and its
    live children's."""
    total = sum(root.cpu_times()[:4])
    for child in root.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += sum(child.cpu_times()[:2])
    return total


def sampler_epoch(output_dir: Path, max_tokens: int, pool_factor: int) -> dict[str, Any]:
    """Seconds to build the token-budget sampler over the prepared training split and draw one epoch."""
    from datasets import load_from_disk

    from hf_relpos.translation.batching import TokenBudgetBatchSampler
    from hf_relpos.translation.data import example_lengths

    (folder,) = (output_dir / "prepared_data").glob("train-*")
    started = time.monotonic()
    lengths = example_lengths(load_from_disk(str(folder / "data")))
    read = time.monotonic() - started
    sampler = TokenBudgetBatchSampler(*lengths, max_tokens, seed=1, pool_factor=pool_factor)
    batches = sum(1 for _ in sampler)
    return {"read_lengths_seconds": round(read, 2), "epoch_seconds": round(time.monotonic() - started - read, 1),
            "batches": batches, "max_tokens_per_batch": max_tokens, "length_pool_factor": pool_factor}


def tokenizer_sample(arguments: list[str]) -> int | None:
    """The tokenizer sample (`tokenizer_training_pairs`; None: every pair) a train_translation.py command line sets,
    read by its own parser."""
    from hf_relpos.translation.arguments import parse_arguments

    return parse_arguments(arguments)[1].tokenizer_training_pairs


def run_size(pairs: int, work: Path, workers: int, tokenizer_training_pairs: str | None = None) -> dict[str, Any]:
    """Both runs at `pairs` pairs; `tokenizer_training_pairs` ("null": every pair) overrides the recipe's."""
    corpus = generate_corpus(work / f"corpus_{pairs}", pairs)
    output_dir = work / f"out_{pairs}"
    command = [sys.executable, "train_translation.py", str(RECIPE), "--train_file", str(corpus["train"]),
               "--validation_file", str(corpus["valid"]), "--test_file", str(corpus["test"]), "--output_dir",
               str(output_dir), "--prepare_only", "true",
               "--preprocessing_num_workers", str(workers), "--report_to", "none"]
    if tokenizer_training_pairs is not None:
        command += ["--tokenizer_training_pairs", tokenizer_training_pairs]
    sample = tokenizer_sample(command[2:])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")   # this checkout first, ahead of the caller's path
    if output_dir.exists():
        subprocess.run(["rm", "-rf", str(output_dir)], check=True)
    text_bytes = sum(Path(f"{corpus['train']}.{lang}").stat().st_size for lang in ("en", "de"))
    first = measure(command, env, work / f"log_{pairs}_first.txt")
    second = measure(command, env, work / f"log_{pairs}_second.txt")
    prepared_bytes = sum(path.stat().st_size for path in (output_dir / "prepared_data").rglob("*") if path.is_file())
    return {"pairs": pairs, "tokenizer_training_pairs": sample, "train_text_mib": round(text_bytes / 2**20),
            "prepared_mib": round(prepared_bytes / 2**20),
            "code": checkout_version(ROOT), "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": " ".join(command[1:]).replace(str(work), "WORK"), "first_run": first, "second_run": second,
            "sampler": sampler_epoch(output_dir, max_tokens=3125, pool_factor=4)}


def render_markdown(record: dict[str, Any]) -> str:
    meta = record["meta"]
    record = dict(record, sizes=sorted(record["sizes"], key=lambda size: size["pairs"]))
    lines = ["| pairs | tokenizer trained on | text | prepared | first run (`--prepare_only`): wall | CPU | peak RSS | "
             "anonymous | second run: wall | CPU | peak RSS | anonymous | sampler epoch (pool 4) |", "|" + "---|" * 13]
    for size in record["sizes"]:
        first, second = size["first_run"], size["second_run"]
        lines.append(f"| {size['pairs']:,} | {tokenizer_pairs(size)} | {size['train_text_mib']} MiB | "
                     f"{size['prepared_mib']} MiB | "
                     f"{minutes(first['wall_seconds'])} | {minutes(first['cpu_seconds'])} | "
                     f"{first['peak_rss_gib']} GiB | {first['peak_anonymous_gib']} GiB | "
                     f"{minutes(second['wall_seconds'])} | {minutes(second['cpu_seconds'])} | "
                     f"{second['peak_rss_gib']} GiB | {second['peak_anonymous_gib']} GiB | "
                     f"{size['sampler']['epoch_seconds']} s |")
    lines += ["", "Phases (wall seconds / CPU seconds of the process tree / peak RSS of one process in GiB):", ""]
    names = list(dict.fromkeys(phase["phase"] for size in record["sizes"]
                               for run in ("first_run", "second_run") for phase in size[run]["phases"]))
    lines += ["| pairs | run | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 2)]
    for size in record["sizes"]:
        for run in ("first_run", "second_run"):
            by_name = {phase["phase"]: phase for phase in size[run]["phases"]}
            cells = [f"{by_name[name]['seconds']} / {by_name[name]['cpu_seconds']} / {by_name[name]['peak_rss_gib']}"
                     if name in by_name else "-" for name in names]
            lines.append(f"| {size['pairs']:,} ({tokenizer_pairs(size)}) | {run.split('_')[0]} | "
                         + " | ".join(cells) + " |")
    lines += ["", f"- command: `{meta['command']}`; each run: `python {record['sizes'][0]['command']}`",
              f"- hardware: {meta['hardware']}; python {meta['python']}"]
    if "note" in meta:
        lines.append(f"- note: {meta['note']}")
    lines += [f"- {size['pairs']:,} pairs ({tokenizer_pairs(size)}): code `{size.get('code', meta['code'])}`, "
              f"{size.get('date', meta['date'])}" + (f"; {size['machine']}" if "machine" in size else "")
              for size in record["sizes"]]
    return "\n".join(lines)


def tokenizer_pairs(size: dict[str, Any]) -> str:
    """The pairs the size's tokenizer was trained on, in words."""
    sample = size.get("tokenizer_training_pairs")
    return "every pair" if sample is None or sample >= size["pairs"] else f"a {sample:,}-pair sample"


def render_cost_note(record: dict[str, Any]) -> str:
    """What preparing each measured size cost, in words (docs/training.md)."""
    sentences = []
    for size in sorted(record["sizes"], key=lambda size: size["pairs"]):
        first, second = size["first_run"], size["second_run"]
        sentences.append(f"{size['pairs']:,} pairs ({size['train_text_mib']} MiB of text; tokenizer trained on "
                         f"{tokenizer_pairs(size)}): "
                         f"{minutes(first['wall_seconds'])} of wall time with `--prepare_only true` ({minutes(first['cpu_seconds'])} "
                         "of CPU time), at most "
                         f"{first['peak_rss_gib']} GiB resident in one process ({first['peak_anonymous_gib']} GiB "
                         f"besides file pages), {size['prepared_mib']} MiB in `prepared_data/`; a second run ready "
                         f"in {minutes(second['wall_seconds'])}" + (f" ({size['machine']})" if "machine" in size else ""))
    codes = ", ".join(dict.fromkeys(size.get("code", record["meta"]["code"]) for size in record["sizes"]))
    return (f"Measured on {record['meta']['hardware']} (`preprocessing_num_workers: "
            f"{record['meta']['preprocessing_num_workers']}`, code `{codes}`), with a synthetic "
            "WMT-like corpus in the plain-text layout and the WMT base recipe: " + "; ".join(sentences) + "."
            + wmt14_estimate(record))


WMT14_PAIRS = 4_500_000


def wmt14_estimate(record: dict[str, Any]) -> str:
    """WMT14's preparation scaled linearly from the largest size measured, when it was not measured itself."""
    largest = max(record["sizes"], key=lambda size: size["pairs"])
    if largest["pairs"] >= WMT14_PAIRS:
        return ""
    scale = WMT14_PAIRS / largest["pairs"]
    return (f" Not measured at WMT14's {WMT14_PAIRS:,} pairs: scaled linearly from {largest['pairs']:,}, its first "
            f"run would use about {minutes(round(largest['first_run']['cpu_seconds'] * scale))} of CPU time (the "
            "tokenizer training, one process, and the tokenization, `preprocessing_num_workers` processes, take "
            "most of it).")


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:04.1f} s" if seconds >= 60 else f"{seconds} s"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, nargs="+", default=[400_000])
    parser.add_argument("--work", type=output_folder, default=Path("/tmp/bench_data"),
                        help="corpora and output folders")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="preprocessing_num_workers")
    parser.add_argument("--hardware_note", default="", help="appended to the hardware line (e.g. shared machine)")
    parser.add_argument("--record", type=Path, required=True, help="JSON record to write (after every size)")
    parser.add_argument("--append", action="store_true", help="add the sizes to an existing --record")
    parser.add_argument("--tokenizer_training_pairs", help="override the recipe's tokenizer sample (null: every pair)")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)

    meta = {"command": command_line("benchmarks.bench_data", argv),
            "hardware": f"{cpu_model_name()}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB"
                        + (f"; {args.hardware_note}" if args.hardware_note else ""),
            "code": checkout_version(ROOT), "python": platform.python_version(),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "preprocessing_num_workers": args.workers}
    record: dict[str, Any] = {"meta": meta, "sizes": []}
    if args.append and args.record.is_file():
        record = json.loads(args.record.read_text())
        record["meta"]["command"] += f"; then {meta['command']}"
    for pairs in args.pairs:
        size = run_size(pairs, args.work, args.workers, args.tokenizer_training_pairs)
        if args.append and args.hardware_note:   # a later command may have run on a busier machine
            size["machine"] = args.hardware_note
        record["sizes"].append(size)
        args.record.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.record, json.dumps(record, indent=2) + "\n")
        print(render_markdown(record), flush=True)


if __name__ == "__main__":
    main()
