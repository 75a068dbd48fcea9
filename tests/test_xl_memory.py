"""Transformer-XL segment-level recurrence in RelPosTransformerForCausalLM."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import SCHEMES, run_without_hf_relpos, sinusoid_by_loop, tiny_config
from transformers import AutoModelForCausalLM

import hf_relpos
from hf_relpos.testing import check_causal_lm_decoding, check_causal_lm_left_padding

SEGMENT = 6
TOLERANCE = 1e-12  # float64 models: a float32 step anywhere fails (generate's own logits come rounded to float32
# by transformers: there it checks equality after that rounding; the forward calls' logits stay float64)


def causal_lm(position_scheme: str = "xl", seed: int = 0, **overrides) -> hf_relpos.RelPosTransformerForCausalLM:
    torch.manual_seed(seed)
    config = tiny_config(position_scheme, **{"mem_len": SEGMENT, **overrides})
    return hf_relpos.RelPosTransformerForCausalLM(config).eval()


def stream(length: int, batch: int = 2) -> torch.Tensor:
    return torch.randint(4, 40, (batch, length), generator=torch.Generator().manual_seed(5))


@pytest.mark.numerics
@pytest.mark.parametrize("layer_norm_position", ["pre", "post"])
@pytest.mark.parametrize("segments, mem_len", [(2, SEGMENT), (3, 2 * SEGMENT), (2, 3 * SEGMENT)])
def test_segments_with_memory_equal_one_long_segment(segments, mem_len, layer_norm_position):
    model = causal_lm(mem_len=mem_len, layer_norm_position=layer_norm_position).double()
    tokens = stream(segments * SEGMENT)
    with torch.no_grad():
        whole = model(input_ids=tokens, mem_len=0).logits
        mems = None
        for index in range(segments):
            piece = tokens[:, index * SEGMENT : (index + 1) * SEGMENT]
            out = model(input_ids=piece, mems=mems)
            assert (out.logits - whole[:, index * SEGMENT : (index + 1) * SEGMENT]).abs().max() < TOLERANCE
            mems = out.mems
            assert all(m.size(1) == min(mem_len, (index + 1) * SEGMENT) for m in mems)


def recurrence_by_loop(model: hf_relpos.RelPosTransformerForCausalLM, tokens: torch.Tensor, segment: int,
                       mem_len: int) -> torch.Tensor:
    """Dai et al. 2019, sec. 3.2-3.3, one sequence [L] at a time, in float64: layer l of segment tau attends from the
    segment's hidden states h^{l-1} over [SG(m^{l-1}); h^{l-1}], m^{l-1} the last `mem_len` layer-(l-1) inputs of the
    sequence so far, with A_ij = (q_i + u).k_j + (q_i + v).W_kR R_(i-j) (distance clamped to clamp_len), / sqrt(d)."""
    config, decoder = model.config, model.decoder
    scheme, width = decoder.positions, config.d_model
    heads = config.decoder_attention_heads
    head_dim = width // heads
    pre_norm = config.layer_norm_position == "pre"
    memories = [torch.zeros(0, width, dtype=torch.float64) for _ in decoder.layers]
    logits = []
    for start in range(0, tokens.numel(), segment):
        hidden = decoder.embed_tokens.weight[tokens[start : start + segment]] * decoder.embed_scale
        length = hidden.size(0)
        layer_inputs = []
        for index, layer in enumerate(decoder.layers):
            layer_inputs.append(hidden)
            attention, norm = layer.self_attn, layer.self_attn_layer_norm
            queries_in = norm(hidden) if pre_norm else hidden
            keys_in = torch.cat([norm(memories[index]) if pre_norm else memories[index], queries_in])
            memory_length = memories[index].size(0)
            query = attention.q_proj(queries_in).view(length, heads, head_dim)
            key = attention.k_proj(keys_in).view(-1, heads, head_dim)
            value = attention.v_proj(keys_in).view(-1, heads, head_dim)
            tied = 0 if scheme.content_bias.size(0) == 1 else index
            u, v = scheme.content_bias[tied], scheme.position_bias[tied]
            attended = torch.zeros(length, heads, head_dim, dtype=torch.float64)
            for i in range(length):
                scores = torch.full((heads, memory_length + length), -math.inf, dtype=torch.float64)
                for j in range(memory_length + i + 1):   # causal: the memory and the segment up to query i
                    distance = memory_length + i - j
                    if scheme.clamp_len is not None:
                        distance = min(distance, scheme.clamp_len)
                    relative = (scheme.position_projections[index].weight @ sinusoid_by_loop(distance, width))
                    relative = relative.view(heads, head_dim)
                    for head in range(heads):
                        scores[head, j] = ((query[i, head] + u[head]) @ key[j, head]
                                           + (query[i, head] + v[head]) @ relative[head]) / math.sqrt(head_dim)
                attended[i] = torch.einsum("hj,jhd->hd", scores.softmax(-1), value)
            output = attention.out_proj(attended.reshape(length, width))
            hidden = hidden + output if pre_norm else norm(hidden + output)
            output = layer.feed_forward(layer.final_layer_norm(hidden) if pre_norm else hidden)
            hidden = hidden + output if pre_norm else layer.final_layer_norm(hidden + output)
        if decoder.layer_norm is not None:
            hidden = decoder.layer_norm(hidden)
        logits.append(model.lm_head(hidden))
        memories = [torch.cat([memory, layer_input])[-mem_len:] if mem_len else memory
                    for memory, layer_input in zip(memories, layer_inputs, strict=True)]
    return torch.cat(logits)


@pytest.mark.numerics
@pytest.mark.parametrize(("mem_len", "clamp_len", "layer_norm_position", "untie_relative_biases"), [
    (2, 50, "post", True), (SEGMENT + 3, None, "pre", False), (SEGMENT - 1, 2, "pre", True), (0, 50, "post", True),
], ids=["shorter than a segment", "longer than a segment", "clamped", "no memory"])
def test_segments_with_memory_follow_the_recurrence_equations(mem_len, clamp_len, layer_norm_position,
                                                              untie_relative_biases):
    """Segment by segment with a memory shorter than the context (where one long segment is no reference), each row
    of a batch gives the float64 recurrence of that sequence alone: rows never share memory."""
    model = causal_lm(mem_len=mem_len, clamp_len=clamp_len, layer_norm_position=layer_norm_position,
                      untie_relative_biases=untie_relative_biases).double()
    with torch.no_grad():
        for parameter in model.decoder.positions.parameters():   # u, v, W_kR of a size that shows in the scores
            parameter.normal_(0.0, 0.5)
        tokens = stream(3 * SEGMENT)
        mems, logits = None, []
        for index in range(3):
            out = model(input_ids=tokens[:, index * SEGMENT : (index + 1) * SEGMENT], mems=mems)
            mems = out.mems
            logits.append(out.logits)
        expected = torch.stack([recurrence_by_loop(model, row, SEGMENT, mem_len) for row in tokens])
    assert (torch.cat(logits, 1) - expected).abs().max() < TOLERANCE


@pytest.mark.numerics
def test_memory_shorter_than_the_context_forgets_it():
    model = causal_lm(mem_len=2).double()
    tokens = stream(2 * SEGMENT)
    with torch.no_grad():
        whole = model(input_ids=tokens, mem_len=0).logits
        first = model(input_ids=tokens[:, :SEGMENT])
        second = model(input_ids=tokens[:, SEGMENT:], mems=first.mems)
    assert (second.logits - whole[:, SEGMENT:]).abs().max() > 1e-3


def test_the_decoder_called_alone_with_memory_returns_memory_and_no_cache():
    """Memory and a KV cache are exclusive: the decoder stepped alone with `mem_len` > 0 and `use_cache` unset returns
    the new memory and no cache (`config.use_cache` stands for the cache of a model without memory)."""
    decoder = causal_lm().get_decoder()
    tokens = stream(2 * SEGMENT)
    with torch.no_grad():
        first = decoder(input_ids=tokens[:, :SEGMENT])
        second = decoder(input_ids=tokens[:, SEGMENT:], mems=first.mems)
    assert first.cache is None and second.cache is None
    assert len(first.mems) == len(second.mems) == len(decoder.layers)


def test_no_gradient_flows_into_the_memory():
    model = causal_lm().train()
    tokens = stream(2 * SEGMENT)
    first_embeds = model.get_input_embeddings()(tokens[:, :SEGMENT]).detach().requires_grad_(True)
    first = model(inputs_embeds=first_embeds)
    assert all(not memory.requires_grad for memory in first.mems)
    second = model(input_ids=tokens[:, SEGMENT:], mems=first.mems, labels=tokens[:, SEGMENT:])
    second.loss.backward()
    assert first_embeds.grad is None
    assert model.decoder.positions.content_bias.grad.abs().sum() > 0


@pytest.mark.numerics
def test_longer_memory_at_evaluation_than_in_training():
    model = causal_lm(mem_len=SEGMENT).double()
    tokens = stream(3 * SEGMENT)
    with torch.no_grad():
        whole = model(input_ids=tokens, mem_len=0).logits
        mems = None
        for index in range(3):
            out = model(input_ids=tokens[:, index * SEGMENT : (index + 1) * SEGMENT], mems=mems, mem_len=3 * SEGMENT)
            mems = out.mems
        assert mems[0].size(1) == 3 * SEGMENT
        assert (out.logits - whole[:, 2 * SEGMENT :]).abs().max() < TOLERANCE


@pytest.mark.numerics
@pytest.mark.parametrize("num_beams", [1, 3], ids=["greedy", "beam3"])
def test_generation_with_mems_as_the_cache_equals_uncached(num_beams):
    model = causal_lm(mem_len=64).double()
    prompt = stream(5)
    kwargs = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, num_beams=num_beams,
                  output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    with torch.no_grad():
        with_memory = model.generate(input_ids=prompt, use_cache=True, **kwargs)
        uncached = model.generate(input_ids=prompt, use_cache=False, **kwargs)
    assert torch.equal(with_memory.sequences, uncached.sequences)
    assert (torch.stack(with_memory.logits) - torch.stack(uncached.logits)).abs().max() < TOLERANCE


@pytest.mark.numerics
@pytest.mark.parametrize("num_beams", [1, 3], ids=["greedy", "beam3"])
@pytest.mark.parametrize("argument", ["mems", "cache"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left_padded"])
def test_generate_continues_a_returned_memory_as_from_the_whole_text(num_beams, argument, padded):
    """A forward's `mems` continue in generate (docs/internals.md): given as `cache`, transformers refused the tuple
    ("Passing a tuple for `cache` is not supported anymore"), and with beams the memory was not expanded to them (a
    batch mismatch). While the text fits in mem_len, continuing equals generating from the whole text; a padded
    batch's mask covers memory and prompt."""
    model = causal_lm(mem_len=64).double()
    text = stream(2 * SEGMENT)
    mask = torch.ones_like(text)
    if padded:
        text[1, :3], mask[1, :3] = 0, 0
    kwargs = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, num_beams=num_beams,
                  output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    with torch.no_grad():
        mems = model(input_ids=text[:, :SEGMENT], attention_mask=mask[:, :SEGMENT]).mems
        continued = model.generate(input_ids=text[:, SEGMENT:], attention_mask=mask, **{argument: mems}, **kwargs)
        whole = model.generate(input_ids=text, attention_mask=mask, **kwargs)
    assert torch.equal(continued.sequences[:, SEGMENT:], whole.sequences[:, 2 * SEGMENT:])
    assert (torch.stack(continued.logits) - torch.stack(whole.logits)).abs().max() < TOLERANCE


