"""RelPosTransformerConfig: a Marian/BART-style encoder-decoder config whose self-attention position scheme is chosen
from the registry by `position_scheme`."""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from transformers import GenerationConfig, PreTrainedConfig
from transformers.activations import ACT2FN

from .positions import (
    MAX_POSITIONS,
    POSITION_SCHEMES,
    SchemeField,
    get_scheme_class,
    reserve_config_names,
    scheme_config_fields,
    warn_renamed,
)

# The built-in schemes, one import line each: importing a scheme's module registers it, and transformers' remote code
# copies exactly the same-folder files imported like this. A new built-in scheme adds its line here, nothing else.
from .positions_absolute import AbsolutePositions  # noqa: F401
from .positions_alibi import AlibiPositions  # noqa: F401
from .positions_directional import DirectionalPositions  # noqa: F401
from .positions_none import NoPositions  # noqa: F401
from .positions_rope import RotaryPositions  # noqa: F401
from .positions_shaw import ShawPositions  # noqa: F401
from .positions_t5 import T5Positions  # noqa: F401
from .positions_xl import XLPositions  # noqa: F401
from .validation import closest_name, require_int, require_positive_number, require_probability

LAYER_NORM_POSITIONS = ("pre", "post")
ATTENTION_DROPOUT_KINDS = ("probabilities", "keys")
# a config field's deprecated name -> its current name: both are accepted as keywords, in config.json (configs saved
# by earlier versions), in a recipe's model: section and as --model.NAME flags; only the current one is saved
DEPRECATED_FIELDS = {"attention_type": "position_scheme"}
# config.json keys and keywords that transformers' PreTrainedConfig handles itself rather than as fields (the
# remote-code map, declared pipelines, keywords its __init__ and from_dict take away)
TRANSFORMERS_CONFIG_KEYS = ("auto_map", "custom_pipelines", "attn_implementation", "experts_implementation",
                            "quantization_config", "name_or_path", "return_unused_kwargs", "kwargs")
BOOLEAN_FIELDS = ("scale_embedding", "use_cache", "tie_word_embeddings", "position_randomization_at_inference",
                  "cross_attention_length_scaling", "keep_absolute_positions", "is_encoder_decoder")


def stack_field_alias(encoder_field: str, decoder_field: str) -> property:
    """One of transformers' common names for a stack's size (`STACK_FIELD_ALIASES`): it stands for `encoder_field` in
    an encoder-decoder config (transformers reads the decoder's through `get_text_config(decoder=True)`) and for
    `decoder_field` in a causal LM's (`is_encoder_decoder` false), whose decoder is the whole model: the KV cache that
    transformers builds from `num_hidden_layers` then has one layer per decoder layer. Given as a keyword, the alias
    sets the field of the config being built: `RelPosTransformerConfig(num_hidden_layers=2)` sets `encoder_layers`
    (build a causal LM's config with `is_encoder_decoder=False` for it to set `decoder_layers`)."""

    def field(config: PreTrainedConfig) -> str:
        return encoder_field if config.is_encoder_decoder else decoder_field

    def get(config: PreTrainedConfig) -> Any:
        return getattr(config, field(config))

    def set_(config: PreTrainedConfig, value: Any) -> None:
        setattr(config, field(config), value)

    return property(get, set_, doc=f"`{encoder_field}`, or `{decoder_field}` in a causal LM's config.")


# transformers' common names of one stack's sizes -> the encoder's and the decoder's field (`stack_field_alias`)
STACK_FIELD_ALIASES = {"num_hidden_layers": ("encoder_layers", "decoder_layers"),
                       "num_attention_heads": ("encoder_attention_heads", "decoder_attention_heads")}


def deprecated_field_alias(old: str, new: str) -> property:
    """The config attribute `old`, a deprecated alias of the field `new`: reading or setting it warns (FutureWarning)
    and reads or sets `new`."""

    def get(config: PreTrainedConfig) -> Any:
        warn_renamed(old, new)
        return getattr(config, new)

    def set_(config: PreTrainedConfig, value: Any) -> None:
        warn_renamed(old, new)
        setattr(config, new, value)

    return property(get, set_, doc=f"Deprecated alias of `{new}`.")


