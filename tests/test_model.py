"""Model-level behaviour of RelPosTransformerForConditionalGeneration for every registered scheme."""

from __future__ import annotations

import copy
import json
import math
import re

import pytest
import torch
from conftest import (
    ORDER_AWARE_SCHEMES,
    RELATIVE_SCHEMES,
    SCHEMES,
    run_without_hf_relpos,
    sinusoid_by_loop,
    tiny_config,
    tiny_model,
    warnings_logged,
)
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

import hf_relpos
from hf_relpos.model.modeling_relpos import RelPosAttention, with_scheme_mask
from hf_relpos.model.positions import PositionContext, sinusoids
from hf_relpos.testing import check_order_aware, check_padding_invariance


def padded_batch():
    """Three sources of lengths 7, 4 and 2 (ids >= 4, so no special token), right-padded with pad id 0."""
    lengths = [7, 4, 2]
    input_ids = torch.zeros(3, 7, dtype=torch.long)
    attention_mask = torch.zeros(3, 7, dtype=torch.long)
    generator = torch.Generator().manual_seed(3)
    for row, length in enumerate(lengths):
        input_ids[row, :length] = torch.randint(4, 40, (length,), generator=generator)
        attention_mask[row, :length] = 1
    return input_ids, attention_mask, lengths


@pytest.mark.numerics
@pytest.mark.parametrize("position_scheme", SCHEMES)
def test_encoder_output_of_real_tokens_does_not_depend_on_padding(position_scheme):
    """The encoder states and decoder logits of a padded source's real tokens are those of the source alone, in
    float64 on every kernel (hf_relpos.testing.check_padding_invariance, which check_position_scheme runs on a user's
    scheme)."""
    check_padding_invariance(position_scheme)


@pytest.mark.numerics
@pytest.mark.parametrize("position_scheme", SCHEMES)
@pytest.mark.parametrize("overrides", [{}, {"keep_absolute_positions": True}])
def test_a_left_padded_source_is_encoded_and_translated_as_alone(position_scheme, overrides):
    """A tokenizer with padding_side "left": each source's encoder states, logits and greedy translation are those of
    the source alone (float64, 1e-12), also where sinusoids are added to the embeddings (`absolute`,
    `keep_absolute_positions`: they placed a short source after its padding, so its translation depended on the
    longest source beside it); right padding is unchanged."""
    if position_scheme == "absolute" and overrides:
        pytest.skip("absolute has its sinusoids already")
    model = tiny_model(position_scheme, **overrides).double().eval()
    right, right_mask, lengths = padded_batch()
    left, left_mask = torch.zeros_like(right), torch.zeros_like(right_mask)
    for row, length in enumerate(lengths):
        left[row, -length:], left_mask[row, -length:] = right[row, :length], 1
    targets = torch.randint(4, 40, (3, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        batched = model(input_ids=left, attention_mask=left_mask, decoder_input_ids=targets)
        for row, length in enumerate(lengths):
            alone = model(input_ids=right[row:row + 1, :length], decoder_input_ids=targets[row:row + 1])
            assert (batched.encoder_last_hidden_state[row, -length:] - alone.encoder_last_hidden_state[0]).abs().max() < 1e-12
            assert (batched.logits[row] - alone.logits[0]).abs().max() < 1e-12
        settings = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, num_beams=1)
        assert torch.equal(model.generate(input_ids=left, attention_mask=left_mask, **settings),
                           model.generate(input_ids=right, attention_mask=right_mask, **settings))


@pytest.mark.parametrize("position_scheme", SCHEMES)
@pytest.mark.parametrize("layer_norm_position", ["pre", "post"])
def test_no_nan_for_length_one_and_fully_padded_rows(position_scheme, layer_norm_position):
    model = tiny_model(position_scheme, layer_norm_position=layer_norm_position).train()
    cases = [
        (torch.tensor([[5]]), torch.tensor([[1]])),
        (torch.tensor([[5, 6, 7], [0, 0, 0]]), torch.tensor([[1, 1, 1], [0, 0, 0]])),
    ]
    for input_ids, attention_mask in cases:
        model.zero_grad()
        labels = torch.full((input_ids.size(0), 2), 9)
        out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        out.loss.backward()
        assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss)
        for name, parameter in model.named_parameters():
            assert parameter.grad is None or torch.isfinite(parameter.grad).all(), name


@pytest.mark.parametrize("kernel", ["eager", "sdpa", "flex_attention"])
def test_directional_first_forward_token_outputs_zero_attention(kernel):
    """A forward head's first query has no earlier key (diagonal disabled): its attention output is exactly 0, on every
    kernel, also without any padding mask."""
    config = tiny_config("directional", directional_heads=["forward"])
    config._attn_implementation = kernel
    scheme = hf_relpos.POSITION_SCHEMES["directional"](config, 1, 4, 8, is_causal=False)
    attention = RelPosAttention(config, 4, 0, is_cross_attention=False)
    q, k, v = (torch.randn(1, 4, 5, 8) for _ in range(3))
    context = scheme.prepare(PositionContext(5, 5, 0, None, q.device, q.dtype))
    out, _ = attention.attend(q, k, v, with_scheme_mask(config, scheme, context, None), scheme, context)
    assert torch.all(out[:, 0] == 0) and torch.all(out[:, 1:].abs().sum(-1) > 0)


def test_directional_default_heads_split_the_encoder_and_all_look_back_in_the_decoder():
    model = tiny_model("directional")
    assert model.model.encoder.positions.head_directions == ["forward", "forward", "backward", "backward"]
    assert model.model.decoder.positions.head_directions == ["forward"] * 4
    explicit = tiny_model("directional", directional_heads=["backward", "both"])
    assert explicit.model.decoder.positions.head_directions == ["backward", "both", "backward", "both"]


@pytest.mark.parametrize(("pattern", "warned"), [(None, False), (["forward", "both"], False),
                                                 (["forward", "backward"], True)])
def test_a_heads_pattern_that_gives_the_decoder_backward_heads_is_warned_of(pattern, warned, caplog):
    """Under the causal mask a backward decoder head sees no key: building such a model says so once, naming how
    many heads; the default and patterns without backward heads say nothing."""
    messages = [message for message in warnings_logged(caplog, lambda: tiny_model("directional",
                                                                                 directional_heads=pattern))
                if "decoder" in message]
    assert bool(messages) == warned
    if warned:
        assert len(messages) == 1 and "2 backward head(s) of 4" in messages[0]


@pytest.mark.parametrize("layer_norm_position", ["pre", "post"])
@pytest.mark.parametrize("position_scheme", SCHEMES)
def test_training_reduces_loss_and_reaches_position_parameters(position_scheme, layer_norm_position):
    model = tiny_model(position_scheme, layer_norm_position=layer_norm_position).train()
    input_ids, attention_mask, _ = padded_batch()
    labels = input_ids.flip(-1).clone()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        optimizer.zero_grad()
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]
    scheme_parameters = {n: p for n, p in model.named_parameters() if ".positions." in n}
    if position_scheme in ("shaw", "xl", "t5"):
        assert scheme_parameters
    for name, parameter in scheme_parameters.items():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_shaw_and_xl_expose_the_paper_parameters():
    shaw = tiny_model("shaw").model.encoder.positions
    assert shaw.relative_keys.shape == (2, 7, 8) and shaw.relative_values.shape == (2, 7, 8)
    per_head = tiny_model("shaw", relative_embeddings_shared_across_heads=False).model.encoder.positions
    assert per_head.relative_keys.shape == (2, 4, 7, 8)
    assert tiny_model("shaw", use_relative_values=False).model.encoder.positions.relative_values is None
    xl = tiny_model("xl").model.decoder.positions
    assert xl.content_bias.shape == (2, 4, 8) and xl.position_bias.shape == (2, 4, 8)
    assert tiny_model("xl", untie_relative_biases=False).model.decoder.positions.content_bias.shape == (1, 4, 8)
    assert not any(p.requires_grad for p in tiny_model("absolute").model.encoder.positions.parameters())


