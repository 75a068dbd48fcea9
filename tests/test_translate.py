"""`python -m hf_relpos.tools.translate MODEL_DIR`: a file (or stdin) translated line by line, batched by tokens, scored
against references with sacreBLEU and chrF."""

from __future__ import annotations

import bz2
import contextlib
import errno
import gzip
import importlib.util
import io
import itertools
import json
import lzma
import os
import queue
import re
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import MEMORISED_PAIRS, checkout_first_on_path, make_unwritable, unreachable_hub

from hf_relpos.publish.records import RUN_RECORD_FILE, RunRecord
from hf_relpos.tools import translate as translate_module
from hf_relpos.tools.sentences import translate_by_sentence
from hf_relpos.tools.translate import main, token_batches
from hf_relpos.translation.metrics import score_translations

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
    assert "translating" in printed.err  # the progress bar, on stderr, counting sentences (a line of several split)
    assert " sentences [" in printed.err and " sentences/s]" in printed.err and "0sentence" not in printed.err


def test_references_no_translation_can_hold_are_named_in_a_warning_before_translating(memorised_model_folder,
                                                                                        tmp_path, capsys):
    """A reference the tokenizer gives back otherwise (NFC composes "a" + U+0308; U+095B becomes two code points)
    cannot be matched by any translation: --reference says so, as the training app does of its splits, and scores
    it as it is; clean references give no such warning."""
    source_file = write_lines(tmp_path / "src.txt", SOURCES[:3])
    write_lines(tmp_path / "ref.txt", [TARGETS[0], "Ma\u0308dchen", "\u095bरूर"])
    main([str(memorised_model_folder), "--input", str(source_file), "--output", str(tmp_path / "hyp.txt"),
          "--reference", str(tmp_path / "ref.txt"), "--no_progress"])
    err = capsys.readouterr().err
    assert ("hf-relpos-translate: warning: --reference: 2 of the 3 references hold text the tokenizer gives back "
            "otherwise (its normaliser, NFC, changes it, or it cannot encode it), first in reference 2; characters no "
            "translation can write as they are: U+0308 COMBINING DIAERESIS, U+095B DEVANAGARI LETTER ZA.") in err
    write_lines(tmp_path / "ref.txt", TARGETS[:3])
    main([str(memorised_model_folder), "--input", str(source_file), "--output", str(tmp_path / "hyp.txt"),
          "--reference", str(tmp_path / "ref.txt"), "--no_progress"])
    assert "warning" not in capsys.readouterr().err


def test_stdin_to_stdout_in_a_fresh_process(memorised_model_folder, tmp_path):
    """Translations on stdout; with --no_progress nothing on stderr (no progress bar, not even transformers' while
    the weights load)."""
    completed = subprocess.run(
        [sys.executable, "-m", "hf_relpos.tools.translate", str(memorised_model_folder), "--no_progress"],
        input="".join(line + "\n" for line in SOURCES), capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={**os.environ, "PYTHONPATH": checkout_first_on_path(), "TRANSFORMERS_VERBOSITY": "error"})
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



@pytest.mark.parametrize("argv", [["--input", "-"], ["-"], ["--input", "-", "--output", "-"], ["-", "--output", "-"]])
def test_a_dash_is_stdin_and_stdout_as_in_unix_tools(memorised_model_folder, tmp_path, capsys, monkeypatch, argv):
    """"-" as --input (or INPUT) reads stdin and as --output writes stdout, as sacrebleu and Unix tools read it; no
    file named "-" is looked for or written."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("".join(f"{line}\n" for line in SOURCES).encode())))
    main([str(memorised_model_folder), "--no_progress", *argv])
    assert capsys.readouterr().out.splitlines() == TARGETS
    assert not (tmp_path / "-").exists()
    assert "-: stdin" in " ".join(translate_module.build_parser().format_help().split())
# lines of one, two and no sentences, blank ones among them: what each chunk size must translate as the whole input
MIXED_SOURCES = [SOURCES[4], "", f"{SOURCES[0]} {SOURCES[1]}", SOURCES[2], "   ", SOURCES[3],
                 f"{SOURCES[5]}  {SOURCES[0]}", SOURCES[1]]
MIXED_TARGETS = [TARGETS[4], "", f"{TARGETS[0]} {TARGETS[1]}", TARGETS[2], "", TARGETS[3], f"{TARGETS[5]} {TARGETS[0]}",
                 TARGETS[1]]


@pytest.mark.parametrize("buffer_lines", ["1", "3", "100"])
def test_any_buffer_size_gives_the_whole_input_s_translations_and_scores(memorised_model_folder, tmp_path, capsys,
                                                                         monkeypatch, buffer_lines):
    """The input read and translated in chunks of 1, 3 or more lines than it has (one chunk, as the whole input was
    translated before --buffer_lines): the same lines, from a file or stdin, sentence by sentence or whole, and the
    same scores against references (float64: no batching difference can change a token)."""
    source_file = write_lines(tmp_path / "src.txt", MIXED_SOURCES)
    references = [*MIXED_TARGETS[:3], "Der kleine Vogel schläft.", *MIXED_TARGETS[4:]]
    reference_file = write_lines(tmp_path / "ref.txt", references)
    settings = [str(memorised_model_folder), "--no_progress", "--dtype", "float64", "--buffer_lines", buffer_lines]
    main([*settings, str(source_file), "--output", str(tmp_path / "hyp.txt"), "--reference", str(reference_file)])
    assert (tmp_path / "hyp.txt").read_text(encoding="utf-8") == "".join(line + "\n" for line in MIXED_TARGETS)
    scores = score_translations(MIXED_TARGETS, references)
    assert scores["bleu"] < 100
    assert capsys.readouterr().out.splitlines() == [f"sacreBLEU {scores['bleu']:.2f}  ({scores['bleu_signature']})",
                                                    f"chrF {scores['chrf']:.2f}  ({scores['chrf_signature']})"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(source_file.read_bytes())))
    main(settings)
    assert capsys.readouterr().out == "".join(line + "\n" for line in MIXED_TARGETS)
    main([*settings, "--buffer_lines", "100", "--no_split_sentences", str(source_file)])
    whole = capsys.readouterr().out
    assert whole.splitlines()[2] != MIXED_TARGETS[2] and len(whole.splitlines()) == len(MIXED_SOURCES)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(source_file.read_bytes())))
    main([*settings, "--no_split_sentences"])
    assert capsys.readouterr().out == whole


def test_stdin_is_translated_as_it_arrives(memorised_model_folder, tmp_path):
    """A pipe's first chunk of lines is translated and on stdout while its writer has not closed it yet."""
    process = subprocess.Popen(
        [sys.executable, "-m", "hf_relpos.tools.translate", str(memorised_model_folder), "--no_progress",
         "--buffer_lines", "2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": checkout_first_on_path(), "TRANSFORMERS_VERBOSITY": "error"})
    printed = queue.Queue()
    threading.Thread(target=lambda: [printed.put(line) for line in process.stdout] + [printed.put(None)],
                     daemon=True).start()

    def printed_line() -> str:
        line = printed.get(timeout=300)   # a job that prints nothing until stdin closes fails here
        assert line is not None, f"stdout closed: {process.stderr.read()[-3000:]}"
        return line

    with process:
        process.stdin.write(f"{SOURCES[0]}\n{SOURCES[1]}\n")
        process.stdin.flush()
        first = [printed_line(), printed_line()]
        assert first == [f"{TARGETS[0]}\n", f"{TARGETS[1]}\n"]
        assert process.poll() is None   # still reading its stdin
        process.stdin.write("".join(line + "\n" for line in SOURCES[2:]))
        process.stdin.close()
        assert process.wait(timeout=300) == 0, process.stderr.read()[-3000:]
    rest = [printed.get(timeout=10) for _ in SOURCES[2:]]
    assert [*first, *rest] == [target + "\n" for target in TARGETS] and printed.get(timeout=10) is None