class OtherModelTypeError(ValueError):
    """A config of another model (its `model_type`, e.g. marian) given where a RelPosTransformerConfig is read."""

    def __init__(self, model_type: str, expected: str) -> None:
        super().__init__(f"config model_type is {model_type!r}; RelPosTransformerConfig needs {expected!r}")
        self.model_type = model_type


class RelPosTransformerConfig(PreTrainedConfig):
    r"""Configuration of `RelPosTransformerModel` / `RelPosTransformerForConditionalGeneration`.

    Field names follow Marian/BART. Position fields:

    - `position_scheme`: a scheme of `hf_relpos.POSITION_SCHEMES` (the built-in ones, or one registered with
      `hf_relpos.register_position_scheme`). Self-attention only: cross-attention has no positions (Shaw et al. 2018).
      Its deprecated alias `attention_type` (keyword, attribute, config.json key) still works, with a FutureWarning.
    - `layer_norm_position`: `"post"` (Vaswani et al. 2017) or `"pre"` (Xiong et al. 2020).
    - The fields the chosen scheme declares (`PositionScheme.config_fields`, with their defaults, help and
      validation; e.g. Shaw's `max_relative_position`): top-level attributes, saved in config.json. A field only
      other registered schemes declare is refused as a keyword unless it has its default
      (`refuse_unread_scheme_fields`), then dropped; in a saved config.json (earlier versions saved every scheme's) it
      is checked and dropped.
    - `embedding_init_std`: std of the token embeddings at initialisation; null (the default) draws them
      N(0, d_model^-0.5) (Vaswani et al. 2017, fairseq: scaled by sqrt(d_model) they start at the sinusoids' unit
      size), a number N(0, embedding_init_std) (transformers' Marian/BART draw them at init_std, 0.02).
    - `mem_len`: Transformer-XL memory length of `RelPosTransformerForCausalLM` (0 = none; the encoder-decoder
      refuses more).
    - `position_randomization_max`: randomized positions in training for every scheme (Ruoss et al. 2023): each
      stack in training mode places its tokens at a sorted random subset of 0 .. position_randomization_max - 1
      instead of 0 .. n-1; evaluation and generation use the ordinary positions (null = off, the default; at most
      `MAX_POSITIONS`, 65536: a draw permutes that many positions).
    - `self_attention_window`: local self-attention for every scheme: query i attends only to the keys j with
      |i - j| <= self_attention_window (in the decoder also j <= i), in the encoder and the decoder; cross-attention
      still sees the whole source (null = the whole sequence, the default). With a relative scheme a token's
      states then depend on its neighbourhood only, never on the length of the sequence. Mistral's `sliding_window`,
      made symmetric in the encoder.
    - `cross_attention_length_scaling`: multiply the cross-attention logits of each example by log m, m = its number
      of source tokens (Chiang & Cholak 2022, "Overcoming a Theoretical Limitation of Self-Attention"; the
      "scalable softmax" of Nakanishi 2025). A key whose logit leads the m - 1 others by d gets 1 / (1 + (m - 1)
      e^-d) of plain softmax, less and less as the source grows; scaled, 1 / (1 + (m - 1) m^-d), which tends to 1
      for d > 1 (false = off, the default).
    - `keep_absolute_positions`: add the sinusoidal absolute positions of the `absolute` scheme (Vaswani et al. 2017,
      sec. 3.5; Marian's) to the scaled token embeddings under any other scheme, whose terms then come on top of them
      (false = off, the default). A scheme with an embedding-level encoding of its own (`absolute`) refuses it: the
      encodings would be added twice. Converting a trained MarianMT model with it
      (`hf_relpos.tools.convert --keep_absolute_positions`) keeps what the model learned to read; the relative terms start
      neutral and fine-tuning can only add (docs/conversion.md).
    - `absolute_positions_scale`: the factor of those kept sinusoids, in [0, 1] (1, the default: as trained). The
      training argument `fade_absolute_positions` lowers it step by step to 0, where the model relies on its relative
      terms alone; a model saved at 0 computes exactly what the same weights compute without
      `keep_absolute_positions`. Needs `keep_absolute_positions` unless it is 1.
    - `position_randomization_at_inference`: randomize in evaluation and generation too, as Ruoss et al.'s code does
      (false = off, the default; needs `position_randomization_max`). Every forward call draws afresh, except the
      decoder in `generate`, which keeps one draw for the whole output (`PositionDraw`, made for generate's
      max_length) so that cached and uncached decoding agree; draws come from torch's global generator, so
      `torch.manual_seed` makes them reproducible.

    Size and training fields (Marian's names):

    - `d_model`: the width of the token embeddings and of every layer's input and output (Vaswani et al.'s d_model);
      a multiple of each stack's number of heads.
    - `encoder_layers`: the number of layers of the encoder.
    - `decoder_layers`: the number of layers of the decoder.
    - `encoder_attention_heads`: attention heads in each encoder layer (d_model / heads per head).
    - `decoder_attention_heads`: attention heads in each decoder layer, self- and cross-attention.
    - `encoder_ffn_dim`: the inner width of each encoder layer's feed-forward network (d_ff).
    - `decoder_ffn_dim`: the inner width of each decoder layer's feed-forward network (d_ff).
    - `activation_function`: the feed-forward networks' non-linearity in both stacks (a name in transformers'
      `ACT2FN`: relu as in Vaswani et al., gelu as in Marian).
    - `dropout`: dropout on the embeddings and on each sublayer's output before the residual addition (P_drop).
    - `attention_dropout`: dropout on the attention probabilities (or on the keys, see below).
    - `attention_dropout_kind`: what attention dropout drops. `"probabilities"` (the default): standard dropout on
      the attention probabilities after the softmax (zeroed with probability p, the others scaled by 1 / (1 - p)).
      `"keys"`: each score (batch entry, head, query, key) is masked before the softmax with probability p, so each
      row renormalises over the keys it keeps; a query that loses every key outputs zeros. The keep decision is a
      counter-based hash of (seed, indices), one seed per attention call from torch's generator, so FlexAttention
      computes it inside its kernel and recomputes it in the backward: the dropout of the fused path
      (`flex_attention` refuses probability dropout). A different regulariser, not yet measured against the
      default (docs/training.md).
    - `activation_dropout`: dropout after the feed-forward networks' non-linearity.
    - `init_std`: std of the normal draw of every linear weight at initialisation (and of the schemes' learned
      parameters unless a scheme says otherwise).
    - `scale_embedding`: multiply the token embeddings by sqrt(d_model) before positions are added (Vaswani et al.
      2017, sec. 3.4).
    - `max_position_embeddings`: the longest target the training app lets evaluation generate; no scheme limits the
      input length by it (every built-in scheme computes its positions for any length).
    - `use_cache`: return the key/value cache from the decoder, for fast step-by-step generation.
    - `tie_word_embeddings`: share one matrix between source embeddings, target embeddings and the output projection
      (Vaswani et al. 2017, sec. 3.4); this needs a joint source-target vocabulary.

    transformers' common names read and set these fields: `hidden_size` is `d_model`; `num_hidden_layers` and
    `num_attention_heads` are the encoder's `encoder_layers` and `encoder_attention_heads`, and in a causal LM's
    config (`is_encoder_decoder` false, as `RelPosTransformerForCausalLM` saves it) the decoder's.
    """

    model_type = "relpos_transformer"
    # outputs the Trainer leaves out of eval predictions: the KV cache (under both of its names), XL memory
    keys_to_ignore_at_inference = ["past_key_values", "cache", "mems"]
    attribute_map = {"hidden_size": "d_model"}   # num_hidden_layers, num_attention_heads: STACK_FIELD_ALIASES

    vocab_size: int = 32768
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    activation_function: str = "relu"
    dropout: float = 0.1
    attention_dropout: float = 0.0
    attention_dropout_kind: str = "probabilities"
    activation_dropout: float = 0.0
    init_std: float = 0.02
    embedding_init_std: float | None = None
    scale_embedding: bool = True
    max_position_embeddings: int = 1024
    use_cache: bool = True
    is_encoder_decoder: bool = True
    pad_token_id: int | None = 0
    eos_token_id: int | None = 1
    bos_token_id: int | None = 2
    decoder_start_token_id: int | None = 2
    tie_word_embeddings: bool = True
    position_scheme: str = "directional"
    layer_norm_position: str = "post"
    mem_len: int = 0
    position_randomization_max: int | None = None
    self_attention_window: int | None = None
    position_randomization_at_inference: bool = False
    cross_attention_length_scaling: bool = False
    keep_absolute_positions: bool = False
    absolute_positions_scale: float = 1.0

    attention_type = deprecated_field_alias("attention_type", "position_scheme")
    num_hidden_layers = stack_field_alias(*STACK_FIELD_ALIASES["num_hidden_layers"])
    num_attention_heads = stack_field_alias(*STACK_FIELD_ALIASES["num_attention_heads"])

    def __new__(cls, *args, **kwargs) -> RelPosTransformerConfig:
        """Checks the deprecated field names (`rename_deprecated_fields`), the common names
        (`refuse_conflicting_aliases`), the generation settings (`refuse_generation_settings`) and the fields of other
        schemes (`refuse_unread_scheme_fields`) among the keywords while it can still tell a field given from a field
        left at its default; `__post_init__` then moves the values of the first two."""
        keywords = rename_deprecated_fields(kwargs)
        refuse_conflicting_aliases(kwargs, builds_encoder_decoder(kwargs))
        refuse_generation_settings(kwargs)
        refuse_unread_scheme_fields(keywords.get("position_scheme", cls.position_scheme), keywords)
        return super().__new__(cls)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs) -> RelPosTransformerConfig:
        """Like `PreTrainedConfig.from_pretrained`, but a folder without config.json is an error (transformers
        silently returns the default config, which could pair a checkpoint with the wrong architecture), and so is a
        config.json that holds another JSON value than an object of field: value."""
        config_dict, _ = cls.get_config_dict(pretrained_model_name_or_path, **dict(kwargs))
        if not config_dict:
            raise OSError(f"{pretrained_model_name_or_path} has no config.json: it is not a saved hf_relpos model")
        if not isinstance(config_dict, dict):
            raise OSError(f"{pretrained_model_name_or_path}: its config.json must hold a JSON object of field: value, "
                          f"got {type(config_dict).__name__}")
        return super().from_pretrained(pretrained_model_name_or_path, **kwargs)

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs) -> RelPosTransformerConfig:
        """Refuses another model's config (transformers only warns), so no folder loads as the wrong model, and
        validates again after the keyword overrides (transformers sets those after `__post_init__` has run); an
        override transformers leaves unused is refused as a misspelled field as in the constructor
        (`_refuse_misspelled_fields`; transformers drops it). The saved fields of other schemes are checked and
        dropped; an override of one is refused as a keyword is (`refuse_unread_scheme_fields`)."""
        model_type = config_dict.get("model_type", cls.model_type)
        if model_type != cls.model_type:
            raise OtherModelTypeError(model_type, cls.model_type)
        return_unused_kwargs = kwargs.pop("return_unused_kwargs", False)
        refuse_conflicting_aliases(kwargs, builds_encoder_decoder(kwargs, config_dict))
        # an override of the scheme or of a scheme's field joins the saved fields before the config is built, so the
        # constructor keeps the fields of the scheme the config ends with (transformers sets overrides afterwards)
        # and refuses an override of another scheme's (`refuse_unread_scheme_fields`)
        scheme_overrides = rename_deprecated_fields(
            {key: kwargs.pop(key) for key in [*kwargs] if key in {"position_scheme", *DEPRECATED_FIELDS,
                                                                  *scheme_config_fields()}})
        # a saved config's generation settings (a config.json of before GenerationConfig) are read by transformers
        # from the file for the model's generation config, never kept by the config; its fields of other schemes
        # (configs saved by earlier versions hold every scheme's, with any value) are checked and dropped
        saved = rename_deprecated_fields(config_dict)
        position_scheme = scheme_overrides.get("position_scheme", saved.get("position_scheme", cls.position_scheme))
        scheme_fields = scheme_config_fields()
        for key, value in saved.items():
            if key in scheme_fields:
                scheme_fields[key].check(value)
        config_dict = {key: value for key, value in {**cls.held_fields(position_scheme, saved),
                                                     **scheme_overrides}.items() if key not in GENERATION_SETTINGS}
        config, unused = super().from_dict(config_dict, **kwargs, return_unused_kwargs=True)
        _refuse_misspelled_fields(unused, config.tie_word_embeddings)
        unused = {key: value for key, value in unused.items() if key not in scheme_config_fields()}   # checked above
        config._validate_relpos()
        return (config, unused) if return_unused_kwargs else config

    @classmethod
    def from_json_file(cls, json_file: str | os.PathLike) -> RelPosTransformerConfig:
        """The config of a config.json file, read as `from_dict` reads one (transformers' builds it directly from the
        file's keys, past `from_dict`'s checks: another model's config, a saved generation setting)."""
        return cls.from_dict(cls._dict_from_json_file(json_file))

    def __post_init__(self, **kwargs) -> None:
        for alias, name in {**self.attribute_map, **DEPRECATED_FIELDS}.items():  # validated as the field they stand for
            if alias in kwargs:
                setattr(self, name, kwargs.pop(alias))
        for alias in STACK_FIELD_ALIASES:   # the encoder's or the decoder's field, by is_encoder_decoder
            if alias in kwargs:
                setattr(self, alias, kwargs.pop(alias))
        get_scheme_class(self.position_scheme)   # an unregistered scheme is the error, not its fields looking unknown
        own = {field.name for field in self._scheme_fields()}
        for name, field in scheme_config_fields().items():
            if name in kwargs:
                value = kwargs.pop(name)
                if name in own:
                    setattr(self, name, value)
                else:   # another scheme's field at its default (`__new__` refuses any other value): checked, dropped
                    field.check(value)
        _refuse_misspelled_fields(kwargs, self.tie_word_embeddings)
        self._validate_relpos()
        super().__post_init__(**kwargs)

    def _scheme_fields(self) -> tuple[SchemeField, ...]:
        """The config fields of the chosen scheme (none for a name that is not registered)."""
        return _fields_of_scheme(self.position_scheme)

    @staticmethod
    def held_fields(position_scheme: Any, values: dict[str, Any]) -> dict[str, Any]:
        """`values` without the fields that a config of `position_scheme` drops: those other registered schemes
        declare (a recipe may set Shaw's `max_relative_position` whatever its scheme, at its default:
        `refuse_unread_scheme_fields`)."""
        own = {field.name for field in _fields_of_scheme(position_scheme)}
        return {key: value for key, value in values.items() if key in own or key not in scheme_config_fields()}

    def to_dict(self) -> dict[str, Any]:
        """transformers' dict (what config.json holds), with the fields of the chosen scheme only."""
        return self.held_fields(self.position_scheme, super().to_dict())

    def validate(self) -> None:
        """transformers' checks (its `@strict` validators), then this config's (`_validate_relpos`, and
        `_refuse_misspelled_fields` on the keys config.json would hold beside the fields, as loading it checks them): a
        field set to a bad value after construction (`config.dropout = 5`, `config.update({"dropuot": 0.3})`) is the
        ValueError here. transformers runs it when saving, after it has made the folder and copied the remote code
        into it."""
        super().validate()
        self._validate_relpos()
        fields = {field.name for field in dataclasses.fields(self)}
        _refuse_misspelled_fields({key: value for key, value in self.to_dict().items() if key not in fields},
                                  self.tie_word_embeddings)

    def save_pretrained(self, save_directory: str | os.PathLike, *args, **kwargs) -> None:
        """`validate` first, so that a config that `from_pretrained` would refuse writes nothing."""
        self.validate()
        super().save_pretrained(save_directory, *args, **kwargs)

    def _validate_relpos(self) -> None:
        """One clear ValueError per bad value, naming the field and what is allowed. The chosen scheme's fields that
        are not set (at construction, or after `position_scheme` changed) take their defaults first."""
        get_scheme_class(self.position_scheme)
        for field in self._scheme_fields():
            if field.name not in self.__dict__:
                setattr(self, field.name, copy.deepcopy(field.default))
        if self.layer_norm_position not in LAYER_NORM_POSITIONS:
            raise ValueError(
                f"layer_norm_position must be one of {list(LAYER_NORM_POSITIONS)}, got {self.layer_norm_position!r}"
            )
        if self.attention_dropout_kind not in ATTENTION_DROPOUT_KINDS:
            raise ValueError(f"attention_dropout_kind must be one of {list(ATTENTION_DROPOUT_KINDS)}, got "
                             f"{self.attention_dropout_kind!r}")
        if not isinstance(self.activation_function, str) or self.activation_function not in ACT2FN:
            raise ValueError(f"activation_function must be one of {sorted(ACT2FN)}, got {self.activation_function!r}")
        for name in ("vocab_size", "d_model", "encoder_attention_heads", "decoder_attention_heads",
                     "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings"):
            require_int(name, getattr(self, name), minimum=1)
        for name in ("encoder_layers", "decoder_layers", "mem_len"):
            require_int(name, getattr(self, name), minimum=0)
        randomization = self.position_randomization_max
        require_int("position_randomization_max", randomization, minimum=1, null_means="off", maximum=MAX_POSITIONS)
        require_int("self_attention_window", self.self_attention_window, minimum=1, null_means="the whole sequence")
        for heads_field in ("encoder_attention_heads", "decoder_attention_heads"):
            heads = getattr(self, heads_field)
            if self.d_model % heads:
                raise ValueError(f"d_model ({self.d_model}) must be divisible by {heads_field} ({heads})")
        for name in BOOLEAN_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.keep_absolute_positions and get_scheme_class(self.position_scheme).embeds_positions():
            raise ValueError(f"keep_absolute_positions must be false with position_scheme {self.position_scheme!r}: that "
                             "scheme adds an embedding-level position encoding of its own, so the sinusoids would be "
                             "added twice (keep_absolute_positions adds them under a scheme that has none)")
        scale = self.absolute_positions_scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0.0 <= scale <= 1.0:
            raise ValueError(f"absolute_positions_scale must be a number in [0, 1], got {scale!r}")
        if scale != 1.0 and not self.keep_absolute_positions:
            raise ValueError(f"absolute_positions_scale ({scale!r}) scales the sinusoids of keep_absolute_positions, "
                             "which is false: set keep_absolute_positions true or leave absolute_positions_scale at 1")
        if self.position_randomization_at_inference and randomization is None:
            raise ValueError("position_randomization_at_inference needs position_randomization_max (the range of the "
                             "randomized positions), which is null")
        require_positive_number("init_std", self.init_std)
        require_positive_number("embedding_init_std", self.embedding_init_std, null_means="d_model^-0.5")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            require_probability(name, getattr(self, name))
        for name in ("pad_token_id", "eos_token_id", "bos_token_id", "decoder_start_token_id"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 0 <= value < self.vocab_size):
                raise ValueError(f"{name} must be None or an id in [0, vocab_size={self.vocab_size}), got {value!r}")
        for field in self._scheme_fields():
            field.check(getattr(self, field.name))
        get_scheme_class(self.position_scheme).check_config(self)


