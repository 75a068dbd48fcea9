"""Shared fixtures: tiny configs that run in milliseconds on a CPU."""

from __future__ import annotations

import pytest
import torch

import hf_relpos

# Tiny test models gain nothing from intra-op threads, and two threads on a loaded 2-core machine are many times
# slower than one: pin one so the suite's time does not depend on what else runs.
torch.set_num_threads(1)

SCHEMES = ("absolute", "shaw", "xl", "directional")
RELATIVE_SCHEMES = ("shaw", "xl", "directional")


def tiny_config(attention_type: str = "shaw", **overrides) -> hf_relpos.RelPosTransformerConfig:
    values = dict(
        vocab_size=40,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        dropout=0.0,
        max_relative_position=3,
        clamp_len=50,
        attention_type=attention_type,
    )
    values.update(overrides)
    return hf_relpos.RelPosTransformerConfig(**values)


def tiny_model(attention_type: str = "shaw", seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config(attention_type, **overrides)).eval()


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