def test_a_reader_that_stops_stops_the_job_without_a_traceback(memorised_model_folder, tmp_path):
    """stdout's reader gone after the first line (`| head -1`): the next chunk's translation cannot be written, and
    the job ends with status 1 and nothing on stderr."""
    process = subprocess.Popen(
        [sys.executable, "-m", "hf_relpos.tools.translate", str(memorised_model_folder), "--no_progress",
         "--buffer_lines", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": checkout_first_on_path(), "TRANSFORMERS_VERBOSITY": "error"})
    with process:
        process.stdin.write(f"{SOURCES[0]}\n")
        process.stdin.flush()
        assert process.stdout.readline() == f"{TARGETS[0]}\n"
        process.stdout.close()
        with contextlib.suppress(BrokenPipeError):
            process.stdin.write("".join(line + "\n" for line in SOURCES[1:]))
            process.stdin.close()
        assert process.wait(timeout=300) == 1
        assert process.stderr.read() == ""


def test_a_line_that_is_not_utf8_in_a_later_chunk_is_named_and_output_is_not_written(memorised_model_folder,
                                                                                     tmp_path, capsys, monkeypatch):
    """Line 5, in the third chunk of 2: the error names stdin's (or the file's) line 5; what stdout got before is the
    first chunks' translations, and --output is not written."""
    data = "".join(line + "\n" for line in SOURCES[:4]).encode() + b"A cat\xff\n" + f"{SOURCES[5]}\n".encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    with pytest.raises(SystemExit) as exited:
        main([str(memorised_model_folder), "--no_progress", "--buffer_lines", "2"])
    assert exited.value.code == 2
    printed = capsys.readouterr()
    assert printed.out.splitlines() == TARGETS[:4]
    assert printed.err.startswith("hf-relpos-translate: error: stdin:5: not UTF-8 text (")
    invalid = tmp_path / "invalid.txt"
    invalid.write_bytes(data)
    with pytest.raises(SystemExit):
        main([str(memorised_model_folder), "--no_progress", "--buffer_lines", "2", str(invalid), "--output",
              str(tmp_path / "hyp.txt")])
    assert capsys.readouterr().err.startswith(f"hf-relpos-translate: error: --input {invalid}:5: not UTF-8 text (")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["invalid.txt"]


@pytest.mark.parametrize("old_output", [None, "an earlier job's translations\n"], ids=["new", "replaced"])
def test_a_job_that_fails_mid_way_leaves_no_part_of_its_output(memorised_model_folder, tmp_path, monkeypatch,
                                                               old_output):
    """--output is written as the chunks are translated into a file beside it, renamed to it when the job ends: the
    translation failing on the second chunk leaves the old file (or none), and no temporary."""
    output = tmp_path / "out" / "hyp.txt"
    output.parent.mkdir()
    if old_output is not None:
        output.write_text(old_output, encoding="utf-8")
    translate_lines = translate_module.translate_lines
    partial = []

    def failing_on_the_second_chunk(lines, *args, **kwargs):
        if partial or lines[0] != SOURCES[0]:
            (temporary,) = [path for path in output.parent.iterdir() if path != output]
            partial.append(temporary.read_text(encoding="utf-8"))
            raise RuntimeError("the GPU fell off the bus")
        partial.append(None)
        return translate_lines(lines, *args, **kwargs)

    monkeypatch.setattr(translate_module, "translate_lines", failing_on_the_second_chunk)
    source_file = write_lines(tmp_path / "src.txt", SOURCES)
    with pytest.raises(RuntimeError, match="fell off the bus"):
        main([str(memorised_model_folder), str(source_file), "--output", str(output), "--no_progress",
              "--buffer_lines", "3", "--no_split_sentences"])
    assert partial == [None, "".join(target + "\n" for target in TARGETS[:3])]  # written as it went
    assert [path.name for path in output.parent.iterdir()] == ([] if old_output is None else ["hyp.txt"])
    assert old_output is None or output.read_text(encoding="utf-8") == old_output


def test_stdin_with_another_line_count_than_the_references_is_refused_as_it_ends(memorised_model_folder, tmp_path,
                                                                                 capsys, monkeypatch):
    """stdin's lines are counted when it ends (translated in chunks by then): the mismatch is one error, and --output
    is not written."""
    write_lines(tmp_path / "ref.txt", TARGETS[:2])
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("".join(line + "\n" for line in SOURCES[:3])
                                                                   .encode())))
    with pytest.raises(SystemExit) as exited:
        main([str(memorised_model_folder), "--reference", str(tmp_path / "ref.txt"), "--output",
              str(tmp_path / "hyp.txt"), "--buffer_lines", "1", "--no_progress"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (f"hf-relpos-translate: error: 3 source lines (stdin) but 2 reference lines "
                                       f"(--reference {str(tmp_path / 'ref.txt')!r}): each source line needs its "
                                       "reference on the same line\n")
    assert not (tmp_path / "hyp.txt").exists()


def translations_cut_with_a_warning(folder: Path, source_file: Path, output: Path, capsys) -> list[str]:
    """`folder`'s translations of the first two SOURCES into `output`, each a strict prefix of its target, and the
    one warning that both reached the maximum length."""
    main([str(folder), "--input", str(source_file), "--output", str(output), "--no_progress"])
    cut = output.read_text(encoding="utf-8").splitlines()
    assert all(TARGETS[index].startswith(line) and line != TARGETS[index] for index, line in enumerate(cut))
    assert "2 translation(s) reached the maximum length (max_new_tokens, else max_length)" in capsys.readouterr().err
    return cut


def test_generation_settings_default_to_the_model_and_flags_override_them(memorised_model_folder, tmp_path, capsys):
    folder = Path(shutil.copytree(memorised_model_folder, tmp_path / "model"))
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**generation, "max_length": 3}))
    source_file = write_lines(tmp_path / "src.txt", SOURCES[:2])
    cut = translations_cut_with_a_warning(folder, source_file, tmp_path / "cut.txt", capsys)
    main([str(folder), "--input", str(source_file), "--output", str(tmp_path / "cut.txt"), "--no_progress",
          "--buffer_lines", "1"])   # counted over the chunks, in one warning
    assert capsys.readouterr().err.count("translation(s) reached") == 1
    assert (tmp_path / "cut.txt").read_text(encoding="utf-8").splitlines() == cut
    main([str(folder), "--input", str(source_file), "--output", str(tmp_path / "full.txt"), "--no_progress",
          "--max_length", "20", "--num_beams", "2", "--length_penalty", "1.0"])
    assert (tmp_path / "full.txt").read_text(encoding="utf-8").splitlines() == TARGETS[:2]


@pytest.mark.parametrize("engine", ["pytorch", "ctranslate2"])
def test_a_translation_cut_by_a_forced_end_token_at_the_maximum_length_is_counted(memorised_model_folder, tmp_path,
                                                                                  capsys, engine):
    """A generation config with `forced_eos_token_id` (MarianMT's, which a converted model keeps) ends a translation
    cut at the maximum length with the end token: it is counted as reaching the maximum length all the same (it was
    not: a translation holding an end token was taken for a finished one, so a converted model's cut lines went
    unreported), and one that ends before it is not."""
    folder = Path(shutil.copytree(memorised_model_folder, tmp_path / "model"))
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**generation, "max_length": 4,
                                                               "forced_eos_token_id": generation["eos_token_id"]}))
    if engine == "ctranslate2":
        pytest.importorskip("ctranslate2")
        from hf_relpos.tools.export import export_ctranslate2
        folder = export_ctranslate2(folder, tmp_path / "ct2")
    source_file = write_lines(tmp_path / "src.txt", SOURCES[:2])
    translations_cut_with_a_warning(folder, source_file, tmp_path / "cut.txt", capsys)
    main([str(folder), "--input", str(source_file), "--output", str(tmp_path / "full.txt"), "--no_progress",
          "--max_length", "20"])
    assert (tmp_path / "full.txt").read_text(encoding="utf-8").splitlines() == TARGETS[:2]
    assert "reached" not in capsys.readouterr().err


def test_a_model_folder_whose_weights_file_is_cut_short_is_one_error_line(memorised_model_folder, tmp_path, capsys):
    """A weights file cut short (a copy or download broken off) was safetensors' traceback."""
    folder = Path(shutil.copytree(memorised_model_folder, tmp_path / "model"))
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    source_file = write_lines(tmp_path / "src.txt", SOURCES[:1])
    with pytest.raises(SystemExit) as stopped:
        main([str(folder), "--input", str(source_file), "--output", str(tmp_path / "hyp.txt"), "--no_progress"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"hf-relpos-translate: error: the model folder {str(folder)!r}: its weights file is "
                            "cut short or corrupt (")
    assert not (tmp_path / "hyp.txt").exists()


def test_one_translation_a_line_when_the_saved_generation_config_returns_several(memorised_model_folder, tmp_path):
    """A generation config saved with num_return_sequences 2 (for the pipeline's alternatives) gave generate two rows
    per source, which were written as the translations of the next lines: each line still gets its own best one."""
    folder = Path(shutil.copytree(memorised_model_folder, tmp_path / "model"))
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**generation, "num_beams": 2,
                                                               "num_return_sequences": 2}))
    source_file = write_lines(tmp_path / "src.txt", SOURCES[:4])
    main([str(folder), "--input", str(source_file), "--output", str(tmp_path / "hyp.txt"), "--no_progress"])
    assert (tmp_path / "hyp.txt").read_text(encoding="utf-8").splitlines() == TARGETS[:4]


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


