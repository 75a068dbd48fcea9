r"""The multi30k_small_* recipes for their 20 epochs, the last 5 averaged, against the peer trained the same way (not
"converged", whatever the name says: the runs still improve at the end).

Each recipe trains as it is (its epochs, about 230 pairs a step, inverse-sqrt schedule) with a checkpoint at the end of
every epoch; the peer (HF MarianMTModel and the plain Seq2SeqTrainer with vs_marian.py's hyperparameters: batches of 64
pairs, learning rate 1e-3, 400 warm-up steps) trains for the same number of epochs, also with a checkpoint per epoch;
`peer+recipe-training` is the same MarianMTModel trained by hf_relpos' own trainer exactly as the recipes train (their
tokenizer, token-budget batches, schedule, epochs and checkpoints), so that against a recipe only the model differs.
Then the last `--last-n` checkpoints of each are averaged (Vaswani et al. 2017; `hf_relpos.tools.average`), and the final
and the averaged weights are decoded alike with the recipes' decoding (beam 4, length penalty 1.0, at most the
longest source + 50 new tokens) and scored with cased sacreBLEU on validation and test2016. One table: mean (min-max)
over seeds; then each system's averaged weights against the `--baseline`'s (absolute) of the same seed, the BLEU
difference and its paired bootstrap p-value (Koehn 2004, sacreBLEU's test). Finished runs
(`<work>/<system>/seed<S>/run.json`) are reused, so systems can train in separate processes at once (one per system
on one GPU) and the table be collected with `--collect-only`; a run cut short (a time limit, the end of a session)
continues from its newest complete checkpoint when called again, and its record names each attempt.

  python experiments/convergence.py --data ../shared/data/multi30k --work /tmp/convergence \
      --out docs/results/convergence --systems peer absolute shaw xl directional --seeds 1
  python experiments/convergence.py ... --systems peer+recipe-training absolute shaw xl directional rope \
      --seeds 1 2 3     # every system trained alike, three seeds
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import torch
from settings import adopt_run_settings, json_settings
from vs_marian import (
    PEER,
    PEER_TRAINING_RECIPE,
    RECIPE_SCHEMES,
    ROOT,
    SPLITS,
    Decoding,
    batch_columns,
    batch_summary,
    evaluate,
    hypotheses_file,
    kept_hypotheses,
    logged_losses,
    paired_tests,
    paired_tests_table,
    recipe_path,
    run_batches,
    scored_pairs,
    spread,
    train_peer,
    train_peer_as_recipe,
    typed_record,
    write_results,
)

from hf_relpos.publish.files import write_text_atomic
from hf_relpos.publish.records import (
    checkout_version,
    cpu_model_name,
    gather_run_records,
    software_versions,
    training_record,
)
from hf_relpos.tools.average import average_checkpoints
from hf_relpos.translation.checkpoints import TRAINER_STATE_FILE, last_complete_checkpoint
from hf_relpos.translation.safety import output_folder
from hf_relpos.translation.training import run

# The peer trained by hf_relpos' trainer exactly as the recipes train (their tokenizer, token-budget batches,
# schedule, epochs): against a recipe, only the model class differs.
PEER_AS_RECIPE = "peer+recipe-training"
PEERS = (PEER, PEER_AS_RECIPE)
# A recipe with one setting changed, for the single-factor swaps that test where the peer and `absolute` differ:
# system -> (recipe, train_translation.py flags). The one structural difference left between the two networks is the
# decoder start token (tests/test_convert.py, tests/test_experiments.py): the peer starts from <pad>, the recipe from
# <s>.
# `shaw+concat-0.5`: sentence concatenation trained into shaw for the recipes' epochs (whether its
# single-caption cost at the equal budget remains after 20 epochs; docs/results.md 5b); `shaw+concat-0.5-up-to-4`:
# as many joined pairs, each of 2 to 4 captions, so training covers the longest level's lengths (a data remedy).
RECIPE_OPTIONS = {"absolute+pad-start": ("absolute", ("--decoder_start_token", "pad")),
                  "shaw+concat-0.5": ("shaw", ("--concatenated_pairs", "0.5")),
                  "shaw+concat-0.5-up-to-4": ("shaw", ("--concatenated_pairs", "0.5", "--max_pairs_per_join", "4"))}
SYSTEMS = (*PEERS, *RECIPE_SCHEMES, *RECIPE_OPTIONS)
PEER_BATCH_SIZE = 64   # pairs per update of the plain peer (vs_marian.py's hyperparameters)
RECIPE_DECODING = Decoding(beams=4, length_penalty=1.0, source_offset=50)


def checkpoints_folder(folder: Path, system: str) -> Path:
    """Where a run of `system` in `folder` keeps its epoch checkpoints: the plain peer's Trainer folder, else the
    model's output folder."""
    return folder / ("trainer" if system == PEER else "model")


