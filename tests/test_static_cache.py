"""A fixed-size KV cache (transformers' StaticCache, `generate(..., cache_implementation="static")`): the token at
cache slot t sits at position t, the query at the cache's fill level p sees slots 0 .. p, and every scheme's terms
equal those of the dynamic cache: decoding steps equal the uncached forward in float64 at 1e-12, and generate gives
the dynamic cache's tokens (greedy and beam search, padded batches, a cache longer than the output). What cannot run
on it is refused with one error naming cache_implementation."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo.testing
from conftest import BUILT_IN_SCHEMES, spread_model, tiny_config
from transformers.cache_utils import DynamicCache, EncoderDecoderCache, StaticCache

import hf_relpos
from hf_relpos.model.positions import POSITION_SCHEMES, PositionScheme, register_position_scheme
from hf_relpos.testing import check_static_cache

KERNELS = ("eager", "sdpa")
SOURCE = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 2], [12, 13, 14, 2, 0, 0, 0, 0], [15, 16, 17, 18, 19, 2, 0, 0]])
REFUSAL = r"^a fixed-size KV cache \(cache_implementation 'static', transformers' StaticCache\) is not supported here: "
DYNAMIC = r"\. Use cache_implementation None or 'dynamic' \(the default dynamic cache\)$"


def static_cache(model, cache_length: int) -> EncoderDecoderCache:
    """What generate builds for cache_implementation "static": `cache_length` self-attention slots, the source's
    length for cross-attention."""
    return EncoderDecoderCache(StaticCache(config=model.config, max_cache_len=cache_length),
                               StaticCache(config=model.config, max_cache_len=SOURCE.size(1)))


def decode_in_steps(model, cache, target: torch.Tensor, target_mask: torch.Tensor, mask_covers_cache: bool):
    """A prompt of 3 decoder tokens, then one token a step, on `cache` (None: a dynamic cache); the decoder mask of
    each call covers the cached tokens and the new ones (`mask_covers_cache`) or the new ones only. Returns the
    logits of every step [B, T, V]."""
    attention_mask = (SOURCE != 0).long()
    encoded = model.model.encoder(input_ids=SOURCE, attention_mask=attention_mask)
    steps, first = [], 0
    for last in (3, *range(4, target.size(1) + 1)):
        output = model(encoder_outputs=encoded, attention_mask=attention_mask, decoder_input_ids=target[:, first:last],
                       decoder_attention_mask=target_mask[:, 0 if mask_covers_cache else first : last], cache=cache,
                       use_cache=True)
        assert cache is None or output.cache is cache
        cache = output.cache
        steps.append(output.logits)
        first = last
    return torch.cat(steps, dim=1)


@pytest.mark.numerics
@pytest.mark.parametrize("layer_norm_position", ["post", "pre"])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("position_scheme", BUILT_IN_SCHEMES)
def test_static_cache_steps_equal_the_uncached_forward(position_scheme, kernel, layer_norm_position):
    """Decoding in steps over a cache of 16 slots (7 unused at the end), with a padded source: with a decoder mask
    over the cached and new tokens (a left-padded target row) every step's logits equal the uncached forward's over
    the whole target; with a mask of the new tokens only (the cached ones count as tokens) they equal the dynamic
    cache's steps; both in float64 at 1e-12."""
    model = spread_model(position_scheme, kernel, layer_norm_position)
    target = torch.randint(3, 40, (SOURCE.size(0), 9), generator=torch.Generator().manual_seed(1))
    target_mask = torch.ones_like(target)
    target_mask[1, 0] = 0
    with torch.no_grad():
        full = model(input_ids=SOURCE, attention_mask=(SOURCE != 0).long(), decoder_input_ids=target,
                     decoder_attention_mask=target_mask, use_cache=False).logits
        cache = static_cache(model, 16)
        stepped = decode_in_steps(model, cache, target, target_mask, mask_covers_cache=True)
        assert cache.self_attention_cache.layers[0].keys.size(2) == 16
        torch.testing.assert_close(stepped, full, rtol=0, atol=1e-12)
        new_only = decode_in_steps(model, static_cache(model, 16), target,
                                   target_mask, mask_covers_cache=False)
        dynamic = decode_in_steps(model, None, target, target_mask, mask_covers_cache=False)
    torch.testing.assert_close(new_only, dynamic, rtol=0, atol=1e-12)
    assert (new_only - stepped).abs().max() > 1e-6   # the masks differ for the padded row: the test tells them apart


