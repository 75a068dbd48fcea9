"""RelPosTransformer: a Marian-shaped encoder-decoder whose self-attention position scheme comes from the registry.

Read top to bottom: attention -> layers -> stacks -> base model -> heads. The model never tests a scheme's name:
each stack holds one `PositionScheme` (`config.attention_type`) that embeds (`embed`) and attends (`attend`);
cross-attention uses the plain `attention_core` with no positions (Shaw et al. 2018, sec. 3).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import CrossEntropyLoss
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    CausalLMOutputWithPast,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)

from .configuration_relpos import RelPosTransformerConfig
from .positions import PositionScheme, attention_core, get_scheme_class


def shift_tokens_right(input_ids: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher-forcing decoder inputs: labels shifted one step right behind the start token; -100 becomes pad."""
    if pad_token_id is None or decoder_start_token_id is None:
        raise ValueError("config.pad_token_id and config.decoder_start_token_id must be set to train with labels")
    shifted = input_ids.new_zeros(input_ids.shape)
    shifted[:, 1:] = input_ids[:, :-1].clone()
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


def padding_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """[B, m] 1/0 mask -> boolean [B, 1, 1, m] (True = real key), or None when nothing is padded."""
    if attention_mask is None:
        return None
    return attention_mask.bool()[:, None, None, :]


def causal_mask(
    query_length: int, key_length: int, past_length: int, key_padding: torch.Tensor | None, device: torch.device
) -> torch.Tensor:
    """Boolean [B|1, 1, n, m]: query i (absolute position past_length + i) may see keys j <= past_length + i."""
    query_positions = torch.arange(past_length, past_length + query_length, device=device)[:, None]
    allowed = (torch.arange(key_length, device=device)[None, :] <= query_positions)[None, None]
    return allowed if key_padding is None else allowed & key_padding


