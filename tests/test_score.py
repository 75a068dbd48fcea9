"""`hf-relpos-score MODEL_DIR --source SRC --target TGT`: log p(target | source) of each line pair by teacher forcing,
against the chain rule computed prefix by prefix, and the command's files and errors."""

from __future__ import annotations

import gzip
import io
import math
import re
import sys
from pathlib import Path

import pytest
import torch
from conftest import BUILT_IN_SCHEMES, MEMORISED_PAIRS
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from hf_relpos.testing import tiny_float64_model
from hf_relpos.tools.score import ScoreTotals, build_parser, main, score_pairs, target_log_probabilities
from hf_relpos.translation.tokenization import special_token_ids, train_joint_tokenizer

SOURCES = [source for source, _ in MEMORISED_PAIRS]
TARGETS = [target for _, target in MEMORISED_PAIRS]
# pairs of unlike lengths, a blank side among them, so that batches pad sources and targets alike
PAIRS = [*MEMORISED_PAIRS, ("The big red house sees the small cat and the tree.", "Das Haus."),
         ("The cat.", "Die kleine Katze sieht den großen Baum und das rote Haus."), ("", "Der Vogel."),
         ("The bird.", "")]


@pytest.fixture(scope="module")
def tokenizer():
    return train_joint_tokenizer([text for pair in PAIRS * 4 for text in pair], vocab_size=300)


@pytest.fixture(scope="module")
def memorised(memorised_model_folder):
    """The memorised model folder's tokenizer and model (eval mode), as the command loads them."""
    return (AutoTokenizer.from_pretrained(memorised_model_folder),
            AutoModelForSeq2SeqLM.from_pretrained(memorised_model_folder).eval())


def chain_rule_log_probability(model, tokenizer, source: str, target: str) -> float:
    """sum_t log p(y_t | y_<t, x) for one pair alone, each term from its own forward pass over the prefix y_<t (the
    decoder start token first), the last position's log-softmax: no padding, no batch, no teacher-forced shift."""
    source_ids = torch.tensor([tokenizer(source)["input_ids"]])
    target_ids = tokenizer(text_target=target)["input_ids"]
    total = 0.0
    with torch.no_grad():
        for step, token in enumerate(target_ids):
            prefix = torch.tensor([[model.config.decoder_start_token_id, *target_ids[:step]]])
            logits = model(input_ids=source_ids, decoder_input_ids=prefix, use_cache=False).logits
            total += float(logits[0, -1].log_softmax(-1)[token])
    return total


@pytest.mark.numerics
@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("scheme", BUILT_IN_SCHEMES)
def test_batched_scores_are_the_chain_rule_of_each_pair_alone(tokenizer, scheme, padding_side):
    """float64, every scheme: one padded batch of pairs of unlike lengths (blank sides included) scores each pair as
    the product of its next-token probabilities, each computed alone from its prefix, to 1e-12."""
    model = tiny_float64_model(scheme, dict(vocab_size=len(tokenizer), **special_token_ids(tokenizer)), kernel="sdpa")
    tokenizer.padding_side = padding_side
    sources, targets = [source for source, _ in PAIRS], [target for _, target in PAIRS]
    scores = score_pairs(sources, targets, model, tokenizer, max_tokens=10_000)
    expected = [chain_rule_log_probability(model, tokenizer, source, target) for source, target in PAIRS]
    assert max(abs(score - reference) for score, reference in zip(scores, expected, strict=True)) < 1e-12
    assert len({round(score, 6) for score in scores}) == len(scores)   # the pairs score differently