# no scheme may declare a config field under a name of the config's own, nor under one that transformers reads from a
# config: a generation setting (generate would take it up from the model config, and save_pretrained refuses it there)
# or a key that saving and loading handle themselves (the built-in schemes, registered by the imports above before the
# class existed, are checked now)
reserve_config_names({*(name for name in dir(RelPosTransformerConfig) if not name.startswith("_")),
                      *(field.name for field in dataclasses.fields(RelPosTransformerConfig)),
                      *RelPosTransformerConfig.attribute_map, *STACK_FIELD_ALIASES, *DEPRECATED_FIELDS})
reserve_config_names(GenerationConfig().to_dict(), "a generation setting of transformers' GenerationConfig (generate "
                                                   "would read it from the model config, and save_pretrained refuses it "
                                                   "there)")
reserve_config_names(TRANSFORMERS_CONFIG_KEYS, "a key transformers' PreTrainedConfig reads or writes itself when a "
                                               "config is built, saved or loaded")


def _fields_of_scheme(position_scheme: Any) -> tuple[SchemeField, ...]:
    """The config fields `position_scheme` declares (none for a name that is not registered)."""
    scheme_class = POSITION_SCHEMES.get(position_scheme) if isinstance(position_scheme, str) else None
    return scheme_class.config_fields if scheme_class is not None else ()