def test_a_translation_that_decodes_to_several_lines_is_written_as_one(memorised_model_folder, tmp_path,
                                                                         monkeypatch):
    """A line break in a decoded translation (a vocabulary may hold one) becomes a space: each input line still gives
    exactly one output line, so the output stays aligned with the input and the references."""
    from transformers import AutoTokenizer

    load = AutoTokenizer.from_pretrained

    def loading(*args, **kwargs):
        tokenizer = load(*args, **kwargs)
        decode = tokenizer.decode
        tokenizer.decode = lambda *ids, **options: decode(*ids, **options).replace(" ", "\n", 1).replace(" ", "\r\n", 1)
        return tokenizer

    monkeypatch.setattr("hf_relpos.tools.translate.AutoTokenizer.from_pretrained", loading)
    source_file = write_lines(tmp_path / "src.txt", SOURCES)
    main([str(memorised_model_folder), str(source_file), "--output", str(tmp_path / "hyp.txt"), "--no_progress"])
    assert (tmp_path / "hyp.txt").read_text(encoding="utf-8").splitlines() == TARGETS


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


def test_whitespace_at_a_line_s_ends_is_no_part_of_its_sentences(memorised_model_folder, tmp_path):
    """Whitespace at either end of a line is kept from the model as whitespace between sentences is (the tokenizer
    makes tokens of it: "  The house is red." was translated otherwise than "The house is red.", and a line's trailing
    whitespace reached the model where its last sentence did not end in . ! ?); the translation is written without
    it."""
    given = []

    def translate(sentences: list[str]) -> list[str]:
        given.extend(sentences)
        return [sentence.strip().upper() for sentence in sentences]

    assert translate_by_sentence(["  A b.", "\tA b. C d.  ", " ", " No end "], translate) == [
        "A B.", "A B. C D.", "", "NO END"]
    assert [sentence for sentence in given if sentence.strip()] == ["A b.", "A b.", "C d.", "No end"]
    assert all(sentence == sentence.strip() for sentence in given if sentence.strip())
    source_file = write_lines(tmp_path / "src.txt", [f"  {SOURCES[3]}", f"\t{SOURCES[4]}  {SOURCES[0]}  "])
    main([str(memorised_model_folder), source_file.as_posix(), "--output", str(tmp_path / "hyp.txt"), "--no_progress"])
    assert (tmp_path / "hyp.txt").read_text(encoding="utf-8").splitlines() == [TARGETS[3], f"{TARGETS[4]} {TARGETS[0]}"]


def test_a_line_opening_with_a_language_tag_has_it_in_front_of_each_of_its_sentences():
    """A multilingual model's line ">>deu<< A b. C d." is translated sentence by sentence: each sentence gets the
    tags that opened the line (or the last sentence that opened with tags of its own), which the later ones lacked
    (translated into no chosen language); a line without a tag, and a tag inside a sentence, are left as they are."""
    given = []

    def translate(sentences: list[str]) -> list[str]:
        given.extend(sentences)
        return [sentence.upper() for sentence in sentences]

    tags = {">>deu<<", ">>fra<<"}
    lines = [">>deu<< A b. C d.", " >>fra<<  >>deu<< E f.\n\nG h.", "I j. K >>deu<< l.", ">>fra<<",
             ">>deu<< The man. >>fra<< The dog. The cat."]
    translate_by_sentence(lines, translate, tags)
    assert given == [">>deu<< A b.", ">>deu<< C d.", "", ">>fra<<  >>deu<< E f.", ">>fra<<  >>deu<< G h.", "I j.",
                     "K >>deu<< l.", ">>fra<<", ">>deu<< The man.", ">>fra<< The dog.", ">>fra<< The cat."]


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
    main([str(memorised_model_folder), source_file.as_posix(), "--output", str(tmp_path / "hyp.txt"),
          "--buffer_lines", "1"])   # one bar for the whole job, counting on over the chunks
    (bar,) = [line for line in capsys.readouterr().err.split("\n") if "translating" in line]
    assert re.fullmatch(r"translating: 100%.* 4/4 .*sentence.*", bar.split("\r")[-1])


def test_token_batches_hold_the_budget_and_cover_every_line():
    lengths = [3, 9, 1, 4, 4, 12, 2, 7]
    batches = token_batches(lengths, max_tokens=10)
    assert sorted(index for batch in batches for index in batch) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) == 1 or len(batch) * max(lengths[index] for index in batch) <= 10
    assert [5] in batches  # longer than the budget: alone


def test_token_batches_go_longest_first_with_lines_of_similar_length_together():
    """Lines sorted longest first (the largest batch is the first one) and cut where the next line would take the
    batch's count x longest over the budget: 12 alone (over it), 9, 7, then 4 + 4 (8), then 3 + 2 + 1 (3 x 3 = 9)."""
    assert token_batches([3, 9, 1, 4, 4, 12, 2, 7], max_tokens=10) == [[5], [1], [7], [3, 4], [0, 6, 2]]


@pytest.mark.parametrize(("flags", "message"), [
    (["--num_beams", "0"], "--num_beams must be a positive integer, got 0"),
    (["--no_repeat_ngram_size", "0"], "--no_repeat_ngram_size must be a positive integer, got 0"),
    (["--buffer_lines", "0"], "--buffer_lines must be a positive integer, got 0"),
    (["--max_length", "1"], "--max_length must be at least 2 (it counts the decoder start token), got 1"),
    (["--length_penalty", "nan"], "--length_penalty must be a finite number, got nan"),
    (["--length_penalty", "inf"], "--length_penalty must be a finite number, got inf"),
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


class ReadsFailingAfter(io.BytesIO):
    """A file's bytes whose reads past the first `good` bytes raise an OSError of the disk (EIO)."""

    def __init__(self, data: bytes, good: int) -> None:
        super().__init__(data)
        self.good = good

    def _fail_past_good(self) -> None:
        if self.tell() >= self.good:
            raise OSError(errno.EIO, "Input/output error")

    def read(self, size: int | None = -1) -> bytes:
        self._fail_past_good()
        return super().read(size)

    def __next__(self) -> bytes:
        self._fail_past_good()
        return super().__next__()


@pytest.mark.parametrize(("flag", "scored"), [("--input", False), ("--input", True), ("--reference", True)])
def test_an_io_error_reading_the_source_or_references_is_one_error_line(memorised_model_folder, tmp_path, capsys,
                                                                       monkeypatch, flag, scored):
    """An OSError of the file's own reads (EIO) after its first line, while --input is translated (its first line
    is, already), while it is counted against --reference, or while --reference is read: one error line naming the
    flag, the file and the reason, exit status 2, --output not written. An --input read error was a traceback."""
    source_file = write_lines(tmp_path / "src.txt", SOURCES[:3])
    reference_file = write_lines(tmp_path / "ref.txt", TARGETS[:3])
    failing = source_file if flag == "--input" else reference_file
    real_open = open

    def open_failing(path, *args, **kwargs):
        if Path(path) == failing:
            data = failing.read_bytes()
            return ReadsFailingAfter(data, data.index(b"\n") + 1)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(translate_module, "open", open_failing, raising=False)
    output = tmp_path / "hyp.txt"
    with pytest.raises(SystemExit) as exited:
        main([str(memorised_model_folder), "--input", str(source_file), "--output", str(output), "--buffer_lines", "1",
              "--no_progress", *(["--reference", str(reference_file)] if scored else [])])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.splitlines() == [f"hf-relpos-translate: error: {flag} {str(failing)!r}: Input/output error"], error
    assert not output.exists()


@pytest.mark.parametrize("scored", [False, True])
def test_an_io_error_reading_stdin_is_one_error_line(memorised_model_folder, tmp_path, capsys, monkeypatch, scored):
    """An OSError of stdin's own reads (EIO) after its first line, which is translated already (with --reference,
    stdin is counted as it ends, not before): one error line `stdin: Input/output error`, exit status 2, --output
    not written, as for --input (`test_an_io_error_reading_the_source_or_references_is_one_error_line`)."""
    reference_file = write_lines(tmp_path / "ref.txt", TARGETS[:3])
    data = "".join(line + "\n" for line in SOURCES[:3]).encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(ReadsFailingAfter(data, data.index(b"\n") + 1)))
    output = tmp_path / "hyp.txt"
    with pytest.raises(SystemExit) as exited:
        main([str(memorised_model_folder), "--output", str(output), "--buffer_lines", "1", "--no_progress",
              *(["--reference", str(reference_file)] if scored else [])])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.splitlines() == ["hf-relpos-translate: error: stdin: Input/output error"], error
    assert not output.exists()


@pytest.mark.parametrize(("flag", "name"), [("--input", "test.jsonl"), ("--input", "test.TSV"),
                                            ("--reference", "test.csv"), ("--reference", "test.json"),
                                            ("--input", "test.parquet"), ("--reference", "test.arrow")])
def test_a_file_of_records_is_refused_before_the_model_loads(memorised_model_folder, tmp_path, capsys, monkeypatch,
                                                             flag, name):
    """A .jsonl/.json/.csv/.tsv/.parquet/.arrow file (the training app's formats) is one error, not its raw lines
    translated or scored as sentences."""
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
    error = capsys.readouterr().err
    assert f"hf-relpos-translate: error: model {model!r}: no such folder (the nearest existing folder is " in error


def test_an_unreachable_hub_model_is_one_error_without_retries(tmp_path, capsys, monkeypatch):
    """A Hub id with no network: transformers' loaders retried twice five times (about a minute, 22 lines of
    retries) before their error; it is one request (`check_model_source`) and one line naming --model's field."""
    unreachable_hub(monkeypatch, tmp_path / "cache")
    monkeypatch.setattr("hf_relpos.tools.translate.AutoTokenizer.from_pretrained",
                        lambda *args, **kwargs: pytest.fail("the loader asked the Hub (with its retries)"))
    with pytest.raises(SystemExit) as exited:
        main(["nope/model", "--input", str(write_lines(tmp_path / "src.txt", SOURCES[:1]))])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "hf-relpos-translate: error: model 'nope/model' is neither a local folder nor a Hub model in the local cache, "
        "and the Hugging Face Hub cannot be reached (ConnectionError: [Errno -2] Name or service not known): connect "
        "to the network, or give a saved model folder (HF_HUB_OFFLINE=1 loads a Hub model from the local cache "
        "without asking the Hub)\n")


