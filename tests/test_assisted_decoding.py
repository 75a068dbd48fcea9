"""Assisted decoding (`generate(..., assistant_model=...)`, `prompt_lookup_num_tokens`): the model verifies several
draft tokens in one forward at the cache's offset and crops the cache back past those it rejects, so its tokens are
greedy decoding's, for every scheme and kernel, whether the drafts are all accepted (the model drafts for itself),
partly accepted (a slightly perturbed copy drafts four tokens a round: the cache is cropped inside a draft), mostly
rejected (another model drafts) or looked up in the prompt: the same tokens, and every step's logits within 1e-12
(float64). Greedy decoding repeats no token (no_repeat_ngram_size=1), so that drafts can agree in part. A
Transformer-XL memory, which cannot be cropped, is refused with one error."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import BUILT_IN_SCHEMES, requires_relpos_triton, spread_model, tiny_config
from transformers.generation.candidate_generator import AssistedCandidateGenerator
from transformers.generation.utils import GenerateBeamEncoderDecoderOutput

import hf_relpos

SOURCE = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 10, 2]])
GREEDY = dict(do_sample=False, max_new_tokens=12, min_new_tokens=12, output_logits=True, return_dict_in_generate=True,
              no_repeat_ngram_size=1)
REFUSAL = (r"^this model cannot {} in assisted decoding \(assistant_model, prompt_lookup_num_tokens, "
           r"assistant_early_exit\): ")
XL_MEMORY = r"a Transformer-XL memory \(mem_len=4\) drops its oldest states"


def redrawn(model, seed: int):
    """`model` with every weight drawn again from N(0, 0.5) under `seed`: a draft that disagrees with it."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.5)
    return model


def assert_same_decoding(assisted, greedy) -> None:
    """The same tokens and every step's logits at 1e-12; the logits differ from step to step (positions count)."""
    assert torch.equal(assisted.sequences, greedy.sequences)
    logits = torch.stack(greedy.logits)
    assert (logits[1:] - logits[:-1]).abs().amax() > 1e-3
    torch.testing.assert_close(torch.stack(assisted.logits), logits, rtol=0, atol=1e-12)


def perturbed(model, seed: int = 1):
    """A copy of `model` with N(0, 0.05) added to every weight, drafting four tokens a round whatever its confidence:
    its drafts agree with `model` in part."""
    torch.manual_seed(seed)
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    draft.generation_config.update(assistant_confidence_threshold=0.0, num_assistant_tokens=4,
                                   num_assistant_tokens_schedule="constant")
    return draft


@pytest.fixture
def draft_rounds(monkeypatch) -> list[list[int]]:
    """[drafted, accepted] tokens of each round of assisted decoding with a draft model, filled as generate runs."""
    rounds: list[list[int]] = []
    get_candidates, update = (AssistedCandidateGenerator.get_candidates,
                              AssistedCandidateGenerator.update_candidate_strategy)

    def drafted(self, input_ids, **kwargs):
        candidates = get_candidates(self, input_ids, **kwargs)
        rounds.append([candidates[0].shape[1] - input_ids.shape[1], -1])
        return candidates

    def accepted(self, input_ids, scores, num_matches):
        rounds[-1][1] = num_matches
        return update(self, input_ids, scores, num_matches)

    monkeypatch.setattr(AssistedCandidateGenerator, "get_candidates", drafted)
    monkeypatch.setattr(AssistedCandidateGenerator, "update_candidate_strategy", accepted)
    return rounds


def drafting(model, position_scheme: str, kernel: str, draft: str) -> dict:
    """generate's arguments for a draft: the model itself (every draft token accepted), a perturbed copy (some
    accepted), another model of the same vocabulary (most rejected), or n-grams looked up in the prompt."""
    if draft == "itself":
        return dict(assistant_model=model)
    if draft == "a perturbed copy":
        return dict(assistant_model=perturbed(model))
    if draft == "another model":
        return dict(assistant_model=redrawn(spread_model(position_scheme, kernel), seed=1))
    return dict(prompt_lookup_num_tokens=3)


def assert_partly_accepted(draft: str, rounds: list[list[int]]) -> None:
    """The perturbed copy's drafts were cut inside in some round: accepted in part (0 < accepted < drafted)."""
    if draft == "a perturbed copy":
        assert any(0 < accepted < drafted for drafted, accepted in rounds), rounds


@pytest.mark.parametrize("draft", ["itself", "a perturbed copy", "another model", "prompt lookup"])
@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
@pytest.mark.parametrize("position_scheme", BUILT_IN_SCHEMES)
def test_assisted_decoding_gives_the_greedy_tokens(position_scheme, kernel, draft, draft_rounds):
    model = spread_model(position_scheme, kernel)
    with torch.no_grad():
        greedy = model.generate(input_ids=SOURCE, **GREEDY)
        assisted = model.generate(input_ids=SOURCE, **GREEDY, **drafting(model, position_scheme, kernel, draft))
    assert_same_decoding(assisted, greedy)
    assert_partly_accepted(draft, draft_rounds)


@requires_relpos_triton
@pytest.mark.parametrize("draft", ["itself", "a perturbed copy", "another model"])
def test_assisted_decoding_on_the_fused_kernel_gives_the_greedy_tokens(draft, draft_rounds):
    model = spread_model("shaw", "relpos_triton")
    with torch.no_grad():
        greedy = model.generate(input_ids=SOURCE, **GREEDY)
        assisted = model.generate(input_ids=SOURCE, **GREEDY, **drafting(model, "shaw", "relpos_triton", draft))
    assert_same_decoding(assisted, greedy)
    assert_partly_accepted(draft, draft_rounds)