def generate(model, use_cache: bool, num_beams: int):
    input_ids, attention_mask, _ = padded_batch()
    with torch.no_grad():
        return model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            num_beams=num_beams,
            do_sample=False,
            max_new_tokens=8,
            min_new_tokens=8,
            use_cache=use_cache,
            output_logits=True,
            return_dict_in_generate=True,
        )


@pytest.mark.parametrize("num_beams", [1, 4], ids=["greedy", "beam4"])
@pytest.mark.parametrize("position_scheme", SCHEMES)
def test_cached_generation_equals_uncached(position_scheme, num_beams):
    model = tiny_model(position_scheme, seed=1)
    cached, uncached = generate(model, True, num_beams), generate(model, False, num_beams)
    assert torch.equal(cached.sequences, uncached.sequences)
    assert (torch.stack(cached.logits) - torch.stack(uncached.logits)).abs().max() < 1e-5


@pytest.mark.numerics
@pytest.mark.parametrize("argument", ["cache", "past_key_values"])
def test_the_kv_cache_is_taken_as_cache_and_under_its_deprecated_name(argument):
    """The cache argument is `cache`, as in transformers' own models; `past_key_values` is still taken (deprecated,
    as Marian takes it): step-by-step decoding that hands the returned cache back under either name gives the
    teacher-forced logits (float64); both names at once are refused."""
    model = tiny_model("shaw", seed=1).double()
    input_ids, attention_mask, _ = padded_batch()
    decoder_input_ids = torch.randint(4, 40, (3, 5), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        inputs = dict(encoder_outputs=model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask),
                      attention_mask=attention_mask)
        whole = model(decoder_input_ids=decoder_input_ids, use_cache=False, **inputs).logits
        cache, steps = None, []
        for step in range(decoder_input_ids.size(1)):
            out = model(decoder_input_ids=decoder_input_ids[:, step:step + 1], use_cache=True, **inputs,
                        **{argument: cache})
            cache = out.cache
            steps.append(out.logits)
        assert cache.get_seq_length() == decoder_input_ids.size(1)
        assert (torch.cat(steps, 1) - whole).abs().max() < 1e-12
        with pytest.raises(ValueError, match="Both `past_key_values` and `cache` are set"):
            model(decoder_input_ids=decoder_input_ids[:, :1], cache=cache, past_key_values=cache, **inputs)


@pytest.mark.numerics
def test_the_decoder_called_alone_returns_the_cache_it_fills():
    """`model.get_decoder()` stepped without `use_cache` takes `config.use_cache` (true), as Marian's decoder does: it
    returned no cache (None after the first step, so the next step restarted at position 0); handing back the cache
    it returns gives the teacher-forced hidden states (float64)."""
    model = tiny_model("shaw", seed=1).double()
    input_ids, attention_mask, _ = padded_batch()
    decoder_input_ids = torch.randint(4, 40, (3, 5), generator=torch.Generator().manual_seed(3))
    decoder = model.get_decoder()
    with torch.no_grad():
        inputs = dict(encoder_hidden_states=model.get_encoder()(input_ids=input_ids,
                                                                attention_mask=attention_mask).last_hidden_state,
                      encoder_attention_mask=attention_mask)
        whole = decoder(input_ids=decoder_input_ids, use_cache=False, **inputs).last_hidden_state
        cache, steps = None, []
        for step in range(decoder_input_ids.size(1)):
            out = decoder(input_ids=decoder_input_ids[:, step:step + 1], cache=cache, **inputs)
            cache = out.cache
            steps.append(out.last_hidden_state)
        assert cache.get_seq_length() == decoder_input_ids.size(1)
        assert (torch.cat(steps, 1) - whole).abs().max() < 1e-12
        model.config.use_cache = False
        assert decoder(input_ids=decoder_input_ids, **inputs).cache is None
    # under gradient checkpointing in training, none (as Marian's decoder), and no warning that a cache was dropped
    model.config.use_cache = True
    model.activation_checkpointing_enable()
    model.train()
    assert decoder(input_ids=decoder_input_ids, **inputs).cache is None


@pytest.mark.numerics
@pytest.mark.parametrize("every_n_layers", [1, 2])
@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("position_scheme", SCHEMES)
def test_gradient_checkpointing_gives_the_gradients_of_a_run_without_it(position_scheme, reentrant, every_n_layers):
    """Under gradient checkpointing every parameter gets the gradient of a run without it, the stack's shared terms
    included (t5's bias table, read by every layer: built in each layer's checkpoint, not kept from the first), and
    `GradientCheckpointingLayer` withholds the cache (`cache=`) from each layer, so recomputing a layer in the backward
    pass cannot write its keys a second time: the decoder returns no cache, though use_cache is true. With
    `every_n_layers` 2 (transformers' option: the first of each two layers checkpointed) a stack mixes both kinds."""
    input_ids, attention_mask, _ = padded_batch()
    decoder_input_ids = torch.randint(4, 40, (3, 5), generator=torch.Generator().manual_seed(4))
    gradients = []
    for checkpointing in (False, True):
        model = tiny_model(position_scheme, seed=1, dropout=0.0, attention_dropout=0.0).double().train()
        if checkpointing:
            model.activation_checkpointing_enable({"use_reentrant": reentrant}, every_n_layers=every_n_layers)
            assert [layer.gradient_checkpointing for layer in model.model.decoder.layers] == [
                index % every_n_layers == 0 for index in range(len(model.model.decoder.layers))]
        out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                    use_cache=checkpointing)
        out.logits.square().sum().backward()
        assert all(parameter.grad is not None for parameter in model.parameters() if parameter.requires_grad)
        gradients.append(torch.cat([parameter.grad.flatten() for parameter in model.parameters()]))
    assert out.cache is None
    assert (gradients[0] - gradients[1]).abs().max() < 1e-12


@pytest.mark.numerics
@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("position_scheme", SCHEMES)
def test_layers_not_checkpointed_share_what_the_positions_build(position_scheme, reentrant, monkeypatch):
    """With some layers checkpointed (every_n_layers 2 of 4 layers), those that are not still share what a stack's
    positions build once per call (t5's and alibi's dense bias, built once for them), while each checkpointed layer
    builds its own inside its checkpoint: it was built by every layer of a stack as soon as one was checkpointed.
    Every parameter gets the gradient of a run without checkpointing."""
    from hf_relpos.model.positions import DenseBias

    builds = []
    build = DenseBias._checked
    monkeypatch.setattr(DenseBias, "_checked", lambda bias: builds.append(1) or build(bias))
    input_ids, attention_mask, _ = padded_batch()
    decoder_input_ids = torch.randint(4, 40, (3, 5), generator=torch.Generator().manual_seed(4))
    gradients = []
    for checkpointing in (False, True):
        model = tiny_model(position_scheme, seed=1, dropout=0.0, attention_dropout=0.0, encoder_layers=4,
                           decoder_layers=4).double().train()
        if checkpointing:
            model.activation_checkpointing_enable({"use_reentrant": reentrant}, every_n_layers=2)
        builds.clear()
        out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
        if checkpointing and position_scheme in ("t5", "alibi"):   # per stack: 2 checkpointed layers + 1 shared build
            assert len(builds) == 2 * (2 + 1)
        out.logits.square().sum().backward()
        gradients.append(torch.cat([parameter.grad.flatten() for parameter in model.parameters()]))
    assert (gradients[0] - gradients[1]).abs().max() < 1e-12