def generate_both(model, num_beams: int, max_new_tokens: int) -> tuple:
    """generate's outputs (sequences and every step's logits) with the dynamic cache and with a static one."""
    settings = dict(input_ids=SOURCE, attention_mask=(SOURCE != 0).long(), num_beams=num_beams, do_sample=False,
                    max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, output_logits=True,
                    return_dict_in_generate=True)
    with torch.no_grad():
        return model.generate(**settings), model.generate(**settings, cache_implementation="static")


@pytest.mark.numerics
@pytest.mark.parametrize("num_beams", [1, 3])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("position_scheme", BUILT_IN_SCHEMES)
def test_generate_with_a_static_cache_gives_the_dynamic_caches_tokens(position_scheme, kernel, num_beams):
    """Greedy and beam search over a padded batch of three source lengths: the same sequences, and every step's
    logits within 1e-12 (float64), with cache_implementation "static" as with the dynamic cache, for 14 new tokens
    and then for 5 (generate keeps the longer cache of the earlier call, so most of its slots stay unused)."""
    model = spread_model(position_scheme, kernel)
    for max_new_tokens in (14, 5):
        dynamic, static = generate_both(model, num_beams, max_new_tokens)
        assert torch.equal(static.sequences, dynamic.sequences)
        torch.testing.assert_close(torch.stack(static.logits), torch.stack(dynamic.logits), rtol=0, atol=1e-12)
    assert model._previous_max_cache_length > 6   # the second call ran on the first call's longer cache


@pytest.mark.numerics
@pytest.mark.parametrize(("position_scheme", "overrides"), [
    ("shaw", {"use_relative_values": False}), ("rope", {"rotary_dim": 4}), ("xl", {"clamp_len": 4}),
    ("t5", {"relative_attention_num_buckets": 8, "relative_attention_max_distance": 10}),
], ids=["shaw-k", "rope-partial", "xl-clamped", "t5-log-buckets"])
def test_the_static_cache_check_passes_other_settings_of_the_schemes(position_scheme, overrides):
    """hf_relpos.testing.check_static_cache, which check_position_scheme runs on every built-in scheme at its
    defaults (and on a user's scheme that declares takes_fixed_size_cache), at settings that change what a step on
    a fixed-size cache computes: keys only (no value term), a partial rotation, distances clamped and T5's
    logarithmic buckets reached within the tiny model's 12 tokens."""
    check_static_cache(position_scheme, config_overrides=overrides)