def test_generate_takes_the_memory_once():
    model = causal_lm()
    mems = model(input_ids=stream(SEGMENT)).mems
    with pytest.raises(ValueError, match="pass the Transformer-XL memory once, as mems or as cache, not both"):
        model.generate(input_ids=stream(SEGMENT), mems=mems, cache=mems, max_new_tokens=2)


@pytest.mark.numerics
@pytest.mark.parametrize("position_scheme", SCHEMES)
def test_causal_lm_kv_cache_equals_uncached_for_every_scheme(position_scheme):
    model = causal_lm(position_scheme, mem_len=0).double()
    prompt = stream(4)
    kwargs = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, output_logits=True,
                  return_dict_in_generate=True, pad_token_id=0)
    with torch.no_grad():
        cached = model.generate(input_ids=prompt, use_cache=True, **kwargs)
        uncached = model.generate(input_ids=prompt, use_cache=False, **kwargs)
    assert torch.equal(cached.sequences, uncached.sequences)
    assert (torch.stack(cached.logits) - torch.stack(uncached.logits)).abs().max() < TOLERANCE


@pytest.mark.numerics
@pytest.mark.parametrize("position_scheme, mem_len", [*((scheme, 0) for scheme in SCHEMES), ("xl", 64)])
def test_generate_takes_an_embedded_prompt_as_the_same_tokens(position_scheme, mem_len):
    """generate(inputs_embeds=...) was refused ("doesn't have its forwarding implemented"): the prompt given as its
    token embeddings gives the logits and new tokens of the prompt given as ids."""
    model = causal_lm(position_scheme, mem_len=mem_len).double()
    prompt = stream(4)
    kwargs = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, output_logits=True,
                  return_dict_in_generate=True, pad_token_id=0)
    with torch.no_grad():
        from_ids = model.generate(input_ids=prompt, **kwargs)
        from_embeds = model.generate(inputs_embeds=model.get_input_embeddings()(prompt), **kwargs)
    assert torch.equal(from_embeds.sequences, from_ids.sequences[:, prompt.size(1):])
    assert (torch.stack(from_embeds.logits) - torch.stack(from_ids.logits)).abs().max() < TOLERANCE