def newest_complete_checkpoint(checkpoints: Path) -> Path | None:
    """The checkpoint a run cut short (by a time limit, or the end of a session) continues from: the newest complete
    one in its checkpoints' folder, if any."""
    return last_complete_checkpoint(checkpoints) if checkpoints.is_dir() else None


def continuation_flags(checkpoints: Path) -> list[str]:
    """train_translation.py flags for a run folder left by an earlier attempt: continue from its newest complete
    checkpoint, or, with none complete, train again from scratch over what it left."""
    if newest_complete_checkpoint(checkpoints) is not None:
        return ["--resume_from_checkpoint", "last"]
    return ["--overwrite_output_dir", "true"] if checkpoints.is_dir() else []


def recipe_argv(scheme: str, folder: Path, seed: int, args: argparse.Namespace, flags: Sequence[str] = ()) -> list[str]:
    """train_translation.py arguments of the scheme's recipe as it is, a checkpoint per epoch, then `flags` (a
    RECIPE_OPTIONS system's), `--recipe-flags`, and last the continuation of an earlier attempt. One checkpoint more
    than are averaged is kept: with early stopping in the flags, transformers keeps the best checkpoint besides the
    newest, so the last `--last-n` are there to average."""
    return [
        str(recipe_path(scheme)), "--train_file", str(args.data / "train.jsonl"), "--source_lang", args.source_lang,
        "--target_lang", args.target_lang, "--output_dir", str(folder / "model"), "--seed", str(seed),
        "--num_train_epochs", str(args.epochs), "--do_eval", "false", "--do_predict", "false",
        "--eval_strategy", "no", "--save_strategy", "epoch", "--save_total_limit", str(args.last_n + 1),
        "--cpu_threads", str(args.threads), "--report_to", "none", "--disable_tqdm", "true", *flags, *args.recipe_flags,
        *continuation_flags(checkpoints_folder(folder, scheme)),
    ]


def train_recipe(scheme: str, folder: Path, seed: int, args: argparse.Namespace,
                 flags: Sequence[str] = ()) -> tuple[dict, Path]:
    """The scheme's recipe as it is, a checkpoint per epoch; returns the training record and the checkpoints' folder."""
    argv = recipe_argv(scheme, folder, seed, args, flags)
    started = time.perf_counter()
    run(argv)
    seconds = time.perf_counter() - started
    state = json.loads((folder / "model" / "trainer_state.json").read_text())
    return {"argv": argv, "steps": state["global_step"], "train_seconds": seconds,
            "train_loss": logged_losses(state["log_history"])}, \
        folder / "model"


def train_peer_as_recipe_epochs(folder: Path, seed: int, args: argparse.Namespace) -> tuple[dict, Path]:
    """HF MarianMTModel trained as the recipes train (vs_marian.py's train_peer_as_recipe with the arguments of
    PEER_TRAINING_RECIPE's run here): their tokenizer, batches, schedule, epochs and checkpoints."""
    training = train_peer_as_recipe(recipe_argv(PEER_TRAINING_RECIPE, folder, seed, args), args)
    return training, folder / "model"


def train_peer_epochs(folder: Path, seed: int, args: argparse.Namespace) -> tuple[dict, Path]:
    """The peer for `--epochs` epochs of 64-pair batches, a checkpoint per epoch (vs_marian.py's train_peer)."""
    peer_args = argparse.Namespace(**vars(args), max_steps=-1, batch_size=PEER_BATCH_SIZE, warmup_steps=args.peer_warmup_steps,
                                   logging_steps=50)
    checkpoints = checkpoints_folder(folder, PEER)
    resume = newest_complete_checkpoint(checkpoints)
    training = train_peer(folder, seed, peer_args, num_train_epochs=args.epochs, save_strategy="epoch",
                          save_total_limit=args.last_n, resume_from_checkpoint=resume and str(resume))
    return training, checkpoints


