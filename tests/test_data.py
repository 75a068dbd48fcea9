"""Loading parallel text: file formats and schemas, clear schema errors, length filtering, order restoration, and the
generated demo corpus."""

import bz2
import errno
import gzip
import io
import json
import logging
import lzma
import random
import re
import sys

import datasets.table
import numpy as np
import pytest
from datasets import Dataset, DatasetDict, Features, Translation, Value

import hf_relpos.translation.data as data_module
from hf_relpos.translation.data import (
    DataArguments,
    DatasetSchemaError,
    example_lengths,
    load_parallel_splits,
    read_local_pairs,
    restore_order,
    select_rows,
    sort_by_source_length,
    text_file_line_chunks,
    text_line_chunks,
    tokenize_evaluation_pairs,
    tokenize_training_pairs,
    with_concatenated_pairs,
)
from hf_relpos.translation.demo_corpus import generate_demo_splits, random_sentence_pair, write_demo_corpus
from hf_relpos.translation.tokenization import train_joint_tokenizer

PAIRS = [("A small cat.", "Eine kleine Katze."), ("Good morning!", "Guten Morgen!"), ("Two dogs.", "Zwei Hunde.")]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records), encoding="utf-8")
    return path


@pytest.mark.parametrize("layout", ["wmt_jsonl", "flat_jsonl", "json_list", "json_data", "csv", "tsv"])
def test_every_file_format_and_schema_reads_the_same_pairs(tmp_path, layout):
    wmt = [{"translation": {"en": en, "de": de}} for en, de in PAIRS]
    flat = [{"en": en, "de": de, "id": i} for i, (en, de) in enumerate(PAIRS)]
    if layout == "wmt_jsonl":
        path = write_jsonl(tmp_path / "data.jsonl", wmt)
    elif layout == "flat_jsonl":
        path = write_jsonl(tmp_path / "data.jsonl", flat)
    elif layout == "json_list":
        path = tmp_path / "data.json"
        path.write_text(json.dumps(wmt), encoding="utf-8")
    elif layout == "json_data":
        path = tmp_path / "data.json"
        path.write_text(json.dumps({"data": flat}), encoding="utf-8")
    elif layout == "csv":
        path = tmp_path / "data.csv"
        rows = ["de,en"] + [f'"{de}","{en}"' for en, de in PAIRS]  # RFC 4180 quoting
        path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    else:
        path = tmp_path / "data.tsv"
        path.write_text("\n".join(["de\ten"] + [f"{de}\t{en}" for en, de in PAIRS]) + "\n", encoding="utf-8")
    dataset = read_local_pairs(path, "en", "de")
    assert list(zip(dataset["source"], dataset["target"], strict=True)) == PAIRS
    reverse = read_local_pairs(path, "de", "en")
    assert reverse["source"] == [de for _, de in PAIRS]
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())   # a byte order mark (Windows editors write one)
    with_mark = read_local_pairs(path, "en", "de")
    assert list(zip(with_mark["source"], with_mark["target"], strict=True)) == PAIRS


def test_missing_language_names_the_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [{"translation": {"en": "a", "de": "b"}},
                                                   {"translation": {"en": "c", "fr": "d"}}])
    with pytest.raises(DatasetSchemaError, match=r"train\.jsonl:2, field 'translation': no 'de' "
                                                 r"\(found \['en', 'fr'\]\)"):
        read_local_pairs(path, "en", "de")