def test_causal_lm_round_trips_through_auto_class(tmp_path):
    model = causal_lm()
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(reloaded, hf_relpos.RelPosTransformerForCausalLM)
    tokens = stream(SEGMENT)
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=tokens).logits, model(input_ids=tokens).logits)


def test_mems_and_a_filled_kv_cache_together_are_refused():
    model = causal_lm(mem_len=0)
    tokens = stream(SEGMENT)
    with torch.no_grad():
        cache = model(input_ids=tokens, use_cache=True).cache
        mems = model(input_ids=tokens, mem_len=SEGMENT).mems
        with pytest.raises(ValueError, match="mems"):
            model.decoder(input_ids=tokens, cache=cache, mems=mems)


@pytest.mark.numerics
def test_a_filled_kv_cache_is_refused_in_memory_mode():
    """A KV cache holds keys, not the layer inputs a memory is built from: continued with mem_len > 0 (a prompt cached
    with mem_len 0, then given to generate as past_key_values), the memory returned held the new tokens only, so from
    the second new token on the cached prompt was forgotten (logits off by 0.3). One error now; mem_len 0 continues
    the cache exactly."""
    model = causal_lm(mem_len=4 * SEGMENT).double()
    tokens = stream(SEGMENT + 2)
    message = (rf"a KV cache holding {SEGMENT} tokens cannot be continued with a Transformer-XL memory \(mem_len="
               rf"{4 * SEGMENT}\): .* Pass mem_len=0 to continue the KV cache")
    kwargs = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, output_logits=True,
                  return_dict_in_generate=True, pad_token_id=0)
    with torch.no_grad():
        expected = model.generate(input_ids=tokens, **kwargs)
        with pytest.raises(ValueError, match=message):
            model(input_ids=tokens[:, SEGMENT:], cache=model(input_ids=tokens[:, :SEGMENT], mem_len=0,
                                                             use_cache=True).cache)
        with pytest.raises(ValueError, match=message):
            model.generate(input_ids=tokens, cache=model(input_ids=tokens[:, :SEGMENT], mem_len=0,
                                                         use_cache=True).cache, **kwargs)
        continued = model.generate(input_ids=tokens, cache=model(input_ids=tokens[:, :SEGMENT], mem_len=0,
                                                                 use_cache=True).cache, mem_len=0, **kwargs)
    assert torch.equal(continued.sequences, expected.sequences)
    assert (torch.stack(continued.logits) - torch.stack(expected.logits)).abs().max() < TOLERANCE


