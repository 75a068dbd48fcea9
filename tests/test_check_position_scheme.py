"""hf_relpos.testing.check_position_scheme, the check a scheme kept in a package of its own calls from its own tests:
every built-in scheme (and the toy scheme of a test file) passes it with its oracle, and a user's scheme broken in
one way fails it with one AssertionError naming the scheme, the property and the largest difference."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest
import torch
from conftest import ORDER_AWARE_SCHEMES, SCHEMES
from test_positions import CASES
from torch import nn

from hf_relpos import AttentionTerms, PositionContext, PositionScheme, register_position_scheme
from hf_relpos.model.positions import POSITION_SCHEMES, add_sinusoids
from hf_relpos.testing import (
    KERNELS,
    check_cached_decoding,
    check_causal_lm_decoding,
    check_position_scheme,
    check_static_cache,
    softmax_attention_by_loop,
)

pytestmark = pytest.mark.numerics

# flex_attention runs a new scheme's score_mod and masks through a Dynamo trace on the CPU (a few tenths of a second
# per graph, several graphs per scheme): the tests below whose property is not flex_attention's run without it (every
# scheme passes on all three kernels in test_every_scheme_passes_the_check)
NO_FLEX = ("eager", "sdpa")
ORACLES = {}
for _name, _oracle, _overrides in CASES:
    ORACLES.setdefault(_name, (_oracle, _overrides))   # each scheme's first case: its defaults


@pytest.mark.parametrize("position_scheme", SCHEMES)
def test_every_scheme_passes_the_check(position_scheme):
    """Every built-in scheme and the toy one (order-blind ones told so). Their oracles run through the same
    check_oracle_case in test_positions.py, case by case; here shaw's (a value term), and toy's in test_scheme_toy.py,
    run through check_position_scheme's oracle argument."""
    oracle = ORACLES[position_scheme][0] if position_scheme == "shaw" else None
    check_position_scheme(position_scheme, oracle=oracle, order_aware=position_scheme in ORDER_AWARE_SCHEMES)


def signed_bias(scheme, query_positions, key_positions, dtype):
    """b_h clip(j - i, -2, 2), slopes b_h = h / H: [H, n, m] (clipped: a linear bias moved by a constant per query
    would cancel in the softmax)."""
    slopes = torch.arange(1, scheme.num_heads + 1, dtype=dtype) / scheme.num_heads
    distance = (key_positions[None, None, :] - query_positions[None, :, None]).clamp(-2, 2)
    return slopes[:, None, None] * distance.to(dtype)


class SignedSlopes(PositionScheme):
    """A signed bias b_h clip(j - i, -2, 2) with fixed slopes, as a score_bias and as FlexAttention's score_mod."""

    score_mod_sign = 1

    def terms(self, layer_idx, query, key, context):
        dtype = torch.promote_types(context.dtype, torch.float32)
        bias = signed_bias(self, *context.query_and_key_positions(), dtype)
        slopes, offset, sign = bias.new_tensor(range(1, self.num_heads + 1)) / self.num_heads, context.query_offset, \
            self.score_mod_sign

        def score_mod(score, b, h, q, kv):
            return score + sign * slopes[h] * (kv - q - offset).clamp(-2, 2)

        return AttentionTerms(score_bias=bias[None], score_mod=score_mod)


class SignFlippedScoreMod(SignedSlopes):
    """Its score_mod is b_h clip(i - j), its score_bias b_h clip(j - i): FlexAttention gives another model."""

    score_mod_sign = -1


class ScoreModAtTheCallsIndex(SignedSlopes):
    """Its score_mod places query q at q, not at q + query_offset: right in a whole forward (offset 0) and in a
    decoding step of one query (which runs on sdpa), wrong in a FlexAttention call of several queries on the KV cache
    (assisted decoding's candidates, a prompt continued on its cache)."""

    def terms(self, layer_idx, query, key, context):
        terms = super().terms(layer_idx, query, key, context)
        slopes = terms.score_bias.new_tensor(range(1, self.num_heads + 1)) / self.num_heads

        def score_mod(score, b, h, q, kv):
            return score + slopes[h] * (kv - q).clamp(-2, 2)

        return AttentionTerms(score_bias=terms.score_bias, score_mod=score_mod)


