r"""Length generalization of the position schemes on sequence reversal, plus Shaw et al.'s ablations.

Task: reverse a sequence of letters (`c a b a </s>` -> `a b a c </s>`, 26 letters, repeats allowed). Position
matters (a bag of words cannot solve it, and with repeats the content of a letter does not say where it stands), and
the rule is the same at every length: output t is source position n + 1 - t. A model has to carry "how far from the
end of the source am I" in its encoder states and "how many letters have I written" in its decoder states; absolute
encodings give both directly for the lengths seen in training, relative schemes have to build them from offsets
(clipped at k for Shaw). Models are trained on lengths 1-20 and evaluated, greedy, on fresh sequences of lengths 1-20,
21-40 and 41-80 (exact-match accuracy and corpus sacreBLEU on the space-joined letters; exact match also per class
of the source's longest repeated run of letters: no repeated pair, a repeated pair, a repeated triple or longer).

Runs, all with the same model size, steps, batches (the same data stream) and seeds:
  - schemes:  absolute, shaw (k=16, a^K and a^V), xl, directional, none, alibi, t5, rope
  - randomized: absolute and rope trained at randomized positions (Ruoss et al. 2023, position_randomization_max)
  - eval_randomized: absolute, rope and alibi trained at randomized positions and evaluated at randomized positions
              too, as in Ruoss et al.'s code (position_randomization_at_inference)
  - k:        shaw with clipping distance k in {0, 1, 2, 4, 16} (Shaw et al. 2018, Table 2)
  - aK_aV:    shaw with a^K / a^V on and off (Table 3)
  - table_init: shaw with its a^K / a^V tables drawn at tensor2tensor's scale (relative_embedding_init_std)
  - window:   every scheme with local self-attention (self_attention_window = 2; Shaw with k = 2 and its tables at
              the default scale): no state can count the tokens of a sequence, so the model has to reverse by
              matching each letter's neighbours, which does not depend on the length; and the same Shaw model
              without the window
  - window_size: Shaw with local self-attention of size w and clipping distance k = w, for w in {1, 2, 3, 4, 6, 8}
  - length_scaling: shaw, rope and t5 with the window and log-length scaled cross-attention
              (cross_attention_length_scaling, Chiang & Cholak 2022): the softmax that picks the next source letter
              keeps its sharpness on sources longer than any seen in training

Example (the figures in docs/results.md):
  python experiments/length_generalization.py --out docs/results/length_generalization --seeds 1 2 \
      --save-models /tmp/lg_models
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import string
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import torch
from sacrebleu.metrics import BLEU
from settings import json_settings
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from hf_relpos import POSITION_SCHEMES, RelPosTransformerConfig, RelPosTransformerForConditionalGeneration
from hf_relpos.publish.files import write_text_atomic
from hf_relpos.publish.records import (
    RECORDS,
    SCHEME_FIELD,
    RunRecord,
    checkout_version,
    cpu_model_name,
    software_versions,
)
from hf_relpos.tools.viz import require_matplotlib, save_figure
from hf_relpos.translation.safety import output_folder
from hf_relpos.translation.tokenization import wrap_tokenizer

ROOT = Path(__file__).resolve().parents[1]
PAD, EOS, BOS = 0, 1, 2
SPECIAL_TOKENS = ["<pad>", "</s>", "<s>", "<unk>"]
SYMBOLS = list(string.ascii_lowercase)
VOCAB_SIZE = len(SPECIAL_TOKENS) + len(SYMBOLS)
TRAIN_LENGTHS = (1, 20)
BUCKETS = ((1, 20), (21, 40), (41, 80))
K_VALUES = (0, 1, 2, 4, 16)
RANDOMIZATION_MAX = 128  # Ruoss et al. (2023): training positions drawn from 0 .. L-1, L > the longest test input
RANDOMIZED_SCHEMES = ("absolute", "rope")
EVAL_RANDOMIZED_SCHEMES = ("absolute", "rope", "alibi")
SHAW_T2T_TABLE_STD = 0.2  # tensor2tensor's fan-average init for a 33 x 16 table (k = 16, head size 64 / 4): sqrt(2 / 49)
# Every other Shaw run draws its tables at 0.02 (init_std), the default when docs/results.md section 1 was measured;
# Tensor2Tensor's scale is the default now, and "shaw table-init 0.2" is the comparison.
SHAW_TABLE_STD = 0.02
WINDOW = 2  # self_attention_window of the window group: every key within 2 positions of the query
WINDOW_SIZES = (1, 2, 3, 4, 6, 8)  # the window_size group: Shaw with window w and k = w
# Sources classed by their longest repeated run of letters: a reversal by local matching ("the letter whose right-hand
# neighbours were just written") is ambiguous where a run of letters occurs twice in the source.
REPEAT_CLASSES = ("no repeated pair", "repeated pair", "repeated triple+")


def shaw_overrides(**overrides) -> dict:
    """A Shaw run's config overrides, its tables at SHAW_TABLE_STD unless the run sets relative_embedding_init_std."""
    return {"relative_embedding_init_std": SHAW_TABLE_STD, **overrides}


