r"""Every figure README.md and docs/ quote, rendered from the committed records under docs/results/.

A generated passage sits between `<!-- generated: NAME -->` and `<!-- end: NAME -->` in a Markdown file; this script
re-renders each from its records (with the experiments' own table writers: vs_marian.py, convergence.py,
benchmarks/bench_*.py) and writes the files back. `--check` writes nothing and exits 1 naming every passage whose text
differs from its records (tests/test_docs_figures.py runs it). A figure outside such a passage is not allowed in the
README or docs/ pages other than docs/archive/ (kept as it was written, history).

  python experiments/report.py           # rewrite the generated passages of README.md and docs/*.md
  python experiments/report.py --check   # exit 1 when a passage and its records disagree
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "experiments"), str(ROOT)]

import convergence  # noqa: E402
import long_inputs  # noqa: E402
import marian_conversion  # noqa: E402
import vs_marian  # noqa: E402
from settings import command_line  # noqa: E402

from benchmarks import (  # noqa: E402
    bench_data,
    bench_decoding,
    bench_inference,
    bench_training,
    step_timeline,
    tune_relpos_triton,
)
from benchmarks.common import markdown_table  # noqa: E402
from hf_relpos.model.configuration_relpos import RelPosTransformerConfig  # noqa: E402
from hf_relpos.model.positions import built_in_schemes  # noqa: E402
from hf_relpos.publish.files import write_text_atomic  # noqa: E402
from hf_relpos.publish.records import RECIPE, TRAINED_WEIGHTS, RunRecord, load_yaml, read_run_records  # noqa: E402
from hf_relpos.translation.arguments import ARGUMENT_CLASSES  # noqa: E402

RESULTS = ROOT / "docs" / "results"
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
# Options of the experiments that are modes of the invocation that collected a record, no setting of its runs.
INVOCATION_MODES = ("collect_only", "list", "decoding_study")
PASSAGE = re.compile(r"(<!-- generated: (?P<name>[a-z0-9_]+) -->\n)(?P<body>.*?)(<!-- end: (?P=name) -->)", re.DOTALL)

# The order of the README's scheme rows: the schemes as the records first measured them, then every other scheme
# hf_relpos ships, in registration order (its rows say "not measured").
MEASURED_ORDER = ("absolute", "shaw", "xl", "directional", "rope", "alibi", "t5", "none")
SCHEMES = (*(scheme for scheme in MEASURED_ORDER if scheme in built_in_schemes()),
           *(scheme for scheme in built_in_schemes() if scheme not in MEASURED_ORDER))
# The row of vs_marian/eight_schemes_three_seeds that trained each scheme at the equal budget, Marian's architecture.
EQUAL_BUDGET_ROWS = {"absolute": "marian-matched", "shaw": "shaw-matched+t2t-table-init",
                     **{scheme: f"{scheme}-matched" for scheme in MEASURED_ORDER[2:]}}
# The recipe file of each scheme that has one in configs/ (`none`, the position-blind control, has none).
RECIPES = {scheme: path for scheme in SCHEMES if (ROOT / (path := f"configs/multi30k_small_{scheme}.yaml")).is_file()}
RECIPE_SCHEMES = {Path(path).stem: scheme for scheme, path in RECIPES.items()}   # recipe name -> its scheme
UNMEASURED = "not measured"
# The recipes and the peer (on the recipes' tokenizer) at the equal budget, every run from one commit.
ONE_COMMIT = "vs_marian/recipes_one_commit/vs_marian.json"
TWENTY_EPOCHS_ONE_COMMIT = "convergence/one_commit_seeds_1_2/convergence.json"
# The third seed of every row of TWENTY_EPOCHS_ONE_COMMIT, trained later from another commit on
# another GPU (an H200), with every recipe as committed then (xl's attention dropout 0.1 among them).
TWENTY_EPOCHS_SEED_3 = "convergence/seed_3_d34293a/convergence.json"
# Data preparation at WMT scale on the 2-core CPU machine (benchmarks/bench_data.py).
DATA_PREPARATION = "benchmarks/data_preparation/cpu_2core.json"
# Model settings runs trained with that their record, written before runs recorded their model, does not hold: the
# `xl` rows of the one-commit records ran with attention dropout 0, the recipe then.
UNRECORDED_MODEL_SETTINGS = {(ONE_COMMIT, "xl"): {"attention_dropout": 0.0},
                             (TWENTY_EPOCHS_ONE_COMMIT, "xl"): {"attention_dropout": 0.0}}
# The one-commit record's row that is the recipe as committed now (its `xl` row ran with the settings above).
ONE_COMMIT_RECIPE_ROWS = {"xl": "xl+attention-dropout-0.1"}
# The recipes the one-commit record lacks, trained later at the same equal budget from another commit (and CPU): shown
# in the same column with that said, and left out of the rule's one-commit columns.
LATER_EQUAL_BUDGET = "vs_marian/alibi_t5_equal_budget/vs_marian.json"


def read(relative: str) -> dict:
    return json.loads((RESULTS / relative).read_text(encoding="utf-8"))


def seeds_and_spread(values: list[float], digits: int = 2) -> str:
    """`mean (min-max), N seeds` (vs_marian.spread plus the seed count)."""
    count = f"{len(values)} seed{'s' if len(values) > 1 else ''}"
    return f"{vs_marian.spread(values, digits)}, {count}"


def table(header: list[str], rows: Iterable[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def code_versions(runs: Iterable[RunRecord]) -> str:
    """The distinct `git describe` of the code that trained the runs (`-dirty`: with uncommitted changes)."""
    versions = sorted({run.source_version or "not recorded" for run in runs})
    return ", ".join(f"`{version}`" for version in versions)


def release_versions(runs: Iterable[RunRecord]) -> str:
    """The distinct torch / transformers releases the runs trained with ("not recorded" for runs older than the
    record field)."""
    versions = sorted({f"torch {run.software['torch']}, transformers {run.software['transformers']}"
                       if run.software else "not recorded" for run in runs})
    return "; ".join(versions)


def provenance(record: dict, path: str, command: str) -> str:
    """Date, hardware, code versions and the command of one record (what a reader needs to rerun it)."""
    runs = read_run_records(RESULTS / path)
    dates = sorted(run.date[:10] for run in runs)
    return (f"Record [`{path}`](results/{path}), collected {record['date'][:10]} (runs {dates[0]} to {dates[-1]}); "
            f"{record['device']}; code {code_versions(runs)}; releases: {release_versions(runs)}; "
            f"`{record['signature']}`. Command: `{command}`.\n")


def without_title(markdown: str) -> str:
    """An experiment's report without its `# title` line and the blank line after it."""
    lines = markdown.splitlines(keepends=True)
    return "".join(lines[2:]) if lines[0].startswith("# ") else markdown


def vs_marian_command(record: dict) -> str:
    """The vs_marian.py command of a record: every setting it holds that is not the script's default (its rows'
    `--row-seeds` as given; `--collect-only`, `--list` and `--decoding-study` are the collecting invocation's)."""
    settings = record["settings"]
    row_seeds = [f"{row}={','.join(map(str, seeds))}" for row, seeds in dict(settings.get("row_seeds") or {}).items()]
    return command_line("experiments/vs_marian.py", vs_marian.build_parser(), {**settings, "row_seeds": row_seeds},
                        leave_out=INVOCATION_MODES)


def vs_marian_passage(path: str) -> str:
    """One vs_marian.py record: its provenance, then the script's own table."""
    record = read(path)
    return provenance(record, path, vs_marian_command(record)) + "\n" + without_title(vs_marian.markdown(record))


def run_devices(record: dict) -> list[str]:
    """The device each run of a convergence record trained on."""
    return [run["device"] for runs in record["runs"].values() for run in runs]


def convergence_caption(record: dict, trained: str) -> str:
    """The caption of a convergence record's tables: epochs, averaging, `trained` (what the systems are) and the flags
    added to every recipe, decoding, and the pairs scored where not every pair."""
    settings, decoding = record["settings"], convergence.RECIPE_DECODING
    return (f"{settings['epochs']} epochs, a checkpoint per epoch, the last {settings['last_n']} averaged; {trained}"
            f"{convergence.added_recipe_flags(settings)}. Decoding for every model: beam {decoding.beams}, length "
            f"penalty {decoding.length_penalty}, at most the longest source + {decoding.source_offset} new tokens. Mean "
            f"over seeds (min-max).{vs_marian.scored_pairs(settings)}")


def convergence_command(record: dict) -> str:
    """The convergence.py command of a record: every setting it holds that is not the script's default, with the
    device its runs trained on (the record's own settings are the collecting invocation's)."""
    on_cpu = all(device.startswith("CPU") for device in run_devices(record))
    return command_line("experiments/convergence.py", convergence.build_parser(),
                        {**record["settings"], "device": "cpu" if on_cpu else "cuda"}, leave_out=INVOCATION_MODES,
                        always=("device",))


# --- the README's tables -------------------------------------------------------------------------------------------

def recipe_overrides(path: str) -> str:
    """What the recipe runs of a record changed from their recipe files, as `name` value (recipe: value): the step
    count, token budget and warm-up each run trained with, where they differ from its recipe's, which must be the
    same for every recipe run."""
    described = set()
    for run in read_run_records(RESULTS / path):
        if run.role != RECIPE:
            continue
        recipe = RunRecord.from_recipe(load_yaml((ROOT / "configs" / f"{run.recipe}.yaml").read_text(
            encoding="utf-8")))
        changed = []
        for name in ("max_steps", "max_tokens_per_batch", "warmup_steps"):
            value, was = getattr(run, name), getattr(recipe, name)
            if value is not None and value != was:
                if was is None:
                    was = f"{recipe.num_train_epochs} epochs" if name == "max_steps" else "unset"
                changed.append(f"`{name}` {value} (recipe: {was})")
        described.add(", ".join(changed))
    if len(described) != 1:
        raise ValueError(f"the recipe runs override different settings: {sorted(described)}")
    return described.pop()


def bleu_by_system(path: str, split: str, weights: str = TRAINED_WEIGHTS) -> dict[str, list[float]]:
    """Each system's BLEU on `split` ("test", "validation") per seed, of its `weights` (`TRAINED_WEIGHTS`, or
    "final" / "averaged" where a record scored both), from the record's typed runs."""
    return bleu_of_runs(read_run_records(RESULTS / path), split, weights)


def bleu_of_runs(runs: list[RunRecord], split: str, weights: str = TRAINED_WEIGHTS) -> dict[str, list[float]]:
    """`bleu_by_system` of runs already read."""
    by_system: dict[str, list[float]] = {}
    for run in runs:
        by_system.setdefault(run.system, []).append(run.scores[weights][split].bleu)
    return by_system


def settings_note(settings: dict[str, Any], when: str) -> str:
    """' (attention dropout 0, its recipe then)': model settings of a table cell's runs, said beside it."""
    return "".join(f" ({name.replace('_', ' ')} {value:g}, {when})" for name, value in settings.items())


def recipe_now(scheme: str) -> dict[str, Any]:
    """Where the one-commit record's recipe row is another row (ONE_COMMIT_RECIPE_ROWS): the committed recipe's values
    of the settings the record's own row of the scheme trained with otherwise (UNRECORDED_MODEL_SETTINGS)."""
    if scheme not in ONE_COMMIT_RECIPE_ROWS:
        return {}
    config = committed_recipe(scheme)[1]
    return {name: getattr(config, name) for name in UNRECORDED_MODEL_SETTINGS[(ONE_COMMIT, scheme)]}


def readme_quality() -> str:
    """One row per scheme (and the peer): equal-budget test2016 and validation BLEU with Marian's architecture, the
    recipe at the equal budget (every run from one commit, the peer with the recipes' tokenizer), 20 epochs with the
    last 5 averaged (test2016); above the table, what the one-commit equal-budget runs overrode in the recipes."""
    schemes = {split: bleu_by_system("vs_marian/eight_schemes_three_seeds/vs_marian.json", split)
               for split in ("test", "validation")}
    peer = {split: bleu_by_system("vs_marian/recipes_equal_budget/vs_marian.json", split)["peer"]
            for split in ("test", "validation")}
    one_commit = bleu_by_system(ONE_COMMIT, "test")
    later_runs = read_run_records(RESULTS / LATER_EQUAL_BUDGET)
    later = bleu_of_runs(later_runs, "test")
    later_commit = ", ".join(f"`{version}`" for version in sorted({run.source_version for run in later_runs}))
    converged = bleu_by_system(TWENTY_EPOCHS_ONE_COMMIT, "test", "averaged")
    rows = []
    for scheme in SCHEMES:
        equal = EQUAL_BUDGET_ROWS.get(scheme)
        recipe = one_commit.get(ONE_COMMIT_RECIPE_ROWS.get(scheme, scheme))
        if recipe:
            recipe_cell = seeds_and_spread(recipe) + settings_note(recipe_now(scheme), "as the recipe now")
        elif scheme in later:
            recipe_cell = (f"{seeds_and_spread(later[scheme])} (trained later from {later_commit} on another CPU: "
                           f"[record](docs/results/{LATER_EQUAL_BUDGET.rsplit('/', 1)[0]}/README.md))")
        else:
            recipe_cell = UNMEASURED
        rows.append([
            f"`{scheme}`", *((seeds_and_spread(schemes["test"][equal]), seeds_and_spread(schemes["validation"][equal]))
                             if equal in schemes["test"] else (UNMEASURED, UNMEASURED)),
            recipe_cell,
            seeds_and_spread(converged[scheme])
            + settings_note(UNRECORDED_MODEL_SETTINGS.get((TWENTY_EPOCHS_ONE_COMMIT, scheme), {}), "its recipe then")
            if scheme in converged else UNMEASURED,
            f"`{RECIPES[scheme]}`" if scheme in RECIPES else "none (the control)" if scheme == "none" else "none",
        ])
    rows.append(["HF `MarianMTModel` (peer)", seeds_and_spread(peer["test"]) + " (its own tokenizer)",
                 seeds_and_spread(peer["validation"]),
                 f"{seeds_and_spread(one_commit[vs_marian.PEER_WITH_RECIPE_TOKENIZER_ROW])} (the recipes' tokenizer)",
                 f"{seeds_and_spread(converged[convergence.PEER_AS_RECIPE])} (trained as the recipes)",
                 "`experiments/vs_marian.py`"])
    caption = (f"Overridden in every recipe run of the one-commit equal-budget column ([`{ONE_COMMIT}`]"
               f"(docs/results/{ONE_COMMIT})): {recipe_overrides(ONE_COMMIT)}.\n\n")
    return caption + table(["scheme", "equal budget: test2016 BLEU", "equal budget: validation BLEU",
                            "recipe at the equal budget, one commit: test2016",
                            "20 epochs, last 5 averaged, one commit: test2016", "recipe"], rows)


