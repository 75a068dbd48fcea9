r"""Multi30k En->De: the four position schemes trained with `train_translation.py` on identical settings.

Each run is `configs/multi30k_small_<scheme>.yaml` (the four files differ only in `position_scheme`) with the same
overrides for every scheme: local data files, seed, step cap, evaluation schedule, CPU threads. The joint BPE
tokenizer is trained once, up front, on the training pairs and passed to every run, so every scheme sees the same token
ids; `--jobs N` runs N trainings at once (one per core with `--threads 1`). A run whose folder under --work already
holds `test_results.json` is reused, not retrained (delete the folder to retrain), so an interrupted comparison picks
up where it stopped. Afterwards the script reads each run's `trainer_state.json` (log_history), `train_results.json`
and `test_results.json` and writes a JSON, Markdown tables (test BLEU/chrF per seed, mean and spread; validation loss
per seed) and a PNG of validation BLEU and loss against steps, one colour per scheme (mean over seeds, min-max band).

Reduced CPU run (the figures in docs/results.md, about 35 minutes per seed on 2 idle cores):
  python experiments/multi30k_compare.py --data ../shared/data/multi30k --work /tmp/multi30k_v2 \
      --out docs/results/multi30k --seeds 1 2 3 --max-steps 1200 --warmup-steps 300 --eval-steps 300 \
      --logging-steps 50 --max-eval-samples 200 --threads 1 --jobs 2 \
      -- --model.d_model 128 --model.encoder_ffn_dim 512 --model.decoder_ffn_dim 512 --max_tokens_per_batch 2048
Options after `--` go to every `train_translation.py` call unchanged (e.g. `-- --model.d_model 128`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import torch

from hf_relpos.publish.files import write_text_atomic
from hf_relpos.publish.records import RECORDS, RUN_RECORD_FILE, RunRecord, cpu_model_name, training_record
from hf_relpos.tools.viz import require_matplotlib, save_figure
from hf_relpos.translation.safety import output_folder

ROOT = Path(__file__).resolve().parents[1]
SCHEMES = ("absolute", "shaw", "xl", "directional")


def device_description() -> str:
    """The accelerator the runs see (CUDA device name) or the CPU model, for the results' metadata."""
    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return f"CPU: {cpu_model_name()}, {os.cpu_count()} cores"


def prepare_tokenizer(args: argparse.Namespace) -> Path:
    """Train the joint tokenizer on every source and target sentence of train.jsonl (or reuse it) under --work."""
    from hf_relpos.translation.tokenization import has_saved_tokenizer, train_joint_tokenizer

    folder = args.work / "tokenizer"
    if not has_saved_tokenizer(folder):
        pairs = [json.loads(line)["translation"] for line in (args.data / "train.jsonl").open() if line.strip()]
        texts = [pair[language] for pair in pairs for language in ("en", "de")]
        train_joint_tokenizer(texts, args.tokenizer_vocab_size).save_pretrained(folder)
    return folder


def train_command(scheme: str, seed: int, output_dir: Path, tokenizer: Path, args: argparse.Namespace) -> list[str]:
    command = [
        sys.executable, str(ROOT / "train_translation.py"), str(ROOT / "configs" / f"multi30k_small_{scheme}.yaml"),
        "--train_file", str(args.data / "train.jsonl"), "--validation_file", str(args.data / "validation.jsonl"),
        "--test_file", str(args.data / "test.jsonl"), "--output_dir", str(output_dir), "--seed", str(seed),
        "--max_steps", str(args.max_steps), "--eval_strategy", "steps", "--eval_steps", str(args.eval_steps),
        "--logging_steps", str(args.logging_steps), "--save_strategy", "no", "--warmup_steps", str(args.warmup_steps),
        "--max_eval_samples", str(args.max_eval_samples), "--cpu_threads", str(args.threads),
        "--tokenizer_name", str(tokenizer), "--overwrite_output_dir", "true",  # an unfinished run starts again
    ]
    return command + args.extra