@pytest.mark.numerics
def test_layers_checkpointed_by_torchs_wrapper_give_the_gradients_of_a_run_without_it():
    """Layers wrapped by torch's checkpoint_wrapper (FSDP's activation checkpointing) instead of transformers' flag:
    t5's shared bias table still gets the gradient of a run without checkpointing."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    input_ids, attention_mask, _ = padded_batch()
    decoder_input_ids = torch.randint(4, 40, (3, 5), generator=torch.Generator().manual_seed(4))
    gradients = []
    for wrapped in (False, True):
        model = tiny_model("t5", seed=1, dropout=0.0, attention_dropout=0.0).double().train()
        if wrapped:
            for stack in (model.model.encoder, model.model.decoder):
                for index, layer in enumerate(stack.layers):
                    stack.layers[index] = checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
              use_cache=False).logits.square().sum().backward()   # as in training (labels turn the cache off)
        gradients.append(torch.cat([parameter.grad.flatten() for parameter in model.parameters()]))
    assert (gradients[0] - gradients[1]).abs().max() < 1e-12


@pytest.mark.parametrize("position_scheme", RELATIVE_SCHEMES)
def test_inputs_far_longer_than_training_run(position_scheme):
    model = tiny_model(position_scheme)
    input_ids = torch.randint(4, 40, (1, 1000))
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, max_new_tokens=3, min_new_tokens=3, do_sample=False,
                             output_logits=True, return_dict_in_generate=True)
    assert out.sequences.shape == (1, 4)
    assert all(torch.isfinite(step).all() for step in out.logits)


@pytest.mark.numerics
def test_absolute_positions_extend_past_max_position_embeddings():
    """`max_position_embeddings` bounds no table: positions at and beyond it get their own sinusoid (Vaswani et al.,
    sec. 3.5), in the encoder and in cached decoding, and generation runs past it with the cache equal to without."""
    model = tiny_model("absolute", max_position_embeddings=16).double()
    limit, dim = model.config.max_position_embeddings, model.config.d_model
    length = 2 * limit + 8
    encodings = model.model.encoder.positions.embed(torch.zeros(1, length, dim, dtype=torch.float64), 0)[0]
    for position in (limit - 1, limit, length - 1):
        assert (encodings[position] - sinusoid_by_loop(position, dim)).abs().max() < 1e-12
    assert torch.cdist(encodings, encodings).add(torch.eye(length)).min() > 1e-3  # no two positions share a code
    step = model.model.decoder.positions.embed(torch.zeros(1, 1, dim, dtype=torch.float64), limit + 5)[0, 0]
    assert (step - sinusoid_by_loop(limit + 5, dim)).abs().max() < 1e-12
    source = torch.randint(4, 40, (1, length), generator=torch.Generator().manual_seed(0))
    kwargs = dict(max_new_tokens=limit + 4, min_new_tokens=limit + 4, do_sample=False, output_logits=True,
                  return_dict_in_generate=True)
    with torch.no_grad():
        cached = model.generate(input_ids=source, use_cache=True, **kwargs)
        uncached = model.generate(input_ids=source, use_cache=False, **kwargs)
    assert cached.sequences.shape == (1, limit + 5) and torch.equal(cached.sequences, uncached.sequences)
    assert (torch.stack(cached.logits) - torch.stack(uncached.logits)).abs().max() < 1e-12


@pytest.mark.numerics
@pytest.mark.parametrize("dim", [8, 7, 33])
def test_sinusoids_are_the_papers_in_marians_layout_for_every_width(dim):
    """Vaswani et al. (2017) sec. 3.5: PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i + 1) = cos(p / 10000^(2i/d)),
    the even dimensions (sines) first and the odd ones (cosines) after, as Marian lays them out: for an odd d one sine
    more than cosines, every frequency over d (transformers' MarianSinusoidalPositionalEmbedding, the same table)."""
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    positions = torch.arange(-3, 40)
    expected = torch.zeros(len(positions), dim, dtype=torch.float64)
    for row, position in enumerate(positions.tolist()):
        paper = [math.sin(position / 10000 ** (j / dim)) if j % 2 == 0 else math.cos(position / 10000 ** ((j - 1) / dim))
                 for j in range(dim)]
        expected[row] = torch.tensor(paper[0::2] + paper[1::2], dtype=torch.float64)
    encoded = sinusoids(positions, dim, torch.float64)
    assert encoded.shape == (len(positions), dim)
    assert (encoded - expected).abs().max() < 1e-12
    for row, position in enumerate(positions.tolist()):
        assert (sinusoid_by_loop(position, dim) - expected[row]).abs().max() < 1e-12   # the tests' own oracle too
    marian = MarianSinusoidalPositionalEmbedding(40, dim).create_weight()
    assert (encoded[3:].float() - marian).abs().max() < 1e-6   # Marian's table is float32


def test_tied_embeddings_share_one_matrix_and_untied_do_not():
    tied = tiny_model("shaw")
    assert tied.lm_head.weight is tied.model.shared.weight is tied.model.encoder.embed_tokens.weight
    assert tied.model.decoder.embed_tokens.weight is tied.model.shared.weight
    untied = tiny_model("shaw", tie_word_embeddings=False)
    assert untied.model.shared is None and not any("shared" in name for name, _ in untied.named_parameters())
    assert untied.get_input_embeddings() is untied.model.encoder.embed_tokens
    matrices = (untied.lm_head.weight, untied.model.encoder.embed_tokens.weight, untied.model.decoder.embed_tokens.weight)
    assert len({id(matrix) for matrix in matrices}) == 3


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_input_embeddings_are_the_ones_the_model_reads_and_resizing_keeps_the_trained_rows(tied, tmp_path):
    """`get_input_embeddings()` is the matrix the encoder reads (inputs_embeds from it give the logits of input_ids,
    and it gets the gradient); `resize_token_embeddings` grows every matrix of the joint vocabulary (the untied
    decoder's too) and leaves the logits of the old tokens as they were; the resized model saves and reloads."""
    model = tiny_model("shaw", tie_word_embeddings=tied).double()
    input_ids, attention_mask, _ = padded_batch()
    decoder_input_ids = input_ids[:, :4]
    inputs = dict(attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    expected = model(input_ids=input_ids, **inputs).logits
    from_embeds = model(inputs_embeds=model.get_input_embeddings()(input_ids), **inputs).logits
    assert (from_embeds - expected).abs().max() < 1e-12
    model.train()
    model(input_ids=input_ids, labels=decoder_input_ids, attention_mask=attention_mask).loss.backward()
    assert model.get_input_embeddings().weight.grad.abs().sum() > 0
    model.eval()
    vocab_size = model.config.vocab_size
    model.resize_token_embeddings(vocab_size + 3)
    stacks = (model.model.encoder, model.model.decoder)
    assert [stack.embed_tokens.weight.size(0) for stack in stacks] == [vocab_size + 3] * 2
    assert model.lm_head.weight.size(0) == model.final_logits_bias.size(1) == model.config.vocab_size == vocab_size + 3
    with torch.no_grad():
        resized = model(input_ids=input_ids, **inputs).logits
    assert (resized[..., :vocab_size] - expected).abs().max() < 1e-12
    model.save_pretrained(tmp_path)
    reloaded = hf_relpos.RelPosTransformerForConditionalGeneration.from_pretrained(tmp_path).double().eval()
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=input_ids, **inputs).logits, resized)
    base = hf_relpos.RelPosTransformerModel(tiny_config("shaw", tie_word_embeddings=tied))
    base.resize_token_embeddings(vocab_size + 5)
    assert [stack.embed_tokens.weight.size(0) for stack in (base.encoder, base.decoder)] == [vocab_size + 5] * 2


