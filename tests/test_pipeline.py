"""The translation pipeline (`pipeline("translation")`, restored by `import hf_relpos`): long texts are translated in
full, sentence by sentence; empty text gives empty text; the old TranslationPipeline keyword arguments."""

from __future__ import annotations

import logging

import pytest
from conftest import MEMORISED_PAIRS
from transformers import pipeline

import hf_relpos
from hf_relpos.publish.pipeline_relpos import join_translations, split_into_sentences

SOURCES = [source for source, _ in MEMORISED_PAIRS]
TARGETS = [target for _, target in MEMORISED_PAIRS]


@pytest.fixture(scope="module")
def translator(memorised_model_folder):
    return pipeline("translation", model=str(memorised_model_folder), device="cpu")


def test_a_long_text_is_translated_in_full(translator):
    """Six sentences in one text (a model trained on single sentences stops after about one): every sentence is
    translated, joined by one space (a line break stays a line break)."""
    text = " ".join(SOURCES[:3]) + "\n" + " ".join(SOURCES[3:])
    assert translator(text) == [{"translation_text": " ".join(TARGETS[:3]) + "\n" + " ".join(TARGETS[3:])}]
    assert translator([text, SOURCES[0]], batch_size=4) == [
        {"translation_text": " ".join(TARGETS[:3]) + "\n" + " ".join(TARGETS[3:])}, {"translation_text": TARGETS[0]}]


def test_whitespace_at_a_text_s_ends_is_not_translated_and_its_line_breaks_are_kept(translator):
    """The model gets no whitespace before a text's first sentence (the tokenizer makes tokens of it, which changed
    the translation); the line breaks there are kept, as those at the end are."""
    assert translator(f"  {SOURCES[3]}") == [{"translation_text": TARGETS[3]}]
    assert translator(f"\n\n {SOURCES[3]} \n") == [{"translation_text": f"\n\n{TARGETS[3]}\n"}]


@pytest.mark.parametrize("text", ["", "   ", "\n"])
def test_empty_text_translates_to_empty_text(translator, text):
    assert translator(text) == [{"translation_text": ""}]
    assert translator([text, SOURCES[1]]) == [{"translation_text": ""}, {"translation_text": TARGETS[1]}]


@pytest.mark.parametrize("batch_size", [None, 2])
def test_an_empty_list_translates_to_an_empty_list_its_settings_checked(translator, memorised_model_folder,
                                                                        batch_size):
    """A list in gives a list out, also an empty one (transformers' Pipeline read its first item: IndexError); the
    call's settings are checked as for any list; so with `pipeline_class` given."""
    explicit = pipeline("translation", model=str(memorised_model_folder), device="cpu",
                        pipeline_class=hf_relpos.TranslationPipeline)
    for pipe in (translator, explicit):
        assert pipe([], batch_size=batch_size) == []
        with pytest.raises(ValueError, match="src_lang"):
            pipe([], src_lang="en")


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("text", ["", "   ", "\n"])
def test_a_blank_text_is_not_generated_so_settings_it_cannot_meet_stop_nothing(translator, text, batch_size):
    """A blank text translates to "" without being generated (as in hf-relpos-translate): a minimum length above the
    source-relative cap of its one-token source (max_len_a x 1 + max_len_b) stops neither it nor the texts batched
    with it."""
    settings = dict(min_new_tokens=3, max_len_a=1.0, max_len_b=1)
    expected = translator(SOURCES[1], **settings)
    assert expected[0]["translation_text"]
    assert translator([text, SOURCES[1], text], batch_size=batch_size, **settings) == [
        {"translation_text": ""}, *expected, {"translation_text": ""}]