class RelPosAttention(nn.Module):
    """Multi-head attention. Self-attention delegates the scaled dot product to the stack's position scheme;
    cross-attention (`is_cross_attention`) runs the plain core."""

    def __init__(self, config: RelPosTransformerConfig, num_heads: int, layer_idx: int, is_cross_attention: bool):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_dim = config.d_model // num_heads
        self.layer_idx = layer_idx
        self.is_cross_attention = is_cross_attention
        self.dropout = config.attention_dropout
        self.q_proj = nn.Linear(config.d_model, config.d_model)
        self.k_proj = nn.Linear(config.d_model, config.d_model)
        self.v_proj = nn.Linear(config.d_model, config.d_model)
        self.out_proj = nn.Linear(config.d_model, config.d_model)

    def _heads(self, states: torch.Tensor) -> torch.Tensor:
        return states.view(*states.shape[:-1], self.num_heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        hidden_states: torch.Tensor,
        allowed: torch.Tensor | None,
        positions: PositionScheme | None = None,
        key_value_states: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        query_offset: int = 0,
        output_attentions: bool = False,
        memory: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`memory` [B, M, d] (Transformer-XL): keys and values over [memory; current segment], queries over the
        current segment only."""
        query = self._heads(self.q_proj(hidden_states))
        cache = past_key_values
        if isinstance(past_key_values, EncoderDecoderCache):
            cache = past_key_values.cross_attention_cache if self.is_cross_attention else past_key_values.self_attention_cache

        if self.is_cross_attention and cache is not None and past_key_values.is_updated.get(self.layer_idx):
            key, value = cache.layers[self.layer_idx].keys, cache.layers[self.layer_idx].values
        else:
            source = key_value_states if self.is_cross_attention else hidden_states
            if memory is not None:
                source = torch.cat([memory.to(source.dtype), source], dim=1)
            key, value = self._heads(self.k_proj(source)), self._heads(self.v_proj(source))
            if cache is not None:
                key, value = cache.update(key, value, self.layer_idx)
                if self.is_cross_attention:
                    past_key_values.is_updated[self.layer_idx] = True

        dropout = self.dropout if self.training else 0.0
        if positions is None:
            output, weights = attention_core(
                query, key, value, allowed, dropout=dropout,
                kernel=self.config._attn_implementation or "sdpa", output_attentions=output_attentions,
            )
        else:
            output, weights = positions.attend(
                self.layer_idx, query, key, value, allowed, query_offset, dropout, output_attentions
            )
        output = output.transpose(1, 2).reshape(*hidden_states.shape[:-1], -1)
        return self.out_proj(output), weights


class RelPosFeedForward(nn.Module):
    """FFN(x) = act(x W1 + b1) W2 + b2 (Vaswani et al. 2017, eq. 2)."""

    def __init__(self, config: RelPosTransformerConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.activation_fn = ACT2FN[config.activation_function]
        self.activation_dropout = config.activation_dropout

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.activation_fn(self.fc1(hidden_states))
        hidden_states = nn.functional.dropout(hidden_states, p=self.activation_dropout, training=self.training)
        return self.fc2(hidden_states)


class RelPosLayer(GradientCheckpointingLayer):
    """One encoder or decoder layer: self-attention, optional cross-attention, feed-forward, each wrapped as
    Post-LN `LN(x + Dropout(f(x)))` (Vaswani et al. 2017) or Pre-LN `x + Dropout(f(LN(x)))` (Xiong et al. 2020)."""

    def __init__(self, config: RelPosTransformerConfig, layer_idx: int, num_heads: int, ffn_dim: int, cross: bool):
        super().__init__()
        self.pre_norm = config.layer_norm_position == "pre"
        self.dropout = config.dropout
        self.self_attn = RelPosAttention(config, num_heads, layer_idx, is_cross_attention=False)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.encoder_attn = RelPosAttention(config, num_heads, layer_idx, is_cross_attention=True) if cross else None
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model) if cross else None
        self.feed_forward = RelPosFeedForward(config, ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model)

    def _residual(self, hidden_states: torch.Tensor, norm: nn.LayerNorm, sublayer) -> tuple[torch.Tensor, object]:
        output, extra = sublayer(norm(hidden_states) if self.pre_norm else hidden_states)
        hidden_states = hidden_states + nn.functional.dropout(output, p=self.dropout, training=self.training)
        return (hidden_states if self.pre_norm else norm(hidden_states)), extra

    def forward(
        self,
        hidden_states: torch.Tensor,
        self_allowed: torch.Tensor | None,
        positions: PositionScheme,
        encoder_hidden_states: torch.Tensor | None = None,
        cross_allowed: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        query_offset: int = 0,
        output_attentions: bool = False,
        memory: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        if memory is not None and self.pre_norm:
            memory = self.self_attn_layer_norm(memory)
        hidden_states, self_weights = self._residual(
            hidden_states,
            self.self_attn_layer_norm,
            lambda x: self.self_attn(
                x, self_allowed, positions, past_key_values=past_key_values, query_offset=query_offset,
                output_attentions=output_attentions, memory=memory,
            ),
        )
        cross_weights = None
        if self.encoder_attn is not None and encoder_hidden_states is not None:
            hidden_states, cross_weights = self._residual(
                hidden_states,
                self.encoder_attn_layer_norm,
                lambda x: self.encoder_attn(
                    x, cross_allowed, key_value_states=encoder_hidden_states, past_key_values=past_key_values,
                    output_attentions=output_attentions,
                ),
            )
        hidden_states, _ = self._residual(
            hidden_states, self.final_layer_norm, lambda x: (self.feed_forward(x), None)
        )
        return hidden_states, self_weights, cross_weights


class RelPosStack(nn.Module):
    """Token embedding -> scheme embedding -> dropout -> layers (-> final LayerNorm for Pre-LN).

    The encoder is bidirectional; a decoder (`is_decoder`) is causal, caches keys/values and, with `cross`, attends
    to the encoder output.
    """

    def __init__(self, config: RelPosTransformerConfig, is_decoder: bool, cross: bool):
        super().__init__()
        self.config = config
        self.is_decoder = is_decoder
        num_layers = config.decoder_layers if is_decoder else config.encoder_layers
        num_heads = config.decoder_attention_heads if is_decoder else config.encoder_attention_heads
        ffn_dim = config.decoder_ffn_dim if is_decoder else config.encoder_ffn_dim
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.positions = get_scheme_class(config.attention_type)(
            config, num_layers, num_heads, config.d_model // num_heads, is_causal=is_decoder
        )
        self.layers = nn.ModuleList(
            [RelPosLayer(config, idx, num_heads, ffn_dim, cross=cross) for idx in range(num_layers)]
        )
        self.layer_norm = nn.LayerNorm(config.d_model) if config.layer_norm_position == "pre" else None

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def embed(self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, past_length: int) -> torch.Tensor:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids and inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        hidden_states = self.positions.embed(inputs_embeds * self.embed_scale, past_length)
        return nn.functional.dropout(hidden_states, p=self.config.dropout, training=self.training)

    def run_layers(
        self,
        hidden_states: torch.Tensor,
        self_allowed: torch.Tensor | None,
        output_attentions: bool,
        output_hidden_states: bool,
        encoder_hidden_states: torch.Tensor | None = None,
        cross_allowed: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        query_offset: int = 0,
        memory: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, tuple | None, tuple | None, tuple | None, list[torch.Tensor]]:
        """Returns the output, optional per-layer hidden states / attentions / cross-attentions, and the inputs of
        every layer (what Transformer-XL keeps as memory)."""
        all_hidden, all_self, all_cross, layer_inputs = [], [], [], []
        for idx, layer in enumerate(self.layers):
            layer_inputs.append(hidden_states)
            if output_hidden_states:
                all_hidden.append(hidden_states)
            hidden_states, self_weights, cross_weights = layer(
                hidden_states,
                self_allowed,
                self.positions,
                encoder_hidden_states,
                cross_allowed,
                past_key_values=past_key_values,
                query_offset=query_offset,
                output_attentions=output_attentions,
                memory=None if memory is None else memory[idx],
            )
            all_self.append(self_weights)
            all_cross.append(cross_weights)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        if output_hidden_states:
            all_hidden.append(hidden_states)
        return (
            hidden_states,
            tuple(all_hidden) if output_hidden_states else None,
            tuple(all_self) if output_attentions else None,
            tuple(all_cross) if output_attentions and encoder_hidden_states is not None else None,
            layer_inputs,
        )


class RelPosEncoder(RelPosStack):
    def __init__(self, config: RelPosTransformerConfig):
        super().__init__(config, is_decoder=False, cross=False)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> BaseModelOutput:
        hidden_states = self.embed(input_ids, inputs_embeds, past_length=0)
        hidden_states, all_hidden, all_self, _, _ = self.run_layers(
            hidden_states, padding_mask(attention_mask), bool(output_attentions), bool(output_hidden_states)
        )
        return BaseModelOutput(last_hidden_state=hidden_states, hidden_states=all_hidden, attentions=all_self)


@dataclass
class RelPosDecoderOutput(BaseModelOutputWithPastAndCrossAttentions):
    """Decoder output plus `mems`: per layer, the last `mem_len` layer inputs, detached (Transformer-XL memory)."""

    mems: tuple[torch.Tensor, ...] | None = None


@dataclass
class RelPosCausalLMOutput(CausalLMOutputWithPast):
    """Causal LM output plus `mems` (Transformer-XL memory); in memory mode `mems` is also the generation cache."""

    mems: tuple[torch.Tensor, ...] | None = None


class RelPosDecoder(RelPosStack):
    """Causal decoder. With a KV cache (`past_key_values`) or a Transformer-XL memory (`mems`, the detached inputs
    of every layer for the previous positions), queries start at position `past_length` and see every earlier key."""

    def __init__(self, config: RelPosTransformerConfig, cross: bool = True):
        super().__init__(config, is_decoder=True, cross=cross)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        mems: list[torch.Tensor] | tuple[torch.Tensor, ...] | None = None,
        mem_len: int | None = None,
        **kwargs,
    ) -> RelPosDecoderOutput:
        """`mem_len` (default `config.mem_len`) > 0 returns new `mems`; a longer one at evaluation than in training
        is allowed (Dai et al. 2019, sec. 4). Memory and a KV cache are exclusive: the memory is the cache."""
        mem_len = self.config.mem_len if mem_len is None else mem_len
        if mems is not None and past_key_values is not None and past_key_values.get_seq_length() > 0:
            raise ValueError("Pass either mems (Transformer-XL memory) or past_key_values (KV cache), not both")
        if mems is not None:
            if len(mems) != len(self.layers):
                raise ValueError(f"mems must hold one tensor per layer ({len(self.layers)}), got {len(mems)}")
            past_key_values = None
        elif use_cache and past_key_values is None:
            past_key_values = (
                EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
                if encoder_hidden_states is not None
                else DynamicCache(config=self.config)
            )
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        past_length += mems[0].size(1) if mems is not None else 0
        hidden_states = self.embed(input_ids, inputs_embeds, past_length)
        query_length = hidden_states.size(1)
        key_length = past_length + query_length
        if attention_mask is not None and attention_mask.size(1) != key_length:
            if attention_mask.size(1) == query_length:
                attention_mask = torch.cat([attention_mask.new_ones(attention_mask.size(0), past_length), attention_mask], 1)
            else:
                attention_mask = attention_mask[:, -key_length:]
        self_allowed = causal_mask(
            query_length, key_length, past_length, padding_mask(attention_mask), hidden_states.device
        )
        hidden_states, all_hidden, all_self, all_cross, layer_inputs = self.run_layers(
            hidden_states,
            self_allowed,
            bool(output_attentions),
            bool(output_hidden_states),
            encoder_hidden_states=encoder_hidden_states,
            cross_allowed=padding_mask(encoder_attention_mask),
            past_key_values=past_key_values,
            query_offset=past_length,
            memory=mems,
        )
        new_mems = None
        if mem_len > 0:
            previous = mems if mems is not None else [None] * len(layer_inputs)
            new_mems = tuple(
                (layer_input if old is None else torch.cat([old.to(layer_input.dtype), layer_input], 1))[:, -mem_len:].detach()
                for old, layer_input in zip(previous, layer_inputs, strict=True)
            )
        return RelPosDecoderOutput(
            last_hidden_state=hidden_states,
            past_key_values=past_key_values if use_cache else None,
            hidden_states=all_hidden,
            attentions=all_self,
            cross_attentions=all_cross,
            mems=new_mems,
        )


class RelPosTransformerPreTrainedModel(PreTrainedModel):
    config: RelPosTransformerConfig
    config_class = RelPosTransformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _no_split_modules = ["RelPosLayer"]

    remote_auto_classes: dict[str, str] = {}

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, allow_missing_weights: bool = False, **kwargs):
        """`PreTrainedModel.from_pretrained`, reading safetensors only, that raises instead of filling weights missing
        from the folder with random values (transformers only warns). `allow_missing_weights=True` restores the
        default, e.g. to start a new head from an encoder-decoder checkpoint."""
        kwargs.setdefault("use_safetensors", True)
        return_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(
            pretrained_model_name_or_path, *model_args, output_loading_info=True, **kwargs
        )
        missing = sorted(info["missing_keys"])
        if missing and not allow_missing_weights:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise ValueError(
                f"{pretrained_model_name_or_path} lacks {len(missing)} weight(s) of {cls.__name__} ({shown}): an "
                "incomplete or foreign checkpoint would load with random weights. Pass allow_missing_weights=True "
                "to initialise them on purpose."
            )
        return (model, info) if return_info else model

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Records every Auto class this checkpoint loads into (HF records only the saved class) in `auto_map`, so
        `AutoModel` and the head's Auto class both work with `trust_remote_code=True` alone."""
        auto_map = dict(getattr(self.config, "auto_map", None) or {})
        for auto_class, model_class in self.remote_auto_classes.items():
            auto_map.setdefault(auto_class, f"modeling_relpos.{model_class}")
        self.config.auto_map = auto_map
        return super().save_pretrained(save_directory, *args, **kwargs)

    @classmethod
    def _can_set_attn_implementation(cls) -> bool:
        """Every attention call reads `config._attn_implementation`, so `set_attn_implementation` works at any time."""
        return True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """HF defaults (N(0, init_std) linears, unit LayerNorms), token embeddings N(0, d_model^-0.5) as in
        Vaswani et al./fairseq so that scaled embeddings and tied logits start at unit scale, and each position
        scheme's own parameters."""
        if isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=self.config.d_model**-0.5)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        else:
            super()._init_weights(module)
        if isinstance(module, PositionScheme):
            module.init_parameters(self.config.init_std)


