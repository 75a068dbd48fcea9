"""Perplexity against evaluation context length: Transformer-XL with memory vs without vs absolute positions.

Byte-level language models (ids = UTF-8 byte + 4) trained with the real `Trainer` (`MemoryTrainer`) on consecutive
segments of a long text, then evaluated on held-out text:
  - xl+memory:  trained with mem_len = segment length; evaluated with segment L and memory M = context - L
  - xl:         trained without memory; evaluated on independent segments of length `context`
  - absolute:   trained without memory; evaluated on independent segments of length `context`

Example (the figures in docs/results.md):
  python experiments/xl_perplexity.py --text-jsonl ../shared/data/multi30k/train.jsonl --language de --out docs/results/xl_perplexity
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
from transformers import TrainingArguments

from hf_relpos import RelPosTransformerConfig, RelPosTransformerForCausalLM
from hf_relpos.publish.files import write_text_atomic
from hf_relpos.publish.records import RECORDS, SCHEME_FIELD, RunRecord, cpu_model_name, software_versions
from hf_relpos.tools.lm_memory import MemoryTrainer, SegmentedStream, stream_perplexity
from hf_relpos.tools.viz import require_matplotlib, save_figure
from hf_relpos.translation.safety import output_folder

BYTE_OFFSET = 4


def encode(text: str) -> torch.Tensor:
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long) + BYTE_OFFSET


def read_text(args: argparse.Namespace) -> str:
    if args.text_jsonl:
        lines = Path(args.text_jsonl).read_text(encoding="utf-8").splitlines()
        return "\n".join(json.loads(line)["translation"][args.language] for line in lines if line.strip())
    if args.text_file:
        return Path(args.text_file).read_text(encoding="utf-8")
    return generated_text(args.seed)


def generated_text(seed: int, sentences: int = 3000) -> str:
    """A deterministic text with long-range structure: each paragraph names a subject and repeats it later."""
    generator = torch.Generator().manual_seed(seed)
    names = ["Anna", "Bernd", "Clara", "Dieter", "Erika", "Fritz", "Greta", "Hans"]
    verbs = ["sieht", "malt", "findet", "kauft", "sucht", "liest"]
    objects = ["ein Buch", "den Hund", "die Katze", "einen Apfel", "das Haus", "den Ball"]
    paragraphs = []
    for _ in range(sentences // 3):
        name = names[int(torch.randint(len(names), (1,), generator=generator))]
        parts = [
            f"{name} {verbs[int(torch.randint(len(verbs), (1,), generator=generator))]} "
            f"{objects[int(torch.randint(len(objects), (1,), generator=generator))]}."
            for _ in range(3)
        ]
        paragraphs.append(" ".join(parts))
    return "\n".join(paragraphs)


def build_model(position_scheme: str, mem_len: int, args: argparse.Namespace) -> RelPosTransformerForCausalLM:
    torch.manual_seed(args.seed)
    config = RelPosTransformerConfig(
        vocab_size=256 + BYTE_OFFSET, d_model=args.d_model, decoder_layers=args.layers, encoder_layers=0,
        decoder_attention_heads=args.heads, encoder_attention_heads=args.heads, decoder_ffn_dim=4 * args.d_model,
        encoder_ffn_dim=4 * args.d_model, dropout=0.1, position_scheme=position_scheme, mem_len=mem_len,
        layer_norm_position="pre",
        **RelPosTransformerConfig.held_fields(position_scheme, {"clamp_len": 1000}),   # xl's: absolute has none
    )
    return RelPosTransformerForCausalLM(config)


def train(model: RelPosTransformerForCausalLM, tokens: torch.Tensor, args: argparse.Namespace, workdir: str) -> float:
    training_args = TrainingArguments(
        output_dir=workdir, per_device_train_batch_size=args.batch_size, max_steps=args.steps,
        learning_rate=args.learning_rate, lr_scheduler_type="cosine", warmup_steps=args.steps // 10,
        weight_decay=0.0, logging_steps=max(args.steps // 10, 1), report_to=[], save_strategy="no",
        seed=args.seed, dataloader_num_workers=0, max_grad_norm=1.0,
    )
    trainer = MemoryTrainer(
        model=model, args=training_args, train_dataset=SegmentedStream(tokens, args.batch_size, args.segment)
    )
    started = time.time()
    trainer.train()
    return time.time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text-jsonl", help="a WMT-schema jsonl file; its --language side is concatenated")
    parser.add_argument("--language", default="de")
    parser.add_argument("--text-file", help="a plain text file (default: a generated text)")
    parser.add_argument("--out", type=output_folder, default="benchmarks/results/xl_perplexity")
    parser.add_argument("--segment", type=int, default=64)
    parser.add_argument("--contexts", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--eval-tokens", type=int, default=60000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.segment < 1:
        parser.error(f"--segment must be at least 1, got {args.segment}")
    if short := [context for context in args.contexts if context < args.segment]:
        # xl+memory reads contexts as a segment plus memory: one shorter than a segment is not a context it can take
        parser.error(f"--contexts must each be at least --segment ({args.segment}), got {', '.join(map(str, short))}")
    require_matplotlib()  # fail before training, not after, when the `viz` extra is missing

    tokens = encode(read_text(args))
    evaluation, training = tokens[: args.eval_tokens], tokens[args.eval_tokens :]
    check_text_lengths(training.numel(), evaluation.numel(), args)
    variants = {"xl+memory": ("xl", args.segment), "xl": ("xl", 0), "absolute": ("absolute", 0)}
    results: dict = {"args": {**vars(args), "out": str(args.out)}, "train_tokens": training.numel(), "eval_tokens": evaluation.numel(),
                     RECORDS: []}
    with tempfile.TemporaryDirectory() as workdir:
        for name, (position_scheme, mem_len) in variants.items():
            model = build_model(position_scheme, mem_len, args)
            seconds = train(model, training, args, workdir)
            rows = {}
            for context in args.contexts:
                if mem_len > 0:
                    memory = max(context - args.segment, 0)
                    rows[context] = stream_perplexity(model, evaluation, args.segment, memory)
                else:
                    rows[context] = stream_perplexity(model, evaluation, context, 0)
            results[name] = {"train_seconds": round(seconds, 1), "perplexity": rows}
            results[RECORDS].append(typed_record(name, position_scheme, mem_len, seconds, rows, args))
            print(name, rows, flush=True)
    write_outputs(results, args)


def check_text_lengths(training: int, evaluation: int, args: argparse.Namespace) -> None:
    """One usage error, before any model trains, when the text after the first --eval-tokens bytes cannot fill a
    training segment in every one of --batch-size rows, or those bytes cannot hold the longest --contexts (the
    model predicts each byte from the ones before it: a segment of L bytes reads L + 1)."""
    if training < args.batch_size * args.segment + 1:
        raise SystemExit(f"--eval-tokens {args.eval_tokens}: leaves {training} bytes of the {training + evaluation}-byte "
                         f"text to train on, fewer than --batch-size x --segment + 1 = "
                         f"{args.batch_size * args.segment + 1}; lower --eval-tokens or give a longer text")
    if evaluation < max(args.contexts) + 1:
        raise SystemExit(f"--eval-tokens {args.eval_tokens}: {evaluation} bytes to evaluate on, fewer than the longest "
                         f"--contexts + 1 = {max(args.contexts) + 1}")


def typed_record(name: str, position_scheme: str, mem_len: int, seconds: float, perplexity: dict[int, float],
                 args: argparse.Namespace) -> dict:
    """One language model as hf_relpos' typed run record (`RunRecord.to_json()`): its scheme and memory, seed,
    steps and training time, and its per-byte perplexity at each evaluation context (bytes) as its metrics."""
    return RunRecord(
        model={SCHEME_FIELD: position_scheme, "mem_len": mem_len, "d_model": args.d_model,
               "decoder_layers": args.layers, "decoder_attention_heads": args.heads},
        system=name, seed=args.seed, steps=args.steps, learning_rate=args.learning_rate,
        per_device_train_batch_size=args.batch_size, training_seconds=seconds, hardware=f"CPU: {cpu_model_name()}",
        devices=1, date=datetime.now(UTC).isoformat(timespec="seconds"), software=software_versions(),
        metrics={f"context {context}": {"perplexity": value} for context, value in perplexity.items()},
    ).to_json()


def write_outputs(results: dict, args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "results.json", json.dumps(results, indent=2))
    names = [name for name in ("xl+memory", "xl", "absolute") if name in results]
    lines = ["| context (bytes) | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for context in args.contexts:
        cells = [f"{results[name]['perplexity'][context]:.3f}" for name in names]
        lines.append(f"| {context} | " + " | ".join(cells) + " |")
    write_text_atomic(out / "results.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(5, 3.5))
    for name in names:
        axis.plot(args.contexts, [results[name]["perplexity"][c] for c in args.contexts], marker="o", label=name)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("evaluation context (bytes)")
    axis.set_ylabel("perplexity (per byte)")
    axis.legend()
    figure.tight_layout()
    save_figure(figure, out / "perplexity_vs_context.png", dpi=120)


if __name__ == "__main__":
    main()
