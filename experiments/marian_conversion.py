r"""What switching a trained MarianMT model to relative positions costs, and what fine-tuning wins back.

1. Train a small `MarianMTModel` (transformers' own class, Post-LN, sinusoidal positions) on the training pairs with
   `Seq2SeqTrainer` for `--train-steps` steps, with a joint BPE tokenizer trained on the same pairs; Marian's
   convention: decoding starts with the pad token.
2. Convert it with `hf_relpos.tools.convert.convert_marian` to `absolute` (must score exactly as Marian) and to each entry
   of `--schemes`: a scheme name (sinusoids removed, the scheme's parameters neutral), `NAME+absolute`, the hybrid
   (`keep_absolute_positions`: Marian's sinusoids kept, the scheme added on top starting neutral, exact at step 0),
   or `NAME+absolute-fade`, the hybrid whose sinusoids fine-tuning fades out over the first `--fade-steps` steps
   (`fade_absolute_positions`), ending on the relative scheme alone.
3. Fine-tune every converted model with `train_translation.py configs/finetune_marian_en_de_shaw.yaml
   --model_name_or_path CONVERTED` for `--finetune-steps` steps (the same budget for `absolute` kept), once per seed
   of `--seeds`.
4. Score each stage on the first `--test-sentences` test sentences (sacreBLEU, greedy unless `--num-beams`).
5. With `--eval-every N`, the recovery curve: BLEU on the first `--eval-sentences` validation pairs at the start of
   fine-tuning and every N steps (the Trainer's own evaluation, one decoding for every point), and the first step at
   which each relative scheme's mean curve reaches what `absolute` scored at step 0 there (Marian's own level).
6. With `--long-pairs N`, a long-sentence bucket: N sources longer (in words) than the longest training source, made
   of consecutive test pairs joined until they are (Multi30k's test2016 has no single sentence that long), scored
   at every stage with up to `--long-max-new-tokens` tokens.

`--marian-model FOLDER` converts an already trained MarianMTModel (with its tokenizer) instead of training one, e.g.
the peer of experiments/vs_marian.py (<work>/peer/seed1/model).

Writes <out>/marian_conversion.json and .md. The figures in docs/results.md (2 CPU cores shared with other jobs,
1 thread, 30 and 22 minutes), with --train-steps 300 and 600:
  nice -n 15 python experiments/marian_conversion.py --data ../shared/data/multi30k --work /tmp/marian_600 \
      --out docs/results/marian_conversion/train600 --d-model 128 --learning-rate 1e-3 --train-steps 600 \
      --finetune-steps 150 --test-sentences 500
The hybrid against absolute kept and shaw, three seeds (section 5's peer on the recipes' tokenizer,
vs_marian.py's peer+recipe-tokenizer row):
  python experiments/marian_conversion.py --data ../shared/data/multi30k --work /tmp/marian_hybrid \
      --out docs/results/marian_conversion/peer_hybrid --marian-model /tmp/vs_marian/peer+recipe-tokenizer/seed1/model \
      --schemes shaw shaw+absolute xl+absolute --seeds 1 2 3 --finetune-steps 600 --eval-every 100 \
      --eval-sentences 500 --test-sentences 1000 --long-pairs 200 --num-beams 4 --threads 1
The hybrids with their sinusoids faded out over the first 300 of the 600 steps (the same work folder reuses the
conversions and `absolute`'s fine-tuned models):
  python experiments/marian_conversion.py --data ../shared/data/multi30k --work /tmp/marian_hybrid \
      --out docs/results/marian_conversion/peer_hybrid_fade --marian-model /tmp/vs_marian/peer+recipe-tokenizer/seed1/model \
      --schemes shaw+absolute-fade xl+absolute-fade --fade-steps 300 --seeds 1 2 3 --finetune-steps 600 \
      --eval-every 100 --eval-sentences 500 --test-sentences 1000 --long-pairs 200 --num-beams 4 --threads 1
Seeds can be fine-tuned by separate invocations (one per core, each with its own --work and --seeds) and their records
joined without training or decoding:
  python experiments/marian_conversion.py --out docs/results/marian_conversion/peer_hybrid \
      --merge /tmp/marian_hybrid_s1/marian_conversion.json /tmp/marian_hybrid_s2/marian_conversion.json
The long bucket's token lengths and its source-relative caps (1.0 x source tokens + 50, the long-input records' cap)
against the fixed --long-max-new-tokens the records above decoded with (no training, no decoding):
  python experiments/marian_conversion.py --data ../shared/data/multi30k --out docs/results/marian_conversion/peer_hybrid \
      --marian-model /tmp/vs_marian/peer+recipe-tokenizer/seed1/model --long-pairs 200 --describe-long-bucket
Smoke run on the generated demo corpus (a minute): add `--quick` (and no --data).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from hf_relpos.publish.files import write_text_atomic
from hf_relpos.publish.records import (
    PEER,
    RECIPE,
    RECORDS,
    SCHEME_FIELD,
    TRAINED_WEIGHTS,
    RunRecord,
    Scores,
    training_record,
)
from hf_relpos.translation.safety import output_folder

if TYPE_CHECKING:   # transformers is imported where a model is trained or loaded
    from transformers import PreTrainedTokenizerBase

ROOT = Path(__file__).resolve().parents[1]
FINETUNE_CONFIG = ROOT / "configs" / "finetune_marian_en_de_shaw.yaml"


def read_pairs(path: Path, source: str, target: str, limit: int | None = None) -> list[tuple[str, str]]:
    pairs = []
    for line in path.open(encoding="utf-8"):
        if line.strip():
            record = json.loads(line)["translation"]
            pairs.append((record[source], record[target]))
            if limit is not None and len(pairs) == limit:
                break
    return pairs


def train_marian(args: argparse.Namespace, tokenizer: PreTrainedTokenizerBase, train_pairs: list[tuple[str, str]]
                 ) -> Path:
    """A MarianMTModel trained with Seq2SeqTrainer, saved with its tokenizer in <work>/marian (reused if there)."""
    from datasets import Dataset
    from transformers import (
        DataCollatorForSeq2Seq,
        MarianConfig,
        MarianMTModel,
        Seq2SeqTrainer,
        Seq2SeqTrainingArguments,
    )

    folder = args.work / "marian"
    if (folder / "model.safetensors").is_file():
        print(f"reusing the trained Marian model in {folder}", flush=True)
        return folder
    config = MarianConfig(
        vocab_size=len(tokenizer), d_model=args.d_model, encoder_layers=args.layers, decoder_layers=args.layers,
        encoder_attention_heads=args.heads, decoder_attention_heads=args.heads, encoder_ffn_dim=4 * args.d_model,
        decoder_ffn_dim=4 * args.d_model, activation_function="swish", scale_embedding=True, dropout=0.1,
        max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id, forced_eos_token_id=None, bos_token_id=None,
    )
    torch.manual_seed(args.seed)
    model = MarianMTModel(config)
    sources, targets = zip(*train_pairs, strict=True)
    encoded = tokenizer(list(sources), text_target=list(targets), truncation=True, max_length=128)
    dataset = Dataset.from_dict({"input_ids": encoded["input_ids"], "labels": encoded["labels"]})
    training_args = Seq2SeqTrainingArguments(
        output_dir=str(args.work / "marian_trainer"), max_steps=args.train_steps, per_device_train_batch_size=64,
        learning_rate=args.learning_rate, lr_scheduler_type="inverse_sqrt", warmup_steps=args.train_steps // 4,
        adam_beta2=0.98, weight_decay=0.0, label_smoothing_factor=0.1, logging_steps=50, save_strategy="no",
        report_to="none", use_cpu=True, seed=args.seed, dataloader_num_workers=0,
    )
    trainer = Seq2SeqTrainer(model=model, args=training_args, train_dataset=dataset,
                             data_collator=DataCollatorForSeq2Seq(tokenizer, model=model))
    trainer.train()
    model.generation_config.max_length = 128
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def long_pairs(train_pairs: list[tuple[str, str]], test_pairs: list[tuple[str, str]],
               count: int) -> list[tuple[str, str]]:
    """Up to `count` pairs whose source has more words than any training source: consecutive test pairs joined
    (source to source, target to target, with a space) until the joined source is that long, then the next ones."""
    if count == 0:
        return []
    longest = max(len(source.split()) for source, _ in train_pairs)
    bucket, sources, targets = [], [], []
    for source, target in test_pairs:
        sources.append(source)
        targets.append(target)
        if sum(len(text.split()) for text in sources) > longest:
            bucket.append((" ".join(sources), " ".join(targets)))
            sources, targets = [], []
            if len(bucket) == count:
                break
    return bucket


def describe_long_bucket(bucket: list[tuple[str, str]], tokenizer: PreTrainedTokenizerBase, max_new_tokens: int,
                         max_len_a: float, max_len_b: int) -> dict:
    """Token lengths (`</s>` included) of the bucket's sources and references under `tokenizer`, and, per source,
    the source-relative cap floor(max_len_a x source tokens + max_len_b) (the decoding paths' `new_token_limits`,
    uncapped) against the fixed `max_new_tokens`."""
    from hf_relpos.model.generation_limits import new_token_limits

    sources = [len(tokenizer(source)["input_ids"]) for source, _ in bucket]
    references = [len(tokenizer(text_target=reference)["input_ids"]) for _, reference in bucket]
    caps = new_token_limits(torch.tensor(sources), max_len_a, max_len_b, ceiling=torch.iinfo(torch.int64).max).tolist()
    return {"pairs": len(bucket), "source_tokens": {"mean": sum(sources) / len(sources), "max": max(sources)},
            "reference_tokens": {"mean": sum(references) / len(references), "max": max(references)},
            "max_new_tokens": max_new_tokens, "max_len_a": max_len_a, "max_len_b": max_len_b,
            "source_relative_caps": {"min": min(caps), "max": max(caps)},
            "sources_whose_relative_cap_exceeds_max_new_tokens": sum(cap > max_new_tokens for cap in caps)}


HYBRIDS = {"": (False, False), "absolute": (True, False), "absolute-fade": (True, True)}


def scheme_of(entry: str) -> tuple[str, bool, bool]:
    """`--schemes` entry -> (position_scheme, keep_absolute_positions, fade them out): "shaw", "shaw+absolute" (the
    hybrid) or "shaw+absolute-fade" (the hybrid, its sinusoids faded out during fine-tuning)."""
    name, _, kept = entry.partition("+")
    if kept not in HYBRIDS:
        raise SystemExit(f"marian_conversion.py: --schemes entry {entry!r} must be NAME, NAME+absolute or "
                         "NAME+absolute-fade")
    return name, *HYBRIDS[kept]


def bleu(model_folder: Path, test_pairs: list[tuple[str, str]], args: argparse.Namespace, marian: bool = False,
         max_new_tokens: int | None = None) -> dict:
    """sacreBLEU / chrF of a saved model on `test_pairs` (greedy or `--num-beams`, at most `max_new_tokens`, by
    default `--max-new-tokens`)."""
    from transformers import AutoTokenizer, MarianMTModel

    from hf_relpos import RelPosTransformerForConditionalGeneration
    from hf_relpos.tools.translate import translate_lines
    from hf_relpos.translation.metrics import score_translations

    model_class = MarianMTModel if marian else RelPosTransformerForConditionalGeneration
    model = model_class.from_pretrained(str(model_folder)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_folder))
    sources, references = zip(*test_pairs, strict=True)
    started = time.perf_counter()
    hypotheses = translate_lines(list(sources), model, tokenizer, max_tokens=2048, progress=False,
                                 num_beams=args.num_beams, max_new_tokens=max_new_tokens or args.max_new_tokens)
    scores = score_translations(hypotheses, list(references))
    return {"bleu": scores["bleu"], "chrf": scores["chrf"], "length_ratio": scores["length_ratio"],
            "signature": scores["bleu_signature"], "seconds": time.perf_counter() - started,
            "first_hypotheses": hypotheses[:3]}


def evaluation_steps(args: argparse.Namespace) -> list[int]:
    """The steps the Trainer evaluates at with `--eval-every`: 0, every N steps, and the last step."""
    if not args.eval_every:
        return []
    steps = list(range(0, args.finetune_steps + 1, args.eval_every))
    return steps if steps[-1] == args.finetune_steps else [*steps, args.finetune_steps]


def finetune(converted: Path, output_dir: Path, args: argparse.Namespace, seed: int, fade: bool = False) -> Path:
    """`train_translation.py --model_name_or_path CONVERTED --seed SEED` with the recipe's settings and
    --finetune-steps (and `--fade_absolute_positions --fade-steps` with `fade`); with `--eval-every`, the Trainer
    also scores the first `--eval-sentences` validation pairs at step 0 and every `--eval-every` steps (kept in
    output_dir/trainer_state.json). A finished run in output_dir is reused only if it has the same number of steps
    and evaluations (the fade length is in the folder's name)."""
    if (output_dir / "model.safetensors").is_file():
        state = json.loads((output_dir / "trainer_state.json").read_text())
        evaluated = [entry["step"] for entry in state["log_history"] if "eval_bleu" in entry]
        if state["max_steps"] != args.finetune_steps or evaluated != evaluation_steps(args):
            raise SystemExit(f"marian_conversion.py: {output_dir} holds a run of {state['max_steps']} steps evaluated at "
                             f"steps {evaluated}; this run asks for {args.finetune_steps} steps evaluated at "
                             f"{evaluation_steps(args)}: remove that folder or choose another --work")
        print(f"reusing the fine-tuned model in {output_dir}", flush=True)
        return output_dir
    command = [
        sys.executable, str(ROOT / "train_translation.py"), str(FINETUNE_CONFIG),
        "--model_name_or_path", str(converted), "--train_file", str(args.data / "train.jsonl"),
        "--output_dir", str(output_dir), "--max_steps", str(args.finetune_steps), "--do_eval", "false",
        "--do_predict", "false", "--save_strategy", "no", "--seed", str(seed),
        "--cpu_threads", str(args.threads), "--overwrite_output_dir", "true", "--logging_steps", "50",
        "--warmup_steps", str(max(1, args.finetune_steps // 10)), "--max_tokens_per_batch", str(args.finetune_max_tokens),
    ]
    if fade:
        command += ["--fade_absolute_positions", str(args.fade_steps)]
    if args.eval_every:
        command += [
            "--eval_strategy", "steps", "--eval_steps", str(args.eval_every), "--eval_on_start", "true",
            "--validation_file", str(args.data / "validation.jsonl"), "--max_eval_samples", str(args.eval_sentences),
            "--generation_num_beams", str(args.num_beams),
        ]
    else:
        command += ["--eval_strategy", "no"]
    with open(output_dir.with_suffix(".log"), "w") as handle:
        subprocess.run(command, check=True, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT)
    return output_dir


def recovery_curve(finetuned: Path) -> list[dict[str, float]]:
    """The validation scores the Trainer logged during fine-tuning, in step order."""
    state = json.loads((finetuned / "trainer_state.json").read_text())
    return [{"step": entry["step"], "bleu": entry["eval_bleu"], "chrf": entry["eval_chrf"]}
            for entry in state["log_history"] if "eval_bleu" in entry]


def recovered_at(curve: list[dict[str, float]], level: float) -> int | None:
    """The first evaluated step whose BLEU reaches `level`; None if none does."""
    return next((point["step"] for point in curve if point["bleu"] >= level), None)


def mean_and_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    mean = sum(values) / len(values)
    variance = sum((value - mean) ** 2 for value in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return mean, variance**0.5


def summarise(run: dict) -> dict:
    """Mean and sd over the seeds of a scheme's fine-tuned test (and long-bucket) BLEU and chrF, and its mean curve."""
    seeds = list(run["seeds"].values())
    summary = {}
    for key in ("finetuned", "finetuned_long"):
        if key in seeds[0]:
            for metric in ("bleu", "chrf"):
                summary[f"{key}_{metric}"] = mean_and_sd([seed[key][metric] for seed in seeds])
    if "curve" in seeds[0]:
        steps = [point["step"] for point in seeds[0]["curve"]]
        summary["curve"] = [{"step": step, "bleu": mean_and_sd([seed["curve"][index]["bleu"] for seed in seeds])[0]}
                            for index, step in enumerate(steps)]
    return summary


def provenance(results: dict) -> str:
    """Code version, releases and device of a record (absent from records older than these fields)."""
    if "source_version" not in results:
        return ""
    versions = results["versions"]
    return (f" Code `{results['source_version']}`; torch {versions['torch']}, transformers {versions['transformers']}; "
            f"{results['device']}; {results['date'][:10]}.")


def paired_differences(results: dict) -> list[str]:
    """Each scheme minus `absolute` kept, seed by seed (the same fine-tuning seed: the same batches), on the test
    sentences and the long-sentence bucket."""
    seeds = results["settings"]["seeds"]
    if len(seeds) < 2:
        return []
    absolute = results["schemes"]["absolute"]["seeds"]
    lines = ["", f"Minus `absolute` kept, seed by seed ({', '.join(map(str, seeds))}; the same seed draws the same "
             "batches):", "", "| position_scheme | test BLEU | long-bucket BLEU |", "| --- | --- | --- |"]
    for scheme, run in results["schemes"].items():
        if scheme == "absolute":
            continue
        cells = []
        for key in ("finetuned", "finetuned_long"):
            if key not in absolute[str(seeds[0])]:
                cells.append("-")
                continue
            cells.append(" / ".join(f"{run['seeds'][str(seed)][key]['bleu'] - absolute[str(seed)][key]['bleu']:+.2f}"
                                    for seed in seeds))
        lines.append(f"| {scheme} | {cells[0]} | {cells[1]} |")
    return lines


def fine_tuning_seconds(run: dict) -> str:
    """Mean wall time of the seeds this invocation fine-tuned; "reused" where every seed's model came from an earlier
    invocation in the same --work (records older than the `reused` flag: those took under a second)."""
    trained = [seed["finetune_seconds"] for seed in run["seeds"].values()
               if not seed.get("reused", seed["finetune_seconds"] < 1.0)]
    return f"{sum(trained) / len(trained):.0f}" if trained else "reused"


def markdown(results: dict) -> str:
    settings = results["settings"]
    seeds = settings["seeds"]
    spread = f" (mean ± sd over seeds {', '.join(map(str, seeds))})" if len(seeds) > 1 else f" (seed {seeds[0]})"
    lines = [
        "# Relative positions for a trained MarianMT model (Multi30k En->De)" if not settings["quick"] else
        "# Relative positions for a trained MarianMT model (generated demo corpus, --quick)",
        "",
        (f"MarianMTModel from {settings['marian_model']}" if settings["marian_model"] else
         f"MarianMTModel d_model {settings['d_model']}, {settings['layers']}+{settings['layers']} layers, trained "
         f"{settings['train_steps']} steps") + f"; each converted model fine-tuned {settings['finetune_steps']} steps with "
        f"`train_translation.py` ({Path(settings['finetune_config']).name}){spread}. sacreBLEU on the first "
        f"{settings['test_sentences']} test sentences, {'greedy' if settings['num_beams'] == 1 else 'beam ' + str(settings['num_beams'])}.",
        f"Signature: `{results['marian']['signature']}`." + provenance(results),
        *([f"`NAME+absolute-fade`: the hybrid fine-tuned with `fade_absolute_positions: {settings['fade_steps']}`, its "
           f"sinusoids faded out linearly over the first {settings['fade_steps']} steps; after them it runs on the "
           "relative scheme alone."] if settings.get("fade_steps") else []),
        "",
        "| position_scheme | Marian (before) | converted, step 0 | after fine-tuning | chrF after | "
        "fine-tuning s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]

    def figure(value: tuple[float, float]) -> str:
        return f"{value[0]:.2f} ± {value[1]:.2f}" if len(seeds) > 1 else f"{value[0]:.2f}"

    for scheme, run in results["schemes"].items():
        lines.append(
            f"| {scheme} | {results['marian']['bleu']:.2f} | {run['converted']['bleu']:.2f} | "
            f"{figure(run['summary']['finetuned_bleu'])} | {figure(run['summary']['finetuned_chrf'])} | "
            f"{fine_tuning_seconds(run)} |"
        )
    if "long_bucket" in results:
        bucket = results["long_bucket"]
        lines += [
            "",
            f"Long-sentence bucket: {bucket['pairs']} sources longer than the longest training source "
            f"({bucket['longest_training_source_words']} words; consecutive test pairs joined, mean "
            f"{bucket['mean_source_words']:.1f} words), at most {settings['long_max_new_tokens']} new tokens.",
            "",
            "| position_scheme | Marian (before) | converted, step 0 | after fine-tuning |",
            "| --- | --- | --- | --- |",
        ]
        for scheme, run in results["schemes"].items():
            lines.append(f"| {scheme} | {results['marian_long']['bleu']:.2f} | {run['converted_long']['bleu']:.2f} | "
                         f"{figure(run['summary']['finetuned_long_bleu'])} |")
    lines += paired_differences(results)
    if "recovery" in results:
        recovery = results["recovery"]
        schemes = list(results["schemes"])
        lines += [
            "",
            f"Recovery curve: BLEU on the first {settings['eval_sentences']} validation pairs during fine-tuning"
            f"{' (mean over the seeds)' if len(seeds) > 1 else ''}. `absolute` scores {recovery['level']:.2f} at step "
            "0 (Marian's level); first step at which each scheme reaches it: "
            + ", ".join(f"{scheme} {'not reached' if step is None else step}"
                        for scheme, step in recovery["recovered_at"].items()) + ".",
            "",
            "| step | " + " | ".join(schemes) + " |",
            "| --- |" + " --- |" * len(schemes),
        ]
        by_scheme = {scheme: {point["step"]: point["bleu"] for point in run["summary"]["curve"]}
                     for scheme, run in results["schemes"].items()}
        for step in by_scheme["absolute"]:
            lines.append(f"| {step} | " + " | ".join(
                f"{by_scheme[scheme][step]:.2f}" if step in by_scheme[scheme] else "-" for scheme in schemes) + " |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="folder with {train,test}.jsonl (Multi30k); not with --quick")
    parser.add_argument("--work", type=output_folder,
                        help="models and logs (reused when present); required unless --merge")
    parser.add_argument("--out", type=output_folder, required=True, help="folder for marian_conversion.{json,md}")
    parser.add_argument("--schemes", nargs="+", default=["shaw"],
                        help="relative schemes to convert to: NAME, NAME+absolute for the hybrid (Marian's "
                             "sinusoids kept, keep_absolute_positions), or NAME+absolute-fade for the hybrid whose "
                             "sinusoids fine-tuning fades out (--fade-steps)")
    parser.add_argument("--train-steps", type=int, default=600)
    parser.add_argument("--finetune-steps", type=int, default=150)
    parser.add_argument("--fade-steps", type=int,
                        help="NAME+absolute-fade entries: fade the sinusoids out over this many fine-tuning steps "
                             "(default: half of --finetune-steps)")
    parser.add_argument("--marian-model", type=Path,
                        help="a trained MarianMTModel folder with its tokenizer, converted instead of training one")
    parser.add_argument("--eval-every", type=int, default=0,
                        help="score the validation pairs every N fine-tuning steps (and at step 0); 0: off")
    parser.add_argument("--eval-sentences", type=int, default=500, help="validation pairs scored by --eval-every")
    parser.add_argument("--finetune-max-tokens", type=int, default=1024,
                        help="fine-tuning batches: padded tokens per side (~64 sentences, Marian's batch)")
    parser.add_argument("--test-sentences", type=int, default=500)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--tokenizer-vocab-size", type=int, default=8000)
    parser.add_argument("--num-beams", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=80)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1, help="seed of the Marian model trained here")
    parser.add_argument("--seeds", type=int, nargs="+", help="fine-tuning seeds, one run each (default: --seed)")
    parser.add_argument("--long-pairs", type=int, default=0,
                        help="size of the long-sentence bucket (joined consecutive test pairs); 0: off")
    parser.add_argument("--long-max-new-tokens", type=int, default=160,
                        help="new-token limit on the long bucket (keep the decoder within Marian's position table)")
    parser.add_argument("--describe-long-bucket", action="store_true",
                        help="only write <out>/long_bucket.json: the --long-pairs bucket's token lengths under "
                             "--marian-model's tokenizer and its source-relative caps (--max-len-a, --max-len-b) "
                             "against --long-max-new-tokens (no training, no decoding)")
    parser.add_argument("--max-len-a", type=float, default=1.0, help="with --describe-long-bucket (fairseq's)")
    parser.add_argument("--max-len-b", type=int, default=50, help="with --describe-long-bucket (fairseq's)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: generated demo corpus in <work>/data, a tiny model, a few steps")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="RECORD",
                        help="join marian_conversion.json records of one conversion with different --seeds into "
                             "one record in --out (no training, no decoding)")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.merge:
        write_record(merge_records(args.merge), args.out)
        return
    if args.describe_long_bucket:
        if args.data is None or args.marian_model is None or not args.long_pairs:
            parser.error("--describe-long-bucket needs --data, --marian-model and --long-pairs")
        from transformers import AutoTokenizer

        from hf_relpos.publish.records import checkout_version

        bucket = long_pairs(read_pairs(args.data / "train.jsonl", "en", "de"),
                            read_pairs(args.data / "test.jsonl", "en", "de"), args.long_pairs)
        description = describe_long_bucket(bucket, AutoTokenizer.from_pretrained(str(args.marian_model)),
                                           args.long_max_new_tokens, args.max_len_a, args.max_len_b)
        description |= {"tokenizer_of": str(args.marian_model), "source_version": checkout_version(ROOT),
                        "command": "python experiments/marian_conversion.py " + " ".join(sys.argv[1:] if argv is None
                                                                                         else argv)}
        args.out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.out / "long_bucket.json", json.dumps(description, indent=1) + "\n")
        print(json.dumps(description, indent=1))
        return
    if args.work is None:
        parser.error("--work is required (unless --merge or --describe-long-bucket)")
    args.seeds = args.seeds or [args.seed]
    fading = any([scheme_of(entry)[2] for entry in args.schemes])   # a list: every entry is checked
    if args.quick:
        args.finetune_steps = min(args.finetune_steps, 2)
    if args.fade_steps is not None and not fading:
        parser.error("--fade-steps applies to NAME+absolute-fade entries of --schemes, and there is none")
    if args.fade_steps is not None and not 1 <= args.fade_steps <= args.finetune_steps:
        parser.error(f"--fade-steps must be an integer in [1, --finetune-steps={args.finetune_steps}], got "
                     f"{args.fade_steps}")
    if fading and args.fade_steps is None:
        args.fade_steps = max(1, args.finetune_steps // 2)
    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.quick:
        from hf_relpos.translation.demo_corpus import write_demo_corpus

        args.data = args.work / "data"
        write_demo_corpus(args.data, 200, 10, 10, seed=1)
        args.d_model, args.layers, args.heads, args.tokenizer_vocab_size = 32, 1, 2, 400
        args.train_steps, args.test_sentences = min(args.train_steps, 4), min(args.test_sentences, 10)
        args.eval_sentences = min(args.eval_sentences, 10)
        args.max_new_tokens, args.finetune_max_tokens, args.long_max_new_tokens = 20, 256, 40
    elif args.data is None:
        parser.error("--data is required (or --quick)")

    from settings import json_settings

    from hf_relpos.publish.records import checkout_version, cpu_model_name, software_versions
    from hf_relpos.tools.convert import convert_marian
    from hf_relpos.translation.tokenization import has_saved_tokenizer, load_tokenizer, train_joint_tokenizer

    train_pairs = read_pairs(args.data / "train.jsonl", "en", "de")
    test_pairs = read_pairs(args.data / "test.jsonl", "en", "de", limit=args.test_sentences)
    if args.marian_model is None:
        tokenizer_folder = args.work / "tokenizer"
        if not has_saved_tokenizer(tokenizer_folder):
            texts = [text for pair in train_pairs for text in pair]
            train_joint_tokenizer(texts, args.tokenizer_vocab_size).save_pretrained(tokenizer_folder)
        marian_folder = train_marian(args, load_tokenizer(tokenizer_folder), train_pairs)
    else:
        marian_folder = args.marian_model
        for name in ("d_model", "layers", "heads", "train_steps", "learning_rate", "tokenizer_vocab_size"):
            setattr(args, name, None)  # set by the given model, not by this run
    bucket = long_pairs(train_pairs, read_pairs(args.data / "test.jsonl", "en", "de"), args.long_pairs)
    results = {"settings": json_settings(args) | {"finetune_config": str(FINETUNE_CONFIG.relative_to(ROOT))},
               "source_version": checkout_version(ROOT), "versions": software_versions(),
               "device": f"CPU: {cpu_model_name()}, {args.threads} thread(s)",
               "date": datetime.now(UTC).isoformat(timespec="seconds"),
               "marian": bleu(marian_folder, test_pairs, args, marian=True), "schemes": {}}
    print(f"Marian: BLEU {results['marian']['bleu']:.2f}", flush=True)
    if bucket:
        results["long_bucket"] = {
            "pairs": len(bucket), "longest_training_source_words": max(len(source.split()) for source, _ in train_pairs),
            "mean_source_words": sum(len(source.split()) for source, _ in bucket) / len(bucket)}
        results["marian_long"] = bleu(marian_folder, bucket, args, marian=True, max_new_tokens=args.long_max_new_tokens)
    results[RECORDS] = [marian_record(results, args)]
    for entry in dict.fromkeys(["absolute", *args.schemes]):
        position_scheme, keep_absolute_positions, fade = scheme_of(entry)
        converted = args.work / f"converted_{entry.removesuffix('-fade')}"   # the fading hybrid starts as the hybrid
        if not (converted / "model.safetensors").is_file():
            convert_marian(marian_folder, converted, position_scheme,
                           **({"keep_absolute_positions": True} if keep_absolute_positions else {}))
        run = {"position_scheme": position_scheme, "keep_absolute_positions": keep_absolute_positions,
               "fade_absolute_positions": args.fade_steps if fade else None,
               "converted": bleu(converted, test_pairs, args), "seeds": {}}
        if bucket:
            run["converted_long"] = bleu(converted, bucket, args, max_new_tokens=args.long_max_new_tokens)
        print(f"{entry}: BLEU {run['converted']['bleu']:.2f} right after the conversion", flush=True)
        for seed in args.seeds:
            started = time.perf_counter()
            # the fade length is part of the folder's name: a run is reused only with the same fade
            output_dir = args.work / f"finetuned_{entry}{args.fade_steps if fade else ''}_seed{seed}"
            reused = (output_dir / "model.safetensors").is_file()
            finetuned = finetune(converted, output_dir, args, seed, fade)
            by_seed = {"finetune_seconds": time.perf_counter() - started, "reused": reused,
                       "finetuned": bleu(finetuned, test_pairs, args)}
            if bucket:
                by_seed["finetuned_long"] = bleu(finetuned, bucket, args, max_new_tokens=args.long_max_new_tokens)
            if args.eval_every:
                by_seed["curve"] = recovery_curve(finetuned)
            run["seeds"][str(seed)] = by_seed
            results[RECORDS].append(finetuned_record(entry, seed, run, finetuned, results))
            print(f"{entry}, seed {seed}: BLEU {by_seed['finetuned']['bleu']:.2f} after {args.finetune_steps} steps",
                  flush=True)
        run["summary"] = summarise(run)
        results["schemes"][entry] = run
    if args.eval_every:
        results["recovery"] = recovery(results)
    write_record(results, args.out)


def scores_of(scored: dict, scored_long: dict | None) -> dict[str, Scores]:
    """`RunRecord.scores` of one set of weights from `bleu()`'s results: the test pairs, and the long bucket."""
    return {split: Scores(values["bleu"], values["chrf"], values["signature"], values["length_ratio"])
            for split, values in (("test", scored), ("long", scored_long)) if values is not None}


def marian_record(results: dict, args: argparse.Namespace) -> dict:
    """The Marian model, the peer the conversions start from, as hf_relpos' typed run record (trained here with
    `--train-steps`, or given as `--marian-model`)."""
    trained_here = args.marian_model is None
    return RunRecord(
        role=PEER, system="marian", seed=args.seed if trained_here else None,
        steps=args.train_steps if trained_here else None, hardware=results["device"], devices=1,
        source_version=results["source_version"], software=results["versions"], date=results["date"],
        scores={TRAINED_WEIGHTS: scores_of(results["marian"], results.get("marian_long"))}).to_json()


def finetuned_record(entry: str, seed: int, run: dict, finetuned: Path, results: dict) -> dict:
    """One fine-tuning of a converted model as hf_relpos' typed run record: the one train_translation.py wrote (the
    recipe it fine-tuned with, its flags and settings), with the scores of the converted ("converted") and the
    fine-tuned ("finetuned") weights."""
    by_seed = run["seeds"][str(seed)]
    trained = training_record(finetuned) or RunRecord(
        model={SCHEME_FIELD: run["position_scheme"], "keep_absolute_positions": run["keep_absolute_positions"]})
    return replace(
        trained, role=RECIPE, system=entry, seed=seed, training_seconds=by_seed["finetune_seconds"],
        source_version=results["source_version"], software=results["versions"], date=results["date"],
        scores={"converted": scores_of(run["converted"], run.get("converted_long")),
                "finetuned": scores_of(by_seed["finetuned"], by_seed.get("finetuned_long"))}).to_json()


def recovery(results: dict) -> dict:
    """`absolute`'s mean validation BLEU at step 0 (Marian's level) and the first step at which each other scheme's
    mean curve reaches it."""
    level = results["schemes"]["absolute"]["summary"]["curve"][0]["bleu"]
    return {"level": level, "recovered_at": {entry: recovered_at(run["summary"]["curve"], level)
                                             for entry, run in results["schemes"].items() if entry != "absolute"}}


def write_record(results: dict, out: Path) -> None:
    """<out>/marian_conversion.json and .md (the report, also printed)."""
    report = markdown(results)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "marian_conversion.json", json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    write_text_atomic(out / "marian_conversion.md", report)
    print(report)


# Settings that may differ between records of one conversion that fine-tuned different seeds.
PER_RUN_SETTINGS = {"seeds", "seed", "work", "out", "merge"}


def without_timing(scores: dict | None) -> dict | None:
    """A `bleu()` result without its decoding time (which differs between two decodings of the same model)."""
    return None if scores is None else {key: value for key, value in scores.items() if key != "seconds"}


def merge_records(paths: list[Path]) -> dict:
    """One record from runs of the same conversion that fine-tuned different seeds (one process per core, say): their
    settings (but seeds and folders), code version and releases, and the scores of Marian and of each converted model
    must be the same (the same models, decoded alike); each seed may appear once. The seeds' runs are joined and the
    summaries recomputed."""
    records = [json.loads(path.read_text()) for path in paths]
    merged = json.loads(json.dumps(records[0]))
    for path, record in zip(paths[1:], records[1:], strict=True):
        differing = sorted(key for key in record["settings"].keys() | merged["settings"].keys()
                           if key not in PER_RUN_SETTINGS and record["settings"].get(key) != merged["settings"].get(key))
        differing += [key for key in ("source_version", "versions") if record.get(key) != merged.get(key)]
        differing += [RECORDS] if (RECORDS in record) != (RECORDS in merged) else []
        differing += [key for key in ("marian", "marian_long")
                      if without_timing(record.get(key)) != without_timing(merged.get(key))]
        if differing or record["schemes"].keys() != merged["schemes"].keys():
            raise SystemExit(f"marian_conversion.py: --merge: {path} is another experiment than {paths[0]} "
                             f"(differs in {differing or ['schemes']})")
        for entry, run in record["schemes"].items():
            target = merged["schemes"][entry]
            for key in ("converted", "converted_long"):
                if without_timing(run.get(key)) != without_timing(target.get(key)):
                    raise SystemExit(f"marian_conversion.py: --merge: {path} scores the converted {entry} model "
                                     f"differently ({key})")
            repeated = sorted(run["seeds"].keys() & target["seeds"].keys())
            if repeated:
                raise SystemExit(f"marian_conversion.py: --merge: seed(s) {repeated} of {entry} in more than one record")
            target["seeds"] = dict(sorted({**target["seeds"], **run["seeds"]}.items(), key=lambda item: int(item[0])))
    if RECORDS in merged:   # the Marian model is each record's; its fine-tunings are the runs joined
        merged[RECORDS] += [values for record in records[1:] for values in record[RECORDS]
                            if RunRecord.from_json(values).role == RECIPE]
    merged["settings"]["seeds"] = sorted(int(seed) for seed in merged["schemes"]["absolute"]["seeds"])
    merged["merged_from"] = [str(path) for path in paths]
    for run in merged["schemes"].values():
        run["summary"] = summarise(run)
    if "recovery" in merged:
        merged["recovery"] = recovery(merged)
    return merged


if __name__ == "__main__":
    main()