class LearnedSlopesInPrepare(PositionScheme):
    """Learned slopes b_h times clip(j - i) built as one tensor in `prepare` from the parameter, shared by the layers
    (what extending.md says not to do): right without gradient checkpointing, and its backward fails under reentrant
    checkpointing (each layer's backward runs through the shared graph again)."""

    def __init__(self, config, num_layers, num_heads, head_dim, is_causal):
        super().__init__(config, num_layers, num_heads, head_dim, is_causal)
        self.slopes = nn.Parameter(torch.ones(num_heads))

    def prepare(self, context):
        bias = signed_bias(self, *context.query_and_key_positions(), torch.float64)
        return context.extend(SlopesContext, bias=(self.slopes.double()[:, None, None] * bias)[None])

    def terms(self, layer_idx, query, key, context):
        return AttentionTerms(score_bias=context.bias.to(query.dtype))


@dataclass(frozen=True)
class SlopesContext(PositionContext):
    bias: torch.Tensor | None = None


class CacheIgnoresPastPositions(PositionScheme):
    """b_h clip(j - i) with queries at 0 .. n-1 whatever query_offset is: a decoding step's query sits at 0."""

    def terms(self, layer_idx, query, key, context):
        positions = torch.arange(context.key_length, device=context.device)
        return AttentionTerms(score_bias=signed_bias(self, positions[:context.query_length], positions,
                                                     torch.promote_types(context.dtype, torch.float32))[None])


class PositionIdsCountedFromThePast(PositionScheme):
    """Sinusoids added to the embeddings at `positions` + past_length: the causal LM's position_ids (which generate
    gives every call, the cached tokens counted) taken as counting from the first new token. Right wherever no
    position_ids are given (the translation model) or nothing is cached; a decoding step of the causal LM counts
    its cached tokens twice."""

    def embed(self, inputs_embeds, past_length, positions=None):
        return add_sinusoids(inputs_embeds, past_length, None if positions is None else positions + past_length)


class PositionIdsIgnored(PositionScheme):
    """Sinusoids at past_length + i whatever the causal LM's position_ids say: a left-padded prompt is encoded after
    its padding (what the `absolute` scheme did before it took them)."""

    def embed(self, inputs_embeds, past_length, positions=None):
        return add_sinusoids(inputs_embeds, past_length)


class QueriesAtTheLastKeys(PositionScheme):
    """b_h clip(j - i) with the n queries at the last n of the m keys, m - n .. m - 1: query_offset on the dynamic
    cache, where m counts the cached and new tokens; on a fixed-size cache (declared) m is the slots, most unused."""

    takes_fixed_size_cache = True

    def terms(self, layer_idx, query, key, context):
        positions = torch.arange(context.key_length, device=context.device)
        return AttentionTerms(score_bias=signed_bias(self, positions[context.key_length - context.query_length:],
                                                     positions, torch.promote_types(context.dtype, torch.float32))[None])


class InitReplacesLoadedBuffer(PositionScheme):
    """Per-head slopes in a persistent buffer that init_parameters draws as a new tensor, and a non-persistent scale
    it computes; as init_parameters runs while a model loads (for the scale), it replaces the loaded slopes with a
    fresh draw (a loaded tensor written in place keeps its values: the model restores them)."""

    def __init__(self, config, num_layers, num_heads, head_dim, is_causal):
        super().__init__(config, num_layers, num_heads, head_dim, is_causal)
        self.register_buffer("slopes", torch.zeros(num_heads))
        self.register_buffer("scale", torch.zeros(()), persistent=False)

    def init_parameters(self, std):
        self.slopes = torch.rand(self.num_heads) + 0.1
        with torch.no_grad():
            self.scale.fill_(0.5)

    def terms(self, layer_idx, query, key, context):
        bias = signed_bias(self, *context.query_and_key_positions(), torch.float64)
        return AttentionTerms(score_bias=(self.scale * self.slopes[:, None, None] * bias).to(query.dtype)[None])