def tiny_config(scheme: str) -> RelPosTransformerConfig:
    """A one-layer config of `scheme`, to read which terms its stacks add to attention."""
    return RelPosTransformerConfig(position_scheme=scheme, vocab_size=16, d_model=16, encoder_layers=1,
                                   decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                                   encoder_ffn_dim=16, decoder_ffn_dim=16)


def runs_on_triton(scheme: str) -> bool:
    """Whether `relpos_triton`'s rule (`triton_clipped_terms`) covers the scheme's terms in both stacks (elsewhere
    that kernel hands the call to sdpa)."""
    from hf_relpos.model.attention_functions import triton_clipped_terms
    from hf_relpos.model.modeling_relpos import scheme_terms

    config = tiny_config(scheme)
    return all(triton_clipped_terms(terms.score_bias, terms.value_term) is not None
               for terms, _ in (scheme_terms(config, is_decoder) for is_decoder in (False, True)))


def kernels(scheme: str) -> str:
    """The kernels a scheme runs on: hf_relpos' eager, sdpa and flex_attention; its fused `relpos_triton` where that
    kernel covers the scheme (`runs_on_triton`); and transformers' kernels when the scheme adds nothing to attention
    but replaced queries/keys (`scheme_additions` empty in both stacks)."""
    from hf_relpos.model.attention_functions import RELPOS_KERNELS, TRITON_KERNEL
    from hf_relpos.model.modeling_relpos import scheme_additions

    names = [kernel for kernel in RELPOS_KERNELS if kernel != TRITON_KERNEL]
    if runs_on_triton(scheme):
        names.append(TRITON_KERNEL)
    if not any(scheme_additions(tiny_config(scheme), is_decoder) for is_decoder in (False, True)):
        names.append("flash_attention_2/3, Hub kernels")
    return ", ".join(names)


def fused_rows(scheme: str) -> list[dict]:
    """The scheme's rows at n = 512 in the latest H200 records of the fused kernels (H200_RECOMMENDED), each with
    the record's attention dropout; `relpos_triton` rows only where that kernel runs the scheme (elsewhere they are
    sdpa under its name), and a baseline on `relpos_triton` named sdpa, which ran it."""
    rows, on_triton = [], runs_on_triton(scheme)
    baseline_kernels = {"relpos_triton": "relpos_triton" if runs_on_triton("absolute") else "sdpa"}
    for path in H200_RECOMMENDED:
        record = read(path)
        for row in record["training"]:
            name, _, kernel = row["scheme"].partition("@")
            if name == scheme and row["length"] == 512 and (kernel != "relpos_triton" or on_triton):
                rows.append(row | {"attention_dropout": record["meta"]["attention_dropout"],
                                   "baseline_kernel": baseline_kernels.get(row["baseline_kernel"],
                                                                           row["baseline_kernel"])})
    return rows


# relpos_triton's goals for shaw against absolute in the base model at attention dropout 0.1: at least this share of
# absolute's tokens/s, at most this share more peak memory.
RELPOS_TRITON_SPEED_GOAL = 0.85
RELPOS_TRITON_MEMORY_GOAL = 0.10


def benchmarks_h200_summary() -> str:
    """The fused kernels at the code as it is, in words, from the H200 records, with relpos_triton's two goals at
    n = 512 (RELPOS_TRITON_SPEED_GOAL, RELPOS_TRITON_MEMORY_GOAL) and relpos_triton's first timing before the changes
    since."""
    triton_record, *flex_records = (read(path) for path in H200_FUSED)
    triton_rows = {row["scheme"]: row for row in triton_record["training"]}
    fused, unfused = triton_rows["shaw@relpos_triton"], triton_rows["shaw@sdpa"]
    first_record = read(H200_FIRST_TRITON)
    first = {row["scheme"]: row for row in first_record["training"]}["shaw@relpos_triton"]
    first_code = first_record["meta"]["code"].removesuffix("-dirty")
    meta = triton_record["meta"]
    speed_met = "met" if fused["ratio"] >= RELPOS_TRITON_SPEED_GOAL else "not met"
    memory_met = "met" if fused["memory_overhead"] <= RELPOS_TRITON_MEMORY_GOAL else "not met"
    flex_rows = [{row["scheme"]: row for row in record["training"]} for record in flex_records]
    absolute = " and ".join(f"{rows['absolute@flex_attention']['ratio']:.2f}x" for rows in flex_rows)
    flex = "; ".join(f"{scheme} {rows[f'{scheme}@flex_attention']['ratio']:.2f}x against "
                     f"{rows[f'{scheme}@sdpa']['ratio']:.2f}x, peak memory "
                     f"{rows[f'{scheme}@flex_attention']['memory_overhead']:+.1%} against "
                     f"{rows[f'{scheme}@sdpa']['memory_overhead']:+.1%}"
                     for rows in flex_rows for scheme in sorted({label.partition("@")[0] for label in rows} - {"absolute"}))
    return (f"One {meta['device_name']}, {meta['dtype']}, the base model at n = {fused['length']} (batch "
            f"{fused['batch']}), {meta['warmup']} warm-up and {meta['repeats']} timed rounds, ratios to `absolute` in "
            f"the same run, code `{meta['code']}` ([`{H200_CHECK}`](results/{H200_CHECK}/README.md)). At attention "
            f"dropout {meta['attention_dropout']:g}: `shaw` with a^V on `relpos_triton` {fused['ratio']:.2f}x, peak "
            f"memory {fused['memory_overhead']:+.1%} ({first['ratio']:.2f}x and {first['memory_overhead']:+.1%} at "
            f"`{first_code}`, before the three changes below); on sdpa {unfused['ratio']:.2f}x, "
            f"{unfused['memory_overhead']:+.1%}. `relpos_triton`'s goals at this length (at least "
            f"{RELPOS_TRITON_SPEED_GOAL:g} x absolute's tokens/s, at most {RELPOS_TRITON_MEMORY_GOAL:.0%} more peak "
            f"memory): speed {speed_met}, memory {memory_met}. At attention dropout "
            f"{flex_records[0]['meta']['attention_dropout']:g}, `flex_attention` "
            f"against sdpa (two processes): absolute {absolute}; {flex}.\n\n"
            + relpos_triton_lengths(H200_LENGTHS_CHECK, "a later lease; the kernel code of `3c5d2ac`, its blocks "
                                    "autotuned per power-of-two length bucket")
            + "\n" + relpos_triton_lengths(H200_8ED37F1_CHECK, "the kernel changes since `1f3e7bf` listed below")
            + "\n" + h200_step_timeline(H200_8ED37F1_TIMELINE, H200_8ED37F1_KERNELS)
            + "\n" + relpos_triton_lengths(H200_A0F821F_CHECK, "the host's work per fused call cut since `8ed37f1`, "
                                            "below")
            + "\n" + h200_step_timeline(H200_A0F821F_TIMELINE, H200_A0F821F_TIMELINE)
            + "\n" + relpos_triton_lengths(H200_E8F9F2F_CHECK, "Shaw's tables padded and split once per stack call "
                                            "since `a0f821f`, below")
            + "\n" + h200_step_timeline(H200_E8F9F2F_TIMELINE, H200_E8F9F2F_TIMELINE)
            + "\n" + h200_host_work(H200_E8F9F2F_HOST_TIMELINE)
            + "\n" + relpos_triton_lengths(H200_LATEST_CHECK, "the latest lease; a tuned key launched directly and "
                                            "Shaw's tables cast once per stack call under autocast since `e8f9f2f`, "
                                            "below")
            + "\n" + h200_step_timeline(H200_LATEST_TIMELINE, H200_LATEST_TIMELINE)
            + "\n" + h200_host_work(H200_LATEST_HOST_TIMELINE))


def relpos_triton_lengths(check: str, code_note: str) -> str:
    """shaw on relpos_triton against absolute at every length of the check's H200 record (the setting of
    relpos_triton's goals: the base model at attention dropout 0.1):
    the ratios, the peak memory, and the extra milliseconds per step (medians over the timed rounds, against the
    faster of absolute's two series), which show how the gap grows with n, and the largest spread of one series'
    timed rounds (slowest / fastest - 1). `code_note` says what the code is."""
    record = read(f"{check}/{H200_LENGTHS_RECORD}")
    meta = record["meta"]
    rows = {(row["length"], row["scheme"]): row for row in record["training"]}
    lengths = sorted({length for length, _ in rows})
    absolute = {n: min(statistics.median(rows[(n, f"absolute@{kernel}")]["seconds"])
                       for kernel in ("sdpa", "relpos_triton")) for n in lengths}

    def listed(scheme: str, field: str, form: str) -> str:
        return ", ".join(format(rows[(n, scheme)][field], form) for n in lengths)

    def extra_ms(scheme: str) -> str:
        return ", ".join(f"{(statistics.median(rows[(n, scheme)]['seconds']) - absolute[n]) * 1000:.1f}"
                         for n in lengths)

    met = [n for n in lengths if rows[(n, "shaw@relpos_triton")]["ratio"] >= RELPOS_TRITON_SPEED_GOAL]
    spread = max(max(row["seconds"]) / min(row["seconds"]) - 1 for row in rows.values())
    return (f"At n = {', '.join(map(str, lengths))} (code `{meta['code']}`: {code_note}; "
            f"[`{check}`](results/{check}/README.md)), attention dropout "
            f"{meta['attention_dropout']:g}: `shaw` on `relpos_triton` {listed('shaw@relpos_triton', 'ratio', '.2f')} "
            f"x absolute, peak memory {listed('shaw@relpos_triton', 'memory_overhead', '+.1%')}; on sdpa "
            f"{listed('shaw@sdpa', 'ratio', '.2f')} x, {listed('shaw@sdpa', 'memory_overhead', '+.1%')}. The speed "
            f"goal ({RELPOS_TRITON_SPEED_GOAL:g} x absolute) met at "
            f"{', '.join(f'n = {n}' for n in met) or 'none of them'}. Per step, `shaw` on "
            f"`relpos_triton` takes {extra_ms('shaw@relpos_triton')} ms more than `absolute` "
            f"({', '.join(f'{absolute[n] * 1000:.1f}' for n in lengths)} ms; medians of {meta['repeats']} rounds), "
            f"on sdpa {extra_ms('shaw@sdpa')} ms more. The timed rounds of one series differ by up to {spread:.0%}.\n")


KERNEL_KINDS = re.compile(r"relative_\w+_kernel|row_delta_kernel|cudnn|cutlass|splitKreduce|bfloat16_copy"
                          r"|direct_copy|ReduceOp<\w+|BinaryFunctor<\w+|CUDAFunctor_add<[\w:]+|FillFunctor<\w+")


def kernel_kind(name: str) -> str:
    """A CUDA kernel's name, shortened to what it does (its functor or library)."""
    found = KERNEL_KINDS.search(name)
    return found.group() if found else name[:40]


def h200_time_split(tuning: str) -> str:
    """Where shaw's extra device time per training step goes on relpos_triton (the `tuning` record: one encoder and
    one decoder layer, every CUDA kernel's time), and whether any block size beats the package's."""
    record = read(tuning)
    meta, profiles = record["meta"], record["profiles"]
    shaw, absolute = profiles[f"{meta['scheme']}@relpos_triton"], profiles["absolute@sdpa"]

    def kind_ms(kernels: dict[str, float]) -> dict[str, float]:
        totals: dict[str, float] = defaultdict(float)
        for name, ms in kernels.items():
            totals[kernel_kind(name)] += ms
        return totals

    shaw_kinds, absolute_kinds = kind_ms(shaw), kind_ms(absolute)
    fused = {kind: ms for kind, ms in shaw_kinds.items() if kind.startswith(("relative_", "row_delta"))}
    cross = shaw_kinds.get("cudnn", 0.0)   # shaw's cross-attention, the one attention left on cuDNN
    absolute_self = absolute_kinds.get("cudnn", 0.0) - cross
    gap = sum(shaw.values()) - sum(absolute.values())
    kernel_gap = sum(fused.values()) - absolute_self
    outside = sorted(((shaw_kinds.get(kind, 0.0) - absolute_kinds.get(kind, 0.0), kind)
                      for kind in set(shaw_kinds) | set(absolute_kinds)
                      if kind != "cudnn" and kind not in fused), reverse=True)
    package = tune_relpos_triton.package_configs(meta)
    best: dict[tuple[str, str], dict[bool, float]] = {}
    for timing in record["timings"]:
        entry = best.setdefault(tune_relpos_triton.tuning_group(timing), {})
        own = timing["config"] in package
        entry[own] = min(entry.get(own, float("inf")), timing["ms"])
    slower = [entry[False] / entry[True] for entry in best.values() if False in entry and True in entry]
    return (f"One encoder and one decoder layer ({meta['shape']} shape, n = {meta['length']}, batch {meta['batch']}, "
            f"attention dropout {meta['attention_dropout']:g}), code `{meta['code']}`: a training step takes "
            f"{sum(shaw.values()):.2f} ms of device time with `{meta['scheme']}` on `relpos_triton` and "
            f"{sum(absolute.values()):.2f} ms with `absolute` on sdpa, {gap:.2f} ms more. The {len(fused)} Triton "
            "kernels take "
            f"{sum(fused.values()):.2f} ms ({', '.join(f'`{kind}` {ms:.2f}' for kind, ms in fused.items())}), where "
            f"absolute's two self-attentions take {absolute_self:.2f} ms of cuDNN's flash kernels (its three "
            f"attentions' cuDNN kernels less shaw's cross-attention's, {cross:.2f} ms): the kernel is "
            f"{sum(fused.values()) / absolute_self:.2f}x cuDNN's time, {kernel_gap:.2f} ms of the gap. The other "
            f"{gap - kernel_gap:.2f} ms is outside it; the largest differences by kind of kernel: "
            + ", ".join(f"`{kind}` {ms:+.2f} ms" for ms, kind in outside[:6])
            + "." + (f" Block sizes: for each of the {len(slower)} kernels and flag sets, the fastest of the "
                     f"package's {len(package)} configurations against the fastest of the "
                     f"{len(meta['candidates']) - len(package)} others (FlashAttention-2's Hopper tiles): the others "
                     f"{min(slower):.2f}x to {max(slower):.2f}x its time." if slower else "") + "\n")