def test_one_piece_when_asked_and_a_cut_translation_is_reported_once_naming_the_cap_that_cut_it(translator, caplog):
    """A folder saved without a source-relative cap: a translation cut by max_new_tokens is reported once as such; cut
    by a source-relative cap passed to the call, once as that."""
    assert translator(SOURCES[2], split_sentences=False) == [{"translation_text": TARGETS[2]}]
    assert getattr(translator.model.generation_config, "max_len_b", None) is None
    logging.Logger.warning_once.cache_clear()  # transformers' once-per-process memory
    with caplog.at_level(logging.WARNING):
        cut = translator(SOURCES[1], max_new_tokens=2)[0]["translation_text"]
        translator(SOURCES[2], max_new_tokens=2)
        translator(SOURCES[0])
        translator(SOURCES[1], max_len_a=0.0, max_len_b=2)
        translator(SOURCES[2], max_len_a=0.0, max_len_b=2)
    assert TARGETS[1].startswith(cut) and cut != TARGETS[1]
    warnings = [record.getMessage() for record in caplog.records if "reached the maximum length" in record.getMessage()]
    assert warnings == [
        "A translation reached the maximum length (max_new_tokens, else max_length) and may be cut: pass a larger "
        "max_new_tokens to the pipeline call, or max_len_a and max_len_b for a cap relative to each source.",
        "A translation reached the maximum length (max_len_a x source tokens + max_len_b, at most max_new_tokens) and "
        "may be cut: pass a larger max_len_b or max_new_tokens to the pipeline call (a translation that repeats "
        "itself up to the cap is the model's loop, not a short cap: no_repeat_ngram_size=N ends such loops)."]


def test_a_translation_cut_by_a_forced_end_token_at_the_maximum_length_is_reported(translator, caplog):
    """`forced_eos_token_id` (MarianMT's generation configs set it) ends a translation cut at max_new_tokens with the
    end token: it is reported as cut all the same (it was taken for a finished one), and one that ends before is not."""
    end = translator.model.generation_config.eos_token_id
    logging.Logger.warning_once.cache_clear()  # transformers' once-per-process memory
    with caplog.at_level(logging.WARNING):
        assert translator(SOURCES[1], max_new_tokens=20, forced_eos_token_id=end) == [{"translation_text": TARGETS[1]}]
        assert not [record for record in caplog.records if "reached the maximum length" in record.getMessage()]
        cut = translator(SOURCES[1], max_new_tokens=2, forced_eos_token_id=end)[0]["translation_text"]
    assert TARGETS[1].startswith(cut) and cut != TARGETS[1]
    warnings = [record.getMessage() for record in caplog.records if "reached the maximum length" in record.getMessage()]
    assert warnings == [
        "A translation reached the maximum length (max_new_tokens, else max_length) and may be cut: pass a larger "
        "max_new_tokens to the pipeline call, or max_len_a and max_len_b for a cap relative to each source."]


def test_old_translation_pipeline_arguments(translator):
    assert translator(SOURCES[3], truncation=True) == [{"translation_text": TARGETS[3]}]
    assert translator(SOURCES[3], clean_up_tokenization_spaces=True) == [{"translation_text": TARGETS[3]}]
    with pytest.raises(ValueError, match=r"src_lang/tgt_lang choose the languages of a multilingual model"):
        translator(SOURCES[3], src_lang="en", tgt_lang="de")
    with pytest.raises(ValueError, match=r"tgt_lang choose the languages"):
        translator(SOURCES[3], tgt_lang="de")
    with pytest.raises(ValueError, match=r"return_tensors / return_text=False: this pipeline returns text only"):
        translator(SOURCES[3], return_tensors=True)


