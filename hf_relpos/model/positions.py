"""Position-scheme registry, the scheme contract, and the pieces every scheme shares.

A position scheme says *what* order information enters self-attention and never runs attention itself:
`embed` adds an embedding-level encoding; `prepare` computes, once per stack call, everything that depends on the
positions only (a `PositionContext`: index tables, masks, rotation angles, sinusoids); `transform_new_keys` maps the
keys a call computes before they are cached (RoPE's rotation); and `terms` returns, per layer, an `AttentionTerms`
record (score bias, extra mask, value term, replaced queries/keys). `RelPosAttention` (modeling_relpos.py) hands that
record to the kernel that `config._attn_implementation` names (attention_functions.py). One scheme instance serves one stack (the
encoder's or the decoder's self-attention) and owns the parameters of all its layers, so parameters shared across
layers (Transformer-XL's tied u, v) need no special case.

A scheme class is also the single source of truth for what is specific to it: its config fields (`config_fields`:
defaults, validation, help) and what a model card says about it (`card`: title, equation, citation).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import re
import sys
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import torch
from torch import nn
from transformers.utils import TRANSFORMERS_DYNAMIC_MODULE_NAME

from .validation import is_int_at_least, is_positive_number

POSITION_SCHEMES: dict[str, type[PositionScheme]] = {}
# The most positions a config sizes anything for, 2^16 tokens, far beyond a sentence to translate: Shaw's table of
# 2k + 1 distances (k at most MAX_POSITIONS - 1, the largest distance among as many tokens), T5's band of the offsets
# below its max_distance, the permutation a randomized-position draw takes of position_randomization_max positions.
# A larger value only allocated until the machine ran out of memory, at model build or at the first training step.
MAX_POSITIONS = 65536
SCHEME_NAME = re.compile(r"[A-Za-z0-9_]+")   # what a scheme may be registered as (a YAML value, a flag, a Hub tag)
# The names no scheme may declare as a config field, each with the reason: those RelPosTransformerConfig has itself
# (its fields, their aliases, its attributes) and those transformers reads from it (generation settings, auto_map, ...),
# reserved by configuration_relpos.py once the class exists (`reserve_config_names`).
CONFIG_NAMES: dict[str, str] = {}
OWN_NAME = "a name RelPosTransformerConfig already has (a field of its own, an alias or an attribute)"


def register_position_scheme(name: str) -> Callable[[type[PositionScheme]], type[PositionScheme]]:
    """Class decorator that makes a `PositionScheme` selectable as `config.position_scheme = name`. A scheme whose
    config field is a reserved name (`CONFIG_NAMES`: the config's own, transformers' generation settings, ...) or is
    declared differently by another scheme is
    refused, and the registry is left as it was."""

    if not (isinstance(name, str) and SCHEME_NAME.fullmatch(name)):
        raise ValueError(f"register_position_scheme: the name must be a non-empty string of letters, digits and "
                         f"underscores (e.g. 'my_alibi'), got {name!r}")

    def decorator(scheme_class: type[PositionScheme]) -> type[PositionScheme]:
        if not (isinstance(scheme_class, type) and issubclass(scheme_class, PositionScheme)):
            raise TypeError(f"register_position_scheme({name!r}) expects a PositionScheme subclass, got {scheme_class!r}")
        if not isinstance(inspect.getattr_static(scheme_class, "check_config"), (classmethod, staticmethod)):
            raise TypeError(f"check_config of scheme {name!r} must be a classmethod (it checks a config before any "
                            "instance of the scheme exists): decorate it with @classmethod")
        for field in scheme_class.config_fields:
            if not field.valid(field.default):
                raise ValueError(f"config field {field.name!r} of scheme {name!r} has a default that its own check "
                                 f"refuses: {field.name} must be {field.allowed}, got the default {field.default!r}")
        existing = POSITION_SCHEMES.get(name)
        # the same class defined again (a module reloaded, a notebook cell run twice) replaces itself; any other is
        # refused, so no class of another module takes over a name (a copy of a built-in scheme's file included)
        if existing is not None and _defined_at(existing) != _defined_at(scheme_class):
            raise ValueError(f"position_scheme {name!r} is already registered by {'.'.join(_defined_at(existing))}: "
                             "register yours under another name")
        _refuse_config_names(name, scheme_class, CONFIG_NAMES)
        for field in scheme_class.config_fields:
            for other_name, other in POSITION_SCHEMES.items():
                declared = {f.name: f for f in other.config_fields}.get(field.name)
                if other_name != name and declared is not None and declared != field:
                    raise ValueError(f"config field {field.name!r} of scheme {name!r} is already declared differently "
                                     f"by scheme {other_name!r}")
        scheme_class.name = name
        POSITION_SCHEMES[name] = scheme_class
        return scheme_class

    return decorator


def _defined_at(scheme_class: type) -> tuple[str, str]:
    """Where a class is defined: its module and qualified name."""
    return scheme_class.__module__, scheme_class.__qualname__


def reserve_config_names(names: Iterable[str], reason: str = OWN_NAME) -> None:
    """Add `names` to `CONFIG_NAMES`, which `register_position_scheme` refuses as a scheme's config field, saying
    `reason` (what the name is); a scheme registered before (the built-in ones) that declares one is refused here. A
    name reserved before keeps its first reason."""
    reserved = dict.fromkeys(names, reason)
    for scheme_name, scheme_class in POSITION_SCHEMES.items():
        _refuse_config_names(scheme_name, scheme_class, reserved)
    for name in reserved:
        CONFIG_NAMES.setdefault(name, reason)


def _refuse_config_names(scheme_name: str, scheme_class: type[PositionScheme], names: dict[str, str]) -> None:
    """Refuse a scheme whose config field bears one of `names` (name -> what it is) or starts with "_" (transformers'
    private config attributes, such as `_attn_implementation`)."""
    for field in scheme_class.config_fields:
        reason = "a private name (transformers keeps its own config attributes under a leading '_')" if (
            field.name.startswith("_")) else names.get(field.name)
        if reason is not None:
            raise ValueError(f"config field {field.name!r} of scheme {scheme_name!r} is {reason}: give the scheme's "
                             "field another name")


Returned = TypeVar("Returned")


def deprecated_alias(function: Callable[..., Returned], old_name: str) -> Callable[..., Returned]:
    """`function` under its deprecated name `old_name`: each call warns (a FutureWarning naming `function`), then
    calls it."""

    @functools.wraps(function)
    def alias(*args: Any, **kwargs: Any) -> Returned:
        warn_renamed(old_name, function.__name__)
        return function(*args, **kwargs)

    alias.__name__ = alias.__qualname__ = old_name
    alias.__doc__ = f"Deprecated alias of `{function.__name__}`."
    return alias


register_attention = deprecated_alias(register_position_scheme, "register_attention")  # deprecated name
DEPRECATED_ATTRIBUTES = {"ATTENTION_REGISTRY": "POSITION_SCHEMES"}   # module attribute -> its current name


def __getattr__(name: str) -> Any:
    """A deprecated module attribute (`DEPRECATED_ATTRIBUTES`), with a FutureWarning naming the current one."""
    if name in DEPRECATED_ATTRIBUTES:
        warn_renamed(name, DEPRECATED_ATTRIBUTES[name])
        return globals()[DEPRECATED_ATTRIBUTES[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Modules whose frames a deprecation warning looks past to find the line that used the old name: this package (or
# its remote-code copy, under transformers_modules) and the transformers / huggingface_hub code that calls into it.
INTERNAL_MODULE_ROOTS = frozenset({__name__.split(".")[0], "transformers", "transformers_modules", "huggingface_hub"})


def warn_renamed(old: str, new: str) -> None:
    """The FutureWarning of a deprecated name, attributed to the first caller outside INTERNAL_MODULE_ROOTS (the
    user's line: a config keyword, a config.json read by from_pretrained, an attribute, a call)."""
    warnings.warn(f"{old} is deprecated and will be removed; use {new}", FutureWarning,
                  stacklevel=stack_level_outside(INTERNAL_MODULE_ROOTS))


def stack_level_outside(module_roots: frozenset[str]) -> int:
    """The `stacklevel` (counted from the function that calls this one) of the first frame whose module's top-level
    package is none of `module_roots` and which is not generated code (a dataclass' `__init__`); the outermost
    frame when every frame is inside."""
    frame, level = sys._getframe(2), 2
    while frame.f_back is not None and (frame.f_code.co_filename.startswith("<")
                                        or frame.f_globals.get("__name__", "").split(".")[0] in module_roots):
        frame, level = frame.f_back, level + 1
    return level


class UnregisteredSchemeError(ValueError):
    """A `position_scheme` name (`scheme`) that no imported module has registered."""

    scheme: str


def get_scheme_class(name: str) -> type[PositionScheme]:
    """Registry lookup with an error that lists what is registered and, for a name (`UnregisteredSchemeError`),
    says that a scheme registered outside hf_relpos exists in a process only once the module that registers it has
    been imported."""
    if not isinstance(name, str):
        raise ValueError(f"position_scheme must be one of {sorted(POSITION_SCHEMES)}, got {name!r}")
    if name not in POSITION_SCHEMES:
        remedy = ("import that module before the config or model is built or loaded (from_pretrained, pipeline)"
                  if not __name__.startswith(f"{TRANSFORMERS_DYNAMIC_MODULE_NAME}.") else
                  "this is a model's remote code (trust_remote_code), which holds hf_relpos' built-in schemes only, "
                  "never one registered elsewhere: install hf_relpos and the package that registers it, import that "
                  "module, and load the model without trust_remote_code")
        error = UnregisteredSchemeError(
            f"position_scheme must be one of {sorted(POSITION_SCHEMES)}, got {name!r}. A scheme registered outside "
            f"hf_relpos (@register_position_scheme({name!r}) in your own code) is known only in a process that has "
            f"imported the module that registers it: {remedy}")
        error.scheme = name
        raise error
    return POSITION_SCHEMES[name]


def built_in_schemes() -> tuple[str, ...]:
    """The names of the schemes registered by the model unit's own files (those hf_relpos ships), in registration
    order; the registry also holds those a user registered."""
    unit = __name__.rpartition(".")[0]
    return tuple(name for name, scheme in POSITION_SCHEMES.items() if scheme.__module__.rpartition(".")[0] == unit)


def scheme_config_fields() -> dict[str, SchemeField]:
    """The config fields declared by the registered schemes, by name. A config accepts each of them; those of its
    `position_scheme` become top-level attributes (saved in config.json), another scheme's are dropped (refused as
    keywords unless at their defaults)."""
    return {field.name: field for scheme in POSITION_SCHEMES.values() for field in scheme.config_fields}


@dataclass(frozen=True)
class SchemeField:
    """One config field a scheme declares: its default, what it does (`help`, shown in model cards), and its
    validation (`valid(value)`; `allowed` completes the error "NAME must be ..."). `symbol` is the paper's name for
    it (e.g. "k"), shown next to the field in model cards. Two declarations are equal when all but `valid` are: what
    a value must be is compared as `allowed` says it (bounds included), as two validators never compare equal."""

    name: str
    default: Any
    help: str
    allowed: str
    valid: Callable[[Any], bool] = dataclasses.field(compare=False)
    symbol: str = ""

    def check(self, value: Any) -> None:
        """Raise ValueError naming the field and what is allowed, unless `value` is valid."""
        if not self.valid(value):
            raise ValueError(f"{self.name} must be {self.allowed}, got {value!r}")


def boolean_field(name: str, default: bool, help: str, symbol: str = "") -> SchemeField:
    """A true/false scheme setting."""
    return SchemeField(name, default, help, "true or false", lambda value: isinstance(value, bool), symbol)


def number_field(
    name: str, default: float | None, help: str, optional: bool = False, symbol: str = ""
) -> SchemeField:
    """A positive real-valued scheme setting (an int is accepted too; None when `optional`)."""

    def valid(value: Any) -> bool:
        return optional if value is None else is_positive_number(value)

    return SchemeField(name, default, help, "a positive number" + (" or null" if optional else ""), valid, symbol)


def integer_field(
    name: str, default: int | None, help: str, minimum: int = 0, optional: bool = False, symbol: str = "",
    maximum: int | None = None, maximum_reason: str = "",
) -> SchemeField:
    """An integer scheme setting >= `minimum` and, with a `maximum`, <= it (`maximum_reason` says why; or None when
    `optional`)."""

    def valid(value: Any) -> bool:
        if value is None:
            return optional
        return is_int_at_least(value, minimum) and (maximum is None or value <= maximum)

    allowed = f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum}"
    allowed += (f" ({maximum_reason})" if maximum is not None and maximum_reason else "") + (" or null" if optional
                                                                                             else "")
    return SchemeField(name, default, help, allowed, valid, symbol)