def test_causal_lm_with_memory_loads_as_remote_code_without_hf_relpos(tmp_path):
    model = causal_lm()
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokens = stream(2 * SEGMENT)
    with torch.no_grad():
        first = model(input_ids=tokens[:, :SEGMENT])
        second = model(input_ids=tokens[:, SEGMENT:], mems=first.mems)
    torch.save({"tokens": tokens, "logits": second.logits, "mems": second.mems}, tmp_path / "expected.pt")
    script = f"""
        import torch
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        expected = torch.load({str(tmp_path / "expected.pt")!r})
        tokens = expected["tokens"]
        with torch.no_grad():
            first = model(input_ids=tokens[:, :{SEGMENT}])
            second = model(input_ids=tokens[:, {SEGMENT}:], mems=first.mems)
        assert torch.equal(second.logits, expected["logits"]), (second.logits - expected["logits"]).abs().max()
        assert all(torch.equal(a, b) for a, b in zip(second.mems, expected["mems"], strict=True))
        print("REMOTE_OK")
        """
    result = run_without_hf_relpos(script, tmp_path)
    assert "REMOTE_OK" in result.stdout, result.stderr[-3000:]
    assert json.loads((folder / "config.json").read_text())["auto_map"] == {
        "AutoConfig": "configuration_relpos.RelPosTransformerConfig",
        "AutoModelForCausalLM": "modeling_relpos.RelPosTransformerForCausalLM",
    }


