"""generate's features, as MT engineers use them, on a converted MarianMTModel and on every built-in scheme.

Part 1, parity: a random float64 MarianMTModel and its `absolute` conversion (the same function, test_convert.py)
give the same output for each feature on a padded batch: token ids, beam indices and every returned tensor.
transformers casts the next-token logits to float32 inside generate, so `scores`, `logits` and `sequences_scores` are
compared at float32 rounding; attentions and hidden states stay float64 and are compared at 1e-12.

Part 2, self-consistency of every built-in scheme (float64, eager and sdpa): the same features with and without the
KV cache give the same output; generate's attentions are probabilities (each query row sums to 1 over the keys it may
see, 0 on padding and future keys) and a cached step's row is the uncached forward's last row; decoding after a
target prefix gives the teacher-forced logits.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from conftest import BUILT_IN_SCHEMES, spread_model
from test_convert import EOS, PAD, float64_marian, padded_batch
from transformers import CompileConfig

from hf_relpos.tools.convert import marian_to_relpos

pytestmark = pytest.mark.numerics

FLOAT64 = {"rtol": 0.0, "atol": 1e-12}
FLOAT32_ROUNDING = {"rtol": 2.5e-7, "atol": 1e-12}   # two float32 ulps: generate's float32 copy of float64 logits
RETURN_ALL = {"return_dict_in_generate": True, "output_scores": True, "output_logits": True}
# A random Marian model repeats one token under greedy and beam search; banning repeated bigrams makes it search.
SEARCH = {"no_repeat_ngram_size": 2, "max_new_tokens": 8}
CACHE_FIELDS = ("cache", "past_key_values")   # the generate output's cache, under its v5 and older names
DECODER_PREFIX = torch.tensor([[PAD, 5, 9], [PAD, 11, 3], [PAD, 7, 8]])


def assert_same_output(got, expected, skip: tuple[str, ...] = ()) -> None:
    """Every non-None field of two generate outputs (the cache left out) but those in `skip`, which must only be
    present in both alike: integer tensors equal, float32 ones at float32 rounding, float64 ones at 1e-12, nested
    tuples alike."""
    fields = {key for key, value in expected.items() if value is not None and key not in CACHE_FIELDS}
    assert fields == {key for key, value in got.items() if value is not None and key not in CACHE_FIELDS}
    for key in fields:
        if key in skip:
            continue
        assert_same_tensors(got[key], expected[key], key)


def assert_same_tensors(got, expected, name: str) -> None:
    if isinstance(expected, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(expected), name
        for index, (got_item, expected_item) in enumerate(zip(got, expected, strict=True)):
            assert_same_tensors(got_item, expected_item, f"{name}[{index}]")
    elif expected.is_floating_point():
        assert got.dtype == expected.dtype, name
        tolerance = FLOAT64 if expected.dtype == torch.float64 else FLOAT32_ROUNDING
        torch.testing.assert_close(got, expected, **tolerance, msg=lambda message: f"{name}: {message}")
    else:
        assert torch.equal(got, expected), name


def generate_with_seed(model, **kwargs):
    torch.manual_seed(123)   # sampling draws the same numbers in both models
    with torch.no_grad():
        return model.generate(**kwargs)


@pytest.fixture(scope="module")
def marian_and_converted_models():
    marian = float64_marian()
    return marian, marian_to_relpos(marian, position_scheme="absolute")


@pytest.fixture
def marian_and_converted(marian_and_converted_models):
    """The module's two models on the kernels they were built with at each test's start: a kernel a test sets is
    restored after it, so that no later test runs on it (the kernels of a test that sets none were those of whichever
    test ran before it in the worker)."""
    kernels = [model.config._attn_implementation for model in marian_and_converted_models]
    yield marian_and_converted_models
    for model, kernel in zip(marian_and_converted_models, kernels, strict=True):
        model.set_attn_implementation(kernel)


def source() -> dict[str, torch.Tensor]:
    batch = padded_batch()
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


def alternate_vocabulary(batch_id: int, prefix: torch.Tensor) -> list[int]:
    """A prefix_allowed_tokens_fn: odd steps may take tokens 2..29, even steps every third token."""
    return list(range(2, 30)) if prefix.size(-1) % 2 else list(range(1, 60, 3))


PARITY_CASES = {
    "greedy": dict(SEARCH),
    "sampling": dict(do_sample=True, top_k=10, top_p=0.9, temperature=0.7, num_return_sequences=2, max_new_tokens=8),
    "sampling_min_p_typical": dict(do_sample=True, min_p=0.05, typical_p=0.9, epsilon_cutoff=1e-4, max_new_tokens=8),
    "beam_sampling": dict(do_sample=True, num_beams=3, max_new_tokens=8),
    "beam_n_best": dict(SEARCH, num_beams=4, num_return_sequences=3),
    "beam_length_penalty_early_stopping": dict(SEARCH, num_beams=4, num_return_sequences=2, length_penalty=0.5,
                                               early_stopping=True),
    "beam_length_penalty_heuristic": dict(SEARCH, num_beams=4, length_penalty=2.0, early_stopping=False),
    "beam_never_stops_early": dict(SEARCH, num_beams=4, early_stopping="never", min_new_tokens=3),
    "bad_words_ids": dict(SEARCH, num_beams=2, bad_words_ids=[[30], [18, 11]]),
    "prefix_allowed_tokens_fn": dict(SEARCH, num_beams=2, prefix_allowed_tokens_fn=alternate_vocabulary),
    "forced_bos_and_eos": dict(SEARCH, forced_bos_token_id=7, forced_eos_token_id=EOS),
    "no_repeat_ngram_size": dict(max_new_tokens=8, num_beams=3, no_repeat_ngram_size=3),
    "encoder_no_repeat_ngram_size": dict(SEARCH, num_beams=3, encoder_no_repeat_ngram_size=2),
    "repetition_penalties": dict(max_new_tokens=8, repetition_penalty=1.5, encoder_repetition_penalty=1.3),
    "sequence_bias": dict(SEARCH, sequence_bias={(30,): -10.0, (7, 8): 5.0}),
    "min_new_tokens": dict(SEARCH, min_new_tokens=6, num_beams=2),
    "suppress_tokens": dict(SEARCH, suppress_tokens=[5, 6], begin_suppress_tokens=[7]),
    "exponential_decay_length_penalty": dict(SEARCH, num_beams=2, exponential_decay_length_penalty=(3, 1.5)),
    "decoder_prefix": dict(SEARCH, decoder_input_ids=DECODER_PREFIX),
    "decoder_prefix_beam": dict(SEARCH, num_beams=3, decoder_input_ids=DECODER_PREFIX),
    "without_cache": dict(SEARCH, num_beams=2, use_cache=False),
    "static_cache": dict(SEARCH, cache_implementation="static"),
    "static_cache_beam": dict(SEARCH, num_beams=2, cache_implementation="static"),
    "attentions_and_hidden_states": dict(SEARCH, output_attentions=True, output_hidden_states=True),
    "attentions_and_hidden_states_beam": dict(SEARCH, num_beams=3, num_return_sequences=2, output_attentions=True,
                                              output_hidden_states=True),
    "attentions_without_cache": dict(SEARCH, use_cache=False, output_attentions=True),
    "attentions_static_cache": dict(SEARCH, cache_implementation="static", output_attentions=True),
}


@pytest.mark.parametrize("case", PARITY_CASES)
def test_the_absolute_conversion_generates_as_marian(marian_and_converted, case):
    marian, converted = marian_and_converted
    kwargs = {**source(), **RETURN_ALL, **PARITY_CASES[case]}
    marian.set_attn_implementation("eager")   # Marian returns attentions on eager only
    converted.set_attn_implementation("eager")
    expected = generate_with_seed(marian, **kwargs)
    assert_same_output(generate_with_seed(converted, **kwargs), expected)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_the_parity_cases_search_among_many_tokens(marian_and_converted, num_beams):
    """With SEARCH's settings Marian's greedy and beam outputs hold more than four distinct tokens: the parity
    cases compare a search, not one repeated token."""
    marian, _ = marian_and_converted
    sequences = generate_with_seed(marian, **source(), **SEARCH, num_beams=num_beams)
    assert len(set(sequences[:, 1:].flatten().tolist())) > 4


def test_beam_search_scores_and_transition_scores_are_marians(marian_and_converted):
    """sequences_scores, beam_indices and compute_transition_scores (per-token log-probabilities of the n-best)."""
    marian, converted = marian_and_converted
    kwargs = {**source(), **SEARCH, "num_beams": 4, "num_return_sequences": 2, **RETURN_ALL}
    expected, got = generate_with_seed(marian, **kwargs), generate_with_seed(converted, **kwargs)
    assert torch.equal(got.beam_indices, expected.beam_indices)
    for normalize_logits in (False, True):
        transitions = [model.compute_transition_scores(output.sequences, output.scores, output.beam_indices,
                                                       normalize_logits=normalize_logits)
                       for model, output in ((marian, expected), (converted, got))]
        torch.testing.assert_close(transitions[1], transitions[0], **FLOAT32_ROUNDING)
    torch.testing.assert_close(got.sequences_scores, expected.sequences_scores, **FLOAT32_ROUNDING)


def test_sdpa_returns_the_attentions_marian_returns_on_eager(marian_and_converted):
    """Marian on sdpa returns empty attention tuples (transformers' sdpa forms no probabilities); hf_relpos runs those
    calls on its eager function, so its attentions on sdpa are Marian's eager ones, e.g. for word alignment."""
    marian, converted = marian_and_converted
    kwargs = {**source(), **SEARCH, "num_beams": 2, "output_attentions": True, **RETURN_ALL}
    marian.set_attn_implementation("eager")
    converted.set_attn_implementation("sdpa")
    expected = generate_with_seed(marian, **kwargs)
    assert_same_output(generate_with_seed(converted, **kwargs), expected)


def test_encoder_outputs_passed_to_generate_give_marians_output(marian_and_converted):
    marian, converted = marian_and_converted
    outputs = []
    for model in (marian, converted):
        with torch.no_grad():
            encoded = model.get_encoder()(**source())
        outputs.append(generate_with_seed(model, encoder_outputs=encoded, attention_mask=source()["attention_mask"],
                                          num_beams=2, **SEARCH, **RETURN_ALL))
    assert_same_output(outputs[1], outputs[0])


def assert_rows_decode_as_alone(batched, alone_outputs: list, prompt_mask: torch.Tensor) -> None:
    """Row i of a generate over left-padded decoder prompts (`prompt_mask` [B, n]) is `alone_outputs[i]`, the same row
    decoded alone without its padding: the tokens after the padding (then only padding), and the logits of every step
    (float32 rounding)."""
    for row, alone in enumerate(alone_outputs):
        padding = int((prompt_mask[row] == 0).sum())
        length = alone.sequences.size(1)
        assert torch.equal(batched.sequences[row, padding : padding + length], alone.sequences[0])
        assert not batched.sequences[row, padding + length :].any()   # PAD (0) after the row ended
        for step, logits in enumerate(alone.logits):
            torch.testing.assert_close(batched.logits[step][row], logits[0], **FLOAT32_ROUNDING)


LEFT_PADDED_PREFIX = torch.tensor([[PAD, PAD, PAD, 5, 9], [PAD, PAD, 11, 3, 4], [PAD, 7, 7, 8, 2]])
LEFT_PADDED_PREFIX_MASK = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])