@dataclass(frozen=True)
class RunSpec:
    """One trained configuration: a name, the scheme, its config overrides and the result groups it belongs to."""

    name: str
    position_scheme: str
    overrides: dict = field(default_factory=dict)
    groups: tuple[str, ...] = ()


def run_specs() -> list[RunSpec]:
    """The main comparison (every registered scheme) and the Shaw ablations; the full Shaw model (k=16, a^K and a^V) is
    shared by the first three groups."""
    full_shaw = RunSpec("shaw", "shaw", shaw_overrides(max_relative_position=16), ("schemes", "k", "aK_aV"))
    specs = [full_shaw if scheme == "shaw" else RunSpec(scheme, scheme, {}, ("schemes",))
             for scheme in POSITION_SCHEMES]
    specs += [
        RunSpec(f"{scheme} randomized L={RANDOMIZATION_MAX}", scheme, {"position_randomization_max": RANDOMIZATION_MAX},
                ("randomized",))
        for scheme in RANDOMIZED_SCHEMES
    ]
    specs += [
        RunSpec(f"{scheme} randomized L={RANDOMIZATION_MAX} eval-randomized", scheme,
                {"position_randomization_max": RANDOMIZATION_MAX, "position_randomization_at_inference": True},
                ("eval_randomized",))
        for scheme in EVAL_RANDOMIZED_SCHEMES
    ]
    specs += [
        RunSpec(f"shaw k={k}", "shaw", shaw_overrides(max_relative_position=k), ("k",)) for k in K_VALUES if k != 16
    ]
    for keys, values in ((True, False), (False, True), (False, False)):
        name = "shaw " + {(True, False): "a^K only", (False, True): "a^V only", (False, False): "no a^K, no a^V"}[
            (keys, values)
        ]
        overrides = shaw_overrides(max_relative_position=16, use_relative_keys=keys, use_relative_values=values)
        specs.append(RunSpec(name, "shaw", overrides, ("aK_aV",)))
    specs.append(RunSpec(f"shaw table-init {SHAW_T2T_TABLE_STD}", "shaw",
                         shaw_overrides(max_relative_position=16, relative_embedding_init_std=SHAW_T2T_TABLE_STD),
                         ("table_init",)))
    specs += [
        RunSpec(f"{scheme} window={WINDOW}", scheme,
                {"self_attention_window": WINDOW, **({"max_relative_position": WINDOW} if scheme == "shaw" else {})},
                ("window", "window_size") if scheme == "shaw" else ("window",))
        for scheme in POSITION_SCHEMES
    ]
    specs += [
        RunSpec(f"shaw window={size}", "shaw", {"self_attention_window": size, "max_relative_position": size},
                ("window_size",))
        for size in WINDOW_SIZES if size != WINDOW
    ]
    specs.append(RunSpec(f"shaw k={WINDOW}, no window", "shaw", {"max_relative_position": WINDOW}, ("window",)))
    specs += [
        RunSpec(f"{scheme} window={WINDOW} length-scaled", scheme,
                {"self_attention_window": WINDOW, "cross_attention_length_scaling": True,
                 **({"max_relative_position": WINDOW} if scheme == "shaw" else {})}, ("length_scaling",))
        for scheme in ("shaw", "rope", "t5")
    ]
    return specs