@dataclass(frozen=True)
class SchemeCard:
    """What a model card says about a scheme.

    `title` completes "self-attention uses ...", e.g. "relative position representations (Shaw et al. 2018)";
    `description` is Markdown (the equation, what is learned), fixed or computed from the config; `bibtex` holds the
    entries to cite beyond the Transformer itself; `tags` are Hub tags (e.g. "relative-position"); `limitations`
    returns extra bullet points for a config. The card's settings table comes from the scheme's `config_fields`.
    """

    title: str
    description: str | Callable[[Any], str] = ""
    bibtex: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    limitations: Callable[[Any], list[str]] | None = None

    def describe(self, config: Any) -> str:
        return self.description(config) if callable(self.description) else self.description

    def limitations_for(self, config: Any) -> list[str]:
        return self.limitations(config) if self.limitations is not None else []


def relative_position_index(
    query_length: int, key_length: int, max_relative_position: int, query_offset: int = 0, device: Any = None
) -> torch.LongTensor:
    """Shaw et al. (2018) sec. 3.2 index table: entry [i, j] = clip(j - i', k) + k with i' = i + query_offset.

    `query_offset` is the number of cached positions before the first query, so an incremental decoding step sees
    its true distance to every key.
    """
    if max_relative_position < 0:
        raise ValueError(f"max_relative_position must be >= 0, got {max_relative_position}")
    query_positions = torch.arange(query_offset, query_offset + query_length, device=device)
    key_positions = torch.arange(key_length, device=device)
    return clipped_distance(key_positions[None, :] - query_positions[:, None], max_relative_position)


def clipped_distance(distance: torch.Tensor, max_relative_position: int) -> torch.Tensor:
    """Shaw et al. (2018) sec. 3.2: the row of a distance j - i in a table of 2k + 1 vectors, clip(j - i, k) + k."""
    return distance.clamp(-max_relative_position, max_relative_position) + max_relative_position


def query_positions(
    query_length: int, key_length: int, positions: torch.Tensor | None, device: Any = None,
    query_offset: int | torch.Tensor | None = None,
) -> torch.LongTensor:
    """The absolute positions [n] of the queries of one attention call over m keys: the last n of `positions` (the
    keys' positions), or, when None, `query_offset` .. `query_offset` + n - 1 (None: m - n, the last n keys; a 0-dim
    tensor for a fixed-size cache, whose slots past the queries are unused)."""
    if positions is not None:
        return positions[key_length - query_length :]
    offset = key_length - query_length if query_offset is None else query_offset
    return torch.arange(query_length, device=device) + offset


def query_and_key_positions(
    query_length: int, key_length: int, positions: torch.Tensor | None, device: Any = None,
    query_offset: int | torch.Tensor | None = None,
) -> tuple[torch.LongTensor, torch.LongTensor]:
    """The absolute positions of the queries [n] (`query_positions`) and keys [m] of one attention call: `positions`
    (the keys' positions) or, when None, the ordinary 0 .. m-1."""
    keys = positions if positions is not None else torch.arange(key_length, device=device)
    return query_positions(query_length, key_length, positions, device, query_offset), keys