@pytest.mark.parametrize(("overrides", "added"), [
    ({"position_scheme": "absolute"}, "position_scheme 'absolute' adds its positions"),
    ({"position_scheme": "shaw", "keep_absolute_positions": True}, "keep_absolute_positions adds sinusoids"),
])
def test_memory_with_positions_added_to_the_embeddings_is_refused(overrides, added):
    """Once the memory is full, every later segment would sit at the same absolute positions (Dai et al. 2019,
    sec. 3.3): refused when the model is built with mem_len, and when a forward call asks for memory."""
    message = rf"mem_len {SEGMENT} \(Transformer-XL segment memory\) needs relative positions: {added} to the"
    with pytest.raises(ValueError, match=message):
        causal_lm(**overrides)
    model = causal_lm(**overrides, mem_len=0)
    with pytest.raises(ValueError, match=message):
        model(input_ids=stream(SEGMENT), mem_len=SEGMENT)
    assert model(input_ids=stream(SEGMENT)).logits.shape[:2] == (2, SEGMENT)   # without memory it runs


@pytest.mark.numerics
@pytest.mark.parametrize(("encoder_layers", "decoder_layers"), [(1, 3), (3, 1)])
def test_causal_lm_cache_has_one_layer_per_decoder_layer(encoder_layers, decoder_layers):
    """transformers sizes the KV cache by `num_hidden_layers`: in a causal LM's config that is decoder_layers, never
    the unused encoder_layers (fewer: an IndexError at the first cached layer beyond them; more: empty layers)."""
    model = causal_lm("rope", mem_len=0, encoder_layers=encoder_layers, decoder_layers=decoder_layers).double()
    prompt = stream(4)
    kwargs = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, output_logits=True,
                  return_dict_in_generate=True, pad_token_id=0)
    with torch.no_grad():
        assert len(model(input_ids=prompt).cache.layers) == decoder_layers
        cached = model.generate(input_ids=prompt, use_cache=True, **kwargs)
        uncached = model.generate(input_ids=prompt, use_cache=False, **kwargs)
    assert len(cached.past_key_values.layers) == decoder_layers
    assert torch.equal(cached.sequences, uncached.sequences)
    assert (torch.stack(cached.logits) - torch.stack(uncached.logits)).abs().max() < TOLERANCE
    assert model.config.num_hidden_layers == decoder_layers


@pytest.mark.parametrize("position_scheme", ["xl", "absolute"])
def test_the_encoder_decoder_refuses_segment_memory(position_scheme):
    """mem_len is the causal LM's: the encoder-decoder refused it only at its first forward with `absolute` (naming
    the scheme) and ignored it with a relative scheme. It is one error when the model is built, and a mem_len set
    after that changes nothing: the decoder computes no memory."""
    with pytest.raises(ValueError, match=r"mem_len must be 0 for the encoder-decoder, got 4: Transformer-XL segment "
                                         r"memory is RelPosTransformerForCausalLM's"):
        hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config(position_scheme, mem_len=4))
    torch.manual_seed(0)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config(position_scheme)).eval()
    tokens = stream(SEGMENT)
    decoder_outputs = []
    model.model.decoder.register_forward_hook(lambda module, args, output: decoder_outputs.append(output))
    with torch.no_grad():
        expected = model(input_ids=tokens, labels=tokens).logits
        model.config.mem_len = 4
        assert torch.equal(model(input_ids=tokens, labels=tokens).logits, expected)
    assert [output.mems for output in decoder_outputs] == [None, None]