def h200_step_timeline(timeline: str, kernel_times: str) -> str:
    """The full model's step on the H200 (the step_timeline record `timeline`): wall time per step against the host's
    enqueue time (equal: host-bound), and the fused kernels' device time against cuDNN's flash kernels in the
    profiled step of `kernel_times` (the same record, or a later call's)."""
    record = read(timeline)
    meta, results = record["meta"], record["results"]
    shaw, absolute = results["shaw@relpos_triton"]["timing"], results["absolute@sdpa"]["timing"]
    kernels = {label: result["profile"]["kernel_ms"] for label, result in read(kernel_times)["results"].items()}
    fused = {name: ms for name, ms in kernels["shaw@relpos_triton"].items() if kernel_kind(name).startswith("relative_")}
    cudnn = sum(ms for name, ms in kernels["absolute@sdpa"].items() if kernel_kind(name) == "cudnn")
    return (f"The full model's step ({meta['layers']} + {meta['layers']} layers, n = {meta['length']}, batch "
            f"{meta['batch']}, code `{meta['code']}`; `benchmarks/step_timeline.py`) is host-bound on the fused "
            f"path: {shaw['drained_ms']:.1f} ms with `shaw` on `relpos_triton` against {absolute['drained_ms']:.1f} ms "
            f"with `absolute` on sdpa (queue drained around each step; {shaw['consecutive_ms']:.1f} and "
            f"{absolute['consecutive_ms']:.1f} ms for {meta['steps']} consecutive steps), and the host returns from "
            f"`shaw`'s step {shaw['drained_ms'] - shaw['enqueue_ms']:.1f} ms before the device finishes "
            f"(`absolute`'s: {absolute['drained_ms'] - absolute['enqueue_ms']:.1f} ms). In a profiled step "
            + ("" if kernel_times == timeline else "of a later call ")
            + f"([`{kernel_times}`](results/{kernel_times})) the fused kernels take "
            f"{sum(fused.values()):.1f} ms of device time for the {2 * meta['layers']} self-attentions, cuDNN's flash "
            f"kernels {cudnn:.1f} ms for `absolute`'s {3 * meta['layers']} attentions.\n")


def relpos_triton_noise(check: str, earlier: str) -> str:
    """What one run tells, from two checks' records of the base model at attention dropout 0.1: `absolute` on
    `relpos_triton` (sdpa under that name, computed as `absolute` on sdpa) against `absolute` on sdpa at each length,
    beside `shaw` on `relpos_triton` in both checks."""
    def ratios(path: str, scheme: str) -> tuple[str, str]:
        record = read(f"{path}/{H200_LENGTHS_RECORD}")
        rows = {row["length"]: row for row in record["training"] if row["scheme"] == scheme}
        return record["meta"]["code"], ", ".join(f"{rows[n]['ratio']:.2f}x" for n in sorted(rows))

    lengths = sorted({row["length"] for row in read(f"{check}/{H200_LENGTHS_RECORD}")["training"]})
    (code, same), (earlier_code, earlier_same) = (ratios(path, "absolute@relpos_triton") for path in (check, earlier))
    (_, shaw), (_, earlier_shaw) = (ratios(path, "shaw@relpos_triton") for path in (check, earlier))
    return (f"At n = {', '.join(map(str, lengths))}, `absolute` on `relpos_triton`, which hands the call to sdpa, ran "
            f"at {same} `absolute` on sdpa at `{code}` ({earlier_same} at `{earlier_code}`); `shaw` on "
            f"`relpos_triton` at {shaw} ({earlier_shaw} at `{earlier_code}`).\n")


def h200_host_work(timeline: str) -> str:
    """The full model's step at a length where the device's share is small (the step_timeline record `timeline`, step
    (u) of the check): both series' drained milliseconds per step and their difference, the host's extra work."""
    record = read(timeline)
    meta, results = record["meta"], record["results"]
    shaw, absolute = results["shaw@relpos_triton"], results["absolute@sdpa"]
    return (f"At n = {meta['length']} (batch {meta['batch']}, code `{meta['code']}`; "
            f"[`{timeline}`](results/{timeline})), where the device is busy {shaw['profile']['busy_ms']:.1f} and "
            f"{absolute['profile']['busy_ms']:.1f} ms of a profiled step, a step takes "
            f"{shaw['timing']['drained_ms']:.1f} ms with `shaw` on `relpos_triton` against "
            f"{absolute['timing']['drained_ms']:.1f} ms with `absolute` on sdpa (queue drained around each step): "
            f"{shaw['timing']['drained_ms'] - absolute['timing']['drained_ms']:.1f} ms more of the host's work per "
            "step.\n")


def h200_extra_host_operators(timeline: str, rows: int = 8) -> str:
    """The step_timeline record's host operators with the most self time beyond the first series' in its profiled
    step (`shaw` on `relpos_triton` against `absolute` on sdpa), the first `rows` of the table that the record's
    markdown shows (step_timeline.extra_host_time), with whether the profiled step recorded Python stacks."""
    record = read(timeline)
    meta, results = record["meta"], record["results"]
    baseline, shaw = results["absolute@sdpa"]["profile"], results["shaw@relpos_triton"]["profile"]
    stacks = "--host_profile" in meta["command"]
    return (f"At n = {meta['length']} (batch {meta['batch']}, code `{meta['code']}`; [`{timeline}`](results/{timeline})), "
            "the host operators and autograd nodes with the most self time in `shaw`'s profiled step beyond "
            f"`absolute`'s (all threads; the profiled step {'with' if stacks else 'without'} Python stacks), the "
            f"first {rows}:\n\n"
            + markdown_table(["operator", "count", "count (absolute@sdpa)", "self ms", "self ms (absolute@sdpa)",
                              "extra ms"],
                             step_timeline.extra_host_time(shaw["host_operators"], baseline["host_operators"])[:rows])
            + "\n")


def host_overhead_before_after() -> str:
    """The fused path's extra host time per step (benchmarks/host_overhead.py, launches stubbed on a CPU) before and
    after eager calls left the custom ops, from the runs of HOST_OVERHEAD (alternated, before then after)."""
    runs = {name: read(f"{HOST_OVERHEAD}/{name}/host_overhead.json") for name in HOST_OVERHEAD_RUNS}

    def extra(prefix: str) -> str:
        return " and ".join(f"{next(row['extra_ms'] for row in record['rows'] if row['series'] == 'shaw@relpos_triton'):.1f}"
                            for name, record in runs.items() if name.startswith(prefix))

    codes = {prefix: next(record["meta"]["code"] for name, record in runs.items() if name.startswith(prefix))
             for prefix in ("before", "after")}
    meta = runs[HOST_OVERHEAD_RUNS[0]]["meta"]
    return (f"With relpos_triton's launches stubbed on a CPU ({meta['device_name']}, {meta['cpu_threads']} thread; "
            f"the full model at d_model {meta['d_model']}, so that a step's time is the host's work; "
            f"[`host_overhead`](results/{HOST_OVERHEAD}/README.md)), `shaw` on `relpos_triton` took {extra('before')} "
            f"ms per step more than `absolute` on sdpa at `{codes['before']}`, {extra('after')} ms at "
            f"`{codes['after']}`.\n")


def host_overhead_through_triton(folder: str, runs: tuple[str, ...],
                                 bf16_runs: tuple[str, str]) -> Callable[[], str]:
    """shaw's extra host time per step through Triton's launch path (benchmarks/host_overhead.py --launches triton,
    CPU) before and after a change, from the alternated `runs` (before1, after1, ...) of the record `folder`, and
    both codes' aten operators per step in float32 and under bfloat16 autocast (`bf16_runs`: before, after)."""
    def passage() -> str:
        records = {name: read(f"{folder}/{name}/host_overhead.json") for name in (*runs, *bf16_runs)}
        rows = {name: {row["series"]: row for row in record["rows"]} for name, record in records.items()}

        def extra(prefix: str) -> str:
            return ", ".join(f"{rows[name]['shaw@relpos_triton']['extra_ms']:.2f}" for name in runs
                             if name.startswith(prefix))

        def operators(name: str) -> str:
            return f"{rows[name]['shaw@relpos_triton']['operators']} against {rows[name]['absolute@sdpa']['operators']}"

        meta = records[runs[0]]["meta"]
        # (a before run may have the benchmark's files copied into a worktree of that commit, hence "-dirty")
        codes = {prefix: records[f"{prefix}1"]["meta"]["code"].removesuffix("-dirty") for prefix in ("before", "after")}
        launches = {prefix: rows[f"{prefix}1"]["shaw@relpos_triton"]["triton_launches"] for prefix in codes}
        launched = (f"relpos_triton's {launches['before']} launches a step" if len(set(launches.values())) == 1 else
                    f"relpos_triton's launches ({launches['before']} a step at `{codes['before']}`, "
                    f"{launches['after']} at `{codes['after']}`)")
        return (f"Through Triton's launch path on a CPU ({meta['device_name']}, {meta['cpu_threads']} thread; the "
                f"full model at d_model {meta['d_model']}, n = {meta['length']}, batch {meta['batch']}, "
                f"{meta['dtype']}; {launched} through the autotuner's and the JIT function's Python with a stand-in "
                f"driver, the kernels not run; [`{folder}`](results/{folder}/README.md)), `shaw` on `relpos_triton` "
                f"took {extra('before')} ms per step more than `absolute` on sdpa at `{codes['before']}` and "
                f"{extra('after')} ms at `{codes['after']}` ({len(runs) // 2} alternated runs each, "
                f"{meta['rounds']} rounds of {meta['steps']} steps). Aten operators per step (views among them, which "
                f"launch nothing on a GPU), `shaw` against `absolute`: {operators('before1')} at `{codes['before']}` "
                f"and {operators('after1')} at `{codes['after']}` in float32; under bfloat16 autocast "
                f"{operators(bf16_runs[0])} and {operators(bf16_runs[1])}.\n")

    return passage


def decoding_host_work_before_after() -> str:
    """A cached decoding step's host work per scheme (benchmarks/decoding_host_work.py, CPU) before and after the
    decoding fixes, from the runs of DECODING_HOST_WORK (alternated, before then after): operators and host syncs
    per step (the same in both runs of a code), and ms per step against absolute's in each run."""
    runs = {name: read(f"{DECODING_HOST_WORK}/{name}/decoding_host_work.json")
            for name in (*DECODING_HOST_WORK_RUNS, DECODING_HOST_WORK_LATEST)}
    rows = {name: {(row["series"], row["num_beams"]): row for row in record["rows"]} for name, record in runs.items()}
    codes = {kind: runs[f"{kind}1"]["meta"]["code"] for kind in ("before", "after")}
    latest = rows[DECODING_HOST_WORK_LATEST]
    latest_code = runs[DECODING_HOST_WORK_LATEST]["meta"]["code"]

    def syncs(row: dict) -> str:
        return ", ".join(f"{count:g}" for count in row["syncs"].values()) or "0"

    def ratios(kind: str, key: tuple[str, int]) -> str:
        return " / ".join(f"{rows[name][key]['ratio']:.2f}" for name in DECODING_HOST_WORK_RUNS
                          if name.startswith(kind))

    table = [[f"`{series}`", "greedy" if beams == 1 else f"beam {beams}",
              f"{row['operators']:g}", f"{rows['after1'][(series, beams)]['operators']:g}",
              f"{latest[(series, beams)]['operators']:g}",
              syncs(row), syncs(rows["after1"][(series, beams)]), syncs(latest[(series, beams)]),
              ratios("before", (series, beams)), ratios("after", (series, beams))]
             for (series, beams), row in rows["before1"].items()]
    meta = runs["before1"]["meta"]
    return (f"Record: [`{DECODING_HOST_WORK}`](results/{DECODING_HOST_WORK}/README.md) (`{meta['command']}`; "
            f"{meta['device_name']}, {meta['cpu_threads']} thread, shared with other jobs; {meta['layers']} + "
            f"{meta['layers']} layers of d_model {meta['d_model']}, batch {meta['batch']}). Per cached decoding step "
            f"at `{codes['before']}` (before), `{codes['after']}` (after) and `{latest_code}` (Shaw's a^K on the keys "
            "and a^V on the values of a decoding step on every kernel, each layer's rows read once per step; XL's one "
            "query scored by distance; RoPE's pairs swapped by one index_select; one run):\n\n"
            + markdown_table(["scheme", "search", "operators before", "operators after",
                              f"operators at `{latest_code}`", "host syncs before", "host syncs after",
                              f"host syncs at `{latest_code}`", "ms vs absolute before (2 runs)",
                              "ms vs absolute after (2 runs)"], table) + "\n")