def random_positions(length: int, position_range: int, device: Any = None) -> torch.LongTensor:
    """Ruoss et al. (2023) randomized positions: a uniformly drawn, sorted subset of `length` of 0 .. range-1, from
    torch's global random number generator (reproducible under `torch.manual_seed`)."""
    if length > position_range:
        raise ValueError(f"position_randomization_max ({position_range}) must be at least the sequence length "
                         f"({length}): raise it or use shorter sequences")
    return torch.randperm(position_range, device=device)[:length].sort().values


@dataclass(frozen=True)
class PositionDraw:
    """The positions of a decoder's tokens for a whole output, drawn once: token t sits at `positions[t]`.

    With `position_randomization_at_inference` (Ruoss et al. 2023 randomize at evaluation too), `generate` draws one
    sorted subset of 0 .. L-1 for the longest output it may produce and hands it to every decoding step; a step over
    tokens past_length .. past_length + n - 1 reads the first past_length + n entries (`first`), so cached keys keep
    the positions they were computed with and cached decoding equals uncached decoding. A record, not a tensor:
    `generate` expands tensor arguments along the batch for beam search, and one draw serves the whole batch (as a
    training draw does).
    """

    positions: torch.LongTensor

    def __post_init__(self) -> None:
        positions = self.positions
        if not torch.is_tensor(positions) or positions.dim() != 1 or positions.is_floating_point():
            raise ValueError(f"decoder_positions must hold a 1-D integer tensor, got {positions!r}")
        if positions.numel() and (positions[0] < 0 or bool((positions[1:] <= positions[:-1]).any())):
            raise ValueError(f"decoder_positions must be non-negative and strictly increasing, got {positions.tolist()}")

    def first(self, length: int) -> torch.LongTensor:
        """The positions of the first `length` tokens."""
        if length > self.positions.numel():
            raise ValueError(f"decoder_positions hold {self.positions.numel()} positions, but the decoder reached "
                             f"{length} tokens: draw them for the longest output")
        return self.positions[:length]


