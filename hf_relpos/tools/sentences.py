"""Translating lines sentence by sentence: each line is split into sentences (the pipeline's `tagged_sentences`),
all sentences are translated as one list, and each line is put back together from its sentences' translations (the
pipeline's `join_translations`: one space between two, none between Chinese or Japanese ones). The models are trained on single sentences:
a line of several would otherwise be translated as one long input, which they stop after about its first sentence."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..publish.pipeline_relpos import join_translations, tagged_sentences


def translate_by_sentence(lines: Sequence[str], translate: Callable[[list[str]], list[str]],
                          tags: set[str] | None = None) -> list[str]:
    """One translation per line: `translate` gets every sentence of every line in one list (a blank line gives one
    blank sentence; a line's language `tags` in front of each of its sentences, `tagged_sentences`) and
    returns one translation per sentence; a line's translation joins its sentences' with one space, or none where two
    translations meet in Chinese or Japanese script (`join_translations`)."""
    layout = [tagged_sentences(line, tags or set()) for line in lines]
    translations = iter(translate([sentence for pieces in layout for sentence, _ in pieces]))
    return [join_translations([(next(translations), separator) for _, separator in pieces]) for pieces in layout]