def test_ranked_translations_of_a_text_of_several_sentences_are_refused_not_joined_rank_by_rank(translator):
    """num_return_sequences > 1 under beam search ranks one input's translations; a text split into sentences has no
    such ranking (joining each sentence's n-th translation is not the text's n-th best), so it is one ValueError
    naming split_sentences=False, as hf-relpos-translate --n_best needs --no_split_sentences. One sentence, one piece
    and sampled translations (independent samples of each sentence joined are a sample of the text) are served."""
    text = f"{SOURCES[0]} {SOURCES[1]}"
    with pytest.raises(ValueError, match=r"^num_return_sequences=2 ranks the beam-search translations of one input; "
                                         r"this text splits into 2 sentences, .* pass split_sentences=False"):
        translator(text, num_beams=2, num_return_sequences=2)
    with pytest.raises(ValueError, match=r"num_return_sequences=2 ranks"):
        translator([SOURCES[2], text], num_beams=2, num_return_sequences=2)
    assert len(translator(text, num_beams=2, num_return_sequences=2, split_sentences=False)) == 2
    assert translator(SOURCES[0], num_beams=2, num_return_sequences=2)[0] == {"translation_text": TARGETS[0]}
    assert len(translator(text, do_sample=True, num_return_sequences=2)) == 2


def test_transformers_4_task_names_with_a_language_pair_are_the_translation_task(memorised_model_folder, translator):
    """`pipeline("translation_en_to_de", ...)`, transformers 4's name of the task (its translation guide uses it), serves
    the translation pipeline as "translation" does, sentence splitting and all; other names stay unknown tasks."""
    by_pair = pipeline("translation_en_to_de", model=str(memorised_model_folder), device="cpu")
    assert type(by_pair) is type(translator)
    text = " ".join(SOURCES[:3])
    assert by_pair([text, SOURCES[3]]) == translator([text, SOURCES[3]]) == [
        {"translation_text": " ".join(TARGETS[:3])}, {"translation_text": TARGETS[3]}]
    for name in ("translation_en_de", "translation_en_to_", "translation_en_to_de_at"):
        with pytest.raises(KeyError, match=f"Unknown task {name},"):
            pipeline(name, model=str(memorised_model_folder), device="cpu")