def builds_encoder_decoder(*sources: Mapping[str, Any]) -> bool:
    """Whether config keywords or a saved config's dict build an encoder-decoder config: `is_encoder_decoder` of the
    first of `sources` that gives it, else the field's default."""
    for values in sources:
        if "is_encoder_decoder" in values:
            return bool(values["is_encoder_decoder"])
    return RelPosTransformerConfig.is_encoder_decoder


def refuse_unread_scheme_fields(position_scheme: Any, values: dict[str, Any]) -> None:
    """One ValueError naming a field of `values` (config keywords, a recipe's `model:` section) that only other
    schemes than `position_scheme` declare, given another value than its default: a config of `position_scheme`
    drops it, so it would do nothing. At its default it is dropped without a word (it then says what the config
    computes anyway, as the recipes written for every scheme say `max_relative_position: 16`)."""
    if not (isinstance(position_scheme, str) and position_scheme in POSITION_SCHEMES):
        return   # an unregistered name is the error (`get_scheme_class`), not its fields
    own = {field.name for field in _fields_of_scheme(position_scheme)}
    for name, value in values.items():
        field = scheme_config_fields().get(name)
        if field is None or name in own:
            continue
        field.check(value)
        if value != field.default:
            owners = sorted(scheme for scheme, scheme_class in POSITION_SCHEMES.items()
                            if any(declared.name == name for declared in scheme_class.config_fields))
            raise ValueError(f"{name}={value!r} is a field of position_scheme {' / '.join(map(repr, owners))}, which "
                             f"position_scheme {position_scheme!r} does not read: remove {name} (or set "
                             f"position_scheme {owners[0]!r})")