def logits_of(model):
    input_ids, attention_mask, _ = padded_batch()
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :4]).logits


@pytest.mark.parametrize("position_scheme", SCHEMES)
def test_save_load_round_trip_with_package_and_auto_classes(position_scheme, tmp_path):
    model = tiny_model(position_scheme, tie_word_embeddings=position_scheme != "xl")
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists() and not (tmp_path / "pytorch_model.bin").exists()
    expected = logits_of(model)
    reloaded = hf_relpos.RelPosTransformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert torch.equal(logits_of(reloaded), expected)
    auto = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert isinstance(auto, hf_relpos.RelPosTransformerForConditionalGeneration)
    assert torch.equal(logits_of(auto), expected)
    assert isinstance(AutoConfig.from_pretrained(tmp_path), hf_relpos.RelPosTransformerConfig)
    base = AutoModel.from_pretrained(tmp_path)
    assert isinstance(base, hf_relpos.RelPosTransformerModel)
    assert torch.equal(base.get_input_embeddings().weight, model.get_input_embeddings().weight)


@pytest.mark.parametrize("position_scheme", ["shaw", "none", "alibi", "t5", "rope"])
def test_remote_code_loads_without_hf_relpos_installed(position_scheme, tmp_path):
    model = tiny_model(position_scheme)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    torch.save(logits_of(model), tmp_path / "expected.pt")
    script = f"""
        import torch
        from transformers import AutoModel, AutoModelForSeq2SeqLM
        try:
            import hf_relpos
            raise SystemExit("hf_relpos was importable")
        except ImportError:
            pass
        model = AutoModelForSeq2SeqLM.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        base = AutoModel.from_pretrained({str(folder)!r}, trust_remote_code=True)
        assert type(base).__name__ == "RelPosTransformerModel", type(base)
        lengths = [7, 4, 2]
        input_ids = torch.zeros(3, 7, dtype=torch.long)
        attention_mask = torch.zeros(3, 7, dtype=torch.long)
        generator = torch.Generator().manual_seed(3)
        for row, length in enumerate(lengths):
            input_ids[row, :length] = torch.randint(4, 40, (length,), generator=generator)
            attention_mask[row, :length] = 1
        with torch.no_grad():
            logits = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :4]).logits
        expected = torch.load({str(tmp_path / "expected.pt")!r})
        assert torch.equal(logits, expected), (logits - expected).abs().max()
        print("REMOTE_OK")
        """
    result = run_without_hf_relpos(script, tmp_path)
    assert "REMOTE_OK" in result.stdout, result.stderr[-3000:]
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    assert auto_map == {
        "AutoConfig": "configuration_relpos.RelPosTransformerConfig",
        "AutoModel": "modeling_relpos.RelPosTransformerModel",
        "AutoModelForSeq2SeqLM": "modeling_relpos.RelPosTransformerForConditionalGeneration",
    }


def reversal_task(pairs: int = 12, seed: int = 0):
    """Reversal of `pairs` random token sequences (lengths 3-8, distinct tokens) and of each one reversed: rows 2p and
    2p + 1 hold the same tokens in opposite orders, so their targets differ while their bags of tokens are equal."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.zeros(2 * pairs, 8, dtype=torch.long)
    attention_mask = torch.zeros(2 * pairs, 8, dtype=torch.long)
    labels = torch.full((2 * pairs, 9), -100, dtype=torch.long)
    for pair in range(pairs):
        length = int(torch.randint(3, 9, (1,), generator=generator))
        tokens = torch.randperm(36, generator=generator)[:length] + 4
        for row, source in ((2 * pair, tokens), (2 * pair + 1, tokens.flip(0))):
            input_ids[row, :length], attention_mask[row, :length] = source, 1
            labels[row, :length], labels[row, length] = source.flip(0), 1
    return input_ids, attention_mask, labels


def train_and_reverse(position_scheme: str) -> tuple[list[bool], torch.Tensor]:
    """Train a tiny model on the reversal task (300 full-batch Adam steps), then translate its sources greedily:
    whether each row's output is exactly its target, and the outputs."""
    torch.manual_seed(0)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(
        tiny_config(position_scheme, d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128,
                    **hf_relpos.RelPosTransformerConfig.held_fields(position_scheme, {"max_relative_position": 8}))
    ).train()
    input_ids, attention_mask, labels = reversal_task()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    for _ in range(300):
        optimizer.zero_grad()
        model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
        optimizer.step()
    with torch.no_grad():
        outputs = model.eval().generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=9,
                                        do_sample=False, num_beams=1)[:, 1:]
    lengths = attention_mask.sum(-1).tolist()
    exact = [outputs[row, : n + 1].tolist() == labels[row, : n + 1].tolist() for row, n in enumerate(lengths)]
    return exact, outputs


@pytest.mark.parametrize("position_scheme", ORDER_AWARE_SCHEMES)
def test_tiny_model_learns_to_reverse_sequences_and_their_reversals(position_scheme):
    """Reversal needs order: every source also appears reversed, with the opposite target. A model that gets all of
    them right tells the two orders apart, i.e. really uses its scheme (a position-blind one cannot, see below)."""
    exact, _ = train_and_reverse(position_scheme)
    assert all(exact)