def test_missing_column_in_csv_names_the_header_line_and_the_columns(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text("english,german\nhello,hallo\n", encoding="utf-8")
    with pytest.raises(DatasetSchemaError, match=r"train\.csv:1, header: no 'en' or 'de' \(found \['english', 'german'\]\); "
                                                 r"its first line names the columns: add a header line naming the "
                                                 r"languages, e\.g\. en,de \(set source_lang/target_lang\)$"):
        read_local_pairs(path, "en", "de")


@pytest.mark.parametrize(("name", "text", "found", "hint"), [
    ("train.csv", "en;de\r\nA cat.;Eine Katze.\r\n", "en;de", "semicolons, where a .csv file's are separated by commas: "
     "save it with commas (a spreadsheet's CSV uses semicolons in some locales)"),
    ("train.csv", "en\tde\nA cat.\tEine Katze.\n", "en\\tde", "tabs, where a .csv file's are separated by commas: "
     "save it with commas, or name it .tsv"),
    ("train.tsv", "en,de\nA cat.,Eine Katze.\n", "en,de", "commas, where a .tsv file's are separated by tabs: save it "
     "with tabs, or name it .csv"),
])
def test_a_header_of_one_field_split_by_another_separator_says_which(tmp_path, name, text, found, hint):
    """A header that names the languages with another separator than the format's (a spreadsheet's semicolon CSV)
    is refused saying so, not asking for a header line the file has."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8", newline="")
    with pytest.raises(DatasetSchemaError) as error:
        read_local_pairs(path, "en", "de")
    assert str(error.value) == (f"{path}:1, header: no 'en' or 'de' (found ['{found}']); its first line is one field "
                                f"whose columns are separated by {hint} (set source_lang/target_lang)")


def test_invalid_json_line_is_reported(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"en": "a", "de": "b"}\n{"en": "c", \n', encoding="utf-8")
    with pytest.raises(DatasetSchemaError, match=r"train\.jsonl:2: invalid JSON"):
        read_local_pairs(path, "en", "de")


def test_non_string_text_is_reported(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [{"en": "a", "de": 5}])
    with pytest.raises(DatasetSchemaError, match=r"train\.jsonl:1: 'de' must be a string, got int"):
        read_local_pairs(path, "en", "de")


@pytest.mark.parametrize("layout", ["jsonl", "json"])
def test_a_lone_surrogate_escape_is_one_error_naming_the_record(tmp_path, layout):
    """A JSON escape of half a surrogate pair (a text cut inside an emoji by a tool counting UTF-16 units) is no
    character: one error naming the record and language, not Arrow's UnicodeEncodeError."""
    records = '{"en": "a", "de": "b"}', '{"translation": {"en": "Hi \\ud83d", "de": "Hallo \\ud83d\\ude42"}}'
    if layout == "jsonl":
        path, location = tmp_path / "train.jsonl", r"train\.jsonl:2"
        path.write_text("\n".join(records) + "\n", encoding="utf-8")
    else:
        path, location = tmp_path / "train.json", r"train\.json: record 1"
        path.write_text(f"[{', '.join(records)}]", encoding="utf-8")
    with pytest.raises(DatasetSchemaError, match=rf"{location}: 'en' holds the escape \\ud83d at character 3, half of a "
                                                 "UTF-16 surrogate pair"):
        read_local_pairs(path, "en", "de")


@pytest.mark.parametrize("layout", ["jsonl", "json"])
@pytest.mark.parametrize("side", ["en", "de"])
def test_a_null_text_is_one_error_naming_the_record(tmp_path, layout, side):
    records = [{"translation": {"en": "a", "de": "b"}}, {"translation": {"en": "c", "de": "d", side: None}}]
    if layout == "jsonl":
        path, location = write_jsonl(tmp_path / "valid.jsonl", records), r"valid\.jsonl:2"
    else:
        path, location = tmp_path / "valid.json", r"valid\.json: record 1"
        path.write_text(json.dumps(records), encoding="utf-8")
    for source_only in (False, True):
        with pytest.raises(DatasetSchemaError, match=rf"^.*{location}: '{side}' must be a string, got null$"):
            read_local_pairs(path, "en", "de", allow_source_only=source_only and side == "en")


def test_a_test_file_whose_targets_are_all_null_is_source_only(tmp_path):
    path = write_jsonl(tmp_path / "test.jsonl", [{"en": "a", "de": None}, {"en": "b", "de": None}])
    dataset = read_local_pairs(path, "en", "de", allow_source_only=True)
    assert dataset["source"] == ["a", "b"] and dataset["target"] == [None, None]
    write_jsonl(path, [{"en": "a", "de": "x"}, {"en": "b", "de": None}])
    with pytest.raises(DatasetSchemaError, match=r"test\.jsonl:2, fields: no 'de', although .*test\.jsonl:1, fields "
                                                 r"has one"):
        read_local_pairs(path, "en", "de", allow_source_only=True)


@pytest.mark.parametrize(("row", "found"), [("hello", 1), ("hello,hallo,extra", 3), ('"a, b"', 1)])
def test_a_csv_row_with_another_number_of_fields_than_the_header_names_its_line(tmp_path, row, found):
    path = tmp_path / "valid.csv"
    path.write_text(f"en,de\nA cat.,Eine Katze.\n\n{row}\n", encoding="utf-8")
    with pytest.raises(DatasetSchemaError, match=rf"^.*valid\.csv:4: {found} field\(s\), but the header has 2 "
                                                 r"\(en, de\)$"):
        read_local_pairs(path, "en", "de")


def test_a_local_dataset_folder_with_the_default_config_name_says_to_set_it_null(tmp_path):
    """`dataset_name` naming a local folder of .jsonl files loads with dataset_config_name null; with the default
    (WMT14's de-en), the error says so."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    for split in ("train", "validation"):
        write_jsonl(folder / f"{split}.jsonl", [{"translation": {"en": en, "de": de}} for en, de in PAIRS])
    arguments = DataArguments(dataset_name=str(folder))
    with pytest.raises(DatasetSchemaError, match=r"BuilderConfig 'de-en' not found.*; a local folder of data files "
                                                 r"\(JSON, CSV, Parquet, save_to_disk\) has no configuration of that "
                                                 r"name: set dataset_config_name null"):
        load_parallel_splits(arguments, ("train",), tmp_path / "demo", cache_dir=str(tmp_path / "cache"))
    arguments = DataArguments(dataset_name=str(folder), dataset_config_name=None)
    loaded = load_parallel_splits(arguments, ("train", "validation"), tmp_path / "demo", cache_dir=str(tmp_path / "cache"))
    assert list(zip(loaded["validation"]["source"], loaded["validation"]["target"], strict=True)) == PAIRS


QUOTED_PAIRS = [('"Hello," she said.', '"Hallo", sagte sie.'), ("A cat.", "Eine Katze.")]


def test_a_local_dataset_folder_of_tab_separated_files_is_refused_as_datasets_would_drop_their_quotes(tmp_path):
    """`datasets` reads a folder's .tsv files as CSV with quoting ('"Hello," she said.' becomes 'Hello, she said.'),
    where a .tsv train_file keeps every quote: such a folder is one error naming its files and the fields that read
    them unquoted, before anything is loaded; with QUOTE_NONE set in its README.md configuration it loads as is."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    for split in ("train", "validation"):
        (folder / f"{split}.tsv").write_text("en\tde\n" + "".join(f"{en}\t{de}\n" for en, de in QUOTED_PAIRS),
                                             encoding="utf-8")
    arguments = DataArguments(dataset_name=str(folder), dataset_config_name=None)
    with pytest.raises(DatasetSchemaError, match=(
            rf"^dataset_name '{re.escape(str(folder))}': datasets reads its tab-separated files \(train\.tsv, "
            r"validation\.tsv\) as CSV, with quoting: .* give them as train_file / validation_file / test_file")):
        load_parallel_splits(arguments, ("train",), tmp_path / "demo", cache_dir=str(tmp_path / "cache"))
    loaded = read_local_pairs(folder / "train.tsv", "en", "de")
    assert list(zip(loaded["source"], loaded["target"], strict=True)) == QUOTED_PAIRS
    (folder / "README.md").write_text("---\nconfigs:\n- config_name: default\n  sep: \"\\t\"\n  quoting: 3\n  data_files:\n"
                                      "  - split: train\n    path: train.tsv\n---\n", encoding="utf-8")
    loaded = load_parallel_splits(arguments, ("train",), tmp_path / "demo", cache_dir=str(tmp_path / "cache"))["train"]
    assert list(zip(loaded["source"], loaded["target"], strict=True)) == QUOTED_PAIRS


@pytest.mark.parametrize("config_name", [None, "de-en"])
def test_a_local_dataset_folder_of_plain_text_pairs_is_one_error_naming_their_prefixes(tmp_path, config_name):
    """`dataset_name` naming a folder in the fairseq layout (train.en + train.de, ...), which `datasets` cannot read:
    the error names the prefixes to give as train_file / validation_file / test_file, whatever dataset_config_name."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    for prefix in ("train", "valid"):
        for index, lang in enumerate(("en", "de")):
            (folder / f"{prefix}.{lang}").write_text("".join(pair[index] + "\n" for pair in PAIRS), encoding="utf-8")
    write_compressed(folder / "test.en.gz", "A line.\n")   # source-only: no pair
    arguments = DataArguments(dataset_name=str(folder), dataset_config_name=config_name)
    with pytest.raises(DatasetSchemaError, match=(
            rf"could not be loaded: .*; its plain-text pairs are read by prefix, not as dataset_name: give "
            rf"{re.escape(str(folder / 'train'))}, {re.escape(str(folder / 'valid'))} as train_file / validation_file "
            r"/ test_file \(each PREFIX\.en \+ PREFIX\.de\)$")):
        load_parallel_splits(arguments, ("train",), tmp_path / "demo", cache_dir=str(tmp_path / "cache"))


# Pairs across several record batches (RECORDS_PER_CHUNK 4 below) and Parquet row groups (3 rows), with the texts a
# reader could trip on (empty, blank, "\r", U+2028, non-ASCII).
COLUMNAR_PAIRS = [*PAIRS, ("", "Leer."), ("Mid\rline", "Zeile\u2028mit Trenner"), ("Ünïcödé – “quotes”", "Straße 😀"),
                  ("   ", "Nur Leerzeichen."), ("short", "kurz")] * 2


def write_columnar(path, table, row_group_size=3):
    """`table` written as `path` says: .parquet (row groups of `row_group_size` rows), .arrow (an Arrow IPC stream,
    as `save_to_disk` writes, in batches of 5 rows), or .feather.arrow (an Arrow IPC file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.suffix == ".parquet":
        pq.write_table(table, path, row_group_size=row_group_size)
        return path
    new_writer = pa.ipc.new_file if path.name.endswith(".feather.arrow") else pa.ipc.new_stream
    with pa.OSFile(str(path), "wb") as sink, new_writer(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=5):
            writer.write_batch(batch)
    return path


def columnar_table(pairs, schema, source_lang="en", target_lang="de"):
    """The pairs as an Arrow table in the WMT schema (a 'translation' struct) or flat language columns beside an id
    column: large strings ("flat", as polars writes Parquet), string views ("string_view", polars' Arrow IPC) or
    dictionary-encoded strings ("dictionary", a pandas categorical)."""
    import pyarrow as pa

    if schema == "wmt":
        return pa.table({"translation": [{source_lang: source, target_lang: target} for source, target in pairs]})

    def column(texts):
        if schema == "dictionary":
            return pa.array(texts).dictionary_encode()
        return pa.array(texts, {"flat": pa.large_string(), "string_view": pa.string_view()}[schema])

    return pa.table({"id": list(range(len(pairs))), target_lang: column([t for _, t in pairs]),
                     source_lang: column([s for s, _ in pairs])})


@pytest.mark.parametrize("schema", ["wmt", "flat", "string_view", "dictionary"])
@pytest.mark.parametrize("name", ["train.parquet", "train.arrow", "train.feather.arrow"])
@pytest.mark.parametrize("on_disk", [False, True])
def test_a_parquet_or_arrow_file_reads_the_pairs_of_the_same_jsonl(tmp_path, monkeypatch, schema, name, on_disk):
    """A .parquet file (the Hub's format) or .arrow file (an IPC stream as save_to_disk writes, or an IPC file) in
    either schema, read across several record batches, gives exactly the `source`/`target` of the same pairs in a
    .jsonl file, taking each batch's Arrow columns (no record read one by one); the WMT-schema Parquet file gives
    the same pairs through its folder as dataset_name too."""
    monkeypatch.setattr(data_module, "RECORDS_PER_CHUNK", 4)
    workdir = tmp_path / "work" if on_disk else None
    (tmp_path / "corpus").mkdir()
    path = write_columnar(tmp_path / "corpus" / name, columnar_table(COLUMNAR_PAIRS, schema))
    jsonl = write_jsonl(tmp_path / "train.jsonl", [{"translation": {"en": en, "de": de}} for en, de in COLUMNAR_PAIRS])
    expected = read_local_pairs(jsonl, "en", "de")
    monkeypatch.setattr(data_module._RecordColumns, "add", lambda *args: pytest.fail("read record by record"))
    read = read_local_pairs(path, "en", "de", workdir=workdir)
    assert read.features == expected.features
    assert read.to_dict() == expected.to_dict() == {"source": [en for en, _ in COLUMNAR_PAIRS],
                                                    "target": [de for _, de in COLUMNAR_PAIRS]}
    assert read_local_pairs(path, "de", "en", workdir=workdir)["source"] == [de for _, de in COLUMNAR_PAIRS]
    if name == "train.parquet" and schema == "wmt":
        arguments = DataArguments(dataset_name=str(tmp_path / "corpus"), dataset_config_name=None)
        train = load_parallel_splits(arguments, ("train",), tmp_path / "demo", cache_dir=str(tmp_path / "cache"))
        assert train["train"].to_dict() == expected.to_dict()


@pytest.mark.parametrize("config_name", [None, "de-en"])
def test_the_parquet_shards_of_a_split_are_read_from_their_folder_as_dataset_name(tmp_path, config_name):
    """What docs/training.md says for a split in several Parquet files (the Hub's WMT14 train split): their folder as
    dataset_name (dataset_config_name null), or the folder above it with the configuration its README.md names, reads
    the shards as one split, in order (train_file names one file)."""
    import pyarrow.parquet as pq

    shards = tmp_path / "wmt14" / "de-en"
    shards.mkdir(parents=True)
    pq.write_table(columnar_table(PAIRS[:2], "wmt"), shards / "train-00000-of-00002.parquet")
    pq.write_table(columnar_table(PAIRS[2:], "wmt"), shards / "train-00001-of-00002.parquet")
    (tmp_path / "wmt14" / "README.md").write_text(
        "---\nconfigs:\n- config_name: de-en\n  data_files:\n  - split: train\n    path: de-en/train-*\n---\n",
        encoding="utf-8")
    folder = shards if config_name is None else tmp_path / "wmt14"
    arguments = DataArguments(dataset_name=str(folder), dataset_config_name=config_name)
    train = load_parallel_splits(arguments, ("train",), tmp_path / "demo", cache_dir=str(tmp_path / "cache"))["train"]
    assert list(zip(train["source"], train["target"], strict=True)) == PAIRS


@pytest.mark.parametrize("name", ["train.parquet", "train.arrow"])
@pytest.mark.parametrize(("schema", "value", "error"), [
    ("flat", None, "'de' must be a string, got null"),
    ("flat", 7, "'de' must be a string, got int"),
    ("wmt", None, "'de' must be a string, got null"),
    ("wmt", "no struct", "'translation' must be an object of language -> text"),
    ("dictionary", None, "'de' must be a string, got null"),
])
def test_an_error_in_a_parquet_or_arrow_file_names_the_file_and_row(tmp_path, monkeypatch, name, schema, value, error):
    """A null or non-string text, or a null 'translation', in row 6 (the second record batch) is one error naming the
    file and that row (counted from 1 across batches), as a .jsonl file's names the line; a dictionary-encoded
    column's null may sit in its dictionary (an index to a null value, which the column's null_count leaves out)."""
    import pyarrow as pa

    monkeypatch.setattr(data_module, "RECORDS_PER_CHUNK", 4)
    sources, targets = (list(side) for side in zip(*COLUMNAR_PAIRS[:8], strict=True))
    if schema == "dictionary":
        if name.endswith(".parquet"):
            pytest.skip("pyarrow does not write a dictionary holding a null to Parquet")
        indices = pa.array([*range(5), 8, 6, 7], pa.int32())   # row 6 points at the dictionary's null
        table = pa.table({"en": sources, "de": pa.DictionaryArray.from_arrays(indices, pa.array(targets + [value]))})
    elif schema == "flat" and isinstance(value, int):
        table = pa.table({"en": sources, "de": [value] * 8})
    elif schema == "flat":
        table = pa.table({"en": sources, "de": targets[:5] + [value] + targets[6:]})
    else:
        records = [{"en": en, "de": de} for en, de in zip(sources, targets, strict=True)]
        records[5] = None if value == "no struct" else {"en": sources[5], "de": value}
        table = pa.table({"translation": records})
    path = write_columnar(tmp_path / name, table)
    with pytest.raises(DatasetSchemaError) as raised:
        read_local_pairs(path, "en", "de")
    row = 1 if isinstance(value, int) else 6
    assert str(raised.value) == f"{path}: row {row}: {error}"


@pytest.mark.parametrize("name", ["train.parquet", "train.arrow"])
@pytest.mark.parametrize("schema", ["wmt", "flat"])
def test_a_parquet_or_arrow_file_without_a_language_names_the_file_row_and_languages_found(tmp_path, name, schema):
    path = write_columnar(tmp_path / name, columnar_table(PAIRS, schema, target_lang="fr"))
    with pytest.raises(DatasetSchemaError) as raised:
        read_local_pairs(path, "en", "de")
    found = "['en', 'fr']" if schema == "wmt" else "['en', 'fr', 'id']"
    where = "field 'translation'" if schema == "wmt" else "fields"
    assert str(raised.value) == (f"{path}: row 1, {where}: no 'de' (found {found}); expected 'translation': "
                                 "{'en': ..., 'de': ...} or flat columns 'en' and 'de' (set source_lang/target_lang)")


@pytest.mark.parametrize("name", ["test.parquet", "test.arrow"])
@pytest.mark.parametrize("schema", ["wmt", "flat"])
def test_a_source_only_parquet_or_arrow_test_file_is_read_with_null_targets(tmp_path, monkeypatch, name, schema):
    """A test file whose rows lack the target language (no such column or struct field, or nulls) is source-only, as
    a .jsonl one is; a row with a target after rows without is the error a .jsonl file gives, naming the rows; a
    training file without targets is the missing-language error."""
    import pyarrow as pa

    monkeypatch.setattr(data_module, "RECORDS_PER_CHUNK", 4)
    sources = [en for en, _ in COLUMNAR_PAIRS]
    table = (pa.table({"translation": [{"en": en} for en in sources]}) if schema == "wmt"
             else pa.table({"en": sources, "de": pa.nulls(len(sources), pa.string())}))
    path = write_columnar(tmp_path / name, table)
    read = read_local_pairs(path, "en", "de", allow_source_only=True)
    assert read.to_dict() == {"source": sources, "target": [None] * len(sources)}
    mixed = write_columnar(tmp_path / f"mixed{path.suffix}", pa.table({"en": sources, "de": [None] * 5 + ["Da."] * (len(sources) - 5)}))
    with pytest.raises(DatasetSchemaError) as raised:
        read_local_pairs(mixed, "en", "de", allow_source_only=True)
    assert str(raised.value) == (f"{mixed}: row 1, fields: no 'de', although {mixed}: row 6, fields has one; a test "
                                 "file is either parallel on every line or source-only")
    with pytest.raises(DatasetSchemaError, match=r": row 1, .*no 'de'|: row 1: 'de' must be a string, got null"):
        read_local_pairs(path, "en", "de")


@pytest.mark.parametrize("name", ["train.parquet", "train.arrow"])
def test_a_parquet_or_arrow_file_compressed_again_or_not_of_its_format_is_one_error_naming_it(tmp_path, name):
    path = write_columnar(tmp_path / name, columnar_table(PAIRS, "wmt"))
    packed = tmp_path / f"{name}.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    with pytest.raises(DatasetSchemaError) as raised:
        read_local_pairs(packed, "en", "de")
    assert str(raised.value) == (f"data file {str(packed)!r}: a {path.suffix} file is read as it is, not compressed "
                                 f"again with .gz: decompress it and give {path}")
    path.write_text('{"translation": {"en": "A", "de": "B"}}\n', encoding="utf-8")
    kind = "a Parquet file" if name.endswith(".parquet") else "an Arrow IPC stream or file"
    with pytest.raises(DatasetSchemaError, match=rf"^{re.escape(str(path))}: not {kind} \("):
        read_local_pairs(path, "en", "de")


def test_a_folder_given_as_a_data_file_is_one_error_saying_what_to_give_instead(tmp_path):
    """`--train_file data/` (a folder, not a file nor a prefix): the error says it is a folder, not that it does not
    exist, and names the prefixes of its plain-text pairs, else says to give one of its files or the folder as
    dataset_name; a prefix whose pair exists beside a folder of the same name is read."""
    folder = tmp_path / "data"
    folder.mkdir()
    write_plain(folder / "train", PAIRS)
    with pytest.raises(DatasetSchemaError) as error:
        read_local_pairs(folder, "en", "de")
    assert str(error.value) == (
        f"data file '{folder}' is a folder, and the plain-text pair it would name as a prefix ({folder}.en + "
        f"{folder}.de) does not exist; give the prefix of its plain-text pairs ({folder / 'train'})")
    for side in ("en", "de"):
        (folder / f"train.{side}").unlink()
    write_jsonl(folder / "train.jsonl", [{"en": en, "de": de} for en, de in PAIRS])
    with pytest.raises(DatasetSchemaError, match=r"is a folder, .*; give one of its \.arrow/\.csv/\.json/\.jsonl/"
                                                 r"\.parquet/\.tsv/\.txt files, or the folder as dataset_name"):
        read_local_pairs(folder, "en", "de")
    write_plain(tmp_path / "data", PAIRS)
    assert list(zip(*(read_local_pairs(folder, "en", "de")[column] for column in ("source", "target")),
                    strict=True)) == PAIRS


def write_hub_layout(folder, splits):
    """A local folder in a Hub dataset's layout: the files of configuration de-en under de-en/, named in README.md."""
    (folder / "de-en").mkdir(parents=True, exist_ok=True)
    for split, pairs in splits.items():
        write_jsonl(folder / "de-en" / f"{split}.jsonl", [{"translation": {"en": en, "de": de}} for en, de in pairs])
    entries = "".join(f"  - split: {split}\n    path: de-en/{split}.jsonl\n" for split in splits)
    (folder / "README.md").write_text(f"---\nconfigs:\n- config_name: de-en\n  data_files:\n{entries}---\n",
                                      encoding="utf-8")


def test_a_local_folder_in_the_hub_layout_is_read_afresh_after_its_files_change(tmp_path):
    """A folder in a Hub dataset's layout, read with its configuration: changed files, and another folder of the same
    name, give their own pairs, not those `datasets` cached for the folder's name before."""
    write_hub_layout(tmp_path / "first" / "corpus", {"train": PAIRS})
    arguments = DataArguments(dataset_name=str(tmp_path / "first" / "corpus"), dataset_config_name="de-en")
    cache = str(tmp_path / "cache")
    train = load_parallel_splits(arguments, ("train",), tmp_path / "demo", cache)["train"]
    assert list(zip(train["source"], train["target"], strict=True)) == PAIRS
    write_hub_layout(tmp_path / "first" / "corpus", {"train": PAIRS[:2]})
    assert len(load_parallel_splits(arguments, ("train",), tmp_path / "demo", cache)["train"]) == 2
    write_hub_layout(tmp_path / "second" / "corpus", {"train": PAIRS[2:]})
    arguments.dataset_name = str(tmp_path / "second" / "corpus")
    assert load_parallel_splits(arguments, ("train",), tmp_path / "demo", cache)["train"]["source"] == ["Two dogs."]


@pytest.mark.parametrize("line, error", [
    (b'{"translation": {"en": "Two dogs.", "de": "Zwei Hunde."}', r"could not be read: ArrowInvalid: JSON parse error: "
                                                                 r".*; give its files as train_file / validation_file / "
                                                                 r"test_file, whose errors name the file and line$"),
    (b'{"translation": {"en": "Two dogs \\ud83d", "de": "Zwei Hunde."}}', r"could not be read: ArrowInvalid: .*"
                                                                         r"surrogate"),
    (b'{"translation": {"en": "Two dogs.", "de": "Zwei H\xfcnde."}}', r"corpus', split 'train', row 3: the 'de' "
                                                                     r"text is not UTF-8 text; save the data files "
                                                                     r"as UTF-8$"),
    (b'{"en": "Two dogs.", "de": "Zwei H\xfcnde."}', r"corpus', split 'train', row 3: the 'de' text is not UTF-8 "
                                                     r"text"),
])
def test_a_local_dataset_folder_whose_file_does_not_parse_or_is_not_utf8_is_one_error(tmp_path, line, error):
    """A local folder given as dataset_name, whose JSON lines datasets cannot parse (invalid JSON, half a surrogate
    pair) or whose texts are not UTF-8 (a Latin-1 file, which datasets' JSON reader keeps in a string column), is one
    DatasetSchemaError naming the dataset (and the row), not datasets' DatasetGenerationError or a UnicodeDecodeError
    traceback once the texts are read."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    flat = line.startswith(b'{"en"')
    records = [{"en": en, "de": de} if flat else {"translation": {"en": en, "de": de}} for en, de in PAIRS]
    (folder / "train.jsonl").write_bytes(b"".join(json.dumps(record).encode() + b"\n" for record in records)
                                         + line + b"\n")
    arguments = DataArguments(dataset_name=str(folder), dataset_config_name=None)
    with pytest.raises(DatasetSchemaError, match=error):
        load_parallel_splits(arguments, ("train",), tmp_path / "demo", str(tmp_path / "cache"))


def test_missing_file_and_missing_split_are_reported(tmp_path):
    with pytest.raises(DatasetSchemaError, match="does not exist"):
        read_local_pairs(tmp_path / "nope.jsonl", "en", "de")
    train = write_jsonl(tmp_path / "train.jsonl", [{"en": "a", "de": "b"}])
    arguments = DataArguments(train_file=str(train))
    with pytest.raises(DatasetSchemaError, match=r"the run needs the validation split\(s\) \(validation: do_eval, or "
                                                 r"evaluation during training unless eval_strategy is 'no'\) but no "
                                                 r"validation_file was given"):
        load_parallel_splits(arguments, ("train", "validation"), tmp_path / "demo")


def test_hub_config_of_another_language_pair_is_refused_before_loading():
    """The default dataset_config_name (de-en) with another pair is an error at once, not after load_dataset has
    downloaded WMT14 de-en; a matching pair (either direction, a region subtag) or local files pass."""
    with pytest.raises(ValueError, match=r"dataset_config_name 'de-en' is the configuration of another language pair "
                                         r"than source_lang 'hi' / target_lang 'en'.*\(WMT's is 'hi-en'\)"):
        DataArguments(source_lang="hi", target_lang="en")
    with pytest.raises(ValueError, match=r"\(WMT's is 'zh-en'\)"):
        DataArguments(dataset_name="wmt/wmt19", source_lang="en", target_lang="zh")
    DataArguments(source_lang="de", target_lang="en")
    DataArguments(dataset_name="wmt/wmt19", dataset_config_name="zh-en", source_lang="zh-CN", target_lang="en")
    DataArguments(source_lang="hi", target_lang="en", train_file="data/train")
    DataArguments(dataset_name="demo", source_lang="hi", target_lang="en")
    DataArguments(dataset_name="some/corpus", dataset_config_name="iwslt2017-de-en", source_lang="ja", target_lang="en")


def test_argument_values_are_checked():
    with pytest.raises(ValueError, match=r"overlong_pairs must be one of \['filter', 'truncate'\]"):
        DataArguments(overlong_pairs="drop")
    with pytest.raises(ValueError, match=r"a \.txt file holds sources only; .* PREFIX\.en \+ PREFIX\.de"):
        DataArguments(validation_file="valid.txt")
    with pytest.raises(ValueError, match="source_lang and target_lang must differ"):
        DataArguments(source_lang="de", target_lang="de")
    with pytest.raises(ValueError, match=r"preprocessing_num_workers must be null \(tokenize in this process\) or an "
                                         r"integer >= 1, got -1"):
        DataArguments(preprocessing_num_workers=-1)
    with pytest.raises(ValueError, match=r"demo_train_pairs must be an integer >= 1, got -5"):
        DataArguments(demo_train_pairs=-5)
    for ratio in (-0.5, 4.5, "half", True):
        with pytest.raises(ValueError, match=r"concatenated_pairs must be a number from 0 \(none\) to 4 \(that many "
                                             rf"joined pairs per training pair\), got {ratio!r}"):
            DataArguments(concatenated_pairs=ratio)
    for size in (1, 9, 3.0, True):
        with pytest.raises(ValueError, match=r"max_pairs_per_join must be an integer from 2 to 8 \(training pairs in "
                                             rf"each joined pair\), got {size!r}"):
            DataArguments(concatenated_pairs=0.5, max_pairs_per_join=size)
    with pytest.raises(ValueError, match=r"max_pairs_per_join 4 sets how many pairs a joined pair of concatenated_pairs "
                                         r"joins, and concatenated_pairs is 0 \(no joined pairs\): set both"):
        DataArguments(max_pairs_per_join=4)
    for name in ("max_source_length", "max_target_length"):
        with pytest.raises(ValueError, match=rf"{name} must be at least 2 \(one token and </s>\), got 1"):
            DataArguments(**{name: 1})
        DataArguments(**{name: 2})


def test_sample_caps_keep_the_first_pairs(tmp_path):
    records = [{"translation": {"en": f"s{i}", "de": f"t{i}"}} for i in range(10)]
    path = write_jsonl(tmp_path / "train.jsonl", records)
    arguments = DataArguments(train_file=str(path), validation_file=str(path), max_train_samples=4,
                              max_eval_samples=2)
    splits = load_parallel_splits(arguments, ("train", "validation"), tmp_path / "demo")
    assert splits["train"]["source"] == ["s0", "s1", "s2", "s3"]
    assert splits["validation"]["target"] == ["t0", "t1"]


@pytest.fixture(scope="module")
def tokenizer():
    english, german = zip(*[random_sentence_pair(random.Random(i)) for i in range(300)], strict=True)
    return train_joint_tokenizer(list(english) + list(german), vocab_size=656)


def overlong_corpus(tmp_path):
    long_text = " ".join(["Hund"] * 40)
    records = [{"en": "The dog.", "de": "Der Hund."}, {"en": "", "de": "Leer."}, {"en": "Empty.", "de": "   "},
               {"en": long_text, "de": "Kurz."}, {"en": "Short.", "de": long_text}, {"en": "A cat.", "de": "Katze."}]
    return read_local_pairs(write_jsonl(tmp_path / "train.jsonl", records), "en", "de")


def test_training_pairs_are_filtered_and_counted(tmp_path, tokenizer):
    dataset = overlong_corpus(tmp_path)
    arguments = DataArguments(max_source_length=16, max_target_length=16, overlong_pairs="filter")
    tokenized, report = tokenize_training_pairs(dataset, tokenizer, arguments)
    assert (report.total, report.empty, report.overlong, report.dropped) == (6, 2, 2, 4)
    assert tokenized["source"] == ["The dog.", "A cat."]
    assert all(ids[-1] == tokenizer.eos_token_id for ids in list(tokenized["input_ids"]) + list(tokenized["labels"]))
    assert tokenized["source_length"] == [len(ids) for ids in tokenized["input_ids"]]


def test_training_pairs_can_be_truncated_instead(tmp_path, tokenizer):
    dataset = overlong_corpus(tmp_path)
    arguments = DataArguments(max_source_length=16, max_target_length=12, overlong_pairs="truncate")
    tokenized, report = tokenize_training_pairs(dataset, tokenizer, arguments)
    assert (report.empty, report.overlong, report.dropped) == (2, 2, 2)
    assert len(tokenized) == 4
    assert max(map(len, tokenized["input_ids"])) == 16 and max(map(len, tokenized["labels"])) == 12
    assert all(ids[-1] == tokenizer.eos_token_id for ids in list(tokenized["input_ids"]) + list(tokenized["labels"]))


@pytest.mark.parametrize("workers", [None, 2])
def test_a_sentence_that_spells_a_special_token_is_tokenized_as_text(tmp_path, tokenizer, workers):
    """A literal "</s>" or "<s>" in a training or evaluation pair is text (its characters), in this process and in
    preprocessing workers alike: the only </s> of input_ids and labels is the final one, and the ids are those the
    tokenizer gives the text."""
    text = "Er schrieb <s>alt</s> neu <unk>."
    dataset = Dataset.from_dict({"source": [text, "The dog."], "target": [text, "Der Hund."]})
    arguments = DataArguments(max_source_length=256, max_target_length=256, preprocessing_num_workers=workers)
    training, _ = tokenize_training_pairs(dataset, tokenizer, arguments, workdir=tmp_path / "train")
    evaluation, _ = tokenize_evaluation_pairs(dataset, tokenizer, arguments, "test", workdir=tmp_path / "test")
    for tokenized in (training, evaluation):
        for column in ("input_ids", "labels"):
            ids = list(tokenized[column])
            assert ids == tokenizer([text, "The dog." if column == "input_ids" else "Der Hund."])["input_ids"]
            assert [index for row in ids for index in row if index < 4] == [tokenizer.eos_token_id] * 2, column
        assert tokenizer.decode(tokenized[0]["labels"], skip_special_tokens=True) == text


def test_a_pair_exactly_at_the_length_limits_is_kept_and_one_token_over_is_filtered(tmp_path, tokenizer):
    """The limits count tokens with </s>: a side of exactly max_source_length / max_target_length tokens is kept."""
    dataset = Dataset.from_dict({"source": ["The small dog.", "a"], "target": ["Der kleine Hund.", "e"]})
    source_length, target_length = (len(tokenizer(text)["input_ids"]) for text in ("The small dog.", "Der kleine Hund."))
    assert min(source_length, target_length) > 2 and len(tokenizer("a")["input_ids"]) == 2
    for limits, kept in (((source_length, target_length), True), ((source_length - 1, target_length), False),
                         ((source_length, target_length - 1), False)):
        arguments = DataArguments(max_source_length=limits[0], max_target_length=limits[1])
        filtered, report = tokenize_training_pairs(dataset, tokenizer, arguments)
        assert ("The small dog." in filtered["source"]) == kept and report.overlong == (not kept), limits


def test_example_lengths_of_a_selected_split_are_picked_by_index_not_gathered_row_by_row(monkeypatch):
    """The training split filtered to the length limits (a `select`) has its token budget checked: `datasets` gathers
    a column of a selected dataset row by row (`Table.fast_gather` of every index), which took 21 s and 2.4 GB of
    memory for a WMT14-sized split of 4.65M pairs, so example_lengths picks the rows the package selected
    (`select_rows`) itself."""
    dataset = Dataset.from_dict({"source_length": [3, 1, 4, 1, 5], "target_length": [2, 7, 1, 8, 2]})
    monkeypatch.setattr(datasets.table.Table, "fast_gather", lambda *_: pytest.fail("gathered row by row"))
    sources, targets = example_lengths(select_rows(dataset, [4, 0, 2]))
    assert (sources.tolist(), targets.tolist()) == ([5, 3, 4], [2, 2, 1])
    assert [lengths.tolist() for lengths in example_lengths(dataset)] == [[3, 1, 4, 1, 5], [2, 7, 1, 8, 2]]


def forbid_private_dataset_attributes_in_the_data_module(monkeypatch):
    """Reading a private attribute of a `Dataset` (`dataset._indices`, ...) from hf_relpos.translation.data fails the
    test: such an attribute may change in any release of `datasets`."""
    original = Dataset.__getattribute__

    def guarded(self, name):
        if (name.startswith("_") and not name.startswith("__")
                and sys._getframe(1).f_globals.get("__name__") == data_module.__name__):
            pytest.fail(f"hf_relpos.translation.data read the private attribute Dataset.{name}")
        return original(self, name)
    monkeypatch.setattr(Dataset, "__getattribute__", guarded)


def test_the_selections_of_filtering_and_sorting_have_their_lengths_picked_without_a_gather_or_a_private_attribute(
        tmp_path, tokenizer, monkeypatch):
    """The training pairs filtered to the length limits, then sorted by source length (a selection of a selection):
    their lengths are those `datasets` gives row by row, picked from the rows this package selected, with no row
    gathered and no private attribute of `datasets` read (a `select`ed dataset's `_indices` was). A dataset selected
    by `datasets` alone is read through its public API: the same lengths, gathered."""
    pairs = [random_sentence_pair(random.Random(i)) for i in range(60)]
    dataset = Dataset.from_dict({"source": [en for en, _ in pairs], "target": [de for _, de in pairs]})
    arguments = DataArguments(max_source_length=9, max_target_length=10)
    filtered, report = tokenize_training_pairs(dataset, tokenizer, arguments, workdir=tmp_path)
    assert 0 < report.overlong < len(pairs) - 10, "some pairs filtered, most kept"
    expected = [np.array(filtered[column]) for column in ("source_length", "target_length")]   # gathered
    by_hand = [np.array([len(ids) for ids in filtered[column]]) for column in ("input_ids", "labels")]
    assert all((a == b).all() for a, b in zip(expected, by_hand, strict=True))
    monkeypatch.setattr(datasets.table.Table, "fast_gather", lambda *_: pytest.fail("gathered row by row"))
    forbid_private_dataset_attributes_in_the_data_module(monkeypatch)
    lengths = example_lengths(filtered)
    assert [column.tolist() for column in lengths] == [column.tolist() for column in expected]
    ordered, order = sort_by_source_length(filtered)
    sorted_lengths = example_lengths(ordered)
    assert [column.tolist() for column in sorted_lengths] == [column[order].tolist() for column in expected]
    assert sorted_lengths[0].tolist() == sorted(expected[0].tolist(), reverse=True)
    monkeypatch.undo()
    elsewhere = filtered.select(order)   # selected by datasets, not by this package: read (gathered) by datasets
    assert [column.tolist() for column in example_lengths(elsewhere)] == [column.tolist() for column in sorted_lengths]


@pytest.mark.parametrize("on_disk", [False, True])
def test_concatenated_pairs_join_two_different_pairs_with_text_on_both_sides(tmp_path, on_disk):
    sources = [f"s{i}" for i in range(10)]
    targets = [f"t{i}" for i in range(10)]
    sources[3], targets[7] = "  ", ""   # pairs 3 and 7 have an empty side: never joined
    dataset = Dataset.from_dict({"source": sources, "target": targets, "id": list(range(10))})
    joined = with_concatenated_pairs(dataset, 1.5, seed=4, workdir=tmp_path if on_disk else None)
    assert joined.column_names == ["source", "target"] and len(joined) == 10 + 15
    assert joined["source"][:10] == sources and joined["target"][:10] == targets
    drawn = []
    for source, target in zip(joined["source"][10:], joined["target"][10:], strict=True):
        first, second = source.split(" ")
        assert target == f"t{first[1:]} t{second[1:]}", "the targets are joined from the same two pairs"
        assert first != second and not {first, second} & {"s3", "s7"}
        drawn += [first, second]
    assert len(set(drawn)) == 8, "every usable pair can be drawn"
    again = with_concatenated_pairs(dataset, 1.5, seed=4)
    assert again["source"] == joined["source"] and again["target"] == joined["target"]
    assert with_concatenated_pairs(dataset, 1.5, seed=5)["source"] != joined["source"]
    assert with_concatenated_pairs(dataset, 0.0, seed=4) is dataset
    large = dataset.cast(Features({"source": Value("large_string"), "target": Value("large_string"),
                                   "id": dataset.features["id"]}))
    joined_large = with_concatenated_pairs(large, 1.5, seed=4)
    assert joined_large.features["source"] == Value("large_string")
    assert joined_large["source"] == joined["source"] and joined_large["target"] == joined["target"]
    with pytest.raises(DatasetSchemaError, match=r"concatenated_pairs joins two different training pairs; the "
                                                 r"training data has 1 pair\(s\) with text on both sides"):
        with_concatenated_pairs(dataset.select([0, 3, 7]), 1.0, seed=4)


@pytest.mark.parametrize("max_pairs", [2, 4])
def test_joined_chinese_or_japanese_sentences_meet_without_a_space_and_others_with_one(max_pairs):
    """The texts of a joined pair are joined as the pipeline joins translated sentences: Chinese or Japanese sentences
    without a space (either side), any other with one, exactly as before for German (a name in Han characters at
    the end of a German sentence still gets its space)."""
    ids = [f"s{i}" for i in range(8)]
    chinese = ["女人喜欢猫。", "男人喂狗。", "「好。」", "孩子在跑！", "他说：“走吧。”", "下雨了？", "天很蓝。", "鸟在唱歌。"]
    german = ["Er traf 田中", "Der Hund läuft.", "  mit Leerzeichen  ", "Zeilen\u2028trenner.", "「Zitat」 sagte er.",
              "Straße, Größe.", "Emoji 🙂.", "Ende."]
    for targets, separator in ((chinese, ""), (german, " ")):
        dataset = Dataset.from_dict({"source": ids, "target": targets})
        joined = with_concatenated_pairs(dataset, 3.0, seed=2, max_pairs=max_pairs)
        for source, target in zip(joined["source"][8:], joined["target"][8:], strict=True):
            assert target == separator.join(targets[int(part[1:])].strip() for part in source.split(" "))
        reverse = with_concatenated_pairs(Dataset.from_dict({"source": targets, "target": ids}), 3.0, seed=2,
                                          max_pairs=max_pairs)
        assert reverse["source"] == joined["target"] and reverse["target"] == joined["source"]


def test_joined_pairs_of_up_to_n_pairs_join_from_2_to_n_different_pairs_the_first_two_as_with_2(monkeypatch):
    """max_pairs 4: each joined pair joins 2, 3 or 4 different usable pairs (each size drawn), sources and targets
    from the same pairs in the same order; its first two pairs are those max_pairs 2 joins with the same seed; built
    in chunks, the same pairs; with exactly 4 usable pairs, still 4 different ones."""
    sources, targets = [f"s{i}" for i in range(12)], [f"t{i}" for i in range(12)]
    sources[5] = ""   # pair 5 has an empty side: never joined
    dataset = Dataset.from_dict({"source": sources, "target": targets})
    joined = with_concatenated_pairs(dataset, 20.0, seed=3, max_pairs=4)
    two = with_concatenated_pairs(dataset, 20.0, seed=3)
    assert len(joined) == 12 + 240 and joined["source"][:12] == sources
    sizes = []
    for source, target, pair in zip(joined["source"][12:], joined["target"][12:], two["source"][12:], strict=True):
        parts = source.split(" ")
        assert target == " ".join(f"t{part[1:]}" for part in parts)
        assert len(set(parts)) == len(parts) and "s5" not in parts and " ".join(parts[:2]) == pair
        sizes.append(len(parts))
    assert set(sizes) == {2, 3, 4}
    assert with_concatenated_pairs(dataset, 20.0, seed=3, max_pairs=4)["source"] == joined["source"]
    monkeypatch.setattr(data_module, "JOIN_CHUNK_PAIRS", 7)
    chunked = with_concatenated_pairs(dataset, 20.0, seed=3, max_pairs=4)
    assert chunked["source"] == joined["source"] and chunked["target"] == joined["target"]
    four = with_concatenated_pairs(dataset.select([0, 1, 2, 3, 5]), 10.0, seed=3, max_pairs=4)["source"][5:]
    assert all(len(set(parts := source.split(" "))) == len(parts) for source in four)
    assert {len(source.split(" ")) for source in four} == {2, 3, 4}
    with pytest.raises(DatasetSchemaError, match=r"concatenated_pairs joins up to 4 \(max_pairs_per_join\) different "
                                                 r"training pairs; the training data has 3 pair\(s\) with text on "
                                                 r"both sides"):
        with_concatenated_pairs(dataset.select([0, 1, 2, 5]), 1.0, seed=4, max_pairs=4)


def test_evaluation_pairs_are_never_dropped_nor_cut(tmp_path, tokenizer):
    """The length limits bound training pairs only: an evaluation source or reference beyond them stays whole (the
    model translates the whole source, as hf-relpos-translate does)."""
    dataset = overlong_corpus(tmp_path)
    arguments = DataArguments(max_source_length=16, max_target_length=16)
    tokenized, report = tokenize_evaluation_pairs(dataset, tokenizer, arguments, "test")
    assert len(tokenized) == 6 and report.dropped == 0 and report.overlong == 2
    assert list(tokenized["input_ids"]) == tokenizer(list(dataset["source"]))["input_ids"]
    assert max(map(len, tokenized["input_ids"])) > 16 and max(map(len, tokenized["labels"])) > 16
    assert "2 over the length limits kept whole" in report.describe("keep")


def test_references_the_tokenizer_cannot_give_back_are_named_in_a_warning(tokenizer, caplog):
    """A reference whose characters NFC changes (U+095B DEVANAGARI LETTER ZA becomes ZA's two code points; a
    decomposed "a" + U+0308 is composed) can never be matched by a translation, which is decoded from NFC tokens: the
    preparation says how many and which characters (the references stay as they are). Clean references, white space
    as it is, or a source-only split: no warning."""
    from hf_relpos.translation.data import unwritable_references, warn_of_unwritable_references

    clean = ["Der Hund.", "  Zwei   Hunde. ", "Eine \"kleine\" Katze…"]
    hindi, decomposed = "\u095bरूर", "Ma\u0308dchen"
    dataset = Dataset.from_dict({"source": ["a"] * 5, "target": [*clean, hindi, decomposed]})
    tokenized, _ = tokenize_evaluation_pairs(dataset, tokenizer, DataArguments(), "test")
    assert unwritable_references(tokenized, tokenizer) == ([3, 4], ["\u095b", "\u0308"])
    assert tokenized["target"] == [*clean, hindi, decomposed]   # scored as they are
    with caplog.at_level("WARNING", logger="hf_relpos.translation.data"):
        warn_of_unwritable_references(tokenized, tokenizer, "test")
    assert "test: 2 of the 5 references hold text the tokenizer gives back otherwise (its normaliser, NFC" in caplog.text
    assert "first in reference 4" in caplog.text
    assert "U+095B DEVANAGARI LETTER ZA, U+0308 COMBINING DIAERESIS" in caplog.text
    caplog.clear()
    clean_split, _ = tokenize_evaluation_pairs(dataset.select(range(3)), tokenizer, DataArguments(), "validation")
    source_only, _ = tokenize_evaluation_pairs(Dataset.from_dict({"source": [hindi], "target": [None]}), tokenizer,
                                               DataArguments(), "test")
    with caplog.at_level("WARNING", logger="hf_relpos.translation.data"):
        warn_of_unwritable_references(clean_split, tokenizer, "validation")
        warn_of_unwritable_references(source_only, tokenizer, "test")
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING] == []


def test_sorting_by_length_and_restoring_order_round_trip(tmp_path, tokenizer):
    dataset = overlong_corpus(tmp_path)
    tokenized, _ = tokenize_evaluation_pairs(dataset, tokenizer, DataArguments(), "test")
    sorted_dataset, order = sort_by_source_length(tokenized)
    lengths = sorted_dataset["source_length"]
    assert lengths == sorted(lengths, reverse=True)
    assert restore_order(list(sorted_dataset["source"]), order) == list(dataset["source"])
    with pytest.raises(ValueError):
        restore_order(["x"], np.array([0, 1]))


def test_demo_corpus_is_deterministic_and_splits_are_disjoint():
    first = generate_demo_splits(300, 50, 50, seed=3)
    assert first == generate_demo_splits(300, 50, 50, seed=3)
    assert first != generate_demo_splits(300, 50, 50, seed=4)
    sources = [{english for english, _ in first[split]} for split in ("train", "validation", "test")]
    assert [len(s) for s in sources] == [300, 50, 50]
    assert sources[0].isdisjoint(sources[1]) and sources[0].isdisjoint(sources[2]) and sources[1].isdisjoint(sources[2])


def test_demo_corpus_reorders_words_like_german():
    pairs = [pair for split in generate_demo_splits(3000, 0, 0, seed=0).values() for pair in split]
    german = " ".join(de for _, de in pairs)
    assert any(ch in german for ch in "äöü") and "ß" in german
    fronted = [(en, de) for en, de in pairs if en.startswith("Today the ") and ", " not in en]
    assert fronted and all(de.split()[0] == "Heute" and de.split()[1] not in ("der", "die", "das", "ein", "eine")
                           for _, de in fronted), "V2: the verb follows the fronted adverb"
    because = [(en, de) for en, de in pairs
               if ", because" in en and not any(modal in en.split(", because")[1] for modal in MODALS)]
    assert because and all(de.split(", weil ")[1].rstrip(".").split()[-1] in VERB_FORMS for _, de in because), \
        "subordinate clauses end in the finite verb"
    separable = [(en, de) for en, de in pairs if en.split(",")[0].split()[2:3] == ["opens"]]
    assert separable and all(de.split(",")[0].rstrip(".").endswith(" auf") for _, de in separable), \
        "a separable verb leaves its particle at the end of the main clause"


MODALS = (" can ", " must ", " wants to ")
VERB_FORMS = {"sieht", "findet", "mag", "trägt", "grüßt", "malt", "aufmacht", "zumacht", "aufhebt", "anruft",
              "zurückbringt"}


def test_demo_corpus_files_use_the_wmt_schema(tmp_path):
    paths = write_demo_corpus(tmp_path / "demo", 20, 5, 5, seed=1)
    assert sorted(paths) == ["test", "train", "validation"]
    assert not list((tmp_path / "demo").glob("*.partial"))
    first = json.loads(paths["train"].read_text(encoding="utf-8").splitlines()[0])
    assert set(first["translation"]) == {"en", "de"}
    assert len(read_local_pairs(paths["validation"], "en", "de")) == 5


def test_demo_corpus_files_hold_the_pairs_of_their_seed_english_as_source(tmp_path):
    paths = write_demo_corpus(tmp_path / "demo", 20, 5, 5, seed=7)
    for split, pairs in generate_demo_splits(20, 5, 5, seed=7).items():
        read = read_local_pairs(paths[split], "en", "de")
        assert list(zip(read["source"], read["target"], strict=True)) == pairs


def test_demo_corpus_of_the_default_size_has_no_english_sentence_twice():
    """At the default 8000 + 300 + 300 pairs the grammar repeats sentences: each is kept once."""
    splits = generate_demo_splits(8000, 300, 300, seed=1234)
    english = [source for pairs in splits.values() for source, _ in pairs]
    assert len(english) == 8600 and len(set(english)) == 8600


def test_the_demo_corpus_a_run_reads_is_the_one_of_its_demo_seed(tmp_path):
    sizes = {"demo_train_pairs": 20, "demo_validation_pairs": 5, "demo_test_pairs": 5}
    for seed in (7, 8):
        arguments = DataArguments(dataset_name="demo", demo_seed=seed, **sizes)
        splits = load_parallel_splits(arguments, ("train",), tmp_path / f"run-{seed}")
        expected = generate_demo_splits(20, 5, 5, seed=seed)["train"]
        assert list(zip(splits["train"]["source"], splits["train"]["target"], strict=True)) == expected


def test_demo_corpus_written_by_several_processes_at_once_is_whole(tmp_path):
    """Under `main_process_first` every non-main rank writes the demo corpus at the same time."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: write_demo_corpus(tmp_path / "demo", 300, 20, 20, seed=1), range(4)))
    expected = write_demo_corpus(tmp_path / "alone", 300, 20, 20, seed=1)
    for path in expected.values():
        assert (tmp_path / "demo" / path.name).read_bytes() == path.read_bytes()
    assert sorted(item.name for item in (tmp_path / "demo").iterdir()) == ["test.jsonl", "train.jsonl",
                                                                            "validation.jsonl"]


def test_failed_demo_corpus_write_leaves_no_partial_file(tmp_path, monkeypatch):
    import hf_relpos.translation.demo_corpus as demo_corpus

    def failing_dumps(*args, **kwargs):
        raise OSError("disk gone")

    monkeypatch.setattr(demo_corpus.json, "dumps", failing_dumps)
    with pytest.raises(OSError, match="disk gone"):
        write_demo_corpus(tmp_path / "demo", 20, 5, 5, seed=1)
    assert list((tmp_path / "demo").iterdir()) == []


def wmt_like_hub_dataset():
    """What `load_dataset("wmt/wmt14", "de-en")` returns, in miniature (a `Translation` feature)."""
    features = Features({"translation": Translation(languages=["de", "en"])})
    split = Dataset.from_dict({"translation": [{"de": de, "en": en} for en, de in PAIRS]}, features=features)
    return DatasetDict({"train": split, "validation": split.select([0]), "test": split.select([1, 2])})


def test_hub_loading_path_maps_the_wmt_schema(monkeypatch, tmp_path):
    requested = []

    def fake_load_dataset(name, config_name, cache_dir=None):
        requested.append((name, config_name))
        return wmt_like_hub_dataset()

    monkeypatch.setattr(data_module, "check_hub_dataset", lambda name: None)  # no network: the Hub is not asked
    monkeypatch.setattr(data_module, "load_dataset", fake_load_dataset)
    splits = load_parallel_splits(DataArguments(), ("train", "validation", "test"), tmp_path / "demo")
    assert requested == [("wmt/wmt14", "de-en")]
    assert list(zip(splits["train"]["source"], splits["train"]["target"], strict=True)) == PAIRS
    assert splits["test"]["target"] == [PAIRS[1][1], PAIRS[2][1]]
    reverse = load_parallel_splits(DataArguments(source_lang="de", target_lang="en"), ("train",), tmp_path / "demo")
    assert reverse["train"]["target"] == [en for en, _ in PAIRS]
    with pytest.raises(DatasetSchemaError, match=r"'wmt/wmt14', split 'train', field 'translation': no 'fr' \(found \['de', 'en'\]\)"):
        load_parallel_splits(DataArguments(dataset_config_name=None, target_lang="fr"), ("train",), tmp_path / "demo")
    with pytest.raises(ValueError, match=r"dataset_config_name 'de-en' is the configuration of another language pair"):
        DataArguments(target_lang="fr")   # refused before anything is loaded
    with pytest.raises(DatasetSchemaError, match=r"has no split 'newstest2015'; its splits are"):
        load_parallel_splits(DataArguments(test_split_name="newstest2015"), ("test",), tmp_path / "demo")


def test_hub_loading_path_maps_flat_language_columns(monkeypatch, tmp_path):
    """bentrevett/multi30k has flat `en`/`de` columns and no configuration."""
    flat = Dataset.from_dict({"en": [en for en, _ in PAIRS], "de": [de for _, de in PAIRS]})
    monkeypatch.setattr(data_module, "check_hub_dataset", lambda name: None)
    monkeypatch.setattr(data_module, "load_dataset", lambda name, config_name, cache_dir=None: DatasetDict(train=flat))
    arguments = DataArguments(dataset_name="bentrevett/multi30k", dataset_config_name=None)
    splits = load_parallel_splits(arguments, ("train",), tmp_path / "demo")
    assert list(zip(splits["train"]["source"], splits["train"]["target"], strict=True)) == PAIRS
    with pytest.raises(DatasetSchemaError, match=r"dataset 'x', split 'train', columns: no 'cs' \(found \['de', 'en'\]\)"):
        load_parallel_splits(DataArguments(dataset_name="x", dataset_config_name=None, source_lang="cs"), ("train",),
                             tmp_path / "demo")



def test_a_missing_hub_text_is_an_error_naming_its_row_and_a_test_split_without_targets_is_source_only(
        monkeypatch, tmp_path):
    """A None text in a Hub split is refused as a `null` in a local file is (it was scored or trained on as ""); a test
    split with no target on any row is source-only."""
    features = Features({"translation": Translation(languages=["de", "en"])})

    def split(*pairs):
        return Dataset.from_dict({"translation": [{"en": en, "de": de} for en, de in pairs]}, features=features)

    splits = {"train": split(("a", "b"), ("c", None)), "validation": split(("a", "b"), (None, "d")),
              "test": split(("a", None), ("c", None))}
    monkeypatch.setattr(data_module, "check_hub_dataset", lambda name: None)
    monkeypatch.setattr(data_module, "load_dataset", lambda name, config_name, cache_dir=None: DatasetDict(splits))
    with pytest.raises(DatasetSchemaError, match=r"^'wmt/wmt14' train split, row 1: the target text \('de'\) is "
                                                 r"missing \(None\) in 1 of its 2 rows; every pair needs both texts$"):
        load_parallel_splits(DataArguments(), ("train",), tmp_path / "demo")
    with pytest.raises(DatasetSchemaError, match=r"validation split, row 1: the source text \('en'\) is missing"):
        load_parallel_splits(DataArguments(), ("validation",), tmp_path / "demo")
    test = load_parallel_splits(DataArguments(), ("test",), tmp_path / "demo")["test"]
    assert test["source"] == ["a", "c"] and test["target"] == [None, None]
    splits["test"] = split(("a", "x"), ("c", None))
    with pytest.raises(DatasetSchemaError, match=r"test split, row 1: .*; a test split is either parallel on every "
                                                 r"row or source-only \(no target on any row\)$"):
        load_parallel_splits(DataArguments(), ("test",), tmp_path / "demo")

# --- plain-text pairs by prefix, TSV without quoting, tricky characters ----------------------------------------------

TRICKY = [
    ('He said "hello" and left.', 'Er sagte „hallo“ und ging.'),
    ('"Quoted at the start," she said', '"Am Anfang zitiert", sagte sie'),
    ("It's O'Brien's", "Das ist O'Briens"),
    ("a single \" quote", "ein einzelnes \" Zeichen"),
    ("Pages 3–5 — see above", "Seiten 3–5 — siehe oben"),
    ("Café, naïve, résumé", "Straße, Größe, Übermaß, ÄÖÜ äöü ß"),
    ("Emoji 🙂 and 👍🏽 and 🇩🇪", "Emoji 🙂 und 👍🏽 und 🇩🇪"),
    ("A line\u2028separator and a form\x0cfeed", "Ein Zeilen\u2028trenner und ein Seiten\x0cvorschub"),
    ("", "Nur Ziel."),
    ("Only source.", ""),
    ("", ""),
    ("  spaced  ", "  mit Leerzeichen  "),
]


def write_plain(prefix, pairs, source_lang="en", target_lang="de", line_end="\n"):
    for lang, side in ((source_lang, 0), (target_lang, 1)):
        text = "".join(pair[side] + line_end for pair in pairs)
        (prefix.parent / f"{prefix.name}.{lang}").write_bytes(text.encode("utf-8"))
    return prefix


@pytest.mark.parametrize("line_end", ["\n", "\r\n"])
def test_plain_text_pair_by_prefix_round_trips_every_character(tmp_path, line_end):
    prefix = write_plain(tmp_path / "train", TRICKY, line_end=line_end)
    dataset = read_local_pairs(prefix, "en", "de")
    assert list(zip(dataset["source"], dataset["target"], strict=True)) == TRICKY
    reverse = read_local_pairs(prefix, "de", "en")
    assert reverse["source"] == [de for _, de in TRICKY]


def test_plain_text_prefix_with_dots_and_a_byte_order_mark(tmp_path):
    prefix = tmp_path / "corpus.tok.bpe"
    write_plain(prefix, PAIRS)
    source = tmp_path / "corpus.tok.bpe.en"
    source.write_bytes(b"\xef\xbb\xbf" + source.read_bytes())
    dataset = read_local_pairs(prefix, "en", "de")
    assert list(zip(dataset["source"], dataset["target"], strict=True)) == PAIRS


def test_plain_text_line_counts_must_match(tmp_path):
    prefix = write_plain(tmp_path / "train", PAIRS)
    (tmp_path / "train.de").write_text("Eine kleine Katze.\nGuten Morgen!\n", encoding="utf-8")
    with pytest.raises(DatasetSchemaError, match=r"train\.en has 3 lines but .*train\.de has 2; parallel"):
        read_local_pairs(prefix, "en", "de")


def test_a_wrong_language_code_names_the_files_that_are_there(tmp_path):
    prefix = write_plain(tmp_path / "train", PAIRS)
    with pytest.raises(DatasetSchemaError) as error:
        read_local_pairs(prefix, "fr", "de")
    assert (f"({prefix}.fr + {prefix}.de: {prefix}.fr missing) (there are {prefix}.de, {prefix}.en: are source_lang "
            f"'fr' and target_lang 'de' right?)") in str(error.value)


def test_plain_text_prefix_with_a_missing_side(tmp_path):
    """A source file alone, outside a test split, is one error saying that the file needs its references (not that
    the language codes may be wrong: the source's code is right)."""
    prefix = tmp_path / "test"
    (tmp_path / "test.en").write_text("One.\n\nTwo.\n", encoding="utf-8")
    with pytest.raises(DatasetSchemaError, match=r"'.*test' does not exist, nor does the plain-text pair .*test\.de "
                                                 r"missing") as error:
        read_local_pairs(prefix, "en", "de")
    assert ("only a test file may be source-only, translated and not scored; a training or validation file needs its "
            ".de side too") in str(error.value) and "are source_lang" not in str(error.value)
    source_only = read_local_pairs(prefix, "en", "de", allow_source_only=True)
    assert source_only["source"] == ["One.", "", "Two."] and source_only["target"] == [None, None, None]
    with pytest.raises(DatasetSchemaError, match=r"nope\.en and .*nope\.de missing"):
        read_local_pairs(tmp_path / "nope", "en", "de", allow_source_only=True)


def test_plain_text_that_is_not_utf8_names_file_and_line(tmp_path):
    prefix = write_plain(tmp_path / "train", PAIRS)
    (tmp_path / "train.de").write_bytes("Eine Katze.\nGr\xf6\xdfe\n".encode("latin-1"))
    with pytest.raises(DatasetSchemaError, match=r"train\.de:2: not UTF-8 text"):
        read_local_pairs(prefix, "en", "de")


@pytest.mark.parametrize("name", ["train.tsv", "train.csv", "train.jsonl", "train.json", "train"])
def test_a_utf16_data_file_is_one_error_saying_to_save_it_as_utf8(tmp_path, name):
    """A UTF-16 file (a spreadsheet's "Unicode text" export, with its byte order mark) is named as such, in every
    format, line 1 at byte 0."""
    text = {"train.tsv": "en\tde\nA cat.\tEine Katze.\n", "train.csv": "en,de\nA cat.,Eine Katze.\n",
            "train.jsonl": '{"en": "A cat.", "de": "Eine Katze."}\n', "train.json": '[{"en": "A cat.", "de": "Katze"}]',
            "train": "A cat.\n"}[name]
    path = tmp_path / (f"{name}.en" if name == "train" else name)
    path.write_bytes(text.encode("utf-16"))
    if name == "train":
        (tmp_path / "train.de").write_text("Eine Katze.\n", encoding="utf-8")
    with pytest.raises(DatasetSchemaError, match=rf"^{re.escape(str(path))}:1: not UTF-8 text \(invalid start byte at "
                                                 r"byte 0 of the line\): it is UTF-16 \(its byte order mark\); save it "
                                                 r"as UTF-8$"):
        read_local_pairs(tmp_path / name, "en", "de")


@pytest.mark.parametrize(("compress", "hint"), [
    (gzip.compress, "it is .gz compressed data; give the file a name ending in .gz, which is decompressed as it is "
                    "read, or decompress it first"),
    (bz2.compress, "it is .bz2 compressed data; give the file a name ending in .bz2, which is decompressed as it is "
                   "read, or decompress it first"),
    (lzma.compress, "it is .xz compressed data; give the file a name ending in .xz, which is decompressed as it is "
                    "read, or decompress it first"),
    (lambda data: b"\x28\xb5\x2f\xfd\x20\x00\xfe" + data, "it is .zst compressed data; decompress it first"),
])
def test_compressed_data_read_as_text_is_named_as_such(tmp_path, compress, hint):
    """Compressed bytes piped to stdin (`cat test.en.gz | hf-relpos-translate`) or in a file without its suffix are
    not UTF-8 from their first bytes, whose magic names the compression and what to do: data files and stdin alike."""
    data = compress(b"Eine Katze.\n" * 50)
    with pytest.raises(DatasetSchemaError, match=rf"^stdin:1: not UTF-8 text \(.*\): {re.escape(hint)}$"):
        list(text_line_chunks(io.BytesIO(data), "stdin", 100))
    (tmp_path / "train.en").write_bytes(data)
    (tmp_path / "train.de").write_text("Eine Katze.\n" * 50, encoding="utf-8")
    with pytest.raises(DatasetSchemaError, match=rf":1: not UTF-8 text \(.*\): {re.escape(hint)}$"):
        read_local_pairs(tmp_path / "train", "en", "de")


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize(("name", "text"), [
    ("train.csv", 'en,de\nA cat.,Eine Katze.\n"A\nbig dog.",Ein gro\xdfer Hund.\n'),
    ("train.json", '[{"en": "A cat.", "de": "Eine Katze."},\n {"en": "A dog.", "de": "Ein gro\xdfer Hund."}]\n'),
    ("train.tsv", "en\tde\nA cat.\tEine Katze.\nA dog.\tEin gro\xdfer Hund.\n"),
    ("train.jsonl", '{"en": "A cat.", "de": "Eine Katze."}\n{"en": "A dog.", "de": "Ein gro\xdfer Hund."}\n'),
])
def test_a_data_file_that_is_not_utf8_is_one_error_naming_its_line_in_every_format(tmp_path, name, text, suffix):
    """A Latin-1 file (a spreadsheet's CSV export) is one error naming the file and the line (counted as `wc -l`
    counts, a quoted line break included) and the byte, in every format; .csv and .json raised UnicodeDecodeError."""
    path = tmp_path / f"{name}{suffix}"
    path.write_bytes(gzip.compress(text.encode("latin-1")) if suffix else text.encode("latin-1"))
    line = text.count("\n", 0, text.index("\xdf")) + 1
    byte = len(text[:text.index("\xdf")].rpartition("\n")[2])
    with pytest.raises(DatasetSchemaError, match=rf"^{re.escape(str(path))}:{line}: not UTF-8 text \(invalid "
                                                 rf"continuation byte at byte {byte} of the line\)$"):
        read_local_pairs(path, "en", "de")


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_text_read_in_chunks_gives_the_lines_of_the_same_bytes_read_as_a_data_file(tmp_path, suffix):
    """`text_line_chunks` (stdin) and `text_file_line_chunks` (`hf-relpos-translate`'s files, decompressed as read)
    give the lines a data file's reader gives for the same bytes: a byte order mark dropped, split at "\n" only with
    a "\r" before it dropped (a stray "\r" stays in its line), a final "\n" starting no line."""
    def lines_of(data: bytes) -> list[str]:
        return [line for chunk in text_line_chunks(io.BytesIO(data), "stdin", 100) for line in chunk]

    assert lines_of(b"") == [] and lines_of(b"\n") == [""] and lines_of(b"a") == ["a"]
    data = "\ufeffA dog.\r\n\r\nA cat\rsits.\nLast".encode()
    assert lines_of(data) == ["A dog.", "", "A cat\rsits.", "Last"]
    (tmp_path / "test.en").write_bytes(data)
    assert read_local_pairs(tmp_path / "test", "en", "de", allow_source_only=True)["source"] == lines_of(data)
    path = tmp_path / f"input.en{suffix}"
    path.write_bytes(gzip.compress(data) if suffix else data)
    with path.open("rb") as file:
        assert [line for chunk in text_file_line_chunks(file, path, 3) for line in chunk] == lines_of(data)
    with pytest.raises(DatasetSchemaError, match=r"^stdin:2: not UTF-8 text \(invalid start byte at byte 2 of the "
                                                 r"line\)$"):
        lines_of(b"A.\nGr\xff\n")


@pytest.mark.parametrize(("data", "lines"), [
    (b"", []), (b"\n", [""]), (b"a", ["a"]), ("\ufeff".encode(), []), ("\ufeff\n".encode(), [""]),
    ("\ufeffA dog.\r\n\r\nA cat\rsits.\n\ufeffLast".encode(), ["A dog.", "", "A cat\rsits.", "\ufeffLast"]),
    (b"x\ny\nz\n", ["x", "y", "z"])])
@pytest.mark.parametrize("chunk_lines", [1, 2, 3, 100])
def test_text_read_in_chunks_gives_the_lines_of_the_whole_text(data, lines, chunk_lines):
    """`text_line_chunks` (`hf-relpos-translate`'s source as it is read): chunks of `chunk_lines` lines (the last one
    shorter) that together are the lines of the whole text: a byte order mark dropped at the start only, "\r\n" as
    "\n", a last line without "\n" kept, blank lines kept."""
    chunks = list(text_line_chunks(io.BytesIO(data), "stdin", chunk_lines))
    assert [line for chunk in chunks for line in chunk] == lines
    assert all(len(chunk) == chunk_lines for chunk in chunks[:-1]) and all(chunks)
    assert len(chunks[-1] if chunks else []) <= chunk_lines


def test_text_chunks_are_given_as_their_lines_arrive_and_an_invalid_line_is_named_across_chunks():
    """A chunk is given once its last line is read, before the stream's next line is asked for (a pipe's writer may
    still be writing it); a line that is not UTF-8 is named by its line number in the whole stream."""
    asked = []

    def stream():
        for line in (b"A.\n", b"B.\n", b"C.\n", b"D.\n", b"Gr\xff\n", b"F.\n"):
            asked.append(line)
            yield line

    chunks = text_line_chunks(stream(), "stdin", 2)
    assert next(chunks) == ["A.", "B."] and len(asked) == 2
    assert next(chunks) == ["C.", "D."] and len(asked) == 4
    with pytest.raises(DatasetSchemaError, match=r"^stdin:5: not UTF-8 text \(invalid start byte at byte 2 of the "
                                                 r"line\)$"):
        next(chunks)


def test_plain_text_empty_lines_stay_aligned_and_training_drops_them(tmp_path, tokenizer):
    """An empty line on either side keeps its place (no shift); training drops the pair, evaluation keeps it."""
    prefix = write_plain(tmp_path / "train", TRICKY)
    arguments = DataArguments(train_file=str(prefix), validation_file=str(prefix), test_file=str(prefix))
    splits = load_parallel_splits(arguments, ("train", "validation", "test"), tmp_path / "demo")
    assert len(splits["train"]) == len(splits["validation"]) == len(TRICKY)
    tokenized, report = tokenize_training_pairs(splits["train"], tokenizer, arguments)
    assert report.empty == 3
    assert list(zip(tokenized["source"], tokenized["target"], strict=True)) == [
        pair for pair in TRICKY if pair[0].strip() and pair[1].strip()]
    evaluation, _ = tokenize_evaluation_pairs(splits["validation"], tokenizer, arguments, "validation")
    assert len(evaluation) == len(TRICKY)


def test_tsv_has_no_quoting_and_round_trips_every_character(tmp_path):
    path = tmp_path / "train.tsv"
    rows = ["id\ten\tde"] + [f"{index}\t{en}\t{de}" for index, (en, de) in enumerate(TRICKY)]
    path.write_text("\n".join(rows[:5]) + "\n\n" + "\n".join(rows[5:]) + "\n", encoding="utf-8")  # one empty line
    dataset = read_local_pairs(path, "en", "de")
    assert list(zip(dataset["source"], dataset["target"], strict=True)) == TRICKY


def test_a_tsv_header_without_the_languages_is_an_error_naming_line_1(tmp_path):
    """Also a file without a header (OPUS, Tatoeba): the error says to add one, not to use the JSON schema."""
    path = tmp_path / "hdr.tsv"
    path.write_text("src\ttgt\nA cat.\tEine Katze.\n", encoding="utf-8")
    with pytest.raises(DatasetSchemaError, match=r"hdr\.tsv:1, header: no 'en' or 'de' \(found \['src', 'tgt'\]\)"):
        read_local_pairs(path, "en", "de")
    path.write_text("A cat.\tEine Katze.\nA dog.\tEin Hund.\n", encoding="utf-8")
    with pytest.raises(DatasetSchemaError) as error:
        read_local_pairs(path, "en", "de")
    assert str(error.value) == (f"{path}:1, header: no 'en' or 'de' (found ['A cat.', 'Eine Katze.']); its first line "
                                "names the columns: add a header line naming the languages, e.g. en<TAB>de (set "
                                "source_lang/target_lang)")


@pytest.mark.parametrize("separator", [",", "\t"], ids=["csv", "tsv"])
def test_a_language_named_twice_in_the_header_reads_its_last_column(tmp_path, separator):
    """As a dict of the row keeps it: the last column of a name given twice."""
    path = tmp_path / ("pairs.csv" if separator == "," else "pairs.tsv")
    path.write_text(separator.join(["en", "de", "en"]) + "\n" + separator.join(["first", "Hund", "last"]) + "\n",
                    encoding="utf-8")
    pairs = read_local_pairs(path, "en", "de")
    assert (pairs["source"], pairs["target"]) == (["last"], ["Hund"])


def test_tsv_with_a_tab_inside_a_sentence_is_refused(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("en\tde\nA cat.\tEine Katze.\nA\ttab.\tEin Tab.\n", encoding="utf-8")
    with pytest.raises(DatasetSchemaError, match=r"train\.tsv:3: 3 tab-separated fields, but the header has 2 "
                                                 r"\(en, de\); .* may not contain a tab"):
        read_local_pairs(path, "en", "de")
    path.write_text("en\tde\nA cat.\n", encoding="utf-8")
    with pytest.raises(DatasetSchemaError, match=r"train\.tsv:2: 1 tab-separated fields"):
        read_local_pairs(path, "en", "de")


def test_csv_quoting_round_trips_quotes_and_commas(tmp_path):
    import csv

    path = tmp_path / "train.csv"
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["en", "de"])
        writer.writerows(pair for pair in TRICKY if pair[0] or pair[1])
        writer.writerow(["a, b", "c, d"])
    dataset = read_local_pairs(path, "en", "de")
    expected = [pair for pair in TRICKY if pair[0] or pair[1]] + [("a, b", "c, d")]
    assert list(zip(dataset["source"], dataset["target"], strict=True)) == expected


def test_jsonl_round_trips_every_character(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [{"translation": {"en": en, "de": de}} for en, de in TRICKY])
    dataset = read_local_pairs(path, "en", "de")
    assert list(zip(dataset["source"], dataset["target"], strict=True)) == TRICKY


def test_a_file_with_an_unknown_suffix_is_no_prefix(tmp_path):
    path = tmp_path / "train.xlsx"
    path.write_bytes(b"PK\x03\x04")
    with pytest.raises(DatasetSchemaError, match=r"must end in one of .* \(or name the prefix"):
        read_local_pairs(path, "en", "de")
    compressed = write_compressed(tmp_path / "train.gz", "A line.\n")   # compressed, but what format?
    with pytest.raises(DatasetSchemaError, match=r"train\.gz' must end in one of \['\.arrow', '\.csv', '\.json', "
                                                 r"'\.jsonl', '\.parquet', '\.tsv', '\.txt'\], or in one of \['\.csv', "
                                                 r"'\.json', '\.jsonl', '\.tsv', '\.txt'\] and \.gz, \.bz2, \.xz "
                                                 r"\(compressed\) \(or name the prefix"):
        read_local_pairs(compressed, "en", "de")



def test_a_zstd_or_zip_data_file_or_prefix_is_one_error_naming_the_field_the_files_and_the_supported_forms(tmp_path):
    """A .zst file (zstandard is no dependency) or a .zip archive, or a prefix whose pair is only there so, was read as
    a prefix and refused as missing files ('are source_lang and target_lang right?'), the field unnamed."""
    for name in ("train.jsonl.zst", "train.en.zip", "train.de.zip"):
        (tmp_path / name).write_bytes(b"\x28\xb5\x2f\xfd" if name.endswith(".zst") else b"PK\x05\x06" + bytes(18))
    supported = (r"give a \.jsonl, \.json, \.csv, \.tsv file or the prefix of plain-text files PREFIX\.en \+ PREFIX\.de, "
                 r"uncompressed or compressed with gzip, bzip2 or xz \(\.gz, \.bz2, \.xz\)$")
    with pytest.raises(ValueError, match=rf"^train_file '.*train\.jsonl\.zst' names compressed file\(s\) \(.*train\."
                                         rf"jsonl\.zst\) of a kind that is not read \(\.zst, \.zip\): decompress first "
                                         rf"\(unzstd .*train\.jsonl\.zst\) and {supported}"):
        DataArguments(train_file=str(tmp_path / "train.jsonl.zst"))
    with pytest.raises(ValueError, match=rf"^validation_file '.*train' names compressed file\(s\) \(.*train\.en\.zip, "
                                         rf".*train\.de\.zip\) .*\(unzip .*train\.en\.zip; unzip .*train\.de\.zip\) "
                                         rf"and {supported}"):
        DataArguments(validation_file=str(tmp_path / "train"))
    with pytest.raises(ValueError, match=r"^test_file .* \.tsv, \.txt \(sources only\) file or the prefix"):
        DataArguments(test_file=str(tmp_path / "train"))
    (tmp_path / "train.en.gz").write_bytes(gzip.compress(b"A line.\n"))   # a side readable otherwise is read so
    with pytest.raises(ValueError, match=r"names compressed file\(s\) \(.*train\.de\.zip\) of a kind"):
        DataArguments(train_file=str(tmp_path / "train"))
    write_plain(tmp_path / "train", PAIRS)   # the plain pair beside the compressed ones is read
    assert DataArguments(train_file=str(tmp_path / "train")).train_file == str(tmp_path / "train")


def write_compressed(path, text, suffix=".gz"):
    compress = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}[suffix]
    path.write_bytes(compress(text.encode("utf-8")))
    return path


def test_a_compressed_plain_text_pair_is_found_by_its_prefix_and_its_line_counts_must_match(tmp_path):
    """`--train_file data/train` reads train.en.gz + train.de.gz (or one side compressed, the other not); their line
    counts are checked as those of uncompressed files are, each file named as it is."""
    prefix = tmp_path / "train"
    (tmp_path / "train.en.gz").write_bytes(b"".join(gzip.compress(f"{en}\n".encode()) for en, _ in PAIRS))   # 3 members
    write_compressed(tmp_path / "train.de.xz", "".join(f"{de}\n" for _, de in PAIRS), ".xz")
    arguments = DataArguments(train_file=str(prefix))
    loaded = load_parallel_splits(arguments, ("train",), tmp_path / "demo")["train"]
    assert list(zip(loaded["source"], loaded["target"], strict=True)) == PAIRS
    assert data_module.existing_data_files(prefix, "en", "de") == [tmp_path / "train.en.gz", tmp_path / "train.de.xz"]
    write_compressed(tmp_path / "train.de.xz", "Eine kleine Katze.\nGuten Morgen!\n", ".xz")
    with pytest.raises(DatasetSchemaError, match=r"train\.en\.gz has 3 lines but .*train\.de\.xz has 2; parallel"):
        read_local_pairs(prefix, "en", "de")
    (tmp_path / "train.de.xz").unlink()
    (tmp_path / "train.de").write_text("Eine kleine Katze.\n", encoding="utf-8")
    with pytest.raises(DatasetSchemaError, match=r"train\.en\.gz has 3 lines but .*train\.de has 1; parallel"):
        read_local_pairs(prefix, "en", "de")


def test_one_compressed_side_of_a_plain_text_pair_is_named_and_a_test_prefix_reads_it_source_only(tmp_path):
    prefix = tmp_path / "test"
    (tmp_path / "test.en.bz2").write_bytes(bz2.compress(b"One.\n\n") + bz2.compress(b"Two.\n"))   # 2 streams (pbzip2)
    with pytest.raises(DatasetSchemaError, match=r"\(.*test\.en \+ .*test\.de: .*test\.de missing\) "
                                                 r"\(only .*test\.en\.bz2 is there: only a test file may be source-only"):
        read_local_pairs(prefix, "en", "de")
    source_only = read_local_pairs(prefix, "en", "de", allow_source_only=True)
    assert source_only["source"] == ["One.", "", "Two."] and source_only["target"] == [None, None, None]
    with pytest.raises(DatasetSchemaError, match=r"'.*test\.en\.bz2' is one side of a plain-text pair: give its prefix "
                                                 r"'.*test' \(read as .*test\.en \+ .*test\.de, or their \.bz2 files\)"):
        read_local_pairs(tmp_path / "test.en.bz2", "en", "de")


def test_a_side_there_uncompressed_is_read_and_one_there_compressed_twice_is_an_error(tmp_path):
    """`gunzip -k` leaves train.en beside train.en.gz: train.en is read. train.en.gz and train.en.xz without
    train.en: which to read is no guess to make."""
    prefix = write_plain(tmp_path / "train", PAIRS)
    write_compressed(tmp_path / "train.en.gz", "Other text.\n")
    assert read_local_pairs(prefix, "en", "de")["source"] == [en for en, _ in PAIRS]
    assert data_module.existing_data_files(prefix, "en", "de") == [tmp_path / "train.en", tmp_path / "train.de"]
    (tmp_path / "train.en").unlink()
    write_compressed(tmp_path / "train.en.xz", "Other text.\n", ".xz")
    for read in (read_local_pairs, data_module.existing_data_files):
        with pytest.raises(DatasetSchemaError, match=r"^plain-text prefix '.*train': its 'en' side is there compressed "
                                                     r"twice \(.*train\.en\.gz, .*train\.en\.xz\) and .*train\.en is "
                                                     r"not; keep the one to read$"):
            read(prefix, "en", "de")


@pytest.mark.parametrize("name", ["train.jsonl.gz", "train.csv.bz2", "train.en.xz"])
def test_a_compressed_file_that_does_not_decompress_is_one_error_naming_it(tmp_path, name):
    whole = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}[name[name.rindex("."):]](
        b'en,de\n"a","b"\n' * 50)
    (tmp_path / name).write_bytes(whole[:-8])   # cut short, as an interrupted download leaves it
    path = tmp_path / (name if "jsonl" in name or "csv" in name else "train")
    if name.endswith(".xz"):
        (tmp_path / "train.de").write_text("b\n" * 50, encoding="utf-8")
    with pytest.raises(DatasetSchemaError, match=rf"^{tmp_path / name}: not a whole \.\w+ file, it does not "
                                                 r"decompress \(\w+: .*\)$"):
        read_local_pairs(path, "en", "de")


class FileFailingAfter(io.RawIOBase):
    """A file object that gives the first `good` bytes of `data`, then (short of its end) raises `error` on every
    read (a disk's EIO)."""

    def __init__(self, data: bytes, good: int, error: OSError) -> None:
        super().__init__()
        self.data, self.good, self.error, self.position = data, good, error, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.position >= self.good and self.good < len(self.data):
            raise self.error
        piece = self.data[self.position:min(self.good, self.position + len(buffer))]
        buffer[:len(piece)] = piece
        self.position += len(piece)
        return len(piece)


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
def test_an_io_error_reading_a_compressed_file_propagates_as_it_is(suffix):
    """An OSError of the file's own reads (EIO) while a compressed file is decompressed is raised as it is, not
    reported as a file that does not decompress; a file cut short, corrupt or of another kind still is, by each
    module's error (EOFError; gzip.BadGzipFile, zlib.error; bzip2's OSError 'Invalid data stream'; lzma.LZMAError)."""
    data = "".join(f"Line {number}.\n" for number in range(20000)).encode()
    compressed = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}[suffix](data)
    path = f"input.en{suffix}"

    def lines(file) -> list[str]:
        return [line for chunk in text_file_line_chunks(file, path, 1000) for line in chunk]

    eio = OSError(errno.EIO, "Input/output error")
    with pytest.raises(OSError) as raised:
        lines(FileFailingAfter(compressed, len(compressed) // 2, eio))
    assert raised.value is eio
    assert lines(FileFailingAfter(compressed, len(compressed), eio)) == data.decode().splitlines()
    middle = len(compressed) // 2
    corrupt = compressed[:middle] + bytes(byte ^ 0xFF for byte in compressed[middle:middle + 64]) + compressed[
        middle + 64:]
    for broken in (compressed[:-8], corrupt, data):   # cut short, corrupt, plain text under the compressed name
        with pytest.raises(DatasetSchemaError, match=rf"^{re.escape(path)}: not a whole \{suffix} file, it does not "
                                                     r"decompress \(\w+: .*\)$"):
            lines(io.BytesIO(broken))


def test_a_compressed_training_file_of_sources_only_is_refused_as_the_uncompressed_one(tmp_path):
    write_compressed(tmp_path / "train.txt.gz", "A line.\n")
    with pytest.raises(ValueError, match=r"train_file '.*train\.txt\.gz': a \.txt file holds sources only"):
        DataArguments(train_file=str(tmp_path / "train.txt.gz"))
    assert read_local_pairs(tmp_path / "train.txt.gz", "en", "de", allow_source_only=True)["source"] == ["A line."]


def test_a_local_dataset_folder_of_compressed_files_is_read_by_datasets(tmp_path):
    """`dataset_name` naming a folder of .jsonl.gz / .jsonl.bz2 / .jsonl.xz files: `datasets` decompresses them by their
    suffix (its extractors, standard library); the files a split's key hashes are the compressed ones."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    records = "".join(json.dumps({"translation": {"en": en, "de": de}}) + "\n" for en, de in PAIRS)
    for split, suffix in (("train", ".gz"), ("validation", ".bz2"), ("test", ".xz")):
        write_compressed(folder / f"{split}.jsonl{suffix}", records, suffix)
    arguments = DataArguments(dataset_name=str(folder), dataset_config_name=None)
    loaded = load_parallel_splits(arguments, ("train", "validation", "test"), tmp_path / "demo",
                                  cache_dir=str(tmp_path / "cache"))
    for split in ("train", "validation", "test"):
        assert list(zip(loaded[split]["source"], loaded[split]["target"], strict=True)) == PAIRS, split
    files = data_module.local_folder_split_files(folder, None, ["train", "validation"], str(tmp_path / "cache"))
    assert files == {"train": [folder / "train.jsonl.gz"], "validation": [folder / "validation.jsonl.bz2"]}


@pytest.mark.parametrize("side", ["en", "de"])
def test_one_side_of_a_plain_text_pair_is_one_error_naming_its_prefix(tmp_path, side):
    for lang in ("en", "de"):
        (tmp_path / f"test.{lang}").write_text("A line.\n", encoding="utf-8")
    with pytest.raises(DatasetSchemaError) as error:
        read_local_pairs(tmp_path / f"test.{side}", "en", "de", allow_source_only=True)
    prefix = str(tmp_path / "test")
    assert str(error.value) == (f"data file '{prefix}.{side}' is one side of a plain-text pair: give its prefix "
                                f"'{prefix}' (read as {prefix}.en + {prefix}.de)")
    assert read_local_pairs(prefix, "en", "de")["target"] == ["A line."]


def docs_command(starts_with: str) -> str:
    from pathlib import Path

    training_md = Path(__file__).resolve().parents[1] / "docs" / "training.md"
    (line,) = [line for line in training_md.read_text(encoding="utf-8").splitlines() if line.startswith(starts_with)]
    return line


def test_the_documented_jsonl_conversion_writes_the_plain_text_pair(tmp_path):
    import shlex
    import subprocess
    import sys

    pairs = [pair for pair in TRICKY if "\u2028" not in pair[0]] + [("Two\nlines", "Zwei\nZeilen")]
    write_jsonl(tmp_path / "train.jsonl", [{"translation": {"en": en, "de": de}} for en, de in pairs])
    arguments = shlex.split(docs_command("python -c 'import json,sys;"))
    subprocess.run([sys.executable, *arguments[1:-3], str(tmp_path / "train"), "en", "de"], check=True)
    dataset = read_local_pairs(tmp_path / "train", "en", "de")
    assert list(zip(dataset["source"], dataset["target"], strict=True)) == pairs[:-1] + [("Two lines", "Zwei Zeilen")]


def test_the_documented_tsv_conversion_writes_the_plain_text_pair(tmp_path):
    import shutil
    import subprocess

    if shutil.which("cut") is None:
        pytest.skip("no cut here")
    pairs = [pair for pair in TRICKY if "\u2028" not in pair[0] and "\x0c" not in pair[0]]
    (tmp_path / "corpus.tsv").write_text("".join(f"{en}\t{de}\n" for en, de in pairs), encoding="utf-8")
    (tmp_path / "data").mkdir()
    subprocess.run(docs_command("cut -f1 corpus.tsv"), shell=True, check=True, cwd=tmp_path)
    dataset = read_local_pairs(tmp_path / "data" / "train", "en", "de")
    assert list(zip(dataset["source"], dataset["target"], strict=True)) == pairs