def field_named(name: str, is_encoder_decoder: bool = RelPosTransformerConfig.is_encoder_decoder) -> str:
    """The config field that the keyword `name` sets: `name`, or the field its alias stands for (`attribute_map`,
    `STACK_FIELD_ALIASES`: the encoder's field in an encoder-decoder config, `DEPRECATED_FIELDS`)."""
    if name in STACK_FIELD_ALIASES:
        return STACK_FIELD_ALIASES[name][0 if is_encoder_decoder else 1]
    return {**RelPosTransformerConfig.attribute_map, **DEPRECATED_FIELDS}.get(name, name)


def rename_deprecated_fields(values: dict[str, Any]) -> dict[str, Any]:
    """`values` (config keywords, a config.json's dict, a recipe's `model:` section) with each deprecated field name
    of `DEPRECATED_FIELDS` replaced by its current name, with a FutureWarning; both names with different values are
    one ValueError."""
    renamed = dict(values)
    for old, new in DEPRECATED_FIELDS.items():
        if old not in renamed:
            continue
        value = renamed.pop(old)
        if new in renamed and renamed[new] != value:
            raise ValueError(f"{old} is the deprecated name of {new}, and they differ ({old}={value!r}, "
                             f"{new}={renamed[new]!r}): give {new} only")
        warn_renamed(old, new)
        renamed[new] = value
    return renamed