def test_the_encoder_decoder_refuses_a_decoder_without_layers():
    """Only the decoder layers' cross-attention reads the source: without them the model translated every source
    alike (a causal LM of 0 layers is still a model of its input)."""
    with pytest.raises(ValueError, match=r"decoder_layers must be at least 1 for the encoder-decoder, got 0"):
        hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config(decoder_layers=0))
    assert causal_lm(mem_len=0, decoder_layers=0)(input_ids=stream(SEGMENT)).logits.shape == (2, SEGMENT, 40)


@pytest.mark.numerics
def test_a_mask_given_with_mems_covers_the_memory_and_the_input():
    """The memory of a left-padded row holds padding: only a mask over memory and input says where. A mask over the
    input alone was taken as all memory real (the padding attended); it is refused, and the wide one continues the
    sequence exactly."""
    model = causal_lm(mem_len=4 * SEGMENT).double()
    tokens = stream(2 * SEGMENT)
    mask = torch.ones_like(tokens)
    mask[0, :3] = 0
    with torch.no_grad():
        whole = model(input_ids=tokens, attention_mask=mask, mem_len=0).logits
        first = model(input_ids=tokens[:, :SEGMENT], attention_mask=mask[:, :SEGMENT])
        second = model(input_ids=tokens[:, SEGMENT:], attention_mask=mask, mems=first.mems)
        assert (second.logits - whole[:, SEGMENT:]).abs().max() < TOLERANCE
        with pytest.raises(ValueError, match=r"with mems the decoder's attention_mask must cover the memory and the "
                                             r"input \(the memory may hold padding\): \[2, 12\] \(6 memory \+ 6 "
                                             r"input\) or wider, got \[2, 6\]"):
            model(input_ids=tokens[:, SEGMENT:], attention_mask=mask[:, SEGMENT:], mems=first.mems)


