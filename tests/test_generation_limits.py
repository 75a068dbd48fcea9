"""The decoding length cap relative to each source (fairseq's max_len_a * |x| + max_len_b), in model.generate: per row
under padding and beam search, saved with the model, off for folders saved without it."""

from __future__ import annotations

import math
import re
import threading

import pytest
import torch
from conftest import run_without_hf_relpos, tiny_model
from transformers import GenerationConfig, LogitsProcessorList

from hf_relpos.model.generation_limits import (
    DEFAULT_NEW_TOKENS,
    SourceLengthCapLogitsProcessor,
    new_token_limits,
    set_relative_limit,
    source_lengths,
)

EOS, PAD = 1, 0  # RelPosTransformerConfig's defaults


def sources(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded source ids (ending in EOS) of the given lengths, and their attention mask."""
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD)
    for row, length in enumerate(lengths):
        ids[row, :length - 1] = torch.arange(5, 4 + length) % 30 + 5
        ids[row, length - 1] = EOS
    return ids, (ids != PAD).long()


def capped_model(ratio: float = 0.5, offset: int = 2, ceiling: int = 60, **overrides):
    """A tiny model that never ends on its own (EOS banned by a large negative bias), capped relative to sources."""
    model = tiny_model("shaw", **overrides)
    with torch.no_grad():
        model.final_logits_bias[0, EOS] = -1e4
    set_relative_limit(model.generation_config, ratio, offset)
    model.generation_config.max_new_tokens = ceiling
    return model


def new_lengths(output: torch.Tensor) -> list[int]:
    """New tokens per output row (the decoder start token left out) up to its first end token, included (beam search
    pads with the end token)."""
    lengths = []
    for row in output[:, 1:].tolist():
        lengths.append(row.index(EOS) + 1 if EOS in row else len([token for token in row if token != PAD]))
    return lengths


def test_new_token_limits_follow_the_equation():
    lengths = torch.tensor([1, 4, 9, 40])
    expected = [min(max(1, math.floor(1.3 * n + 3)), 30) for n in (1, 4, 9, 40)]
    assert new_token_limits(lengths, 1.3, 3, 30).tolist() == expected
    assert new_token_limits(torch.tensor([0]), 0.0, 0, 30).tolist() == [1]  # at least the end token
    ids, mask = sources([3, 5])
    assert source_lengths(ids, mask, PAD).tolist() == [3, 5]
    assert source_lengths(ids, None, PAD).tolist() == [3, 5]
    assert source_lengths(None, None, PAD, torch.zeros(2, 7, 4)).tolist() == [7, 7]


@pytest.mark.numerics
def test_processor_ends_each_row_at_its_own_limit_and_keeps_the_end_tokens_score():
    processor = SourceLengthCapLogitsProcessor(torch.tensor([2, 3]), prompt_length=1, eos_token_id=EOS)
    scores = torch.randn(4, 10, dtype=torch.float64)  # 2 rows x 2 beams
    after_one = processor(torch.zeros(4, 2, dtype=torch.long), scores.clone())  # the 2nd new token comes next
    assert torch.equal(after_one[2:], scores[2:])
    assert torch.equal(after_one[:2, EOS], scores[:2, EOS])
    assert torch.isinf(after_one[:2]).sum() == 2 * 9
    assert torch.equal(processor(torch.zeros(4, 1, dtype=torch.long), scores.clone()), scores)


@pytest.mark.numerics
@pytest.mark.parametrize("num_beams", [1, 3])
def test_each_row_of_a_padded_batch_is_capped_as_if_decoded_alone(num_beams):
    model = capped_model(ratio=0.5, offset=2, ceiling=60).double()
    lengths = [3, 9, 17]
    ids, mask = sources(lengths)
    with torch.no_grad():
        batch = model.generate(input_ids=ids, attention_mask=mask, num_beams=num_beams, do_sample=False)
        alone = [model.generate(input_ids=ids[row:row + 1, :n], num_beams=num_beams, do_sample=False)
                 for row, n in enumerate(lengths)]
    assert new_lengths(batch) == [math.floor(0.5 * n + 2) for n in lengths]
    for row, single in enumerate(alone):
        assert torch.equal(batch[row, :single.shape[-1]], single[0])
        assert single[0, -1] == EOS  # the cap ends a row with its end token (fairseq's forced </s>)


def test_an_input_longer_than_any_in_training_gets_a_longer_cap_than_the_saved_ceiling_gave(tmp_path):
    """A folder saved with max_len_a / max_len_b: the cap grows with the source; old folders (no max_len_b) keep their
    fixed max_new_tokens; max_len_b=None switches the relative cap off; explicit max_new_tokens stays a ceiling."""
    model = capped_model(ratio=1.0, offset=3, ceiling=200)
    model.save_pretrained(tmp_path / "new")
    loaded = type(model).from_pretrained(tmp_path / "new").eval()
    long_ids, _ = sources([40])
    with torch.no_grad():
        assert new_lengths(loaded.generate(input_ids=long_ids, num_beams=1)) == [43]
        assert new_lengths(loaded.generate(input_ids=long_ids, num_beams=1, max_new_tokens=10)) == [10]
        assert new_lengths(loaded.generate(input_ids=long_ids, num_beams=1, max_len_a=0.5, max_len_b=1)) == [21]
        assert new_lengths(loaded.generate(input_ids=long_ids, num_beams=1, max_len_b=None)) == [200]
        # hf-relpos-translate --max_length: max_length (the decoder start counted) is the ceiling instead
        assert new_lengths(loaded.generate(input_ids=long_ids, num_beams=1, max_new_tokens=None, max_length=9)) == [8]
        old = capped_model(ceiling=12)
        for name in ("max_len_a", "max_len_b"):
            delattr(old.generation_config, name)
        old.save_pretrained(tmp_path / "old")
        old = type(model).from_pretrained(tmp_path / "old").eval()
        assert getattr(old.generation_config, "max_len_b", None) is None
        assert new_lengths(old.generate(input_ids=long_ids, num_beams=1)) == [12]


@pytest.mark.parametrize("num_beams", [1, 3])
def test_the_cap_without_a_ceiling_stops_where_generate_stops_by_default(num_beams, caplog, monkeypatch):
    """A generation config with neither max_new_tokens nor max_length (a plain save_pretrained's): the source-relative
    cap applies under generate's own default of DEFAULT_NEW_TOKENS new tokens, as passed or as saved, and says so
    (as generate warns of its default)."""
    from hf_relpos.model import modeling_relpos

    monkeypatch.setattr(modeling_relpos.logger, "warning_once", modeling_relpos.logger.warning)   # not cached
    model = tiny_model("shaw")
    with torch.no_grad():
        model.final_logits_bias[0, EOS] = -1e4
    assert model.generation_config.max_new_tokens is None and model.generation_config.max_length is None
    ids, mask = sources([4, 9, 30])
    uncapped = model.generate(input_ids=ids, attention_mask=mask, num_beams=num_beams)
    assert new_lengths(uncapped) == [DEFAULT_NEW_TOKENS] * 3   # generate's default, which the cap stays under
    with caplog.at_level("WARNING"):
        passed = model.generate(input_ids=ids, attention_mask=mask, num_beams=num_beams, max_len_a=1.0, max_len_b=2)
    assert new_lengths(passed) == [min(n + 2, DEFAULT_NEW_TOKENS) for n in (4, 9, 30)]
    assert f"cap each translation under generate's default ceiling of {DEFAULT_NEW_TOKENS} new tokens" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        model.generate(input_ids=ids, attention_mask=mask, num_beams=num_beams, max_len_a=1.0, max_len_b=2,
                       max_new_tokens=40)
    assert "default ceiling" not in caplog.text
    set_relative_limit(model.generation_config, 0.5, 1)
    assert new_lengths(model.generate(input_ids=ids, attention_mask=mask, num_beams=num_beams)) == [3, 5, 16]
    assert new_lengths(model.generate(input_ids=ids, attention_mask=mask, num_beams=num_beams, max_len_b=2)) == [
        4, 6, 17]   # the saved max_len_a with the passed max_len_b


def test_a_passed_generation_config_keeps_the_saved_relative_cap():
    model = capped_model(ratio=1.0, offset=1, ceiling=100)
    ids, mask = sources([6, 11])
    config = type(model.generation_config)(num_beams=2, do_sample=False)
    with torch.no_grad():
        output = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        positional = model.generate(ids, config, attention_mask=mask)
    assert new_lengths(output) == [7, 12]
    assert torch.equal(output, positional)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_a_minimum_length_beyond_a_rows_cap_is_one_error_and_one_within_it_ends_at_the_cap(num_beams):
    """min_new_tokens / min_length ban the end token until their length: at or beyond a row's source-relative cap
    they would leave that step with no token to choose (fairseq refuses min_len > max_len likewise)."""
    model = capped_model(ratio=1.0, offset=2, ceiling=60)
    ids, mask = sources([4, 9])   # caps 6 and 11 new tokens
    for too_long in ({"min_new_tokens": 6}, {"min_length": 7}):   # min_length counts the decoder start token
        with pytest.raises(ValueError, match=r"at least 6 new tokens .* ends a row of this batch after 6 new tokens"):
            model.generate(input_ids=ids, attention_mask=mask, num_beams=num_beams, **too_long)
    with torch.no_grad():
        output = model.generate(input_ids=ids, attention_mask=mask, num_beams=num_beams, min_new_tokens=5)
        # where max_new_tokens binds, as it always does in generate: exactly that many tokens, no end token forced
        exact = model.generate(input_ids=ids, attention_mask=mask, num_beams=num_beams, min_new_tokens=5,
                               max_new_tokens=5)
    assert new_lengths(output) == [6, 11]
    assert new_lengths(exact) == [5, 5] and bool((exact[:, 1:] != EOS).all())
    model.generation_config.min_new_tokens = 8   # saved, under a passed config that leaves it unset
    with pytest.raises(ValueError, match=r"at least 8 new tokens .* after 6 new tokens"):
        model.generate(input_ids=ids, attention_mask=mask, generation_config=GenerationConfig(num_beams=num_beams))


@pytest.mark.parametrize("num_beams", [1, 3])
def test_the_cap_ends_a_row_whose_end_token_another_processor_bans(num_beams):
    """With the end token suppressed, every score of the capped step would be -inf: the row still ends there, with
    its end token and a finite score."""
    model = tiny_model("shaw")
    set_relative_limit(model.generation_config, 1.0, 2)
    model.generation_config.max_new_tokens = 60
    ids, mask = sources([4, 9])
    with torch.no_grad():
        output = model.generate(input_ids=ids, attention_mask=mask, num_beams=num_beams, suppress_tokens=[EOS],
                                return_dict_in_generate=True, output_scores=True)
    assert new_lengths(output.sequences) == [6, 11]
    assert [row[:length + 1][-1] for row, length in zip(output.sequences.tolist(), [6, 11], strict=True)] == [EOS] * 2
    if num_beams > 1:
        assert torch.isfinite(output.sequences_scores).all() and (output.sequences_scores > -1e4).all()


def test_a_cap_set_on_the_generation_config_survives_save_and_load(tmp_path):
    """Fields set directly on a generation config made from the model's config (transformers drops the custom fields
    of such a config when it loads it): save_pretrained keeps them."""
    model = tiny_model("shaw")
    with torch.no_grad():
        model.final_logits_bias[0, EOS] = -1e4
    assert model.generation_config._from_model_config
    model.generation_config.max_len_a, model.generation_config.max_len_b = 1.0, 5
    model.generation_config.max_new_tokens = 200
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path).eval()
    assert (loaded.generation_config.max_len_a, loaded.generation_config.max_len_b) == (1.0, 5)
    ids, _ = sources([4])
    with torch.no_grad():
        assert new_lengths(loaded.generate(input_ids=ids)) == [9]


def test_a_max_length_that_the_saved_ceiling_overrides_is_said(caplog, monkeypatch):
    from hf_relpos.model import modeling_relpos

    monkeypatch.setattr(modeling_relpos.logger, "warning_once", modeling_relpos.logger.warning)   # not cached
    model = capped_model(ratio=1.0, offset=2, ceiling=60)
    ids, _ = sources([9])
    with caplog.at_level("WARNING"), torch.no_grad():
        assert new_lengths(model.generate(input_ids=ids, max_length=4)) == [11]
    assert "max_length=4 is ignored: max_new_tokens (60) is the ceiling" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"), torch.no_grad():
        assert new_lengths(model.generate(input_ids=ids, max_length=4, max_new_tokens=None)) == [3]
    assert "is ignored" not in caplog.text


@pytest.mark.parametrize("field, value, allowed", [
    ("max_len_a", -1.0, "a finite number >= 0"), ("max_len_a", "x", "a finite number >= 0"),
    ("max_len_a", float("inf"), "a finite number >= 0"), ("max_len_b", 1.5, "an integer >= 0"),
    ("max_len_b", -2, "an integer >= 0"), ("max_len_b", True, "an integer >= 0")])
def test_bad_cap_fields_are_one_error_naming_the_field(field, value, allowed):
    model = capped_model()
    ids, mask = sources([4])
    with pytest.raises(ValueError, match=rf"^{field} \(new tokens [^)]*\) must be {allowed}, got {re.escape(repr(value))}$"):
        model.generate(input_ids=ids, attention_mask=mask, **{field: value})


def test_the_training_apps_evaluation_caps_each_source_by_the_models_rule(tmp_path):
    """TranslationTrainer.prediction_step generates with the model's saved rule per row (no batch-wide number), also
    for a source longer than any the model was trained on."""
    from hf_relpos.translation.arguments import TranslationTrainingArguments
    from hf_relpos.translation.trainer import TranslationTrainer

    model = capped_model(ratio=1.0, offset=2, ceiling=100)
    arguments = TranslationTrainingArguments(output_dir=str(tmp_path), predict_with_generate=True,
                                             generation_num_beams=2, use_cpu=True, report_to="none")
    trainer = TranslationTrainer(model=model, args=arguments, evaluation_sets={})
    ids, mask = sources([4, 33])
    _, generated, _ = trainer.prediction_step(model, {"input_ids": ids, "attention_mask": mask},
                                              prediction_loss_only=False, num_beams=2)
    assert new_lengths(generated) == [6, 35]


@pytest.fixture(scope="module")
def never_ending_folder(tmp_path_factory):
    """A tiny model with a tokenizer that never ends on its own, saved with a cap of 1 x source tokens + 2 under a
    ceiling of 300, and the source lengths its tokenizer gives to a short line and to a line longer than any
    'training' source (a ceiling the old rule, longest training source + offset, would have made 20)."""
    from hf_relpos.translation.tokenization import special_token_ids, train_joint_tokenizer

    tokenizer = train_joint_tokenizer(["A man rides a horse.", "Ein Mann reitet ein Pferd."] * 4, vocab_size=300)
    ids = special_token_ids(tokenizer)
    model = tiny_model("shaw", vocab_size=len(tokenizer), **ids)
    with torch.no_grad():
        model.final_logits_bias[0, ids["eos_token_id"]] = -1e4
    set_relative_limit(model.generation_config, 1.0, 2)
    model.generation_config.update(max_new_tokens=300, num_beams=2)
    folder = tmp_path_factory.mktemp("never_ending") / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


LINES = ["A man.", " ".join(["A man rides a horse"] * 12) + "."]


def generated_lengths_by(model, monkeypatch) -> list[list[int]]:
    """Record the new tokens of every row that `model.generate` returns (the start token left out, up to the first
    end token, included)."""
    recorded = []
    generate = model.generate

    def recording(*args, **kwargs):
        output = generate(*args, **kwargs)
        ends = output[:, 1:] == model.generation_config.eos_token_id
        recorded.append([int(row.nonzero()[0]) + 1 if row.any() else row.numel() for row in ends])
        return output

    monkeypatch.setattr(model, "generate", recording)
    return recorded


def test_translate_and_the_pipeline_cap_a_long_line_by_its_own_length(never_ending_folder, monkeypatch, capsys):
    """hf-relpos-translate's batches and the pipeline give each source min(|x| + 2, 300) new tokens: the line of 60
    words gets far more than 20 (no cut), the short line in the same batch only its own limit; the cap is reported."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

    from hf_relpos.tools.translate import translate_lines

    tokenizer = AutoTokenizer.from_pretrained(never_ending_folder)
    lengths = [len(ids) for ids in tokenizer(LINES)["input_ids"]]
    assert lengths[1] > 40
    model = AutoModelForSeq2SeqLM.from_pretrained(never_ending_folder).eval()
    recorded = generated_lengths_by(model, monkeypatch)
    translate_lines(LINES, model, tokenizer, progress=False)
    assert sorted(recorded[0]) == sorted(length + 2 for length in lengths)
    assert "2 translation(s) reached the length cap" in capsys.readouterr().err
    recorded.clear()
    translator = pipeline("translation", model=model, tokenizer=tokenizer, device="cpu")
    translator(LINES, split_sentences=False, batch_size=2)
    assert sorted(length for call in recorded for length in call) == sorted(length + 2 for length in lengths)


def test_each_n_best_hypothesis_is_held_to_its_own_sources_cap(never_ending_folder, capsys):
    """n-best lists under the source-relative cap: every hypothesis of both lines (a short and a long one, in one
    batch) ends at its own source's cap, so all 4 are reported as reaching it."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hf_relpos.tools.translate import translate_lines

    tokenizer = AutoTokenizer.from_pretrained(never_ending_folder)
    model = AutoModelForSeq2SeqLM.from_pretrained(never_ending_folder).eval()
    lists = translate_lines(LINES, model, tokenizer, progress=False, n_best=2, num_beams=2)
    assert [len(hypotheses) for hypotheses in lists] == [2, 2]
    assert "warning: 4 n-best hypothesis(es) reached the length cap" in capsys.readouterr().err


def test_the_translate_command_caps_by_source_and_takes_the_cap_as_flags(never_ending_folder, tmp_path, capsys):
    from hf_relpos.tools.translate import main

    source = tmp_path / "source.txt"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    main([str(never_ending_folder), str(source), "--output", str(tmp_path / "out.txt"), "--no_progress",
          "--no_split_sentences", "--max_len_a", "0", "--max_len_b", "3"])
    printed = capsys.readouterr().err
    assert "2 translation(s) reached the length cap" in printed and "--no_repeat_ngram_size N ends such loops" in printed
    assert len((tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()) == 2


def test_the_remote_code_applies_the_saved_cap_without_hf_relpos(tmp_path):
    """Where hf_relpos is not installed, the folder's own code (generation_limits.py ships with it) caps each row."""
    model = capped_model(ratio=1.0, offset=3, ceiling=200)
    model.save_pretrained(tmp_path / "model")
    script = f"""
        import torch
        from transformers import AutoModelForSeq2SeqLM
        model = AutoModelForSeq2SeqLM.from_pretrained({str(tmp_path / "model")!r}, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        input_ids = torch.full((2, 40), 7)
        input_ids[:, -1] = {EOS}
        attention_mask = torch.ones_like(input_ids)
        attention_mask[0, 5:] = 0
        output = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=2)
        lengths = [row[1:].tolist().index({EOS}) + 1 for row in output]
        print("LENGTHS", lengths)
        """
    result = run_without_hf_relpos(script, tmp_path)
    assert "LENGTHS [8, 43]" in result.stdout, result.stderr[-3000:]


@pytest.mark.parametrize("passed", [False, True], ids=["saved", "passed"])
def test_a_max_length_beside_the_cap_ceiling_gives_no_warning_that_both_are_set(passed, caplog):
    """Seq2SeqTrainer's evaluation fills generate's defaults into the model's generation config (max_length 20
    beside the cap's max_new_tokens), and the model is saved with them: the cap folds max_length into its ceiling,
    so generate neither warns at every call that both are set nor stops at max_length."""
    model = capped_model(ratio=1.0, offset=30, ceiling=60)
    model.generation_config.update(**model.generation_config._get_default_generation_params(), defaults_only=True)
    assert model.generation_config.max_length == 20
    ids, mask = sources([4, 9])
    config = type(model.generation_config)(num_beams=2, max_length=20) if passed else None
    with caplog.at_level("WARNING"), torch.no_grad():
        output = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    assert new_lengths(output) == [34, 39]
    assert "seem to have been set" not in caplog.text
    assert model.generation_config.max_length == 20   # the model's config is left as it was


def test_a_model_built_in_a_script_caps_by_source_once_the_readme_fields_are_set():
    """README: a model built from its config has no source-relative rule (transformers' default of 20 new tokens, 19
    once Seq2SeqTrainer has written max_length 20 into its generation config) until max_len_a, max_len_b and
    max_new_tokens are set on its generation config; then each source is capped by its own length, the trainer's
    max_length notwithstanding."""
    model = tiny_model("shaw")
    with torch.no_grad():
        model.final_logits_bias[0, EOS] = -1e4
    ids, mask = sources([4, 30])
    with torch.no_grad(), pytest.warns(UserWarning, match="model-agnostic default `max_length`"):
        assert new_lengths(model.generate(input_ids=ids, attention_mask=mask)) == [DEFAULT_NEW_TOKENS] * 2
    with torch.no_grad():
        model.generation_config.update(**model.generation_config._get_default_generation_params(), defaults_only=True)
        assert new_lengths(model.generate(input_ids=ids, attention_mask=mask)) == [DEFAULT_NEW_TOKENS - 1] * 2
        model.generation_config.max_len_a, model.generation_config.max_len_b = 1.0, 50
        model.generation_config.max_new_tokens = 1023
        assert new_lengths(model.generate(input_ids=ids, attention_mask=mask)) == [54, 80]


def test_a_capped_generate_leaves_the_models_generation_config_to_a_call_in_another_thread(caplog):
    """A capped generate leaves the model's generation config alone while it runs: a call in another thread (a
    server's), started before the capped one ends and ending after it, reads the saved max_length (an uncapped call,
    max_len_b=None, ends there, where the model-agnostic default of 20 was read), and so does any other reader; the
    capped call gives no warning that both max_new_tokens and max_length are set."""
    model = capped_model(ratio=1.0, offset=3, ceiling=60)
    model.generation_config.max_length = 25
    config = model.generation_config
    first_in, second_in, first_done = threading.Event(), threading.Event(), threading.Event()
    seen, results = [], {}

    def step(entered: threading.Event, wait_for: threading.Event):
        def processor(input_ids, scores):
            seen.append(model.generation_config.max_length)
            if not entered.is_set():
                entered.set()
                wait_for.wait(timeout=60)
            return scores
        return processor

    def run(name: str, processor, **kwargs) -> None:
        ids, mask = sources([4, 9])
        with torch.no_grad():
            results[name] = new_lengths(model.generate(input_ids=ids, attention_mask=mask,
                                                       logits_processor=LogitsProcessorList([processor]), **kwargs))

    first = threading.Thread(target=run, args=("capped", step(first_in, second_in)))
    second = threading.Thread(target=run, args=("uncapped", step(second_in, first_done)),
                              kwargs={"max_len_b": None, "max_new_tokens": None})
    with caplog.at_level("WARNING"):
        first.start()
        assert first_in.wait(timeout=60)
        second.start()
        first.join(timeout=120)
        first_done.set()
        second.join(timeout=120)
    assert results == {"capped": [7, 12], "uncapped": [24, 24]}
    assert model.generation_config is config and config.max_length == 25
    assert set(seen) == {25}
    assert "seem to have been set" not in caplog.text