def sample_sequences(generator: torch.Generator, count: int, min_length: int, max_length: int) -> list[list[int]]:
    """`count` sequences of letter ids drawn uniformly (repeats allowed), lengths uniform in [min_length, max_length]."""
    lengths = torch.randint(min_length, max_length + 1, (count,), generator=generator)
    first_symbol = len(SPECIAL_TOKENS)
    return [
        torch.randint(first_symbol, first_symbol + len(SYMBOLS), (int(length),), generator=generator).tolist()
        for length in lengths
    ]


def longest_repeat(sequence: list[int]) -> int:
    """Length of the longest run of consecutive letters that occurs at least twice in `sequence` (overlapping
    occurrences count: `a a a` repeats `a a`); 0 when no letter repeats."""
    size = 0
    while size < len(sequence) - 1:
        runs = [tuple(sequence[start : start + size + 1]) for start in range(len(sequence) - size)]
        if len(set(runs)) == len(runs):
            break
        size += 1
    return size


def repeat_class(sequence: list[int]) -> str:
    """The REPEAT_CLASSES entry of a source sequence."""
    return REPEAT_CLASSES[min(max(longest_repeat(sequence) - 1, 0), len(REPEAT_CLASSES) - 1)]


def pad(rows: list[list[int]], value: int) -> torch.Tensor:
    width = max(len(row) for row in rows)
    return torch.tensor([row + [value] * (width - len(row)) for row in rows], dtype=torch.long)


def make_batch(sequences: list[list[int]]) -> dict[str, torch.Tensor]:
    """Source = the sequence + </s> (as a translation tokenizer encodes it); labels = the reversed sequence + </s>,
    padded with -100."""
    input_ids = pad([sequence + [EOS] for sequence in sequences], PAD)
    return {
        "input_ids": input_ids,
        "attention_mask": (input_ids != PAD).long(),
        "labels": pad([sequence[::-1] + [EOS] for sequence in sequences], -100),
    }


def to_text(ids: list[int]) -> str:
    return " ".join(SYMBOLS[i - len(SPECIAL_TOKENS)] if i >= len(SPECIAL_TOKENS) else SPECIAL_TOKENS[i] for i in ids)


def letter_tokenizer() -> PreTrainedTokenizerFast:
    """The task's vocabulary as a tokenizer (one letter = one token, "</s>" appended), saved with the models so
    that `python -m hf_relpos.tools.viz MODEL --sentence "c a b a"` works."""
    vocabulary = {token: index for index, token in enumerate(SPECIAL_TOKENS + SYMBOLS)}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", EOS)])
    return wrap_tokenizer(tokenizer)


def build_model(spec: RunSpec, args: argparse.Namespace, seed: int) -> RelPosTransformerForConditionalGeneration:
    torch.manual_seed(seed)
    config = RelPosTransformerConfig(
        vocab_size=VOCAB_SIZE, d_model=args.d_model, encoder_layers=args.layers, decoder_layers=args.layers,
        encoder_attention_heads=args.heads, decoder_attention_heads=args.heads, encoder_ffn_dim=4 * args.d_model,
        decoder_ffn_dim=4 * args.d_model, dropout=0.0, layer_norm_position="pre", position_scheme=spec.position_scheme,
        pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS, decoder_start_token_id=BOS, **spec.overrides,
    )
    return RelPosTransformerForConditionalGeneration(config)