def h200_timeline_table(timeline: str) -> str:
    """A check's step timings per series (the step_timeline record `timeline`), with the columns that every such
    record supports: the profiled step's busy and idle columns counted the step's own annotation as device work
    (step_timeline before 5b75bf8), and series timed one after another give no ratios (step (a)'s round-robin rounds
    do). Where the record has it, the host's enqueue time of the forward pass."""
    record = read(timeline)
    meta, results = record["meta"], record["results"]
    forward = all("forward_enqueue_ms" in result["timing"] for result in results.values())
    rows = [[label, f"{result['timing']['drained_ms']:.2f}", f"{result['timing']['consecutive_ms']:.2f}",
             f"{result['timing']['enqueue_ms']:.2f}",
             *([f"{result['timing']['forward_enqueue_ms']:.2f}"] if forward else []),
             f"{result['timing']['drained_ms'] - result['timing']['enqueue_ms']:.2f}", result["profile"]["kernels"],
             sum(sync["count"] for sync in result.get("syncs", []))] for label, result in results.items()]
    return (f"Record: [`{timeline}`](results/{timeline}) (`{meta['command']}`; series timed "
            "one after another, so their ratios are step (a)'s, not this table's).\n\n"
            + markdown_table(["series", "drained ms/step", f"{meta['steps']} consecutive ms/step", "host enqueue ms",
                              *(["of which forward ms"] if forward else []), "device after the host ms", "kernels",
                              "syncs"], rows) + "\n")


def recommended_kernel(scheme: str) -> str:
    """The fastest kernel measured for the scheme at each attention dropout of the H200 records (ratios to the run's
    baseline, absolute on its fastest kernel, which each record names), sdpa where nothing else was measured."""
    rows = fused_rows(scheme)
    if scheme == "absolute":
        by_baseline: dict[str, dict[tuple[str, float], list[str]]] = {}
        for row in rows:
            measured = by_baseline.setdefault(row["baseline_kernel"], {})
            if row["kernel"] != row["baseline_kernel"]:
                measured.setdefault((row["kernel"], row["attention_dropout"]), []).append(f"{row['ratio']:.2f}x")
        parts = []
        for baseline, measured in (by_baseline or {"sdpa": {}}).items():
            dropouts = sorted({row["attention_dropout"] for row in rows if row["baseline_kernel"] == baseline},
                              reverse=True)
            at = f" at dropout {' and '.join(f'{dropout:g}' for dropout in dropouts)}" if len(by_baseline) > 1 else ""
            others = ", ".join(f"{kernel} {' and '.join(ratios)} at dropout {dropout:g}"
                               for (kernel, dropout), ratios in measured.items())
            parts.append(f"`{baseline}` (the baseline{at}" + (f"; {others})" if others else ")"))
        return "; ".join(parts)
    if not rows:
        return "`sdpa` (fused paths not measured)"
    parts = []
    for dropout in sorted({row["attention_dropout"] for row in rows}, reverse=True):
        measured = sorted((row for row in rows if row["attention_dropout"] == dropout), key=lambda row: -row["ratio"])
        best, *others = measured
        rest = ", ".join(f"{row['kernel']} {row['ratio']:.2f}x" for row in others)
        parts.append(f"`{best['kernel']}`: {best['ratio']:.2f}x, {best['memory_overhead']:+.1%}"
                     + (f" ({rest})" if rest else "") + f" at dropout {dropout:g}")
    return "; ".join(parts)


H100_CHECK = "gpu_check/2026-11-26_h100"   # benchmarks/gpu_check.sh's record of the code as it is
H100_TRAINING = tuple(f"{H100_CHECK}/training_n{length}/training.json" for length in (128, 512))
H100_DECODING = "benchmarks_h100/decoding.json"
# The fused kernels' first timings (H200, n = 512, code 0c6ed16): relpos_triton at attention dropout 0.1,
# flex_attention at 0.
H200_FIRST = "gpu_check/2026-11-27_h200"
H200_FIRST_TRITON = f"{H200_FIRST}/training_n512_dropout0.1_relpos_triton/training.json"
# The same at the code as it is (H200, n = 512, code 3c5d2ac): relpos_triton at attention dropout 0.1, then
# flex_attention at 0 in two processes. README's recommended kernels come from these.
H200_CHECK = "gpu_check/2026-11-27_h200_3c5d2ac"
H200_FUSED = (f"{H200_CHECK}/training_n512_dropout0.1/training.json",
              f"{H200_CHECK}/training_n512_flex_xl_t5/training.json",
              f"{H200_CHECK}/training_n512_flex_shaw_alibi/training.json")
# relpos_triton at n = 128, 512 and 1024 (H200, attention dropout 0.1), first at code cae802d (the kernel code of
# 3c5d2ac), then at the code as it is (1f3e7bf: blocks autotuned per length bucket), with the kernels' block sizes
# and each CUDA kernel's time (benchmarks/tune_relpos_triton.py).
H200_LENGTHS_CAE802D = "gpu_check/2026-11-27_h200_cae802d/training_dropout0.1/training.json"
H200_LENGTHS_RECORD = "training_dropout0.1/training.json"
H200_LENGTHS_CHECK = "gpu_check/2026-11-28_h200_1f3e7bf"
H200_LENGTHS = f"{H200_LENGTHS_CHECK}/{H200_LENGTHS_RECORD}"
H200_TUNING = f"{H200_LENGTHS_CHECK}/tuning_n512/tuning.json"
# The check at 8ed37f1 (the kernel changes since 1f3e7bf), with the full model's step timeline
# (benchmarks/step_timeline.py: the second call's timings, the third call's kernel times).
H200_8ED37F1_CHECK = "gpu_check/2026-11-28_h200_8ed37f1"
H200_8ED37F1_LENGTHS = f"{H200_8ED37F1_CHECK}/{H200_LENGTHS_RECORD}"
H200_8ED37F1_TUNING = f"{H200_8ED37F1_CHECK}/tuning_n512/tuning.json"
H200_8ED37F1_TIMELINE = f"{H200_8ED37F1_CHECK}/timeline_n512/timeline.json"
H200_8ED37F1_KERNELS = f"{H200_8ED37F1_CHECK}/timeline_host_n512/timeline.json"
# The check at a0f821f (the host-overhead changes since 8ed37f1), the prepared check alone: its step timeline
# profiles the kernels in the same record.
H200_A0F821F_CHECK = "gpu_check/2026-12-04_h200_a0f821f"
H200_A0F821F_LENGTHS = f"{H200_A0F821F_CHECK}/{H200_LENGTHS_RECORD}"
H200_A0F821F_TUNING = f"{H200_A0F821F_CHECK}/tuning_n512/tuning.json"
H200_A0F821F_TIMELINE = f"{H200_A0F821F_CHECK}/timeline_n512/timeline.json"
# The check at e8f9f2f (Shaw's tables padded and split once per stack call, key ranges built once per stack call
# since a0f821f), the prepared check alone, with its step (u): the same two series at n = 16, where a step is mostly
# the host's work.
H200_E8F9F2F_CHECK = "gpu_check/2026-12-04_h200_e8f9f2f"
H200_E8F9F2F_LENGTHS = f"{H200_E8F9F2F_CHECK}/{H200_LENGTHS_RECORD}"
H200_E8F9F2F_TUNING = f"{H200_E8F9F2F_CHECK}/tuning_n512/tuning.json"
H200_E8F9F2F_TIMELINE = f"{H200_E8F9F2F_CHECK}/timeline_n512/timeline.json"
H200_E8F9F2F_HOST_TIMELINE = f"{H200_E8F9F2F_CHECK}/timeline_n16/timeline.json"
# The latest check (d34293a: a tuned key launched directly with the autotuner's cached config, Shaw's a^K and a^V
# tables cast once per stack call under autocast since e8f9f2f), the prepared check alone; its steps (t) and (u) list
# the host operators with the most self time beyond absolute's.
H200_LATEST_CHECK = "gpu_check/2026-12-04_h200_d34293a"
H200_LATEST_LENGTHS = f"{H200_LATEST_CHECK}/{H200_LENGTHS_RECORD}"
H200_LATEST_TUNING = f"{H200_LATEST_CHECK}/tuning_n512/tuning.json"
H200_LATEST_TIMELINE = f"{H200_LATEST_CHECK}/timeline_n512/timeline.json"
H200_LATEST_HOST_TIMELINE = f"{H200_LATEST_CHECK}/timeline_n16/timeline.json"
# README's recommended kernels: relpos_triton and sdpa at attention dropout 0.1 from the latest check, flex_attention
# and sdpa at dropout 0 from 3c5d2ac (the fused path's latest timing at dropout 0).
H200_RECOMMENDED = (H200_LATEST_LENGTHS, *H200_FUSED[1:])
# benchmarks/host_overhead.py before (8ed37f1) and after (eager calls through an autograd.Function), alternated.
HOST_OVERHEAD = "host_overhead"
HOST_OVERHEAD_RUNS = ("before1", "after1", "before2", "after2")
# benchmarks/host_overhead.py --launches triton (Triton's launch path with a stand-in driver) before (e8f9f2f, the
# benchmark files copied in) and after the launch-path and autocast-cast changes since, alternated; one bfloat16
# (autocast) pair for the operators per step.
HOST_OVERHEAD_TRITON = "host_overhead_triton"
HOST_OVERHEAD_TRITON_RUNS = ("before1", "after1", "before2", "after2", "before3", "after3")
HOST_OVERHEAD_TRITON_BF16 = ("before_bf16", "after_bf16")
# ... before (6606b91) and after (86fb072) the Delta pass folded into the dq/dT kernel and the masses' fill and dT's
# cast folded into the kernels, the same runs
HOST_OVERHEAD_TRITON_86FB072 = "host_overhead_triton_86fb072"
# benchmarks/decoding_host_work.py before (40ab9e1, the benchmark file copied in) and after the decoding step's
# host-work fixes (9bc5a03, 065eff6, 40808d1, fe51b42; run at f4b4fb6), alternated.
DECODING_HOST_WORK = "decoding_host_work"
DECODING_HOST_WORK_RUNS = ("before1", "after1", "before2", "after2")
# ... and once at dce029f (the decoding steps of Shaw, XL and RoPE since): its operators and syncs
DECODING_HOST_WORK_LATEST = "latest"


def h100_model_rows(scheme: str) -> list[dict]:
    """The base model's rows of `scheme` in the H100 training records (one record per length)."""
    return [row for path in H100_TRAINING for row in read(path)["training"]
            if (row["benchmark"], row["shape"], row["scheme"]) == ("model", "base", scheme)]


def readme_cost() -> str:
    """Per scheme: H100 training speed and memory against absolute (base model), cached decoding, kernels."""
    meta = read(H100_TRAINING[0])["meta"]
    fused_meta, flex_meta = (read(path)["meta"] for path in H200_RECOMMENDED[:2])
    decoding_record = read(H100_DECODING)
    decoding = {row["scheme"]: row for row in decoding_record["decoding"]}
    rows = []
    for scheme in SCHEMES:
        measured = h100_model_rows(scheme)
        if scheme == "absolute":
            speed, memory, cached = "1 (the baseline)", "0 (the baseline)", "1 (the baseline)"
        else:
            speed = ", ".join(f"{row['ratio']:.2f}x (n = {row['length']})" for row in measured) or UNMEASURED
            memory = ", ".join(f"{row['memory_overhead']:+.1%} (n = {row['length']})" for row in measured) or UNMEASURED
            cached = f"{decoding[scheme]['cached_ratio_to_absolute']:.2f}x" if scheme in decoding else UNMEASURED
        rows.append([f"`{scheme}`", speed, memory, cached, recommended_kernel(scheme), kernels(scheme)])
    baseline = h100_model_rows("absolute")
    baseline_kernels = " or ".join(sorted({row["baseline_kernel"] for row in fused_rows("absolute")}))
    caption = (f"Training: {meta['device_name']}, {meta['dtype']} autocast, `{meta['kernel']}` kernel, torch "
               f"{meta['torch']}, transformers {meta['transformers']}, {meta['date'][:10]}, code `{meta['code']}` "
               f"(records [`{H100_CHECK}`](docs/results/{H100_CHECK}/README.md)); the base "
               f"model ({baseline[0]['layers']} + {baseline[0]['layers']} layers), {meta['model_tokens']} source tokens "
               "a batch; ratios to `absolute` in the same round. Cached decoding: the "
               f"{decoding_record['meta']['date'][:10]} record (`{H100_DECODING}`), before the changes to every "
               "scheme's decoding step since (fewer operators a step, `shaw`'s on SDPA: [the host's work per "
               "step](docs/benchmarks.md#the-hosts-work-per-cached-decoding-step-cpu), unmeasured on a GPU). "
               "Recommended kernel: the fastest measured for training on an "
               f"{fused_meta['device_name']}, base model, n = 512, ratio to `absolute` on {baseline_kernels} and "
               f"peak memory against it in the same run: at attention dropout {fused_meta['attention_dropout']:g} "
               f"code `{fused_meta['code'].removesuffix('-dirty')}` "
               f"([`{H200_LATEST_CHECK}`](docs/results/{H200_LATEST_CHECK}/README.md); "
               "[more](docs/benchmarks.md#one-h200-2026-12-04-evening-relpos_triton-at-d34293a-a-tuned-key-launched-"
               "directly)), "
               f"at {flex_meta['attention_dropout']:g} code `{flex_meta['code'].removesuffix('-dirty')}` "
               f"([`{H200_CHECK}`](docs/results/{H200_CHECK}/README.md); "
               "[more](docs/benchmarks.md#one-h200-2026-11-27-second-lease-the-fused-kernels-at-3c5d2ac)).\n\n")
    return caption + table(["scheme", "training speed vs absolute", "peak memory vs absolute",
                            "cached decoding vs absolute", "recommended `attn_implementation` (H200, n = 512)",
                            "kernels"], rows)


# PyTorch generate against CTranslate2 on the CPU, one model, every engine in the same run.
INFERENCE_CPU = "inference/cpu_multi30k_small_absolute/inference.json"


