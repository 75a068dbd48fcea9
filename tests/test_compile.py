"""torch.compile of a training forward: the schemes that compile into one graph stay so (a graph break costs a
return to Python per stack call, host time that a GPU step waits on)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from conftest import SCHEMES, tiny_config

import hf_relpos


def padded_batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    input_ids = torch.randint(3, 40, (2, 13), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 9:] = 0
    return dict(input_ids=input_ids, attention_mask=attention_mask,
                labels=torch.randint(3, 40, (2, 11), generator=generator))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_padded_training_forward_compiles_into_one_graph(scheme):
    """dynamo traces the whole forward of a padded batch on sdpa, loss included, without a graph break."""
    torch.manual_seed(0)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config(scheme)).train()
    batch = padded_batch()
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(lambda: model(**batch).loss)()
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