def run_one(system: str, seed: int, args: argparse.Namespace) -> dict:
    """Train (unless `run.json` exists), average the last checkpoints, decode and score final and averaged weights."""
    folder = args.work / system / f"seed{seed}"
    record_path = folder / "run.json"
    if record_path.is_file():
        return json.loads(record_path.read_text())
    if args.collect_only:
        raise SystemExit(f"convergence.py: --collect-only: {system} seed {seed} has no {record_path}")
    folder.mkdir(parents=True, exist_ok=True)
    version, started = checkout_version(ROOT), time.perf_counter()   # the code that trains, not the code at the end
    is_peer = system in PEERS
    starts = record_start(folder, version, newest_complete_checkpoint(checkpoints_folder(folder, system)))
    version = " then ".join(dict.fromkeys(start["source_version"] for start in starts))
    print(f"{system} seed {seed}: training" + (f", continued from {starts[-1]['continued_from']}"
                                               if starts[-1]["continued_from"] else ""), flush=True)
    recipe, option_flags = RECIPE_OPTIONS.get(system, (system, ()))
    if system == PEER_AS_RECIPE:
        training, checkpoints = train_peer_as_recipe_epochs(folder, seed, args)
    elif is_peer:
        training, checkpoints = train_peer_epochs(folder, seed, args)
    else:
        training, checkpoints = train_recipe(recipe, folder, seed, args, option_flags)
    shutil.rmtree(folder / "averaged", ignore_errors=True)   # an earlier attempt's, cut before its run.json
    averaged = average_checkpoints(checkpoints, args.last_n, folder / "averaged")
    scores = {}
    for weights, model_folder in (("final", folder / "model"), ("averaged", averaged)):
        hypotheses = folder / f"{weights}_hypotheses"
        hypotheses.mkdir(exist_ok=True)
        scores[weights] = evaluate(model_folder, is_peer, RECIPE_DECODING, args, hypotheses_folder=hypotheses)
    wall_seconds = time.perf_counter() - started
    training["train_seconds"] += starts[-1]["trained_seconds_before"] or 0.0   # what its checkpoint holds
    batch_args = argparse.Namespace(**vars(args), batch_size=PEER_BATCH_SIZE)
    batches = run_batches(folder, seed, batch_args, training.get("argv"), training["steps"])
    date = datetime.now(UTC).isoformat(timespec="seconds")
    trained_as = system if is_peer else " ".join([recipe_path(recipe).name, *option_flags, *args.recipe_flags])
    typed = typed_record(system, is_peer, recipe_path(recipe).stem, trained_as, seed, version, args.device_name,
                         training["steps"], training, batches, scores, date, average_checkpoints=args.last_n,
                         trained=training_record(folder / "model"))
    record = {"system": system, "seed": seed, "source_version": version, "versions": software_versions(),
              "device": args.device_name, "wall_seconds": wall_seconds, **training, "batches": batches,
              "scores": scores, "date": date, "record": typed,
              **{name: vars(args)[name] for name in RUN_SETTINGS}}
    if any(start["continued_from"] for start in starts):
        record["starts"] = starts
    write_text_atomic(record_path, json.dumps(record, indent=1) + "\n")
    print(f"{system} seed {seed}: test BLEU {scores['final']['test']['bleu']:.2f} final, "
          f"{scores['averaged']['test']['bleu']:.2f} averaged", flush=True)
    return record


# The settings that shape what a run trains and scores: each run records them, and a collection states the runs' (a
# collection's caption names the epochs trained and the checkpoints averaged: the runs', not the collecting command's).
RUN_SETTINGS = ("recipe_flags", "max_eval_samples", "epochs", "last_n")


def added_recipe_flags(settings: dict) -> str:
    """A caption's note on the train_translation.py flags a record's `--recipe-flags` added to every recipe (else
    nothing: the recipes as they are)."""
    flags = settings.get("recipe_flags")
    return f", `{shlex.join(flags)}` added to every recipe" if flags else ""