def sinusoids(positions: torch.Tensor, dim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Vaswani et al. (2017) sinusoids [sin(p / 10000^(2i/d)) | cos(p / 10000^(2i/d))], shape [*positions.shape, dim]:
    the paper's even dimensions 2i (sines) first, then its odd ones 2i + 1 (cosines), as Marian lays them out; for an
    odd d one sine more than cosines.

    Works for any (also negative, as Transformer-XL's R needs) position, so no table limits the length.
    """
    sines = (dim + 1) // 2   # the even dimensions 2i < d; the odd ones, cosines, are dim // 2
    inverse_frequency = torch.exp(
        torch.arange(sines, device=positions.device, dtype=torch.float64) * (-2.0 * math.log(10000.0) / dim)
    )
    angles = positions.to(torch.float64)[..., None] * inverse_frequency
    return torch.cat([angles.sin(), angles[..., : dim // 2].cos()], dim=-1).to(dtype)


def add_sinusoids(
    inputs_embeds: torch.Tensor, past_length: int, positions: torch.Tensor | None = None, scale: float = 1.0
) -> torch.Tensor:
    """inputs_embeds [B, n, d] + scale x the `sinusoids` of positions past_length .. past_length + n - 1 (or
    `positions`, [n] or per sequence [B, n]): Vaswani et al. (2017) sec. 3.5, the `absolute` scheme's encoding, and
    `keep_absolute_positions`' under any other scheme (with its `absolute_positions_scale`)."""
    if positions is None:   # past_length may be a 0-dim tensor (a fixed-size cache's fill level)
        positions = torch.arange(inputs_embeds.size(1), device=inputs_embeds.device) + past_length
    encoding = sinusoids(positions, inputs_embeds.size(-1), inputs_embeds.dtype)
    return inputs_embeds + (encoding if scale == 1.0 else scale * encoding)


def rel_shift(scores: torch.Tensor, key_length: int) -> torch.Tensor:
    """Transformer-XL's relative shift (Dai et al. 2019, appendix B).

    `scores[..., t, p]` holds query t against the distance `D_max - p`, with `D_max = query_offset + n - 1` (the
    largest distance). Returns `out[..., t, j] = scores[..., t, n - 1 - t + j]`, i.e. query t against key j at
    distance `query_offset + t - j`. The paper pads a column and re-views the memory; the same skew is a view of
    each contiguous [n, D] matrix read as rows of D - 1 from element n - 1 on (element (n - 1) + t (D - 1) + j):
    no gather, no copy, no n x n x d tensor, and only slices and reshapes, which torch.compile traces for any
    length (an as_strided view's backward specialises on the storage size). A row needs D - 1 >= m (one query:
    D >= m): with fewer distance columns the scores are padded to m + 1 first, a copy (the package's callers pass
    enough).
    Entries whose distance lies outside the range that `scores` covers are arbitrary and must be masked.
    """
    query_length, distance_length = scores.shape[-2:]
    if query_length == 1 and distance_length >= key_length:   # one row: out[..., 0, j] = scores[..., 0, j]
        return scores[..., :key_length]
    if distance_length <= key_length:
        scores = nn.functional.pad(scores, (0, key_length + 1 - distance_length))
        distance_length = key_length + 1
    width = distance_length - 1
    rows = scores.contiguous().flatten(-2)[..., query_length - 1 : query_length - 1 + query_length * width]
    return rows.unflatten(-1, (query_length, width))[..., :key_length]


QUERY_BLOCK = 64   # queries per block of a dense relative bias (`dense_by_query_blocks`)


def dense_by_query_blocks(query_length: int, key_length: int,
                          block: Callable[[int, int, slice], torch.Tensor]) -> torch.Tensor:
    """A dense relative bias [..., n, m] built QUERY_BLOCK queries at a time. Its columns p stand for the relative
    position p - (n - 1) - query_offset (key minus query, largest distance first, n + m - 1 columns); queries
    [a, a + b) meet only columns n - a - b .. n - a + m - 2, so `block(a, b, columns)` returns just those b + m - 1
    columns [..., b, b + m - 1], which `rel_shift` skews to [..., b, m]: n (b + m - 1) entries read and skewed
    instead of n (n + m - 1), half at n = m >> b. The loop runs over the block count, not range(0, n, b): under
    torch.compile with dynamic shapes a new length recompiles only where the count changes or the last block holds
    one query."""
    blocks = []
    for index in range((query_length + QUERY_BLOCK - 1) // QUERY_BLOCK):
        first = index * QUERY_BLOCK
        size = min(QUERY_BLOCK, query_length - first)
        columns = slice(query_length - first - size, query_length - first + key_length - 1)
        blocks.append(rel_shift(block(first, size, columns), key_length))
    return torch.cat(blocks, dim=-2) if len(blocks) > 1 else blocks[0].contiguous()


def clipped_rel_shift(table: torch.Tensor, key_length: int, max_relative_position: int,
                      query_offset: int = 0) -> torch.Tensor:
    """out[..., i, j] = table[..., i, clip(j - i', k) + k], i' = i + query_offset: Shaw et al.'s (2018) a^K term
    (eq. 5) for every key, without a gather. A gather's backward is a scatter-add whose indices repeat across the
    whole row (every key beyond distance k adds into one of the two edge buckets), which serialises on a GPU
    (pytorch/pytorch#53491). Instead, block by block of queries (`dense_by_query_blocks`), the table's first 2k + 1
    columns (a wider table's others, such as Shaw's aligned padding, are not read) are widened to one per relative
    position the block meets, the edge columns repeated by `expand` (their gradient is a sum), skewed by `rel_shift`
    and copied out (the widened tensors are not kept alive by the result)."""
    query_length = table.size(-2)
    k = max_relative_position
    largest = query_offset + query_length - 1   # column p: key position minus query position = p - largest

    def widened(first_query: int, size: int, columns: slice) -> torch.Tensor:
        rows = table[..., first_query : first_query + size, :]
        # columns [start, lo) hold bucket 0, [lo, hi) bucket p - largest + k, [hi, stop) bucket 2k: each bound
        # clamped into the columns, so that the three widths add up to the block's by construction (under dynamic
        # shapes torch.compile then has no Min/Max sums to prove equal, which took most of a recompile)
        lo = min(max(largest - k, columns.start), columns.stop)
        hi = min(max(largest + k + 1, lo), columns.stop)
        edge_shape = rows.shape[:-1]
        return torch.cat([
            rows[..., :1].expand(*edge_shape, lo - columns.start),
            rows[..., lo - largest + k : hi - largest + k],
            rows[..., 2 * k : 2 * k + 1].expand(*edge_shape, columns.stop - hi),
        ], dim=-1)

    return dense_by_query_blocks(query_length, key_length, widened)


@dataclass
class RelativeBias:
    """A score bias that depends on (query i, key j) only through a bucket: bias[b, h, i, j] = table[b, h, i, bucket(i, j)].

    `table` is [B, H, n, R] (Shaw: q . w^K_r for the 2k+1 clipped distances, then zero columns up to an aligned R;
    XL: (q + v) . W_kR R_d for every distance d; T5: the bucket table, expanded), or a function computing it when a
    kernel first asks (`full_table()`). `dense()` expands it to [B, H, n, m] for the eager and SDPA kernels (by
    `densify(bias)` when the scheme has a cheaper way, such as XL's rel-shift: given the bias, so that it needs no
    reference to it, whose cycle would keep each layer's tensors until Python's cycle collector ran; else by a
    gather in promote_types(dtype, float32), returned in the table's dtype: the gather's backward sums the gradients
    of every key in a bucket, up to m for a clipped distance's edge bucket, and CUDA's scatter-add would round after
    each addition in half precision), once per record: a record shared by every layer (T5) is expanded once per
    forward. The FlexAttention kernel reads the table through `bucket` inside its score_mod and never builds the n x
    m float tensor; with `recompute` (a table computed by a function) it computes the table again in the backward
    instead of keeping it (XL's n x (n + m - 1) per head, one layer's at a time). `clip_distance` = k says that the
    bucket is the clipped distance clip(j - i', k) + k between the query's and the key's positions (Shaw's); at
    consecutive positions (`consecutive`, i' = i + `query_offset`) the "relpos_triton" kernel computes it itself.
    """

    table: torch.Tensor | Callable[[], torch.Tensor]
    bucket: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    key_length: int
    densify: Callable[[RelativeBias], torch.Tensor] | None = None
    clip_distance: int | None = None
    query_offset: int = 0
    consecutive: bool = True
    recompute: bool = False
    _dense: torch.Tensor | None = dataclasses.field(default=None, init=False, repr=False)

    def full_table(self) -> torch.Tensor:
        if callable(self.table):
            self.table = self.table()
        return self.table

    def dense(self) -> torch.Tensor:
        if self._dense is None:
            if self.densify is not None:
                self._dense = self.densify(self)
            else:
                table = self.full_table()
                batch, heads, query_length, _ = table.shape
                queries = torch.arange(query_length, device=table.device)[:, None]
                keys = torch.arange(self.key_length, device=table.device)[None, :]
                index = self.bucket(queries, keys).expand(batch, heads, query_length, self.key_length)
                compute = torch.promote_types(table.dtype, torch.float32)
                self._dense = torch.gather(table.to(compute), -1, index).to(table.dtype)
        return self._dense


class DenseBias:
    """A dense score bias [1|B, H, n, m] computed by `build` when a kernel first asks (eager, SDPA, a decoding step),
    once per stack call and kept for every layer, or at every read when `reuse` is false (set by
    `PositionContext.extend` from the context's `reuse_across_layers`); the fused path reads the scheme's score_mod
    instead and never builds it. `check` (set by `scheme_terms_of`) raises for a built tensor of the wrong type or
    shape, naming the scheme."""

    def __init__(self, build: Callable[[], torch.Tensor]) -> None:
        self.build = build
        self.reuse = True
        self.check: Callable[[torch.Tensor], None] | None = None
        self._dense: torch.Tensor | None = None

    def dense(self) -> torch.Tensor:
        if not self.reuse:
            return self._checked()
        if self._dense is None:
            self._dense = self._checked()
        return self._dense

    def _checked(self) -> torch.Tensor:
        dense = self.build()
        if self.check is not None:
            self.check(dense)
        return dense


BAND_BLOCK = 64   # queries per block of `band_scores` / `band_values`


def _band_windows(states: torch.Tensor, query_length: int, first_key: int, count: int, block: int) -> torch.Tensor:
    """[B, H, blocks, block + count - 1, d]: for each block of `block` queries starting at a, the keys (or values)
    a + first_key .. a + first_key + block + count - 2, zero outside 0 .. m-1 (a view of one padded copy)."""
    key_length = states.size(-2)
    padded_queries = math.ceil(query_length / block) * block
    lead = max(0, -first_key)
    trail = max(0, first_key + padded_queries + count - 1 - key_length)
    padded = nn.functional.pad(states, (0, 0, lead, trail))
    start = first_key + lead
    return padded[:, :, start : start + padded_queries + count - 1].unfold(2, block + count - 1, block).transpose(-1, -2)


def band_block(query_length: int) -> int:
    """Queries per block of `band_scores` / `band_values`: BAND_BLOCK, or all n when fewer; under torch.compile
    always BAND_BLOCK (a short call's block padded with zero queries), since a block of n would make every new
    length below BAND_BLOCK a new graph."""
    return BAND_BLOCK if torch.compiler.is_compiling() else min(BAND_BLOCK, query_length)


def with_zero_rows(states: torch.Tensor, rows: int) -> torch.Tensor:
    """`states` [..., n, d] and zero rows after them up to `rows`, contiguous. Not `nn.functional.pad`: adding no row,
    it returns a copy with the input's strides, where a graph compiled for lengths that vary expects a contiguous
    tensor (its views of a transposed query then fail under aot_eager)."""
    return torch.cat((states, states.new_zeros(*states.shape[:-2], rows - states.size(-2), states.size(-1))), dim=-2)


def band_scores(query: torch.Tensor, key: torch.Tensor, first_key: int, count: int) -> torch.Tensor:
    """S[b, h, i, r] = q_i . k_(i + first_key + r) for the `count` diagonals r (0 where the key is outside 0 .. m-1),
    [B, H, n, count]: one batched product of each block of BAND_BLOCK queries with the keys its diagonals meet,
    skewed to diagonals by a reshape (n (BAND_BLOCK + count - 1) scores, no per-diagonal loop)."""
    batch, heads, query_length, head_dim = query.shape
    block = band_block(query_length)
    blocks = math.ceil(query_length / block)
    queries = with_zero_rows(query, blocks * block).view(batch, heads, blocks, block, -1)
    scores = torch.matmul(queries, _band_windows(key, query_length, first_key, count, block).transpose(-1, -2))
    width = block + count - 1   # row t of a block holds its diagonals at columns t .. t + count - 1
    skewed = nn.functional.pad(scores.reshape(batch, heads, blocks, block * width), (0, block))
    diagonals = skewed.view(batch, heads, blocks, block, width + 1)[..., :count]
    return diagonals.reshape(batch, heads, blocks * block, count)[:, :, :query_length]


def band_values(weights: torch.Tensor, value: torch.Tensor, first_key: int) -> torch.Tensor:
    """sum_r W[b, h, i, r] v_(i + first_key + r) [B, H, n, d] for diagonal weights W [B, H, n, count] (zero where the
    key is outside 0 .. m-1): the inverse skew of `band_scores`, then one batched product per block of queries."""
    batch, heads, query_length, count = weights.shape
    block = band_block(query_length)
    blocks = math.ceil(query_length / block)
    width = block + count - 1
    weights = with_zero_rows(weights, blocks * block).view(batch, heads, blocks, block, count)
    skewed = nn.functional.pad(weights, (0, block)).reshape(batch, heads, blocks, block * (width + 1))
    by_key = skewed[..., : block * width].view(batch, heads, blocks, block, width)
    output = torch.matmul(by_key, _band_windows(value, query_length, first_key, count, block))
    return output.reshape(batch, heads, blocks * block, -1)[:, :, :query_length]


RegionBias = Callable[[int, int, torch.dtype], tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]]


def region_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float, mask: Any,
                     attend: Callable, band_first: int, band_count: int, bias: RegionBias, with_weights: bool = False,
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(q k^T * scaling + bias) v for a score bias that depends on the distance d = j - i' only (i' = i + query
    offset, consecutive positions) and is one constant per (head, query) row outside the band of distances
    `band_first` <= d < `band_first` + `band_count`; from three disjoint key regions merged by their log-sum-exps
    (a scheme's `fused_attention`, with the call's `FlexMask` `mask` and FlexAttention call `attend`):

    - left, d < band_first, and right, d >= band_first + band_count: one FlexAttention call each, no score_mod.
      Over a region the bias is a per-row constant c_i: it moves the region's log-sum-exp by c_i and leaves its
      output unchanged, so it is added to the log-sum-exp (no table inside the kernel, no atomic gradient);
    - the band, clamped to the distances the call can meet (`mask.distance_bounds()`, so short sequences do not pay
      for diagonals they lack; not under torch.compile, where the clamp would make each short length a graph): its
      diagonals' scores (`band_scores`, one batched product per block of queries) plus
      their bias, O(n band_count d) per head.

    `bias(first, count, compute)` gives, in `compute` = promote_types(dtype, float32), the left region's row constant
    (broadcastable to [B, H, n]), the band's bias for the diagonals first .. first + count - 1 ([B, H, n, count]) and
    the right region's row constant; None: no bias there. With lse = logsumexp(lse_left + c_left, band scores,
    lse_right + c_right): z_i = e^(lse_left + c_left - lse) z_left + e^(lse_right + c_right - lse) z_right +
    sum_r p_ir v_(i'+band_first+r) (`band_values`), in `compute`, zero for a query with no key. With `with_weights`
    also W [B, H, n, band_count + 2]: the left region's probability, each band diagonal's (zero for one the call does
    not meet), the right region's (each >= 0, summing to 1; zero for a query with no key). Every gradient (q, k, v
    and what the bias is computed from) follows by autograd through O(n (band_count + d)) tensors and
    FlexAttention's own backward (with its log-sum-exp)."""
    compute = torch.promote_types(query.dtype, torch.float32)
    regions = []   # (output, log-sum-exp) of the left and right regions, None for an empty one
    for lowest, highest in ((None, band_first - 1), (band_first + band_count, None)):
        region = mask.restricted(lowest, highest)
        regions.append(None if region is None else attend(query, key, value, region, scaling, with_lse=True))
    if torch.compiler.is_compiling():   # the whole band: one clamped to the call's reach makes each length a graph
        first, count = band_first, band_count
    else:
        reach_low, reach_high = mask.distance_bounds()
        first = min(max(band_first, reach_low), band_first + band_count)
        count = max(0, min(band_first + band_count, reach_high + 1) - first)
    # autocast off: the rest stays in `compute` (autocast would run its products in bf16 again)
    with torch.autocast(query.device.type, enabled=False):
        left_bias, band_bias, right_bias = bias(first, count, compute)
        log_weights, outputs = [], []
        for result, row_bias in zip(regions, (left_bias, right_bias), strict=True):
            if result is None:
                log_weights.append(query.new_full(query.shape[:-1], float("-inf"), dtype=compute))
                outputs.append(None)
                continue
            output, log_mass = result
            log_mass = log_mass.to(compute)
            if row_bias is not None:
                log_mass = log_mass + row_bias
            log_weights.append(log_mass)
            outputs.append(torch.where(torch.isfinite(log_mass)[..., None], output.to(compute), 0.0))
        scores = [log_weights[0][..., None]]
        if count:
            band = band_scores(query.to(compute), key.to(compute), mask.query_offset + first, count) * scaling
            if band_bias is not None:
                band = band + band_bias
            scores.append(band.masked_fill(~mask.band(first, count, query.device, query.size(1)), float("-inf")))
        scores.append(log_weights[1][..., None])
        scores = torch.cat(scores, dim=-1)   # [B, H, n, count + 2]
        has_key = torch.isfinite(scores).any(-1, keepdim=True)
        log_normalizer = torch.logsumexp(torch.where(has_key, scores, 0.0), dim=-1, keepdim=True)
        weights = torch.exp(scores - log_normalizer) * has_key
        parts = [weights[..., column, None] * part for column, part in ((0, outputs[0]), (-1, outputs[1]))
                 if part is not None]
        if count:
            parts.append(band_values(weights[..., 1:-1], value.to(compute), mask.query_offset + first))
        output = sum(parts[1:], parts[0])
        if not with_weights:
            return output, None
        if count != band_count:   # the diagonals the call does not meet: zero weight
            band = nn.functional.pad(weights[..., 1:-1], (first - band_first, band_first + band_count - first - count))
            weights = torch.cat([weights[..., :1], band, weights[..., -1:]], dim=-1)
        return output, weights