@pytest.mark.numerics
def test_alibi_encoder_is_mirror_equivariant():
    """ALiBi's encoder bias -m_h |i - j| does not change when the sequence is reversed, so without a marker at one end
    (such as `</s>`) the encoder states of a reversed input are the reversed states: a source and its reversal look
    alike to cross-attention, which is why `alibi` is not in ORDER_AWARE_SCHEMES."""
    model = tiny_model("alibi").double()
    source = torch.randint(4, 40, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        states = model.get_encoder()(input_ids=source).last_hidden_state
        mirrored = model.get_encoder()(input_ids=source.flip(1)).last_hidden_state
    assert (mirrored - states.flip(1)).abs().max() < 1e-12
    with pytest.raises(AssertionError, match="'alibi': order awareness"):
        check_order_aware("alibi")
    check_order_aware("shaw")  # a direction-aware scheme is not mirror-equivariant


def test_a_position_blind_model_fails_the_reversal_task():
    """Without positions (`none`) the encoder is permutation-equivariant and cross-attention sums over it, so a source
    and its reversal give the decoder the same input: identical translations, at most one of each pair right."""
    exact, outputs = train_and_reverse("none")
    assert sum(exact) <= len(exact) // 2
    assert all(torch.equal(outputs[2 * pair], outputs[2 * pair + 1]) for pair in range(len(exact) // 2))


def return_dict_cases():
    """(model, inputs) for every model class, each with labels where it has a head."""
    source, attention_mask, _ = padded_batch()
    causal = hf_relpos.RelPosTransformerForCausalLM(tiny_config("xl", mem_len=3)).eval()
    return [
        (tiny_model("shaw"), dict(input_ids=source, attention_mask=attention_mask, labels=source[:, :4])),
        (hf_relpos.RelPosTransformerModel(tiny_config("xl")).eval(),
         dict(input_ids=source, attention_mask=attention_mask, decoder_input_ids=source[:, :4])),
        (causal, dict(input_ids=source, labels=source)),
    ]


@pytest.mark.parametrize("case", range(3), ids=["seq2seq", "base", "causal_lm"])
def test_return_dict_false_returns_the_output_as_a_tuple(case):
    """`return_dict=False` (argument or config) gives `ModelOutput.to_tuple()`, as every transformers model does."""
    model, inputs = return_dict_cases()[case]
    with torch.no_grad():
        expected = model(**inputs).to_tuple()
        as_argument = model(**inputs, return_dict=False)
        model.config.return_dict = False
        from_config = model(**inputs)
        encoder = model.get_encoder()(input_ids=inputs["input_ids"]) if hasattr(model, "get_encoder") else None
    assert isinstance(as_argument, tuple) and isinstance(from_config, tuple) and len(as_argument) == len(expected)
    for got, want in zip(as_argument, expected, strict=True):
        assert torch.equal(got, want) if torch.is_tensor(want) else type(got) is type(want)
    assert torch.equal(from_config[0], expected[0])
    if encoder is not None:
        assert isinstance(encoder, tuple)


@pytest.mark.parametrize("case", range(3), ids=["seq2seq", "base", "causal_lm"])
def test_output_flags_left_unset_take_the_configs(case):
    """`config.output_attentions` / `output_hidden_states` (e.g. `from_pretrained(path, output_attentions=True)`)
    stand for the flags a call leaves unset, as in Marian and BART; a flag passed wins."""
    model, inputs = return_dict_cases()[case]
    model.set_attn_implementation("eager")   # transformers allows config.output_attentions on eager only
    with torch.no_grad():
        expected = model(**inputs, output_attentions=True, output_hidden_states=True)
        model.config.output_attentions = model.config.output_hidden_states = True
        from_config = model(**inputs)
        overridden = model(**inputs, output_attentions=False, output_hidden_states=False)
        encoder = model.get_encoder()(input_ids=inputs["input_ids"]) if hasattr(model, "get_encoder") else None
    flagged = [key for key in expected if "attentions" in key or key.endswith("hidden_states")]
    assert len(flagged) >= 2
    for key in flagged:
        assert len(from_config[key]) == len(expected[key])
        assert all(torch.equal(got, want) for got, want in zip(from_config[key], expected[key], strict=True))
        assert overridden.get(key) is None
    if encoder is not None:
        assert encoder.attentions is not None and encoder.hidden_states is not None


class RecordedPositions:
    """Records the positions each stack's scheme receives (`embed`'s and `terms`' `positions`, None = ordinary)."""

    def __init__(self, model, monkeypatch):
        self.calls: list[tuple[str, str, torch.Tensor | None]] = []
        for stack_name in ("encoder", "decoder"):
            scheme = getattr(model.model, stack_name).positions
            embed, terms = scheme.embed, scheme.terms

            def recorded_embed(inputs_embeds, past_length, positions=None, _embed=embed, _stack=stack_name):
                self.calls.append((_stack, "embed", positions))
                return _embed(inputs_embeds, past_length, **({} if positions is None else {"positions": positions}))

            def recorded_terms(layer_idx, query, key, context, _terms=terms, _stack=stack_name):
                self.calls.append((_stack, "terms", context.positions))
                return _terms(layer_idx, query, key, context)

            monkeypatch.setattr(scheme, "embed", recorded_embed)
            monkeypatch.setattr(scheme, "terms", recorded_terms)


@pytest.mark.parametrize("position_scheme", SCHEMES)
def test_position_randomization_is_off_by_default_and_in_evaluation(position_scheme, monkeypatch):
    """Without `position_randomization_max` training passes no positions (every scheme computes what it did before
    the option existed, and no random number is drawn); with it, evaluation and generation use the ordinary
    positions, so a model with it set computes exactly what the same weights without it compute."""
    input_ids, attention_mask, _ = padded_batch()
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids.flip(-1))
    assert tiny_config(position_scheme).position_randomization_max is None
    assert tiny_config(position_scheme, position_randomization_max=64).position_randomization_at_inference is False
    plain = tiny_model(position_scheme).train()
    randomized = tiny_model(position_scheme, position_randomization_max=64).train()
    randomized.load_state_dict(plain.state_dict())
    recorded = RecordedPositions(plain, monkeypatch)
    state = torch.get_rng_state()
    plain(**inputs).loss.backward()
    assert torch.equal(torch.get_rng_state(), state)
    counted = torch.arange(attention_mask.size(1)).expand_as(attention_mask)   # right padding: every token's index
    assert recorded.calls and all(positions is None or (stack == "encoder" and torch.equal(positions, counted))
                                  for stack, _, positions in recorded.calls)
    with torch.no_grad():
        plain.eval(), randomized.eval()
        assert torch.equal(randomized(**inputs).logits, plain(**inputs).logits)
        kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=5, do_sample=False)
        state = torch.get_rng_state()
        assert torch.equal(randomized.generate(**kwargs), plain.generate(**kwargs))
        assert torch.equal(torch.get_rng_state(), state)  # nothing drawn at inference by default


def test_position_randomization_draws_sorted_positions_in_range_in_training_only(monkeypatch):
    """Ruoss et al. (2023): in training each stack's tokens sit at a sorted random subset of 0 .. L-1 (embed gets the
    tokens' positions, every layer's terms the same key positions); in evaluation every scheme gets None (0 .. n-1)."""
    model = tiny_model("shaw", position_randomization_max=30).train()
    recorded = RecordedPositions(model, monkeypatch)
    input_ids, attention_mask, _ = padded_batch()
    draws = []
    for _ in range(3):
        recorded.calls.clear()
        model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids[:, :5]).loss.backward()
        for stack, length in (("encoder", 7), ("decoder", 5)):
            calls = [positions for name, _, positions in recorded.calls if name == stack]
            assert len(calls) == 1 + 2  # embed, then the terms of both layers
            positions = calls[0]
            assert positions.shape == (length,) and positions.dtype == torch.long
            assert 0 <= positions.min() and positions.max() < 30
            assert torch.all(positions[1:] > positions[:-1])  # sorted, distinct
            assert all(torch.equal(other, positions) for other in calls[1:])
            draws.append(positions)
    assert len({tuple(draw.tolist()) for draw in draws}) > 2  # random, not one fixed subset
    model.eval()
    recorded.calls.clear()
    with torch.no_grad():
        model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids[:, :5])
        model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=3)
    assert recorded.calls and all(positions is None for _, _, positions in recorded.calls)


def test_position_randomization_shorter_than_a_training_sequence_is_a_clear_error():
    model = tiny_model("shaw", position_randomization_max=4).train()
    with pytest.raises(ValueError, match=r"position_randomization_max \(4\) must be at least the sequence length"):
        model(input_ids=torch.randint(4, 40, (1, 6)), labels=torch.randint(4, 40, (1, 2)))


def test_randomized_positions_check_given_position_ids_but_not_the_source_positions_the_encoder_counts(monkeypatch):
    """The decoder's position_ids (given, as generate gives them) must index the randomized positions: one clear error
    otherwise. The encoder's own ids for a padded source (`source_position_ids`, cumsum - 1 over the mask: 0 .. n-1 by
    construction) are not range-checked: no `torch.aminmax`, whose host sync would stall every training step."""
    model = tiny_model("absolute", position_randomization_max=30).train()
    input_ids, attention_mask, _ = padded_batch()
    ranges, aminmax = [], torch.aminmax
    monkeypatch.setattr(torch, "aminmax", lambda tensor, **kwargs: ranges.append(tensor) or aminmax(tensor, **kwargs))
    model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids[:, :5]).loss.backward()
    assert ranges == []
    decoder_ids = input_ids[:, :5]
    with pytest.raises(ValueError, match=r"with randomized positions, position_ids must index the sequence's 5 "
                                         r"positions \(0 \.\. 4\), got 0 \.\. 5"):
        model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_ids,
              decoder_position_ids=torch.arange(1, 6).expand_as(decoder_ids) * (torch.arange(5) > 0))
    assert len(ranges) == 1


