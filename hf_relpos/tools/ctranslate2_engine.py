"""A CTranslate2 folder (written by `hf-relpos-export ctranslate2`) behind the part of the PyTorch model's interface
that `hf-relpos-translate` uses: `generate(input_ids, attention_mask, **generation settings)`, `generation_config`,
`device`. The same tokenizer encodes and decodes around it, and the folder's generation_config.json gives the same
defaults (beams, length penalty, length cap), so a line is translated the same way by either engine.

One difference is the engine's: its beam search ends once num_beams hypotheses have finished, which is generate's
`early_stopping=True`. With transformers' default (`early_stopping=False`) generate may search on while a running
beam could still win, so a few beam-search lines can differ (never to a translation that PyTorch scores higher);
greedy decoding, and beam search with `early_stopping=True`, give the same lines (at the length penalties checked, 0.6 and 1.0; at 0
the engine can end with other hypotheses, which it scores higher). Under the source-relative cap
(max_len_b) the PyTorch model forces the end token as a row's `limit`-th new token: the engine decodes at most
`limit - 1` tokens and appends the end token to a row that did not end, which is greedy decoding's result exactly;
in beam search the forced end token's score is not part of the engine's ranking, so a capped row (one
`hf-relpos-translate` warns about) can differ. A `forced_eos_token_id` that is an end token (MarianMT's generation
configs set one) forces it the same way at the ceiling; `bad_words_ids` are translate_batch's `suppress_sequences`,
as is the decoder start token under `no_repeat_ngram_size` 1 (generate's history holds it, the engine's does not).
A `repetition_penalty` is refused with beam search and for a decoder that starts from its end token
(`translate_options`), where the engines' translations differ.
`generate_n_best` gives translate_batch's `num_hypotheses` with the n-best scores of the PyTorch model
(hf_relpos.tools.n_best): the engine's score is the same length-normalised score over the same tokens.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig

from ..model.generation_limits import (
    RELATIVE_LIMIT_FIELDS,
    check_shortest_below_limits,
    new_token_limits,
    relative_limit,
    source_lengths,
)
from .export import EXPORT_RECORD, banned_sequences, import_ctranslate2, start_and_end_tokens, translate_options
from .n_best import ScoredSequences, length_normalised

COMPUTE_TYPES = ("default", "auto", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16",
                 "bfloat16", "float32")


class CTranslate2Model:
    """`ctranslate2.Translator` over an exported folder, with generate()'s settings and token ids.

    `generate` takes generate()'s settings (num_beams, length_penalty, max_length counting the decoder start token,
    max_new_tokens, min_new_tokens, repetition_penalty, no_repeat_ngram_size), defaulting to the folder's
    generation_config.json as generate() does, and returns the generated ids (end token included when reached)
    right-padded into a [batch, length] tensor; sources are never truncated.
    """

    def __init__(self, folder: str | Path, device: str = "cpu", compute_type: str = "default",
                 threads: int | None = None) -> None:
        ctranslate2 = import_ctranslate2()
        if compute_type not in COMPUTE_TYPES:
            raise ValueError(f"compute_type must be one of {list(COMPUTE_TYPES)}, got {compute_type!r}")
        folder = Path(folder)
        self.record = json.loads((folder / EXPORT_RECORD).read_text(encoding="utf-8"))
        vocabulary_file = folder / "shared_vocabulary.json"
        self.tokens = json.loads(vocabulary_file.read_text(encoding="utf-8"))
        self.token_ids = {token: index for index, token in enumerate(self.tokens)}
        self.generation_config = (GenerationConfig.from_pretrained(folder)
                                  if (folder / "generation_config.json").is_file() else GenerationConfig())
        self.device = device
        kind, _, index = device.partition(":")
        self.translator = ctranslate2.Translator(
            str(folder), device=kind, device_index=int(index or 0), compute_type=compute_type,
            intra_threads=torch.get_num_threads() if threads is None else threads)
        self.position_table_rows = self.record.get("position_table_rows")
        self.start_token_id, self.end_token_ids = start_and_end_tokens(self.generation_config)

    def length_config(self, **settings: Any) -> GenerationConfig:
        """The folder's generation config updated with generate()'s `settings` (max_len_a / max_len_b included)."""
        config = copy.deepcopy(self.generation_config)
        for name in RELATIVE_LIMIT_FIELDS:
            if name in settings:
                setattr(config, name, settings.pop(name))
        config.update(**settings)
        return config

    def new_token_limits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                         **settings: Any) -> torch.Tensor | None:
        """Per source row, the most new tokens generate lets it produce: min(floor(max_len_a |x_i| + max_len_b),
        the ceiling) as the PyTorch model computes it (`hf_relpos.model.generation_limits`); None without max_len_b."""
        config = self.length_config(**settings)
        limit = relative_limit(config)
        if limit is None:
            return None
        lengths = source_lengths(input_ids, attention_mask, config.pad_token_id)
        return new_token_limits(lengths, *limit, self.decoding_options(**settings)["max_decoding_length"])

    def decoding_options(self, **settings: Any) -> dict[str, Any]:
        """translate_batch's options for generate()'s `settings` over the folder's generation config."""
        config = self.length_config(**settings)
        options = translate_options(config)
        banned = banned_sequences(config)
        if banned:
            options["suppress_sequences"] = [[self.tokens[token] for token in ids] for ids in banned]
        return options

    def forces_end_token(self, **settings: Any) -> bool:
        """Whether generate forces the end token as the last new token it allows (`forced_eos_token_id`)."""
        return self.length_config(**settings).forced_eos_token_id in self.end_token_ids

    def check_position_table(self, longest_source: int, longest_output: int, scoring: bool = False) -> None:
        """One ValueError when a position table (`absolute`, `none`, `alibi`) covers fewer positions than the longest
        source or the most new tokens a row may get (its own cap under max_len_b, else the ceiling), or, `scoring`,
        than the longest target scored (its tokens, the end token included)."""
        rows = self.position_table_rows
        if rows is not None and max(longest_source, longest_output) > rows:
            outputs, output, work = (("targets", "a target of", "score") if scoring else
                                     ("translations", "a length cap of", "translate"))
            raise ValueError(f"this export's position table covers {rows} positions: it serves sources and {outputs} "
                             f"of at most {rows} tokens, got a source of {longest_source} tokens and {output} "
                             f"{longest_output}; export again with hf-relpos-export ctranslate2 --max_positions "
                             f"{max(longest_source, longest_output)} or more, or {work} with the PyTorch folder")

    def positions_needed(self, lengths: list[int], **settings: Any) -> list[int]:
        """Per source of `lengths` tokens, the positions its translation takes of a position table: its length, or
        under a source-relative cap (max_len_b) its own cap where longer (`new_token_limits`); the ceiling, which
        every row shares, is `check_position_table`'s."""
        limit = relative_limit(self.length_config(**settings))
        if limit is None or not lengths:
            return list(lengths)
        caps = new_token_limits(torch.tensor(lengths), *limit, self.decoding_options(**settings)["max_decoding_length"])
        return [max(length, cap) for length, cap in zip(lengths, caps.tolist(), strict=True)]

    def target_log_probabilities(self, source_ids: list[list[int]], target_ids: list[list[int]]) -> list[list[float]]:
        """log p(y_t | y_<t, x) of each target token as the tokenizer encodes a label (ending in the end token), by
        the engine's `score_batch` (teacher forcing), sources never truncated: `hf_relpos.tools.score`'s numbers."""
        self.check_position_table(max(map(len, source_ids)), max(map(len, target_ids)), scoring=True)
        for ids in target_ids:
            if not ids or ids[-1] not in self.end_token_ids:
                raise ValueError(f"a target to score must end in the end token (score_batch appends it), got "
                                 f"{self.tokens[ids[-1]] if ids else 'no token'!r} last")
        results = self.translator.score_batch(
            [[self.tokens[token] for token in ids] for ids in source_ids],
            [[self.tokens[token] for token in ids[:-1]] for ids in target_ids], max_input_length=0)
        return [list(result.log_probs) for result in results]

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 **settings: Any) -> torch.Tensor:
        """The translations of the (padded) sources as generated ids [batch, length], the decoder start token first
        (as generate returns them), padded with pad_token_id (`generate_n_best`'s best hypotheses)."""
        return self.generate_n_best(input_ids, attention_mask, 1, **settings).sequences

    def generate_n_best(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, n_best: int = 1,
                        **settings: Any) -> ScoredSequences:
        """The `n_best` best translations of each (padded) source, rows i * n_best ..., as generated ids (the decoder
        start token first, as generate returns them, padded with pad_token_id) with F0 and SCORE as the PyTorch model
        gives them (hf_relpos.tools.n_best): the engine's score is F0 / length ** length_penalty over the tokens it
        returns (the end token included, as `return_end_token` gives it), F0 is that score times length **
        length_penalty. With a source-relative cap (max_len_b), the rows are decoded in groups of equal
        `new_token_limits`, each to one token short of its cap, the end token then ending a row that did not end (as
        the PyTorch model forces it; a row's translation does not depend on the rows beside it): it counts in the
        length and adds 0 to F0, as generate's greedy search and `forced_eos_token_id` score it (the engine does not
        score it; generate's beam search keeps the model's log-probability of the end token at the source-relative
        cap, so a capped row's F0 differs there, as its translation can). Without an attention mask, the tokens that
        are not pad_token_id are the sources (transformers 4's generate inferred that mask; the PyTorch model under
        transformers 5 attends to the padding without it, and warns)."""
        pad = self.length_config(**settings).pad_token_id
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids) if pad is None else (input_ids != pad).long()
        options = self.decoding_options(**settings)
        limits = self.new_token_limits(input_ids, attention_mask, **settings)
        self.check_position_table(max(attention_mask.sum(-1).tolist()),
                                  options["max_decoding_length"] if limits is None else int(limits.max()))
        if limits is not None:
            check_shortest_below_limits(limits, options["min_decoding_length"], options["max_decoding_length"])
        sources = [[self.tokens[token] for token, kept in zip(ids, mask, strict=True) if kept]  # either padding side
                   for ids, mask in zip(input_ids.tolist(), attention_mask.tolist(), strict=True)]
        forced_end = limits is not None or self.forces_end_token(**settings)
        if limits is None:   # the ceiling: as a cap whose last new token is forced only with forced_eos_token_id
            limits = torch.full((len(sources),), options["max_decoding_length"] + (0 if forced_end else 1))
        caps = limits.tolist()
        length_penalty = options["length_penalty"]
        outputs: list[list[int]] = [[] for _ in range(len(sources) * n_best)]
        log_probabilities = [0.0] * len(outputs)
        for cap in sorted(set(caps)):
            group = [index for index, row_cap in enumerate(caps) if row_cap == cap]
            results = [([[]] * n_best, [0.0] * n_best) for _ in group] if cap == 1 else [
                (result.hypotheses, result.scores) for result in self.translator.translate_batch(
                    [sources[index] for index in group], max_input_length=0, return_end_token=True,
                    num_hypotheses=n_best, return_scores=True,
                    **{**options, "max_decoding_length": cap - 1,
                       "min_decoding_length": min(options["min_decoding_length"], cap - 1)})]
            for index, (hypotheses, scores) in zip(group, results, strict=True):
                for rank, (tokens, score) in enumerate(zip(hypotheses, scores, strict=True)):
                    new_ids = [self.token_ids[token] for token in tokens]
                    log_probabilities[index * n_best + rank] = score * len(new_ids) ** length_penalty if new_ids else 0.0
                    if forced_end and (not new_ids or new_ids[-1] not in self.end_token_ids):
                        new_ids.append(self.end_token_ids[0])   # the model forces the end token as new token `cap`
                    outputs[index * n_best + rank] = [self.start_token_id, *new_ids]
        longest = max((len(ids) for ids in outputs), default=0)
        lengths = torch.tensor([len(ids) - 1 for ids in outputs])
        log_probabilities = torch.tensor(log_probabilities, dtype=torch.float64)
        return ScoredSequences(torch.tensor([ids + [pad or 0] * (longest - len(ids)) for ids in outputs],
                                            dtype=torch.long),
                               log_probabilities, length_normalised(log_probabilities, lengths, length_penalty), lengths)