@dataclass
class RelativeValues:
    """Shaw et al.'s (2018) value term, eq. 3: z_i += sum_j p_ij w_clip(j - i', k), i' = i + `query_offset`, for the
    attention probabilities p [B, H, n, m] and a table `table` [2k+1, d] (shared by the heads) or [H, 2k+1, d], or
    either followed by zero rows up to `mass_columns` (`padded_table`).

    `mass_by_distance(p)` sums each row's probabilities into the 2k+1 clipped distances (a scatter-add over
    `index` [n, m], the bucket of every query-key pair, or a function giving it), in `mass_columns` columns (zero
    beyond 2k+1, so that `from_masses` multiplies on aligned kernels); calling the record gives the term. The fused
    kernel never forms p: the scheme's `fused_attention` computes the masses from key regions' log-sum-exps instead,
    which needs consecutive positions (`consecutive`: False under randomized positions).
    """

    table: torch.Tensor
    max_relative_position: int
    query_offset: int
    index: torch.Tensor | Callable[[], torch.Tensor]
    consecutive: bool

    @property
    def mass_columns(self) -> int:
        """The width of the masses M [B, H, n, *] that kernels hand to `from_masses`: 2k+1, aligned."""
        return aligned_width(2 * self.max_relative_position + 1)

    def mass_by_distance(self, probabilities: torch.Tensor) -> torch.Tensor:
        """M[b, h, i, r] = sum of p[b, h, i, j] over the keys j at clipped distance r - k (zero for r > 2k), summed in
        promote_types(dtype, float32) as the fused kernels' masses are: an edge bucket adds up to m probabilities, and
        CUDA's scatter-add rounds after every addition (in bf16 that loses the mass of keys far beyond k)."""
        batch, heads, query_length, key_length = probabilities.shape
        accumulate = torch.promote_types(probabilities.dtype, torch.float32)
        by_distance = probabilities.new_zeros(batch, heads, query_length, self.mass_columns, dtype=accumulate)
        index = self.index() if callable(self.index) else self.index
        return by_distance.scatter_add_(-1, index.expand(batch, heads, query_length, key_length),
                                        probabilities.to(accumulate))

    def from_masses(self, masses: torch.Tensor) -> torch.Tensor:
        """sum_r M[..., r] w_r: [B, H, n, d]."""
        return times_table(masses, self.table, transpose=False)

    def __call__(self, probabilities: torch.Tensor) -> torch.Tensor:
        """The term of the probabilities [B, H, n, m], in their dtype (the masses in between in float32 at least)."""
        return self.from_masses(self.mass_by_distance(probabilities)).to(probabilities.dtype)