class RelPosTransformerModel(RelPosTransformerPreTrainedModel):
    """Encoder-decoder without a head; with `tie_word_embeddings` both stacks share `shared` (a joint vocabulary)."""

    remote_auto_classes = {
        "AutoModel": "RelPosTransformerModel",
        "AutoModelForSeq2SeqLM": "RelPosTransformerForConditionalGeneration",
    }
    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }

    def __init__(self, config: RelPosTransformerConfig):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.encoder = RelPosEncoder(config)
        self.decoder = RelPosDecoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.shared = value
        self.encoder.embed_tokens = value
        self.decoder.embed_tokens = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> Seq2SeqModelOutput:
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                inputs_embeds=inputs_embeds,
                output_attentions=output_attentions,
                output_hidden_states=output_hidden_states,
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            past_key_values=past_key_values,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=self.config.use_cache if use_cache is None else use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            past_key_values=decoder_outputs.past_key_values,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


class RelPosTransformerForConditionalGeneration(RelPosTransformerPreTrainedModel, GenerationMixin):
    """Encoder-decoder with a language-model head for translation; `labels` -> cross-entropy loss (-100 ignored)."""

    remote_auto_classes = {
        "AutoModel": "RelPosTransformerModel",
        "AutoModelForSeq2SeqLM": "RelPosTransformerForConditionalGeneration",
    }
    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}

    def __init__(self, config: RelPosTransformerConfig):
        super().__init__(config)
        self.model = RelPosTransformerModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = shift_tokens_right(
                    labels, self.config.pad_token_id, self.config.decoder_start_token_id
                )
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = CrossEntropyLoss()(logits.float().view(-1, logits.size(-1)), labels.view(-1))
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )

    def generate(self, *args, **kwargs):
        """`GenerationMixin.generate`, refusing a beam wider than the vocabulary (which would fail deep inside
        beam search's top-k)."""
        generation_config = kwargs.get("generation_config") or self.generation_config
        num_beams = kwargs.get("num_beams") or generation_config.num_beams or 1
        if num_beams > self.config.vocab_size:
            raise ValueError(f"num_beams ({num_beams}) must not exceed the vocabulary size ({self.config.vocab_size})")
        return super().generate(*args, **kwargs)

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)