class InitReplacesLoadedParameter(InitReplacesLoadedBuffer):
    """The slopes as a parameter that init_parameters replaces (a new nn.Parameter, not the loaded one)."""

    def __init__(self, config, num_layers, num_heads, head_dim, is_causal):
        PositionScheme.__init__(self, config, num_layers, num_heads, head_dim, is_causal)
        self.slopes = nn.Parameter(torch.zeros(num_heads))
        self.register_buffer("scale", torch.zeros(()), persistent=False)

    def init_parameters(self, std):
        self.slopes = nn.Parameter(torch.rand(self.num_heads) + 0.1)
        self.scale.fill_(0.5)


class BufferOnlyInInit(PositionScheme):
    """A non-persistent buffer whose values only __init__ gives: left uninitialised while a model loads."""

    def __init__(self, config, num_layers, num_heads, head_dim, is_causal):
        super().__init__(config, num_layers, num_heads, head_dim, is_causal)
        self.register_buffer("slopes", torch.arange(1.0, num_heads + 1) / num_heads, persistent=False)

    def terms(self, layer_idx, query, key, context):
        bias = signed_bias(self, *context.query_and_key_positions(), torch.float64)
        return AttentionTerms(score_bias=(self.slopes[:, None, None] * bias).to(query.dtype)[None])


class EncoderBiasByLength(PositionScheme):
    """The encoder's bias b_h clip(j - i) divided by the key length m (padding included): a padded source is encoded as
    a longer one."""

    def terms(self, layer_idx, query, key, context):
        bias = signed_bias(self, *context.query_and_key_positions(), torch.promote_types(context.dtype, torch.float32))
        return AttentionTerms(score_bias=(bias if self.is_causal else bias / context.key_length)[None])


@pytest.fixture
def registered():
    """register(name, scheme_class) for the test only: the registry is as before afterwards."""
    names = []

    def register(name, scheme_class):
        register_position_scheme(name)(scheme_class)
        names.append(name)
        return name

    yield register
    for name in names:
        POSITION_SCHEMES.pop(name, None)


def test_a_users_scheme_with_a_score_mod_that_agrees_passes(registered):
    check_position_scheme(registered("check_signed_slopes", SignedSlopes))


@pytest.mark.parametrize(("scheme_class", "prop"), [
    (SignFlippedScoreMod, "kernels agree: flex_attention and eager give different logits"),
    (CacheIgnoresPastPositions, "cached decoding equals the full forward: step 3 (eager)"),
    (InitReplacesLoadedBuffer, "save_pretrained / from_pretrained keeps the scheme's buffer "
                                 "model.encoder.positions.slopes"),
    (InitReplacesLoadedParameter, "save_pretrained / from_pretrained keeps the scheme's parameter "
                                  "model.encoder.positions.slopes"),
    (BufferOnlyInInit, "save_pretrained / from_pretrained keeps the scheme's buffer model.encoder.positions.slopes"),
    (EncoderBiasByLength, "padding invariance: the encoder states of a source of 6 tokens padded to 9"),
    (PositionIdsCountedFromThePast, "causal LM cached decoding equals the full forward: step 1 after a prompt of 7 "
                                    "tokens (eager, left-padded prompts)"),
    (QueriesAtTheLastKeys, "static cache decoding equals the full forward: translation model step 1 (eager, a "
                           "fixed-size cache of 16 slots)"),
    (PositionIdsIgnored, "causal LM left padding: the logits of a prompt of 4 tokens left-padded to 7 differ from "
                         "those of the prompt alone (eager)"),
    (LearnedSlopesInPrepare, "gradient checkpointing (reentrant) gives the gradients of a run without it: the "
                             "backward fails"),
], ids=["score_mod", "cache", "init-buffer", "init-parameter", "non-persistent-buffer", "padding",
        "causal-lm-cache", "static-cache", "causal-lm-left-padding", "term-from-a-parameter-in-prepare"])
