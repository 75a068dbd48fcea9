"""Looking inside a model: encoder self-attention maps of one sentence, and Shaw's learned w^K / w^V tables.

matplotlib is the optional `viz` extra, beside the `train` extra whose folder checks the command uses
(`pip install ".[train,viz]"` in the checkout); matplotlib is imported inside the plotting
functions, which draw on `matplotlib.figure.Figure` objects (no pyplot, no global backend change) and return them.

Command line, for a saved model folder (tokenizer from the folder, or `--token-ids`):
  python -m hf_relpos.tools.viz MODEL_DIR --sentence "a b c d" --out DIR
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..model.configuration_relpos import RelPosTransformerConfig
from ..publish.files import atomic_file, expand_home, reading_weights
from ..translation.preflight import check_model_source
from ..translation.safety import output_folder
from .modes import evaluation_mode

if TYPE_CHECKING:   # matplotlib is the optional viz extra, imported where a plot is drawn
    from matplotlib.figure import Figure


def require_matplotlib() -> None:
    """Raise one clear ImportError naming the `viz` extra when matplotlib is missing (plots are optional)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise ImportError("plotting needs matplotlib, the optional `viz` extra: pip install '.[train,viz]' in the "
                          "hf_relpos checkout (the command runs on the train extra too)") from error


def save_figure(figure: Any, path: str | os.PathLike, dpi: int) -> None:
    """`figure.savefig(path)` through `atomic_file`: a kill never leaves an image cut short. The format is savefig's:
    from `path`'s suffix, or for a path without one matplotlib's `savefig.format` (PNG), its extension appended."""
    from matplotlib import rcParams

    path = Path(path)
    if not path.suffix:
        path = path.with_name(f"{path.name}.{rcParams['savefig.format']}")
    with atomic_file(path) as temporary:
        figure.savefig(temporary, dpi=dpi, format=path.suffix.removeprefix("."))


def _stack(model: nn.Module, stack: str) -> nn.Module:
    """The encoder or decoder stack of a model with a head (`model.model`) or of a base model; one without layers
    (`encoder_layers` 0) is a ValueError, as it has nothing to plot."""
    base = getattr(model, "model", model)
    module = getattr(base, stack, None)
    if module is None:
        raise ValueError(f"{type(model).__name__} has no {stack} stack")
    if len(module.layers) == 0:
        raise ValueError(f"the {stack} of this model has no layers ({stack}_layers 0): it has no attention or "
                         "relative tables to plot")
    return module


def encode_sentence(tokenizer_or_tokens: Any, sentence: str | None) -> tuple[list[int], list[str]]:
    """(token ids, tick labels). A tokenizer encodes `sentence`; a sequence of ids is used as it is."""
    if hasattr(tokenizer_or_tokens, "convert_ids_to_tokens"):
        if sentence is None:
            raise ValueError("pass the sentence to tokenize")
        ids = tokenizer_or_tokens(sentence)["input_ids"]
        return ids, [str(token) for token in tokenizer_or_tokens.convert_ids_to_tokens(ids)]
    ids = [int(token) for token in tokenizer_or_tokens]
    return ids, [str(token) for token in ids]


@torch.no_grad()
def encoder_attentions(model: nn.Module, input_ids: Sequence[int]) -> torch.Tensor:
    """Encoder self-attention weights of one sentence, [layers, heads, n, n], from the eager kernel.

    The model's attention implementation is set to "eager" and the model to eval mode for the call, both restored
    afterwards (each module's own mode, `evaluation_mode`).
    """
    encoder = _stack(model, "encoder")
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with evaluation_mode(model):
            ids = torch.tensor([list(input_ids)], device=next(model.parameters()).device)
            output = encoder(input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True)
    finally:
        model.set_attn_implementation(previous)
    return torch.stack([weights[0] for weights in output.attentions]).float().cpu()