def rows_by_index(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """w_clip(j - i', k) for every key j of one query's bucket `index` [1, m]: the rows of a distance table [2k+1, d]
    or [H, 2k+1, d] at each key, [m, d] or [H, m, d], which broadcast over [B, H, m, d] (of a stack's tables
    [L, ..., 2k+1, d]: [L, ..., m, d])."""
    if index.size(0) != 1:
        raise ValueError(f"rows_by_index needs one query's bucket index, got {index.size(0)} queries")
    return table[..., index[0], :]


DISTANCE_ALIGNMENT = 8   # the distance dimension of `times_table`'s products, rounded up to a multiple of this


def aligned_width(distances: int) -> int:
    """`distances` rounded up to a multiple of `DISTANCE_ALIGNMENT` (8: 16 bytes of half precision): cuBLAS runs a
    product whose distance dimension is 2k + 1 (odd) on unaligned kernels, several times slower on an H200."""
    return -(-distances // DISTANCE_ALIGNMENT) * DISTANCE_ALIGNMENT


def padded_table(table: torch.Tensor) -> torch.Tensor:
    """A distance table [..., R, d] followed by zero rows up to aligned_width(R) rows: what `times_table` multiplies,
    padded once for all the layers of a stack call (one pad, forward and backward) instead of in every product; the
    table's gradient in its own layout (`ZeroRowsAfter`)."""
    rows = aligned_width(table.size(-2))
    return ZeroRowsAfter.apply(table, rows) if rows > table.size(-2) else table


class ZeroRowsAfter(torch.autograd.Function):
    """table [..., R, d] followed by zero rows up to `rows` (`nn.functional.pad`); backward: the first R rows of the
    padded gradient, copied into the table's own strides (`empty_like`: contiguous for a table whose strides overlap,
    an expanded one). `nn.functional.pad`'s backward gives a view of them, with the
    padded table's strides: AccumulateGrad keeps such a view as the parameter's gradient where the only other
    dimension has size 1 (a stack of one layer: the strides of size-1 dimensions are not compared), and DDP then copies
    it into its bucket with a warning ("Grad strides do not match bucket view strides"); where it copies the view
    (several layers) this copy replaces that one."""

    @staticmethod
    def forward(ctx: Any, table: torch.Tensor, rows: int) -> torch.Tensor:
        ctx.save_for_backward(table)
        return nn.functional.pad(table, (0, 0, 0, rows - table.size(-2)))

    @staticmethod
    def backward(ctx: Any, padded_gradient: torch.Tensor) -> tuple[torch.Tensor, None]:
        (table,) = ctx.saved_tensors
        gradient = torch.empty_like(table)   # its strides where dense and non-overlapping, as AccumulateGrad lays out
        return gradient.copy_(padded_gradient.narrow(-2, 0, table.size(-2))), None


def product_dtype(dtype: torch.dtype, device_type: str) -> torch.dtype:
    """The dtype a matmul of a `dtype` tensor on `device_type` computes in: autocast's where autocast is on there
    (for float32 and narrower inputs, which it casts), else `dtype`."""
    if torch.is_autocast_enabled(device_type) and dtype in (torch.float32, torch.float16, torch.bfloat16):
        return torch.get_autocast_dtype(device_type)
    return dtype


def times_table(x: torch.Tensor, table: torch.Tensor, transpose: bool = True, distances: int | None = None
                ) -> torch.Tensor:
    """x [B, H, n, *] times a distance table [R, d] or [H, R, d], the table's rows padded with zeros so that every
    product (forward and backward) has an aligned distance dimension. transpose: x . w_r for every r, [B, H, n, R],
    a view of the [B, H, n, aligned_width(R)] product (the product itself where R is aligned); otherwise
    x [B, H, n, R'] with R' >= R (masses as wide as `RelativeValues.mass_columns`, zero beyond R; narrower ones are
    padded here, a copy) times the table padded to that width. `distances`: R for a table whose rows beyond the first R are zeros already (`padded_table`; default:
    every row is a distance). A token-major x (the model's heads split from [B, n, H * d]) is multiplied in that
    order: no copy of x, a token-major result. The table is cast to the dtype the product computes in
    (`product_dtype`: under autocast, autocast's, which a caller's table may be in already)."""
    distances = table.size(-2) if distances is None else distances
    if not transpose and x.size(-1) % DISTANCE_ALIGNMENT:
        x = nn.functional.pad(x, (0, aligned_width(x.size(-1)) - x.size(-1)))
    width = aligned_width(distances) if transpose else x.size(-1)
    table = table.to(product_dtype(x.dtype, x.device.type))
    if width > table.size(-2):
        table = nn.functional.pad(table, (0, 0, 0, width - table.size(-2)))
    if table.dim() == 2:
        weights = table.t() if transpose else table
        if not x.is_contiguous() and x.transpose(1, 2).is_contiguous():
            product = torch.matmul(x.transpose(1, 2), weights).transpose(1, 2)
        else:
            product = torch.matmul(x, weights)
    else:
        product = torch.einsum("bhnd,hrd->bhnr" if transpose else "bhnr,hrd->bhnd", x, table)
    return product[..., :distances] if transpose and distances < width else product


@dataclass
class AttentionTerms:
    """What a position scheme contributes to one self-attention call; every field is optional and the empty record
    is plain attention, softmax(q k^T / sqrt(d) + mask) v.

    - `query`, `key`: replacements for the projected queries / keys [B, H, n|m, d] (XL's q + u). Keys here include
      the cached ones, at positions 0 .. m-1; queries start at position `query_offset` (or all at the randomized
      `positions`, see `PositionScheme`).
    - `value_bias`: added to the values [B, H, m, d] (broadcastable to them) before attention, for a value term that
      depends on the key alone: Shaw's a^V_ij of one query i (a decoding step), eq. 3 unfactored,
      z_i = sum_j p_ij (v_j + a^V_ij), which every kernel then runs as plain attention over these values.
    - `score_bias`: added to the scaled scores, a tensor broadcastable to [B, H, n, m] or a bucketed `RelativeBias`.
    - `mask`: boolean, broadcastable to [B, H, n, m], True = may attend; combined (and) with padding and causality.
      A query left with no key outputs zeros. (A mask that is the same in every layer belongs in
      `PositionContext.mask`, combined once per forward.)
    - `value_term(probabilities)`: added to the output [B, H, n, d], computed from the attention probabilities
      [B, H, n, m] after dropout (Shaw's a^V, a `RelativeValues`).

    The fused kernel (FlexAttention) reads instead, when the scheme gives them besides the `score_bias` /
    `value_term` that the other kernels read (either alone is an error, `scheme_terms_of`):
    - `score_mod(score, b, h, i, j)`: the score bias computed from the indices (query i of the call, key j) and small
      tables, never an [n, m] tensor (ALiBi's closed form, T5's bucket by arithmetic under randomized positions);
    - `fused_attention(query, key, value, scaling, mask, attend)`: the scheme's own composition of FlexAttention
      calls for its score bias and value term together, returning [B, H, n, d]; `mask` is the call's `FlexMask`
      (`restricted(lowest, highest)` for key regions, `band(first, count)` for diagonals, `distance_bounds()`) and
      `attend(query, key, value, mask, scaling, score_mod=None, with_lse=False) -> (output, log-sum-exp or None)`
      one FlexAttention call. A bias by distance that is a per-row constant far from the diagonal composes them
      through `region_attention` (Shaw's a^K and a^V, `positions_shaw`; T5's buckets, `positions_t5`).

    Score biases, masks and value terms need hf_relpos' own kernels (`RELPOS_KERNELS`); a record
    with none of them (replaced queries and keys, a value bias) also runs on every transformers kernel
    (flash_attention_2/3, Hub kernels).
    """

    query: torch.Tensor | None = None
    key: torch.Tensor | None = None
    value_bias: torch.Tensor | None = None
    score_bias: torch.Tensor | RelativeBias | None = None
    mask: torch.Tensor | None = None
    value_term: Callable[[torch.Tensor], torch.Tensor] | None = None
    score_mod: Callable | None = None
    fused_attention: Callable | None = None

    def additions(self) -> list[str]:
        """What this record adds that only hf_relpos' kernels take (empty for plain attention)."""
        named = (("a score bias", self.score_bias), ("an attention mask", self.mask), ("a value term", self.value_term))
        return [name for name, term in named if term is not None]


def scheme_terms_of(scheme: PositionScheme, layer_idx: int, query: torch.Tensor, key: torch.Tensor,
                    context: PositionContext) -> AttentionTerms:
    """`scheme.terms(...)`, checked against what `AttentionTerms` documents for queries [B, H, n, d] and keys
    [B, H, m, d]: one error naming the scheme, the term and what it must be. Types and shapes only (no tensor
    operation, no device sync), so every attention call checks."""
    terms = scheme.terms(layer_idx, query, key, context)
    where = f"position scheme {scheme.name!r}: terms()"
    if not isinstance(terms, AttentionTerms):
        raise TypeError(f"{where} must return an AttentionTerms, got {_described(terms)}")
    for name, replaced, given in (("query", terms.query, query), ("key", terms.key, key)):
        if replaced is not None and not (torch.is_tensor(replaced) and replaced.shape == given.shape):
            raise ValueError(f"{where}.{name} must be a tensor of the shape it replaces, {list(given.shape)}, got "
                             f"{_described(replaced)}")
    target = (*query.shape[:3], key.size(-2))
    if isinstance(terms.score_bias, DenseBias):   # checked when a kernel builds it
        terms.score_bias.check = functools.partial(
            _check_term_tensor, f"{where}.score_bias (the tensor its DenseBias builds)", "score_bias", target)
    elif terms.score_bias is not None and not isinstance(terms.score_bias, RelativeBias):
        _check_term_tensor(f"{where}.score_bias", "score_bias", target, terms.score_bias)
    if terms.mask is not None:
        _check_term_tensor(f"{where}.mask", "mask", target, terms.mask)
    if terms.value_bias is not None:
        _check_term_tensor(f"{where}.value_bias", "value_bias", tuple(key.shape), terms.value_bias)
    for name in ("value_term", "score_mod", "fused_attention"):
        if getattr(terms, name) is not None and not callable(getattr(terms, name)):
            raise TypeError(f"{where}.{name} must be callable, got {_described(getattr(terms, name))}")
    # score_mod and fused_attention are FlexAttention's forms of a score bias and value term: eager, sdpa, a decoding
    # step and the flash kernels' check read score_bias and value_term only, and would run plain attention
    if terms.score_mod is not None and terms.score_bias is None:
        raise ValueError(f"{where}.score_mod is FlexAttention's form of a score bias: give the bias as score_bias too "
                         "(a tensor or a DenseBias), which eager, sdpa and decoding steps read; without it they "
                         "would attend without the bias")
    if terms.fused_attention is not None and terms.score_bias is None and terms.value_term is None:
        raise ValueError(f"{where}.fused_attention is FlexAttention's form of a score bias or value term: give "
                         "score_bias or value_term too, which eager, sdpa and decoding steps read; without them "
                         "they would attend without the scheme's terms")
    return terms


def _check_term_tensor(what: str, name: str, target: tuple[int, ...], tensor: Any) -> None:
    """Raise for a score bias (`name` "score_bias") that is not a floating-point tensor, or a mask ("mask") that is not
    a boolean one, broadcastable to `target` = [B, H, n, m], or a value bias ("value_bias") that is not a
    floating-point tensor broadcastable to the values, `target` = [B, H, m, d]; `what` names the term in the error."""
    kind = "boolean" if name == "mask" else "floating-point"
    typed = torch.is_tensor(tensor) and (tensor.dtype == torch.bool if name == "mask" else
                                         tensor.is_floating_point())
    if not (typed and tensor.dim() <= 4 and all(
            size in (1, full) for size, full in zip(tensor.shape[::-1], target[::-1], strict=False))):
        shape = "the values [B, H, m, d]" if name == "value_bias" else "[B, H, n, m]"
        raise ValueError(f"{what} must be a {kind} tensor broadcastable to {shape} = {list(target)}, "
                         f"got {_described(tensor)}")


def _described(value: Any) -> str:
    """A term as an error names it: a tensor by its shape and dtype, anything else by its type."""
    return f"a {value.dtype} tensor of shape {list(value.shape)}" if torch.is_tensor(value) else type(value).__name__


ContextType = TypeVar("ContextType", bound="PositionContext")


def computed_once(method: Callable[[Any], Any]) -> property:
    """A read-only property of a (frozen) context computed on its first read and kept in the instance's __dict__
    (computed at every read when the context's `reuse_across_layers` is false): functools.cached_property without the
    lock it takes under Python 3.11, which torch.compile cannot trace (a graph break at every read)."""
    name = method.__name__

    def read(self: Any) -> Any:
        return self.once(name, lambda: method(self))

    return property(read, doc=method.__doc__)


@dataclass(frozen=True)
class PositionContext:
    """The positions of one stack call, built once per forward by `PositionScheme.prepare` and read by every layer.

    The call's n queries sit at `query_offset` .. `query_offset` + n - 1 and its m keys (cached ones and
    Transformer-XL memory included) at 0 .. m-1, or, with randomized positions, the keys at `positions` [m] and the
    queries at its last n entries. With a fixed-size KV cache (`fixed_size_cache`) `query_offset` is a 0-dim tensor
    and the m keys are the cache's slots, m >= `query_offset` + n. `dtype` is the dtype of the stack's hidden
    states. `mask` is a boolean mask broadcastable to [B, H, n, m] that the scheme adds to every layer's
    self-attention (DiSAN's directions; True = may attend), or `mask_mod(h, i', j)` the same from head h, query position index i' = i + query_offset and key
    index j (its fused form; `dense_mask` expands it for the other kernels); the stack combines it with padding and
    causality once. `kernel_cache` is where an attention kernel keeps what it reads once per stack call and every
    layer shares (the fused kernel's padding ranges: a host sync). Schemes keep what else they precompute in a
    subclass (`extend`). `reuse_across_layers` is false in the context of the layers that are checkpointed
    (gradient checkpointing; the stack prepares another one for its other layers): what a layer builds on its first
    read (`computed_once`, `DenseBias`), possibly from a parameter, is then built at every read, inside each layer's
    checkpoint, since a copy kept for the next layers would escape the layer's recomputation (and under reentrant
    checkpointing be built without gradients).
    """

    query_length: int
    key_length: int
    query_offset: int | torch.Tensor
    positions: torch.Tensor | None
    device: torch.device
    dtype: torch.dtype
    mask: torch.Tensor | None = None
    mask_mod: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    reuse_across_layers: bool = True
    kernel_cache: dict[Any, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def clip_distance(self) -> int | None:
        """k when the scheme's terms are by the clipped distance clip(j - i', k) at consecutive positions (what the
        "relpos_triton" kernel computes itself), else None."""
        return None

    def has_mask(self) -> bool:
        return self.mask is not None or self.mask_mod is not None

    def dense_mask(self, heads: int) -> torch.Tensor | None:
        """The scheme's mask as a boolean [1, H, n, m] tensor (from `mask_mod` when it gives only that)."""
        if self.mask is not None or self.mask_mod is None:
            return self.mask
        query_positions = torch.arange(self.query_length, device=self.device) + self.query_offset
        keys = torch.arange(self.key_length, device=self.device)
        heads_index = torch.arange(heads, device=self.device)[:, None, None]
        return self.mask_mod(heads_index, query_positions[:, None], keys[None, :]).expand(heads, -1, -1)[None]

    def query_and_key_positions(self) -> tuple[torch.LongTensor, torch.LongTensor]:
        """The queries' [n] and keys' [m] absolute positions."""
        return query_and_key_positions(self.query_length, self.key_length, self.positions, self.device,
                                       self.query_offset)

    @property
    def fixed_size_cache(self) -> bool:
        """Whether the keys are the slots of a fixed-size KV cache (transformers' StaticCache, `generate(...,
        cache_implementation="static")`): `query_offset` is then a 0-dim tensor (the cache's fill level, read on the
        device so that a compiled decoding step does not depend on its value), the m keys are all the cache's
        slots, those past each query's position unused and masked (causally), and `positions` is None. A fast path
        that slices by the offset applies only when this is false."""
        return torch.is_tensor(self.query_offset)

    def once(self, name: str, compute: Callable[[], Any]) -> Any:
        """compute() on the first read of `name` in this stack call, kept for the next layers' reads (in the
        instance's __dict__: `name` must be an identifier, as torch.compile reads it as an attribute); at every read
        when `reuse_across_layers` is false."""
        if not self.reuse_across_layers:
            return compute()
        values = self.__dict__
        if name not in values:
            values[name] = compute()
        return values[name]

    def extend(self, context_class: type[ContextType], **extra: Any) -> ContextType:
        """This context as an instance of the subclass `context_class`, with its extra fields; a `DenseBias` among
        them is kept for the next layers only as `reuse_across_layers` allows."""
        for value in extra.values():
            if isinstance(value, DenseBias):
                value.reuse = self.reuse_across_layers
        return context_class(**{name: getattr(self, name) for name in CONTEXT_FIELDS}, **extra)


# PositionContext's field names, read once (torch.compile cannot trace dataclasses.fields of a class: a graph break
# in every stack call of a scheme with its own context)
CONTEXT_FIELDS = tuple(field.name for field in fields(PositionContext))


class PositionScheme(nn.Module):
    """How order enters the self-attention of one stack (encoder or decoder); subclass and `@register_position_scheme`.

    A subclass owns the parameters of all `num_layers` layers and overrides what it needs:

    - `embed(inputs_embeds, past_length, positions=None)`: an embedding-level encoding (absolute sinusoids).
    - `prepare(context) -> PositionContext`: once per stack call, everything that depends on the positions only
      (index tables, masks, angles), returned in the context (a subclass of it, see `PositionContext.extend`).
    - `transform_new_keys(layer_idx, key, context)`: the keys [B, H, c, d] this call computed, at the c positions
      that end with the last query's (the last c of the m keys; in a fixed-size cache the slots before the unused
      ones), before they enter the KV cache (RoPE rotates them here, so a cached step rotates only its new key).
    - `terms(layer_idx, query, key, context) -> AttentionTerms`: what layer `layer_idx` adds to attention, given its
      per-head projections (queries [B, H, n, d], keys [B, H, m, d] including any cache or memory).
    - `config_fields`: the config fields it reads (`SchemeField`), `check_config` for checks across fields,
      `init_parameters(std)`, `start_neutral()` (parameters for switching a trained model to this scheme), and
      `card` (`SchemeCard`) for model cards.

    Positions. By default the tokens of a call sit at the ordinary positions: key j at j, query i at
    `query_offset + i`. With `config.position_randomization_max` = L set, a stack in training mode draws its
    positions instead as a sorted random subset of 0 .. L-1 (Ruoss et al. 2023; `random_positions`, one draw per
    batch and stack) and passes them as `positions`: to `embed` the positions of its n tokens [n] (or [B, n], see
    below), to `prepare` (in
    the context) those of the m keys [m] (the queries are the last n of them). With
    `config.position_randomization_at_inference` as well, evaluation draws them too, and generation keeps one decoder
    draw for the whole output (`PositionDraw`). `positions=None` always means the ordinary positions. A scheme reads
    both cases through `PositionContext.query_and_key_positions`, and so takes randomized positions without further
    code; fast paths that rely on consecutive positions (XL's rel-shift) apply only when `positions` is None.
    The causal LM's `position_ids` (transformers' name; `generate` counts them over the tokens the attention mask
    keeps) place each sequence's tokens for `embed` alone, as [B, n] `positions`: left padding then leaves a prompt's
    embedding-level encoding as without it; the relative terms read distances in the sequence, which left padding
    does not change with ordinary positions (with randomized ones at inference they read the draw by column, so a
    left-padded row is not encoded as the prompt alone). So a scheme whose attention reads positions
    (`attention_reads_positions`) takes `position_ids` only as such a shift of a row's tokens; others are one error.
    """

    name: str = ""
    config_fields: tuple[SchemeField, ...] = ()
    card: SchemeCard | None = None
    # Whether the scheme runs with a fixed-size KV cache (`generate(..., cache_implementation="static")`): its
    # `embed` takes `past_length` as a 0-dim tensor and its `prepare` / `transform_new_keys` / `terms` a context whose
    # `fixed_size_cache` is true (`PositionContext`). A scheme that does not declare it is refused with one error.
    takes_fixed_size_cache: bool = False

    def __init__(self, config: Any, num_layers: int, num_heads: int, head_dim: int, is_causal: bool) -> None:
        super().__init__()
        self.config = config
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.is_causal = is_causal

    @classmethod
    def check_config(cls, config: Any) -> None:
        """Raise ValueError for combinations of config values this scheme cannot use (each field alone is checked by
        its `SchemeField`)."""

    def init_parameters(self, std: float) -> None:
        """Initialise this scheme's own parameters (called by `PreTrainedModel._init_weights`)."""

    def start_neutral(self) -> None:
        """Set this scheme's parameters so that it changes attention as little as it can: the start when a trained
        model switches to this scheme (`hf_relpos.tools.convert`). Default: every parameter zero, which removes additive
        terms exactly (Shaw's a^K, a^V; Transformer-XL's u, v and W_kR); override where zero is not neutral."""
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.zero_()

    @property
    def attention_reads_positions(self) -> bool:
        """Whether self-attention reads the tokens' positions (the scheme overrides `prepare`, `transform_new_keys`
        or `terms`): by each token's place in the sequence, where the causal LM's `position_ids` do not reach."""
        return any(getattr(type(self), name) is not getattr(PositionScheme, name)
                   for name in ("prepare", "transform_new_keys", "terms"))

    @classmethod
    def embeds_positions(cls) -> bool:
        """Whether the scheme adds an embedding-level encoding (overrides `embed`): sinusoids added beside it would
        count positions twice, and a Transformer-XL memory would repeat it for every later segment. Called on the
        class (a config) or on an instance, also through a module that wraps the scheme (PEFT's `modules_to_save`
        copy), which reads the wrapped scheme's class."""
        return cls.embed is not PositionScheme.embed

    def embed(self, inputs_embeds: torch.Tensor, past_length: int, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Embedding-level position encoding of tokens at past_length + i (or at `positions`, [n] or [B, n]);
        identity for purely relative schemes."""
        return inputs_embeds

    def prepare(self, context: PositionContext) -> PositionContext:
        """What every layer of this stack call shares; nothing beyond the positions by default."""
        return context

    def transform_new_keys(self, layer_idx: int, key: torch.Tensor, context: PositionContext) -> torch.Tensor:
        """The keys computed by this call, as they enter the cache and attention; unchanged by default."""
        return key

    def terms(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, context: PositionContext) -> AttentionTerms:
        """What layer `layer_idx`'s self-attention gets from this scheme; nothing by default."""
        return AttentionTerms()