def memories(*shapes: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    return tuple(torch.zeros(shape) for shape in shapes)


@pytest.mark.parametrize(("inputs", "message"), [
    ({"mem_len": 2.5}, r"mem_len must be an integer >= 0, got 2.5"),
    ({"mem_len": -3}, r"mem_len must be an integer >= 0, got -3"),
    ({"mems": memories((3, 4, 32), (3, 4, 32))}, r"mems hold a batch of 3 sequences, the input 2"),
    ({"mems": memories((2, 4, 31), (2, 4, 31))}, r"\[batch, M, d_model=32\] tensor per layer \(2\), .* got "
                                                 r"\[\[2, 4, 31\], \[2, 4, 31\]\]"),
    ({"mems": memories((2, 4, 32), (2, 5, 32))}, r"with the same batch and M in every layer, got \[\[2, 4, 32\], "
                                                 r"\[2, 5, 32\]\]"),
    ({"mems": memories((4, 32), (4, 32))}, r"mems must hold one \[batch, M, d_model=32\] tensor per layer"),
    ({"mems": memories((2, 4, 32))}, r"tensor per layer \(2\), .* got \[\[2, 4, 32\]\]"),
    ({"mems": tuple(torch.zeros(2, 4, 32, dtype=torch.long) for _ in range(2))},
     r"mems must be floating-point tensors \(the layers' inputs\), got dtype \[torch.int64, torch.int64\]"),
], ids=["fractional mem_len", "negative mem_len", "batch", "width", "lengths", "rank", "layers", "integer dtype"])
def test_bad_memory_inputs_are_one_error_naming_them(inputs, message):
    """Each was a raw TypeError or torch.cat error, or (a negative mem_len) silently no memory."""
    with pytest.raises(ValueError, match=message):
        causal_lm()(input_ids=stream(SEGMENT), **inputs)


@pytest.mark.numerics
@pytest.mark.parametrize("layer_norm_position", ["pre", "post"])
def test_a_memory_of_another_float_dtype_is_taken_in_the_models_dtype(layer_norm_position):
    """A float32 memory given to a float64 model is taken in float64, as the Post-LN layers took it; the Pre-LN layers
    normalised it with their float64 LayerNorm as it came, a raw "mixed dtype" RuntimeError."""
    model = causal_lm(layer_norm_position=layer_norm_position).double()
    tokens = stream(2 * SEGMENT)
    with torch.no_grad():
        first = model(input_ids=tokens[:, :SEGMENT])
        single = tuple(memory.float() for memory in first.mems)
        expected = model(input_ids=tokens[:, SEGMENT:], mems=tuple(memory.double() for memory in single))
        second = model(input_ids=tokens[:, SEGMENT:], mems=single)
    assert torch.equal(second.logits, expected.logits)
    assert all(memory.dtype == torch.float64 for memory in second.mems)


@pytest.mark.parametrize("layer_norm_position", ["pre", "post"])
def test_a_memory_on_another_device_is_taken_on_the_models(layer_norm_position):
    """A memory on another device than the model (a stored one, as on a GPU model a memory kept on the CPU) was a
    raw torch.cat device error: it is taken on the device of each layer's input, as its dtype is. Here the model is
    on the meta device and the memory on the CPU."""
    torch.manual_seed(0)
    with torch.device("meta"):
        model = hf_relpos.RelPosTransformerForCausalLM(
            tiny_config("xl", mem_len=SEGMENT, layer_norm_position=layer_norm_position)).double().eval()
    mems = tuple(torch.zeros(2, SEGMENT, model.config.d_model, dtype=torch.float64) for _ in model.decoder.layers)
    with torch.no_grad():
        output = model(input_ids=torch.randint(4, 40, (2, SEGMENT), device="meta"), mems=mems)
    assert output.logits.device.type == "meta"
    assert [memory.device.type for memory in output.mems] == ["meta"] * len(model.decoder.layers)


def positions_of(mask: torch.Tensor) -> torch.Tensor:
    """transformers' position_ids of a padded batch: each token numbered among its sequence's unpadded tokens."""
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)


@pytest.mark.numerics
@pytest.mark.parametrize("overrides", [{"position_scheme": "absolute"},
                                       {"position_scheme": "shaw", "keep_absolute_positions": True}],
                         ids=["absolute", "keep_absolute_positions"])
@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
def test_a_left_padded_prompt_is_encoded_as_the_prompt_alone(overrides, use_cache):
    """Sinusoids added to the embeddings placed a left-padded prompt's tokens after its padding (logits off by up to
    1.3): with position_ids, which generate counts over the unpadded tokens as transformers does, the padded row's
    logits and greedy output are those of the prompt alone."""
    model = causal_lm(mem_len=0, **overrides).double()
    short, long = stream(4, batch=1), stream(7, batch=1).flip(-1)
    batch = torch.cat([torch.cat([torch.zeros(1, 3, dtype=torch.long), short], 1), long])
    mask = (batch != 0).long()
    kwargs = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, output_logits=True,
                  return_dict_in_generate=True, pad_token_id=0, use_cache=use_cache)
    with torch.no_grad():
        padded = model(input_ids=batch, attention_mask=mask, position_ids=positions_of(mask)).logits[0, 3:]
        assert (padded - model(input_ids=short).logits[0]).abs().max() < TOLERANCE
        together = model.generate(input_ids=batch, attention_mask=mask, **kwargs)
        alone = model.generate(input_ids=short, **kwargs)
    assert torch.equal(together.sequences[0, 3:], alone.sequences[0])
    assert (torch.stack(together.logits)[:, 0] - torch.stack(alone.logits)[:, 0]).abs().max() < TOLERANCE


