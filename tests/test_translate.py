"""`python -m hf_relpos.tools.translate MODEL_DIR`: a file (or stdin) translated line by line, batched by tokens, scored
against references with sacreBLEU and chrF."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import MEMORISED_PAIRS

from hf_relpos.publish.records import RUN_RECORD_FILE, RunRecord
from hf_relpos.tools.sentences import translate_by_sentence
from hf_relpos.tools.translate import main, token_batches
from hf_relpos.translation.metrics import score_translations

REPO = Path(__file__).resolve().parents[1]
SOURCES = [source for source, _ in MEMORISED_PAIRS]
TARGETS = [target for _, target in MEMORISED_PAIRS]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_file_to_file_keeps_every_line_and_scores_against_references(memorised_model_folder, tmp_path, capsys):
    sources = [SOURCES[4], "", SOURCES[0], SOURCES[1], "   ", *SOURCES[2:4], SOURCES[5]]
    expected = [TARGETS[4], "", TARGETS[0], TARGETS[1], "", *TARGETS[2:4], TARGETS[5]]
    references = [TARGETS[4], "", TARGETS[0], "Der Hund sieht eine Katze.", "", *TARGETS[2:4], TARGETS[5]]
    source_file = write_lines(tmp_path / "src.txt", sources)
    write_lines(tmp_path / "ref.txt", references)
    main([str(memorised_model_folder), "--input", str(source_file), "--output", str(tmp_path / "hyp.txt"),
          "--reference", str(tmp_path / "ref.txt"), "--max_tokens", "16"])
    assert (tmp_path / "hyp.txt").read_text(encoding="utf-8") == "".join(line + "\n" for line in expected)
    printed = capsys.readouterr()
    scores = score_translations(expected, references)
    assert printed.out.splitlines() == [f"sacreBLEU {scores['bleu']:.2f}  ({scores['bleu_signature']})",
                                        f"chrF {scores['chrf']:.2f}  ({scores['chrf_signature']})"]
    assert scores["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert "translating" in printed.err  # the progress bar, on stderr


def test_stdin_to_stdout_in_a_fresh_process(memorised_model_folder, tmp_path):
    """Translations on stdout; with --no_progress nothing on stderr (no progress bar, not even transformers' while
    the weights load)."""
    completed = subprocess.run(
        [sys.executable, "-m", "hf_relpos.tools.translate", str(memorised_model_folder), "--no_progress"],
        input="".join(line + "\n" for line in SOURCES), capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "TRANSFORMERS_VERBOSITY": "error"})
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.split("\n") == [*TARGETS, ""]
    assert completed.stderr == ""


def test_a_file_and_stdin_with_windows_line_ends_and_a_bom_translate_as_the_plain_file(memorised_model_folder,
                                                                                       tmp_path, capsys, monkeypatch):
    plain = write_lines(tmp_path / "plain.txt", SOURCES)
    windows = tmp_path / "windows.txt"
    windows.write_bytes(("\ufeff" + "".join(line + "\r\n" for line in SOURCES)).encode("utf-8"))
    main([str(memorised_model_folder), "--no_progress", str(plain)])   # the input file after an option
    expected = capsys.readouterr().out
    assert expected.splitlines() == TARGETS
    main([str(memorised_model_folder), str(windows), "--no_progress", "--no_split_sentences"])
    assert capsys.readouterr().out == expected
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(windows.read_bytes())))
    main([str(memorised_model_folder), "--no_progress", "--no_split_sentences"])
    assert capsys.readouterr().out == expected
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"A dog.\nA cat\xff\n")))
    with pytest.raises(SystemExit):
        main([str(memorised_model_folder), "--no_progress"])
    assert capsys.readouterr().err.startswith("hf-relpos-translate: error: stdin:2: not UTF-8 text (")
    invalid = tmp_path / "invalid.txt"
    invalid.write_bytes(b"A dog.\nA cat\xff\n")
    with pytest.raises(SystemExit):
        main([str(memorised_model_folder), "--no_progress", str(invalid)])
    assert capsys.readouterr().err.startswith(f"hf-relpos-translate: error: --input {invalid}:2: not UTF-8 text (")


def test_generation_settings_default_to_the_model_and_flags_override_them(memorised_model_folder, tmp_path, capsys):
    folder = Path(shutil.copytree(memorised_model_folder, tmp_path / "model"))
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**generation, "max_length": 3}))
    source_file = write_lines(tmp_path / "src.txt", SOURCES[:2])
    main([str(folder), "--input", str(source_file), "--output", str(tmp_path / "cut.txt"), "--no_progress"])
    cut = (tmp_path / "cut.txt").read_text(encoding="utf-8").splitlines()
    assert all(TARGETS[index].startswith(line) and line != TARGETS[index] for index, line in enumerate(cut))
    assert "2 translation(s) reached the maximum length (max_new_tokens, else max_length)" in capsys.readouterr().err
    main([str(folder), "--input", str(source_file), "--output", str(tmp_path / "full.txt"), "--no_progress",
          "--max_length", "20", "--num_beams", "2", "--length_penalty", "1.0"])
    assert (tmp_path / "full.txt").read_text(encoding="utf-8").splitlines() == TARGETS[:2]


def test_no_repeat_ngram_size_stops_a_looping_translation(memorised_model_folder, tmp_path):
    """A model made to loop on one token (its logit raised, the end token's lowered): every translation repeats
    2-grams to the cap; under --no_repeat_ngram_size 2 none does."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    folder = tmp_path / "looping"
    model = AutoModelForSeq2SeqLM.from_pretrained(memorised_model_folder)
    tokenizer = AutoTokenizer.from_pretrained(memorised_model_folder)
    word = tokenizer(TARGETS[0].split()[1], add_special_tokens=False)["input_ids"][0]
    with torch.no_grad():
        model.final_logits_bias[..., word] = 30.0
        model.final_logits_bias[..., model.config.eos_token_id] = -30.0
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)

    def repeated_bigrams(line: str) -> int:
        tokens = tokenizer(line, add_special_tokens=False)["input_ids"]
        bigrams = list(zip(tokens[:-1], tokens[1:], strict=True))
        return len(bigrams) - len(set(bigrams))

    source_file = write_lines(tmp_path / "src.txt", SOURCES[:3])
    for flags, output in (([], "loops.txt"), (["--no_repeat_ngram_size", "2"], "blocked.txt")):
        main([str(folder), str(source_file), "--output", str(tmp_path / output), "--no_progress", *flags])
    loops = (tmp_path / "loops.txt").read_text(encoding="utf-8").splitlines()
    blocked = (tmp_path / "blocked.txt").read_text(encoding="utf-8").splitlines()
    assert len(loops) == len(blocked) == 3
    assert all(repeated_bigrams(line) > 0 for line in loops), loops
    assert not any(repeated_bigrams(line) for line in blocked), blocked