def test_a_left_padded_decoder_prefix_decodes_each_row_as_marian_decodes_it_alone(marian_and_converted):
    """Target prefixes of different lengths, left-padded with decoder_attention_mask: each row of the converted
    model's output is Marian's for that row alone (Marian itself places a padded row after its padding, the converted
    model counts the positions over the row's tokens: `place_decoder_prompt`). A padding query, which may attend to
    no key, gets a zero row of attention weights (Marian's are uniform)."""
    marian, converted = marian_and_converted
    for model in (marian, converted):
        model.set_attn_implementation("eager")
    kwargs = {"max_new_tokens": 8, **RETURN_ALL}
    got = generate_with_seed(converted, **source(), decoder_input_ids=LEFT_PADDED_PREFIX,
                             decoder_attention_mask=LEFT_PADDED_PREFIX_MASK, output_attentions=True, **kwargs)
    sources, source_masks = source()["input_ids"], source()["attention_mask"].bool()
    alone = [generate_with_seed(marian, input_ids=sources[row][source_masks[row]][None],
                                decoder_input_ids=LEFT_PADDED_PREFIX[row][LEFT_PADDED_PREFIX_MASK[row].bool()][None],
                                **kwargs)
             for row in range(sources.size(0))]
    assert_rows_decode_as_alone(got, alone, LEFT_PADDED_PREFIX_MASK)
    padding_queries = ~LEFT_PADDED_PREFIX_MASK.bool()[:, None, :, None]   # [B, 1, n, 1] of the prompt step
    for layer in got.decoder_attentions[0]:
        assert not (layer * padding_queries).any()