def test_the_log_softmax_runs_in_float32_for_a_bfloat16_model(tokenizer):
    """A bfloat16 model's log-probabilities come out of a float32 log-softmax over its logits (promoted, never computed
    in bfloat16), so they equal the float32 log-softmax of the same bfloat16 logits."""
    model = tiny_float64_model("shaw", dict(vocab_size=len(tokenizer), **special_token_ids(tokenizer))).bfloat16()
    source_ids, target_ids = tokenizer(SOURCES[:2])["input_ids"], tokenizer(text_target=TARGETS[:2])["input_ids"]
    scored = target_log_probabilities(model, tokenizer, source_ids, target_ids)
    assert all(row.dtype == torch.float32 for row in scored)
    labels = torch.tensor(target_ids[0])[None]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(source_ids[:1]), labels=labels).logits
    assert logits.dtype == torch.bfloat16
    assert torch.equal(scored[0], logits.float().log_softmax(-1)[0].gather(-1, labels[0, :, None])[:, 0])


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_file_to_file_in_order_whatever_the_batches_and_chunks(
        memorised_model_folder, memorised, tmp_path, capsys):
    """One score a pair, in input order, the same with one batch and one chunk as with batches of a few tokens and
    chunks of 2 lines; --normalize divides each by its target's token count; the corpus cross-entropy and perplexity
    on stderr are those of the scores."""
    sources, targets = [source for source, _ in PAIRS], [target for _, target in PAIRS]
    source_file, target_file = write_lines(tmp_path / "src", sources), write_lines(tmp_path / "tgt", targets)
    runs = {}
    for name, flags in {"whole": ["--max_tokens", "100000"],
                        "small": ["--max_tokens", "12", "--buffer_lines", "2"],
                        "normalized": ["--normalize", "--buffer_lines", "3"]}.items():
        output = tmp_path / f"{name}.txt.gz"
        main([str(memorised_model_folder), "--source", str(source_file), "--target", str(target_file),
              "--output", str(output), "--no_progress", *flags])
        runs[name] = [float(line) for line in gzip.open(output, "rt", encoding="utf-8").read().splitlines()]
        runs[name, "stderr"] = capsys.readouterr().err
    tokenizer, model = memorised
    expected = [chain_rule_log_probability(model, tokenizer, source, target) for source, target in PAIRS]
    assert len(runs["whole"]) == len(PAIRS)
    for whole, small, reference in zip(runs["whole"], runs["small"], expected, strict=True):
        assert whole == pytest.approx(reference, rel=1e-6, abs=2e-6)
        assert small == pytest.approx(reference, rel=1e-6, abs=2e-6)
    assert runs["whole"][:len(MEMORISED_PAIRS)] > [-0.5] * len(MEMORISED_PAIRS)   # its own pairs: likely
    assert min(runs["whole"][len(MEMORISED_PAIRS):]) < -5                         # the others: not
    counts = [len(ids) for ids in tokenizer(text_target=targets)["input_ids"]]
    per_token = [score / count for score, count in zip(runs["whole"], counts, strict=True)]
    assert runs["normalized"] == pytest.approx(per_token, rel=1e-6, abs=2e-6)
    cross_entropy = -sum(runs["whole"]) / sum(counts)
    assert runs["whole", "stderr"] == (f"hf-relpos-score: {len(PAIRS)} pairs, {sum(counts)} target tokens: "
                                       f"cross-entropy {cross_entropy:.4f} nats per token, perplexity "
                                       f"{math.exp(cross_entropy):.2f}\n")


def test_scores_to_stdout(memorised_model_folder, tmp_path, capsys):
    source_file, target_file = write_lines(tmp_path / "src", SOURCES), write_lines(tmp_path / "tgt", TARGETS)
    main([str(memorised_model_folder), "--source", str(source_file), "--target", str(target_file), "--no_progress"])
    assert len([float(line) for line in capsys.readouterr().out.splitlines()]) == len(SOURCES)


@pytest.mark.parametrize("dash", ["--source", "--target", "--n_best", "--output"])
def test_a_dash_is_stdin_and_stdout_as_in_unix_tools(memorised_model_folder, tmp_path, capsys, monkeypatch, dash):
    """"-" as one of --source, --target and --n_best reads stdin (as bytes, through the files' chunked reader) and
    as --output writes stdout, as in hf-relpos-translate: the same lines as from the files to stdout, and no file
    named "-" looked for or written."""
    monkeypatch.chdir(tmp_path)
    source_file = write_lines(tmp_path / "src", SOURCES[:2])
    other = {"--target": write_lines(tmp_path / "tgt", TARGETS[:2]),
             "--n_best": write_lines(tmp_path / "nbest", [f"0 ||| {TARGETS[0]} ||| LM= -2.5 ||| -1.0",
                                                          f"1 ||| {TARGETS[1]} ||| LM= -1.5 ||| -0.5"])}
    flag = "--n_best" if dash == "--n_best" else "--target"
    files = {"--source": source_file, flag: other[flag]}
    argv = [str(memorised_model_folder), "--no_progress", "--buffer_lines", "1"]
    main([*argv, *(str(part) for name, path in files.items() for part in (name, path))])
    expected = capsys.readouterr().out
    if dash in files:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(files[dash].read_bytes())))
    main([*argv, *(str(part) for name, path in files.items() for part in (name, "-" if name == dash else path)),
          "--output", "-"])
    assert capsys.readouterr().out == expected
    assert len(expected.splitlines()) == 2
    assert not (tmp_path / "-").exists()
    assert "- is stdin" in " ".join(build_parser().format_help().split())