def causal_lm(position_scheme: str, **overrides):
    torch.manual_seed(0)
    config = tiny_config(position_scheme, d_model=16, decoder_layers=2, decoder_attention_heads=2, decoder_ffn_dim=32,
                         pad_token_id=0, eos_token_id=2, bos_token_id=1, **overrides)
    return redrawn(hf_relpos.RelPosTransformerForCausalLM(config).double().eval(), seed=0)


@pytest.mark.parametrize("draft", ["itself", "a perturbed copy", "prompt lookup"])
@pytest.mark.parametrize("position_scheme", ["shaw", "rope", "xl", "t5"])
def test_assisted_decoding_of_the_causal_lm_gives_the_greedy_tokens(position_scheme, draft, draft_rounds):
    model = causal_lm(position_scheme)
    with torch.no_grad():
        greedy = model.generate(input_ids=SOURCE, **GREEDY)
        assisted = model.generate(input_ids=SOURCE, **GREEDY, **drafting(model, position_scheme, "eager", draft))
    assert_same_decoding(assisted, greedy)
    assert_partly_accepted(draft, draft_rounds)


@pytest.mark.parametrize("draft", ["itself", "prompt lookup"])
@pytest.mark.parametrize("mem_len_in", ["config", "call"])
def test_assisted_decoding_with_a_transformer_xl_memory_is_one_error(mem_len_in, draft):
    model = causal_lm("xl", mem_len=4 if mem_len_in == "config" else 0)
    per_call = dict(mem_len=4) if mem_len_in == "call" else {}
    with pytest.raises(ValueError, match=REFUSAL.format("decode with an assistant") + XL_MEMORY):
        model.generate(input_ids=SOURCE, **GREEDY, **per_call, **drafting(model, "xl", "eager", draft))


def test_a_transformer_xl_memory_model_drafting_for_another_model_is_one_error():
    model, draft = causal_lm("shaw"), causal_lm("xl", mem_len=4)
    with pytest.raises(ValueError, match=REFUSAL.format("draft for another model") + XL_MEMORY):
        model.generate(input_ids=SOURCE, **GREEDY, assistant_model=draft)


@pytest.mark.parametrize("draft", ["another model", "prompt lookup"])
def test_assisted_decoding_at_randomized_positions_gives_the_greedy_tokens(draft):
    """position_randomization_at_inference: generate draws the decoder's positions once; the verification reads
    them as greedy decoding does, and they are not passed on to the draft model."""
    model = spread_model("shaw", "eager", position_randomization_max=64, position_randomization_at_inference=True)
    arguments = drafting(model, "shaw", "eager", draft)
    with torch.no_grad():
        torch.manual_seed(3)
        greedy = model.generate(input_ids=SOURCE, **GREEDY)
        torch.manual_seed(3)
        assert_same_decoding(model.generate(input_ids=SOURCE, **GREEDY, **arguments), greedy)


@pytest.mark.parametrize("model_class", ["translation", "causal LM"])
def test_a_draft_model_with_randomized_positions_is_one_error(model_class):
    randomized = dict(position_randomization_max=64, position_randomization_at_inference=True)
    if model_class == "translation":
        model, draft = spread_model("shaw", "eager"), spread_model("shaw", "eager", **randomized)
    else:
        model, draft = causal_lm("shaw"), causal_lm("shaw", **randomized)
    with pytest.raises(ValueError, match=REFUSAL.format("draft for another model") + "position_randomization_at_"):
        model.generate(input_ids=SOURCE, **GREEDY, assistant_model=draft)


@pytest.mark.parametrize("model_class", ["translation", "causal LM"])
def test_the_main_model_s_drawn_positions_are_not_passed_to_its_draft(model_class):
    """A main model with position_randomization_at_inference draws its positions in generate; its draft (not
    randomized) is called without them, at its own positions, in every round."""
    randomized = dict(position_randomization_max=64, position_randomization_at_inference=True)
    if model_class == "translation":
        model, draft, argument = spread_model("shaw", "eager", **randomized), spread_model("shaw", "eager"), "decoder_positions"
    else:
        model, draft, argument = causal_lm("shaw", **randomized), redrawn(causal_lm("shaw"), seed=1), "positions"
    passed = []
    draft.register_forward_pre_hook(lambda module, args, kwargs: passed.append(kwargs.get(argument)), with_kwargs=True)
    with torch.no_grad():
        model.generate(input_ids=SOURCE, **GREEDY, assistant_model=draft)
    assert len(passed) > 1 and all(positions is None for positions in passed)



def test_a_beam_search_asked_for_with_a_draft_model_ignores_the_draft():
    """transformers' assisted decoding has greedy search and sampling only: with num_beams 4 (as a translation run's
    saved generation config may set) it warns and runs the beam search, never calling the draft model (no speed-up),
    as docs/internals.md says."""
    model = spread_model("shaw", "eager")
    draft = redrawn(spread_model("shaw", "eager"), seed=1)
    calls = []
    draft.register_forward_pre_hook(lambda module, args: calls.append(1))
    settings = dict(GREEDY, num_beams=4, output_scores=True)
    with torch.no_grad():
        beam = model.generate(input_ids=SOURCE, **settings)
        assisted = model.generate(input_ids=SOURCE, **settings, assistant_model=draft)
    assert isinstance(assisted, GenerateBeamEncoderDecoderOutput) and not calls
    assert torch.equal(assisted.sequences, beam.sequences)
    torch.testing.assert_close(assisted.sequences_scores, beam.sequences_scores, rtol=0, atol=1e-12)