def test_inputs_embeds_are_scaled_by_the_model_unlike_marians_encoder(marian_and_converted):
    """hf_relpos scales `inputs_embeds` by sqrt(d_model) in both stacks, so `get_input_embeddings()(ids)` passed as
    inputs_embeds gives the output of the ids; Marian's encoder takes them already scaled (its decoder scales them)."""
    marian, converted = marian_and_converted
    ids, mask = source()["input_ids"], source()["attention_mask"]
    kwargs = {"attention_mask": mask, **SEARCH, **RETURN_ALL}
    embeddings = converted.get_input_embeddings()(ids)
    from_ids = generate_with_seed(converted, input_ids=ids, **kwargs)
    from_embeddings = generate_with_seed(converted, inputs_embeds=embeddings, **kwargs)
    assert_same_output(from_embeddings, from_ids)
    scale = converted.model.encoder.embed_scale
    assert_same_output(generate_with_seed(marian, inputs_embeds=embeddings * scale, **kwargs), from_embeddings)


def test_prompt_lookup_decoding_gives_marians_output(marian_and_converted):
    """Assisted decoding by n-gram lookup in the source (batch of one, as transformers requires)."""
    marian, converted = marian_and_converted
    kwargs = {key: value[:1] for key, value in source().items()}
    kwargs.update(SEARCH, prompt_lookup_num_tokens=3, **RETURN_ALL)
    assert_same_output(generate_with_seed(converted, **kwargs), generate_with_seed(marian, **kwargs))


