"""hf_relpos: relative position self-attention (Shaw et al. 2018, Transformer-XL, DiSAN, T5, ALiBi, RoPE) for
Hugging Face encoder-decoder Transformers, with a pluggable registry of position schemes.

Importing it registers the models and the tokenizer class of its trained tokenizers (`RelPosTokenizer`) with the Auto
classes (their public `register`) and the "translation" pipeline task; it needs torch and transformers only. The
translation application (`hf_relpos.translation`, train_translation.py, scoring, model cards) needs the
`hf_relpos[train]` extra."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

from .model import positions as _positions
from .model.configuration_relpos import RelPosTransformerConfig
from .model.modeling_relpos import (
    RelPosTransformerForCausalLM,
    RelPosTransformerForConditionalGeneration,
    RelPosTransformerModel,
    RelPosTransformerPreTrainedModel,
    shift_tokens_right,
)
from .model.positions import (
    POSITION_SCHEMES,
    AttentionTerms,
    PositionContext,
    PositionDraw,
    PositionScheme,
    RelativeBias,
    RelativeValues,
    SchemeCard,
    SchemeField,
    boolean_field,
    integer_field,
    number_field,
    query_and_key_positions,
    random_positions,
    register_attention,  # noqa: F401 (the deprecated name of register_position_scheme, not in __all__)
    register_position_scheme,
    rel_shift,
    relative_position_index,
    sinusoids,
)
from .publish.pipeline_relpos import TranslationPipeline, register_translation_task
from .tokenization_relpos import RelPosTokenizer

AutoConfig.register(RelPosTransformerConfig.model_type, RelPosTransformerConfig, exist_ok=True)
AutoModel.register(RelPosTransformerConfig, RelPosTransformerModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(RelPosTransformerConfig, RelPosTransformerForConditionalGeneration, exist_ok=True)
AutoModelForCausalLM.register(RelPosTransformerConfig, RelPosTransformerForCausalLM, exist_ok=True)
AutoTokenizer.register(RelPosTransformerConfig, tokenizer_class=RelPosTokenizer, exist_ok=True)
RelPosTransformerConfig.register_for_auto_class()
RelPosTransformerModel.register_for_auto_class("AutoModel")
RelPosTransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
RelPosTransformerForCausalLM.register_for_auto_class("AutoModelForCausalLM")
register_translation_task()

__all__ = [
    "POSITION_SCHEMES",
    "AttentionTerms",
    "PositionContext",
    "PositionDraw",
    "PositionScheme",
    "RelPosTokenizer",
    "RelPosTransformerConfig",
    "RelPosTransformerForCausalLM",
    "RelPosTransformerForConditionalGeneration",
    "RelPosTransformerModel",
    "RelPosTransformerPreTrainedModel",
    "RelativeBias",
    "RelativeValues",
    "SchemeCard",
    "SchemeField",
    "TranslationPipeline",
    "boolean_field",
    "integer_field",
    "number_field",
    "query_and_key_positions",
    "random_positions",
    "register_position_scheme",
    "rel_shift",
    "relative_position_index",
    "shift_tokens_right",
    "sinusoids",
]


def __getattr__(name: str):
    """The deprecated names of `hf_relpos.model.positions` (`DEPRECATED_ATTRIBUTES`), each with its FutureWarning."""
    if name in _positions.DEPRECATED_ATTRIBUTES:
        current = _positions.DEPRECATED_ATTRIBUTES[name]
        _positions.warn_renamed(name, current)
        return getattr(_positions, current)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