def inference_provenance(record: dict, path: str, prefix: str) -> str:
    """The model, hardware, code, command and date of a bench_inference record."""
    environment = record["environment"]
    return (f"Record [`{path}`]({prefix}{path}): {record['model_note']}; {record['sentences']} sentences of "
            f"`{Path(record['test_file']).name}` (Multi30k test), beam {record['num_beams']}, batches of "
            f"{record['batch_size']}; {environment['device_name']} ({record['hardware_note']}), torch "
            f"{environment['torch']}, CTranslate2 {record['ctranslate2']}, code `{environment['code']}`, "
            f"{environment['date'][:10]}; wall-clock time. Command: `{environment['command']}`.")


def inference_goals(record: dict) -> str:
    """bench_inference's CPU goals (the record's `goals`), each against the record's runs: met or not, with the
    measured figures."""
    sentences = record["sentences"]
    lines = []
    for run in record["runs"]:
        engines = run["engines"]
        baseline, float32, int8 = engines["pytorch"], engines["ct2_float32"], engines["ct2_int8"]
        loss = baseline["bleu"] - int8["bleu"]
        int8_met = int8["speedup"] >= record["goals"]["ct2_int8"] and loss <= record["max_bleu_loss_int8"]
        float32_met = (float32["speedup"] >= record["goals"]["ct2_float32"]
                       and float32["identical_lines"] == sentences)
        lines.append(
            f"- {run['threads']} thread(s): int8 {int8['speedup']:.2f}x PyTorch's sentences/s, BLEU "
            f"{int8['bleu'] - baseline['bleu']:+.2f} against PyTorch's (goal: {record['goals']['ct2_int8']:.1f}x at "
            f"<= {record['max_bleu_loss_int8']} "
            f"BLEU loss: {'met' if int8_met else 'not met'}); float32 {float32['speedup']:.2f}x with "
            f"{float32['identical_lines']} of {sentences} lines identical (goal: {record['goals']['ct2_float32']:.1f}x, "
            f"identical lines: {'met' if float32_met else 'not met'}).")
    return "\n".join(lines)


def readme_deploy() -> str:
    """README 'Deploy': the CPU record's engines side by side, and the goals."""
    record = read(INFERENCE_CPU)
    return (bench_inference.render(record) + "\n\n" + inference_goals(record) + "\n\n"
            + inference_provenance(record, INFERENCE_CPU, "docs/results/") + "\n")


def benchmarks_inference_cpu() -> str:
    """docs/benchmarks.md: the CPU inference record, with its goals and provenance."""
    record = read(INFERENCE_CPU)
    return (inference_provenance(record, INFERENCE_CPU, "results/") + "\n\n" + bench_inference.render(record)
            + "\n\n" + inference_goals(record) + "\n")


KEY_DROPOUT = "vs_marian/key_dropout_xl/vs_marian.json"
PROBABILITY_DROPOUT_ROW, KEY_DROPOUT_ROW = "xl", "xl+key-dropout-0.1"


def benchmarks_key_dropout() -> str:
    """docs/benchmarks.md: the 3-seed key-dropout record and the outcome of the criterion stated before its third seed
    (key dropout is the fused path's dropout when it is level with probability dropout on validation: the seeds'
    ranges overlap)."""
    rows = read(KEY_DROPOUT)["rows"]
    probability, keys = rows[PROBABILITY_DROPOUT_ROW], rows[KEY_DROPOUT_ROW]

    def level(split: str) -> bool:
        """The two rows' seed ranges overlap on `split`."""
        return min(keys[split]) <= max(probability[split]) and min(probability[split]) <= max(keys[split])

    def compared(split: str, name: str) -> str:
        ahead = statistics.mean(keys[split]) - statistics.mean(probability[split])
        return (f"{name}: key dropout {vs_marian.spread(keys[split])} against {vs_marian.spread(probability[split])}, "
                f"{'ranges overlapping' if level(split) else 'ranges apart'}, {abs(ahead):.2f} "
                f"{'ahead' if ahead >= 0 else 'behind'} on the mean")

    outcome = ("level on validation: key dropout is the dropout the fused path runs" if level("validation_bleu") else
               "not level on validation: key dropout is not the fused path's dropout")
    return (vs_marian_passage(KEY_DROPOUT) + "\n" + compared("validation_bleu", "Validation") + "; "
            + compared("test_bleu", "test2016") + f". Outcome of the criterion: {outcome}.\n")


# --- the rule that chooses the default position_scheme (README 'How the default is chosen') -------------------------

# A scheme whose training on the GPU is slower than this fraction of absolute's, at any length measured, is not a
# candidate for the default.
SPEED_FLOOR = 0.8
# Why a scheme without a committed recipe (the control `none`) is not a candidate.
NO_RECIPE = "no committed recipe (the control)"
LONG_INPUTS = "long_inputs"  # experiments/long_inputs.py's records, docs/results/long_inputs/<name>/long_inputs.json


# What every recipe run of an experiment sets alike, its protocol rather than a change of the recipe: the budget (steps
# or epochs, token budget, warm-up; README's tables state it), the seed, the checkpoints averaged for scoring, and where
# the same data was read from.
PROTOCOL_SETTINGS = ("max_steps", "num_train_epochs", "max_tokens_per_batch", "warmup_steps", "seed",
                     "average_checkpoints", "dataset_name", "dataset_config_name", "train_file", "validation_file",
                     "test_file")


def run_scheme(run: RunRecord) -> str | None:
    """The scheme a recipe run trained: that of the recipe file it trained from (RECIPES), else its system's name where
    that names a scheme (a model scored without its training record); None for a peer or anything else."""
    if run.role != RECIPE:
        return None
    return RECIPE_SCHEMES.get(run.recipe) or (run.system if run.system in SCHEMES else None)


@cache
def committed_recipe(scheme: str) -> tuple[RunRecord, RelPosTransformerConfig]:
    """The scheme's recipe file as committed now, as a RunRecord, and the model config it builds (read once)."""
    recipe = RunRecord.from_recipe(load_yaml((ROOT / RECIPES[scheme]).read_text(encoding="utf-8")))
    return recipe, RelPosTransformerConfig(**recipe.model)


@cache
def training_defaults() -> dict[str, Any]:
    """train_translation.py's default of each of its fields that has one."""
    return {item.name: item.default for arguments in ARGUMENT_CLASSES for item in dataclasses.fields(arguments)
            if item.default is not dataclasses.MISSING}


def recipe_changes(run: RunRecord, scheme: str, unrecorded: dict | None = None) -> list[str]:
    """What `run` of `scheme` trained with other than the scheme's recipe as committed now, as `name` value (recipe:
    value): each setting the run records (and the model settings `unrecorded` adds) against the recipe file's, where
    the file leaves a setting out train_translation.py's default or the model config's; PROTOCOL_SETTINGS are no
    change. A scheme without a recipe file has nothing to differ from."""
    if scheme not in RECIPES:
        return []
    recipe, config = committed_recipe(scheme)
    defaults = training_defaults()
    changes = [f"`model.{name}` {value} (recipe: {was})" for name, value in {**run.model, **(unrecorded or {})}.items()
               if value != (was := recipe.model.get(name, getattr(config, name, None)))]
    for name in RunRecord.recipe_fields():
        value, was = getattr(run, name), getattr(recipe, name)
        was = defaults.get(name) if was is None else was
        if name not in PROTOCOL_SETTINGS and value is not None and value != was:
            changes.append(f"`{name}` {value} (recipe: {was})")
    return changes


def committed_recipe_runs(path: str) -> list[tuple[str, RunRecord]]:
    """(scheme, run) for each run of a record that trained its scheme's recipe as committed now (no `recipe_changes`):
    the runs the rule reads, of every record."""
    return [(scheme, run) for run in read_run_records(RESULTS / path) if (scheme := run_scheme(run)) is not None
            and not recipe_changes(run, scheme, UNRECORDED_MODEL_SETTINGS.get((path, run.system)))]


def bleu_by_scheme(runs: list[tuple[str, RunRecord]], split: str, weights: str = TRAINED_WEIGHTS
                   ) -> dict[str, list[float]]:
    """{scheme: BLEU on `split` per run} of `committed_recipe_runs`, in SCHEMES order."""
    by_scheme: dict[str, list[float]] = defaultdict(list)
    for scheme, run in runs:
        if split in run.scores[weights]:
            by_scheme[scheme].append(run.scores[weights][split].bleu)
    return {scheme: by_scheme[scheme] for scheme in SCHEMES if scheme in by_scheme}


def default_rule_columns(twenty_epochs: tuple[str, ...] = (TWENTY_EPOCHS_ONE_COMMIT,)
                         ) -> dict[str, dict[str, list[float]]]:
    """The evaluation columns the rule ranks on, each {scheme: BLEU per seed}, of the recipes as committed now (a run
    trained with another recipe setting is left out, in every record: `committed_recipe_runs`): test2016 and
    validation of the one-commit records (at the equal budget, and 20 epochs with the last 5 averaged: the runs of
    `twenty_epochs` together), then every level of every long-input record."""
    one_commit = committed_recipe_runs(ONE_COMMIT)
    twenty = [run for path in twenty_epochs for run in committed_recipe_runs(path)]
    columns: dict[str, dict[str, list[float]]] = {}
    for split, name in (("test", "test2016"), ("validation", "validation")):
        columns[f"equal budget, {name}"] = bleu_by_scheme(one_commit, split)
        columns[f"20 epochs, {name}"] = bleu_by_scheme(twenty, split, "averaged")
    for path in sorted((RESULTS / LONG_INPUTS).glob("*/long_inputs.json")):
        runs = committed_recipe_runs(path.relative_to(RESULTS).as_posix())
        for level in dict.fromkeys(level for run in read_run_records(path) for level in run.scores[TRAINED_WEIGHTS]):
            columns[f"{path.parent.name}: {level}"] = bleu_by_scheme(runs, level)
    return columns


# A column ranks schemes by their seed spread, so it enters the rule only when each of its schemes has at least this
# many seeds (stated before any long-input record existed; the one-commit columns have 2 and 3).
MIN_SEEDS = 2


def ranked_columns(columns: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, list[float]]]:
    """The columns the rule ranks on: those in which every scheme has at least MIN_SEEDS seeds."""
    return {name: column for name, column in columns.items()
            if column and min(len(values) for values in column.values()) >= MIN_SEEDS}


def ranks_by_spread(column: dict[str, list[float]]) -> dict[str, int]:
    """Rank 1 + the number of rows whose worst seed beats this row's best seed: rows within each other's seed spread
    share a rank."""
    return {scheme: 1 + sum(min(other) > max(values) for other in column.values()) for scheme, values in column.items()}


def gpu_speed(scheme: str) -> float:
    """The scheme's slowest training speed relative to absolute on the H100 (1 for absolute itself)."""
    return 1.0 if scheme == "absolute" else min(row["ratio"] for row in h100_model_rows(scheme))


def choose_default(columns: dict[str, dict[str, list[float]]]) -> tuple[str, dict[str, dict]]:
    """The rule: among the schemes with a committed recipe (RECIPES; the control `none` has none), measured in every
    column, whose GPU speed is at least SPEED_FLOOR x absolute's, the one whose worst rank over the columns is best;
    equal worst ranks go to the faster. Only the columns of `ranked_columns` count. Returns the choice and, per scheme,
    its ranks, worst rank, speed and why it is out (None when it is a candidate)."""
    ranks = {name: ranks_by_spread(column) for name, column in ranked_columns(columns).items()}
    table_rows = {}
    for scheme in SCHEMES:
        speed = gpu_speed(scheme) if h100_model_rows(scheme) or scheme == "absolute" else None
        scheme_ranks = {name: column_ranks.get(scheme) for name, column_ranks in ranks.items()}
        missing = [name for name, rank in scheme_ranks.items() if rank is None]
        out = (NO_RECIPE if scheme not in RECIPES else
               "not measured on the GPU" if speed is None else
               f"slower than {SPEED_FLOOR} x absolute" if speed < SPEED_FLOOR else
               f"not measured in {len(missing)} column(s)" if missing else None)
        worst = None if missing else max(scheme_ranks.values())
        table_rows[scheme] = {"ranks": scheme_ranks, "worst": worst, "speed": speed, "out": out}
    candidates = [scheme for scheme, row in table_rows.items() if row["out"] is None]
    choice = min(candidates, key=lambda scheme: (table_rows[scheme]["worst"], -table_rows[scheme]["speed"]))
    return choice, table_rows


# The two Multi30k sets every column of the rule is drawn from, as the column names spell them. Both were read while
# the recipes' shared settings were chosen (README, "Which sets chose which settings"), and both are columns here.
RULE_SETS = ("validation", "test2016")


def outcome_on_one_set(columns: dict[str, dict[str, list[float]]], name: str) -> str:
    """The rule applied to the columns drawn from one set alone (`name` in the column's name), in words: its choice, and
    the candidates that share the choice's worst rank (the tie the GPU speed breaks), or why it chooses none."""
    subset = {column: values for column, values in columns.items() if name in column}
    if not ranked_columns(subset):
        return f"no {name} column counts"
    try:
        choice, rows = choose_default(subset)
    except ValueError:   # no candidate measured in every column of the set
        return f"no candidate measured in every {name} column"
    tied = [f"`{scheme}`" for scheme, row in rows.items()
            if scheme != choice and row["out"] is None and row["worst"] == rows[choice]["worst"]]
    tie = f" (tied on worst rank with {', '.join(tied)}, the faster on the GPU)" if tied else ""
    return f"**`{choice}`**{tie}"


def long_input_records() -> list[str]:
    """The names of the long-input records (docs/results/long_inputs/<name>/long_inputs.json)."""
    return [path.parent.name for path in sorted((RESULTS / LONG_INPUTS).glob("*/long_inputs.json"))]