def test_marian_drafts_for_the_converted_model_given_a_decoder_prompt_and_its_mask(marian_and_converted):
    """Assisted decoding with the source Marian model as the draft, a target prefix and its (unpadded) mask: the
    converted model's greedy output. The draft is handed the main model's generate arguments, so none that Marian's
    generate refuses (decoder_position_ids) may be added for a prompt without padding."""
    marian, converted = marian_and_converted
    kwargs = {key: value[:1] for key, value in source().items()}
    kwargs.update(SEARCH, decoder_input_ids=DECODER_PREFIX[:1], decoder_attention_mask=torch.ones(1, 3, dtype=torch.long),
                  **RETURN_ALL)
    assert_same_output(generate_with_seed(converted, assistant_model=marian, **kwargs),
                       generate_with_seed(converted, **kwargs))


# Part 2: every built-in scheme, consistent with itself.
SOURCE = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 2], [12, 13, 14, 2, 0, 0, 0, 0], [15, 16, 17, 18, 19, 2, 0, 0]])
SOURCE_MASK = (SOURCE != 0).long()
TARGET_PREFIX = torch.tensor([[1, 7, 9], [1, 20, 3], [1, 4, 4]])   # spread_model's decoder_start_token_id is 1
NEW_TOKENS = 7
SCHEME_CASES = {
    "greedy": {},
    "beam_n_best_length_penalty": dict(num_beams=3, num_return_sequences=2, length_penalty=0.7),
    "sampling": dict(do_sample=True, top_k=8, top_p=0.9, temperature=0.8, num_return_sequences=2),
    "processors": dict(num_beams=2, no_repeat_ngram_size=2, repetition_penalty=1.3, bad_words_ids=[[5]],
                       min_new_tokens=5, sequence_bias={(7,): 2.0}),
    "prefix": dict(decoder_input_ids=TARGET_PREFIX),
    "prefix_beam": dict(decoder_input_ids=TARGET_PREFIX, num_beams=3),
    "attentions": dict(output_attentions=True, output_hidden_states=True),
    "attentions_beam": dict(output_attentions=True, num_beams=2),
}


# generate's per-step outputs, over the new query only with the cache, over every query without it
PER_STEP_FIELDS = ("decoder_attentions", "cross_attentions", "decoder_hidden_states")