def plot_attention_maps(
    model: nn.Module,
    tokenizer_or_tokens: Any,
    sentence: str | None = None,
    out_path: str | Path | None = None,
    title: str | None = None,
) -> Figure:
    """Encoder self-attention of one sentence: one row of head maps per layer (query on y, key on x).

    `tokenizer_or_tokens` is a tokenizer (then `sentence` is the text) or a sequence of token ids. Returns the
    matplotlib Figure; saves it as PNG when `out_path` is given.
    """
    require_matplotlib()
    from matplotlib.figure import Figure

    ids, labels = encode_sentence(tokenizer_or_tokens, sentence)
    weights = encoder_attentions(model, ids)
    layers, heads, length, _ = weights.shape
    cell = max(2.0, 0.22 * length)
    figure = Figure(figsize=(cell * heads + 1, cell * layers + 0.6))
    axes = figure.subplots(layers, heads, squeeze=False)
    for layer in range(layers):
        for head in range(heads):
            ax = axes[layer][head]
            image = ax.imshow(weights[layer, head].numpy(), vmin=0.0, vmax=1.0, cmap="viridis")
            ax.set_title(f"layer {layer} head {head}", fontsize=8)
            ax.set_xticks(range(length), labels, rotation=90, fontsize=6)
            ax.set_yticks(range(length), labels, fontsize=6)
    figure.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6)
    figure.suptitle(title or f"encoder self-attention ({model.config.position_scheme})")
    if out_path is not None:
        save_figure(figure, out_path, dpi=100)
    return figure


def relative_similarities(model: nn.Module, stack: str = "encoder") -> dict[str, torch.Tensor]:
    """Cosine similarity between the learned Shaw vectors of every pair of clipped distances.

    Returns {"w^K": [layers, 2k+1, 2k+1], "w^V": ...} for the tables the model has. Per-head tables
    ([layers, H, 2k+1, d]) are compared head by head and the similarities averaged over heads.
    """
    scheme = _stack(model, stack).positions
    tables = {"w^K": getattr(scheme, "relative_keys", None), "w^V": getattr(scheme, "relative_values", None)}
    similarities = {}
    for name, table in tables.items():
        if table is None:
            continue
        vectors = nn.functional.normalize(table.detach().float().cpu(), dim=-1)
        similarity = vectors @ vectors.transpose(-1, -2)
        similarities[name] = similarity.mean(dim=1) if similarity.dim() == 4 else similarity
    if not similarities:
        raise ValueError(
            f"the {stack} of this model has no learned relative tables (position_scheme="
            f"{model.config.position_scheme!r}; needs 'shaw' with use_relative_keys or use_relative_values)"
        )
    return similarities


def _has_relative_tables(model: nn.Module, stack: str = "encoder") -> bool:
    scheme = _stack(model, stack).positions
    return any(getattr(scheme, name, None) is not None for name in ("relative_keys", "relative_values"))