@pytest.mark.parametrize("scored", ["--target", "--n_best"])
def test_a_dash_for_two_inputs_is_one_error_naming_both(memorised_model_folder, tmp_path, capsys, monkeypatch,
                                                        scored):
    """Stdin is read once: "-" as --source and as --target (or --n_best) is one error naming both flags, before the
    model loads."""
    monkeypatch.chdir(tmp_path)
    error = error_of(capsys, [str(memorised_model_folder), "--source", "-", scored, "-", "--no_progress"])
    assert error == (f"hf-relpos-score: error: --source and {scored} are both - (stdin), which is read once: give "
                     "one of them as a file")


def test_stdin_errors_name_stdin(memorised_model_folder, tmp_path, capsys, monkeypatch):
    """A line of stdin that is not UTF-8 is named as stdin's line, and line counts that differ name stdin."""
    monkeypatch.chdir(tmp_path)
    target_file = write_lines(tmp_path / "tgt", TARGETS[:2])
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"The house.\n\xff\xfe kaputt\n")))
    error = error_of(capsys, [str(memorised_model_folder), "--source", "-", "--target", str(target_file),
                              "--no_progress"])
    assert error.startswith("hf-relpos-score: error: --source stdin:2: not UTF-8 text"), error
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("".join(f"{line}\n" for line in SOURCES).encode())))
    error = error_of(capsys, [str(memorised_model_folder), "--source", "-", "--target", str(target_file),
                              "--no_progress"])
    assert f"{len(SOURCES)} source lines (--source stdin) but 2 target lines (--target '{target_file}')" in error