def readme_default_rule() -> str:
    """README: the rule's outcome and each scheme's ranks; a long-input record's levels shown as one column, the
    scheme's worst rank over them (docs/results.md has every level)."""
    columns = default_rule_columns()
    choice, rows = choose_default(columns)
    ranked = ranked_columns(columns)
    records = long_input_records()
    shown = {name: [name] for name in ranked if not any(name.startswith(f"{record}: ") for record in records)}
    for record in records:
        levels = [name for name in ranked if name.startswith(f"{record}: ")]
        if levels:
            shown[f"{record}, worst over its {len(levels)} levels"] = levels

    def rank(ranks: dict[str, int | None], names: list[str]) -> str:
        values = [ranks.get(name) for name in names]
        return UNMEASURED if None in values else str(max(values))

    body = [[f"`{scheme}`", f"{row['speed']:.2f}" if row["speed"] is not None else UNMEASURED,
             *(rank(row["ranks"], names) for names in shown.values()),
             str(row["worst"]) if row["worst"] is not None else "-", row["out"] or "candidate"]
            for scheme, row in rows.items()]
    set_aside = [name for name in columns if name not in ranked]
    for record in records:   # a long-input record with no level counted is named once, not level by level
        levels = [name for name in columns if name.startswith(f"{record}: ")]
        if levels and all(name in set_aside for name in levels):
            set_aside = [name for name in set_aside if name not in levels] + [f"the {len(levels)} levels of `{LONG_INPUTS}/{record}`"]
    if not records:
        missing = (" Not yet among the columns: the long-input levels (`experiments/long_inputs.py`, no record yet), "
                   "so this outcome rests on test2016 and validation only.")
    elif set_aside:
        missing = f" Set aside, a scheme there having fewer than {MIN_SEEDS} seeds: {'; '.join(set_aside)}."
    else:
        missing = ""
    long_inputs_link = "".join(f", [`{LONG_INPUTS}/{record}`](docs/results/{LONG_INPUTS}/{record}/long_inputs.md)"
                               for record in records)
    caption = (f"Outcome on the records as they are: **`{choice}`**.{missing} Columns: the one-commit records "
               f"([`{ONE_COMMIT}`](docs/results/{ONE_COMMIT}), [`{TWENTY_EPOCHS_ONE_COMMIT}`]"
               f"(docs/results/{TWENTY_EPOCHS_ONE_COMMIT}){long_inputs_link}), each recipe as committed now; GPU "
               f"speed: the slowest of the H100 training ratios to `absolute` ([`{H100_CHECK}`]"
               f"(docs/results/{H100_CHECK}/README.md)).")
    one_set = {name: outcome_on_one_set(columns, name) for name in RULE_SETS}
    agreement = (" Each set alone gives the outcome of both." if all(
        outcome.startswith(f"**`{choice}`**") for outcome in one_set.values()) else
        " Not every set alone gives the outcome of both.")
    caption += (" The rule on the columns of one set alone (a long-input level counts for the set its captions come "
                "from): " + "; ".join(f"{name}, {outcome}" for name, outcome in one_set.items()) + "." + agreement
                + "\n\n")
    return caption + table(["scheme", "GPU speed vs absolute (slowest)", *(f"rank: {name}" for name in shown),
                            "worst rank", "status"], body)


# --- docs/results.md ----------------------------------------------------------------------------------------------

def results_equal_budget_schemes() -> str:
    return vs_marian_passage("vs_marian/eight_schemes_three_seeds/vs_marian.json")


def results_recipes_equal_budget() -> str:
    return "\n".join(vs_marian_passage(path) for path in ("vs_marian/recipes_equal_budget/vs_marian.json",
                                                            "vs_marian/recipe_absolute_seed1/vs_marian.json"))


def results_recipes_one_commit() -> str:
    return vs_marian_passage(ONE_COMMIT)


def results_attention_dropout() -> str:
    return vs_marian_passage("vs_marian/attention_dropout_xl/vs_marian.json")


def results_convergence() -> str:
    """convergence.py's table of each record, under a caption that says only what the record holds (the script's own
    caption quotes pairs per step, which only the newer records measured)."""
    passages = []
    for path in (TWENTY_EPOCHS_ONE_COMMIT, TWENTY_EPOCHS_SEED_3, "convergence/recipes_seeds_1_2/convergence.json",
                 "convergence/peer_seed_1/convergence.json"):
        record = read(path)
        settings = record["settings"]
        peer = (f"`{convergence.PEER_AS_RECIPE}` (HF MarianMTModel) trained exactly as the recipes are"
                if convergence.PEER_AS_RECIPE in settings["systems"] else
                f"the peer with vs_marian.py's sentence batches and {settings['peer_warmup_steps']} warm-up steps")
        caption = convergence_caption(record, f"the recipes as committed at the runs' code version, {peer}")
        passages.append(provenance(record, path, convergence_command(record)) + "\n" + caption + "\n\n"
                        + "\n".join(convergence.tables(record)) + "\n")
    return "\n".join(passages)


# After the recipes' 20 epochs: the averaged weights of TWENTY_EPOCHS_SEED_3's runs on long inputs.
LONG_INPUTS_TWENTY_EPOCHS_SEED_3 = f"{LONG_INPUTS}/converged_seed_3_d34293a/long_inputs.json"


def results_long_inputs_twenty_epochs() -> str:
    return long_inputs_passage(LONG_INPUTS_TWENTY_EPOCHS_SEED_3)


def results_convergence_three_seeds() -> str:
    """Seeds 1 and 2 of the one-commit 20-epoch record with seed 3 (another commit, another GPU) in one table: each
    recipe's runs that trained it as committed now (`committed_recipe_runs`, so `xl` has seed 3 alone) and the peer
    trained as the recipes; then the rule for the default with those 20-epoch columns."""
    paths = (TWENTY_EPOCHS_ONE_COMMIT, TWENTY_EPOCHS_SEED_3)
    runs: dict[str, list[dict]] = defaultdict(list)
    sources = []
    for path in paths:
        record, record_runs = read(path), read_run_records(RESULTS / path)
        committed = {(run.system, run.seed) for _, run in committed_recipe_runs(path)}
        for system, system_runs in record["runs"].items():
            runs[system] += [run for run in system_runs
                             if system == convergence.PEER_AS_RECIPE or (system, run["seed"]) in committed]
        seeds = sorted({run.seed for run in record_runs})
        sources.append(f"[`{path}`](results/{path}): seed{'s' if len(seeds) > 1 else ''} "
                       f"{', '.join(map(str, seeds))}, code {code_versions(record_runs)}, "
                       f"{record['device'].split(',')[0]}")
    systems = [system for system in runs if runs[system]]   # the first record's order, then any the second adds
    summary = {"systems": convergence.summarize({system: runs[system] for system in systems})}
    return (f"Records {'; '.join(sources)}. "
            "Each recipe's runs that trained it as committed now (so `xl`, whose seeds 1 and 2 ran with attention "
            "dropout 0, has seed 3 alone), the peer trained as the recipes are. Decoding as above. Mean over seeds "
            "(min-max).\n\n" + "\n".join(convergence.table(summary)) + "\n\nThe rule for the default "
            f"([How the default is chosen](../README.md#how-the-default-is-chosen)) with these 20-epoch columns in "
            f"place of the one-commit record's: {three_seed_rule_outcome(default_rule_columns(paths))}\n")


def three_seed_rule_outcome(columns: dict[str, dict[str, list[float]]]) -> str:
    """The rule's outcome on `columns` (its 20-epoch columns of three seeds), said over the columns that enter it: a
    scheme with fewer than MIN_SEEDS seeds in the 20-epoch columns (`xl`, seed 3 alone) sets both aside, so the
    outcome is given again with that scheme left out of them, as the one-commit columns leave it out."""
    twenty = [name for name in columns if name.startswith("20 epochs, ")]
    few = {scheme: len(seeds) for name in twenty for scheme, seeds in columns[name].items() if len(seeds) < MIN_SEEDS}
    choice = choose_default(columns)[0]
    if not few:
        return f"**`{choice}`**."
    one_commit, ranked = default_rule_columns(), ranked_columns(columns)
    if any(name in ranked for name in twenty) or any(scheme in one_commit[name] for scheme in few for name in twenty):
        raise ValueError(f"three_seed_rule_outcome: 20-epoch columns {twenty} hold {sorted(few)} with fewer than "
                         f"{MIN_SEEDS} seeds in other ways than the sentence it writes says")
    without = {name: {scheme: seeds for scheme, seeds in column.items() if name not in twenty or scheme not in few}
               for name, column in columns.items()}
    ranked_without = ranked_columns(without)
    if not all(name in ranked_without for name in twenty):
        raise ValueError(f"three_seed_rule_outcome: the 20-epoch columns {twenty} still do not enter the rule")
    named = " and ".join(f"`{scheme}`" for scheme in few)
    counts = ", ".join(f"`{scheme}` has {count}" for scheme, count in few.items())
    seeds = f"{named}'s one seed" if set(few.values()) == {1} else f"the seeds of {named}"
    return (f"its count of seeds set aside both 20-epoch columns ({MIN_SEEDS} seeds a scheme at least; {counts}), so "
            f"the outcome, **`{choice}`**, rests on the other columns; with {seeds} left out of them, as the one-commit "
            f"columns have no {named}, both enter and the rule chooses **`{choose_default(without)[0]}`**.")


LENGTH_SCALED = "length_generalization_issue18/window2_d128_length_scaled_seed{}/length_generalization.json"


def results_length_generalization() -> str:
    """Exact-match accuracy per seed of Shaw, window 2, d_model 128, cross-attention length scaling."""
    rows, by_bucket = [], {}
    for seed in range(1, 7):
        record = read(LENGTH_SCALED.format(seed))
        (run,) = read_run_records(RESULTS / LENGTH_SCALED.format(seed))
        rows.append([str(seed), record["date"][:10], *(f"{100 * run.metrics[bucket]['accuracy']:.1f} %"
                                                       for bucket in record["buckets"])])
        for bucket in record["buckets"]:
            by_bucket.setdefault(bucket, []).append(100 * run.metrics[bucket]["accuracy"])
    rows.append(["mean", "", *(f"{statistics.mean(values):.1f} %" for values in by_bucket.values())])
    settings = record["settings"]
    caption = (f"`{run.system}`: {settings['steps']} steps, d_model {settings['d_model']}, {settings['layers']} + "
               f"{settings['layers']} layers, trained on lengths {record['train_lengths'][0]}-"
               f"{record['train_lengths'][1]}; {settings['eval_size']} sequences per bucket drawn with evaluation seed "
               f"{settings['eval_seed']}; {record['device']['cpu']}, torch {record['device']['torch']}. Records: "
               f"[`{LENGTH_SCALED.format('N').rsplit('/', 1)[0]}`](results/length_generalization_issue18/).\n\n")
    return caption + table(["seed", "date", *(f"exact match {bucket}" for bucket in by_bucket)], rows)


# --- docs/training.md ----------------------------------------------------------------------------------------------

DECODING_STUDY = "vs_marian/decoding_study"


def training_length_penalty() -> str:
    """vs_marian.py's decoding study: each model's BLEU with length penalty 1.0 minus with the table's 0.6, per set."""
    rows, gains = [], []
    for path in sorted((RESULTS / DECODING_STUDY).glob("*/decoding.json")):
        for run, variants in json.loads(path.read_text(encoding="utf-8")).items():
            table_setting = next(name for name in variants if name.endswith("(the table's)"))
            gain = {split: variants["lp 1.0"][split]["bleu"] - variants[table_setting][split]["bleu"]
                    for split in ("test", "validation")}
            gains += gain.values()
            rows.append([run, table_setting.removesuffix(" (the table's)"), f"{gain['test']:+.2f}",
                         f"{gain['validation']:+.2f}"])
    caption = (f"Records [`{DECODING_STUDY}/*/decoding.json`](results/{DECODING_STUDY}/) (the same trained models "
               f"decoded both ways, `python experiments/vs_marian.py --decoding-study`): length penalty 1.0 gains "
               f"{min(gains):.2f} to {max(gains):.2f} BLEU over 0.6.\n\n")
    return caption + table(["model", "decoding otherwise", "test2016 BLEU, lp 1.0 - lp 0.6",
                            "validation BLEU, lp 1.0 - lp 0.6"], rows)


# --- docs/benchmarks.md -------------------------------------------------------------------------------------------

def benchmark_report(stem: str, renderer: Callable[..., str]) -> Callable[[], str]:
    def render() -> str:
        path = f"{stem}.json"
        record = read(path)
        body = renderer(record["meta"], record.get("training", record.get("decoding")),
                        *((record["memory_growth"],) if "memory_growth" in record else ()))
        return f"Record: [`{path}`](results/{path}).\n\n" + without_title(body.replace("\n## ", "\n#### ")) + "\n"
    return render


def training_before_after(before_stem: str, after_stem: str) -> Callable[[], str]:
    """Two bench_training records of the same command side by side: each scheme's ratio to absolute (and tokens/s)
    per benchmark and length, with both runs' code versions, clocks and commands."""
    def render() -> str:
        records = [read(f"{stem}.json") for stem in (before_stem, after_stem)]
        lines = []
        for label, stem, record in zip(("Before", "After"), (before_stem, after_stem), records, strict=True):
            meta = record["meta"]
            lines.append(f"- {label}: record [`{stem}.json`](results/{stem}.json), code `{meta['code']}`, clock "
                         f"{meta['clock']}, {meta['device_name']}, {meta['cpu_threads']} thread(s), torch "
                         f"{meta['torch']}; `{meta['command']}`")
        keyed = [{(r["benchmark"], r["shape"], r["length"], r["batch"], r["scheme"]): r for r in record["training"]}
                 for record in records]
        rows = [[*map(str, key[:4]), key[4], f"{before['ratio']:.3f}", f"{keyed[1][key]['ratio']:.3f}",
                 f"{before['tokens_per_s']:.0f}", f"{keyed[1][key]['tokens_per_s']:.0f}"]
                for key, before in keyed[0].items() if key in keyed[1]]
        return "\n".join(lines) + "\n\n" + table(
            ["benchmark", "shape", "n", "batch", "scheme", "ratio before", "ratio after", "tokens/s before",
             "tokens/s after"], rows)
    return render


