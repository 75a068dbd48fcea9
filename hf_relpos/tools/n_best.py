"""N-best lists for `hf-relpos-translate --n_best N`, in the Moses / Marian n-best format:

    LINE_INDEX ||| HYPOTHESIS ||| F0= SUM_LOGPROB ||| SCORE

LINE_INDEX counts the input's lines from 0. F0 is the hypothesis' summed token log-probability,
sum_t log p(y_t | y_<t, x) over its new tokens (the end token included, the decoder start token not), with
log p(y_t | ...) the score generate gave the token: in beam search, the log-softmax of the model's logits after
generate's logits processors (beam search applies them to the log-softmax; `compute_transition_scores` with the beam
indices and normalize_logits=False reads it back); in greedy search, the log-softmax of the logits the processors left
(greedy search applies them to the logits). Both equal the model's log-probability where no processor changes the
scores. generate takes the logits in float32 whatever the model's dtype; F0 is summed in float64. SCORE is
F0 / length ** length_penalty, length the same new tokens: transformers' beam-search score of a finished hypothesis
(`sequences_scores`, computed here in float64 rather than generate's float32), and CTranslate2's, whose length counts
the end token it returns. A line's hypotheses come best first by SCORE.

HYPOTHESIS is the translation with Moses' escapes for "&" and "|" ("&amp;", "&#124;", as escape-special-chars.perl
writes them), so that "|||" only ever separates fields, whatever the model translates: `html.unescape` (or Moses'
deescape-special-chars.perl) gives the translation back exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel


@dataclass(frozen=True)
class Hypothesis:
    """One translation of a line, with F0 (`log_probability`) and SCORE of the n-best format."""

    text: str
    log_probability: float
    score: float


@dataclass(frozen=True)
class ScoredSequences:
    """Generated ids [rows, length] (the decoder start token first, right-padded), each row's F0 (float64) and SCORE
    (float64), and its new tokens counted as SCORE counts them."""

    sequences: torch.Tensor
    log_probabilities: torch.Tensor
    scores: torch.Tensor
    lengths: torch.Tensor


def length_normalised(log_probabilities: torch.Tensor, lengths: torch.Tensor, length_penalty: float) -> torch.Tensor:
    """SCORE = F0 / length ** length_penalty (transformers' `sequences_scores`), in float64; 0 for an empty hypothesis
    (length 0, whose F0 is 0)."""
    lengths = lengths.to(torch.float64)
    return torch.where(lengths > 0, log_probabilities.to(torch.float64) / lengths.clamp(min=1) ** length_penalty, 0.0)


def new_token_lengths(sequences: torch.Tensor, end_token_ids: Sequence[int]) -> torch.Tensor:
    """Per row of generated ids (the decoder start token first), its new tokens up to and including the first end
    token; all of them in a row without one (cut at the length cap)."""
    new_tokens = sequences[:, 1:]
    ends = torch.isin(new_tokens, torch.tensor(list(end_token_ids), device=new_tokens.device))
    first_end = torch.where(ends.any(-1), ends.int().argmax(-1) + 1, new_tokens.shape[-1])
    return first_end.cpu()


def generate_n_best(model: PreTrainedModel, inputs: dict[str, torch.Tensor], n_best: int,
                    **generate_kwargs: Any) -> ScoredSequences:
    """`model.generate`'s `n_best` best hypotheses per source row (rows i * n_best ... in generate's order), with F0
    gathered from generate's own step scores (`compute_transition_scores` with the beam indices) and SCORE. An engine
    that scores its own hypotheses (hf_relpos.tools.ctranslate2_engine) gives them from its `generate_n_best`."""
    if hasattr(model, "generate_n_best"):
        return model.generate_n_best(**inputs, n_best=n_best, **generate_kwargs)
    output = model.generate(**inputs, **generate_kwargs, num_return_sequences=n_best, output_scores=True,
                            return_dict_in_generate=True)
    beam_indices = getattr(output, "beam_indices", None)
    steps = [step.to(torch.float64) for step in output.scores]   # float32 from generate: promoted
    if beam_indices is None:   # greedy search keeps processed logits, beam search processed log-probabilities
        steps = [step.log_softmax(-1) for step in steps]
    token_log_probabilities = model.compute_transition_scores(output.sequences, tuple(steps), beam_indices)
    settings = generation_settings(model, generate_kwargs)
    end = settings.eos_token_id
    lengths = new_token_lengths(output.sequences, end if isinstance(end, list) else [end])
    counted = torch.arange(token_log_probabilities.shape[-1]) < lengths[:, None]   # greedy rows go on past their end
    log_probabilities = torch.where(counted.to(token_log_probabilities.device), token_log_probabilities,
                                    0.0).sum(-1).cpu()
    return ScoredSequences(output.sequences, log_probabilities,
                           length_normalised(log_probabilities, lengths, settings.length_penalty), lengths)


def generation_settings(model: PreTrainedModel, generate_kwargs: dict[str, Any]) -> GenerationConfig:
    """The generation settings `model.generate(**generate_kwargs)` runs with, derived by generate's own rule
    (transformers' `_prepare_generation_config`): a passed `generation_config`, its unset fields from the model's
    and then transformers' defaults, updated with the keyword arguments."""
    kwargs = dict(generate_kwargs)
    return model._prepare_generation_config(kwargs.pop("generation_config", None), **kwargs)[0]


def escaped(text: str) -> str:
    """`text` with Moses' escapes for "&" and "|" (escape-special-chars.perl's "&amp;" and "&#124;"), "&" first, so
    that `html.unescape` reverses it exactly."""
    return text.replace("&", "&amp;").replace("|", "&#124;")


def n_best_lines(line_index: int, hypotheses: Sequence[Hypothesis]) -> str:
    """A line's hypotheses in the n-best format, one a line: the hypothesis `escaped` (a "|||" in it would read as a
    field separator), the numbers as Python's repr, which reads back exactly."""
    return "".join(f"{line_index} ||| {escaped(hypothesis.text)} ||| F0= {hypothesis.log_probability!r} ||| "
                   f"{hypothesis.score!r}\n" for hypothesis in hypotheses)