def train(scheme: str, seed: int, tokenizer: Path, args: argparse.Namespace) -> None:
    """One `train_translation.py` run, its output in <work>/<scheme>_seed<seed>.log; skipped when already finished."""
    output_dir = args.work / f"{scheme}_seed{seed}"
    if (output_dir / "test_results.json").is_file():
        print(f"{scheme} seed {seed}: reusing the finished run in {output_dir}", flush=True)
        return
    with open(args.work / f"{scheme}_seed{seed}.log", "w") as handle:
        subprocess.run(train_command(scheme, seed, output_dir, tokenizer, args), check=True,
                       stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT)


def read_run(output_dir: Path) -> dict:
    """Curves from trainer_state.json's log_history, training seconds and the test scores of one finished run."""
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    test = json.loads((output_dir / "test_results.json").read_text())
    return {
        "seconds": json.loads((output_dir / "train_results.json").read_text())["train_runtime"],
        "train_loss": [[entry["step"], entry["loss"]] for entry in history if "loss" in entry],
        "eval_loss": [[entry["step"], entry["eval_loss"]] for entry in history if "eval_loss" in entry],
        "eval_bleu": [[entry["step"], entry["eval_bleu"]] for entry in history if "eval_bleu" in entry],
        "test_bleu": test["test_bleu"],
        "test_chrf": test.get("test_chrf"),
        "test_length_ratio": test.get("test_length_ratio"),
        "test_bleu_signature": test.get("test_bleu_signature"),
    }


def typed_record(output_dir: Path, scheme: str) -> RunRecord:
    """The run's typed record: the one train_translation.py wrote (its recipe, flags, settings and scores), with
    the scheme as its system."""
    trained = training_record(output_dir)
    if trained is None:
        raise SystemExit(f"multi30k_compare.py: {output_dir} holds no {RUN_RECORD_FILE}: retrain the run (delete it)")
    return replace(trained, system=scheme)