@pytest.mark.parametrize(
    ("text", "pieces"),
    [
        ("A b. C d! E? F", [("A b.", " "), ("C d!", " "), ("E?", " "), ("F", "")]),
        ("He said: \"Go.\" Then left.", [("He said: \"Go.\"", " "), ("Then left.", "")]),
        ("Take e.g. the bus. Or walk.", [("Take e.g. the bus.", " "), ("Or walk.", "")]),
        ("one line\n\ntwo", [("one line", "\n\n"), ("two", "")]),
        # whitespace opening the text is no part of its first sentence; a blank text is one piece
        ("  lead. Next", [("", "  "), ("lead.", " "), ("Next", "")]),
        ("\n\tlead.  ", [("", "\n\t"), ("lead.", "  "), ("", "")]),
        ("No end  ", [("No end", "  "), ("", "")]),
        ("Das ist gut usw. \t", [("Das ist gut usw.", " \t"), ("", "")]),
        ("", [("", "")]),
        (" \t ", [(" \t ", "")]),
        ("Dr. Smith met Mr. Brown. They left.", [("Dr. Smith met Mr. Brown.", " "), ("They left.", "")]),
        ("See No. 5 and J. R. Tolkien in the U.S. Army. Then go.",
         [("See No. 5 and J. R. Tolkien in the U.S. Army.", " "), ("Then go.", "")]),
        ("It costs 3.50 euros. In 1990. Then.", [("It costs 3.50 euros.", " "), ("In 1990.", " "), ("Then.", "")]),
        ("1. Take the bus. 2. Walk home.", [("1. Take the bus.", " "), ("2. Walk home.", "")]),
        # a number's period ends a sentence as a word's does; a list or section number opening one holds it
        ("It rose to 3.5. Then it fell to 1.000. We met at 10.30. It cost $4.99. 2.1. Overview of it. Version 2.0. Ok.",
         [("It rose to 3.5.", " "), ("Then it fell to 1.000.", " "), ("We met at 10.30.", " "), ("It cost $4.99.", " "),
          ("2.1. Overview of it.", " "), ("Version 2.0.", " "), ("Ok.", "")]),
        # an address's periods are its own: the period after it ends a sentence
        ("Write to info@example.com. We answer. See https://example.org/a.html. Or www.example.de. Then (mail@x.de.) Go.",
         [("Write to info@example.com.", " "), ("We answer.", " "), ("See https://example.org/a.html.", " "),
          ("Or www.example.de.", " "), ("Then (mail@x.de.)", " "), ("Go.", "")]),
        # a bare host name too; a dotted shorthand is none ("M.Sc", "Ph.D", "Dr.med" hold their period)
        ("Visit example.com. We open. See bbc.co.uk. It is news.org. Then an M.Sc. Student and a Ph.D. Thesis by Dr.med. Kurz.",
         [("Visit example.com.", " "), ("We open.", " "), ("See bbc.co.uk.", " "), ("It is news.org.", " "),
          ("Then an M.Sc. Student and a Ph.D. Thesis by Dr.med. Kurz.", "")]),
        ("He asked: \"Why?\" She said (loudly): \"No!\" \"Go.\"",
         [("He asked: \"Why?\"", " "), ("She said (loudly): \"No!\"", " "), ("\"Go.\"", "")]),
        ("\"Stop!\" he said. Wait... what? Ok.", [("\"Stop!\" he said.", " "), ("Wait... what?", " "), ("Ok.", "")]),
        ("Ein Mann, z. B. ein Koch, kocht. Eine Frau liest.", [("Ein Mann, z. B. ein Koch, kocht.", " "),
                                                               ("Eine Frau liest.", "")]),
        ("他看见狗。她打开门！孩子喜欢猫？", [("他看见狗。", ""), ("她打开门！", ""), ("孩子喜欢猫？", "")]),
        # a closing quote or bracket right after 。！？ goes on: a quoted sentence inside the next one
        ("他说：「好。」她笑了。 然后呢？！走吧", [("他说：「好。」她笑了。", " "), ("然后呢？！", ""), ("走吧", "")]),
        ("「はい。」と彼は言った。次です。", [("「はい。」と彼は言った。", ""), ("次です。", "")]),
        ("ﾊｲ｡ｲｲｴ｡", [("ﾊｲ｡", ""), ("ｲｲｴ｡", "")]),   # the half-width 。
        ("“你去哪儿？”他问道。", [("“你去哪儿？”他问道。", "")]),
        ("彼は猫です。（本当に？）次です。", [("彼は猫です。", ""), ("（本当に？）次です。", "")]),
        ("「好。」 她笑了。", [("「好。」", " "), ("她笑了。", "")]),
        ("I waited... Then he came.", [("I waited...", " "), ("Then he came.", "")]),
        ("I waited… Then he came.", [("I waited…", " "), ("Then he came.", "")]),
        ("He said \"Wait...\" Then he left...", [("He said \"Wait...\"", " "), ("Then he left...", "")]),
        # no, art, ... hold a period only before a number: as words they end a sentence
        ("The answer is no. We left. No. 5 and Art. 3 stay.",
         [("The answer is no.", " "), ("We left.", " "), ("No. 5 and Art. 3 stay.", "")]),
        ("No. He loves art. She does not.", [("No.", " "), ("He loves art.", " "), ("She does not.", "")]),
        ("Ich traf Jan. Er lachte am 5. Jan. 2020. Dann Sept. 3 und Dec. Dann ging er.",
         [("Ich traf Jan.", " "), ("Er lachte am 5. Jan. 2020.", " "), ("Dann Sept. 3 und Dec.", " "),
          ("Dann ging er.", "")]),
        # German quotes close with “ ‘ « and open with „ ‚ »
        ("Er sagte: „Ja.“ Sie rief ‚Nein!‘ »Komm.« Dann ging er.",
         [("Er sagte: „Ja.“", " "), ("Sie rief ‚Nein!‘", " "), ("»Komm.«", " "), ("Dann ging er.", "")]),
        ("„Dr. Müller kam.“ Er ging.", [("„Dr. Müller kam.“", " "), ("Er ging.", "")]),
        # other scripts' sentence ends, followed by a space: Hindi's danda, Arabic's question mark, Urdu's full stop
        ("वह घर गया। वह सो गई॥ क्या?", [("वह घर गया।", " "), ("वह सो गई॥", " "), ("क्या?", "")]),
        ("هل أنت بخير؟ نعم.", [("هل أنت بخير؟", " "), ("نعم.", "")]),
        ("وہ گھر گیا۔ وہ سو گئی۔", [("وہ گھر گیا۔", " "), ("وہ سو گئی۔", "")]),
        ("Բարեւ։ Ինչպես ես։", [("Բարեւ։", " "), ("Ինչպես ես։", "")]),
        # a bidirectional mark after the end (RLM, as Arabic, Persian and Hebrew text often has it) still ends it
        ("مرحبا.\u200f كيف حالك؟\u200f أنا بخير.", [("مرحبا.\u200f", " "), ("كيف حالك؟\u200f", " "), ("أنا بخير.", "")]),
        ("שלום.\u200e\u2069 מה שלומך?", [("שלום.\u200e\u2069", " "), ("מה שלומך?", "")]),
        # a reference holds its period before a Roman numeral or a capital letter too, not before "A" or a lone "I"
        ("Vol. II is out. See Art. IV, Ch. V and Fig. B now. No. I won't. The answer is no. A man came.",
         [("Vol. II is out.", " "), ("See Art. IV, Ch. V and Fig. B now.", " "), ("No.", " "), ("I won't.", " "),
          ("The answer is no.", " "), ("A man came.", "")]),
        # a number before a month's name is a German date's day only after a word that opens a date
        ("The temperature rose to 30. August was hot. Sie lag auf Platz 3. Juli wurde Zweite. Bis zum 5. Okt. 2020 "
         "war es warm.", [("The temperature rose to 30.", " "), ("August was hot.", " "), ("Sie lag auf Platz 3.", " "),
                          ("Juli wurde Zweite.", " "), ("Bis zum 5. Okt. 2020 war es warm.", "")]),
        # a German date's day is an ordinal number with a period
        ("Er kam am 3. Oktober. Am 24. Dezember ging er. Er zählte bis 3. Dann ging er.",
         [("Er kam am 3. Oktober.", " "), ("Am 24. Dezember ging er.", " "), ("Er zählte bis 3.", " "),
          ("Dann ging er.", "")]),
        # a German ordinal number after an article (or a preposition joined with one) and before a noun
        ("Das war im 19. Jahrhundert. Der 2. Weltkrieg endete. Zum 3. Mal kam er des 20. „Tatort“ wegen. Er ist 3. Dann.",
         [("Das war im 19. Jahrhundert.", " "), ("Der 2. Weltkrieg endete.", " "),
          ("Zum 3. Mal kam er des 20. „Tatort“ wegen.", " "), ("Er ist 3.", " "), ("Dann.", "")]),
        # the last day of a month is a day too; a sentence opening with a day has no word before it
        ("Er kam am 31. Dezember. Am 1. Januar ging er. 3. Oktober war ein Montag.",
         [("Er kam am 31. Dezember.", " "), ("Am 1. Januar ging er.", " "), ("3. Oktober war ein Montag.", "")]),
        # titles, "u. U." (German "unter Umständen") and page references hold their period
        ("Mrs. Brown met Prof. Lee. Das geht u. U. schief. It is on pp. 4-7. Then stop. See p. 5. Then go.",
         [("Mrs. Brown met Prof. Lee.", " "), ("Das geht u. U. schief.", " "), ("It is on pp. 4-7.", " "),
          ("Then stop.", " "), ("See p. 5.", " "), ("Then go.", "")]),
    ],
)
def test_sentence_splitting_keeps_every_character(text, pieces):
    assert split_into_sentences(text) == pieces
    assert "".join(sentence + space for sentence, space in pieces) == text