SAVED_MODELS = "length_generalization_issue18/window2_d128_length_scaled_saved_models"


def results_length_generalization_fresh_sets() -> str:
    """Each saved model (one per training seed) on the selection sets (evaluation seed 1234) and on sets never looked
    at (2026), with the mean over the seeds."""
    rows, by_column = [], {}
    seed_folders = sorted((RESULTS / SAVED_MODELS).glob("seed*"), key=lambda folder: int(folder.name[4:]))
    for folder in seed_folders:
        for purpose, seed in (("chose the settings", 1234), ("never looked at", 2026)):
            record = read(f"{SAVED_MODELS}/{folder.name}/eval_seed_{seed}/saved_models.json")
            (run,) = read_run_records(RESULTS / SAVED_MODELS / folder.name / f"eval_seed_{seed}" / "saved_models.json")
            accuracies = [100 * run.metrics[bucket]["accuracy"] for bucket in record["buckets"]]
            by_column.setdefault(seed, []).append(accuracies)
            rows.append([folder.name[4:], str(seed), purpose, str(record["settings"]["eval_size"]),
                         *(f"{value:.1f} %" for value in accuracies)])
    for seed, purpose in ((1234, "chose the settings"), (2026, "never looked at")):
        means = [statistics.mean(column) for column in zip(*by_column[seed], strict=True)]
        rows.append([f"mean of {len(by_column[seed])}", str(seed), purpose, "", *(f"{value:.1f} %" for value in means)])
    caption = (f"`{run.system}`, one saved model per training seed, scored without training (`--evaluate-saved`) on "
               f"two evaluation seeds' sets; {record['device']['cpu']}, torch {record['device']['torch']}. Records and "
               f"commands: [`{SAVED_MODELS}`](results/{SAVED_MODELS}/).\n\n")
    return caption + table(["training seed", "evaluation seed", "its sets", "sequences per bucket",
                            *(f"exact match {bucket}" for bucket in record["buckets"])], rows)


def marian_conversion_passage(path: str) -> Callable[[], str]:
    """The Marian conversion experiments: the record and its command, then marian_conversion.py's own tables."""

    def passage() -> str:
        record = read(path)
        settings = record["settings"]
        fade = f" --fade-steps {settings['fade_steps']}" if settings.get("fade_steps") else ""
        command = (f"python experiments/marian_conversion.py --marian-model {settings['marian_model']} --schemes "
                   f"{' '.join(settings['schemes'])}{fade} --seeds {' '.join(map(str, settings['seeds']))} "
                   f"--finetune-steps {settings['finetune_steps']} --eval-every {settings['eval_every']} "
                   f"--eval-sentences {settings['eval_sentences']} --test-sentences {settings['test_sentences']} "
                   f"--long-pairs {settings['long_pairs']} --num-beams {settings['num_beams']}")
        joined = (" (one invocation per seed, joined with `--merge`)" if "merged_from" in record else "")
        return (f"Record [`{path}`](results/{path}){joined}. Command: `{command}`.\n\n"
                + without_title(marian_conversion.markdown(record)))

    return passage


def long_inputs_command(settings: dict) -> str:
    """The long_inputs.py command line of a record's settings: every one that is not the script's default (its models
    as given)."""
    return command_line("experiments/long_inputs.py", long_inputs.build_parser(), settings)


# The decoding study for long inputs: the same models decoded by several settings, one long_inputs.py record each,
# docs/results/long_input_decoding/<name>/ (not among the rule's long-input records: one decoding per column there).
LONG_INPUT_DECODING = "long_input_decoding"
DECODING_STUDY_LEVELS = ("1 caption", "4 as one sentence", "4 as sentences", "longest 10 %")


def decoding_name(settings: dict) -> str:
    """A long_inputs.py record's decoding in words: its length penalty, and its options (a minimum length, blocked
    repeated n-grams), if any."""
    minimum, blocked = settings.get("min_len_a"), settings.get("no_repeat_ngram_size")
    return (f"length penalty {settings['length_penalty']}"
            + (f", at least {minimum} x source tokens" if minimum is not None else "")
            + (f", no repeated {blocked}-gram" if blocked is not None else ""))


def decoding_options(settings: dict) -> tuple[float, int]:
    """A record's decoding options, (minimum length, blocked n-gram size), 0 where unset: (0, 0) is none."""
    return settings.get("min_len_a") or 0, settings.get("no_repeat_ngram_size") or 0


def results_long_input_decoding() -> str:
    """The decoding study's records side by side: per system and decoding, BLEU (min-max over seeds) and hyp/ref
    per level and set, at 4 as one sentence also chrF and the outputs at the length cap per seed, and the share kept
    there; then each decoding option against the same models at the same length penalty without any
    (`long_inputs.decoding_verdict`)."""
    paths = sorted((RESULTS / LONG_INPUT_DECODING).glob("*/long_inputs.json"))
    if not paths:
        return "No record yet.\n"
    records = [json.loads(path.read_text(encoding="utf-8")) for path in paths]
    records.sort(key=lambda record: (record["settings"]["length_penalty"], *decoding_options(record["settings"])))
    first = records[0]
    scored_by = sorted({run["scored_by"] for record in records for runs in record["runs"].values() for run in runs})
    collected_at = sorted({record["source_version"] for record in records})
    lines = [f"Records `{LONG_INPUT_DECODING}/*/long_inputs.json`, one per decoding (the models, how they were trained "
             f"and the commands: [its README](results/{LONG_INPUT_DECODING}/README.md)), decoded by code "
             f"`{'`, `'.join(scored_by)}` and collected at `{'`, `'.join(collected_at)}` on {first['date'][:10]}; "
             f"{first['device']}. Beam {first['settings']['beams']}, at most {first['settings']['max_len_a']}"
             f" x source tokens + {first['settings']['max_len_b']} new tokens, no sentence splitting. Cells: BLEU mean "
             "(min-max over seeds) / hyp/ref; at 4 as one sentence also chrF (mean) and the outputs that used every "
             "new token their cap allowed, per seed; kept: BLEU at 4 as one sentence as a % of single-caption BLEU, "
             "mean (min-max).", ""]
    for set_name in long_inputs.SETS:
        levels = [f"{set_name}: {level}" for level in DECODING_STUDY_LEVELS]
        lines += [f"**{set_name}**", "", "| system | seeds | decoding | "
                  + " | ".join(f"{level.split(': ')[1]} ({first['sizes'][level]})" for level in levels)
                  + " | 4 as one sentence: chrF, at the cap | kept, % |", "|" + " --- |" * (len(levels) + 5)]
        for system in first["levels"][levels[0]]:
            for record in records:
                rows = [record["levels"][level][system] for level in levels]
                joined = record["levels"][f"{set_name}: {long_inputs.OPTION_LEVEL}"][system]
                kept = long_inputs.bleu_kept(record, f"{set_name}: {long_inputs.OPTION_LEVEL}", system)
                lines.append(f"| {system} | {', '.join(map(str, rows[0]['seeds']))} | {decoding_name(record['settings'])} | "
                             + " | ".join(f"{vs_marian.spread(row['bleu'])} / {statistics.mean(row['length_ratio']):.2f}"
                                          for row in rows)
                             + f" | {statistics.mean(joined['chrf']):.1f}, {' / '.join(map(str, joined['at_cap']))}"
                             + f" | {vs_marian.spread(kept, 1) if kept else '-'} |")
        lines.append("")
    lines += ["The criterion (docs/results.md 5b, stated before each option's first number on a recipe model): a "
              "decoding option (a minimum length, blocked repeated n-grams) becomes the recipes' saved decoding only "
              "if, on validation, it raises BLEU at 4 as one sentence over the same length penalty without it for "
              "every model and lowers none's single-caption BLEU by more than "
              f"{long_inputs.DECODING_OPTION_COST}.", "",
              "| decoding | against | validation, 4 as one sentence: mean change (smallest) | validation, 1 caption: "
              "mean change | verdict |", "| --- | --- | --- | --- | --- |"]
    for record in records:
        baseline = next((other for other in records if decoding_options(other["settings"]) == (0, 0)
                         and other["settings"]["length_penalty"] == record["settings"]["length_penalty"]), None)
        if decoding_options(record["settings"]) == (0, 0) or baseline is None:
            continue
        verdict, figures = long_inputs.decoding_verdict(baseline, record)
        changes = (f"{figures['joined gain']:+.2f} ({figures['smallest joined gain']:+.2f}) | "
                   f"{figures['single gain']:+.2f}" if figures else "- | -")
        lines.append(f"| {decoding_name(record['settings'])} | {decoding_name(baseline['settings'])} | {changes} | "
                     f"{verdict} |")
    return "\n".join(lines) + "\n"


def long_inputs_passage(relative: str) -> str:
    """One experiments/long_inputs.py record: its provenance, then the script's own tables."""
    record = read(relative)
    return (f"Record [`{relative}`](results/{relative}), collected {record['date'][:10]}; {record['device']}; code "
            f"`{record['source_version']}`; torch {record['versions']['torch']}, transformers "
            f"{record['versions']['transformers']}. Command: `{long_inputs_command(record['settings'])}`.\n\n"
            + without_title(long_inputs.markdown(record)).replace("\n## ", "\n#### "))


def results_long_inputs() -> str:
    """experiments/long_inputs.py's records of models trained at the equal budget, each with its provenance and the
    script's own tables (the record of the 20-epoch models has its own passage)."""
    passages = [long_inputs_passage(relative) for path in sorted((RESULTS / LONG_INPUTS).glob("*/long_inputs.json"))
                if (relative := path.relative_to(RESULTS).as_posix()) != LONG_INPUTS_TWENTY_EPOCHS_SEED_3]
    return "\n".join(passages) if passages else (
        "No record yet: the trained models of the one-commit tables were not kept where this was written, and the "
        "three-seed runs need a machine with the time for them.\n")


# The joined-pair study at the recipes' 20 epochs (docs/results.md 5b): convergence.py's record of the runs and
# long_inputs.py's record of their averaged weights, with `--baseline shaw`. The long-input goal: the option keeps at
# least this % of its single-caption BLEU at long_inputs.OPTION_LEVEL on both sets, besides meeting the criterion.
JOINED_PAIRS_20_EPOCHS = "joined_pairs_20_epochs"
LONG_INPUT_KEPT_GOAL = 70.0


def joined_pairs_goal(record: dict) -> str:
    """Each option of a long_inputs.py record against its recipe: the criterion's verdict and the long-input goal."""
    lines = []
    for option, recipe in long_inputs.option_rows(record):
        verdict, figures = long_inputs.option_verdict(record, option, recipe)
        kept = {set_name: figures[f"{set_name} kept"] for set_name in long_inputs.SETS if f"{set_name} kept" in figures}
        reached = len(kept) == len(long_inputs.SETS) and min(kept.values()) >= LONG_INPUT_KEPT_GOAL
        outcome = ("not decided" if verdict.startswith("not decided") else
                   "met" if verdict == "adopted" and reached else "not met")
        shares = " and ".join(f"{value:.1f} % on {set_name}" for set_name, value in kept.items())
        lines.append(f"`{option}` against `{recipe}`: {verdict}. At `{long_inputs.OPTION_LEVEL}` it keeps {shares} "
                     f"of its single-caption BLEU (the long-input goal: at least {LONG_INPUT_KEPT_GOAL:g} % on both "
                     f"sets, with the criterion met): goal {outcome}.")
    return "\n".join(lines) + "\n"


def results_joined_pairs_20_epochs() -> str:
    """The joined-pair study at the recipes' 20 epochs: the training record (convergence.py's tables), the long-input
    record of the same averaged weights (long_inputs.py's tables, the criterion's verdict), and the long-input goal."""
    training_path = f"{JOINED_PAIRS_20_EPOCHS}/convergence.json"
    long_path = f"{JOINED_PAIRS_20_EPOCHS}/long_inputs.json"
    record = read(training_path)
    options = "".join(f", `{system}` with `{' '.join(convergence.RECIPE_OPTIONS[system][1])}` added"
                      for system in record["settings"]["systems"] if system in convergence.RECIPE_OPTIONS)
    caption = (convergence_caption(record, "each system for the epochs of its own training set, the recipe as "
                                           f"committed at the runs' code version{options}")
               + (" The train min of a run on a CPU is not a speed figure: such runs shared the machine (the record's "
                  "README)." if any(device.startswith("CPU") for device in run_devices(record)) else "") + "\n\n")
    return (provenance(record, training_path, convergence_command(record)) + "\n" + caption
            + "\n".join(convergence.tables(record)) + "\n\n" + long_inputs_passage(long_path) + "\n"
            + joined_pairs_goal(read(long_path)))


MARIAN_HYBRID = "marian_conversion/peer_hybrid/marian_conversion.json"
MARIAN_LONG_BUCKET = "marian_conversion/peer_hybrid/long_bucket.json"


def long_bucket_length_ratios(path: str = MARIAN_HYBRID) -> dict[str, list[float]]:
    """Hypothesis/reference length on the long-sentence bucket after fine-tuning, per scheme, seed by seed."""
    schemes = read(path)["schemes"]
    return {scheme: [seed["finetuned_long"]["length_ratio"] for _, seed in sorted(entry["seeds"].items())]
            for scheme, entry in schemes.items()}


