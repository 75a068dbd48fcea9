"""The host work of a cached decoding step, scheme by scheme: on a GPU a translation model's cached decoding is
host-bound (Python and one dispatch per operator, not kernels), so what a scheme adds to each layer of a step is
counted here in aten operators (TorchDispatchMode), against `absolute`, which adds nothing to attention."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import tiny_model
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.cache_utils import DynamicCache, EncoderDecoderCache, StaticCache


class CountOperators(TorchDispatchMode):
    """How many aten operators run inside it."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def step_operators(position_scheme: str, decoder_layers: int, kernel: str = "sdpa") -> int:
    """The aten operators of one greedy cached decoding step (one token after 3 cached ones, batch 2, no decoder
    mask) of a tiny model with `decoder_layers` decoder layers."""
    model = tiny_model(position_scheme, seed=1, decoder_layers=decoder_layers, attn_implementation=kernel)
    input_ids = torch.randint(4, 40, (2, 6), generator=torch.Generator().manual_seed(0))
    decoder_input_ids = input_ids[:, :4]
    with torch.no_grad():
        prefix = model(input_ids=input_ids, decoder_input_ids=decoder_input_ids[:, :3], use_cache=True)
        inputs = dict(encoder_outputs=(prefix.encoder_last_hidden_state,), decoder_input_ids=decoder_input_ids[:, 3:],
                      cache=copy.deepcopy(prefix.cache))
        with CountOperators() as counted:
            model(**inputs)
    return counted.count


def operators_per_layer_beyond_absolute(position_scheme: str, kernel: str = "sdpa") -> float:
    """What each decoder layer of a cached step dispatches beyond `absolute`'s: the step's operators at 4 layers less
    those at 2, halved (the stack's own once-per-step work cancels), minus the same for absolute."""
    def per_layer(scheme: str) -> float:
        return (step_operators(scheme, 4, kernel) - step_operators(scheme, 2, kernel)) / 2

    return per_layer(position_scheme) - per_layer("absolute")


# The most each layer of a cached step may dispatch beyond absolute's, per scheme: what its equation needs there.
ROPE_ROTATIONS = 2 * 4   # the query's and the new key's: the swapped pairs (index_select), x cos + swapped sin


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_rope_rotates_a_cached_steps_query_and_key_in_a_few_operators_per_layer(kernel):
    """RoPE's cached step rotates each layer's query and new key as x cos + swapped(x) sin with per-dimension angles
    read once per step, not plane by plane (select, four products, stack, cat) from angles sliced twice per layer,
    and swaps each plane's pair by one index_select of an index built once per step, not unflatten, flip, flatten."""
    assert operators_per_layer_beyond_absolute("rope", kernel) <= ROPE_ROTATIONS


# u and v added to the query (2); (q + v) by head (transpose, view); W_kR^T (q + v) (the weight by head, bmm); its dot
# with the step's R^T / sqrt(d) (view, mm); the scores as a [B, H, 1, m] bias (view, transpose); eager adds the bias
XL_TERMS = {"eager": 11, "sdpa": 10}


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_xls_cached_step_scores_its_one_query_by_distance_with_what_the_step_shares(kernel):
    """XL's cached step takes each layer's u and v from one split per step, R^T / sqrt(d) from the step's context and
    the one query's scores per distance as the bias, not u and v selected and unsqueezed by every layer, the weight
    scaled by every layer, R transposed per layer, a 3-d matmul's reshapes and the rel-shift's slice (18 on sdpa)."""
    assert operators_per_layer_beyond_absolute("xl", kernel) <= XL_TERMS[kernel]