@pytest.mark.parametrize(
    ("pieces", "joined"),
    [
        ([("He sees the dog.", ""), ("She opens the door!", ""), ("", "")], "He sees the dog. She opens the door!"),
        ([("他看见狗。", ""), ("她打开门！", ""), ("「好。」", ""), ("走吧", "")], "他看见狗。她打开门！「好。」走吧"),
        ([("Er sagte: »Gut.«", ""), ("Sie lacht.", "\n"), ("Dann.", "")], "Er sagte: »Gut.« Sie lacht.\nDann."),
        # a translation into a spaced script that ends in Han characters (a name) still gets its space
        ([("I met 田中", ""), ("He left.", "")], "I met 田中 He left."),
        ([("I met Tanaka (田中)", ""), ("「He left.」", "")], "I met Tanaka (田中) 「He left.」"),
        # Chinese or Japanese translations meet without a space whatever separated their sources
        ([("女人喜欢猫。", " "), ("男人喂狗。", "\u3000"), ("「好。」", "\t"), ("走吧", "")], "女人喜欢猫。男人喂狗。「好。」走吧"),
        ([("One.", "  "), ("Two.", "")], "One. Two."),
        # line breaks are kept ("\r\n" as "\n"), also at the end; other whitespace at the ends and empty
        # translations give nothing
        ([("One.", " \r\n"), ("Two.", "\n\n"), ("三。", "\n"), ("四。", "\n")], "One.\nTwo.\n\n三。\n四。\n"),
        ([("One.", " "), ("", "  "), ("Three.", " "), ("", "")], "One. Three."),
        # Chinese quotes “…” around a sentence: no space between it and the next Chinese one, on either side
        ([("他说：“好。”", " "), ("她笑了。", " "), ("“走吧。”", "")], "他说：“好。”她笑了。“走吧。”"),
    ],
)
def test_translations_of_sentences_are_joined_as_their_script_writes(pieces, joined):
    """Two translations are joined with one space, or none where both are in a script written without spaces
    (Chinese, Japanese), whatever whitespace separated their sources; line breaks are kept."""
    assert join_translations(pieces) == joined