@pytest.mark.parametrize("value", [0, -3, 2.5, True, "64"])
def test_position_randomization_max_is_validated(value):
    with pytest.raises(ValueError, match="position_randomization_max must be null"):
        tiny_config(position_randomization_max=value)


# ------------------------------------------- randomized positions at inference (position_randomization_at_inference)

ORDER_ONLY = ("directional", "none")  # DiSAN's masks compare positions by order only; NoPE ignores them


def randomized_at_inference(position_scheme: str = "shaw", seed: int = 1, **overrides):
    return tiny_model(position_scheme, seed=seed, position_randomization_max=40,
                      position_randomization_at_inference=True, **overrides)


def seeded_generate(model, seed: int, use_cache: bool, num_beams: int):
    torch.manual_seed(seed)
    return generate(model, use_cache, num_beams)


@pytest.mark.numerics
@pytest.mark.parametrize("num_beams", [1, 4], ids=["greedy", "beam4"])
@pytest.mark.parametrize("position_scheme", SCHEMES)
def test_randomized_inference_cached_generation_equals_uncached(position_scheme, num_beams):
    """Ruoss et al. (2023) randomize at evaluation too: under one seed (so one encoder draw and one decoder draw for
    the whole output), cached and uncached greedy / beam search give the same tokens and logits; the positions are
    really random (another seed, or the same weights at ordinary positions, give other logits, except for the schemes
    that read only the order of positions)."""
    model = randomized_at_inference(position_scheme).double()
    cached, uncached = seeded_generate(model, 7, True, num_beams), seeded_generate(model, 7, False, num_beams)
    assert torch.equal(cached.sequences, uncached.sequences)
    assert (torch.stack(cached.logits) - torch.stack(uncached.logits)).abs().max() < 1e-12
    again = seeded_generate(model, 7, True, num_beams)
    assert torch.equal(torch.stack(again.logits), torch.stack(cached.logits))  # reproducible under a seed
    other_seed = seeded_generate(model, 8, True, num_beams)
    model.config.position_randomization_at_inference = False
    ordinary = seeded_generate(model, 7, True, num_beams)
    for other in (other_seed, ordinary):
        assert torch.equal(torch.stack(other.logits), torch.stack(cached.logits)) == (position_scheme in ORDER_ONLY)


@pytest.mark.numerics
@pytest.mark.parametrize("position_scheme", SCHEMES)
def test_randomized_inference_decoding_steps_reuse_one_draw(position_scheme):
    """Given one `PositionDraw`, the logits of a whole teacher-forced output equal those of step-by-step cached
    decoding (float64): each step reads the first past_length + n positions, past keys keep theirs."""
    model = randomized_at_inference(position_scheme).double()
    input_ids, attention_mask, _ = padded_batch()
    decoder_input_ids = torch.randint(4, 40, (3, 6), generator=torch.Generator().manual_seed(2))
    draw = hf_relpos.PositionDraw(torch.tensor([1, 4, 5, 11, 20, 33, 38]))
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
        inputs = dict(encoder_outputs=encoder_outputs, attention_mask=attention_mask, decoder_positions=draw)
        whole = model(decoder_input_ids=decoder_input_ids, use_cache=False, **inputs).logits
        cache, steps = None, []
        for start, end in ((0, 2), (2, 3), (3, 4), (4, 6)):  # a two-token prompt, then single tokens and a pair
            out = model(decoder_input_ids=decoder_input_ids[:, start:end], cache=cache, use_cache=True, **inputs)
            cache = out.cache
            steps.append(out.logits)
    assert (torch.cat(steps, 1) - whole).abs().max() < 1e-12
    with torch.no_grad():
        consecutive = model(decoder_input_ids=decoder_input_ids, use_cache=False, **{
            **inputs, "decoder_positions": hf_relpos.PositionDraw(torch.arange(6))}).logits
        model.config.position_randomization_at_inference = False
        ordinary = model(decoder_input_ids=decoder_input_ids, encoder_outputs=encoder_outputs,
                         attention_mask=attention_mask).logits
    assert (consecutive - ordinary).abs().max() < 1e-12  # the draw 0 .. n-1 is the ordinary positions


def test_randomized_inference_draws_sorted_positions_in_range_once_per_generate(monkeypatch):
    """In generate, the encoder gets one sorted draw in 0 .. L-1 and the decoder one draw for the longest output
    (prompt + max_new_tokens): every cached step's keys are a prefix of it and its new token the next entry. A
    teacher-forced evaluation call draws afresh for both stacks, as training does."""
    model = randomized_at_inference("shaw")
    recorded = RecordedPositions(model, monkeypatch)
    input_ids, attention_mask, _ = padded_batch()
    with torch.no_grad():
        model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=6, min_new_tokens=6,
                       do_sample=False)
    encoder = [positions for stack, _, positions in recorded.calls if stack == "encoder"]
    decoder_keys = [positions for stack, kind, positions in recorded.calls if stack == "decoder" and kind == "terms"]
    decoder_tokens = [positions for stack, kind, positions in recorded.calls if stack == "decoder" and kind == "embed"]
    assert len(encoder) == 3 and all(torch.equal(positions, encoder[0]) for positions in encoder)
    draw = decoder_keys[-1]
    assert draw.numel() == 6  # the start token and 5 fed back; generate may produce 7 tokens in all
    for positions in (encoder[0], draw):
        assert 0 <= positions.min() and positions.max() < 40 and torch.all(positions[1:] > positions[:-1])
    assert [keys.numel() for keys in decoder_keys] == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6]  # 2 layers per step
    assert all(torch.equal(keys, draw[: keys.numel()]) for keys in decoder_keys)
    assert torch.equal(torch.cat(decoder_tokens), draw)
    recorded.calls.clear()
    with torch.no_grad():
        model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids[:, :5])
    assert all(positions is not None for _, _, positions in recorded.calls) and len(recorded.calls) == 6


@pytest.mark.numerics
def test_randomized_inference_causal_lm_cached_generation_equals_uncached():
    torch.manual_seed(0)
    model = hf_relpos.RelPosTransformerForCausalLM(tiny_config(
        "rope", position_randomization_max=40, position_randomization_at_inference=True)).eval().double()
    prompt = torch.randint(4, 40, (2, 5), generator=torch.Generator().manual_seed(4))
    results = []
    for use_cache in (True, False):
        torch.manual_seed(3)
        with torch.no_grad():
            results.append(model.generate(input_ids=prompt, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                                          use_cache=use_cache, output_logits=True, return_dict_in_generate=True))
    assert torch.equal(results[0].sequences, results[1].sequences)
    assert (torch.stack(results[0].logits) - torch.stack(results[1].logits)).abs().max() < 1e-12


@pytest.mark.parametrize("prompt_argument", ["input_ids", "inputs", "positional"])
def test_randomized_inference_causal_lm_draws_for_the_prompt_however_it_is_passed(prompt_argument):
    """generate's prompt is `inputs` (its first parameter, by name or position) or `input_ids`: each draws positions
    for the prompt plus the new tokens and generates the same tokens, where `inputs=` drew for the new tokens only
    (a ValueError once the decoder passed them)."""
    torch.manual_seed(0)
    model = hf_relpos.RelPosTransformerForCausalLM(tiny_config(
        "xl", position_randomization_max=40, position_randomization_at_inference=True)).eval()
    prompt = torch.tensor([[5, 6, 7]])
    settings = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False)
    with torch.no_grad():
        torch.manual_seed(1)
        expected = model.generate(input_ids=prompt, **settings)
        torch.manual_seed(1)
        got = (model.generate(prompt, **settings) if prompt_argument == "positional"
               else model.generate(**{prompt_argument: prompt}, **settings))
    assert expected.shape == (1, 7) and torch.equal(got, expected)