@pytest.mark.parametrize("position_scheme", ["shaw", "rope", "xl"])
def test_causal_lm_generate_with_a_static_cache_gives_the_dynamic_caches_tokens(position_scheme):
    """The causal LM over a left-padded prompt (its 2-D attention mask covers the cache's first slots)."""
    torch.manual_seed(0)
    config = tiny_config(position_scheme, d_model=16, decoder_layers=2, decoder_attention_heads=2, decoder_ffn_dim=32,
                         pad_token_id=0, eos_token_id=2, bos_token_id=1, attn_implementation="sdpa")
    model = hf_relpos.RelPosTransformerForCausalLM(config).double().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.5)
    prompt = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    settings = dict(input_ids=prompt, attention_mask=(prompt != 0).long(), do_sample=False, max_new_tokens=10,
                    min_new_tokens=10, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(model.generate(**settings, cache_implementation="static"), model.generate(**settings))


def test_flex_attention_is_refused_with_a_static_cache():
    model = spread_model("alibi", "flex_attention")
    with pytest.raises(ValueError, match=REFUSAL + r"it runs with attn_implementation \['eager', 'sdpa', "
                                         r"'relpos_triton'\], got 'flex_attention'" + DYNAMIC):
        generate_both(model, 1, 3)


def test_randomized_positions_are_refused_with_a_static_cache():
    model = spread_model("shaw", "sdpa", position_randomization_max=64, position_randomization_at_inference=True)
    with pytest.raises(ValueError, match=REFUSAL + r"randomized positions .*" + DYNAMIC):
        generate_both(model, 1, 3)


def test_transformer_xl_memory_is_refused_with_a_static_cache():
    torch.manual_seed(0)
    config = tiny_config("xl", d_model=16, decoder_layers=1, decoder_attention_heads=2, mem_len=4, pad_token_id=0)
    model = hf_relpos.RelPosTransformerForCausalLM(config).eval()
    prompt = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match=REFUSAL + r"Transformer-XL segment memory \(mem_len > 0, or mems\) .*" + DYNAMIC):
        model.generate(input_ids=prompt, max_new_tokens=3, cache_implementation="static", pad_token_id=0)
    assert model.generate(input_ids=prompt, max_new_tokens=3, pad_token_id=0).shape == (1, 6)


def test_a_scheme_that_does_not_declare_it_is_refused_with_a_static_cache():
    """A registered scheme takes a fixed-size cache only when it says so (`takes_fixed_size_cache`): one written for
    integer offsets would otherwise read a tensor."""

    @register_position_scheme("static_cache_test_undeclared")
    class Undeclared(PositionScheme):
        """Plain attention, without the declaration."""

    try:
        model = spread_model("static_cache_test_undeclared", "sdpa")
        with pytest.raises(ValueError, match=REFUSAL + r"position_scheme 'static_cache_test_undeclared' does not "
                                             r"declare that it takes one \(takes_fixed_size_cache\)" + DYNAMIC):
            generate_both(model, 1, 3)
    finally:
        del POSITION_SCHEMES["static_cache_test_undeclared"]


def test_a_decoder_mask_wider_than_the_cache_is_one_error():
    model = spread_model("shaw", "sdpa")
    attention_mask = (SOURCE != 0).long()
    cache = static_cache(model, 4)
    with pytest.raises(ValueError, match=r"^the decoder's attention_mask must be a \[batch, length\] mask of at most "
                                         r"the fixed-size cache's 4 slots, got \[3, 5\]$"):
        model(input_ids=SOURCE, attention_mask=attention_mask, decoder_input_ids=torch.ones(3, 2, dtype=torch.long),
              decoder_attention_mask=torch.ones(3, 5, dtype=torch.long), cache=cache, use_cache=True)


@pytest.mark.parametrize("cache_kind", ["static", "dynamic"])
def test_a_decoder_mask_narrower_than_the_cached_and_new_tokens_is_one_error(cache_kind):
    """The prompt's [3, 3] mask passed again with the next token, after 3 cached ones: wider than the new token, narrower
    than the cached and new ones. The static cache laid it over slots 1 .. 3 (row 1's padding moved one slot on, in
    silence); it is the dynamic cache's error on both."""
    model = spread_model("shaw", "sdpa")
    attention_mask = (SOURCE != 0).long()
    prompt_mask = torch.ones(3, 3, dtype=torch.long)
    prompt_mask[1, 0] = 0
    cache = static_cache(model, 8) if cache_kind == "static" else None
    with torch.no_grad():
        cache = model(input_ids=SOURCE, attention_mask=attention_mask, decoder_input_ids=torch.full((3, 3), 5),
                      decoder_attention_mask=prompt_mask, cache=cache, use_cache=True).cache
        with pytest.raises(ValueError, match=r"^the decoder's attention_mask must be a \[batch, length\] mask of 1 "
                                             r"\(attend\) and 0 \(padding\): \[3, 1\] \(new tokens\) or \[3, 4 or more\] "
                                             r"\(cached and new\), got \[3, 3\]$"):
            model(input_ids=SOURCE, attention_mask=attention_mask, decoder_input_ids=torch.full((3, 1), 6),
                  decoder_attention_mask=prompt_mask, cache=cache, use_cache=True)