@pytest.mark.parametrize("whitespace", ["\r", "\x0c", "\u2028", "\u2029", "\x85", "\t", "\x0b", "\x1c", "\xa0", " \r "])
def test_whitespace_between_sentences_becomes_one_space(whitespace):
    """A line break other than "\n" (or a tab) between two sentences of a line is no line break in their translation,
    so one line in gives one line out for every reader (`str.splitlines`, universal newlines)."""
    text = f"One dog.{whitespace}Two cats."
    pieces = split_into_sentences(text)
    assert [sentence for sentence, _ in pieces] == ["One dog.", "Two cats."]
    joined = join_translations([(sentence.replace("One", "Ein"), separator) for sentence, separator in pieces])
    assert joined == "Ein dog. Two cats." and joined.splitlines() == [joined]


def test_a_chinese_text_is_translated_sentence_by_sentence(translator):
    """A text of 。！-ended sentences without spaces is translated as its sentences are, one by one, joined by a space
    (the memorised model writes German)."""
    first, second = (translator(sentence)[0]["translation_text"] for sentence in ("他看见狗。", "她打开门！"))
    assert first and second
    assert translator("他看见狗。她打开门！") == [{"translation_text": f"{first} {second}"}]


def test_a_source_relative_cap_given_when_the_pipeline_is_made_holds_for_every_call(memorised_model_folder):
    """max_len_a / max_len_b are no GenerationConfig fields: given to `pipeline(...)`, they cap every call as given to
    the call (they were dropped by each call's own keyword arguments)."""
    capped = pipeline("translation", model=str(memorised_model_folder), device="cpu", max_len_a=0.0, max_len_b=2)
    cut = capped(SOURCES[1])[0]["translation_text"]
    assert cut != TARGETS[1] and TARGETS[1].startswith(cut)
    assert capped(SOURCES[1], num_beams=1) == capped(SOURCES[1], max_len_a=0.0, max_len_b=2, num_beams=1)
    assert capped(SOURCES[1], max_len_b=None) == [{"translation_text": TARGETS[1]}]