def train(model: RelPosTransformerForConditionalGeneration, args: argparse.Namespace, seed: int) -> list[float]:
    """AdamW, linear warm-up then cosine decay; the batch stream depends on the seed only (same data for every run).
    Returns the mean training loss of each tenth of the run."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, betas=(0.9, 0.98), weight_decay=0.0)
    warmup = max(args.steps // 10, 1)

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(args.steps - warmup, 1)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    losses, window = [], []
    chunk = max(args.steps // 10, 1)
    for step in range(args.steps):
        lengths = TRAIN_LENGTHS
        if args.one_length_batches:
            length = int(torch.randint(TRAIN_LENGTHS[0], TRAIN_LENGTHS[1] + 1, (), generator=generator))
            lengths = (length, length)
        batch = make_batch(sample_sequences(generator, args.batch_size, *lengths))
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        window.append(loss.item())
        if len(window) == chunk or step == args.steps - 1:
            losses.append(sum(window) / len(window))
            window = []
    return losses


def eval_sets(args: argparse.Namespace) -> dict[str, list[list[int]]]:
    """Fixed test sequences per bucket (from `eval_seed`, independent of the training seed)."""
    generator = torch.Generator().manual_seed(args.eval_seed)
    return {f"{low}-{high}": sample_sequences(generator, args.eval_size, low, high) for low, high in BUCKETS}


@torch.no_grad()
def evaluate(
    model: RelPosTransformerForConditionalGeneration, sets: dict[str, list[list[int]]], args: argparse.Namespace
) -> tuple[dict[str, dict], str]:
    """Greedy decoding (`model.generate`, batched); exact match and sacreBLEU per bucket, and BLEU's signature.
    Randomized positions at inference (one draw per batch and stack) come from torch's generator seeded here with
    `eval_seed`; nothing else in evaluation is random."""
    model.eval()
    torch.manual_seed(args.eval_seed)
    results = {}
    for bucket, sequences in sets.items():
        hypotheses = [None] * len(sequences)
        for indices in eval_batches(sequences, args):
            chunk = [sequences[index] for index in indices]
            batch = make_batch(chunk)
            generated = model.generate(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], do_sample=False, num_beams=1,
                max_new_tokens=max(len(sequence) for sequence in chunk) + 5,
            )
            for index, row in zip(indices, generated[:, 1:].tolist(), strict=True):
                hypotheses[index] = row[: row.index(EOS)] if EOS in row else row
        references = [sequence[::-1] for sequence in sequences]
        bleu = BLEU()
        score = bleu.corpus_score([to_text(h) for h in hypotheses], [[to_text(r) for r in references]])
        correct = [h == r for h, r in zip(hypotheses, references, strict=True)]
        by_repeat = {name: {"correct": 0, "n": 0} for name in REPEAT_CLASSES}
        for sequence, right in zip(sequences, correct, strict=True):
            counts = by_repeat[repeat_class(sequence)]
            counts["correct"] += right
            counts["n"] += 1
        results[bucket] = {"accuracy": sum(correct) / len(correct), "bleu": score.score, "n": len(references),
                           "by_repeat": by_repeat}
    return results, bleu.get_signature().format()


def eval_batches(sequences: list[list[int]], args: argparse.Namespace) -> list[list[int]]:
    """Indices of the evaluation batches (at most `eval_batch_size` each): consecutive sequences, or with
    `one_length_batches` sequences of one length each (as that option trains)."""
    if not args.one_length_batches:
        indices = list(range(len(sequences)))
        return [indices[start : start + args.eval_batch_size] for start in range(0, len(indices), args.eval_batch_size)]
    by_length: dict[int, list[int]] = {}
    for index, sequence in enumerate(sequences):
        by_length.setdefault(len(sequence), []).append(index)
    return [group[start : start + args.eval_batch_size] for _, group in sorted(by_length.items())
            for start in range(0, len(group), args.eval_batch_size)]


def summarize(per_seed: list[dict[str, dict]]) -> dict[str, dict]:
    """Mean, min and max over seeds of accuracy and BLEU, per bucket; exact matches per repeat class summed over
    seeds."""
    summary = {}
    for bucket in per_seed[0]:
        summary[bucket] = {}
        for metric in ("accuracy", "bleu"):
            values = [result[bucket][metric] for result in per_seed]
            summary[bucket][metric] = sum(values) / len(values)
            summary[bucket][f"{metric}_min"] = min(values)
            summary[bucket][f"{metric}_max"] = max(values)
        summary[bucket]["by_repeat"] = {
            name: {key: sum(result[bucket]["by_repeat"][name][key] for result in per_seed) for key in ("correct", "n")}
            for name in REPEAT_CLASSES
        }
    return summary


def cell(summary: dict, metric: str, seeds: int) -> str:
    value = summary[metric]
    if metric == "accuracy":
        text = f"{100 * value:.1f}"
        spread = f" ({100 * summary['accuracy_min']:.1f}-{100 * summary['accuracy_max']:.1f})"
    else:
        text = f"{value:.1f}"
        spread = f" ({summary['bleu_min']:.1f}-{summary['bleu_max']:.1f})"
    return text + (spread if seeds > 1 else "")


def markdown(results: dict) -> str:
    """One table per group: exact-match accuracy (%) and BLEU per bucket."""
    buckets = [f"{low}-{high}" for low, high in BUCKETS]
    seeds = len(results["settings"]["seeds"])
    titles = {
        "schemes": "Position schemes",
        "k": "Shaw clipping distance k (a^K and a^V)",
        "aK_aV": "Shaw a^K / a^V (k = 16)",
        "randomized": f"Randomized positions in training (Ruoss et al. 2023), L = {RANDOMIZATION_MAX}",
        "eval_randomized": f"Randomized positions in training and evaluation (Ruoss et al. 2023), L = {RANDOMIZATION_MAX}",
        "table_init": f"Shaw tables drawn at std {SHAW_T2T_TABLE_STD} (tensor2tensor's scale) instead of {SHAW_TABLE_STD}",
        "window": f"Local self-attention (self_attention_window = {WINDOW})",
        "window_size": "Shaw with local self-attention: window size w (and k = w)",
        "length_scaling": f"Local self-attention (window {WINDOW}) and cross-attention logits times log(source length)",
    }
    header = "| run | " + " | ".join(f"acc {b}" for b in buckets) + " | " + " | ".join(f"BLEU {b}" for b in buckets)
    lines = [
        "# Length generalization on sequence reversal",
        "",
        f"Trained on lengths {TRAIN_LENGTHS[0]}-{TRAIN_LENGTHS[1]}; exact-match accuracy (%) and sacreBLEU per test "
        f"length bucket, greedy decoding, {results['settings']['eval_size']} sequences per bucket, "
        f"seeds {results['settings']['seeds']}" + (" (mean, min-max in brackets)." if seeds > 1 else "."),
        f"BLEU signature: `{results['bleu_signature']}`.",
    ]
    for group, title in titles.items():
        if not group_rows(results["runs"], group):
            continue
        lines += ["", f"## {title}", "", header + " | train s |", "|" + " --- |" * (2 * len(buckets) + 2)]
        for label, run in group_rows(results["runs"], group):
            accuracy = " | ".join(cell(run["summary"][b], "accuracy", seeds) for b in buckets)
            bleu = " | ".join(cell(run["summary"][b], "bleu", seeds) for b in buckets)
            lines.append(f"| {label} | {accuracy} | {bleu} | {run['train_seconds']:.0f} |")
    return "\n".join(lines + repeat_table(results["runs"], buckets)) + "\n"


def repeat_table(runs: list[dict], buckets: list[str]) -> list[str]:
    """Exact match (%) per bucket and repeat class, pooled over seeds; the class sizes (per seed) in the header."""
    sizes = {b: {name: runs[0]["per_seed"][0][b]["by_repeat"][name]["n"] for name in REPEAT_CLASSES} for b in buckets}
    columns = [f"{b}: {name} (n={sizes[b][name]})" for b in buckets for name in REPEAT_CLASSES]
    lines = ["", "## Exact match by the source's longest repeated run of letters", "",
             "Pooled over seeds; a source in \"repeated pair\" holds some pair of adjacent letters twice, none three.",
             "", "| run | " + " | ".join(columns) + " |", "|" + " --- |" * (len(columns) + 1)]
    for run in runs:
        cells = []
        for b in buckets:
            for name in REPEAT_CLASSES:
                counts = run["summary"][b]["by_repeat"][name]
                cells.append(f"{100 * counts['correct'] / counts['n']:.1f}" if counts["n"] else "-")
        lines.append(f"| {run['name']} | " + " | ".join(cells) + " |")
    return lines


def group_rows(runs: list[dict], group: str) -> list[tuple[str, dict]]:
    """The runs of one result group with their row labels: the k group in increasing k, each labelled with its k
    (the full Shaw model is "shaw k=16" there and "shaw a^K + a^V" in the a^K / a^V group)."""
    members = [run for run in runs if group in run["groups"]]
    if group == "k":
        members.sort(key=lambda run: run["overrides"]["max_relative_position"])
        return [(f"shaw k={run['overrides']['max_relative_position']}", run) for run in members]
    if group == "window_size":
        members.sort(key=lambda run: run["overrides"]["self_attention_window"])
        return [(f"shaw window={run['overrides']['self_attention_window']}", run) for run in members]
    if group == "aK_aV":
        return [("shaw a^K + a^V" if run["name"] == "shaw" else run["name"], run) for run in members]
    return [(run["name"], run) for run in members]


METRICS = (("accuracy", "exact-match accuracy", (-0.03, 1.03)), ("bleu", "sacreBLEU", (-3, 103)))


def plot(results: dict, out: Path) -> list[Path]:
    """Accuracy (left) and BLEU (right) panels: accuracy_by_length.png (one line per scheme, dashed for randomized
    positions), k_ablation.png (against k, one line per bucket) and relative_ablation.png (one line per a^K / a^V
    setting); a figure whose runs were not run is left out."""
    from matplotlib.figure import Figure

    buckets = [f"{low}-{high}" for low, high in BUCKETS]
    runs = results["runs"]
    k_runs = [run for _, run in group_rows(runs, "k")]
    window_runs = [run for _, run in group_rows(runs, "window_size")]
    figures = {
        "accuracy_by_length.png": ("position schemes", "test length (training: 1-20, shaded)", [
            (label, buckets, [run["summary"][b] for b in buckets])
            for label, run in group_rows(runs, "schemes") + group_rows(runs, "randomized")
            + group_rows(runs, "eval_randomized")
        ]),
        "k_ablation.png": ("Shaw clipping distance (a^K and a^V)", "clipping distance k", [
            (f"length {b}", [str(run["overrides"]["max_relative_position"]) for run in k_runs],
             [run["summary"][b] for run in k_runs]) for b in buckets
        ]),
        "relative_ablation.png": ("Shaw a^K / a^V (k = 16)", "test length (training: 1-20, shaded)", [
            (label, buckets, [run["summary"][b] for b in buckets]) for label, run in group_rows(runs, "aK_aV")
        ]),
        "window_by_length.png": (f"self_attention_window = {WINDOW}", "test length (training: 1-20, shaded)", [
            (label, buckets, [run["summary"][b] for b in buckets]) for label, run in group_rows(runs, "window")
        ]),
        "window_size_ablation.png": ("Shaw, window w and k = w", "self-attention window w", [
            (f"length {b}", [str(run["overrides"]["self_attention_window"]) for run in window_runs],
             [run["summary"][b] for run in window_runs]) for b in buckets
        ]),
    }
    paths = []
    for filename, (title, xlabel, lines) in figures.items():
        if not lines or not lines[0][1]:
            continue
        figure = Figure(figsize=(10, 3.8))
        for axes, (metric, ylabel, ylim) in zip(figure.subplots(1, 2), METRICS, strict=True):
            for label, xs, summaries in lines:
                axes.plot(xs, [summary[metric] for summary in summaries], marker="o", label=label,
                          linestyle="--" if "randomized" in label else "-")
            if xlabel.startswith("test length"):
                axes.axvspan(-0.3, 0.3, color="0.9", zorder=0)
            axes.set(xlabel=xlabel, ylabel=ylabel, ylim=ylim, title=f"reversal: {title}")
        axes.legend(fontsize=8)
        figure.tight_layout()
        paths.append(out / filename)
        save_figure(figure, paths[-1], dpi=90)
    return paths


# --quick: the settings of a smoke run that trains in seconds (small model, few steps, small sets).
QUICK_SETTINGS = {"steps": 4, "d_model": 16, "layers": 1, "heads": 2, "eval_size": 6, "seeds": [1]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=output_folder, required=True, help="folder for the JSON, Markdown and PNG files")
    parser.add_argument("--quick", action="store_true",
                        help="tiny smoke run (seconds): small model, few steps, for the settings not given")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--eval-size", type=int, default=200, help="test sequences per length bucket")
    parser.add_argument("--eval-batch-size", type=int, default=100)
    parser.add_argument("--eval-seed", type=int, default=1234)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per run (tiny models run best on one)")
    parser.add_argument("--jobs", type=int, default=2, help="runs trained at the same time (one per core)")
    parser.add_argument("--only", nargs="+", choices=[spec.name for spec in run_specs()], metavar="RUN",
                        help="run only these run names (default: all)")
    parser.add_argument("--one-length-batches", action="store_true",
                        help="every training batch holds sequences of one length, drawn uniformly from the training "
                             "lengths (as Ruoss et al. 2023 train), and every evaluation batch one length; default: "
                             "lengths mixed within a batch")
    parser.add_argument("--save-models", type=Path, help="save each run's first-seed model under this folder")
    parser.add_argument("--evaluate-saved", type=Path, metavar="FOLDER",
                        help="train nothing: score the models that --save-models wrote to FOLDER (the runs of --only) "
                             "on the sets of --eval-seed. Settings are chosen looking at one evaluation seed "
                             "(1234 so far); the table to report comes from another seed's sets, never looked at")
    args = parser.parse_args(argv)
    if args.quick:   # the smoke run's settings as defaults: what the command line gives stays
        parser.set_defaults(**QUICK_SETTINGS)
        args = parser.parse_args(argv)
    return args


def typed_record(spec: RunSpec, args: argparse.Namespace, result: dict[str, dict], seed: int | None = None,
                 training_seconds: float | None = None) -> dict:
    """One model of a run spec as hf_relpos' typed run record (`RunRecord.to_json()`): its scheme and config
    overrides, seed, steps and training time (None: scored, not trained, here), and its exact match and BLEU per
    bucket as its metrics."""
    return RunRecord(
        model={SCHEME_FIELD: spec.position_scheme, **spec.overrides}, system=spec.name, seed=seed,
        steps=args.steps if training_seconds is not None else None, training_seconds=training_seconds,
        hardware=f"CPU: {cpu_model_name()}", devices=1, date=datetime.now(UTC).isoformat(timespec="seconds"),
        software=software_versions(),
        metrics={bucket: {"accuracy": scores["accuracy"], "bleu": scores["bleu"]} for bucket, scores in result.items()},
    ).to_json()


def saved_model_folder(root: Path, spec: RunSpec) -> Path:
    return root / spec.name.replace(" ", "_").replace("^", "").replace(",", "")


def evaluate_saved(args: argparse.Namespace, specs: list[RunSpec]) -> dict:
    """Score saved models (no training) on the sets of `--eval-seed`; writes saved_models.{json,md} to --out."""
    torch.set_num_threads(args.threads)
    sets = eval_sets(args)
    runs, records, signature = [], [], ""
    for spec in specs:
        folder = saved_model_folder(args.evaluate_saved, spec)
        if not (folder / "config.json").is_file():
            raise SystemExit(f"length_generalization.py: --evaluate-saved: no saved model of {spec.name!r} in {folder}")
        model = RelPosTransformerForConditionalGeneration.from_pretrained(folder)
        result, signature = evaluate(model, sets, args)
        runs.append({"name": spec.name, "model": str(folder), "result": result})
        records.append(typed_record(spec, args, result))
    results = {"buckets": [f"{low}-{high}" for low, high in BUCKETS], "settings": json_settings(args),
               "source_version": checkout_version(ROOT),
               "device": {"cpu": cpu_model_name(), "threads": args.threads, "torch": torch.__version__},
               "date": datetime.now(UTC).isoformat(timespec="seconds"), "bleu_signature": signature,
               "runs": runs, RECORDS: records}
    lines = [f"# Saved models scored on evaluation seed {args.eval_seed}", "",
             f"{args.eval_size} sequences per bucket, greedy; exact match (%) and BLEU (`{signature}`).", "",
             "| run | " + " | ".join(f"acc {b} | BLEU {b}" for b in results["buckets"]) + " |",
             "|" + " --- |" * (2 * len(results["buckets"]) + 1)]
    for run in runs:
        cells = " | ".join(f"{100 * run['result'][b]['accuracy']:.1f} | {run['result'][b]['bleu']:.1f}"
                           for b in results["buckets"])
        lines.append(f"| {run['name']} | {cells} |")
    args.out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out / "saved_models.json", json.dumps(results, indent=1) + "\n")
    write_text_atomic(args.out / "saved_models.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return results


def train_and_evaluate(spec: RunSpec, args: argparse.Namespace, sets: dict[str, list[list[int]]]) -> dict:
    """Every seed of one run spec: train, score per bucket, save the first seed's model when asked."""
    torch.set_num_threads(args.threads)
    per_seed, records, losses, seconds, signature = [], [], [], 0.0, ""
    for seed in args.seeds:
        model = build_model(spec, args, seed)
        started = time.perf_counter()
        losses.append(train(model, args, seed))
        seed_seconds = time.perf_counter() - started
        seconds += seed_seconds
        result, signature = evaluate(model, sets, args)
        per_seed.append(result)
        records.append(typed_record(spec, args, result, seed, seed_seconds))
        if args.save_models and seed == args.seeds[0]:
            folder = saved_model_folder(args.save_models, spec)
            model.save_pretrained(folder)
            letter_tokenizer().save_pretrained(folder)
    run = {
        "name": spec.name, "position_scheme": spec.position_scheme, "overrides": spec.overrides,
        "groups": list(spec.groups), "train_seconds": seconds / len(args.seeds), "loss_curves": losses,
        "per_seed": per_seed, "summary": summarize(per_seed), "bleu_signature": signature, RECORDS: records,
    }
    accuracies = "  ".join(f"{b}: {run['summary'][b]['accuracy']:.3f}" for b in run["summary"])
    print(f"{spec.name:<20} loss {losses[0][-1]:.3f}  {accuracies}  ({run['train_seconds']:.0f}s/seed)", flush=True)
    return run


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    specs = [spec for spec in run_specs() if not args.only or spec.name in args.only]
    if args.evaluate_saved:
        return evaluate_saved(args, specs)
    require_matplotlib()  # fail before training, not after, when the `viz` extra is missing
    args.out.mkdir(parents=True, exist_ok=True)
    sets = eval_sets(args)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=context) as pool:
        runs = list(pool.map(train_and_evaluate, specs, [args] * len(specs), [sets] * len(specs)))
    signature = runs[0].pop("bleu_signature")
    for run in runs[1:]:
        run.pop("bleu_signature")
    records = [record for run in runs for record in run.pop(RECORDS)]
    settings = json_settings(args)
    results = {
        "task": f"sequence reversal over {len(SYMBOLS)} letters (repeats allowed)",
        "train_lengths": list(TRAIN_LENGTHS),
        "buckets": [f"{low}-{high}" for low, high in BUCKETS],
        "settings": settings,
        "source_version": checkout_version(ROOT),
        "device": {"cpu": cpu_model_name(), "threads": args.threads, "torch": torch.__version__},
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "bleu_signature": signature,
        "runs": runs,
        RECORDS: records,
    }
    write_text_atomic(args.out / "length_generalization.json", json.dumps(results, indent=1) + "\n")
    write_text_atomic(args.out / "length_generalization.md", markdown(results))
    plot(results, args.out)
    return results


if __name__ == "__main__":
    main()