def test_randomized_inference_errors_name_the_field():
    with pytest.raises(ValueError, match="position_randomization_at_inference needs position_randomization_max"):
        tiny_config(position_randomization_at_inference=True)
    with pytest.raises(ValueError, match="position_randomization_at_inference must be true or false"):
        tiny_config(position_randomization_max=8, position_randomization_at_inference="yes")
    model = randomized_at_inference()
    input_ids, attention_mask, _ = padded_batch()
    with torch.no_grad(), pytest.raises(ValueError, match=r"position_randomization_max \(40\) must be at least the "
                                                           r"longest output generate may produce \(41 tokens\)"):
        model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=40)
    with torch.no_grad():
        first = model(input_ids=input_ids, decoder_input_ids=torch.full((3, 1), 2), use_cache=True)
        with pytest.raises(ValueError, match="position_randomization_at_inference: a decoding step after cached"):
            model(encoder_outputs=(first.encoder_last_hidden_state,), decoder_input_ids=torch.full((3, 1), 5),
                  cache=first.cache, use_cache=True)
        with pytest.raises(ValueError, match="decoder_positions hold 1 positions, but the decoder reached 2 tokens"):
            model(input_ids=input_ids, decoder_input_ids=torch.full((3, 2), 5),
                  decoder_positions=hf_relpos.PositionDraw(torch.tensor([3])))
    for bad in (torch.tensor([3, 3]), torch.tensor([-1, 2]), torch.tensor([[1, 2]]), torch.tensor([0.0, 1.0])):
        with pytest.raises(ValueError, match="decoder_positions must"):
            hf_relpos.PositionDraw(bad)
    torch.manual_seed(0)
    memory_lm = hf_relpos.RelPosTransformerForCausalLM(tiny_config(
        "xl", mem_len=4, position_randomization_max=40, position_randomization_at_inference=True)).eval()
    with torch.no_grad(), pytest.raises(ValueError, match=r"does not work with a Transformer-XL memory \(mem_len=4\)"):
        memory_lm.generate(input_ids=torch.tensor([[5, 6]]), max_new_tokens=2)
    memoryless_lm = copy.deepcopy(memory_lm)
    memoryless_lm.config.mem_len = 0
    with torch.no_grad():   # the call's mem_len decides: 0 switches the memory off, so positions are drawn
        torch.manual_seed(3)
        expected = memoryless_lm.generate(input_ids=torch.tensor([[5, 6]]), max_new_tokens=6, output_logits=True,
                                          return_dict_in_generate=True)
        torch.manual_seed(3)
        got = memory_lm.generate(input_ids=torch.tensor([[5, 6]]), max_new_tokens=6, mem_len=0, output_logits=True,
                                 return_dict_in_generate=True)
    assert torch.equal(got.sequences, expected.sequences)
    torch.testing.assert_close(torch.stack(got.logits), torch.stack(expected.logits), rtol=0, atol=0)


def test_generate_refuses_a_beam_wider_than_the_vocabulary():
    """One check for the model and train_translation.py (`check_num_beams`): beam search's top-k would fail deep
    inside `generate`; here it is one error naming the argument. A beam as wide as the vocabulary runs."""
    model = tiny_model("shaw", seed=1).eval()
    input_ids, attention_mask, _ = padded_batch()
    vocabulary = model.config.vocab_size
    with pytest.raises(ValueError, match=rf"^num_beams \({vocabulary + 1}\) is larger than the vocabulary "
                                         rf"\({vocabulary} tokens\)$"):
        model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=vocabulary + 1, max_new_tokens=2)
    output = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=vocabulary, max_new_tokens=2)
    assert output.shape[0] == input_ids.shape[0]
    with pytest.raises(ValueError, match=r"^num_beams must be a positive integer, got 0$"):
        model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=0, max_new_tokens=2)


@pytest.mark.parametrize(("argument", "shape", "accepted"), [
    ("attention_mask", (3, 8), "[3, 7]"), ("attention_mask", (3, 6), "[3, 7]"),
    ("attention_mask", (1, 7), "[3, 7]"), ("attention_mask", (7,), "[3, 7]"),
    ("decoder_attention_mask", (3, 4), "[3, 5 or more]"), ("decoder_attention_mask", (1, 5), "[3, 5 or more]"),
])
def test_a_mask_of_another_shape_is_one_error_naming_it(argument, shape, accepted):
    """A key mask must be [batch, length] (the decoder's may be wider: its last columns count); transformers'
    masking utilities would zero-pad a short one and cut a long one in silence."""
    model = tiny_model("shaw", seed=1).eval()
    input_ids = torch.randint(4, 40, (3, 7), generator=torch.Generator().manual_seed(0))
    decoder_input_ids = input_ids[:, :5]
    name = "attention_mask" if argument == "attention_mask" else "the decoder's attention_mask"
    with pytest.raises(ValueError, match=rf"^{name} must be a \[batch, length\] mask of 1 \(attend\) and 0 "
                                         rf"\(padding\): {re.escape(accepted)}, got {re.escape(str(list(shape)))}$"):
        model(input_ids=input_ids, decoder_input_ids=decoder_input_ids, **{argument: torch.ones(shape)})