def test_batched_sources_reach_generate_right_padded_whatever_the_tokenizers_side(tmp_path):
    """transformers' pipeline batches pad on the tokenizer's side; a tokenizer set to pad on the left (the habit of
    batched decoder-only generation) shifted a short source's tokens, so `absolute` (sinusoids read from a token's
    index) translated it differently beside longer ones. generate now gets each source's tokens first, as alone."""
    import torch

    from hf_relpos.testing import tiny_float64_model
    from hf_relpos.translation.tokenization import special_token_ids, train_joint_tokenizer

    tokenizer = train_joint_tokenizer([text for pair in MEMORISED_PAIRS * 4 for text in pair], vocab_size=300)
    tokenizer.padding_side = "left"
    model = tiny_float64_model("absolute", dict(vocab_size=len(tokenizer), **special_token_ids(tokenizer)),
                               kernel="sdpa")
    model.generation_config.max_length = 8
    translate = pipeline("translation", model=model, tokenizer=tokenizer, device="cpu")
    sources = ["The house is red and the small bird sings in the big tree", *SOURCES[:3]]
    seen = []
    generate = model.generate

    def recording(**inputs):
        seen.append((inputs["input_ids"], inputs["attention_mask"]))
        return generate(**inputs)

    model.generate = recording
    batched = translate(sources, batch_size=4, split_sentences=False)
    (input_ids, attention_mask), = seen
    for row, source in zip(range(len(sources)), sources, strict=True):
        ids = tokenizer(source)["input_ids"]
        assert attention_mask[row].tolist() == [1] * len(ids) + [0] * (attention_mask.size(1) - len(ids))
        assert input_ids[row, :len(ids)].tolist() == ids
    assert batched == [translate(source, split_sentences=False)[0] for source in sources]
    assert torch.equal(attention_mask.sum(-1), torch.tensor([len(tokenizer(source)["input_ids"]) for source in sources]))


def test_a_text_opening_with_a_language_tag_has_it_in_front_of_each_sentence(memorised_model_folder):
    """The pipeline translates a text sentence by sentence: every sentence of ">>deu<< A. B." starts with the tag's
    id, as the first does."""
    translator = pipeline("translation", model=str(memorised_model_folder), device="cpu")
    translator.tokenizer.add_special_tokens({"additional_special_tokens": [">>deu<<"]})
    tag = translator.tokenizer.convert_tokens_to_ids(">>deu<<")
    text = f">>deu<< {MEMORISED_PAIRS[0][0]} {MEMORISED_PAIRS[1][0]}"
    inputs = list(translator.preprocess(text))
    assert len(inputs) == 2 and [int(encoded["input_ids"][0, 0]) for encoded in inputs] == [tag, tag]


def test_tgt_lang_given_to_a_model_with_language_tags_says_to_write_the_tag(memorised_model_folder):
    """src_lang / tgt_lang cannot be honoured; for a model whose tokenizer has language tags, the error says to write
    the tag in front of the text instead of calling the model one of a fixed language pair."""
    translator = pipeline("translation", model=str(memorised_model_folder), device="cpu")
    translator.tokenizer.add_special_tokens({"additional_special_tokens": [">>deu<<", ">>fra<<"]})
    with pytest.raises(ValueError, match=r"language tags \(>>deu<<, >>fra<<\): write the target language's tag"):
        translator(MEMORISED_PAIRS[0][0], tgt_lang="de")