def results_marian_long_lengths() -> str:
    ratios = long_bucket_length_ratios()
    every = [value for values in ratios.values() for value in values]
    hybrids = [value for scheme, values in ratios.items() if scheme != "shaw" for value in values]
    caption = (f"Record [`{MARIAN_HYBRID}`](results/{MARIAN_HYBRID}): the long bucket's hypothesis/reference length "
               f"after fine-tuning, seeds 1, 2, 3: {min(hybrids):.2f} to {max(hybrids):.2f} for `absolute` kept and "
               f"both hybrids, {min(every):.2f} at the lowest.\n\n")
    bucket = read(MARIAN_LONG_BUCKET)
    lengths = (f"\n\nRecord [`{MARIAN_LONG_BUCKET}`](results/{MARIAN_LONG_BUCKET}) (`{bucket['command']}`): the bucket's "
               f"{bucket['pairs']} sources have {bucket['source_tokens']['mean']:.1f} tokens on average (at most "
               f"{bucket['source_tokens']['max']}) and its references {bucket['reference_tokens']['mean']:.1f} (at most "
               f"{bucket['reference_tokens']['max']}), under the recipes' tokenizer (that of the folder in the command), `</s>` included. The long-input records' "
               f"source-relative cap ({bucket['max_len_a']:g} x source tokens + {bucket['max_len_b']}) is "
               f"{bucket['source_relative_caps']['min']} to {bucket['source_relative_caps']['max']} new tokens per "
               f"source (the smallest, {bucket['source_relative_caps']['min'] / bucket['reference_tokens']['mean']:.1f} "
               f"times the references' mean length); it exceeds the fixed {bucket['max_new_tokens']} these runs decoded with for "
               f"{bucket['sources_whose_relative_cap_exceeds_max_new_tokens']} of them.\n")
    return caption + table(["position_scheme", "long-bucket hyp/ref, seeds 1 / 2 / 3"],
                           [[scheme, " / ".join(f"{value:.2f}" for value in values)] for scheme, values in
                            ratios.items()]) + lengths


# The hybrids of section 6 on the long inputs: long_inputs.py's record of Marian (the peer the conversions
# start from) and of its fine-tuned conversions, one fine-tuning seed per run.
MARIAN_HYBRID_LONG_INPUTS = "marian_conversion/peer_hybrid_long_inputs/long_inputs.json"
HYBRID_LEVELS = ("1 caption", "4 as one sentence", "longest 10 %")


def results_marian_hybrid_long_inputs() -> str:
    """Per model and set: BLEU on single captions, at 4 captions as one sentence (with its length ratio and the share
    of single-caption BLEU kept) and on the longest tenth, and the outputs that reached the cap on the long levels."""
    record = read(MARIAN_HYBRID_LONG_INPUTS)
    settings = record["settings"]
    levels = record["levels"]
    rows = []
    for system in levels[next(iter(levels))]:
        for set_name in long_inputs.SETS:
            single, joined, longest = (levels[f"{set_name}: {level}"][system] for level in HYBRID_LEVELS)
            capped = " / ".join(str(sum(levels[f"{set_name}: {level}"][system]["at_cap"]))
                                for level in HYBRID_LEVELS[1:])
            rows.append([system, ", ".join(map(str, single["seeds"])), set_name, vs_marian.spread(single["bleu"]),
                         f"{vs_marian.spread(joined['bleu'])}, {statistics.mean(joined['length_ratio']):.2f}",
                         vs_marian.spread(long_inputs.bleu_kept(record, f"{set_name}: {HYBRID_LEVELS[1]}", system), 1),
                         f"{vs_marian.spread(longest['bleu'])}, {statistics.mean(longest['length_ratio']):.2f}", capped])
    sizes = record["sizes"]
    caption = (f"Record [`{MARIAN_HYBRID_LONG_INPUTS}`](results/{MARIAN_HYBRID_LONG_INPUTS}) (its README has the "
               f"models' provenance), collected {record['date'][:10]}; {record['device']}; code "
               f"`{record['source_version']}`. Beam {settings['beams']}, length penalty {settings['length_penalty']}, "
               f"at most {settings['max_len_a']:g} x source tokens + {settings['max_len_b']} new tokens per source. "
               "BLEU mean (min-max over the fine-tuning seeds); hyp/ref: the mean length ratio; kept: the BLEU at 4 "
               "captions as one sentence as a % of the same model's single-caption BLEU; at the cap: the outputs that "
               f"used every new token their cap allowed, summed over seeds (of {sizes['test2016: 4 as one sentence']} / "
               f"{sizes['validation: 4 as one sentence']} inputs at 4 as one sentence, test2016 / validation, and "
               f"{sizes['test2016: longest 10 %']} / {sizes['validation: longest 10 %']} in the longest tenth).\n\n")
    return caption + table(["model", "seeds", "set", "1 caption BLEU", "4 as one sentence: BLEU, hyp/ref", "kept, %",
                            "longest 10 %: BLEU, hyp/ref", "at the cap: 4 as one sentence / longest 10 %"], rows)


def h200_check_passages(code: str, check: str, earlier: str) -> dict[str, Callable[[], str]]:
    """The passages of one prepared check's record (`check`, at `code`) since step (u): its lengths, the n = 512
    timeline, its ratios beside those of the `earlier` check, and the n = 16 timeline with the host's work."""
    timeline, host_timeline = f"{check}/timeline_n512/timeline.json", f"{check}/timeline_n16/timeline.json"
    return {
        f"benchmarks_h200_relpos_triton_lengths_{code}": benchmark_report(
            f"{check}/{H200_LENGTHS_RECORD}".removesuffix(".json"), bench_training.render_markdown),
        f"benchmarks_h200_timeline_{code}": lambda: h200_timeline_table(timeline),
        f"benchmarks_h200_noise_{code}": lambda: relpos_triton_noise(check, earlier),
        f"benchmarks_h200_timeline_n16_{code}": lambda: (h200_timeline_table(host_timeline) + "\n"
                                                         + h200_host_work(host_timeline)),
    }


PASSAGES: dict[str, Callable[[], str]] = {
    "readme_quality": readme_quality,
    "readme_cost": readme_cost,
    "readme_deploy": readme_deploy,
    "benchmarks_inference_cpu": benchmarks_inference_cpu,
    "benchmarks_key_dropout": benchmarks_key_dropout,
    "readme_default_rule": readme_default_rule,
    "results_equal_budget_schemes": results_equal_budget_schemes,
    "results_recipes_equal_budget": results_recipes_equal_budget,
    "results_recipes_one_commit": results_recipes_one_commit,
    "results_convergence": results_convergence,
    "results_convergence_three_seeds": results_convergence_three_seeds,
    "results_long_inputs_twenty_epochs": results_long_inputs_twenty_epochs,
    "results_attention_dropout": results_attention_dropout,
    "results_length_generalization": results_length_generalization,
    "results_length_generalization_fresh_sets": results_length_generalization_fresh_sets,
    "results_marian_hybrid": marian_conversion_passage(MARIAN_HYBRID),
    "results_marian_long_lengths": results_marian_long_lengths,
    "results_marian_hybrid_long_inputs": results_marian_hybrid_long_inputs,
    "results_long_inputs": results_long_inputs,
    "results_joined_pairs_20_epochs": results_joined_pairs_20_epochs,
    "results_long_input_decoding": results_long_input_decoding,
    "results_marian_fade": marian_conversion_passage("marian_conversion/peer_hybrid_fade/marian_conversion.json"),
    "training_length_penalty": training_length_penalty,
    "benchmarks_query_blocks": training_before_after("benchmarks/query_blocks/training_before",
                                                     "benchmarks/query_blocks/training_after"),
    "benchmarks_h200_relpos_triton": benchmark_report(H200_FIRST_TRITON.removesuffix(".json"),
                                                      bench_training.render_markdown),
    "benchmarks_h200_summary": benchmarks_h200_summary,
    "benchmarks_h200_flex": benchmark_report(f"{H200_FIRST}/training_n512_flex/training",
                                             bench_training.render_markdown),
    "benchmarks_h200_relpos_triton_3c5d2ac": benchmark_report(H200_FUSED[0].removesuffix(".json"),
                                                              bench_training.render_markdown),
    "benchmarks_h200_flex_xl_t5_3c5d2ac": benchmark_report(H200_FUSED[1].removesuffix(".json"),
                                                           bench_training.render_markdown),
    "benchmarks_h200_flex_shaw_alibi_3c5d2ac": benchmark_report(H200_FUSED[2].removesuffix(".json"),
                                                                bench_training.render_markdown),
    "benchmarks_h200_relpos_triton_lengths_cae802d": benchmark_report(H200_LENGTHS_CAE802D.removesuffix(".json"),
                                                                      bench_training.render_markdown),
    "benchmarks_h200_relpos_triton_lengths": benchmark_report(H200_LENGTHS.removesuffix(".json"),
                                                              bench_training.render_markdown),
    "benchmarks_h200_time_split": lambda: h200_time_split(H200_TUNING),
    "benchmarks_h200_time_split_8ed37f1": lambda: h200_time_split(H200_8ED37F1_TUNING),
    "benchmarks_h200_time_split_a0f821f": lambda: h200_time_split(H200_A0F821F_TUNING),
    "benchmarks_h200_time_split_e8f9f2f": lambda: h200_time_split(H200_E8F9F2F_TUNING),
    "benchmarks_h200_time_split_d34293a": lambda: h200_time_split(H200_LATEST_TUNING),
    "benchmarks_host_overhead": host_overhead_before_after,
    "benchmarks_host_overhead_triton": host_overhead_through_triton(HOST_OVERHEAD_TRITON, HOST_OVERHEAD_TRITON_RUNS,
                                                                    HOST_OVERHEAD_TRITON_BF16),
    "benchmarks_host_overhead_triton_86fb072": host_overhead_through_triton(
        HOST_OVERHEAD_TRITON_86FB072, HOST_OVERHEAD_TRITON_RUNS, HOST_OVERHEAD_TRITON_BF16),
    "benchmarks_decoding_host_work": decoding_host_work_before_after,
    "benchmarks_h200_relpos_triton_lengths_8ed37f1": benchmark_report(H200_8ED37F1_LENGTHS.removesuffix(".json"),
                                                                      bench_training.render_markdown),
    "benchmarks_h200_timeline_8ed37f1": lambda: h200_timeline_table(H200_8ED37F1_TIMELINE),
    "benchmarks_h200_relpos_triton_lengths_a0f821f": benchmark_report(H200_A0F821F_LENGTHS.removesuffix(".json"),
                                                                      bench_training.render_markdown),
    "benchmarks_h200_timeline_a0f821f": lambda: h200_timeline_table(H200_A0F821F_TIMELINE),
    **h200_check_passages("e8f9f2f", H200_E8F9F2F_CHECK, H200_A0F821F_CHECK),
    **h200_check_passages("d34293a", H200_LATEST_CHECK, H200_E8F9F2F_CHECK),
    "benchmarks_h200_host_operators_d34293a": lambda: h200_extra_host_operators(H200_LATEST_HOST_TIMELINE),
    "benchmarks_h200_tuning": lambda: (f"Record: [`{H200_TUNING}`](results/{H200_TUNING}).\n\n" + without_title(
        tune_relpos_triton.render_markdown(**{key: read(H200_TUNING)[key] for key in ("meta", "timings", "profiles")})
        .replace("\n## ", "\n#### ")) + "\n"),
    "benchmarks_h100_check_n128": benchmark_report(f"{H100_CHECK}/training_n128/training", bench_training.render_markdown),
    "benchmarks_h100_check_n512": benchmark_report(f"{H100_CHECK}/training_n512/training", bench_training.render_markdown),
    "benchmarks_h100_training": benchmark_report("benchmarks_h100/training", bench_training.render_markdown),
    "benchmarks_h100_decoding": benchmark_report("benchmarks_h100/decoding", bench_decoding.render_markdown),
    "benchmarks_cpu_training": benchmark_report("benchmarks/issue16/training_after", bench_training.render_markdown),
    "benchmarks_cpu_decoding": benchmark_report("benchmarks/issue16/decoding_after", bench_decoding.render_markdown),
    "benchmarks_prepare_decoding_before": benchmark_report("benchmarks/prepare_stage/decoding_before",
                                                           bench_decoding.render_markdown),
    "benchmarks_prepare_decoding_after": benchmark_report("benchmarks/prepare_stage/decoding_after",
                                                          bench_decoding.render_markdown),
    "benchmarks_prepare_training_before": benchmark_report("benchmarks/prepare_stage/training_before",
                                                           bench_training.render_markdown),
    "benchmarks_data_preparation": lambda: (f"Record: [`{DATA_PREPARATION}`](results/{DATA_PREPARATION}).\n\n"
                                            + bench_data.render_markdown(read(DATA_PREPARATION)) + "\n"),
    "training_data_preparation_cost": lambda: bench_data.render_cost_note(read(DATA_PREPARATION)) + "\n",
    "benchmarks_prepare_training_after": benchmark_report("benchmarks/prepare_stage/training_after",
                                                          bench_training.render_markdown),
}


def render(text: str, rendered: dict[str, str], source: str) -> str:
    """`text` with every generated passage replaced by its rendering; an unknown name is an error."""
    def replace(match: re.Match) -> str:
        name = match["name"]
        if name not in PASSAGES:
            raise SystemExit(f"report.py: {source} has a passage '{name}' this script cannot render; "
                             f"known: {', '.join(PASSAGES)}")
        if name not in rendered:
            rendered[name] = PASSAGES[name]()
        return match[1] + rendered[name] + match[4]
    return PASSAGE.sub(replace, text)


def stale_passages(documents: Iterable[Path] = DOCUMENTS) -> list[str]:
    """`file: passage` for every generated passage whose text is not what its records render."""
    rendered: dict[str, str] = {}
    stale = []
    for path in documents:
        text = path.read_text(encoding="utf-8")
        fresh = render(text, rendered, path.name)
        old = {match["name"]: match["body"] for match in PASSAGE.finditer(text)}
        new = {match["name"]: match["body"] for match in PASSAGE.finditer(fresh)}
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        stale += [f"{shown}: {name}" for name in old if old[name] != new[name]]
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a passage is out of date")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_passages()
        for passage in stale:
            print(f"out of date: {passage} (run python experiments/report.py)")
        return 1 if stale else 0
    rendered: dict[str, str] = {}
    for path in DOCUMENTS:
        text = path.read_text(encoding="utf-8")
        fresh = render(text, rendered, path.name)
        if fresh != text:
            write_text_atomic(path, fresh)
            print(f"rewrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