def markdown(results: dict) -> str:
    settings = results["settings"]
    recipes = (f"Recipes{added_recipe_flags(settings)} (pairs a step: the table's)" if settings.get("recipe_flags")
               else "Recipes as they are (about 230 pairs a step)")
    lines = [
        f"# The multi30k_small_* recipes for {settings['epochs']} epochs, last {settings['last_n']} averaged, against "
        "HF MarianMT trained the same way",
        "",
        f"{settings['epochs']} epochs each, a checkpoint per epoch, the last {settings['last_n']} averaged. {recipes}; "
        "`peer` with vs_marian.py's hyperparameters (64 pairs a step, learning rate "
        f"1e-3, {settings['peer_warmup_steps']} warm-up steps), `peer+recipe-training` trained as the recipes are. "
        f"Decoding: beam {RECIPE_DECODING.beams}, length "
        f"penalty {RECIPE_DECODING.length_penalty}, at most the longest source + {RECIPE_DECODING.source_offset} new "
        f"tokens, for every model. Mean over seeds (min-max).{scored_pairs(settings)} Device: {results['device']}.",
        f"sacreBLEU signature: `{results['signature']}`.",
        "",
        *tables(results),
    ]
    return "\n".join(lines) + "\n"


def continued_runs(results: dict) -> list[str]:
    """The line naming the runs that continued from a checkpoint after a cut, if any."""
    continued = [f"{system} seed {run['seed']} (from "
                 f"{', '.join(start['continued_from'] for start in run['starts'] if start['continued_from'])})"
                 for system, runs in results["runs"].items() for run in runs if "starts" in run]
    if not continued:
        return []
    return ["", f"Continued after a cut, from their newest complete checkpoint: {'; '.join(continued)}. Their train "
            "min adds the earlier attempts' time up to that checkpoint (where their start is on record)."]


def tables(results: dict) -> list[str]:
    """The main table's lines, the runs continued after a cut, then the paired tests' when the record has them."""
    lines = table(results) + continued_runs(results)
    if "paired_tests" in results:
        lines += ["", *paired_tests_table(results["paired_tests"])]
    return lines


def table(results: dict) -> list[str]:
    """The main table's lines: one row per system, mean (min-max) over seeds."""
    lines = [
        "| system | seeds | steps | test2016 BLEU, averaged | test2016 BLEU, final | validation BLEU, averaged | "
        "validation BLEU, final | test hyp/ref, averaged | pairs/update | padding % | train min |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for system, row in results["systems"].items():
        lines.append(
            f"| {system} | {', '.join(map(str, row['seeds']))} | {spread(row['steps'], 0)} | "
            f"{spread(row['averaged_test_bleu'])} | {spread(row['final_test_bleu'])} | "
            f"{spread(row['averaged_validation_bleu'])} | {spread(row['final_validation_bleu'])} | "
            f"{spread(row['averaged_test_length_ratio'], 3)} | {batch_columns(row)} | {spread(row['train_minutes'], 1)} |"
        )
    return lines


def weights_hypotheses(work: Path, weights: str) -> Callable[[str, int, str], Path]:
    """Where each run keeps its hypotheses of a split from its `weights` ("final" or "averaged")."""
    return lambda system, seed, split: hypotheses_file(work / system / f"seed{seed}" / f"{weights}_hypotheses", split)


def summarize(records: dict[str, list[dict]]) -> dict:
    return {
        system: {
            "seeds": [record["seed"] for record in runs], "steps": [record["steps"] for record in runs],
            **{f"{weights}_{split}_{key}": [record["scores"][weights][split][key] for record in runs]
               for weights in ("final", "averaged") for split in SPLITS for key in ("bleu", "length_ratio")},
            "train_minutes": [record["train_seconds"] / 60 for record in runs], **batch_summary(runs),
        }
        for system, runs in records.items()
    }


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name(device)}, one process per system"
    return f"CPU: {cpu_model_name()}"


def record_start(folder: Path, version: str, continued_from: Path | None) -> list[dict]:
    """Append this attempt to the run's `starts.json` before it trains: its code version, the checkpoint it continues
    from, and the training time that checkpoint holds (`trained_seconds_before`: the attempt that wrote it, from its
    start to the checkpoint's state file, plus what that attempt continued from; None when no earlier start is on
    record). Returns the attempts whose training the run keeps: one that starts from scratch replaces the earlier
    ones, and an attempt cut before it wrote a checkpoint is left out."""
    path = folder / "starts.json"
    attempt = {"source_version": version, "continued_from": None, "trained_seconds_before": 0.0,
               "date": datetime.now(UTC).isoformat(timespec="seconds")}
    starts = []
    if continued_from is not None:
        written = (continued_from / TRAINER_STATE_FILE).stat().st_mtime
        recorded = json.loads(path.read_text()) if path.is_file() else []
        starts = [start for start in recorded if datetime.fromisoformat(start["date"]).timestamp() <= written]
        before = starts[-1].get("trained_seconds_before", 0.0) if starts else None
        attempt["continued_from"] = continued_from.name
        attempt["trained_seconds_before"] = before if before is None else (
            before + written - datetime.fromisoformat(starts[-1]["date"]).timestamp())
    starts.append(attempt)
    write_text_atomic(path, json.dumps(starts, indent=1) + "\n")
    return starts