# a^K added to the keys and a^V to the values, one addition each: every layer's rows are read once per step
# (ShawContext.step_rows), on every kernel
SHAW_TERMS = 2


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_shaws_cached_step_adds_its_terms_to_the_keys_and_values_on_every_kernel(kernel):
    """A cached step's one query has a^K_ij and a^V_ij depending on the key alone: the scheme gives the keys
    k_j + a^K_ij and adds a^V_ij to the values (one addition each, the rows of every layer read once per step), and
    the kernel runs plain attention. Not each layer reading its own rows (its table, the index row, the rows: 8 a
    layer), nor the profile q . w^K_r laid out over the keys as a bias (13, eager and sdpa), nor, on eager, a^V's
    masses by scatter-add and their product with w^V (10: 14 a layer), nor, on sdpa, the probabilities, scatter-add
    and products of eager (39)."""
    assert operators_per_layer_beyond_absolute("shaw", kernel) <= SHAW_TERMS


# DiSAN's mask applied (eager: masked_fill, the zeroing of keyless rows; sdpa: its conversion of the boolean mask to
# an additive one, which dispatches 3, and the zeroing)
DIRECTIONAL_MASK = {"eager": 2, "sdpa": 4}


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_a_masked_cached_step_reads_what_its_mask_gives_once_per_step(kernel):
    """DiSAN's cached step applies its direction mask in every layer, but what the mask gives (the masked entries,
    which queries have a key, the mask with keyless rows opened) is computed once per stack call for all layers
    (`attention_functions.mask_rows`), not by every layer (any, ~, |)."""
    assert operators_per_layer_beyond_absolute("directional", kernel) <= DIRECTIONAL_MASK[kernel]


class CountElements(TorchDispatchMode):
    """How many elements the aten operators that run inside it return, all together."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        output = func(*args, **(kwargs or {}))
        self.count += sum(tensor.numel() for tensor in (output if isinstance(output, (tuple, list)) else [output])
                          if torch.is_tensor(tensor))
        return output


def step_elements(position_scheme: str, cached: int, kernel: str, slots: int | None = None) -> int:
    """The elements the operators of one cached decoding step return (one token after `cached` ones, batch 2, no
    decoder mask) in a tiny model, on a dynamic cache or on a fixed-size one of `slots` slots."""
    model = tiny_model(position_scheme, seed=1, attn_implementation=kernel)
    input_ids = torch.randint(4, 40, (2, 6), generator=torch.Generator().manual_seed(0))
    decoder_input_ids = torch.randint(4, 40, (2, cached + 1), generator=torch.Generator().manual_seed(1))
    self_attention = DynamicCache(config=model.config) if slots is None else StaticCache(config=model.config,
                                                                                       max_cache_len=slots)
    cache = EncoderDecoderCache(self_attention, DynamicCache(config=model.config))
    with torch.no_grad():
        encoded = model.model.encoder(input_ids=input_ids)
        model(encoder_outputs=encoded, decoder_input_ids=decoder_input_ids[:, :cached], cache=cache, use_cache=True)
        with CountElements() as counted:
            model(encoder_outputs=encoded, decoder_input_ids=decoder_input_ids[:, cached:], cache=cache, use_cache=True)
    return counted.count


def elements_per_key_beyond_absolute(position_scheme: str, kernel: str, fixed_size: bool) -> float:
    """What one more key of the self-attention cache (a cached token, or a fixed-size cache's slot) adds to the
    elements of a cached step beyond what it adds in `absolute` (the cache's own work: its keys, values, scores)."""
    def per_key(scheme: str) -> float:
        if fixed_size:
            return (step_elements(scheme, 8, kernel, slots=40) - step_elements(scheme, 8, kernel, slots=16)) / 24
        return (step_elements(scheme, 40, kernel) - step_elements(scheme, 8, kernel)) / 32

    return per_key(position_scheme) - per_key("absolute")


@pytest.mark.parametrize("fixed_size", [False, True], ids=["dynamic_cache", "fixed_size_cache"])
@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_a_cached_rope_step_computes_the_angles_of_its_own_position_only(kernel, fixed_size):
    """RoPE's cached step rotates its one query and new key: it computes their angles alone, so its work grows with
    the cache exactly as absolute's does, not the angles of every cached position (or every slot of a fixed-size
    cache) rebuilt at each step to read one row of them."""
    assert elements_per_key_beyond_absolute("rope", kernel, fixed_size) == 0