def test_a_line_of_several_sentences_is_translated_sentence_by_sentence(memorised_model_folder, tmp_path):
    """Three sentences on one line (two spaces, a form feed between them), and a blank line: each sentence translated
    and joined with one space; --no_split_sentences gives the model the line in one piece (which a sentence-trained
    model cuts short)."""
    source_file = write_lines(tmp_path / "src.txt", [f"{SOURCES[0]}  {SOURCES[1]}\x0c{SOURCES[2]}", "", SOURCES[3]])
    main([str(memorised_model_folder), source_file.as_posix(), "--output", str(tmp_path / "hyp.txt"), "--no_progress"])
    assert (tmp_path / "hyp.txt").read_text(encoding="utf-8").splitlines() == [
        f"{TARGETS[0]} {TARGETS[1]} {TARGETS[2]}", "", TARGETS[3]]
    main([str(memorised_model_folder), source_file.as_posix(), "--output", str(tmp_path / "whole.txt"),
          "--no_progress", "--no_split_sentences"])
    whole = (tmp_path / "whole.txt").read_text(encoding="utf-8").splitlines()
    assert whole[1:] == ["", TARGETS[3]] and whole[0] != f"{TARGETS[0]} {TARGETS[1]} {TARGETS[2]}"


def test_lines_of_chinese_sentences_are_translated_sentence_by_sentence_and_joined_per_line():
    """Sentences ended by 。！？ with no space after them are translated one by one; each line's translations are
    joined (with a space in a language written with spaces, without one in Chinese or Japanese) into one line."""
    english = {"他看见狗。": "He sees the dog.", "她打开门！": "She opens the door!", "孩子喜欢猫？": "Does the child like cats?",
               "I waited...": "Ich wartete...", "Then he came.": "Dann kam er."}
    japanese = {"他看见狗。": "彼は犬を見る。", "她打开门！": "彼女はドアを開ける！"}
    given = []

    def translate(table: dict[str, str]) -> Callable[[list[str]], list[str]]:
        def run(sentences: list[str]) -> list[str]:
            given.append(sentences)
            return [table[sentence] if sentence.strip() else "" for sentence in sentences]
        return run

    lines = ["他看见狗。她打开门！孩子喜欢猫？", "", "I waited... Then he came."]
    assert translate_by_sentence(lines, translate(english)) == [
        "He sees the dog. She opens the door! Does the child like cats?", "", "Ich wartete... Dann kam er."]
    assert given[0] == ["他看见狗。", "她打开门！", "孩子喜欢猫？", "", "I waited...", "Then he came."]
    assert translate_by_sentence(["他看见狗。她打开门！", "他看见狗。 她打开门！"], translate(japanese)) == [
        "彼は犬を見る。彼女はドアを開ける！"] * 2