# The keywords that transformers' PreTrainedConfig takes away as generation settings (GenerationConfig's) without
# keeping them, but for this config's own fields (use_cache); a constant, as configs are also built inside a compiled
# forward (a cache's get_text_config), where computing it would break the graph
GENERATION_SETTINGS = frozenset(GenerationConfig._get_default_generation_params()) - {
    field.name for field in dataclasses.fields(RelPosTransformerConfig)}


def refuse_generation_settings(keywords: dict[str, Any]) -> None:
    """One ValueError naming the generation settings among a config's keywords: transformers drops them without a
    word, so RelPosTransformerConfig(num_beams=4) generated with one beam."""
    given = sorted(key for key in keywords if key in GENERATION_SETTINGS)
    if given:
        raise ValueError(f"{', '.join(given)}: generation setting(s), not config fields (the config would drop them): "
                         "set them on model.generation_config, or pass them to generate")


def refuse_conflicting_aliases(values: dict[str, Any], is_encoder_decoder: bool) -> None:
    """One ValueError where `values` (config keywords, a config.json's dict, from_pretrained's overrides) give a
    common name of transformers (`attribute_map`, `STACK_FIELD_ALIASES`) and the field it stands for (`field_named`,
    by `is_encoder_decoder`) different values: one of them would silently win."""
    for alias in (*RelPosTransformerConfig.attribute_map, *STACK_FIELD_ALIASES):
        field = field_named(alias, is_encoder_decoder)
        if alias in values and field in values and values[alias] != values[field]:
            raise ValueError(f"{alias} stands for {field}, and they differ ({alias}={values[alias]!r}, "
                             f"{field}={values[field]!r}): give {field} only")


