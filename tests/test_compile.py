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


def batch_of(batch: int, source_length: int, target_length: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(source_length)
    input_ids = torch.randint(3, 40, (batch, source_length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[-1, source_length // 2:] = 0
    return dict(input_ids=input_ids, attention_mask=attention_mask,
                labels=torch.randint(3, 40, (batch, target_length), generator=generator))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_compiled_training_step_follows_new_lengths_without_recompiling(scheme):
    """torch.compile(model) trains on batches of changing sizes as token-budget batching makes them: after the first
    shape and the one recompile that makes sizes dynamic, a batch of other lengths reuses the graph (no scheme
    specialises on a length: dynamo's limit of 8 recompiles would otherwise send training back to eager)."""
    torch.manual_seed(0)
    config = tiny_config(scheme, encoder_layers=1, decoder_layers=1)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(config).train()
    compiled = torch.compile(model, backend="aot_eager")
    torch._dynamo.reset()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for shape in ((2, 13, 11), (3, 17, 9), (4, 30, 19)):
        compiled(**batch_of(*shape)).loss.backward()
        assert all(torch.isfinite(parameter.grad).all() for parameter in model.parameters() if parameter.grad is not None)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 2