def test_a_hub_model_in_the_local_cache_translates_offline(memorised_model_folder, tmp_path):
    """HF_HUB_OFFLINE=1 with the model in the Hub cache (HF_HUB_CACHE laid out as huggingface_hub's): it loads from
    there, the Hub check passing it without a request."""
    commit = "0" * 40
    snapshot = tmp_path / "cache" / "models--me--tiny" / "snapshots" / commit
    shutil.copytree(memorised_model_folder, snapshot)
    (tmp_path / "cache" / "models--me--tiny" / "refs").mkdir()
    (tmp_path / "cache" / "models--me--tiny" / "refs" / "main").write_text(commit)
    completed = subprocess.run(
        [sys.executable, "-m", "hf_relpos.tools.translate", "me/tiny", "--input",
         str(write_lines(tmp_path / "src.txt", SOURCES[:1]))], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": checkout_first_on_path(), "HF_HUB_CACHE": str(tmp_path / "cache"),
             "HF_HUB_OFFLINE": "1"})
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout == TARGETS[0] + "\n"


@pytest.mark.parametrize("sources", [[], ["", "   "]], ids=["no lines", "blank lines"])
def test_a_source_with_nothing_to_translate_gives_as_many_blank_lines(memorised_model_folder, tmp_path, sources):
    source_file = write_lines(tmp_path / "src.txt", sources)
    main([str(memorised_model_folder), "--input", str(source_file), "--output", str(tmp_path / "hyp.txt")])
    assert (tmp_path / "hyp.txt").read_text(encoding="utf-8") == "\n" * len(sources)


@pytest.mark.parametrize(("output", "message"), [
    ("missing/hyp.txt", "--output 'missing/hyp.txt': no folder 'missing' to write it in"),
    (".", "--output '.': is a folder"),
    ("link.txt", "--output 'link.txt': no folder '{tmp}/missing' to write it in"),   # the link's file is written
    ("hyp.txt/", "--output 'hyp.txt/': ends in '/', which names a folder; give a file name"),   # not the file hyp.txt
])
def test_an_output_that_cannot_be_written_is_refused_before_the_model_loads(memorised_model_folder, tmp_path, capsys,
                                                                          monkeypatch, output, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "link.txt").symlink_to("missing/hyp.txt")
    monkeypatch.setattr("hf_relpos.tools.translate.AutoModelForSeq2SeqLM.from_pretrained",
                        lambda *args, **kwargs: pytest.fail("loaded the model before checking --output"))
    source_file = write_lines(tmp_path / "src.txt", SOURCES[:1])
    with pytest.raises(SystemExit) as exited:
        main([str(memorised_model_folder), "--input", str(source_file), "--output", output])
    assert exited.value.code == 2
    assert message.format(tmp=tmp_path.resolve()) in capsys.readouterr().err


def test_an_output_folder_without_write_permission_is_one_error_before_the_model_loads(memorised_model_folder,
                                                                                      tmp_path, capsys, monkeypatch):
    (tmp_path / "read_only").mkdir()
    make_unwritable(monkeypatch, tmp_path / "read_only")
    monkeypatch.setattr("hf_relpos.tools.translate.AutoModelForSeq2SeqLM.from_pretrained",
                        lambda *args, **kwargs: pytest.fail("loaded the model before checking --output"))
    source_file = write_lines(tmp_path / "src.txt", SOURCES[:1])
    with pytest.raises(SystemExit) as exited:
        main([str(memorised_model_folder), "--input", str(source_file), "--output", str(tmp_path / "read_only" / "h")])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert f"--output's folder '{tmp_path / 'read_only'}' is not writable: cannot create files in" in error
    assert "Permission denied" in error and "Traceback" not in error


@pytest.mark.parametrize("through_link", [False, True])
@pytest.mark.parametrize("flag", ["--input", "--reference"])
def test_an_output_that_is_the_source_or_reference_file_is_refused_and_the_file_kept(memorised_model_folder, tmp_path,
                                                                                    capsys, monkeypatch, flag,
                                                                                    through_link):
    """Named as itself or through a link of its own (which then truncated the file unread): one error line, before
    the model loads."""
    monkeypatch.setattr("hf_relpos.tools.translate.AutoModelForSeq2SeqLM.from_pretrained",
                        lambda *args, **kwargs: pytest.fail("loaded the model before checking --output"))
    source_file = write_lines(tmp_path / "src.txt", SOURCES[:1])
    reference_file = write_lines(tmp_path / "ref.txt", ["a reference"])
    same = tmp_path / "." / (source_file if flag == "--input" else reference_file).name
    if through_link:
        (tmp_path / "hyp.txt").symlink_to(same.name)
        same = tmp_path / "hyp.txt"
    with pytest.raises(SystemExit) as exited:
        main([str(memorised_model_folder), "--input", str(source_file), "--reference", str(reference_file),
              "--output", str(same)])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"hf-relpos-translate: error: --output {str(same)!r} is the {flag} file: the translations would replace it; "
        "write them to another file"]
    assert source_file.read_text(encoding="utf-8") == SOURCES[0] + "\n"
    assert reference_file.read_text(encoding="utf-8") == "a reference\n"


@pytest.mark.parametrize("tool", ["translate", "score"])
@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "tokenizer.json"])
def test_an_output_that_is_a_file_of_the_model_folder_is_refused_and_the_model_kept(memorised_model_folder, tmp_path,
                                                                                   capsys, monkeypatch, tool, name):
    """--output naming a file the model folder is loaded from (a slip of the shell's completion: MODEL/model.sa<TAB>)
    replaced the model's weights, config or tokenizer with the text written: one error line before the model loads,
    and the folder kept. A new file in the model folder is written as anywhere else."""
    from hf_relpos.tools import score

    model_folder = Path(shutil.copytree(memorised_model_folder, tmp_path / "model"))
    kept = (model_folder / name).read_bytes()
    source_file = write_lines(tmp_path / "src.txt", [source for source, _ in MEMORISED_PAIRS[:1]])
    target_file = write_lines(tmp_path / "tgt.txt", [target for _, target in MEMORISED_PAIRS[:1]])
    arguments = (["--input", str(source_file)] if tool == "translate" else
                 ["--source", str(source_file), "--target", str(target_file)])
    tool_main, program = (main, "hf-relpos-translate") if tool == "translate" else (score.main, "hf-relpos-score")
    with pytest.raises(SystemExit) as exited:
        tool_main([str(model_folder), *arguments, "--output", str(model_folder / name)])
    assert exited.value.code == 2
    what = "the translations" if tool == "translate" else "the scores"
    assert capsys.readouterr().err.splitlines() == [
        f"{program}: error: --output {str(model_folder / name)!r} is {name} of the model folder {str(model_folder)!r}: "
        f"{what} would replace a file of the saved model (weights, config, tokenizer, code or record); write them to "
        "another file"]
    assert (model_folder / name).read_bytes() == kept
    tool_main([str(model_folder), *arguments, "--output", str(model_folder / "written.txt")])
    assert (model_folder / "written.txt").read_text(encoding="utf-8").count("\n") == 1