def generate_scheme(model, **kwargs):
    return generate_with_seed(model, input_ids=SOURCE, attention_mask=SOURCE_MASK, max_new_tokens=NEW_TOKENS,
                              **RETURN_ALL, **kwargs)


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
@pytest.mark.parametrize("position_scheme", BUILT_IN_SCHEMES)
def test_every_feature_gives_the_same_output_with_and_without_the_cache(position_scheme, kernel):
    """Each case with use_cache True and False: the same tokens, scores and beams; with output_attentions and
    output_hidden_states, a cached step's attention row and hidden states (one query) are the last row of the uncached
    step's (which recomputes every query), at 1e-12."""
    model = spread_model(position_scheme, kernel)
    for case, kwargs in SCHEME_CASES.items():
        cached, uncached = generate_scheme(model, use_cache=True, **kwargs), generate_scheme(model, use_cache=False,
                                                                                            **kwargs)
        assert_same_output(cached, uncached, skip=PER_STEP_FIELDS)
        if not kwargs.get("output_attentions"):
            continue
        assert_same_tensors(cached.encoder_attentions, uncached.encoder_attentions, f"{case} encoder_attentions")
        for key in PER_STEP_FIELDS:
            if cached.get(key) is None:
                continue
            for step, (cached_step, uncached_step) in enumerate(zip(cached[key], uncached[key], strict=True)):
                for layer, (cached_layer, uncached_layer) in enumerate(zip(cached_step, uncached_step, strict=True)):
                    assert cached_layer.size(-2) == 1   # one query: [B, H, 1, keys] or [B, 1, d_model]
                    assert_same_tensors(cached_layer, uncached_layer[..., -1:, :], f"{case} {key}[{step}][{layer}]")


def assert_probabilities(weights: torch.Tensor, allowed: torch.Tensor, name: str, empty_rows: bool = False) -> None:
    """`weights` [B, H, n, m] are zero where `allowed` [B, 1, n, m] is False, and each row sums to 1 (or to 0 with
    `empty_rows`: a query a scheme's mask leaves no key, as directional's first forward token)."""
    assert not (weights * ~allowed).any(), f"{name}: weight on a key the query may not see"
    sums = weights.sum(-1)
    ones = (sums - 1).abs() <= 1e-12
    if empty_rows:
        ones |= sums == 0
    assert bool(ones.all()), f"{name}: rows sum to {sums[~ones].tolist()}"


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
@pytest.mark.parametrize("position_scheme", BUILT_IN_SCHEMES)
def test_generated_attentions_are_probabilities_over_the_keys_each_query_may_see(position_scheme, kernel):
    """Encoder, decoder and cross attentions of an uncached generate (every step attends over the whole prefix) and
    of a cached one (one query a step): [B, H, n, m] rows summing to 1, zero on padding and future keys; one hidden
    state per layer plus the embeddings per step."""
    model = spread_model(position_scheme, kernel)
    heads, layers = model.config.decoder_attention_heads, model.config.decoder_layers
    empty_rows = position_scheme == "directional"   # its forward heads leave the first token no key (a zero row)
    real_sources = SOURCE_MASK.bool()
    for use_cache in (False, True):
        output = generate_scheme(model, use_cache=use_cache, output_attentions=True, output_hidden_states=True)
        for layer in output.encoder_attentions:   # bidirectional: every query, padding too, sees the real keys
            assert layer.shape == (SOURCE.size(0), model.config.encoder_attention_heads, SOURCE.size(1), SOURCE.size(1))
            assert_probabilities(layer, real_sources[:, None, None, :], "encoder", empty_rows)
        assert len(output.decoder_attentions) == NEW_TOKENS and len(output.decoder_hidden_states) == NEW_TOKENS
        for step, (self_layers, cross_layers, hidden) in enumerate(zip(
                output.decoder_attentions, output.cross_attentions, output.decoder_hidden_states, strict=True)):
            assert len(self_layers) == len(cross_layers) == layers and len(hidden) == layers + 1
            keys = step + 1
            queries = 1 if use_cache else keys
            future = torch.ones(keys, keys, dtype=torch.bool).tril()[-queries:]
            for self_weights, cross_weights in zip(self_layers, cross_layers, strict=True):
                assert self_weights.shape == (SOURCE.size(0), heads, queries, keys)
                assert cross_weights.shape == (SOURCE.size(0), heads, queries, SOURCE.size(1))
                assert_probabilities(self_weights, future[None, None], f"decoder step {step}", empty_rows)
                assert_probabilities(cross_weights, real_sources[:, None, None, :], f"cross step {step}")


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
@pytest.mark.parametrize("position_scheme", BUILT_IN_SCHEMES)
def test_decoding_after_a_target_prefix_gives_the_teacher_forced_logits(position_scheme, kernel):
    """A forced target prefix (decoder_input_ids): generate keeps it, and its logits at every new step are the
    forward pass's over the whole output (teacher forcing), up to generate's float32 copy."""
    model = spread_model(position_scheme, kernel)
    output = generate_scheme(model, decoder_input_ids=TARGET_PREFIX)
    assert torch.equal(output.sequences[:, :TARGET_PREFIX.size(1)], TARGET_PREFIX)
    with torch.no_grad():
        forced = model(input_ids=SOURCE, attention_mask=SOURCE_MASK, decoder_input_ids=output.sequences[:, :-1]).logits
    torch.testing.assert_close(torch.stack(output.logits, 1), forced[:, TARGET_PREFIX.size(1) - 1:].float(),
                               **FLOAT32_ROUNDING)


