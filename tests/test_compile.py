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


def flex_compiled_graphs(scheme: str, backend: str) -> int:
    """The graphs torch.compile(model, backend=backend) makes for padded inference batches of three shapes on
    flex_attention (lengths below one FlexAttention block and one band block), each output checked against the same
    model uncompiled in float64 at 1e-12 (a float32 step in the compiled path alone fails)."""
    torch.manual_seed(0)
    config = tiny_config(scheme, encoder_layers=1, decoder_layers=1, attn_implementation="flex_attention")
    model = hf_relpos.RelPosTransformerForConditionalGeneration(config).double().eval()
    batches = [batch_of(*shape) for shape in ((2, 13, 11), (3, 17, 9), (4, 30, 19))]
    with torch.no_grad():
        expected = [model(**batch).logits for batch in batches]
        compiled = torch.compile(model, backend=backend)
        torch._dynamo.reset()
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        for batch, logits in zip(batches, expected, strict=True):
            torch.testing.assert_close(compiled(**batch).logits, logits, rtol=0, atol=1e-12)
    return torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs


# rope on dynamo's eager backend (the graphs are dynamo's; 17 s here against aot_eager's 27); Shaw's and T5's band
# through AOT autograd as well, where a strided zero-row pad failed
@pytest.mark.parametrize("scheme, backend", [("rope", "eager"), pytest.param("shaw", "aot_eager", marks=pytest.mark.slow),
                                             pytest.param("t5", "aot_eager", marks=pytest.mark.slow)])
def test_a_compiled_flex_attention_model_follows_new_lengths_without_recompiling(scheme, backend):
    """On flex_attention, torch.compile(model) keeps one graph (no break at the padding's host check: under compile
    the mask reads the padding per key) and new lengths reuse it after the one recompile that makes sizes dynamic:
    the block mask is built over the count of query blocks, Shaw's and T5's band over a fixed block of queries and
    every diagonal of the band, not blocks of n or the diagonals a length meets (each length a graph until dynamo's
    limit of 8 sent the model back to eager). rope stands for the schemes without a band (before: a graph break at
    each stack's padding check, and a recompile per length)."""
    assert flex_compiled_graphs(scheme, backend) == 2