def error_of(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hf-relpos-score: error: ")]
    assert len(errors) == 1, errors
    return errors[0]


def test_files_of_other_line_counts_are_one_error_and_write_nothing(memorised_model_folder, tmp_path, capsys):
    """The counts differ in a later chunk than the first: both files are counted to their ends, and --output, whose
    first chunk was written, is not left behind."""
    source_file = write_lines(tmp_path / "src", SOURCES)
    target_file = write_lines(tmp_path / "tgt", TARGETS[:-1])
    output = tmp_path / "scores.txt"
    error = error_of(capsys, [str(memorised_model_folder), "--source", str(source_file), "--target", str(target_file),
                              "--output", str(output), "--buffer_lines", "2", "--no_progress"])
    assert f"{len(SOURCES)} source lines (--source '{source_file}') but {len(SOURCES) - 1} target lines" in error
    assert not output.exists()


@pytest.mark.parametrize(("content", "message"), [
    (b"", "nothing to score"),
    (b"Das Haus.\n\xff\xfe kaputt\n", "--target .*tgt:2"),
])
def test_empty_or_undecodable_input_is_one_error_and_writes_nothing(memorised_model_folder, tmp_path, capsys,
                                                                    content, message):
    source_file = tmp_path / "src"
    source_file.write_bytes(b"" if not content else b"The house.\nThe tree.\n")
    target_file = tmp_path / "tgt"
    target_file.write_bytes(content)
    output = tmp_path / "scores.txt"
    error = error_of(capsys, [str(memorised_model_folder), "--source", str(source_file), "--target", str(target_file),
                              "--output", str(output), "--no_progress"])
    assert re.search(message, error), error
    assert not output.exists()


@pytest.mark.parametrize(("flags", "message"), [
    (["--output", "{src}"], "--output '.*src' is the --source file: the scores would replace it"),
    (["--max_tokens", "0"], "--max_tokens must be a positive integer"),
    (["--compute_type", "int8"], "--compute_type is for CTranslate2 folders"),
])
def test_bad_flags_are_one_error(memorised_model_folder, tmp_path, capsys, flags, message):
    source_file, target_file = write_lines(tmp_path / "src", SOURCES), write_lines(tmp_path / "tgt", TARGETS)
    flags = [flag.format(src=source_file) for flag in flags]
    error = error_of(capsys, [str(memorised_model_folder), "--source", str(source_file), "--target", str(target_file),
                              "--no_progress", *flags])
    assert re.search(message, error), error
    assert source_file.read_text(encoding="utf-8").splitlines() == SOURCES


def test_a_file_of_records_is_refused_before_the_model_loads(tmp_path, capsys):
    source_file = write_lines(tmp_path / "src.jsonl", ['{"translation": {"en": "a", "de": "b"}}'])
    target_file = write_lines(tmp_path / "tgt", ["b"])
    error = error_of(capsys, [str(tmp_path), "--source", str(source_file), "--target", str(target_file)])
    assert "--source" in error and "file of records, not plain text" in error


def test_totals_count_pairs_tokens_and_log_probability():
    """The corpus cross-entropy and perplexity; a cross-entropy whose exponential is beyond a float's range (an
    untrained or mismatched model's) gives perplexity inf, not an OverflowError after the scores are written."""
    totals = ScoreTotals(pairs=2, tokens=4, log_probability=-4 * math.log(3))
    assert totals.summary() == "2 pairs, 4 target tokens: cross-entropy 1.0986 nats per token, perplexity 3.00"
    huge = ScoreTotals(pairs=1, tokens=2, log_probability=-2000.0)
    assert huge.summary() == "1 pairs, 2 target tokens: cross-entropy 1000.0000 nats per token, perplexity inf"


def test_an_n_best_list_gets_each_hypothesis_score_as_a_feature_equal_to_generates(
        memorised_model_folder, memorised, tmp_path, capsys):
    """hf-relpos-translate --n_best, then hf-relpos-score --n_best with the same model: each entry comes back whole
    with `F1= SCORE` appended to its features, and F1 is generate's own F0 (the model's log-probability of the
    hypothesis, no logits processor changing it) to float32 rounding; a blank line's entries are scored as the model
    scores its end token alone (translate gives them 0 without generating). --normalize divides by the tokens and
    --n_best_feature names the feature."""
    from hf_relpos.tools.translate import main as translate_main

    source_file = write_lines(tmp_path / "src", [*SOURCES, ""])
    n_best_file = tmp_path / "nbest.txt"
    translate_main([str(memorised_model_folder), str(source_file), "--output", str(n_best_file), "--n_best", "3",
                    "--num_beams", "3", "--no_split_sentences", "--no_progress"])
    entries = n_best_file.read_text(encoding="utf-8").splitlines()
    assert len(entries) == 3 * (len(SOURCES) + 1)
    capsys.readouterr()
    main([str(memorised_model_folder), "--source", str(source_file), "--n_best", str(n_best_file), "--no_progress"])
    out, err = capsys.readouterr()
    rescored = out.splitlines()
    assert len(rescored) == len(entries)
    for entry, line in zip(entries, rescored, strict=True):
        index, hypothesis, features, score = entry.split(" ||| ")
        new_index, new_hypothesis, new_features, new_score = line.split(" ||| ")
        assert (new_index, new_hypothesis, new_score) == (index, hypothesis, score)
        assert new_features.startswith(features + " F1= ")
        f0, f1 = float(features.split()[1]), float(new_features.split()[3])
        if int(index) < len(SOURCES):
            assert f1 == pytest.approx(f0, rel=1e-5, abs=1e-5), line
        else:
            assert f0 == 0 and f1 < 0
    assert err.startswith(f"hf-relpos-score: {len(entries)} hypotheses, ")
    main([str(memorised_model_folder), "--source", str(source_file), "--n_best", str(n_best_file), "--no_progress",
          "--normalize", "--n_best_feature", "R2L"])
    normalized = capsys.readouterr().out.splitlines()
    tokenizer, _ = memorised
    for line, total in zip(normalized, rescored, strict=True):
        _, hypothesis, features, _ = line.split(" ||| ")
        assert features.split()[2] == "R2L="
        tokens = len(tokenizer(text_target=hypothesis)["input_ids"])
        assert float(features.split()[3]) == pytest.approx(float(total.split(" ||| ")[2].split()[3]) / tokens,
                                                           rel=1e-12)


def test_n_best_hypotheses_are_scored_with_their_escapes_undone(
        memorised_model_folder, memorised, tmp_path, capsys):
    """Moses' escapes (&amp; &#124; &lt; ...) in an entry are undone before scoring, as hf_relpos.tools.n_best writes
    them, and the entry is written back as it was read; an entry's extra fields stay after the score."""
    source_file = write_lines(tmp_path / "src", SOURCES[:2])
    n_best_file = write_lines(tmp_path / "nbest", ["0 ||| Die Katze &amp; der Hund &#124; &lt;3 ||| LM= -2.5 ||| -1.0",
                                                   "1 ||| Der Hund. ||| LM= -1.5 ||| -0.5 ||| 0-0 1-1"])
    main([str(memorised_model_folder), "--source", str(source_file), "--n_best", str(n_best_file), "--no_progress"])
    lines = capsys.readouterr().out.splitlines()
    tokenizer, model = memorised
    expected = score_pairs(SOURCES[:2], ["Die Katze & der Hund | <3", "Der Hund."], model, tokenizer)
    assert lines == [f"0 ||| Die Katze &amp; der Hund &#124; &lt;3 ||| LM= -2.5 F0= {expected[0]!r} ||| -1.0",
                     f"1 ||| Der Hund. ||| LM= -1.5 F0= {expected[1]!r} ||| -0.5 ||| 0-0 1-1"]


def test_the_feature_goes_to_the_features_field_before_the_total_score_wherever_the_list_puts_it(
        memorised_model_folder, memorised, tmp_path, capsys):
    """marian-nmt's --alignment, --word-scores and --word-counts fields come between the hypothesis and the features,
    Moses' alignments after the total score: in both the score joins the features field (the one before the total
    score) and its default name is the first F<k> that field lacks; the other fields are written back as read."""
    source_file = write_lines(tmp_path / "src", SOURCES[:2])
    n_best_file = write_lines(tmp_path / "nbest", [
        "0 ||| Die Katze schläft. ||| WordCounts=3,4 ||| 0-0 1-1 2-2 ||| WordScores=-0.1 -0.2 -0.3 ||| F0= -1.5 "
        "||| -0.5",
        "1 ||| Der Hund. ||| F0= -2.5 ||| -1.0 ||| 0-0 1-1"])
    main([str(memorised_model_folder), "--source", str(source_file), "--n_best", str(n_best_file), "--no_progress"])
    lines = capsys.readouterr().out.splitlines()
    tokenizer, model = memorised
    expected = score_pairs(SOURCES[:2], ["Die Katze schläft.", "Der Hund."], model, tokenizer)
    assert lines == [f"0 ||| Die Katze schläft. ||| WordCounts=3,4 ||| 0-0 1-1 2-2 ||| WordScores=-0.1 -0.2 -0.3 ||| "
                     f"F0= -1.5 F1= {expected[0]!r} ||| -0.5",
                     f"1 ||| Der Hund. ||| F0= -2.5 F1= {expected[1]!r} ||| -1.0 ||| 0-0 1-1"]


def test_n_best_raw_scores_a_marian_list_whose_text_holds_entities_as_it_is(
        memorised_model_folder, memorised, tmp_path, capsys):
    """marian-nmt writes its n-best hypotheses unescaped: with --n_best_raw, "Tom &amp; Jerry" is scored as that text
    (not as "Tom & Jerry", which html.unescape would make of it) and the entry is written back as it was read; without
    --n_best, --n_best_raw is one error."""
    source_file = write_lines(tmp_path / "src", SOURCES[:1])
    n_best_file = write_lines(tmp_path / "nbest", ["0 ||| Die Katze &amp; &lt;3 ||| F0= -2.5 ||| -1.0"])
    main([str(memorised_model_folder), "--source", str(source_file), "--n_best", str(n_best_file), "--n_best_raw",
          "--no_progress"])
    line = capsys.readouterr().out.splitlines()
    tokenizer, model = memorised
    raw, unescaped = score_pairs(SOURCES[:1] * 2, ["Die Katze &amp; &lt;3", "Die Katze & <3"], model, tokenizer)
    assert raw != unescaped
    assert line == [f"0 ||| Die Katze &amp; &lt;3 ||| F0= -2.5 F1= {raw!r} ||| -1.0"]
    error = error_of(capsys, [str(memorised_model_folder), "--source", str(source_file), "--target", str(source_file),
                              "--n_best_raw"])
    assert "--n_best_raw says how --n_best's hypotheses are scored: give --n_best" in error


def test_n_best_backward_scores_each_source_line_given_its_hypothesis(
        memorised_model_folder, memorised, tmp_path, capsys):
    """A model of the other direction rescoring a list: with --n_best_backward each entry's feature is log p(source
    line | hypothesis), the hypothesis the model's input (here the memorised model's pairs read backwards), which
    differs from the forward log p(hypothesis | source line); without --n_best, the flag is one error."""
    source_file = write_lines(tmp_path / "src", TARGETS[:2])   # the list translated German into English
    n_best_file = write_lines(tmp_path / "nbest", [f"{index} ||| {source} ||| F0= -1.0 ||| -0.5"
                                                   for index, source in enumerate(SOURCES[:2])])
    main([str(memorised_model_folder), "--source", str(source_file), "--n_best", str(n_best_file),
          "--n_best_backward", "--no_progress"])
    lines = capsys.readouterr().out.splitlines()
    tokenizer, model = memorised
    backward = score_pairs(SOURCES[:2], TARGETS[:2], model, tokenizer)
    forward = score_pairs(TARGETS[:2], SOURCES[:2], model, tokenizer)
    assert min(backward) > -0.5 > max(forward)   # the pairs the model memorised, read as it learnt them
    assert lines == [f"{index} ||| {source} ||| F0= -1.0 F1= {score!r} ||| -0.5"
                     for index, (source, score) in enumerate(zip(SOURCES[:2], backward, strict=True))]
    error = error_of(capsys, [str(memorised_model_folder), "--source", str(source_file), "--target", str(source_file),
                              "--n_best_backward"])
    assert "--n_best_backward says how --n_best's hypotheses are scored: give --n_best" in error


@pytest.mark.parametrize(("entries", "flags", "message"), [
    (["1 ||| a ||| F0= -1 ||| -1", "0 ||| b ||| F0= -1 ||| -1"], [], r"nbest:2: line index 0 after 1: the entries must "
                                                                      "come in the order of --source's lines"),
    (["0 ||| a ||| F0= -1 ||| -1", "9 ||| b ||| F0= -1 ||| -1"], [], rf"nbest:2: line index 9, but --source has "
                                                                      rf"{len(SOURCES)} lines"),
    (["0 ||| a ||| F0= -1 ||| -1", "Die Katze schläft."], [], r"nbest:2: not an n-best entry"),
    (["0 ||| a ||| F0= -1 ||| -1", "² ||| b ||| F0= -1 ||| -1"], [], r"nbest:2: not an n-best entry"),
    (["0 ||| a ||| F0= -1 ||| -1"], ["--n_best_feature", "F0"], r"nbest:1: the entry has a feature 'F0' already"),
    ([], [], "nothing to score: --n_best has no entries"),
    (["0 ||| a ||| F0= -1 ||| -1"], ["--n_best_feature", "my feature"], "--n_best_feature must be a name without"),
])
def test_an_n_best_list_that_cannot_be_scored_is_one_error_and_writes_nothing(memorised_model_folder, tmp_path, capsys,
                                                                              entries, flags, message):
    source_file = write_lines(tmp_path / "src", SOURCES)
    n_best_file = write_lines(tmp_path / "nbest", entries)
    output = tmp_path / "rescored.txt"
    error = error_of(capsys, [str(memorised_model_folder), "--source", str(source_file), "--n_best", str(n_best_file),
                              "--output", str(output), "--no_progress", "--buffer_lines", "1", *flags])
    assert re.search(message, error), error
    assert not output.exists()


def test_target_and_n_best_are_one_or_the_other(memorised_model_folder, tmp_path, capsys):
    source_file = write_lines(tmp_path / "src", SOURCES)
    with pytest.raises(SystemExit):
        main([str(memorised_model_folder), "--source", str(source_file), "--target", str(source_file),
              "--n_best", str(source_file)])
    assert "not allowed with argument" in capsys.readouterr().err
    error = error_of(capsys, [str(memorised_model_folder), "--source", str(source_file), "--target", str(source_file),
                              "--n_best_feature", "R2L"])
    assert "--n_best_feature names the feature --n_best appends: give --n_best" in error


@pytest.mark.parametrize("program", ["score", "translate"])
def test_a_compute_type_the_device_does_not_run_is_one_error_naming_the_types_it_runs(memorised_model_folder, tmp_path,
                                                                                    capsys, program):
    """--compute_type float16 (or another type CTranslate2 does not run on the CPU) on a CTranslate2 folder is one
    error naming --compute_type and --device and listing the types the device runs, in both programs (it was the
    engine's own message, naming neither flag nor a way out)."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from hf_relpos.tools.ctranslate2_engine import COMPUTE_TYPES
    from hf_relpos.tools.export import export_ctranslate2
    from hf_relpos.tools.translate import main as translate_main

    supported = ctranslate2.get_supported_compute_types("cpu")
    refused = next((kind for kind in COMPUTE_TYPES if kind not in (*supported, "default", "auto")), None)
    if refused is None:
        pytest.skip("this CPU runs every compute type")
    folder = export_ctranslate2(memorised_model_folder, tmp_path / "ct2")
    source_file, target_file = write_lines(tmp_path / "src", SOURCES), write_lines(tmp_path / "tgt", TARGETS)
    flags = ["--compute_type", refused, "--device", "cpu", "--no_progress"]
    with pytest.raises(SystemExit) as exited:
        if program == "score":
            main([str(folder), "--source", str(source_file), "--target", str(target_file), *flags])
        else:
            translate_main([str(folder), str(source_file), *flags])
    assert exited.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error == (f"hf-relpos-{program}: error: --compute_type {refused}: CTranslate2 does not run it on --device "
                     f"cpu, which runs {', '.join(sorted(supported))}; give one of them, or leave --compute_type out "
                     "(the type the weights were exported in)")


def test_a_full_device_is_one_error_naming_output(memorised_model_folder, tmp_path, capsys):
    """Writing --output fails (/dev/full: no space left): one error naming --output, not a traceback."""
    source_file, target_file = write_lines(tmp_path / "src", SOURCES), write_lines(tmp_path / "tgt", TARGETS)
    error = error_of(capsys, [str(memorised_model_folder), "--source", str(source_file), "--target", str(target_file),
                              "--output", "/dev/full", "--no_progress"])
    assert error == ("hf-relpos-score: error: writing --output '/dev/full': No space left on device; what reached it "
                     "before the error stays")


def test_a_file_that_cannot_grow_is_one_error_and_is_not_written(memorised_model_folder, tmp_path):
    """A regular --output whose writes fail (here a file size limit, as a full disk fails them) is one error saying it
    is not written, and its folder keeps no part of it."""
    import subprocess
    import sys

    source_file, target_file = write_lines(tmp_path / "src", SOURCES), write_lines(tmp_path / "tgt", TARGETS)
    output = tmp_path / "out" / "scores.txt"
    output.parent.mkdir()
    script = ("import resource, signal, sys\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"   # a write past the limit fails with EFBIG
              "resource.setrlimit(resource.RLIMIT_FSIZE, (20, 20))\n"
              "from hf_relpos.tools.score import main\n"
              "main(sys.argv[1:])\n")
    run = subprocess.run([sys.executable, "-c", script, str(memorised_model_folder), "--source", str(source_file),
                          "--target", str(target_file), "--output", str(output), "--no_progress"],
                         capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines()[-1] == (f"hf-relpos-score: error: writing --output '{output}': File too large; it "
                                           "is not written")
    assert list(output.parent.iterdir()) == []