def test_a_broken_scheme_fails_the_check_naming_the_property(registered, scheme_class, prop):
    name = registered(f"check_broken_{scheme_class.__name__.lower()}", scheme_class)
    with pytest.raises(AssertionError) as error:
        check_position_scheme(name, kernels=KERNELS if scheme_class is SignFlippedScoreMod else NO_FLEX)
    message = str(error.value)
    assert message.startswith(f"position scheme {name!r}: {prop}"), message
    assert "max difference" in message or "the backward fails" in message


class CacheIgnoresPastPositionsDeclared(CacheIgnoresPastPositions):
    """CacheIgnoresPastPositions declaring that it takes a fixed-size cache."""

    takes_fixed_size_cache = True


@pytest.mark.parametrize(("check", "prop"), [
    (check_causal_lm_decoding, "causal LM cached decoding equals the full forward: step 1 after a prompt of 7 tokens "
                               "(eager, left-padded prompts)"),
    (check_static_cache, "static cache decoding equals the full forward: translation model step 3 (eager, a "
                         "fixed-size cache of 16 slots)"),
], ids=["causal-lm", "static-cache"])
def test_a_decoding_step_at_position_0_fails_each_decoding_check(registered, check, prop):
    """A step's query at 0 instead of at query_offset (the seq2seq check's classic) fails the causal LM's and the
    fixed-size cache's decoding checks too, called on their own."""
    name = registered("check_broken_step_at_0", CacheIgnoresPastPositionsDeclared)
    with pytest.raises(AssertionError) as error:
        check(name)
    assert str(error.value).startswith(f"position scheme {name!r}: {prop}"), str(error.value)
    assert "max difference" in str(error.value)


def test_a_score_mod_that_ignores_query_offset_fails_the_cached_decoding_check(registered):
    """A FlexAttention call of several queries on the KV cache reads the score_mod at query_offset > 0, which neither
    a whole forward nor a one-query decoding step (on sdpa) does: the cached decoding check decodes two tokens a call
    too, so a score_mod that forgets query_offset fails there, on flex_attention."""
    name = registered("check_broken_score_mod_offset", ScoreModAtTheCallsIndex)
    with pytest.raises(AssertionError) as error:
        check_cached_decoding(name)
    message = str(error.value)
    assert message.startswith(f"position scheme {name!r}: cached decoding equals the full forward: tokens 2..3 "
                              "(flex_attention) in one call on the KV cache of 2 tokens"), message
    assert "max difference" in message


def test_the_static_cache_check_runs_for_a_scheme_that_declares_it(registered):
    """check_position_scheme checks a fixed-size cache only for a scheme that declares it takes one (generate refuses
    cache_implementation "static" for any other); check_static_cache alone says so for such a scheme."""
    undeclared = type("QueriesAtTheLastKeysUndeclared", (QueriesAtTheLastKeys,), {"takes_fixed_size_cache": False})
    name = registered("check_queries_at_the_last_keys_undeclared", undeclared)
    check_position_scheme(name, kernels=NO_FLEX)
    with pytest.raises(ValueError, match=rf"^position scheme '{name}' does not declare that it takes a fixed-size KV "
                                         r"cache \(takes_fixed_size_cache = True\)"):
        check_static_cache(name)