def plot_relative_embeddings(model: nn.Module, out_path: str | Path | None = None, stack: str = "encoder"
                             ) -> Figure:
    """Shaw's w^K / w^V as distance-by-distance cosine-similarity heatmaps: one row per table, one column per layer.

    Returns the matplotlib Figure; saves it as PNG when `out_path` is given.
    """
    require_matplotlib()
    from matplotlib.figure import Figure

    similarities = relative_similarities(model, stack)
    layers = next(iter(similarities.values())).size(0)
    k = model.config.max_relative_position
    distances = list(range(-k, k + 1))
    ticks = [index for index, distance in enumerate(distances) if distance % max(1, (2 * k + 1) // 8) == 0]
    figure = Figure(figsize=(3.2 * layers + 1, 3.0 * len(similarities) + 0.6))
    axes = figure.subplots(len(similarities), layers, squeeze=False)
    for row, (name, similarity) in enumerate(similarities.items()):
        for layer in range(layers):
            ax = axes[row][layer]
            image = ax.imshow(similarity[layer].numpy(), vmin=-1.0, vmax=1.0, cmap="RdBu_r")
            ax.set_title(f"{name}, layer {layer}", fontsize=9)
            ax.set_xticks(ticks, [str(distances[index]) for index in ticks], fontsize=7)
            ax.set_yticks(ticks, [str(distances[index]) for index in ticks], fontsize=7)
            ax.set_xlabel("distance j - i", fontsize=8)
    figure.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6, label="cosine similarity")
    figure.suptitle(f"Shaw relative embeddings ({stack}, k = {k})")
    if out_path is not None:
        save_figure(figure, out_path, dpi=100)
    return figure


def load_model(parser: argparse.ArgumentParser, model_dir: Path) -> nn.Module:
    """The hf_relpos translation model saved in `model_dir`; a missing folder or an unknown or unreachable Hub id
    (`check_model_source`, one request without retries), one that does not load (its weights file corrupt included),
    or another architecture's (Marian, BART) is one usage error naming it."""
    from transformers import AutoModelForSeq2SeqLM

    try:
        check_model_source(str(model_dir), "model_dir")
    except ValueError as error:
        parser.error(str(error))
    try:
        with reading_weights():
            model = AutoModelForSeq2SeqLM.from_pretrained(model_dir)
    except (OSError, ValueError) as error:
        parser.error(f"model_dir '{model_dir}': {' '.join(str(error).split())}")
    if not isinstance(model.config, RelPosTransformerConfig):
        parser.error(f"model_dir '{model_dir}' holds a {model.config.model_type!r} model; this command plots hf_relpos "
                     f"models ({RelPosTransformerConfig.model_type!r})")
    return model


def main(argv: list[str] | None = None) -> list[Path]:
    """Render attention maps (and, for Shaw models, the relative-embedding heatmaps) of a saved model folder."""
    from transformers import AutoTokenizer

    import hf_relpos  # noqa: F401  (registers the model with the Auto classes)

    parser = argparse.ArgumentParser(prog="python -m hf_relpos.tools.viz", description=main.__doc__)
    parser.add_argument("model_dir", type=lambda text: Path(expand_home(text)))
    parser.add_argument("--sentence", help="source sentence (tokenized with the tokenizer saved in MODEL_DIR)")
    parser.add_argument("--token-ids", type=int, nargs="+", help="source token ids, when the folder has no tokenizer")
    parser.add_argument("--out", type=output_folder, required=True, help="folder for the PNG files")
    args = parser.parse_args(argv)
    if (args.sentence is None) == (args.token_ids is None):
        parser.error("pass exactly one of --sentence and --token-ids")
    try:
        require_matplotlib()
    except ImportError as error:
        parser.error(str(error))
    model = load_model(parser, args.model_dir)
    vocab_size = model.config.vocab_size
    outside = [token for token in args.token_ids or () if not 0 <= token < vocab_size]
    if outside:
        parser.error(f"--token-ids must be ids in [0, {vocab_size}) (the model's vocab_size), got {outside}")
    try:
        _stack(model, "encoder")
    except ValueError as error:
        parser.error(str(error))
    tokenizer_or_tokens: Any = args.token_ids
    if args.sentence is not None:
        try:
            tokenizer_or_tokens = AutoTokenizer.from_pretrained(args.model_dir)
        except (OSError, ValueError) as error:
            parser.error(f"{args.model_dir} has no loadable tokenizer ({error}); pass --token-ids instead")
    args.out.mkdir(parents=True, exist_ok=True)
    written = [args.out / "attention_maps.png"]
    plot_attention_maps(model, tokenizer_or_tokens, args.sentence, written[0])
    if _has_relative_tables(model):
        written.append(args.out / "relative_embeddings.png")
        plot_relative_embeddings(model, written[-1])
    for path in written:
        print(path)
    return written


if __name__ == "__main__":
    main()