def test_the_progress_bar_counts_the_sentences_it_translates(memorised_model_folder, tmp_path, capsys):
    """Lines split into sentences: the bar counts the sentences (4 here, the blank line generates nothing)."""
    source_file = write_lines(tmp_path / "src.txt", [f"{SOURCES[0]} {SOURCES[1]} {SOURCES[2]}", "", SOURCES[3]])
    main([str(memorised_model_folder), source_file.as_posix(), "--output", str(tmp_path / "hyp.txt")])
    assert re.search(r"translating: 100%.* 4/4 .*sentence", capsys.readouterr().err)
    main([str(memorised_model_folder), source_file.as_posix(), "--output", str(tmp_path / "whole.txt"),
          "--no_split_sentences"])
    assert re.search(r"translating: 100%.* 2/2 .*line", capsys.readouterr().err)


def test_token_batches_hold_the_budget_and_cover_every_line():
    lengths = [3, 9, 1, 4, 4, 12, 2, 7]
    batches = token_batches(lengths, max_tokens=10)
    assert sorted(index for batch in batches for index in batch) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) == 1 or len(batch) * max(lengths[index] for index in batch) <= 10
    assert [5] in batches  # longer than the budget: alone


@pytest.mark.parametrize(("flags", "message"), [
    (["--num_beams", "0"], "--num_beams must be a positive integer, got 0"),
    (["--no_repeat_ngram_size", "0"], "--no_repeat_ngram_size must be a positive integer, got 0"),
    (["--input", "missing.txt"], "--input 'missing.txt': No such file or directory"),
    (["missing.txt"], "--input 'missing.txt': No such file or directory"),
    (["--reference", "missing.txt"], "--reference 'missing.txt': No such file or directory"),
    (["a.txt", "--input", "b.txt"], "two source files: INPUT 'a.txt' and --input 'b.txt'; give one"),
    (["--dtype", "fp16"], "argument --dtype: invalid choice: 'fp16' (choose from "),
    (["--device", "gpu"], "argument --device: 'gpu' is not one of auto, cpu, cuda, cuda:N"),
    (["--device", "cuda:64"], "argument --device: 'cuda:64': this machine has"),
    (["--attn_implementation", "flash"], "argument --attn_implementation: attn_implementation 'flash' is not a "
                                         "registered attention kernel: one of ['eager', "),
    (["--reference", "src.txt", "--tokenize", "zh-cn"], "argument --tokenize: invalid choice: 'zh-cn' (choose from "),
    (["--tokenize", "zh"], "--tokenize sets how --reference is scored: give --reference"),
    (["--target_lang", "zh"], "--target_lang sets how --reference is scored: give --reference"),
])
def test_bad_flags_are_one_error_line(memorised_model_folder, tmp_path, capsys, flags, message, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main([str(memorised_model_folder), *flags])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_bleu_is_tokenized_for_the_target_language_unless_tokenize_names_one(memorised_model_folder, tmp_path,
                                                                              capsys):
    """The default tokenization is the training run's (the bleu_tokenize of the folder's run record), else sacreBLEU's
    choice for the target language: --target_lang, else the target_lang of the run record (none here: 13a);
    --tokenize wins over both. A record written before it held bleu_tokenize scores as before."""
    source_file = write_lines(tmp_path / "src.txt", SOURCES)
    reference_file = write_lines(tmp_path / "ref.txt", TARGETS)
    folder = shutil.copytree(memorised_model_folder, tmp_path / "model")
    scoring = [str(folder), str(source_file), "--output", str(tmp_path / "hyp.txt"), "--no_progress", "--reference",
               str(reference_file)]

    def signature(*flags: str) -> str:
        main([*scoring, *flags])
        return re.search(r"^sacreBLEU \S+  \((.*)\)$", capsys.readouterr().out, re.MULTILINE).group(1)

    assert "|tok:13a|" in signature()
    assert "|tok:zh|" in signature("--target_lang", "zh")
    (folder / RUN_RECORD_FILE).write_text(json.dumps(RunRecord(target_lang="zh").to_json()), encoding="utf-8")
    assert "|tok:zh|" in signature()
    assert "|tok:13a|" in signature("--tokenize", "13a")
    assert "|tok:char|" in signature("--target_lang", "de", "--tokenize", "char")
    # a ja run scored with char BLEU: scored so again, without sacrebleu[ja]
    (folder / RUN_RECORD_FILE).write_text(json.dumps(RunRecord(target_lang="ja", bleu_tokenize="char").to_json()),
                                          encoding="utf-8")
    assert "|tok:char|" in signature() and "|tok:char|" in signature("--target_lang", "zh")
    assert "|tok:13a|" in signature("--tokenize", "13a")
    older = {name: value for name, value in RunRecord(target_lang="zh").to_json().items() if name != "bleu_tokenize"}
    (folder / RUN_RECORD_FILE).write_text(json.dumps(older), encoding="utf-8")
    assert "|tok:zh|" in signature()


@pytest.mark.skipif(importlib.util.find_spec("MeCab") is not None, reason="sacrebleu[ja] is installed")
def test_japanese_bleu_without_its_extra_is_refused_before_the_model_loads(memorised_model_folder, tmp_path, capsys,
                                                                          monkeypatch):
    monkeypatch.setattr("hf_relpos.tools.translate.AutoModelForSeq2SeqLM.from_pretrained",
                        lambda *args, **kwargs: pytest.fail("loaded the model before setting up BLEU"))
    source_file = write_lines(tmp_path / "src.txt", SOURCES)
    with pytest.raises(SystemExit) as exited:
        main([str(memorised_model_folder), str(source_file), "--reference", str(source_file), "--target_lang", "ja"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("hf-relpos-translate: error: --tokenize: ") and "pip install sacrebleu[ja]" in error
    assert error.endswith("; or name another tokenization with --tokenize (e.g. char)\n")
    assert len(error.splitlines()) == 1


def test_a_missing_source_file_is_refused_before_the_model_loads(memorised_model_folder, tmp_path, capsys,
                                                                 monkeypatch):
    monkeypatch.setattr("hf_relpos.tools.translate.AutoModelForSeq2SeqLM.from_pretrained",
                        lambda *args, **kwargs: pytest.fail("loaded the model before reading the source file"))
    with pytest.raises(SystemExit) as exited:
        main([str(memorised_model_folder), "--input", str(tmp_path / "missing.txt")])
    assert exited.value.code == 2
    assert "--input" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "name"), [("--input", "test.jsonl"), ("--input", "test.TSV"),
                                            ("--reference", "test.csv"), ("--reference", "test.json")])
def test_a_file_of_records_is_refused_before_the_model_loads(memorised_model_folder, tmp_path, capsys, monkeypatch,
                                                             flag, name):
    """A .jsonl/.json/.csv/.tsv file (the training app's formats) is one error, not its raw lines translated or
    scored as sentences."""
    monkeypatch.setattr("hf_relpos.tools.translate.AutoModelForSeq2SeqLM.from_pretrained",
                        lambda *args, **kwargs: pytest.fail("loaded the model before refusing the file"))
    records = tmp_path / name
    records.write_text(json.dumps({"translation": {"en": SOURCES[0], "de": TARGETS[0]}}) + "\n", encoding="utf-8")
    plain = write_lines(tmp_path / "plain.txt", SOURCES[:1])
    given = [str(records), "--reference", str(plain)] if flag == "--input" else [str(plain), "--reference", str(records)]
    with pytest.raises(SystemExit) as exited:
        main([str(memorised_model_folder), *given])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith(f"hf-relpos-translate: error: {flag} {str(records)!r} is a ") and "file of records" in error
    assert len(error.splitlines()) == 1


@pytest.mark.parametrize("model", ["outputs/dmeo", "./dmeo", "runs/a/b"])
def test_a_mistyped_model_folder_is_one_error_without_a_hub_lookup(tmp_path, capsys, monkeypatch, model):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    monkeypatch.setattr("hf_relpos.tools.translate.AutoTokenizer.from_pretrained",
                        lambda *args, **kwargs: pytest.fail("looked the folder up on the Hub"))
    with pytest.raises(SystemExit) as exited:
        main([model])
    assert exited.value.code == 2
    assert f"no model folder {model!r}" in capsys.readouterr().err


@pytest.mark.parametrize("sources", [[], ["", "   "]], ids=["no lines", "blank lines"])
def test_a_source_with_nothing_to_translate_gives_as_many_blank_lines(memorised_model_folder, tmp_path, sources):
    source_file = write_lines(tmp_path / "src.txt", sources)
    main([str(memorised_model_folder), "--input", str(source_file), "--output", str(tmp_path / "hyp.txt")])
    assert (tmp_path / "hyp.txt").read_text(encoding="utf-8") == "\n" * len(sources)


@pytest.mark.parametrize(("output", "message"), [
    ("missing/hyp.txt", "--output 'missing/hyp.txt': no folder 'missing' to write it in"),
    (".", "--output '.': is a folder"),
])
def test_an_output_that_cannot_be_written_is_refused_before_the_model_loads(memorised_model_folder, tmp_path, capsys,
                                                                          monkeypatch, output, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("hf_relpos.tools.translate.AutoModelForSeq2SeqLM.from_pretrained",
                        lambda *args, **kwargs: pytest.fail("loaded the model before checking --output"))
    source_file = write_lines(tmp_path / "src.txt", SOURCES[:1])
    with pytest.raises(SystemExit) as exited:
        main([str(memorised_model_folder), "--input", str(source_file), "--output", output])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_an_empty_source_with_references_has_nothing_to_score(memorised_model_folder, tmp_path, capsys):
    source_file = write_lines(tmp_path / "src.txt", [])
    reference_file = write_lines(tmp_path / "ref.txt", [])
    with pytest.raises(SystemExit) as exited:
        main([str(memorised_model_folder), "--input", str(source_file), "--reference", str(reference_file)])
    assert exited.value.code == 2
    assert "nothing to score: the source and --reference have no lines" in capsys.readouterr().err


def test_the_source_file_may_follow_the_model_folder(memorised_model_folder, tmp_path, capsys):
    source_file = write_lines(tmp_path / "src.txt", SOURCES[:2])
    main([str(memorised_model_folder), str(source_file), "--no_progress"])
    assert capsys.readouterr().out.splitlines() == TARGETS[:2]


def test_help_shows_defaults_only_where_an_option_has_one(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in shown and "(default: False)" not in shown and "(default: True)" not in shown
    assert "(default: stdin)" in shown and "(default: 4096)" in shown


def test_reference_with_another_line_count_is_refused(memorised_model_folder, tmp_path, capsys):
    source_file = write_lines(tmp_path / "src.txt", SOURCES[:3])
    write_lines(tmp_path / "ref.txt", TARGETS[:2])
    with pytest.raises(SystemExit) as exited:
        main([str(memorised_model_folder), "--input", str(source_file), "--reference", str(tmp_path / "ref.txt")])
    assert exited.value.code == 2
    assert "3 source lines but 2 reference lines" in capsys.readouterr().err


def test_dtype_device_and_kernel_flags_reach_the_model(memorised_model_folder, tmp_path, capsys, monkeypatch):
    from transformers import AutoModelForSeq2SeqLM

    loaded = []
    load = AutoModelForSeq2SeqLM.from_pretrained
    monkeypatch.setattr("hf_relpos.tools.translate.AutoModelForSeq2SeqLM.from_pretrained",
                        lambda *args, **kwargs: loaded.append(load(*args, **kwargs)) or loaded[-1])
    source_file = write_lines(tmp_path / "src.txt", SOURCES[:3])
    main([str(memorised_model_folder), str(source_file), "--no_progress", "--dtype", "float64", "--device", "cpu",
          "--attn_implementation", "eager"])
    assert capsys.readouterr().out.splitlines() == TARGETS[:3]
    (model,) = loaded
    assert model.dtype == torch.float64 and model.device.type == "cpu"
    assert model.config._attn_implementation == "eager"
    main([str(memorised_model_folder), str(source_file), "--no_progress", "--device", "auto"])
    assert loaded[-1].dtype == torch.float32  # the saved dtype
    assert loaded[-1].device.type == ("cuda" if torch.cuda.is_available() else "cpu")
