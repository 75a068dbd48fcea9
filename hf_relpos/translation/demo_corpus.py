"""A generated English -> German-like parallel corpus for the embedded demo (no download needed).

The grammar is small but makes word order matter: German-like main clauses put the finite verb second (V2, so a
fronted adverbial inverts subject and verb), subordinate clauses put it last, modal verbs send the infinitive to the
end, separable verbs leave their particle at the end of a main clause, and articles and adjectives agree in gender and
case (nominative subject, accusative object). Vocabulary has umlauts and ß. Every English sentence has exactly one
translation, and the corpus is a pure function of the seed.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from ..publish.files import write_text_atomic

SOURCE_LANG = "en"
TARGET_LANG = "de"


@dataclass(frozen=True)
class Noun:
    english: str
    german: str
    gender: str  # "m", "f" or "n"


@dataclass(frozen=True)
class Verb:
    english_third_person: str
    english_base: str
    german_third_person: str
    german_infinitive: str
    particle: str = ""  # separable prefix of a German particle verb ("auf" in "macht ... auf")


NOUNS = (
    Noun("man", "Mann", "m"), Noun("woman", "Frau", "f"), Noun("child", "Kind", "n"), Noun("dog", "Hund", "m"),
    Noun("cat", "Katze", "f"), Noun("bird", "Vogel", "m"), Noun("girl", "Mädchen", "n"), Noun("teacher", "Lehrerin", "f"),
    Noun("baker", "Bäcker", "m"), Noun("king", "König", "m"), Noun("student", "Schüler", "m"), Noun("door", "Tür", "f"),
    Noun("key", "Schlüssel", "m"), Noun("book", "Buch", "n"), Noun("window", "Fenster", "n"), Noun("box", "Kiste", "f"),
    Noun("bridge", "Brücke", "f"), Noun("cake", "Kuchen", "m"), Noun("letter", "Brief", "m"), Noun("gate", "Tor", "n"),
)
VERBS = (
    Verb("sees", "see", "sieht", "sehen"),
    Verb("finds", "find", "findet", "finden"),
    Verb("likes", "like", "mag", "mögen"),
    Verb("carries", "carry", "trägt", "tragen"),
    Verb("greets", "greet", "grüßt", "grüßen"),
    Verb("paints", "paint", "malt", "malen"),
    Verb("opens", "open", "macht", "machen", particle="auf"),
    Verb("closes", "close", "macht", "machen", particle="zu"),
    Verb("picks up", "pick up", "hebt", "heben", particle="auf"),
    Verb("calls", "call", "ruft", "rufen", particle="an"),
    Verb("brings back", "bring back", "bringt", "bringen", particle="zurück"),
)
ADJECTIVES = (
    ("big", "groß"), ("small", "klein"), ("old", "alt"), ("green", "grün"), ("tired", "müde"), ("sweet", "süß"),
    ("beautiful", "schön"), ("happy", "fröhlich"),
)
ADVERBIALS = (
    ("today", "heute"), ("tomorrow", "morgen"), ("often", "oft"), ("later", "später"), ("unfortunately", "leider"),
    ("in the morning", "am Morgen"),
)
MODALS = (("can", "kann"), ("must", "muss"), ("wants to", "will"))
CONJUNCTIONS = (("because", "weil"), ("although", "obwohl"), ("while", "während"), ("when", "wenn"))

DEFINITE_ARTICLES = {("nom", "m"): "der", ("nom", "f"): "die", ("nom", "n"): "das",
                     ("acc", "m"): "den", ("acc", "f"): "die", ("acc", "n"): "das"}
INDEFINITE_ARTICLES = {("nom", "m"): "ein", ("nom", "f"): "eine", ("nom", "n"): "ein",
                       ("acc", "m"): "einen", ("acc", "f"): "eine", ("acc", "n"): "ein"}
WEAK_ENDINGS = {("nom", "m"): "e", ("nom", "f"): "e", ("nom", "n"): "e", ("acc", "m"): "en", ("acc", "f"): "e",
                ("acc", "n"): "e"}
STRONG_ENDINGS = {("nom", "m"): "er", ("nom", "f"): "e", ("nom", "n"): "es", ("acc", "m"): "en", ("acc", "f"): "e",
                  ("acc", "n"): "es"}


@dataclass(frozen=True)
class Clause:
    """The parts of one clause in both languages; German word order is decided when the clause is rendered."""

    english_subject: str
    english_object: str
    german_subject: str
    german_object: str
    verb: Verb
    modal: tuple[str, str] | None


def _noun_phrase(rng: random.Random, case: str) -> tuple[str, str]:
    noun = rng.choice(NOUNS)
    definite = rng.random() < 0.6
    adjective = rng.choice(ADJECTIVES) if rng.random() < 0.4 else None
    key = (case, noun.gender)
    german_article = (DEFINITE_ARTICLES if definite else INDEFINITE_ARTICLES)[key]
    english_article = "the" if definite else ("an" if (adjective[0] if adjective else noun.english)[0] in "aeiou" else "a")
    if adjective is None:
        return f"{english_article} {noun.english}", f"{german_article} {noun.german}"
    ending = (WEAK_ENDINGS if definite else STRONG_ENDINGS)[key]
    stem = adjective[1].removesuffix("e")  # müde + e -> müde, müde + en -> müden
    return f"{english_article} {adjective[0]} {noun.english}", f"{german_article} {stem}{ending} {noun.german}"


def _random_clause(rng: random.Random) -> Clause:
    english_subject, german_subject = _noun_phrase(rng, "nom")
    english_object, german_object = _noun_phrase(rng, "acc")
    modal = rng.choice(MODALS) if rng.random() < 0.3 else None
    return Clause(english_subject, english_object, german_subject, german_object, rng.choice(VERBS), modal)


def _english_clause(clause: Clause) -> str:
    if clause.modal is None:
        verb_phrase = clause.verb.english_third_person
    else:
        verb_phrase = f"{clause.modal[0]} {clause.verb.english_base}"
    words = verb_phrase.split()
    if len(words) > 1 and words[-1] in ("up", "back") and clause.modal is None:
        return f"{clause.english_subject} {words[0]} {clause.english_object} {words[1]}"
    return f"{clause.english_subject} {verb_phrase} {clause.english_object}"


def _german_main_clause(clause: Clause, fronted: str | None) -> str:
    """V2: the finite verb is the second constituent; the infinitive or the particle closes the clause."""
    if clause.modal is None:
        finite, clause_end = clause.verb.german_third_person, clause.verb.particle
    else:
        finite, clause_end = clause.modal[1], clause.verb.particle + clause.verb.german_infinitive
    if fronted is None:
        words = [clause.german_subject, finite, clause.german_object, clause_end]
    else:
        words = [fronted, finite, clause.german_subject, clause.german_object, clause_end]
    return " ".join(word for word in words if word)


def _german_subordinate_clause(clause: Clause) -> str:
    """Verb-final: particle and verb join ("aufmacht"); a modal follows the infinitive ("aufmachen kann")."""
    if clause.modal is None:
        verb_group = clause.verb.particle + clause.verb.german_third_person
    else:
        verb_group = f"{clause.verb.particle}{clause.verb.german_infinitive} {clause.modal[1]}"
    return f"{clause.german_subject} {clause.german_object} {verb_group}"


def _capitalize(text: str) -> str:
    return text[0].upper() + text[1:]


def random_sentence_pair(rng: random.Random) -> tuple[str, str]:
    """One (English, German-like) pair: a main clause, maybe fronted adverbial, maybe a subordinate clause."""
    main = _random_clause(rng)
    fronted_draw = rng.random()
    if fronted_draw < 0.3:
        english_fronted, german_fronted = rng.choice(ADVERBIALS)
    elif fronted_draw < 0.4:
        hour = rng.randint(1, 12)
        english_fronted, german_fronted = f"at {hour} o'clock", f"um {hour} Uhr"
    else:
        english_fronted = german_fronted = None
    english = _english_clause(main)
    german = _german_main_clause(main, german_fronted)
    if english_fronted is not None:
        english = f"{english_fronted} {english}"
    if rng.random() < 0.5:
        subordinate = _random_clause(rng)
        english_conjunction, german_conjunction = rng.choice(CONJUNCTIONS)
        english += f", {english_conjunction} {_english_clause(subordinate)}"
        german += f", {german_conjunction} {_german_subordinate_clause(subordinate)}"
    return _capitalize(english) + ".", _capitalize(german) + "."


def generate_demo_splits(
    num_train: int, num_validation: int, num_test: int, seed: int
) -> dict[str, list[tuple[str, str]]]:
    """Distinct sentence pairs for each split (no English sentence appears in two splits), deterministic in `seed`."""
    rng = random.Random(seed)
    wanted = num_train + num_validation + num_test
    seen: set[str] = set()
    pairs: list[tuple[str, str]] = []
    attempts = 0
    while len(pairs) < wanted:
        attempts += 1
        if attempts > 20 * wanted + 1000:
            raise ValueError(f"the demo grammar cannot produce {wanted} distinct sentence pairs")
        english, german = random_sentence_pair(rng)
        if english not in seen:
            seen.add(english)
            pairs.append((english, german))
    return {
        "train": pairs[:num_train],
        "validation": pairs[num_train : num_train + num_validation],
        "test": pairs[num_train + num_validation :],
    }


def write_demo_corpus(
    directory: str | os.PathLike, num_train: int, num_validation: int, num_test: int, seed: int
) -> dict[str, Path]:
    """Write `{train,validation,test}.jsonl` in the WMT schema (`{"translation": {"en": ..., "de": ...}}`).

    Each file is written atomically (`write_text_atomic`: several processes may write the same corpus at once), so an
    interrupted run never leaves half a file and a failed write leaves no temporary file.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, pairs in generate_demo_splits(num_train, num_validation, num_test, seed).items():
        path = directory / f"{split}.jsonl"
        records = ({"translation": {SOURCE_LANG: english, TARGET_LANG: german}} for english, german in pairs)
        write_text_atomic(path, "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records))
        paths[split] = path
    return paths