def build_parser() -> argparse.ArgumentParser:
    """convergence.py's options (report.py writes a record's command line from their defaults)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k",
                        help="folder with train/validation/test.jsonl")
    parser.add_argument("--work", type=output_folder, default=Path("/tmp/convergence"),
                        help="run folders (not committed)")
    parser.add_argument("--out", type=output_folder, default=Path(__file__).resolve().parents[1] / "docs" / "results" /
                        "convergence")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=[*PEERS, *RECIPE_SCHEMES])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--collect-only", action="store_true", help="only read finished runs under --work")
    parser.add_argument("--baseline", default="absolute", choices=SYSTEMS,
                        help="system every other one is compared with, seed by seed (paired bootstrap), when present")
    parser.add_argument("--epochs", type=float, default=20, help="training epochs of every system (the recipes' 20)")
    parser.add_argument("--last-n", type=int, default=5, help="checkpoints averaged")
    parser.add_argument("--peer-warmup-steps", type=int, default=400)
    parser.add_argument("--recipe-flags", nargs=argparse.REMAINDER, default=[],
                        help="train_translation.py flags for every recipe (last; e.g. a smaller model for a smoke run)")
    parser.add_argument("--source-lang", default="en")
    parser.add_argument("--target-lang", default="de")
    parser.add_argument("--vocab-size", type=int, default=8000, help="peer tokenizer (the recipes' 8000)")
    parser.add_argument("--d-model", type=int, default=256, help="peer size (the recipes' 256)")
    parser.add_argument("--layers", type=int, default=3, help="peer: encoder and decoder layers each")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn-dim", type=int, default=1024)
    parser.add_argument("--eval-batch-size", type=int, default=64)
    parser.add_argument("--max-eval-samples", type=int, default=None, help="score only the first N pairs (smoke)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where the models decode (training: the Trainer's choice)")
    return parser


def parse_command_line(argv: Sequence[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    missing = [name for name in ("train.jsonl", *SPLITS.values()) if not (args.data / name).is_file()]
    if missing:
        raise SystemExit(f"convergence.py: --data {args.data} lacks {', '.join(missing)}")
    if args.last_n < 1:
        raise SystemExit(f"convergence.py: --last-n must be at least 1, got {args.last_n}")
    for option, values in (("--systems", args.systems), ("--seeds", args.seeds)):
        repeated = sorted({str(value) for value in values if values.count(value) > 1})
        if repeated:
            raise SystemExit(f"convergence.py: {option} names {', '.join(repeated)} more than once (each run counts "
                             "once in a table)")
    args.device_name = device_name(args.device)
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_command_line(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(args.threads)
    records = {system: [run_one(system, seed, args) for seed in args.seeds] for system in args.systems}
    first = records[args.systems[0]][0]
    adopt_run_settings(args, [run for runs in records.values() for run in runs], RUN_SETTINGS, "convergence.py")
    results = {
        "settings": json_settings(args),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": first["device"],
        "signature": first["scores"]["averaged"]["test"]["bleu_signature"],
        "systems": summarize(records),
        "runs": records,
    }
    seeds = {system: [record["seed"] for record in runs] for system, runs in records.items()}
    tests = paired_tests(seeds, args.baseline, "averaged", weights_hypotheses(args.work, "averaged"), args,
                         "convergence.py")
    if tests is not None:
        results["paired_tests"] = tests
    gather_run_records(results)
    write_results(args.out, "convergence", results, markdown(results),
                  {name: lines for weights in ("final", "averaged")
                   for name, lines in kept_hypotheses(seeds, weights_hypotheses(args.work, weights), weights).items()})
    return results


if __name__ == "__main__":
    main()
