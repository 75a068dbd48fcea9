"""A decoding length cap relative to each source, fairseq's `--max-len-a` / `--max-len-b`:

    limit_i = min(floor(max_len_a * |x_i| + max_len_b), max_new_tokens)

new tokens for row i, |x_i| its source length in tokens (end token included, padding excluded). The two numbers are
generation-config fields (`generation_config.json` saves them); `max_new_tokens` stays the absolute ceiling. A row
that reaches its limit ends there with its end token (as fairseq forces </s> at max_len), so each row of a padded
batch, and each beam search, gives what that row gives decoded alone.
"""

from __future__ import annotations

import math

import torch
from transformers import GenerationConfig, LogitsProcessor

from .validation import require_int, require_non_negative_number

RELATIVE_LIMIT_FIELDS = ("max_len_a", "max_len_b")


def relative_limit(config: GenerationConfig) -> tuple[float, int] | None:
    """(max_len_a, max_len_b) of `config`; None when max_len_b is unset (a folder saved before these fields: its fixed
    `max_new_tokens` alone caps). max_len_a defaults to 0 as in fairseq. A negative or non-numeric value is one
    ValueError naming the field."""
    ratio, offset = (getattr(config, name, None) for name in RELATIVE_LIMIT_FIELDS)
    if offset is None:
        return None
    ratio = 0.0 if ratio is None else ratio
    require_non_negative_number("max_len_a (new tokens per source token)", ratio)
    require_int("max_len_b (new tokens beyond max_len_a * source length)", offset, 0)
    return float(ratio), offset


def set_relative_limit(config: GenerationConfig, max_len_a: float, max_len_b: int) -> None:
    """Save the source-relative cap in `config` (validated; `keep_relative_limit`)."""
    relative_limit(GenerationConfig(max_len_a=max_len_a, max_len_b=max_len_b))
    config.max_len_a, config.max_len_b = float(max_len_a), max_len_b
    keep_relative_limit(config)


def keep_relative_limit(config: GenerationConfig) -> None:
    """A generation config made from the model's config (`_from_model_config`) loses custom fields when it is loaded
    again: one that holds the source-relative cap becomes a config of its own, so that saving keeps the cap."""
    if relative_limit(config) is not None:
        config._from_model_config = False


def source_lengths(input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None, pad_token_id: int | None,
                   embedded: torch.Tensor | None = None) -> torch.Tensor:
    """Tokens per source row: the attention mask's sum; without a mask, the tokens of `input_ids` that are not
    padding (the mask transformers 4's generate inferred; 5 infers none for an encoder-decoder, and the model warns of
    such a batch: `warn_of_unmasked_padding`); with neither, the full width of `embedded` (inputs_embeds or the encoder's
    output)."""
    if attention_mask is not None:
        return attention_mask.sum(dim=-1).long()
    if input_ids is not None:
        if pad_token_id is None:
            return torch.full(input_ids.shape[:1], input_ids.shape[-1], dtype=torch.long, device=input_ids.device)
        return (input_ids != pad_token_id).sum(dim=-1).long()
    if embedded is None:
        raise ValueError("max_len_b: no input_ids, attention_mask, inputs_embeds or encoder_outputs to measure the "
                         "sources by")
    return torch.full(embedded.shape[:1], embedded.shape[1], dtype=torch.long, device=embedded.device)


# New tokens generate makes when neither max_new_tokens nor max_length is set: transformers' default max_length, 20,
# counted from the end of the decoder prompt (GenerationMixin._prepare_generated_length).
DEFAULT_NEW_TOKENS = 20


def longest_new_output(config: GenerationConfig, prompt_length: int) -> int:
    """New tokens `config` allows (transformers' rule): max_new_tokens, else max_length minus the decoder prompt,
    else DEFAULT_NEW_TOKENS."""
    if config.max_new_tokens is not None:
        return config.max_new_tokens
    if config.max_length is not None:
        return config.max_length - prompt_length
    return DEFAULT_NEW_TOKENS


def new_token_limits(lengths: torch.Tensor, ratio: float, offset: int, ceiling: int) -> torch.Tensor:
    """limit_i = min(floor(ratio * length_i + offset), ceiling), at least 1 (the end token)."""
    relative = torch.floor(lengths.double() * ratio + offset).long()
    return relative.clamp(min=1, max=max(1, ceiling))


def per_scores_row(values: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """One value per source row, repeated to the rows of generate's `scores` (a row's beams and returned sequences
    are adjacent), on their device."""
    return values.to(scores.device).repeat_interleave(scores.shape[0] // values.shape[0])


def shortest_new_output(config: GenerationConfig, prompt_length: int) -> int:
    """New tokens before which `config` bans the end token (transformers' `min_new_tokens`, and `min_length` counted
    with the decoder prompt): the larger of the two, 0 when neither is set."""
    from_min_length = (config.min_length or 0) - prompt_length
    return max(config.min_new_tokens or 0, from_min_length, 0)


def check_shortest_below_limits(limits: torch.Tensor, shortest: int, ceiling: int) -> None:
    """One ValueError when a minimum output length bans the end token at the step where a row's source-relative cap
    must end it (fairseq refuses min_len > max_len likewise): every row capped below the `ceiling` (max_new_tokens)
    needs limit_i > `shortest`. At the ceiling, generate stops as it always does, without an end token."""
    capped = limits[limits < ceiling]
    if capped.numel() == 0:
        return
    tightest = int(capped.min())
    if shortest >= tightest:
        raise ValueError(f"min_new_tokens / min_length ask for at least {shortest} new tokens before the end token, "
                         f"but max_len_a * source length + max_len_b ends a row of this batch after {tightest} new "
                         f"tokens (its end token included): lower min_new_tokens / min_length, or raise max_len_a / "
                         "max_len_b (max_len_b=None switches the source-relative cap off)")


class SourceLengthCapLogitsProcessor(LogitsProcessor):
    """At the step that makes row i's `limits[i]`-th new token, only the end token(s) keep their scores (the others
    become -inf; the end token's log-probability is left as the model gives it, as in fairseq), so the row ends there.
    The cap wins over other processors: an end token they set to -inf (`bad_words_ids`, `suppress_tokens`, a minimum
    length) scores 0 there, so the row still ends instead of choosing among -inf scores; except at the `ceiling`
    (max_new_tokens, when given), where generate stops anyway and such a row keeps its scores, as without the cap.
    Rows are matched to the scores' rows by repetition (`per_scores_row`)."""

    def __init__(self, limits: torch.Tensor, prompt_length: int, eos_token_id: int | list[int],
                 ceiling: int | None = None):
        self.limits = limits
        self.prompt_length = prompt_length
        self.eos_token_ids = eos_token_id if isinstance(eos_token_id, list) else [eos_token_id]
        self.ceiling = ceiling

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        generated = input_ids.shape[-1] - self.prompt_length
        limits = per_scores_row(self.limits, scores)
        ending = limits == generated + 1
        if not bool(ending.any()):
            return scores
        ended = torch.full_like(scores, -math.inf)
        end_scores = scores[:, self.eos_token_ids]
        banned = torch.isneginf(end_scores).all(dim=-1)   # every end token of the row at -inf
        ended[:, self.eos_token_ids] = torch.where(banned[:, None], 0.0, end_scores)
        if self.ceiling is not None:
            ending = ending & ~(banned & (limits == self.ceiling))
        return torch.where(ending[:, None], ended, scores)