def test_an_output_that_is_a_pipe_or_a_link_is_kept(memorised_model_folder, tmp_path):
    """--output is replaced atomically when it is a plain file; a named pipe is written through and a link stays a
    link, the file it leads to replaced: a rename would have put a plain file in the pipe's or the link's place."""
    source_file = write_lines(tmp_path / "src.txt", SOURCES[:3])
    expected = "".join(line + "\n" for line in TARGETS[:3])
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    received: list[str] = []
    # a daemon: should the pipe be replaced by a file, the reader waits on it for ever, and the test still fails
    reader = threading.Thread(target=lambda: received.append(pipe.read_text(encoding="utf-8")), daemon=True)
    reader.start()
    main([str(memorised_model_folder), "--input", str(source_file), "--output", str(pipe), "--no_progress"])
    reader.join(timeout=60)
    assert received == [expected] and stat.S_ISFIFO(pipe.stat().st_mode)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "hyp.txt").write_text("old\n", encoding="utf-8")
    (tmp_path / "hyp.txt").symlink_to(tmp_path / "elsewhere" / "hyp.txt")
    main([str(memorised_model_folder), "--input", str(source_file), "--output", str(tmp_path / "hyp.txt"),
          "--no_progress"])
    assert (tmp_path / "hyp.txt").is_symlink()
    assert (tmp_path / "elsewhere" / "hyp.txt").read_text(encoding="utf-8") == expected


def test_output_to_dev_stdout_in_a_fresh_process(memorised_model_folder, tmp_path):
    """`--output /dev/stdout` (a link to the process's stdout, here a pipe) prints the translations and leaves
    /dev/stdout as it was."""
    source_file = write_lines(tmp_path / "src.txt", SOURCES[:3])
    before = os.lstat("/dev/stdout")
    completed = subprocess.run(
        [sys.executable, "-m", "hf_relpos.tools.translate", str(memorised_model_folder), "--input", str(source_file),
         "--output", "/dev/stdout", "--no_progress"], capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={**os.environ, "PYTHONPATH": checkout_first_on_path(), "TRANSFORMERS_VERBOSITY": "error"})
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout == "".join(line + "\n" for line in TARGETS[:3])
    after = os.lstat("/dev/stdout")
    assert (stat.S_IFMT(after.st_mode), after.st_ino) == (stat.S_IFMT(before.st_mode), before.st_ino)


@pytest.mark.parametrize("mode", ["a", "w"])
def test_output_to_dev_stdout_on_a_file_keeps_what_the_file_had(memorised_model_folder, tmp_path, mode):
    """`--output /dev/stdout >> log` appends to log, and with `> log` the translations follow what was already written
    through that descriptor: the descriptor is written as the shell opened it (replacing the file it leads to lost
    the log's earlier lines)."""
    source_file = write_lines(tmp_path / "src.txt", SOURCES[:3])
    log = tmp_path / "log.txt"
    log.write_text("earlier\n", encoding="utf-8")
    with open(log, mode, encoding="utf-8") as stdout:
        if mode == "w":
            stdout.write("written first\n")
            stdout.flush()
        completed = subprocess.run(
            [sys.executable, "-m", "hf_relpos.tools.translate", str(memorised_model_folder), "--input",
             str(source_file), "--output", "/dev/stdout", "--no_progress"], stdout=stdout, stderr=subprocess.PIPE,
            text=True, cwd=tmp_path, timeout=300,
            env={**os.environ, "PYTHONPATH": checkout_first_on_path(), "TRANSFORMERS_VERBOSITY": "error"})
    assert completed.returncode == 0, completed.stderr[-3000:]
    kept = "earlier\n" if mode == "a" else "written first\n"
    assert log.read_text(encoding="utf-8") == kept + "".join(line + "\n" for line in TARGETS[:3])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["log.txt", "src.txt"]


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
    assert "(default: stdin)" in shown and "(default: 4096)" in shown and "(default: 10000)" in shown


def test_reference_with_another_line_count_is_refused(memorised_model_folder, tmp_path, capsys):
    source_file = write_lines(tmp_path / "src.txt", SOURCES[:3])
    write_lines(tmp_path / "ref.txt", TARGETS[:2])
    with pytest.raises(SystemExit) as exited:
        main([str(memorised_model_folder), "--input", str(source_file), "--reference", str(tmp_path / "ref.txt")])
    assert exited.value.code == 2
    assert (f"3 source lines (--input {str(source_file)!r}) but 2 reference lines (--reference "
            f"{str(tmp_path / 'ref.txt')!r})") in capsys.readouterr().err


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


def test_generation_flags_and_the_token_budget_reach_generate(memorised_model_folder, tmp_path, capsys, monkeypatch):
    """Each decoding flag is passed to every generate call as given (--max_length clears the saved max_new_tokens,
    which would win over it), and --max_tokens bounds each batch's padded source tokens."""
    from transformers import AutoModelForSeq2SeqLM

    calls = []
    load = AutoModelForSeq2SeqLM.from_pretrained

    def loading(*args, **kwargs):
        model = load(*args, **kwargs)
        generate = model.generate
        model.generate = lambda **settings: calls.append(settings) or generate(**settings)
        return model

    monkeypatch.setattr("hf_relpos.tools.translate.AutoModelForSeq2SeqLM.from_pretrained", loading)
    source_file = write_lines(tmp_path / "src.txt", SOURCES)
    flags = dict(num_beams=3, length_penalty=0.5, max_length=30, max_len_a=0.5, max_len_b=4, no_repeat_ngram_size=3)
    main([str(memorised_model_folder), str(source_file), "--no_progress", "--no_split_sentences", "--max_tokens", "16",
          *(item for name, value in flags.items() for item in (f"--{name}", str(value)))])
    assert len(capsys.readouterr().out.splitlines()) == len(SOURCES)
    assert len(calls) > 1
    for settings in calls:
        assert {name: settings.get(name, "not passed") for name in [*flags, "max_new_tokens"]} == {
            **flags, "max_new_tokens": None}
        assert settings["input_ids"].shape[0] == 1 or settings["input_ids"].numel() <= 16