def markdown(results: dict) -> str:
    seeds = results["settings"]["seeds"]
    lines = [
        "# Multi30k En->De, reduced CPU run",
        "",
        f"Test sacreBLEU (beam 4, full test set) after {results['settings']['max_steps']} steps; seeds {seeds}.",
        f"Signature: `{results['signature']}`.",
        "",
        "| scheme | test BLEU (mean) | per seed | spread (max-min) | test chrF (mean) | hyp/ref length | best val BLEU "
        "| last val BLEU | train s / run |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for scheme, summary in results["schemes"].items():
        bleus = summary["test_bleu"]
        chrf = summary["test_chrf"]
        lines.append(
            f"| {scheme} | {statistics.mean(bleus):.2f} | {', '.join(f'{b:.2f}' for b in bleus)} | "
            f"{max(bleus) - min(bleus):.2f} | {statistics.mean(chrf):.2f} | "
            f"{statistics.mean(summary['test_length_ratio']):.2f} | {statistics.mean(summary['best_eval_bleu']):.2f} | "
            f"{statistics.mean(summary['last_eval_bleu']):.2f} | {statistics.mean(summary['seconds']):.0f} |"
        )
    lines += [
        "",
        f"Validation loss (label-smoothed) at the last evaluation, per seed {', '.join(map(str, seeds))}:",
        "",
        "| scheme | validation loss per seed | mean |",
        "| --- | --- | --- |",
    ]
    for scheme, summary in results["schemes"].items():
        losses = [run["eval_loss"][-1][1] for run in summary["runs"]]
        lines.append(f"| {scheme} | {' / '.join(f'{loss:.3f}' for loss in losses)} | {statistics.mean(losses):.3f} |")
    return "\n".join(lines) + "\n"


def seed_band(runs: list[dict], key: str) -> tuple[list[int], list[float], list[float], list[float]]:
    """Steps, mean, min and max over seeds of one logged curve (steps common to every seed)."""
    curves = [dict(run[key]) for run in runs]
    steps = sorted(set.intersection(*(set(curve) for curve in curves)))
    values = [[curve[step] for curve in curves] for step in steps]
    return steps, [statistics.mean(v) for v in values], [min(v) for v in values], [max(v) for v in values]


def plot(results: dict, path: Path) -> None:
    """Validation BLEU (left) and training / validation loss (right) against steps: the mean over seeds, with the
    min-max band across seeds shaded; one colour per scheme."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4))
    bleu_axes, loss_axes = figure.subplots(1, 2)
    for index, (scheme, summary) in enumerate(results["schemes"].items()):
        colour = f"C{index}"
        for axes, key, style, label in (
            (bleu_axes, "eval_bleu", {"marker": "o"}, scheme),
            (loss_axes, "train_loss", {}, f"{scheme} train"),
            (loss_axes, "eval_loss", {"marker": "o", "linestyle": "--"}, f"{scheme} validation"),
        ):
            steps, mean, low, high = seed_band(summary["runs"], key)
            axes.plot(steps, mean, color=colour, label=label, **style)
            axes.fill_between(steps, low, high, color=colour, alpha=0.15, linewidth=0)
    seeds = len(results["settings"]["seeds"])
    band = f"mean of {seeds} seeds, band min-max" if seeds > 1 else "one seed"
    bleu_axes.set(xlabel="step", ylabel="validation sacreBLEU (beam 4)",
                  title=f"Multi30k En->De: validation BLEU ({band})")
    loss_axes.set(xlabel="step", ylabel="loss (label-smoothed train, validation)", title=f"loss ({band})")
    bleu_axes.legend()
    loss_axes.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    save_figure(figure, path, dpi=100)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="folder with train/validation/test.jsonl")
    parser.add_argument("--work", type=output_folder, required=True,
                        help="folder for the runs' output_dirs (not committed)")
    parser.add_argument("--out", type=output_folder, required=True, help="folder for the JSON, Markdown and PNG")
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=SCHEMES)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--warmup-steps", type=int, default=100)
    parser.add_argument("--eval-steps", type=int, default=100)
    parser.add_argument("--logging-steps", type=int, default=25)
    parser.add_argument("--max-eval-samples", type=int, default=200, help="validation sentences scored during training")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per run")
    parser.add_argument("--jobs", type=int, default=1, help="runs trained at the same time")
    parser.add_argument("--tokenizer-vocab-size", type=int, default=8000, help="as tokenizer_vocab_size in the configs")
    parser.add_argument("--collect-only", action="store_true", help="only read finished runs under --work")
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    require_matplotlib()  # fail before training, not after, when the `viz` extra is missing
    args.extra = extra

    jobs = [(scheme, seed) for seed in args.seeds for scheme in args.schemes]
    if args.collect_only:   # every run checked before any is read, as vs_marian.py and convergence.py do
        for scheme, seed in jobs:
            if not (finished := args.work / f"{scheme}_seed{seed}" / "test_results.json").is_file():
                raise SystemExit(f"multi30k_compare.py: --collect-only: {scheme} seed {seed} has no {finished}")
    else:
        args.work.mkdir(parents=True, exist_ok=True)
        tokenizer = prepare_tokenizer(args)
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for future in [pool.submit(train, *job, tokenizer, args) for job in jobs]:
                future.result()
    schemes: dict[str, dict] = {}
    records = []
    for scheme, seed in jobs:
        run = read_run(args.work / f"{scheme}_seed{seed}")
        records.append(typed_record(args.work / f"{scheme}_seed{seed}", scheme).to_json())
        summary = schemes.setdefault(scheme, {"runs": [], "test_bleu": [], "test_chrf": [], "test_length_ratio": [],
                                              "best_eval_bleu": [], "last_eval_bleu": [], "seconds": []})
        summary["runs"].append(run)
        summary["test_bleu"].append(run["test_bleu"])
        summary["test_chrf"].append(run["test_chrf"])
        summary["test_length_ratio"].append(run["test_length_ratio"])
        summary["best_eval_bleu"].append(max(bleu for _, bleu in run["eval_bleu"]))
        summary["last_eval_bleu"].append(run["eval_bleu"][-1][1])
        summary["seconds"].append(run["seconds"])
        print(f"{scheme} seed {seed}: test BLEU {run['test_bleu']:.2f}", flush=True)

    settings = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
    first = next(iter(schemes.values()))["runs"][0]
    results = {
        "settings": settings,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": device_description(),
        "signature": first["test_bleu_signature"],
        "schemes": schemes,
        RECORDS: records,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out / "multi30k.json", json.dumps(results, indent=1) + "\n")
    write_text_atomic(args.out / "multi30k.md", markdown(results))
    plot(results, args.out / "multi30k_curves.png")
    return results


if __name__ == "__main__":
    main()