def compiled_decoding(model, backend) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy decoding of a fixed target by hand: the first step uncompiled (as generate does), the next 7 through
    `torch.compile(model, fullgraph=True, dynamic=False, backend=backend)` on one static cache. Returns the steps'
    logits and the uncached forward's."""
    attention_mask = (SOURCE != 0).long()
    target = torch.randint(3, 40, (SOURCE.size(0), 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(input_ids=SOURCE, attention_mask=attention_mask, decoder_input_ids=target, use_cache=False).logits
        encoded = model.model.encoder(input_ids=SOURCE, attention_mask=attention_mask)
        cache = static_cache(model, 12)
        steps = [model(encoder_outputs=encoded, attention_mask=attention_mask, decoder_input_ids=target[:, :1],
                       cache=cache, use_cache=True).logits]
        step = torch.compile(model, fullgraph=True, dynamic=False, backend=backend)
        for position in range(1, target.size(1)):
            steps.append(step(encoder_outputs=encoded, attention_mask=attention_mask,
                              decoder_input_ids=target[:, position : position + 1], cache=cache, use_cache=True).logits)
    return torch.cat(steps, dim=1), full


@pytest.mark.numerics
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("position_scheme", BUILT_IN_SCHEMES)
def test_a_decoding_step_on_a_static_cache_traces_as_one_graph(position_scheme, kernel):
    """Dynamo traces a decoding step whole (fullgraph: no graph break) and once for every step (the fill level is a
    tensor, so no step recompiles); the traced steps' logits equal the uncached forward's in float64 at 1e-12."""
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounter()
    stepped, full = compiled_decoding(spread_model(position_scheme, kernel), counter)
    assert counter.frame_count == 1
    torch.testing.assert_close(stepped, full, rtol=0, atol=1e-12)


@pytest.mark.slow
def test_inductor_compiled_decoding_on_a_static_cache_matches_the_uncached_forward():
    """The same under Inductor (float32, its fused kernels' rounding), Shaw's relative keys and values on sdpa."""
    torch._dynamo.reset()
    stepped, full = compiled_decoding(spread_model("shaw", "sdpa").float(), "inductor")
    torch.testing.assert_close(stepped, full, rtol=0, atol=1e-4)


@pytest.mark.parametrize("cache_kind", ["static", "dynamic"])
def test_a_cache_passed_in_training_with_gradient_checkpointing_is_not_used(cache_kind):
    """In training with gradient checkpointing the layers run without a cache passed to them (transformers'
    GradientCheckpointingLayer drops it): the decoder too then runs as with none, its keys the call's tokens, and
    its logits equal the uncached forward's (float64, 1e-12); the cache is left as it was, and the backward runs."""
    model = spread_model("shaw", "eager").train()
    model.activation_checkpointing_enable()
    attention_mask = (SOURCE != 0).long()
    target = torch.randint(3, 40, (SOURCE.size(0), 6), generator=torch.Generator().manual_seed(3))
    cache = static_cache(model, 8) if cache_kind == "static" else EncoderDecoderCache(DynamicCache(), DynamicCache())
    uncached = model(input_ids=SOURCE, attention_mask=attention_mask, decoder_input_ids=target, use_cache=False).logits
    output = model(input_ids=SOURCE, attention_mask=attention_mask, decoder_input_ids=target, cache=cache,
                   use_cache=True)
    torch.testing.assert_close(output.logits, uncached, rtol=0, atol=1e-12)
    assert cache.get_seq_length() == 0
    output.logits.sum().backward()


@pytest.mark.numerics
@pytest.mark.parametrize("position_scheme", ["shaw", "rope"])
def test_a_decoder_mask_wider_than_the_cached_and_new_tokens_counts_by_its_last_columns(position_scheme):
    """A decoder mask wider than the cached and new tokens counts by its last columns on a static cache as on the
    dynamic one (`check_padding_mask`): two leading columns of 0 are ignored, and the steps' logits equal those of
    masks of exactly the cached and new tokens (float64, 1e-12)."""
    model = spread_model(position_scheme, "sdpa")
    attention_mask = (SOURCE != 0).long()
    target = torch.randint(3, 40, (SOURCE.size(0), 6), generator=torch.Generator().manual_seed(4))
    target_mask = torch.ones_like(target)
    target_mask[1, 0] = 0
    with torch.no_grad():
        encoded = model.model.encoder(input_ids=SOURCE, attention_mask=attention_mask)
        logits = {}
        for kind, leading in (("static", 2), ("dynamic", 2), ("static", 0)):
            cache, steps, first = static_cache(model, 8) if kind == "static" else None, [], 0
            for last in (3, 4, 5, 6):
                wide = torch.cat([target_mask.new_zeros(SOURCE.size(0), leading), target_mask[:, :last]], dim=1)
                output = model(encoder_outputs=encoded, attention_mask=attention_mask,
                               decoder_input_ids=target[:, first:last], decoder_attention_mask=wide, cache=cache,
                               use_cache=True)
                cache, first = output.cache, last
                steps.append(output.logits)
            logits[kind, leading] = torch.cat(steps, dim=1)
    torch.testing.assert_close(logits["static", 2], logits["dynamic", 2], rtol=0, atol=1e-12)
    torch.testing.assert_close(logits["static", 2], logits["static", 0], rtol=0, atol=1e-12)


@pytest.mark.numerics
@pytest.mark.parametrize("cache_kind", ["static", "dynamic"])
def test_a_bare_cache_given_to_the_translation_model_holds_the_decoders_self_attention(cache_kind):
    """A StaticCache or DynamicCache passed as such (not in an EncoderDecoderCache) takes the decoder's
    self-attention keys, the encoder's get their own: generate's tokens and logits equal those of its own cache, and
    the passed cache holds one entry per decoder token fed."""
    model = spread_model("shaw", "eager")
    bare = (StaticCache(config=model.config, max_cache_len=16) if cache_kind == "static"
            else DynamicCache(config=model.config))
    settings = dict(input_ids=SOURCE, attention_mask=(SOURCE != 0).long(), do_sample=False, max_new_tokens=6,
                    min_new_tokens=6, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        own, passed = model.generate(**settings), model.generate(**settings, cache=bare)
    assert torch.equal(passed.sequences, own.sequences)
    torch.testing.assert_close(torch.stack(passed.logits), torch.stack(own.logits), rtol=0, atol=1e-12)
    assert int(bare.get_seq_length()) == own.sequences.size(1) - 1


@pytest.mark.parametrize("use_cache", [None, True])
def test_a_cache_is_returned_exactly_when_the_layers_keep_one(use_cache):
    """With use_cache unset (config.use_cache true) or true the decoder returns a cache unless its checkpointed layers
    drop it (training with gradients enabled): then none, not an empty one; in training under no_grad the layers
    keep it, and so does the decoder."""
    model = spread_model("shaw", "eager").train()
    model.activation_checkpointing_enable()
    arguments = dict(input_ids=SOURCE, attention_mask=(SOURCE != 0).long(), decoder_input_ids=SOURCE[:, :3],
                     use_cache=use_cache)
    assert model(**arguments).cache is None
    with torch.no_grad():
        assert model(**arguments).cache.get_seq_length() == 3
    assert model.eval()(**arguments).cache.get_seq_length() == 3