@pytest.mark.parametrize("position_scheme", ["absolute", "shaw", "t5"])
def test_generate_compiles_its_decoding_step_into_one_graph_with_the_uncompiled_output(position_scheme):
    """generate's own compilation (a static cache and `compile_config`; `_compile_all_devices` lets it compile on the
    CPU, as it does on CUDA by default): the decoding steps run as one Dynamo graph, never recompiled, and give the
    tokens and logits of uncompiled decoding. A counting backend stands for Inductor (tests/test_static_cache.py runs
    Inductor); compile_config is deep-copied by generate, so the graphs are counted in a list it cannot copy."""
    graphs = []

    def count_graphs(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    model = spread_model(position_scheme, "sdpa")
    compile_config = CompileConfig(fullgraph=True, backend=count_graphs, mode=None)
    compile_config._compile_all_devices = True
    kwargs = dict(cache_implementation="static", min_new_tokens=NEW_TOKENS)
    uncompiled = generate_scheme(model, **kwargs)
    compiled = generate_scheme(model, compile_config=compile_config, **kwargs)
    assert len(graphs) == 1
    assert_same_output(compiled, uncompiled)


@pytest.mark.parametrize(("position_scheme", "overrides"), [
    *(pytest.param(scheme, {}, id=scheme) for scheme in BUILT_IN_SCHEMES),
    *(pytest.param(scheme, {"keep_absolute_positions": True}, id=f"{scheme}+absolute")
      for scheme in BUILT_IN_SCHEMES if scheme != "absolute"),
])
def test_a_left_padded_target_prefix_decodes_each_row_as_alone(position_scheme, overrides):
    """Forced target prefixes of different lengths in one batch, left-padded with decoder_attention_mask: each row's
    tokens and logits are those of the row decoded alone, with the cache (dynamic and static) and without it. With
    sinusoids (absolute, keep_absolute_positions) generate placed a padded row after its padding (logits up to 3e-3
    from the row's alone here) until it counted the prompt's positions over its tokens (`place_decoder_prompt`)."""
    model = spread_model(position_scheme, "sdpa", **overrides)
    prefix = torch.tensor([[1, 7, 9, 4], [0, 0, 1, 20], [0, 1, 4, 4]])   # spread_model: pad 0, decoder start 1
    prefix_mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1], [0, 1, 1, 1]])
    for cache in (dict(), dict(cache_implementation="static"), dict(use_cache=False)):
        batched = generate_scheme(model, decoder_input_ids=prefix, decoder_attention_mask=prefix_mask, **cache)
        alone = [generate_with_seed(model, input_ids=SOURCE[row][SOURCE_MASK[row].bool()][None],
                                    decoder_input_ids=prefix[row][prefix_mask[row].bool()][None],
                                    max_new_tokens=NEW_TOKENS, **RETURN_ALL, **cache)
                 for row in range(SOURCE.size(0))]
        assert_rows_decode_as_alone(batched, alone, prefix_mask)


def test_a_decoder_mask_of_another_shape_than_the_prompt_is_the_models_error_naming_it():
    """generate counts prompt positions only from a mask of the prompt's shape: another is left to the decoder's
    mask check, whose error names the mask (not position ids the caller never passed)."""
    model = spread_model("absolute", "sdpa")
    with pytest.raises(ValueError, match=r"^the decoder's attention_mask must be a \[batch, length\] mask"):
        generate_scheme(model, decoder_input_ids=TARGET_PREFIX, decoder_attention_mask=torch.tensor([[0, 1]] * 3))