def test_the_decoder_mask_of_the_new_tokens_or_of_all_tokens_is_taken_with_a_cache():
    """Cached decoding: a decoder mask over the new tokens or over cached + new ones (or wider, its last columns)
    gives the logits of the uncached call; a mask of another width is refused."""
    model = tiny_model("shaw", seed=1).eval()
    input_ids = torch.randint(4, 40, (2, 6), generator=torch.Generator().manual_seed(0))
    decoder_input_ids = input_ids[:, :4]
    with torch.no_grad():
        full = model(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits[:, -1]
        prefix = model(input_ids=input_ids, decoder_input_ids=decoder_input_ids[:, :3], use_cache=True)
        for width in (1, 4, 6):
            step = model(encoder_outputs=(prefix.encoder_last_hidden_state,), decoder_input_ids=decoder_input_ids[:, 3:],
                         decoder_attention_mask=torch.ones(2, width), cache=copy.deepcopy(prefix.cache))
            assert (step.logits[:, -1] - full).abs().max() < 1e-5, width
        with pytest.raises(ValueError, match=r"\[2, 1\] \(new tokens\) or \[2, 4 or more\] \(cached and new\)"):
            model(encoder_outputs=(prefix.encoder_last_hidden_state,), decoder_input_ids=decoder_input_ids[:, 3:],
                  decoder_attention_mask=torch.ones(2, 2), cache=copy.deepcopy(prefix.cache))


@pytest.mark.numerics
@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
@pytest.mark.parametrize("position_scheme", SCHEMES)
def test_a_cached_decoding_step_without_padding_builds_no_self_attention_mask(position_scheme, kernel, monkeypatch):
    """A cached step of one token without a decoder mask attends to every key: its self-attention gets no mask
    (beyond a scheme's own, DiSAN's), which a step built and applied in every layer, and its logits are bitwise
    those of the step under an all-ones decoder mask, which builds the mask (float64)."""
    model = tiny_model(position_scheme, seed=1, attn_implementation=kernel).double().eval()
    input_ids = torch.randint(4, 40, (2, 6), generator=torch.Generator().manual_seed(0))
    decoder_input_ids = input_ids[:, :4]
    self_masks = []
    attend = RelPosAttention.attend

    def recording(self, query, key, value, attention_mask, scheme=None, context=None, *args, **kwargs):
        if scheme is not None and not context.has_mask():
            self_masks.append(attention_mask)
        return attend(self, query, key, value, attention_mask, scheme, context, *args, **kwargs)

    with torch.no_grad():
        prefix = model(input_ids=input_ids, decoder_input_ids=decoder_input_ids[:, :3], use_cache=True)
        steps = {}
        for masked in (False, True):
            self_masks.clear()
            monkeypatch.setattr(RelPosAttention, "attend", recording)
            steps[masked] = model(encoder_outputs=(prefix.encoder_last_hidden_state,),
                                  decoder_input_ids=decoder_input_ids[:, 3:], cache=copy.deepcopy(prefix.cache),
                                  decoder_attention_mask=torch.ones(2, 4) if masked else None).logits
            monkeypatch.setattr(RelPosAttention, "attend", attend)
            if not masked and position_scheme != "directional":
                assert len(self_masks) == model.config.decoder_layers and all(mask is None for mask in self_masks)
    assert torch.equal(steps[False], steps[True])


@pytest.mark.numerics
def test_a_decoder_mask_of_the_new_tokens_puts_the_cached_tokens_before_them():
    """Cached decoding with a mask of the new tokens only, one of them padding: the cached tokens count as tokens
    before the new ones, so the last logits equal the uncached call's under the mask ones (cached) + the new tokens'
    mask (float64, 1e-12)."""
    model = tiny_model("shaw", seed=1).double().eval()
    input_ids = torch.randint(4, 40, (2, 6), generator=torch.Generator().manual_seed(0))
    decoder_input_ids = input_ids[:, :5]
    new_tokens_mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    with torch.no_grad():
        full = model(input_ids=input_ids, decoder_input_ids=decoder_input_ids,
                     decoder_attention_mask=torch.cat([torch.ones(2, 2, dtype=torch.long), new_tokens_mask], 1))
        prefix = model(input_ids=input_ids, decoder_input_ids=decoder_input_ids[:, :2], use_cache=True)
        step = model(encoder_outputs=(prefix.encoder_last_hidden_state,), decoder_input_ids=decoder_input_ids[:, 2:],
                     decoder_attention_mask=new_tokens_mask, cache=prefix.cache)
    assert (step.logits[:, -1] - full.logits[:, -1]).abs().max() < 1e-12


@pytest.mark.parametrize(("inputs", "message"), [
    (lambda ids: dict(input_ids=ids[0], decoder_input_ids=ids),
     r"the encoder's input_ids must be a \[batch, length\] tensor of integer token ids, got shape \[7\]"),
    (lambda ids: dict(input_ids=ids.float(), decoder_input_ids=ids), r"dtype torch.float32"),
    (lambda ids: dict(input_ids=ids, decoder_input_ids=ids[:, :3].bool()), r"the decoder's input_ids .* dtype torch.bool"),
    (lambda ids: dict(input_ids=ids[:, :0], decoder_input_ids=ids),
     r"the encoder's inputs must hold at least one token per sequence .* got shape \[3, 0, 32\]"),
    (lambda ids: dict(input_ids=ids, decoder_input_ids=ids[:1]),
     r"the decoder's batch \(1\) and the encoder output's \(3\) must be the same size"),
    # what a Trainer passes when it takes the labels out (label smoothing) and the collator made no decoder inputs
    (lambda ids: dict(input_ids=ids),
     r"Pass exactly one of decoder_input_ids and decoder_inputs_embeds, or labels .* "
     r"DataCollatorForSeq2Seq\(tokenizer, model=model\) adds them"),
])
def test_malformed_token_inputs_are_one_error_naming_them(inputs, message):
    model = tiny_model("xl", seed=1).eval()
    ids = torch.randint(4, 40, (3, 7), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=message):
        model(**inputs(ids))


@pytest.mark.numerics
@pytest.mark.parametrize("position_scheme", ["absolute", "shaw"])
def test_decoder_position_ids_place_a_left_padded_decoder_prompt_as_without_its_padding(position_scheme):
    """`decoder_position_ids` (transformers' name in an encoder-decoder, which generate extends step by step) reach the
    decoder as the causal LM's position_ids do: a decoder prompt left-padded by two gives the logits of the prompt
    alone (float64, 1e-12; with absolute sinusoids they were swallowed, and the padded prompt placed after its
    padding), and ids that Shaw's attention would ignore are its one error."""
    model = tiny_model(position_scheme, keep_absolute_positions=position_scheme != "absolute").double()
    source, prompt = torch.tensor([[5, 6, 7, 8, 1]]), torch.tensor([[2, 9, 10, 11]])
    padded = torch.cat([torch.zeros(1, 2, dtype=torch.long), prompt], 1)
    mask = (torch.arange(6) >= 2).long()[None]
    with torch.no_grad():
        alone = model(input_ids=source, decoder_input_ids=prompt).logits
        placed = model(input_ids=source, decoder_input_ids=padded, decoder_attention_mask=mask,
                       decoder_position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
        assert (placed[:, 2:] - alone).abs().max() < 1e-12
        if position_scheme == "shaw":
            with pytest.raises(ValueError, match=r"^position_scheme 'shaw' reads each token's place in the sequence"):
                model(input_ids=source, decoder_input_ids=prompt, decoder_position_ids=torch.tensor([[0, 2, 4, 6]]))


@pytest.mark.parametrize("inputs", [
    lambda ids: dict(input_ids=ids),
    lambda ids: dict(inputs=ids),
    lambda ids: dict(input_ids=ids, attention_mask=None),
    lambda ids: dict(inputs=ids, input_ids=None),
], ids=["input_ids", "inputs", "attention_mask None", "input_ids None"])
def test_generate_on_padded_sources_without_their_mask_warns_that_the_encoder_attends_to_the_padding(inputs, caplog):
    """transformers 5 infers no attention mask for an encoder-decoder's generate (4 did, from pad_token_id): the
    encoder attends to a padded row's padding and its translation depends on the batch, as Marian's does, so a batch holding the pad token without its mask is warned of,
    once, naming attention_mask; with the mask, or without padding, nothing is said."""
    model = tiny_model("shaw")
    ids = torch.tensor([[5, 6, 7, 8, 1], [9, 10, 1, 0, 0]])
    settings = dict(max_new_tokens=3, do_sample=False, num_beams=1)
    warned = warnings_logged(caplog, lambda: model.generate(**inputs(ids), **settings))
    assert [message for message in warned if "attention_mask" in message] == [
        "generate: input_ids hold the pad token (pad_token_id 0) and no attention_mask was passed, so the encoder "
        "attends to the padding and each row's translation depends on the rest of the batch (transformers 5 infers no "
        "mask for an encoder-decoder model); pass the tokenizer's attention_mask"]
    assert not warnings_logged(caplog, lambda: model.generate(input_ids=ids, attention_mask=(ids != 0).long(),
                                                              **settings))
    assert not warnings_logged(caplog, lambda: model.generate(input_ids=ids[:1], **settings))


def test_the_source_relative_cap_and_the_padding_warning_read_the_pad_token_generate_is_given(caplog):
    """A pad_token_id passed to generate is the padding both the cap's source lengths and the unmasked-padding warning
    look for, before the generation config's and the model's (as generate resolves it); then the model's."""
    model = tiny_model("shaw")
    ids = torch.tensor([[5, 6, 7, 8, 1], [9, 10, 1, 3, 3]])
    caps = dict(max_len_a=1.0, max_len_b=0, max_new_tokens=50)
    assert model.new_token_limits(ids, pad_token_id=3, **caps).tolist() == [5, 3]
    assert model.new_token_limits(ids, **caps).tolist() == [5, 5]
    settings = dict(max_new_tokens=3, do_sample=False, num_beams=1)
    warned = warnings_logged(caplog, lambda: model.generate(input_ids=ids, pad_token_id=3, **settings))
    assert any("(pad_token_id 3)" in message for message in warned)
