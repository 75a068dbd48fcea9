r"""Do relative positions translate inputs longer than any in training better than absolute ones?

Trained models (recipes and the peer, given as `--model SYSTEM:SEED=FOLDER`, e.g. the one-commit runs of
vs_marian.py or convergence.py) translate levels built from Multi30k's test2016 and validation sets:

- `1 caption`: the set as it is (the reference level);
- `K as sentences` (K = 2, 3, 4): K consecutive captions in one input, as the sentences they are;
- `K as one sentence`: the same K captions joined into one sentence with " and " (" und " on the German side): each
  caption but the last loses its final punctuation, each but the first its capital where the word is not a noun
  (`lowercase_start`);
- `longest 10 %`: the tenth of the set with the longest sources (in words).

Each level is scored with cased sacreBLEU and chrF (the sacrebleu library, signatures kept) and the
hypothesis/reference length ratio; per system, the mean and min-max over seeds. Per seed and level, the record also
counts the outputs that used every new token their cap allowed (those the cap may have cut). Every model is decoded
by the same function (vs_marian.translate_marking_caps: beam 4, length penalty 0.6 by default, batches sorted by
source length) under a source-relative cap (at most `--max-len-a` x source tokens + `--max-len-b` new tokens, per
source, for the peer too), without sentence splitting: the level measures the model, not the tools'
splitter. Models are only read; nothing is trained here. The records go to `<out>/long_inputs.{json,md}`; experiments/report.py renders them
into docs/results.md and feeds each level to the rule that chooses the default position_scheme.

A model's scores are kept beside it (`<folder>/long_inputs_scores.json`, with the decoding settings, the levels'
sizes, a digest of their text and the code version that decoded them) and reused when the same settings meet the same
levels again: models can
be scored by separate invocations (one per core, each with its own `--out`) and the table collected by one more
invocation over all of them, which then decodes nothing. With `--baseline SYSTEM` every other system is tested
against the baseline's model of the same seed on `--paired-levels` (single captions and the largest size as one
sentence by default): the BLEU difference and its paired bootstrap p-value (Koehn 2004, sacreBLEU's test), from the
hypotheses kept with the scores (a model scored before they were kept is decoded again).

  python experiments/long_inputs.py --data ../shared/data/multi30k --out docs/results/long_inputs/equal_budget \
      --model absolute:1=/tmp/exp/absolute/seed1/model --model directional:1=/tmp/exp/directional/seed1/model \
      --model peer+recipe-tokenizer:1=/tmp/exp/peer+recipe-tokenizer/seed1/model ...
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import torch
from settings import json_settings
from vs_marian import (
    PAIRED_RESAMPLES,
    Decoding,
    load_trained,
    paired_cell,
    paired_test_results,
    read_pairs,
    spread,
    translate_marking_caps,
    write_results,
)

from hf_relpos.publish.records import (
    PEER,
    RECIPE,
    RECORDS,
    TRAINED_WEIGHTS,
    RunRecord,
    Scores,
    checkout_version,
    cpu_model_name,
    software_versions,
    training_record,
)
from hf_relpos.translation.metrics import score_translations
from hf_relpos.translation.safety import output_folder

ROOT = Path(__file__).resolve().parents[1]
SETS = {"test2016": "test.jsonl", "validation": "validation.jsonl"}
JOINING_WORD = {"en": "and", "de": "und"}
# German words that open a caption and are written in lowercase inside a sentence (articles, numerals, pronouns,
# quantifiers); any other first word (a noun, a name) keeps its capital.
GERMAN_LOWERCASE_STARTS = frozenset(
    "ein eine einer eines einem einen der die das des dem den zwei drei vier fünf sechs sieben acht neun zehn "
    "mehrere viele einige manche alle beide zwei dieser diese dieses jemand er sie es wir man ihr hier dort da "
    "im in am an auf bei mit vor nach unter über neben zwischen während von zu aus".split()
)
SIZES = (2, 3, 4)
LONGEST_FRACTION = 0.1
METRICS = ("bleu", "chrf", "length_ratio")


def lowercase_start(caption: str, language: str) -> str:
    """`caption` as it reads inside a sentence: English lowercases its first letter unless the first word is "I" or
    an acronym (all capitals); German only when the first word is one of GERMAN_LOWERCASE_STARTS."""
    first = caption.split(maxsplit=1)[0] if caption.strip() else ""
    if language == "de":
        keep = first.lower().strip(",.;:") not in GERMAN_LOWERCASE_STARTS
    else:
        keep = first == "I" or (len(first) > 1 and first.isupper())
    return caption if keep or not caption else caption[0].lower() + caption[1:]


def join_as_one_sentence(captions: Sequence[str], language: str) -> str:
    """The captions as one sentence: "A man runs." + "A dog barks." -> "A man runs and a dog barks."."""
    parts = [caption.strip() for caption in captions]
    parts = [part.rstrip(" .!?;") for part in parts[:-1]] + parts[-1:]
    parts = parts[:1] + [lowercase_start(part, language) for part in parts[1:]]
    return f" {JOINING_WORD[language]} ".join(parts)


def join_as_sentences(captions: Sequence[str]) -> str:
    return " ".join(caption.strip() for caption in captions)


def build_levels(sources: Sequence[str], references: Sequence[str], source_lang: str, target_lang: str,
                 sizes: Sequence[int] = SIZES, longest_fraction: float = LONGEST_FRACTION
                 ) -> dict[str, tuple[list[str], list[str]]]:
    """Level name -> (sources, references): the set, K consecutive captions (in file order, the last incomplete
    group dropped) as sentences and as one sentence, and the longest sources (in words; ties in file order)."""
    levels = {"1 caption": (list(sources), list(references))}
    for size in sizes:
        groups = [range(start, start + size) for start in range(0, len(sources) - size + 1, size)]
        levels[f"{size} as sentences"] = ([join_as_sentences([sources[i] for i in group]) for group in groups],
                                          [join_as_sentences([references[i] for i in group]) for group in groups])
        levels[f"{size} as one sentence"] = (
            [join_as_one_sentence([sources[i] for i in group], source_lang) for group in groups],
            [join_as_one_sentence([references[i] for i in group], target_lang) for group in groups])
    count = max(1, round(len(sources) * longest_fraction))
    longest = sorted(sorted(range(len(sources)), key=lambda index: -len(sources[index].split()))[:count])
    levels[f"longest {round(100 * longest_fraction)} %"] = ([sources[i] for i in longest],
                                                            [references[i] for i in longest])
    return levels


def parse_model(spec: str) -> tuple[str, int, Path]:
    """SYSTEM:SEED=FOLDER -> (system, seed, folder)."""
    name, separator, folder = spec.partition("=")
    system, colon, seed = name.rpartition(":")
    if not separator or not colon or not system or not seed.isdigit() or not folder:
        raise argparse.ArgumentTypeError(f"--model {spec!r}: expected SYSTEM:SEED=FOLDER, e.g. absolute:1=/tmp/m")
    return system, int(seed), Path(folder)


def is_peer(folder: Path) -> bool:
    """A transformers MarianMTModel folder (the peer) rather than an hf_relpos one."""
    return json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type") == "marian"


def evaluate_model(folder: Path, levels: dict[str, dict[str, tuple[list[str], list[str]]]], decoding: Decoding,
                   args: argparse.Namespace) -> tuple[dict[str, dict], dict[str, list[str]]]:
    """`set: level` -> sacreBLEU, chrF, length ratio (and signatures, decoding seconds, the number of outputs that
    used every new token their cap allowed) of one saved model, and `set: level` -> its translations."""
    model, tokenizer = load_trained(folder, is_peer(folder), args.device)
    scores, translations = {}, {}
    for set_name, set_levels in levels.items():
        for level, (sources, references) in set_levels.items():
            started = time.perf_counter()
            hypotheses, at_cap = translate_marking_caps(model, tokenizer, sources, decoding, args.eval_batch_size)
            scored = score_translations(hypotheses, references, target_lang=args.target_lang)
            scores[f"{set_name}: {level}"] = {**scored, "at_cap": sum(at_cap),
                                              "decode_seconds": time.perf_counter() - started}
            translations[f"{set_name}: {level}"] = hypotheses
    return scores, translations


SCORES_FILE = "long_inputs_scores.json"
# The settings a model's kept scores depend on: the levels (sizes, pairs, languages) and the decoding.
SCORED_WITH = ("sizes", "max_pairs", "source_lang", "target_lang", "beams", "length_penalty", "max_len_a", "max_len_b",
               "min_len_a", "no_repeat_ngram_size", "max_new_tokens", "eval_batch_size")


def levels_digest(levels: dict[str, dict[str, tuple[list[str], list[str]]]]) -> str:
    """SHA-256 of every level's sources and references: the levels' text itself, so that kept scores are not reused
    for other data of the same size (another `--data`, e.g. a test set of as many lines) or for levels that a change
    of their construction (the joining, the longest tenth) has changed."""
    return hashlib.sha256(json.dumps(levels, ensure_ascii=False, sort_keys=True).encode("utf-8")).hexdigest()


def scoring_key(args: argparse.Namespace, levels: dict[str, dict[str, tuple[list[str], list[str]]]]) -> dict:
    """What a model's scores were computed under: the settings of SCORED_WITH, the number of inputs per level and
    the digest of the levels' text (an entry kept before the digest was part of the key is not reused: what it
    scored cannot be told)."""
    level_sizes = {f"{set_name}: {level}": len(pair[0]) for set_name, set_levels in levels.items()
                   for level, pair in set_levels.items()}
    return {**{name: getattr(args, name) for name in SCORED_WITH}, "level_sizes": level_sizes,
            "levels_sha256": levels_digest(levels)}


def kept_entries(folder: Path) -> list[dict]:
    """Every scoring kept beside `folder` (one per scoring key; a file of one entry, as first written, is a list of
    one)."""
    path = folder / SCORES_FILE
    if not path.is_file():
        return []
    kept = json.loads(path.read_text(encoding="utf-8"))
    return kept if isinstance(kept, list) else [kept]


def same_key(entry: dict, key: dict) -> bool:
    """Whether a kept entry was scored under `key`; a setting added to SCORED_WITH after the entry was written
    counts as unset (None) there."""
    return {**dict.fromkeys(SCORED_WITH), **entry.get("key", {})} == key


def kept_scores(folder: Path, key: dict) -> dict | None:
    """The scores kept beside `folder` for exactly `key`, with the code version that decoded them; else None."""
    return next((entry for entry in kept_entries(folder) if same_key(entry, key)), None)


def keep_scores(folder: Path, key: dict, scores: dict[str, dict], hypotheses: dict[str, list[str]]) -> dict:
    """Add `scores` and the `hypotheses` they score under `key` to those kept beside `folder` (replacing an entry of
    the same key) and return the kept entry. The file is written whole or not at all, under a lock, so that
    invocations scoring the same model with other settings at the same time keep each other's entries."""
    kept = {"key": key, "source_version": checkout_version(ROOT), "date": datetime.now(UTC).isoformat(
        timespec="seconds"), "scores": scores, "hypotheses": hypotheses}
    with open(folder / f".{SCORES_FILE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        entries = [entry for entry in kept_entries(folder) if not same_key(entry, key)] + [kept]
        staged = folder / f".{SCORES_FILE}.partial"
        staged.write_text(json.dumps(entries, indent=1) + "\n", encoding="utf-8")
        staged.replace(folder / SCORES_FILE)
    return kept


def paired_levels(args: argparse.Namespace) -> list[str]:
    """The levels tested against `--baseline`: `--paired-levels`, else single captions and the largest size as one
    sentence (with the default sizes, the levels of the options' criterion)."""
    return args.paired_levels or ["1 caption", f"{max(args.sizes)} as one sentence"]


def level_paired_tests(args: argparse.Namespace, levels: dict[str, dict[str, tuple[list[str], list[str]]]],
                       seeds: dict[str, list[int]], hypotheses: dict[tuple[str, int], dict[str, list[str]]]
                       ) -> dict | None:
    """Each system against `--baseline` of the same seed on each set's paired levels (`paired_test_results`); None
    without a baseline or when no pair was tested."""
    if args.baseline is None:
        return None
    references = {f"{set_name}: {level}": set_levels[level][1] for set_name, set_levels in levels.items()
                  for level in paired_levels(args)}
    systems, signature = paired_test_results(
        seeds, args.baseline, references, lambda system, seed, name: hypotheses.get((system, seed), {}).get(name),
        "long_inputs.py", target_lang=args.target_lang)
    if signature is None:
        return None
    return {"baseline": args.baseline, "resamples": PAIRED_RESAMPLES, "signature": signature,
            "levels": list(references), "systems": systems}


def paired_table(tests: dict) -> list[str]:
    """Markdown lines: each system against the baseline, per level and seed: BLEU difference (p-value)."""
    lines = ["", "## Against the baseline", "",
             f"Each system against `{tests['baseline']}` of the same seed: BLEU difference (p-value of paired bootstrap "
             f"resampling, Koehn 2004, {tests['resamples']} resamples), per seed. Signature: `{tests['signature']}`.",
             "", "| system | " + " | ".join(tests["levels"]) + " |", "|" + " --- |" * (len(tests["levels"]) + 1)]
    for system, by_level in tests["systems"].items():
        cells = [paired_cell(by_level.get(level, {})) for level in tests["levels"]]
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    return lines


def typed_record(system: str, seed: int, folder: Path, scores: dict[str, dict]) -> RunRecord:
    """A scored model as hf_relpos' typed run record: the one train_translation.py wrote when it trained it (its
    recipe and settings; else only its role: a peer, or an hf_relpos model), with this run's scores of every level
    (`set: level`) as its splits."""
    trained = training_record(folder) or RunRecord(role=PEER if is_peer(folder) else RECIPE)
    return replace(trained, system=system, seed=seed,
                   scores={TRAINED_WEIGHTS: {level: Scores.of(values) for level, values in scores.items()}})


def summarize(runs: dict[str, list[dict]]) -> dict[str, dict[str, dict[str, list[float]]]]:
    """`set: level` -> system -> seeds and each metric per seed (and the outputs at the cap per seed, where every
    seed's scores count them: scores kept before they were counted do not)."""
    levels = list(next(iter(runs.values()))[0]["scores"])
    return {level: {system: {"seeds": [run["seed"] for run in system_runs],
                             **{metric: [run["scores"][level][metric] for run in system_runs] for metric in METRICS},
                             **({"at_cap": [run["scores"][level]["at_cap"] for run in system_runs]}
                                if all("at_cap" in run["scores"][level] for run in system_runs) else {})}
                    for system, system_runs in runs.items()}
            for level in levels}


def markdown(results: dict) -> str:
    """One table per set: a row per system, a column per level, each cell BLEU (min-max) / chrF / hyp/ref."""
    settings = results["settings"]
    minimum = settings.get("min_len_a")
    at_least = f"at least {minimum} x source tokens (rounded down) and " if minimum is not None else ""
    blocked = settings.get("no_repeat_ngram_size")
    no_repeat = f", no repeated {blocked}-gram" if blocked is not None else ""
    lines = [
        "# Long inputs: captions joined as sentences and as one sentence, and the longest sources",
        "",
        f"Beam {settings['beams']}, length penalty {settings['length_penalty']}, {at_least}at most "
        f"{settings['max_len_a']} x source tokens + {settings['max_len_b']} new tokens per source{no_repeat}, no sentence "
        f"splitting. Cells: BLEU mean "
        f"(min-max over seeds) / chrF mean / hypothesis-reference length ratio mean. Device: {results['device']}.",
        f"sacreBLEU signatures: `{results['signatures']['bleu']}`, `{results['signatures']['chrf']}`.",
    ]
    for set_name in SETS:
        names = [level for level in results["levels"] if level.startswith(f"{set_name}: ")]
        if not names:
            continue
        lines += ["", f"## {set_name}", "",
                  "| system | seeds | " + " | ".join(f"{name.split(': ', 1)[1]} ({results['sizes'][name]})"
                                                    for name in names) + " |",
                  "|" + " --- |" * (len(names) + 2)]
        for system in results["levels"][names[0]]:
            cells = []
            for name in names:
                row = results["levels"][name][system]
                cells.append(f"{spread(row['bleu'])} / {statistics.mean(row['chrf']):.1f} / "
                             f"{statistics.mean(row['length_ratio']):.3f}")
            seeds = ", ".join(map(str, results["levels"][names[0]][system]["seeds"]))
            lines.append(f"| {system} | {seeds} | " + " | ".join(cells) + " |")
    joined = [level for level in results["levels"] if " as " in level]
    if joined:
        lines += ["", "## BLEU kept", "",
                  "Each joined level's BLEU as a percentage of the same model's BLEU on the set's single captions "
                  "(`1 caption`), per seed; mean (min-max).", "",
                  "| system | " + " | ".join(joined) + " |", "|" + " --- |" * (len(joined) + 1)]
        for system in results["levels"][joined[0]]:
            cells = [spread(kept, 0) if (kept := bleu_kept(results, level, system)) else "-" for level in joined]
            lines.append(f"| {system} | " + " | ".join(cells) + " |")
    lines += cap_table(results)
    lines += options_table(results)
    if "paired_tests" in results:
        lines += paired_table(results["paired_tests"])
    return "\n".join(lines) + "\n"


def cap_table(results: dict) -> list[str]:
    """Markdown lines: per system and level, the outputs that used every new token their cap allowed, per seed
    (systems whose scores do not count them are left out; nothing when none does)."""
    levels = list(results["levels"])
    systems = [system for system in results["levels"][levels[0]]
               if all("at_cap" in results["levels"][level][system] for level in levels)]
    if not systems:
        return []
    lines = ["", "## Outputs at the length cap", "",
             "Per level, the outputs that used every new token the source-relative cap allowed them (the cap forces "
             "the end token there, so such an output may have been cut; one that ends on its own at that length "
             "counts too), per seed, of the level's inputs.", "",
             "| system | " + " | ".join(f"{level} ({results['sizes'][level]})" for level in levels) + " |",
             "|" + " --- |" * (len(levels) + 1)]
    for system in systems:
        lines.append(f"| {system} | " + " | ".join(" / ".join(map(str, results["levels"][level][system]["at_cap"]))
                                                    for level in levels) + " |")
    return lines


# The length-generalization options (a recipe trained with one, system "<recipe>+<option>") and the criterion
# for adopting one, stated in docs/results.md 5b before their first number: with at least OPTION_SEEDS
# seeds each, (a) at OPTION_LEVEL its mean share of single-caption BLEU kept leads the recipe's by more than the
# recipe's seed spread on validation and is not below it on test2016, (b) its mean single-caption BLEU is at most
# OPTION_COST below the recipe's on both sets.
OPTION_LEVEL = "4 as one sentence"
OPTION_SEEDS = 2
OPTION_COST = 0.3


def option_verdict(results: dict, option: str, recipe: str) -> tuple[str, dict[str, float]]:
    """("adopted" | "not adopted: <every failed part>" | "not decided: <why>", figures) for `option` against
    `recipe` by the criterion above (too few seeds decide nothing: "not decided", with the parts failed so far);
    figures: mean % kept at OPTION_LEVEL per set (option, recipe), the recipe's validation spread of it, and the
    single-caption BLEU difference per set."""
    figures: dict[str, float] = {}
    for set_name in SETS:
        level = f"{set_name}: {OPTION_LEVEL}"
        option_kept, recipe_kept = bleu_kept(results, level, option), bleu_kept(results, level, recipe)
        if not option_kept or not recipe_kept:
            return f"not decided: no single-caption BLEU on {set_name}", figures
        figures[f"{set_name} kept"] = statistics.mean(option_kept)
        figures[f"{set_name} recipe kept"] = statistics.mean(recipe_kept)
        figures[f"{set_name} recipe spread"] = max(recipe_kept) - min(recipe_kept)
        single = results["levels"][f"{set_name}: 1 caption"]
        figures[f"{set_name} 1 caption difference"] = (statistics.mean(single[option]["bleu"])
                                                      - statistics.mean(single[recipe]["bleu"]))
    seeds = {name: len(results["levels"][f"test2016: {OPTION_LEVEL}"][name]["seeds"]) for name in (option, recipe)}
    failed = []
    lead = figures["validation kept"] - figures["validation recipe kept"]
    if lead <= figures["validation recipe spread"]:
        failed.append(f"validation kept {lead:+.1f} points against the recipe's, not beyond its seed spread "
                      f"{figures['validation recipe spread']:.1f}")
    if figures["test2016 kept"] < figures["test2016 recipe kept"]:
        failed.append("test2016 kept below the recipe's")
    failed += [f"{set_name} single captions {figures[f'{set_name} 1 caption difference']:+.2f} BLEU"
               for set_name in SETS if figures[f"{set_name} 1 caption difference"] < -OPTION_COST]
    if min(seeds.values()) < OPTION_SEEDS:
        return (f"not decided: {option} {seeds[option]}, {recipe} {seeds[recipe]} seed(s), {OPTION_SEEDS} needed"
                + ("; failed so far: " + "; ".join(failed) if failed else "")), figures
    return ("not adopted: " + "; ".join(failed)) if failed else "adopted", figures


def option_rows(results: dict) -> list[tuple[str, str]]:
    """(option, recipe) for each system named "<recipe>+<option>" whose recipe is a system of the record too; none
    when the record lacks the criterion's level (OPTION_LEVEL, of `--sizes` 4)."""
    if f"test2016: {OPTION_LEVEL}" not in results["levels"]:
        return []
    systems = list(results["levels"][next(iter(results["levels"]))])
    return [(system, recipe) for system in systems
            if "+" in system and (recipe := system.split("+", 1)[0]) in systems]


def options_table(results: dict) -> list[str]:
    """Markdown lines: each option against its recipe by `option_verdict` (nothing when the record has none)."""
    rows = option_rows(results)
    if not rows:
        return []
    lines = ["", "## Options against their recipe", "",
             f"The criterion (docs/results.md 5b, stated before any option's score was read): with at least "
             f"{OPTION_SEEDS} seeds each, at `{OPTION_LEVEL}` the option's mean % of single-caption BLEU kept leads "
             f"the recipe's by more than the recipe's seed spread on validation and is not below it on test2016, and "
             f"its single-caption BLEU is at most {OPTION_COST} below the recipe's on both sets.", "",
             "| option | recipe | seeds | kept, validation (recipe, its spread) | kept, test2016 (recipe) | "
             "1 caption, BLEU difference: test2016 / validation | verdict |", "|" + " --- |" * 7]
    for option, recipe in rows:
        verdict, figures = option_verdict(results, option, recipe)
        seeds = ", ".join(map(str, results["levels"][f"test2016: {OPTION_LEVEL}"][option]["seeds"]))
        if "validation kept" not in figures:
            lines.append(f"| {option} | {recipe} | {seeds} | - | - | - | {verdict} |")
            continue
        lines.append(
            f"| {option} | {recipe} | {seeds} | {figures['validation kept']:.1f} ({figures['validation recipe kept']:.1f}, "
            f"{figures['validation recipe spread']:.1f}) | {figures['test2016 kept']:.1f} "
            f"({figures['test2016 recipe kept']:.1f}) | {figures['test2016 1 caption difference']:+.2f} / "
            f"{figures['validation 1 caption difference']:+.2f} | {verdict} |")
    return lines


# The decoding study for long inputs (docs/results.md 5b, each criterion stated before its first number on a
# recipe model): a decoding option, a source-relative minimum length (--min-len-a) or blocked repeated n-grams
# (--no-repeat-ngram-size), against the same models decoded without it. It becomes the recipes' saved default only if
# on validation it raises BLEU at OPTION_LEVEL for every model and lowers none's single-caption BLEU by more than
# DECODING_OPTION_COST.
DECODING_OPTION_COST = 0.1


def paired_bleu(results: dict, level: str) -> dict[tuple[str, int], float]:
    """(system, seed) -> BLEU on `level` (a record's every scored model)."""
    return {(system, seed): bleu for system, row in results["levels"][level].items()
            for seed, bleu in zip(row["seeds"], row["bleu"], strict=True)}


def decoding_verdict(baseline: dict, candidate: dict) -> tuple[str, dict[str, float]]:
    """("adoptable" | "not adoptable: <every failed part>", figures) for `candidate` (the same models decoded with a
    decoding option) against `baseline` by the criterion above; figures: the mean validation BLEU change at
    OPTION_LEVEL and on single captions over the models, and the smallest change at OPTION_LEVEL."""
    joined, single = f"validation: {OPTION_LEVEL}", "validation: 1 caption"
    models = sorted(paired_bleu(baseline, joined))
    if sorted(paired_bleu(candidate, joined)) != models:
        return "not adoptable: the two records score different models", {}
    gains = {level: {model: paired_bleu(candidate, level)[model] - paired_bleu(baseline, level)[model]
                     for model in models} for level in (joined, single)}
    failed = [f"{system} seed {seed}: {OPTION_LEVEL} {gains[joined][(system, seed)]:+.2f} BLEU"
              for system, seed in models if gains[joined][(system, seed)] <= 0]
    failed += [f"{system} seed {seed}: 1 caption {gains[single][(system, seed)]:+.2f} BLEU"
               for system, seed in models if round(gains[single][(system, seed)], 2) < -DECODING_OPTION_COST]  # as reported
    figures = {"joined gain": statistics.mean(gains[joined].values()), "smallest joined gain": min(gains[joined].values()),
               "single gain": statistics.mean(gains[single].values())}
    return ("not adoptable: " + "; ".join(failed)) if failed else "adoptable", figures


def bleu_kept(results: dict, level: str, system: str) -> list[float]:
    """Per seed, 100 x BLEU on `level` / BLEU on its set's `1 caption` level (empty when a single-caption BLEU is 0)."""
    single = results["levels"][f"{level.split(': ', 1)[0]}: 1 caption"][system]["bleu"]
    joined = results["levels"][level][system]["bleu"]
    return [] if 0 in single else [100 * value / base for value, base in zip(joined, single, strict=True)]


def build_parser() -> argparse.ArgumentParser:
    """long_inputs.py's options (report.py writes a record's command line from their defaults)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="folder with test.jsonl and validation.jsonl")
    parser.add_argument("--out", type=output_folder, required=True, help="where long_inputs.{json,md} go")
    parser.add_argument("--model", type=parse_model, action="append", required=True, metavar="SYSTEM:SEED=FOLDER",
                        help="a trained model folder (hf_relpos or MarianMTModel with its tokenizer); repeat")
    parser.add_argument("--source-lang", default="en")
    parser.add_argument("--target-lang", default="de")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="captions per joined input")
    parser.add_argument("--max-pairs", type=int, help="use only the first N pairs of each set (a quick check)")
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--length-penalty", type=float, default=0.6)
    parser.add_argument("--max-len-a", type=float, default=1.0, help="new tokens per source token (fairseq's)")
    parser.add_argument("--max-len-b", type=int, default=50, help="new tokens beyond max-len-a x source tokens")
    parser.add_argument("--min-len-a", type=float, help="new tokens before the end token, at least, per source token "
                        "(rounded down; default: no minimum)")
    parser.add_argument("--no-repeat-ngram-size", type=int, metavar="N",
                        help="no output repeats an N-gram of tokens (transformers' no_repeat_ngram_size; default: none)")
    parser.add_argument("--max-new-tokens", type=int, default=1000, help="ceiling for every output")
    parser.add_argument("--eval-batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--baseline", metavar="SYSTEM",
                        help="test every other system against this one of the same seed (paired bootstrap)")
    parser.add_argument("--paired-levels", nargs="+", metavar="LEVEL",
                        help="levels of the paired tests (default: '1 caption' and the largest size 'as one sentence')")
    return parser


def parse_command_line(argv: Sequence[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    missing = [name for name in SETS.values() if not (args.data / name).is_file()]
    if missing:
        parser.error(f"--data {args.data} lacks {', '.join(missing)}")
    if args.min_len_a is not None and not 0 <= args.min_len_a <= args.max_len_a:
        parser.error(f"--min-len-a must be between 0 and --max-len-a ({args.max_len_a}), got {args.min_len_a}")
    if args.no_repeat_ngram_size is not None and args.no_repeat_ngram_size < 1:
        parser.error(f"--no-repeat-ngram-size must be at least 1, got {args.no_repeat_ngram_size}")
    if min(args.sizes) < 2:
        parser.error(f"--sizes must be at least 2 (1 caption is always a level), got {args.sizes}")
    runs = [f"{system}:{seed}" for system, seed, _ in args.model]
    repeated = sorted({run for run in runs if runs.count(run) > 1})
    if repeated:
        parser.error(f"--model names {', '.join(repeated)} more than once (each SYSTEM:SEED counts once per level)")
    systems = list(dict.fromkeys(system for system, _, _ in args.model))
    if args.paired_levels and args.baseline is None:
        parser.error("--paired-levels needs --baseline (the system the others are tested against)")
    if args.baseline is not None and args.baseline not in systems:
        parser.error(f"--baseline must be one of the --model systems ({', '.join(systems)}), got {args.baseline!r}")
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_command_line(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(args.threads)
    levels = {}
    for set_name, file_name in SETS.items():
        sources, references = read_pairs(args.data / file_name, args.source_lang, args.target_lang)
        limit = args.max_pairs or len(sources)
        levels[set_name] = build_levels(sources[:limit], references[:limit], args.source_lang, args.target_lang,
                                        args.sizes)
    names = list(next(iter(levels.values())))
    unknown = [level for level in args.paired_levels or () if level not in names]
    if unknown:
        raise SystemExit(f"long_inputs.py: --paired-levels: unknown {', '.join(map(repr, unknown))}; the levels are "
                         f"{', '.join(map(repr, names))}")
    # checked here, not in parse_command_line: convergence_gpu.sh parses these arguments before the models exist
    unsaved = [f"{system}:{seed}={folder}" for system, seed, folder in args.model if not (folder / "config.json").is_file()]
    if unsaved:
        raise SystemExit(f"long_inputs.py: --model: no saved model (config.json) in {', '.join(unsaved)}")
    decoding = Decoding(args.beams, args.length_penalty, args.max_new_tokens, args.max_len_b, args.max_len_a,
                        args.min_len_a, args.no_repeat_ngram_size)
    key = scoring_key(args, levels)
    level_sizes = key["level_sizes"]
    runs: dict[str, list[dict]] = {}
    records, hypotheses = [], {}
    for system, seed, folder in args.model:
        kept = kept_scores(folder, key)
        if kept is None or (args.baseline is not None and "hypotheses" not in kept):
            kept = keep_scores(folder, key, *evaluate_model(folder, levels, decoding, args))
        scores, hypotheses[system, seed] = kept["scores"], kept.get("hypotheses", {})
        runs.setdefault(system, []).append({"seed": seed, "folder": str(folder), "scored_by": kept["source_version"],
                                            "scores": scores})
        records.append(typed_record(system, seed, folder, scores).to_json())
        print(f"{system} seed {seed}: " + ", ".join(f"{level} {score['bleu']:.2f}" for level, score in scores.items()),
              flush=True)
    first = next(iter(runs.values()))[0]["scores"]
    results = {
        "settings": {**json_settings(args), "model": [f"{system}:{seed}={folder}" for system, seed, folder in args.model]},
        "source_version": checkout_version(ROOT), "versions": software_versions(),
        "device": cpu_model_name() if args.device == "cpu" else args.device,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "sizes": level_sizes,
        "signatures": {metric: first[next(iter(first))][f"{metric}_signature"] for metric in ("bleu", "chrf")},
        "levels": summarize(runs), "runs": runs, RECORDS: records,
    }
    seeds = {system: [run["seed"] for run in system_runs] for system, system_runs in runs.items()}
    tests = level_paired_tests(args, levels, seeds, hypotheses)
    if tests is not None:
        results["paired_tests"] = tests
    write_results(args.out, "long_inputs", results, markdown(results),
                  {f"{system} seed {seed}: {level}": lines for (system, seed), by_level in hypotheses.items()
                   for level, lines in by_level.items()})
    return results


if __name__ == "__main__":
    main()