def test_a_kernel_that_cannot_run_on_the_device_is_one_error_before_loading(memorised_model_folder, capsys,
                                                                            monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(SystemExit) as exited:
        main([str(memorised_model_folder), "--device", "cpu", "--attn_implementation", "relpos_triton"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "hf-relpos-translate: error: --attn_implementation: attn_implementation 'relpos_triton' runs on CUDA GPUs (on "
        "the CPU only under Triton's interpreter, TRITON_INTERPRET=1, for tests), not on 'cpu': use 'sdpa' or "
        "'eager' on this device"]


N_BEST_LINE = re.compile(r"(\d+) \|\|\| (.*) \|\|\| F0= (\S+) \|\|\| (\S+)")


def read_n_best(text: str) -> list[tuple[int, str, float, float]]:
    """(line index, hypothesis, F0, SCORE) of each line of an n-best file; every line must parse."""
    entries = []
    for line in text.splitlines():
        match = N_BEST_LINE.fullmatch(line)
        assert match is not None, line
        entries.append((int(match[1]), match[2], float(match[3]), float(match[4])))
    return entries


@pytest.mark.parametrize("num_beams", [1, 4])
def test_n_best_scores_are_the_summed_log_probabilities_generate_ranks_by(memorised_model_folder, num_beams):
    """F0 of each hypothesis against an independent float64 computation: one teacher-forced forward pass of the
    hypothesis, the logits as generate takes them (cast to float32), their log-softmax (beam search takes it in
    float32, greedy search's F0 in float64) gathered and summed in float64 up to the first end token; SCORE = F0 /
    length ** length_penalty with length the new tokens, end token included (transformers' convention: its
    sequences_scores agree to float32 rounding). Both at 1e-12; no logits processor is active here."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hf_relpos.tools.n_best import generate_n_best

    model = AutoModelForSeq2SeqLM.from_pretrained(memorised_model_folder, dtype=torch.float64).eval()
    tokenizer = AutoTokenizer.from_pretrained(memorised_model_folder)
    inputs = tokenizer([*SOURCES, "The bird sees the red house.", "The dog"], padding=True, return_tensors="pt")
    n_best, length_penalty = min(num_beams, 3), 0.6
    settings = dict(num_beams=num_beams, length_penalty=length_penalty)
    with torch.inference_mode():
        scored = generate_n_best(model, dict(inputs), n_best, **settings)
        reference = model.generate(**inputs, **settings, num_return_sequences=n_best, output_scores=True,
                                   return_dict_in_generate=True)
        sources = {name: tensor.repeat_interleave(n_best, 0) for name, tensor in inputs.items()}
        logits = model(**sources, decoder_input_ids=scored.sequences[:, :-1]).logits.to(torch.float32)
    assert torch.equal(scored.sequences, reference.sequences)
    log_softmax = logits.log_softmax(-1).double() if num_beams > 1 else logits.double().log_softmax(-1)
    token_log_probabilities = log_softmax.gather(-1, scored.sequences[:, 1:, None])[..., 0]
    for row, ids in enumerate(scored.sequences[:, 1:].tolist()):
        length = ids.index(tokenizer.eos_token_id) + 1   # every hypothesis here ends
        expected = token_log_probabilities[row, :length].sum()
        assert scored.lengths[row] == length
        assert abs(scored.log_probabilities[row] - expected) <= 1e-12 * abs(expected)
        assert abs(scored.scores[row] - expected / length ** length_penalty) <= 1e-12 * abs(expected)
    assert len(set(scored.log_probabilities.tolist())) == len(scored.log_probabilities)   # varied hypotheses
    if num_beams > 1:
        assert torch.allclose(scored.scores, reference.sequences_scores.double(), rtol=1e-6, atol=0)


def test_n_best_scores_take_the_settings_generate_ran_with(memorised_model_folder):
    """SCORE read length_penalty from the keyword arguments or the model's generation config, and the end token from
    the model's: a `generation_config` passed to generate was ignored there. Both come from the settings generate
    derives, so SCORE is its sequences_scores (to float32 rounding)."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig

    from hf_relpos.tools.n_best import generate_n_best

    model = AutoModelForSeq2SeqLM.from_pretrained(memorised_model_folder, dtype=torch.float64).eval()
    tokenizer = AutoTokenizer.from_pretrained(memorised_model_folder)
    inputs = tokenizer([*SOURCES, "The dog"], padding=True, return_tensors="pt")
    assert model.generation_config.length_penalty != 0.3
    settings = dict(generation_config=GenerationConfig(num_beams=4, length_penalty=0.3))
    with torch.inference_mode():
        scored = generate_n_best(model, dict(inputs), 3, **settings)
        reference = model.generate(**inputs, **settings, num_return_sequences=3, output_scores=True,
                                   return_dict_in_generate=True)
    assert torch.equal(scored.sequences, reference.sequences)
    assert torch.allclose(scored.scores, reference.sequences_scores.double(), rtol=1e-6, atol=0)


def test_n_best_lists_keep_the_input_s_line_indices_across_chunks_and_parse_back(memorised_model_folder, tmp_path,
                                                                                  capsys):
    """--n_best 3 over chunks of 2 lines: every input line (a blank one too) has 3 entries under its own index,
    counted from 0 over the whole input, best first by SCORE; the numbers read back as translate_lines gave them, and
    the file is the one a single chunk writes (float64 weights: float32 ones round the scores by their batch)."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    sources = [SOURCES[0], "", *SOURCES[1:4], "The bird sees the red house."]
    source_file = write_lines(tmp_path / "src.txt", sources)
    written = {}
    for buffer_lines in ("2", "100"):
        output = tmp_path / f"nbest_{buffer_lines}.txt"
        main([str(memorised_model_folder), str(source_file), "--output", str(output), "--n_best", "3", "--num_beams",
              "4", "--no_split_sentences", "--buffer_lines", buffer_lines, "--no_progress", "--dtype", "float64"])
        written[buffer_lines] = output.read_text(encoding="utf-8")
    assert written["2"] == written["100"]
    entries = read_n_best(written["2"])
    assert [index for index, *_ in entries] == [index for index in range(len(sources)) for _ in range(3)]
    assert entries[3:6] == [(1, "", 0.0, 0.0)] * 3   # the blank line: 3 empty hypotheses scored 0
    model = AutoModelForSeq2SeqLM.from_pretrained(memorised_model_folder, dtype=torch.float64)
    expected = translate_module.translate_lines(sources, model, AutoTokenizer.from_pretrained(memorised_model_folder),
                                                progress=False, n_best=3, num_beams=4)
    assert entries == [(index, hypothesis.text, hypothesis.log_probability, hypothesis.score)
                       for index, hypotheses in enumerate(expected) for hypothesis in hypotheses]
    for index in range(len(sources)):
        scores = [score for line, _, _, score in entries if line == index]
        assert scores == sorted(scores, reverse=True)
    assert entries[0][1] == TARGETS[0] and len({text for _, text, *_ in entries}) > len(sources)


def test_n_best_1_gives_the_translations_and_reference_scores_the_best(memorised_model_folder, tmp_path, capsys):
    """--n_best 1: each line's hypothesis is the line written without --n_best (the same beam search);
    --reference with --n_best scores the best hypotheses, as it scores the plain output."""
    sources = [*SOURCES, "The bird sees the red house.", ""]
    source_file = write_lines(tmp_path / "src.txt", sources)
    reference = write_lines(tmp_path / "ref.txt", [*TARGETS, "Der Vogel sieht das rote Haus.", ""])
    flags = ["--num_beams", "3", "--no_split_sentences", "--no_progress", "--reference", str(reference)]
    main([str(memorised_model_folder), str(source_file), "--output", str(tmp_path / "plain.txt"), *flags])
    plain_scores = capsys.readouterr().out
    for n_best in ("1", "3"):
        main([str(memorised_model_folder), str(source_file), "--output", str(tmp_path / "best.txt"), *flags,
              "--n_best", n_best])
        assert capsys.readouterr().out == plain_scores and plain_scores.startswith("sacreBLEU ")
        entries = read_n_best((tmp_path / "best.txt").read_text(encoding="utf-8"))
        assert len(entries) == len(sources) * int(n_best)
        assert [text for _, text, *_ in entries[::int(n_best)]] == (tmp_path / "plain.txt").read_text(
            encoding="utf-8").splitlines()


@pytest.mark.parametrize(("flags", "message"), [
    (["--n_best", "2"], "--n_best lists a line's best translations by beam search, which a line translated "
                        "sentence by sentence does not have: give --no_split_sentences with --n_best"),
    (["--n_best", "0", "--no_split_sentences"], "--n_best must be a positive integer, got 0"),
    (["--n_best", "5", "--num_beams", "4", "--no_split_sentences"],
     "--n_best 5 is more than --num_beams 4: beam search keeps --num_beams hypotheses; give --n_best at most "
     "--num_beams, or raise --num_beams"),
    (["--n_best", "2", "--no_split_sentences"],
     "--n_best 2 is more than --num_beams 1 (the model's generation config)"),
])
def test_an_n_best_it_cannot_give_is_one_error_naming_the_flags(memorised_model_folder, tmp_path, capsys, flags,
                                                                 message):
    source_file = write_lines(tmp_path / "src.txt", SOURCES[:2])
    with pytest.raises(SystemExit) as exited:
        main([str(memorised_model_folder), str(source_file), "--no_progress", *flags])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert message in error.splitlines()[-1] and error.count("error:") == 1, error


def test_the_length_cap_warning_of_n_best_lists_counts_hypotheses(memorised_model_folder, tmp_path, capsys):
    """With --n_best 3 under a cap of 3 tokens most of the 2 lines' 6 hypotheses are cut: the warning counts them as
    hypotheses, not as more translations than the input has lines."""
    source_file = write_lines(tmp_path / "src.txt", SOURCES[:2])
    main([str(memorised_model_folder), str(source_file), "--output", str(tmp_path / "nbest.txt"), "--no_progress",
          "--no_split_sentences", "--num_beams", "3", "--n_best", "3", "--max_length", "3"])
    assert len(read_n_best((tmp_path / "nbest.txt").read_text(encoding="utf-8"))) == 6
    error = capsys.readouterr().err
    counted = re.search(r"warning: (\d+) n-best hypothesis\(es\) reached the maximum length", error)
    assert counted is not None and 2 < int(counted[1]) <= 6 and "translation(s)" not in error, error


def test_an_n_best_hypothesis_with_the_field_separator_is_escaped_as_moses_escapes_it(tmp_path):
    """A translation holding "|||" (or a "|" or "&") does not break the n-best format: the hypothesis is written with
    Moses' escapes (escape-special-chars.perl: "&" as "&amp;", "|" as "&#124;"), so every line splits at "|||" into
    its 4 fields, and unescaping the hypothesis (html.unescape, deescape-special-chars.perl) gives the translation
    the plain output writes; a text that already reads "&#124;" comes back as it was, not as "|"."""
    import html

    from conftest import train_memorising_model

    pairs = (("Yes or no?", "Ja ||| nein | so & so"), ("The cat sleeps.", "Die Katze &#124; schläft."))
    model, tokenizer, _ = train_memorising_model(pairs, steps=150)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    source_file = write_lines(tmp_path / "src.txt", [source for source, _ in pairs])
    main([str(folder), str(source_file), "--output", str(tmp_path / "plain.txt"), "--no_progress",
          "--no_split_sentences", "--num_beams", "2"])
    main([str(folder), str(source_file), "--output", str(tmp_path / "nbest.txt"), "--no_progress",
          "--no_split_sentences", "--num_beams", "2", "--n_best", "2"])
    plain = (tmp_path / "plain.txt").read_text(encoding="utf-8").splitlines()
    assert plain == [target for _, target in pairs]
    lines = (tmp_path / "nbest.txt").read_text(encoding="utf-8").splitlines()
    fields = [line.split("|||") for line in lines]
    assert [len(entry) for entry in fields] == [4] * 4, lines
    assert [int(entry[0]) for entry in fields] == [0, 0, 1, 1]
    best = [html.unescape(fields[index][1].strip()) for index in (0, 2)]
    assert best == plain
    assert fields[0][1] == " Ja &#124;&#124;&#124; nein &#124; so &amp; so "
    assert fields[2][1] == " Die Katze &amp;#124; schläft. "
    assert all(float(entry[2].removeprefix(" F0= ")) < 0 and float(entry[3]) < 0 for entry in fields)


COMPRESS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}


def write_compressed(path: Path, data: bytes, pieces: int = 1) -> Path:
    """`data` compressed by `path`'s suffix, in `pieces` streams one after the other (as `cat a.gz b.gz` or pbzip2
    write them)."""
    compress = COMPRESS[path.suffix]
    cuts = [len(data) * index // pieces for index in range(pieces + 1)]
    path.write_bytes(b"".join(compress(data[start:end]) for start, end in itertools.pairwise(cuts)))
    return path


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
def test_a_compressed_input_and_reference_translate_and_score_as_the_uncompressed_files(memorised_model_folder,
                                                                                       tmp_path, capsys, suffix):
    """--input test.en.gz (.bz2, .xz) and --reference test.de.gz are decompressed while read, by the training app's
    opener: the same translations and scores as the uncompressed files, read by the same rules (a byte order mark
    dropped, "\\r\\n" as "\\n", blank lines kept, lines of several sentences split), in chunks, their line counts
    checked, n-best lists indexed the same; a line that is not UTF-8 is named by file and line."""
    sources = [SOURCES[4], "", f"{SOURCES[0]} {SOURCES[1]}", *SOURCES[2:4], "   ", SOURCES[5]]
    references = [TARGETS[4], "", f"{TARGETS[0]} {TARGETS[1]}", TARGETS[2], "Das Haus ist blau.", "", TARGETS[5]]
    source_bytes = ("\ufeff" + "".join(line + "\r\n" for line in sources)).encode("utf-8")
    reference_bytes = "".join(line + "\n" for line in references).encode("utf-8")
    (tmp_path / "test.en").write_bytes(source_bytes)
    (tmp_path / "test.de").write_bytes(reference_bytes)
    write_compressed(tmp_path / f"test.en{suffix}", source_bytes, pieces=3)
    write_compressed(tmp_path / f"test.de{suffix}", reference_bytes, pieces=2)
    flags = ["--no_progress", "--buffer_lines", "3"]
    main([str(memorised_model_folder), str(tmp_path / "test.en"), "--reference", str(tmp_path / "test.de"),
          "--output", str(tmp_path / "plain.de"), *flags])
    plain_scores = capsys.readouterr().out
    assert (tmp_path / "plain.de").read_text(encoding="utf-8").splitlines() == [
        TARGETS[4], "", f"{TARGETS[0]} {TARGETS[1]}", *TARGETS[2:4], "", TARGETS[5]]
    assert plain_scores.startswith("sacreBLEU ") and not plain_scores.startswith("sacreBLEU 100.00")
    for source, reference in [(f"test.en{suffix}", f"test.de{suffix}"), (f"test.en{suffix}", "test.de"),
                              ("test.en", f"test.de{suffix}")]:
        main([str(memorised_model_folder), "--input", str(tmp_path / source), "--reference",
              str(tmp_path / reference), "--output", str(tmp_path / "hyp.de"), *flags])
        assert capsys.readouterr().out == plain_scores, (source, reference)
        assert (tmp_path / "hyp.de").read_bytes() == (tmp_path / "plain.de").read_bytes(), (source, reference)
    n_best = ["--n_best", "2", "--num_beams", "2", "--no_split_sentences", *flags]
    for source in ("test.en", f"test.en{suffix}"):
        main([str(memorised_model_folder), str(tmp_path / source), "--output", str(tmp_path / f"{source}.nbest"),
              *n_best])
    assert (tmp_path / f"test.en{suffix}.nbest").read_text(encoding="utf-8") == (
        tmp_path / "test.en.nbest").read_text(encoding="utf-8")
    write_compressed(tmp_path / f"short.de{suffix}", reference_bytes[:reference_bytes.index(b"\n") + 1])
    with pytest.raises(SystemExit) as exited:
        main([str(memorised_model_folder), str(tmp_path / f"test.en{suffix}"), "--reference",
              str(tmp_path / f"short.de{suffix}"), *flags])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        f"hf-relpos-translate: error: 7 source lines (--input {str(tmp_path / f'test.en{suffix}')!r}) but 1 reference "
        f"lines (--reference {str(tmp_path / f'short.de{suffix}')!r}): each source line needs its reference on the "
        "same line\n")
    invalid = write_compressed(tmp_path / f"invalid.en{suffix}", source_bytes + b"A cat\xff\n")
    with pytest.raises(SystemExit):
        main([str(memorised_model_folder), str(invalid), "--output", str(tmp_path / "invalid.de"), *flags])
    assert capsys.readouterr().err.startswith(f"hf-relpos-translate: error: --input {invalid}:8: not UTF-8 text (")
    assert not (tmp_path / "invalid.de").exists()


@pytest.mark.parametrize("flag", ["--input", "--reference"])
@pytest.mark.parametrize("name", ["test.en.gz", "test.en.bz2", "test.en.xz", "plain.gz"])
def test_a_compressed_input_or_reference_that_does_not_decompress_is_one_error_naming_it(memorised_model_folder,
                                                                                         tmp_path, capsys, flag, name):
    """A file cut short (an interrupted download), or one that is not of its suffix's kind (plain text named .gz), is
    one error line naming the flag and the file and the decompressor's error, as the training app says it; --output
    is not written."""
    data = "".join(line + "\n" for line in SOURCES * 50).encode("utf-8")
    broken = tmp_path / name
    if name == "plain.gz":
        broken.write_bytes(data)
    else:
        broken.write_bytes(COMPRESS[broken.suffix](data)[:-8])
    plain = write_lines(tmp_path / "plain.txt", SOURCES * 50)
    given = [str(broken), "--reference", str(plain)] if flag == "--input" else [str(plain), "--reference", str(broken)]
    with pytest.raises(SystemExit) as exited:
        main([str(memorised_model_folder), *given, "--output", str(tmp_path / "hyp.de"), "--no_progress"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert re.fullmatch(rf"hf-relpos-translate: error: {flag} {re.escape(str(broken))}: not a whole "
                        rf"{re.escape(broken.suffix)} file, it does not decompress \(\w+: .*\)\n", error), error
    assert not (tmp_path / "hyp.de").exists()
    if flag == "--input":   # without --reference: found as the chunks are read, output not written either
        with pytest.raises(SystemExit):
            main([str(memorised_model_folder), str(broken), "--output", str(tmp_path / "hyp.de"), "--no_progress"])
        assert re.fullmatch(rf"hf-relpos-translate: error: --input {re.escape(str(broken))}: not a whole .*\n",
                            capsys.readouterr().err)
        assert not (tmp_path / "hyp.de").exists()


@pytest.mark.parametrize(("flag", "name", "command"), [("--input", "test.en.zst", "unzstd"),
                                                       ("--reference", "test.de.zst", "unzstd"),
                                                       ("--input", "test.en.ZIP", "unzip")])
def test_a_zstd_or_zip_input_or_reference_is_refused_naming_the_flag_and_the_decompress_command(
        memorised_model_folder, tmp_path, capsys, monkeypatch, flag, name, command):
    """zstd and zip files are not read (as by the training app): one error before the model loads, naming the flag,
    the file and the command that decompresses it; a compressed file of records is refused as the uncompressed one."""
    monkeypatch.setattr("hf_relpos.tools.translate.AutoModelForSeq2SeqLM.from_pretrained",
                        lambda *args, **kwargs: pytest.fail("loaded the model before refusing the file"))
    compressed = tmp_path / name
    compressed.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(16))
    plain = write_lines(tmp_path / "plain.txt", SOURCES[:1])
    given = [str(compressed), "--reference", str(plain)] if flag == "--input" else [str(plain), "--reference",
                                                                                   str(compressed)]
    with pytest.raises(SystemExit) as exited:
        main([str(memorised_model_folder), *given])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        f"hf-relpos-translate: error: {flag} {str(compressed)!r} is compressed in a kind that is not read (.zst, "
        f".zip): decompress first ({command} {compressed}) and give the text file, uncompressed or compressed with "
        "gzip, bzip2 or xz (.gz, .bz2, .xz)\n")
    records = write_compressed(tmp_path / "test.jsonl.gz", b'{"translation": {"en": "A", "de": "B"}}\n')
    with pytest.raises(SystemExit):
        main([str(memorised_model_folder), str(records)])
    assert capsys.readouterr().err.startswith(f"hf-relpos-translate: error: --input {str(records)!r} is a .jsonl file "
                                              "of records, not plain text")


DECOMPRESS = {".gz": gzip.decompress, ".bz2": bz2.decompress, ".xz": lzma.decompress}


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
def test_an_output_named_gz_bz2_or_xz_is_written_compressed_and_whole_or_not_at_all(memorised_model_folder, tmp_path,
                                                                                    capsys, monkeypatch, suffix):
    """--output hyp.de.gz (.bz2, .xz) holds the plain output's bytes compressed so (what sacrebleu and zcat read), the
    scores printed alike; a gzip file names no file and no time (the same text, the same bytes). It is written beside
    the file and renamed when the job ends: a job failing on its second chunk leaves the old file and no temporary."""
    source_file = write_lines(tmp_path / "src.txt", MIXED_SOURCES)
    reference = write_lines(tmp_path / "ref.txt", MIXED_TARGETS)
    flags = ["--no_progress", "--buffer_lines", "3", "--reference", str(reference)]
    main([str(memorised_model_folder), str(source_file), "--output", str(tmp_path / "plain.de"), *flags])
    plain_scores = capsys.readouterr().out
    output = tmp_path / "out" / f"hyp.de{suffix}"
    output.parent.mkdir()
    main([str(memorised_model_folder), str(source_file), "--output", str(output), *flags])
    assert capsys.readouterr().out == plain_scores
    written = output.read_bytes()
    assert DECOMPRESS[suffix](written) == (tmp_path / "plain.de").read_bytes()
    assert DECOMPRESS[suffix](written).decode("utf-8").splitlines() == MIXED_TARGETS
    if suffix == ".gz":
        assert written[3] & 0x08 == 0 and written[4:8] == bytes(4)   # no FNAME flag, MTIME 0
        main([str(memorised_model_folder), str(source_file), "--output", str(tmp_path / "again.de.gz"), *flags])
        assert (tmp_path / "again.de.gz").read_bytes() == written
    translate_lines = translate_module.translate_lines
    calls = []

    def failing_on_the_second_chunk(lines, *args, **kwargs):
        calls.append(lines)
        if len(calls) > 1:
            raise RuntimeError("the GPU fell off the bus")
        return translate_lines(lines, *args, **kwargs)

    monkeypatch.setattr(translate_module, "translate_lines", failing_on_the_second_chunk)
    with pytest.raises(RuntimeError, match="fell off the bus"):
        main([str(memorised_model_folder), str(source_file), "--output", str(output), "--no_progress",
              "--buffer_lines", "3", "--no_split_sentences"])
    assert len(calls) == 2
    assert [path.name for path in output.parent.iterdir()] == [output.name]
    assert output.read_bytes() == written


@pytest.mark.parametrize("name", ["hyp.de.zst", "hyp.de.zip"])
def test_an_output_named_zst_or_zip_is_refused_before_the_model_loads(memorised_model_folder, tmp_path, capsys,
                                                                      monkeypatch, name):
    monkeypatch.setattr("hf_relpos.tools.translate.AutoModelForSeq2SeqLM.from_pretrained",
                        lambda *args, **kwargs: pytest.fail("loaded the model before refusing the output"))
    source_file = write_lines(tmp_path / "src.txt", SOURCES[:1])
    with pytest.raises(SystemExit) as exited:
        main([str(memorised_model_folder), str(source_file), "--output", str(tmp_path / name)])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        f"hf-relpos-translate: error: --output {str(tmp_path / name)!r} names a compression that is not written (.zst, "
        ".zip): give a name ending in .gz, .bz2, .xz (written compressed with gzip, bzip2 or xz) or a plain-text name, "
        "and compress it after\n")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["src.txt"]


def test_a_compressed_input_is_decompressed_chunk_by_chunk_as_it_is_translated(memorised_model_folder, tmp_path,
                                                                               monkeypatch):
    """A large --input test.en.gz is streamed as a plain one is: each --buffer_lines chunk is translated once its
    lines are decompressed, before the rest of the file is read (memory holds one chunk, not the file)."""
    lines_read = []

    class CountingGzipFile(gzip.GzipFile):
        def readline(self, size=-1):
            lines_read.append(None)
            return super().readline(size)

    monkeypatch.setattr(gzip, "GzipFile", CountingGzipFile)
    source = write_compressed(tmp_path / "test.en.gz", "".join(line + "\n" for line in SOURCES * 1000).encode())
    read_when_translated = []
    translate_lines = translate_module.translate_lines

    def stopping_at_the_third_chunk(lines, *args, **kwargs):
        read_when_translated.append(len(lines_read))
        if len(read_when_translated) == 3:
            raise RuntimeError("stopped")
        return translate_lines(lines, *args, **kwargs)

    monkeypatch.setattr(translate_module, "translate_lines", stopping_at_the_third_chunk)
    with pytest.raises(RuntimeError, match="stopped"):
        main([str(memorised_model_folder), str(source), "--output", str(tmp_path / "hyp.de"), "--buffer_lines", "2",
              "--no_split_sentences", "--no_progress"])
    assert read_when_translated == [2, 4, 6]   # of 6000 lines
    assert not (tmp_path / "hyp.de").exists()


def test_a_tokenizer_that_pads_on_the_left_translates_each_line_as_alone():
    """Sources are padded on the right whatever the tokenizer's side: `absolute` reads a token's sinusoid from its
    index, so with left padding a short line's tokens sat at shifted positions and its translations and their scores
    depended on the longer lines batched with it (float64: the n-best lists' scores to 1e-12)."""
    from hf_relpos.testing import tiny_float64_model
    from hf_relpos.tools.translate import translate_lines
    from hf_relpos.translation.tokenization import special_token_ids, train_joint_tokenizer

    tokenizer = train_joint_tokenizer([text for pair in MEMORISED_PAIRS * 4 for text in pair], vocab_size=300)
    tokenizer.padding_side = "left"
    model = tiny_float64_model("absolute", dict(vocab_size=len(tokenizer), **special_token_ids(tokenizer)),
                               kernel="sdpa")
    model.generation_config.max_length = 8
    sources = ["The house is red and the small bird sings in the big tree.", *SOURCES]
    settings = dict(progress=False, n_best=2, num_beams=2)
    alone = [translate_lines([source], model, tokenizer, **settings)[0] for source in sources]
    batched = translate_lines(sources, model, tokenizer, max_tokens=10_000, **settings)
    for line, expected in zip(batched, alone, strict=True):
        assert [hypothesis.text for hypothesis in line] == [hypothesis.text for hypothesis in expected]
        for hypothesis, reference in zip(line, expected, strict=True):
            assert abs(hypothesis.log_probability - reference.log_probability) < 1e-12


def test_a_full_device_is_one_error_naming_output(memorised_model_folder, tmp_path, capsys):
    """Writing --output fails (/dev/full: no space left): one error naming --output, exit status 2, no traceback."""
    source_file = write_lines(tmp_path / "src.txt", SOURCES)
    with pytest.raises(SystemExit) as exited:
        main([str(memorised_model_folder), str(source_file), "--output", "/dev/full", "--no_progress"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "hf-relpos-translate: error: writing --output '/dev/full': No space left on device; what reached it before the "
        "error stays")


def test_translate_lines_keeps_the_space_before_punctuation_whatever_the_tokenizer_config_says():
    """hf-relpos-translate writes what the model generated, as the training app scores it and the pipeline returns
    it: not the tokenizer config's `clean_up_tokenization_spaces` version of it ("Quoi ?" stays "Quoi ?")."""
    from test_train_metrics import SPACED_PUNCTUATION, word_level_tokenizer_that_cleans_up_spaces
    from transformers import GenerationConfig

    tokenizer = word_level_tokenizer_that_cleans_up_spaces()
    target = tokenizer(SPACED_PUNCTUATION, add_special_tokens=False)["input_ids"]

    class RepeatsTheReference(torch.nn.Module):
        """Generates the reference for every source: the decoder start token, its ids, the end token."""
        generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, max_new_tokens=20)
        device = torch.device("cpu")

        def generate(self, input_ids, **_):
            row = [tokenizer.pad_token_id, *target, tokenizer.eos_token_id]
            return torch.tensor([row] * len(input_ids))

    translations = translate_module.translate_lines([SPACED_PUNCTUATION] * 2, RepeatsTheReference(), tokenizer,
                                                    progress=False)
    assert translations == [SPACED_PUNCTUATION] * 2