# Marian/BART config fields this model does not have -> (the value that says what it computes, given the config's
# tie_word_embeddings; what it computes in words): given with another value, the field would be kept by transformers
# and silently do nothing.
FIXED_MARIAN_FIELDS = {
    "encoder_layerdrop": (lambda tied: 0.0, "no LayerDrop"),
    "decoder_layerdrop": (lambda tied: 0.0, "no LayerDrop"),
    "layer_norm_eps": (lambda tied: 1e-5, "torch's LayerNorm epsilon, 1e-5"),
    "share_encoder_decoder_embeddings": (lambda tied: tied, "source embeddings, target embeddings and output layer "
                                                            "tied with tie_word_embeddings true, all three apart with "
                                                            "false"),
    "normalize_before": (lambda tied: None, "layer_norm_position 'pre' or 'post'"),
    "add_final_layer_norm": (lambda tied: None, "layer_norm_position 'pre' adds one after each stack"),
    "normalize_embedding": (lambda tied: False, "no layer norm on the embeddings"),
}


def _refuse_misspelled_fields(extra: dict, tie_word_embeddings: bool) -> None:
    """transformers keeps unknown config keys (for its own bookkeeping); a near-miss of one of our fields is a typo
    that would silently fall back to the default, and a Marian/BART field this model does not implement
    (FIXED_MARIAN_FIELDS) set to another value than what it computes would silently do nothing: both are errors."""
    for key, value in extra.items():
        if key in FIXED_MARIAN_FIELDS:
            computed, meaning = FIXED_MARIAN_FIELDS[key]
            if value != computed(tie_word_embeddings):
                raise ValueError(f"config field {key}={value!r} is not implemented by RelPosTransformerConfig (it "
                                 f"computes {meaning}); remove it")
    scheme_fields = scheme_config_fields()
    own_fields = [field.name for field in dataclasses.fields(RelPosTransformerConfig)] + list(scheme_fields)
    for key in extra:
        if key in scheme_fields:   # a scheme's field (the chosen scheme's, beside the dataclass fields): checked
            scheme_fields[key].check(extra[key])
            continue
        match = closest_name(key, own_fields, cutoff=0.85)
        if match:
            raise ValueError(f"unknown config field {key!r}; did you mean {match!r}?")