@pytest.mark.numerics
def test_the_causal_lm_checks_pass_with_sinusoids_beside_a_relative_scheme():
    """hf_relpos.testing's causal LM checks, which check_position_scheme runs on every scheme (the absolute one's
    sinusoids included), with keep_absolute_positions: the model's own sinusoids beside Shaw's attention take generate's
    position_ids too, on a left-padded prompt (eager and sdpa; flex_attention at the scheme's defaults there)."""
    for check in (check_causal_lm_decoding, check_causal_lm_left_padding):
        check("shaw", config_overrides={"keep_absolute_positions": True}, kernels=("eager", "sdpa"))


@pytest.mark.numerics
def test_a_left_padded_prompt_keeps_its_randomized_positions():
    """With randomized positions at inference, generate's position_ids pick each token's entry of the one draw: the
    padded row's tokens sit where the prompt's alone do."""
    model = causal_lm("absolute", mem_len=0, position_randomization_max=64,
                      position_randomization_at_inference=True).double()
    short, long = stream(4, batch=1), stream(7, batch=1).flip(-1)
    batch = torch.cat([torch.cat([torch.zeros(1, 3, dtype=torch.long), short], 1), long])
    draw = hf_relpos.PositionDraw(torch.arange(0, 60, 4))
    kwargs = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, output_logits=True,
                  return_dict_in_generate=True, pad_token_id=0, positions=draw)
    with torch.no_grad():
        together = model.generate(input_ids=batch, attention_mask=(batch != 0).long(), **kwargs)
        alone = model.generate(input_ids=short, **kwargs)
    assert torch.equal(together.sequences[0, 3:], alone.sequences[0])
    assert (torch.stack(together.logits)[:, 0] - torch.stack(alone.logits)[:, 0]).abs().max() < TOLERANCE


@pytest.mark.parametrize("position_scheme", ["rope", "shaw", "t5", "alibi", "xl", "directional"])
def test_position_ids_that_attention_would_ignore_are_one_error(position_scheme):
    """A scheme whose attention reads positions reads each token's place in the sequence, so position_ids are honoured
    there only as a shift of a row's tokens (what generate gives a left-padded prompt: the same distances). Gaps or a
    restart gave the logits of no position_ids, in silence; now one error. A shift, and generate's ids for a
    left-padded row, still give the logits of no position_ids (float64)."""
    model = causal_lm(position_scheme, mem_len=0).double()
    tokens = stream(SEGMENT)
    with torch.no_grad():
        plain = model(input_ids=tokens).logits
        shifted = model(input_ids=tokens, position_ids=torch.arange(SEGMENT)[None] + 7).logits
        assert (shifted - plain).abs().max() < TOLERANCE
        mask = torch.ones_like(tokens)
        mask[1, :2] = 0
        padded = model(input_ids=tokens, attention_mask=mask, position_ids=positions_of(mask)).logits
        assert (padded - model(input_ids=tokens, attention_mask=mask).logits).abs().max() < TOLERANCE
        for position_ids, shown in ((torch.arange(0, 2 * SEGMENT, 2)[None], r"\[0, 2, 4, 6, 8, 10\]"),
                                    (torch.tensor([[0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 4, 5]]), r"\[0, 1, 2, 0, 1, 2\]")):
            with pytest.raises(ValueError, match=rf"^position_scheme '{position_scheme}' reads each token's place in "
                                                 rf"the sequence in attention.* got {shown} in row 0"):
                model(input_ids=tokens, position_ids=position_ids)


@pytest.mark.parametrize(("position_ids", "message"), [
    (torch.zeros(2, 3, dtype=torch.long), r"got shape \[2, 3\] and dtype torch.int64"),
    (torch.zeros(3, 6, dtype=torch.long), r"got shape \[3, 6\] and dtype torch.int64"),
    (torch.zeros(6, dtype=torch.long), r"got shape \[6\] and dtype torch.int64"),
    (torch.zeros(2, 6), r"got shape \[2, 6\] and dtype torch.float32"),
], ids=["length", "batch", "rank", "dtype"])
def test_position_ids_of_another_shape_are_one_error_naming_them(position_ids, message):
    """They were swallowed by forward's **kwargs."""
    with pytest.raises(ValueError, match=r"position_ids must be a \[batch, length\] tensor of integer positions, "
                                         r"\[2, 6\] or \[1, 6\], " + message):
        causal_lm("absolute", mem_len=0)(input_ids=stream(SEGMENT), position_ids=position_ids)