class RelPosTransformerForCausalLM(RelPosTransformerPreTrainedModel, GenerationMixin):
    """Decoder-only language model with the same blocks and registry (decoder_* config fields).

    With `config.mem_len` M > 0 it runs Transformer-XL's segment-level recurrence: `forward` takes and returns
    `mems` (per layer, the last M layer inputs, detached: SG(h_tau) in Dai et al. 2019, eq. in sec. 3.2), keys and
    values span [mems; segment], queries the segment, and positions are offset by the memory length. In `generate`
    the memory is the cache (and is reordered for beam search): it equals uncached generation while prompt plus new
    tokens fit in M, and beyond that each step sees the last M states only (XL's bounded context). With M = 0 it is a
    plain causal LM with a KV cache.
    """

    remote_auto_classes = {"AutoModelForCausalLM": "RelPosTransformerForCausalLM"}
    _tied_weights_keys = {"lm_head.weight": "decoder.embed_tokens.weight"}

    def __init__(self, config: RelPosTransformerConfig):
        config = copy.deepcopy(config)
        config.is_encoder_decoder = False
        config.is_decoder = True
        super().__init__(config)
        self.decoder = RelPosDecoder(config, cross=False)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.decoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.decoder.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | list[torch.Tensor] | tuple[torch.Tensor, ...] | None = None,
        mems: list[torch.Tensor] | tuple[torch.Tensor, ...] | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        mem_len: int | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> RelPosCausalLMOutput:
        """`labels` are the input ids (shifted inside, -100 ignored); `mems` continue the previous segment."""
        if isinstance(past_key_values, (list, tuple)):
            mems, past_key_values = past_key_values, None
        use_cache = self.config.use_cache if use_cache is None else use_cache
        memory_mode = (self.config.mem_len if mem_len is None else mem_len) > 0
        if memory_mode and isinstance(past_key_values, Cache) and past_key_values.get_seq_length() == 0:
            past_key_values = None
        outputs = self.decoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache and not memory_mode and labels is None,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            mems=mems,
            mem_len=mem_len,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            shifted = logits[:, :-1].float()
            loss = CrossEntropyLoss()(shifted.reshape(-1, shifted.size(-1)), labels[:, 1:].reshape(-1))
        return RelPosCausalLMOutput(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            mems=outputs.mems,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, past_key_values=None, **kwargs) -> dict:
        """`generate` stores returned `mems` as the cache even with `use_cache=False`; drop them then, so an uncached
        step really recomputes the whole sequence."""
        if not kwargs.get("use_cache", True):
            past_key_values = None
        return super().prepare_inputs_for_generation(input_ids, past_key_values=past_key_values, **kwargs)

    def _reorder_cache(self, past, beam_idx: torch.Tensor):
        """Beam search: reorder the memory (a tuple of tensors) or the KV cache along the batch."""
        if isinstance(past, Cache):
            past.reorder_cache(beam_idx)
            return past
        return tuple(memory.index_select(0, beam_idx.to(memory.device)) for memory in past)
