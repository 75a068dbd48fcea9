"""Checkpoints saved before the attention redesign (schemes returning `AttentionTerms`, kernels called through a
model-local `AttentionInterface`) load into the same function.

tests/fixtures/legacy_checkpoints/ holds tiny models saved by hf_relpos at commit c74c95a, with the logits that code
computed (see tests/fixtures/make_legacy_checkpoints.py, which wrote them).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

import hf_relpos
from hf_relpos.model.configuration_relpos import DEPRECATED_FIELDS

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "legacy_checkpoints"
SEQ2SEQ = ("absolute", "shaw", "xl", "directional")


def legacy_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The batch make_legacy_checkpoints.py computed its logits on."""
    input_ids = torch.tensor([[5, 9, 4, 12, 7], [8, 6, 11, 0, 0]])
    return input_ids, (input_ids != 0).long(), torch.tensor([[2, 7, 12], [2, 11, 6]])


@pytest.mark.parametrize("name", SEQ2SEQ)
def test_seq2seq_checkpoint_of_the_old_layout_loads_every_weight_and_gives_its_logits(name):
    folder = FIXTURES / name
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert isinstance(model, hf_relpos.RelPosTransformerForConditionalGeneration)
    saved = load_file(folder / "model.safetensors")
    state = model.state_dict()
    unread = set() if model.config.tie_word_embeddings else {"model.shared.weight"}   # untied: read by no stack
    assert unread <= set(saved) and not unread & set(state)
    for key in set(saved) - unread:
        assert torch.equal(state[key], saved[key].float()), key
    input_ids, attention_mask, decoder_input_ids = legacy_inputs()
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    expected = load_file(FIXTURES / "expected_logits.safetensors")[name]
    assert (logits - expected).abs().max() < 1e-5  # float32 rounding differs by CPU kernel (0 to 5e-7 measured)


def test_xl_causal_lm_checkpoint_of_the_old_layout_continues_its_memory():
    model = AutoModelForCausalLM.from_pretrained(FIXTURES / "xl_causal_lm", dtype=torch.float32).eval()
    input_ids, _, _ = legacy_inputs()
    with torch.no_grad():
        first = model(input_ids=input_ids[:, :3])
        logits = model(input_ids=input_ids[:, 3:], mems=first.mems).logits
    assert (logits - load_file(FIXTURES / "expected_logits.safetensors")["xl_causal_lm"]).abs().max() < 1e-5


# Config fields added after the fixtures were written (randomized positions, the t5 and rope schemes, the
# self-attention window; log-length scaled cross-attention; keep_absolute_positions and its scale), with the
# defaults an old checkpoint loads with: the common ones, and those of the fixtures' schemes.
COMMON_FIELDS_ADDED_SINCE_THE_FIXTURES = {
    "position_randomization_max": None,
    "self_attention_window": None,
    "position_randomization_at_inference": False,
    "embedding_init_std": None,
    "cross_attention_length_scaling": False,
    "keep_absolute_positions": False,
    "absolute_positions_scale": 1.0,
    "attention_dropout_kind": "probabilities",
}
SCHEME_FIELDS_ADDED_SINCE_THE_FIXTURES = {"shaw": {"relative_embedding_init_std": None}}


@pytest.mark.parametrize("name", [*SEQ2SEQ, "xl_causal_lm"])
def test_config_json_keeps_the_old_keys_of_its_scheme_and_drops_the_other_schemes(name, tmp_path):
    """A config saved by an earlier version holds every scheme's fields; saved today it keeps the old file's keys and
    values except the other schemes' fields (plus the fields added since the fixtures were made, at their defaults),
    and the scheme under the field's current name."""
    folder = FIXTURES / name
    old = json.loads((folder / "config.json").read_text())
    old = {DEPRECATED_FIELDS.get(key, key): value for key, value in old.items()}   # as saved today
    model_class = AutoModelForCausalLM if name == "xl_causal_lm" else AutoModelForSeq2SeqLM
    model_class.from_pretrained(folder).save_pretrained(tmp_path)
    new = json.loads((tmp_path / "config.json").read_text())
    scheme = old["position_scheme"]
    own = {field.name for field in hf_relpos.POSITION_SCHEMES[scheme].config_fields}
    others = {field.name for other in hf_relpos.POSITION_SCHEMES.values() for field in other.config_fields} - own
    assert others & set(old), "the fixture holds no other scheme's field: the test would prove nothing"
    added = COMMON_FIELDS_ADDED_SINCE_THE_FIXTURES | SCHEME_FIELDS_ADDED_SINCE_THE_FIXTURES.get(scheme, {})
    assert set(new) == (set(old) - others) | set(added)
    assert {key: new[key] for key in added} == added
    assert {key: new[key] for key in set(old) - others if key != "transformers_version"} == {
        key: value for key, value in old.items() if key not in others and key != "transformers_version"}
