"""`pipeline("translation")` for hf_relpos models: transformers 5 removed the built-in translation task.

`import hf_relpos` puts the task back into transformers' pipeline registry (`register_translation_task`), so
`pipeline("translation", model=FOLDER)` translates with a saved folder. Flat on purpose: hf_relpos.publish.hub ships this
file with every pushed model and declares it in config.json (`custom_pipelines`), so that where hf_relpos is not
installed

    pipeline("translation", model=REPO, trust_remote_code=True)("A sentence.")

translates too (transformers then requires `trust_remote_code=True` for such a repo even with hf_relpos installed).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import torch
from transformers.pipelines.base import ChunkPipeline
from transformers.utils import logging

logger = logging.get_logger(__name__)

# Sentence ends followed by whitespace: Latin and Cyrillic . ! ? …; Devanagari danda । ॥ (Hindi, Marathi,
# Nepali), Arabic-script ؟ and ۔ (Arabic, Persian, Urdu), Armenian ։, Ethiopic ። ፧ ፨, Burmese ။; and CJK 。！？ (｡ the
# half-width 。).
SENTENCE_END = ".!?…।॥؟۔։።፧፨။。！？｡"
NO_SPACE_SENTENCE_END = "。！？｡"   # Chinese and Japanese: the next sentence follows without a space
CLOSING = "\"'”’»)]」』）】〕〉》〗〙〛＂＇］｝"
ELLIPSIS = "..."   # three periods, which end a sentence as … does
# Where a sentence may end: whitespace (`ends_sentence` decides), or 。！？ right before the next sentence's first
# character. Not after a closing quote or bracket: 「はい。」と彼は言った。 and “你去哪儿？”他问道。 go on past it.
SENTENCE_BOUNDARY = re.compile(rf"\s+|[{NO_SPACE_SENTENCE_END}]+(?=[^\s{re.escape(CLOSING)}])")
# A character of the scripts written without spaces between sentences (CJK symbols and punctuation, kana, Han,
# full-width forms; the characters themselves, not escapes, so that Arrow's RE2 reads the pattern too), and the
# opening quotes and brackets before a sentence's first letter.
NO_SPACE_SCRIPT = re.compile("[\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef]")
OPENING = "\"'“‘«„‚»([「『（【〔〈《〖〘〚＂＇［｛"
# After a sentence's end, German quotes „…“, ‚…‘ and »…« close with “ ‘ « (which open quotes elsewhere, so they are
# not in CLOSING, whose 。！？ rule must not read “ as closing).
QUOTE_CLOSING = CLOSING + "“‘«"
# Invisible marks of bidirectional text (LRM, RLM, the Arabic letter mark, embeddings, overrides and isolates) that
# Arabic, Persian and Hebrew text often puts right after a sentence's end ("بخير؟\u200f"): it still ends there.
BIDI_MARKS = "\u200e\u200f\u061c\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
# Words whose period does not end a sentence when a capital or a number follows (English and German titles,
# Latin shorthands, German "z. B.", "d. h.", "u. a."); lowercase, without the period.
ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st jr sr sen rep gov gen col capt lt sgt rev fr hr frl mt ft vs cf approx ca str bzw usw vgl "
    "inc ltd corp co dept univ z d u".split()
)
MONTH_ABBREVIATIONS = "jan feb mar mär apr jun jul aug sep sept oct okt nov dec dez"   # English and German
# References and months whose period does not end a sentence only when a number follows ("No. 5", "Art. 3", "p. 4",
# "Jan. 5"; Moses' NUMERIC_ONLY prefixes): as words or names ("The answer is no. We left.", "He loves art. She hates
# it.", "Ich traf Jan. Er lachte.") they end one.
NUMBER_ABBREVIATIONS = frozenset(f"no nos nr art p pp fig figs vol vols ch sec abs {MONTH_ABBREVIATIONS}".split())
# A number after a reference: digits, a Roman numeral but a lone "I" ("Vol. II", "Art. IV"; "No. I won't." ends), or a
# capital letter but "A" and "I" ("Fig. B").
REFERENCE_NUMBER = re.compile(r"\d|(?!I(?:\W|$))[IVXLCDM]+(?:\W|$)|[B-HJ-Z](?:\W|$)")
# German writes a date's day as an ordinal number with a period ("am 3. Oktober", "bis zum 5. Jan."): after one of
# `DATE_OPENERS` and before a month's name or its abbreviation, a day's number does not end a sentence (elsewhere it
# may: "He finished 3. September began well.", "Sie lag auf Platz 3. Juli wurde Zweite.").
MONTHS = frozenset("januar jänner februar feber märz april mai juni juli august september oktober november "
                   f"dezember {MONTH_ABBREVIATIONS}".split())
DATE_OPENERS = frozenset("am vom zum bis ab seit den dem der des im".split())
# German writes every ordinal number with a period ("im 19. Jahrhundert", "der 2. Weltkrieg", "zum 3. Mal"): after an
# article or a preposition joined with one, a number before a capitalised word (German capitalises its nouns) does not
# end a sentence ("Er zählte bis 3. Dann ging er." does).
ORDINAL_OPENERS = frozenset("am vom zum zur im ins beim der die das den dem des".split())
NEXT_WORD = re.compile(r"\S*")
# An e-mail or web address ("info@example.com", "https://example.com/a", "www.example.com"): its periods are its
# own, so a period after it ends a sentence as after a word.
ADDRESS = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+|(?:[a-z][a-z0-9+.-]*://|www\.)\S+", re.IGNORECASE)
# A bare host name ("example.com", "bbc.co.uk"): a label of three characters or more, and a lowercase country code or
# common generic top-level domain last, which no dotted shorthand has ("U.S", "M.Sc", "Ph.D", "z.B", "Dr.med").
HOST_NAME = re.compile(r"(?=.*[A-Za-z0-9-]{3})(?:[A-Za-z0-9-]+\.)+(?:[a-z]{2}|com|org|net|edu|gov|info|biz|app|dev)")
# A list or section number ("1", "2.1"), whose period does not end a sentence it opens ("1. Take", "2.1. Overview").
LIST_NUMBER = re.compile(r"\d+(?:\.\d+)*")
# Keyword arguments of transformers 4's TranslationPipeline that cannot mean anything for a bilingual model.
MULTILINGUAL_ARGUMENTS = ("src_lang", "tgt_lang")


def reached_length_limit(token_ids: Any, eos_token_id: int | list[int] | None, limit: int | None = None) -> bool:
    """Whether generated ids (a sequence or 1-d tensor, the decoder start token first) reached the length limit: they
    hold no end token (generation stopped at max_new_tokens / max_length: the translation is cut), or their end token
    is new token number `limit` or later (the model's source-relative cap ends a row with it, so it may be cut)."""
    ends = set(eos_token_id if isinstance(eos_token_id, list) else [eos_token_id])
    new_tokens = (token_ids.tolist() if hasattr(token_ids, "tolist") else list(token_ids))[1:]
    first_end = next((index for index, token in enumerate(new_tokens) if token in ends), None)
    return first_end is None or (limit is not None and first_end + 1 >= limit)


def forced_end_limit(config: Any, **settings: Any) -> int | None:
    """The new token at which generation under `config` (a generation config) with the call's `settings` on top ends a
    translation with its `forced_eos_token_id` (MarianMT's generation configs, which a converted model keeps, force the
    end token so): the last one the call allows, max_new_tokens, else max_length less the decoder start token, else
    transformers' default of 20; None where no token is forced. A translation cut there holds its end token, so only
    this limit tells `reached_length_limit` that it reached the maximum length."""
    forced, max_new_tokens, max_length = (settings[name] if name in settings else getattr(config, name, None)
                                          for name in ("forced_eos_token_id", "max_new_tokens", "max_length"))
    if forced is None:
        return None
    if max_new_tokens is not None:
        return max_new_tokens
    return 20 if max_length is None else max_length - 1


def right_aligned(inputs: dict[str, Any]) -> dict[str, Any]:
    """`inputs` (input_ids and attention_mask [B, n] of padded sources) with each row's tokens moved to its start and
    its padding to its end, whatever side the tokenizer padded: a source's tokens then sit at positions 0 .. n-1 as
    alone, which the embedding-level encodings (`absolute`'s sinusoids, `keep_absolute_positions`) read from a
    token's index, so no source's translation depends on the sources batched beside it. Other entries stay."""
    mask = inputs.get("attention_mask")
    if mask is None:
        return inputs
    order = torch.argsort((mask == 0).to(torch.int8), dim=-1, stable=True)   # kept tokens first, in their order
    return {**inputs, "input_ids": inputs["input_ids"].gather(-1, order), "attention_mask": mask.gather(-1, order)}


def split_into_sentences(text: str) -> list[tuple[str, str]]:
    """`text` as (sentence, the whitespace after it) pairs, whose concatenation is `text`; no sentence starts or ends
    with whitespace (whitespace opening the text is the first pair's, ("", whitespace); a blank text is one pair, (text,
    "")). A sentence ends at a line break; at . ! ? … or ... (three periods), or another script's end of `SENTENCE_END`
    (Hindi ।, Urdu ۔), closing quotes or brackets and `BIDI_MARKS` allowed, followed by whitespace and no lowercase
    letter ("e.g. the" is not split), except after a period that belongs to its word: an abbreviation of `ABBREVIATIONS`
    ("Dr. Smith"), one of `NUMBER_ABBREVIATIONS` before a number ("No. 5", "Vol. II"), a capital initial or a dotted
    shorthand ("J. Smith", "U.S. Army"), a list or section number opening the sentence ("1. Take", "2.1. Overview"), a
    German date's day ("am 3. Oktober") or ordinal number ("im 19. Jahrhundert"), quotes allowed around the word (German
    „Ja.“ ends a sentence, „Dr. Müller does not); and at Chinese and Japanese 。！？, with whitespace after them (closing
    quotes or brackets such as 」』） allowed) or right before the next sentence's first character (the sentence is
    followed by ""; a closing quote there continues the sentence: 「はい。」と彼は言った。). Decimals ("3.5") hold no whitespace and
    are never split; a number's period ends a sentence as a word's does ("It rose to 3.5. Then it fell."), as does the
    period after an e-mail or web address or a host name ("Write to info@example.com. We", "See example.com. We")."""
    pieces = []
    start = 0
    for match in SENTENCE_BOUNDARY.finditer(text):
        if not match.group().isspace():   # 。！？ right before the next sentence
            pieces.append((text[start:match.end()], ""))
            start = match.end()
        elif match.start() == 0 and match.end() < len(text):   # whitespace before the first sentence: not part of it
            pieces.append(("", match.group()))
            start = match.end()
        elif match.start() > start and (match.end() == len(text) or "\n" in match.group() or ends_sentence(
                text[start:match.start()], NEXT_WORD.match(text, match.end()).group())):
            pieces.append((text[start:match.start()], match.group()))
            start = match.end()
    pieces.append((text[start:], ""))
    return pieces


def language_tags(tokenizer: Any) -> set[str]:
    """The tokens that open a source to name its target language: the tokenizer's special tokens besides the named
    ones (those added with `add_special_tokens({"additional_special_tokens": [">>deu<<"]})`) and a MarianTokenizer's
    language codes (`supported_language_codes`)."""
    named = set(tokenizer.special_tokens_map.values())
    codes = getattr(tokenizer, "supported_language_codes", None) or ()
    return {token for token in tokenizer.all_special_tokens if token not in named} | set(codes)


def tagged_sentences(text: str, tags: set[str]) -> list[tuple[str, str]]:
    """`split_into_sentences(text)` with each sentence that is neither blank nor opened by tags of its own given the
    tags that opened the last earlier sentence that had them (one or more of `tags`, each followed by optional
    whitespace: ">>deu<< A. B." gives ">>deu<< B."): each sentence is translated alone, and one without its text's
    target-language tag would be translated into another language. A tag inside a sentence is left as it is."""
    pieces = split_into_sentences(text)
    if not tags:
        return pieces
    opening_tags = re.compile(rf"(?:(?:{'|'.join(map(re.escape, sorted(tags, key=len, reverse=True)))})\s*)+")
    tagged = []
    prefix = ""
    for sentence, separator in pieces:
        opening = opening_tags.match(sentence)
        if opening is not None:
            prefix = opening.group().rstrip() + " "
        elif sentence.strip():
            sentence = prefix + sentence
        tagged.append((sentence, separator))
    return tagged


def ends_sentence(sentence: str, next_word: str) -> bool:
    """Whether `sentence` (the text since the last split, up to a space) ends where `next_word` follows."""
    next_character = next_word[:1]
    words = sentence.rsplit(None, 2)   # the last word, and the one before it (a German date's opener)
    word = words[-1].rstrip(QUOTE_CLOSING + BIDI_MARKS)
    if not word.endswith(tuple(SENTENCE_END)) or next_character.islower():
        return False
    if not word.endswith(".") or word.endswith(ELLIPSIS):
        return True
    stem = word[:-1].lstrip(OPENING)
    if stem.lower() in ABBREVIATIONS or (stem.lower() in NUMBER_ABBREVIATIONS and REFERENCE_NUMBER.match(next_word)):
        return False
    if ADDRESS.fullmatch(stem) or HOST_NAME.fullmatch(stem):
        return True
    if ("." in stem and any(character.isalpha() for character in stem)) or (len(stem) == 1 and stem.isupper()):
        return False   # a dotted shorthand ("U.S", "e.g", "z.B") or an initial; a number's periods are its own ("3.5.")
    if (stem.isdigit() and 1 <= int(stem) <= 31 and next_word.rstrip(".,;:!?").lower() in MONTHS
            and len(words) > 1 and words[-2].rstrip(",").lower() in DATE_OPENERS):
        return False
    if (stem.isdigit() and next_word.lstrip(OPENING)[:1].isupper() and len(words) > 1
            and words[-2].lower() in ORDINAL_OPENERS):
        return False
    return not (LIST_NUMBER.fullmatch(stem) and sentence.strip() == word)


def join_translations(pieces: list[tuple[str, str]]) -> str:
    """The translations of a text's sentences, given with the whitespace that followed each source sentence
    (`split_into_sentences`), joined into one text: the line breaks ("\n") of that whitespace are kept (a paragraph
    break stays one), any other whitespace (spaces, tabs, "\r", U+2028, ...) or none becomes one space between two
    translations, or none where both are written without spaces there: the first ends and the second starts in such
    a script (Chinese or Japanese translations; not an English one ending in a name in Han characters). Empty
    translations and whitespace at the ends give nothing but their line breaks."""
    joined, line_breaks = "", 0
    for translation, separator in pieces:
        if translation:
            without_space = not joined or (NO_SPACE_SCRIPT.fullmatch(joined.rstrip(CLOSING)[-1:]) is not None
                                            and NO_SPACE_SCRIPT.fullmatch(translation.lstrip(OPENING)[:1]) is not None)
            joined += ("\n" * line_breaks if line_breaks else "" if without_space else " ") + translation
            line_breaks = 0
        line_breaks += separator.count("\n")
    return joined + "\n" * line_breaks


class TranslationPipeline(ChunkPipeline):
    """`pipeline("translation")` for encoder-decoder models: text (or a list of texts) in,
    `[{"translation_text": ...}]` out (one dict per `num_return_sequences`).

    The models are trained on sentences, so a text is translated sentence by sentence (`split_sentences=False`
    translates it in one piece) and the translations are joined as `join_translations` says (line breaks kept, one
    space or none between sentences): a long text is translated in full, never cut to a first fragment. An empty (or blank) text or sentence translates
    to "". Generation settings (`num_beams`, the length cap `max_len_a` x source tokens + `max_len_b` under
    `max_new_tokens`, ...) come from the model's generation_config.json unless passed as keyword arguments; a
    translation that reaches its length cap is reported once with a warning. Of the old `TranslationPipeline` arguments, `truncation` is passed to the tokenizer
    and `clean_up_tokenization_spaces` to decoding; `src_lang`/`tgt_lang` (languages of a multilingual model) are an
    error, as is `return_tensors` (the ids of one text are those of several sentences).
    """

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True
    _pipeline_calls_generate = True

    def __call__(self, inputs: Any, **kwargs: Any) -> Any:
        """Translate a text (a list of one dict per sequence) or a list of texts (a list of those; [] for [],
        whose first item transformers' Pipeline reads: an IndexError), its settings checked either way."""
        if isinstance(inputs, list) and not inputs:
            self._sanitize_parameters(**kwargs)
            return []
        outputs = super().__call__(inputs, **kwargs)
        if isinstance(inputs, list) and all(len(output) == 1 for output in outputs):
            return [output[0] for output in outputs]
        return outputs

    def _sanitize_parameters(
        self, truncation: bool | str | None = None, split_sentences: bool | None = None,
        clean_up_tokenization_spaces: bool | None = None, **generate_kwargs: Any,
    ) -> tuple[dict, dict, dict]:
        given = [name for name in MULTILINGUAL_ARGUMENTS if generate_kwargs.pop(name, None) is not None]
        if given:
            tags = sorted(language_tags(self.tokenizer))
            how = (f"this model's tokenizer has language tags ({', '.join(tags)}): write the target language's tag "
                   "in front of the text (\">>deu<< A text.\") and leave them out" if tags else
                   "this model translates one fixed language pair, so they cannot be honoured: leave them out")
            raise ValueError(f"{'/'.join(given)} choose the languages of a multilingual model (mBART, M2M100); {how}")
        if generate_kwargs.pop("return_tensors", None) or generate_kwargs.pop("return_text", True) is False:
            raise ValueError("return_tensors / return_text=False: this pipeline returns text only (a text is "
                             "translated sentence by sentence); call model.generate for token ids")
        preprocess = {name: value for name, value in (("truncation", truncation),
                                                      ("split_sentences", split_sentences)) if value is not None}
        postprocess = {} if clean_up_tokenization_spaces is None else {
            "clean_up_tokenization_spaces": clean_up_tokenization_spaces}
        # Settings generate takes that are not GenerationConfig fields (max_len_a, max_len_b) reach here, not the
        # pipeline's own generation kwargs: a call's are added to those given when the pipeline was made.
        given_at_init = getattr(self, "_forward_params", {}).get("generate_kwargs", {})
        merged = {**given_at_init, **generate_kwargs}
        settings = merged.get("generation_config", self.model.generation_config)
        sequences = merged.get("num_return_sequences") or settings.num_return_sequences or 1
        preprocess["ranked_sequences"] = 1 if merged.get("do_sample", settings.do_sample) else sequences
        return preprocess, {"generate_kwargs": merged}, postprocess

    def preprocess(self, text: str, truncation: bool | str = False, split_sentences: bool = True,
                   ranked_sequences: int = 1) -> Iterator[dict]:
        """The text's sentences (or the text in one piece), tokenized. `ranked_sequences` > 1 (num_return_sequences
        under beam search) refuses a text of several sentences: each sentence's n-th translation joined is not the
        text's n-th best, which hf-relpos-translate --n_best refuses too."""
        if not isinstance(text, str):
            raise TypeError(f"the translation pipeline takes a text or a list of texts, got {type(text).__name__}")
        pieces = (tagged_sentences(text, language_tags(self.tokenizer)) if split_sentences
                  else [(text, "")])
        sentences = sum(1 for sentence, _ in pieces if sentence.strip())
        if ranked_sequences > 1 and sentences > 1:
            raise ValueError(f"num_return_sequences={ranked_sequences} ranks the beam-search translations of one "
                             f"input; this text splits into {sentences} sentences, each translated on its own, and "
                             "their n-th translations joined are not the text's n-th best: pass split_sentences=False "
                             "to rank translations of the text in one piece, or give its sentences as a list")
        for index, (sentence, separator) in enumerate(pieces):
            encoded = self.tokenizer(sentence, truncation=truncation, return_tensors="pt")
            yield {**encoded, "blank": not sentence.strip(), "separator": separator, "is_last": index == len(pieces) - 1}

    def _forward(self, model_inputs: dict, generate_kwargs: dict) -> dict:
        extras = {name: model_inputs.pop(name) for name in ("blank", "separator", "is_last")}
        batch_size = model_inputs["input_ids"].shape[0]
        generate_kwargs = self._prepare_generate_kwargs(generate_kwargs)
        settings = generate_kwargs.get("generation_config", self.model.generation_config)
        sequences = generate_kwargs.get("num_return_sequences") or settings.num_return_sequences or 1
        # A blank sentence translates to "" (postprocess): only the others are generated, so that settings a one-token
        # source cannot meet (a minimum length above its length cap) do not stop them.
        wanted = ~torch.tensor(extras["blank"]).reshape(batch_size)
        output_ids = torch.zeros((batch_size, sequences, 0), dtype=torch.long)
        limits = torch.full((batch_size,), -1)   # each source's own length cap, -1 where there is none
        # the fixed cap where it ends a translation with a forced end token, -1 where it does not
        fixed = forced_end_limit(settings, **{name: value for name, value in generate_kwargs.items()
                                              if name != "generation_config"})
        fixed_limits = torch.full((batch_size,), -1 if fixed is None else fixed)
        if bool(wanted.any()):
            sources = right_aligned({name: value[wanted.to(value.device)] for name, value in model_inputs.items()})
            generated = self.model.generate(**sources, **generate_kwargs).cpu()
            output_ids = torch.zeros((batch_size, sequences, generated.shape[-1]), dtype=generated.dtype)
            output_ids[wanted] = generated.reshape(-1, sequences, generated.shape[-1])
            wanted_limits = (self.model.new_token_limits(**sources, **generate_kwargs)
                             if hasattr(self.model, "new_token_limits") else None)
            if wanted_limits is not None:
                limits[wanted] = wanted_limits.cpu()
        return {"output_ids": output_ids, "limits": limits, "fixed_limits": fixed_limits, **extras}

    def postprocess(self, outputs: list[dict], clean_up_tokenization_spaces: bool = False) -> list[dict[str, str]]:
        translations: list[list[tuple[str, str]]] = [[] for _ in range(outputs[0]["output_ids"].shape[1])]
        for output in outputs:
            for index, ids in enumerate(output["output_ids"][0]):
                if output["blank"]:
                    text = ""
                else:
                    self._warn_if_cut(ids, int(output["limits"].reshape(-1)[0]),
                                      int(output["fixed_limits"].reshape(-1)[0]))
                    text = self.tokenizer.decode(ids, skip_special_tokens=True,
                                                 clean_up_tokenization_spaces=clean_up_tokenization_spaces).strip()
                translations[index].append((text, output["separator"]))
        return [{"translation_text": join_translations(pieces)} for pieces in translations]

    def _warn_if_cut(self, ids: Any, limit: int, fixed_limit: int = -1) -> None:
        """Warn once when a translation reached the cap that applied: the source-relative one (`limit` >= 0), else
        the fixed max_new_tokens / max_length (`fixed_limit` >= 0 where it ends a translation with a forced end
        token: `forced_end_limit`)."""
        relative = limit >= 0
        cap = limit if relative else fixed_limit if fixed_limit >= 0 else None
        if not reached_length_limit(ids, self.model.generation_config.eos_token_id, cap):
            return
        if relative:
            logger.warning_once(
                "A translation reached the maximum length (max_len_a x source tokens + max_len_b, at most "
                "max_new_tokens) and may be cut: pass a larger max_len_b or max_new_tokens to the pipeline call (a "
                "translation that repeats itself up to the cap is the model's loop, not a short cap: "
                "no_repeat_ngram_size=N ends such loops).")
        else:
            logger.warning_once(
                "A translation reached the maximum length (max_new_tokens, else max_length) and may be cut: pass a "
                "larger max_new_tokens to the pipeline call, or max_len_a and max_len_b for a cap relative to each "
                "source.")


class LanguagePairTaskAliases(dict):
    """transformers' task aliases, and transformers 4's names of the translation task with a language pair
    ("translation_en_to_de", `LANGUAGE_PAIR_TASK`), each an alias of "translation" as it was there (the pair is not
    checked: a bilingual model translates its own pair, as MarianMT did under any such name)."""

    def __contains__(self, task: object) -> bool:
        return super().__contains__(task) or (isinstance(task, str) and LANGUAGE_PAIR_TASK.fullmatch(task) is not None)

    def __missing__(self, task: str) -> str:
        if isinstance(task, str) and LANGUAGE_PAIR_TASK.fullmatch(task):
            return "translation"
        raise KeyError(task)


LANGUAGE_PAIR_TASK = re.compile(r"translation_[^_]+_to_[^_]+")


def register_translation_task() -> None:
    """Restore the "translation" task that transformers 5 removed, served by `TranslationPipeline`, under its name
    and transformers 4's names with a language pair (`LanguagePairTaskAliases`)."""
    from transformers import AutoModelForSeq2SeqLM, pipelines

    pipelines.REMOVED_TASKS.pop("translation", None)
    registry = pipelines.PIPELINE_REGISTRY
    registry.register_pipeline(
        "translation", pipeline_class=TranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
    )
    if not isinstance(registry.task_aliases, LanguagePairTaskAliases):
        registry.task_aliases = LanguagePairTaskAliases(registry.task_aliases)