def test_the_static_cache_check_given_no_kernel_that_takes_a_fixed_size_cache_is_an_error(registered):
    """check_static_cache given kernels none of which takes a fixed-size cache (flex_attention alone) would check
    nothing and pass: one ValueError naming the kernels given and those it checks; given one that does among them,
    it checks (a broken scheme fails). check_position_scheme on such kernels skips that check (nothing to check) and
    passes a scheme that declares a fixed-size cache (alibi)."""
    name = registered("check_broken_step_at_0_declared_flex_only", CacheIgnoresPastPositionsDeclared)
    with pytest.raises(ValueError, match=r"^check_static_cache: none of kernels \['flex_attention'\] takes a "
                                         r"fixed-size KV cache, so it would check nothing; it checks \['eager', "
                                         r"'sdpa', 'relpos_triton'\]$"):
        check_static_cache(name, kernels=["flex_attention"])
    with pytest.raises(AssertionError, match=r"static cache decoding equals the full forward: translation model "
                                             r"step 3 \(eager"):
        check_static_cache(name, kernels=iter(["flex_attention", "eager"]))   # one that takes it: checked
    check_position_scheme("alibi", kernels=["flex_attention"], order_aware=False)


def test_an_oracle_that_disagrees_fails_the_check_naming_the_oracle():
    """The toy scheme's oracle with the distance's sign flipped: the check names the oracle and the case."""
    from test_scheme_toy import naive_toy

    def flipped(scheme, layer, q, k, v, allowed, query_at, key_at):
        return naive_toy(scheme, layer, q, k, v, allowed, [-i for i in query_at], [-j for j in key_at])

    with pytest.raises(AssertionError, match=r"position scheme 'toy': self-attention matches the oracle \(encoder, "
                                             r"unpadded, eager\): max difference"):
        check_position_scheme("toy", oracle=flipped)


def test_an_oracle_ends_with_the_packages_softmax_by_loop():
    """softmax_attention_by_loop: softmax over the allowed keys, zeros for a query with none."""
    scores = torch.tensor([[[[0.0, 1.0], [2.0, 3.0]]]], dtype=torch.float64)
    allowed = torch.tensor([[[[True, True], [False, False]]]])
    values = torch.tensor([[[[1.0], [2.0]]]], dtype=torch.float64)
    out = softmax_attention_by_loop(scores, allowed, lambda b, h, i, j: values[b, h, j])
    weight = torch.softmax(torch.tensor([0.0, 1.0], dtype=torch.float64), 0)
    assert torch.equal(out[0, 0, 1], torch.zeros(1, dtype=torch.float64))
    assert abs(out[0, 0, 0, 0].item() - (weight[0] + 2 * weight[1]).item()) < 1e-15


def test_a_symmetric_scheme_fails_the_order_check_unless_told_it_is_order_blind():
    """ALiBi's encoder bias -m |i - j| cannot tell a sequence from its reversal: order_aware=True (the default) fails
    naming the property and how to pass; order_aware=False passes."""
    with pytest.raises(AssertionError, match=r"position scheme 'alibi': order awareness: .* max difference .*"
                                             r"pass order_aware=False"):
        check_position_scheme("alibi", kernels=NO_FLEX)
    check_position_scheme("alibi", order_aware=False, kernels=NO_FLEX)


def test_an_unregistered_scheme_is_one_error_saying_to_import_its_module():
    with pytest.raises(ValueError, match="position_scheme must be one of"):
        check_position_scheme("no_such_scheme")


def test_the_check_module_imports_no_test_runner():
    """hf_relpos.testing is installed with the package: it imports the standard library, torch, transformers and
    hf_relpos' model unit only (no pytest, and none of the training app's dependencies; docs/internals.md), at any
    depth."""
    from test_layers import PACKAGE, imports_of

    imports = imports_of(PACKAGE / "testing.py")
    imported = {name.split(".")[0] for _, name, level in imports if level == 0}
    assert imported <= {"torch", "transformers"} | sys.stdlib_module_names, imported
    relative = {(level, name.split(".")[0]) for _, name, level in imports if level > 0}
    assert relative <= {(1, "model")}, relative
