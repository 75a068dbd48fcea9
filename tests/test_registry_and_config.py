"""The registry is open to user schemes, and every invalid config value gets one clear error."""

from __future__ import annotations

import json
import math
import re
import warnings

import pytest
import torch
from conftest import run_without_hf_relpos, tiny_config
from transformers import AutoConfig, AutoModelForSeq2SeqLM

import hf_relpos
from hf_relpos import AttentionTerms, PositionScheme, integer_field, number_field, register_position_scheme
from hf_relpos.model import positions
from hf_relpos.model.positions import DenseBias
from hf_relpos.publish import hub
from hf_relpos.translation.training import parse_arguments


@register_position_scheme("test_alibi")
class LearnedAlibi(PositionScheme):
    """ALiBi (Press et al. 2022) with a learned slope per layer and head: score bias -m_h |i - j|, m_h starting at
    2^(-e h) for heads h = 1..H with e = `test_alibi_exponent`."""

    config_fields = (integer_field("test_alibi_exponent", 1, "initial slopes 2^(-e h)", minimum=1, symbol="e"),)

    def __init__(self, config, num_layers, num_heads, head_dim, is_causal):
        super().__init__(config, num_layers, num_heads, head_dim, is_causal)
        self.slopes = torch.nn.Parameter(torch.empty(num_layers, num_heads))

    def init_parameters(self, std):
        exponents = self.config.test_alibi_exponent * torch.arange(1, self.num_heads + 1, dtype=torch.float32)
        with torch.no_grad():
            self.slopes.copy_((2.0 ** -exponents).repeat(self.num_layers, 1))

    def terms(self, layer_idx, query, key, context):
        queries = torch.arange(context.query_offset, context.query_offset + query.size(-2), device=query.device)
        distance = (queries[:, None] - torch.arange(key.size(-2), device=query.device)[None, :]).abs()
        return AttentionTerms(score_bias=-self.slopes[layer_idx][:, None, None] * distance)


def test_user_registered_scheme_trains_and_round_trips(tmp_path):
    assert hf_relpos.POSITION_SCHEMES["test_alibi"] is LearnedAlibi
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("test_alibi")).train()
    assert torch.equal(model.model.encoder.positions.slopes[0], torch.tensor([0.5, 0.25, 0.125, 0.0625]))
    input_ids = torch.randint(4, 40, (2, 6))
    loss = model(input_ids=input_ids, labels=input_ids.flip(-1)).loss
    loss.backward()
    assert model.model.encoder.positions.slopes.grad.abs().sum() > 0
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    model.eval().save_pretrained(tmp_path)
    reloaded = hf_relpos.RelPosTransformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert reloaded.config.position_scheme == "test_alibi"
    assert torch.equal(reloaded.model.encoder.positions.slopes, model.model.encoder.positions.slopes)
    with torch.no_grad():
        expected = model(input_ids=input_ids, decoder_input_ids=input_ids).logits
        assert torch.equal(reloaded(input_ids=input_ids, decoder_input_ids=input_ids).logits, expected)


def test_loading_keeps_a_schemes_loaded_parameters_where_its_init_writes_in_place(tmp_path, registry_before):
    """A scheme with a non-persistent buffer (left uninitialised by transformers while a model loads, so the scheme is
    initialised again, its buffer set by `init_parameters`) whose `init_parameters` writes its parameter in place, as
    LearnedAlibi's does: from_pretrained gives the trained parameter back, where it gave the initial one."""

    @register_position_scheme("test_buffered")
    class Buffered(LearnedAlibi):
        def __init__(self, config, num_layers, num_heads, head_dim, is_causal):
            super().__init__(config, num_layers, num_heads, head_dim, is_causal)
            self.register_buffer("scale", torch.empty(num_heads), persistent=False)

        def init_parameters(self, std):
            super().init_parameters(std)
            with torch.no_grad():
                self.scale.fill_(2.0)

        def terms(self, layer_idx, query, key, context):
            terms = super().terms(layer_idx, query, key, context)
            return AttentionTerms(score_bias=self.scale[:, None, None] * terms.score_bias)

    model = hf_relpos.RelPosTransformerForConditionalGeneration(
        tiny_config("test_buffered", test_alibi_exponent=1)).eval()
    with torch.no_grad():
        model.model.encoder.positions.slopes.mul_(3.0)
    model.save_pretrained(tmp_path)
    reloaded = hf_relpos.RelPosTransformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    for stack in ("encoder", "decoder"):
        scheme = getattr(reloaded.model, stack).positions
        assert torch.equal(scheme.slopes, getattr(model.model, stack).positions.slopes), stack
        assert torch.equal(scheme.scale, torch.full((4,), 2.0)), stack
    input_ids = torch.randint(4, 40, (2, 6))
    with torch.no_grad():
        expected = model(input_ids=input_ids, decoder_input_ids=input_ids).logits
        assert torch.equal(reloaded(input_ids=input_ids, decoder_input_ids=input_ids).logits, expected)


def test_loading_keeps_a_schemes_loaded_persistent_buffer_where_its_init_draws_it_in_place(tmp_path, registry_before):
    """A scheme initialised again while the model loads (it has a non-persistent buffer) whose persistent buffer, a
    table drawn at random in `init_parameters` and saved with the model, is written in place there: from_pretrained
    gives the saved table back, where it gave a new draw (and other logits)."""

    @register_position_scheme("test_drawn_table")
    class DrawnTable(LearnedAlibi):
        def __init__(self, config, num_layers, num_heads, head_dim, is_causal):
            super().__init__(config, num_layers, num_heads, head_dim, is_causal)
            self.register_buffer("table", torch.empty(num_heads))
            self.register_buffer("scale", torch.empty(num_heads), persistent=False)

        def init_parameters(self, std):
            super().init_parameters(std)
            with torch.no_grad():
                self.table.copy_(torch.rand(self.table.shape) + 0.5)
                self.scale.fill_(2.0)

        def terms(self, layer_idx, query, key, context):
            terms = super().terms(layer_idx, query, key, context)
            return AttentionTerms(score_bias=(self.scale * self.table)[:, None, None] * terms.score_bias)

    model = hf_relpos.RelPosTransformerForConditionalGeneration(
        tiny_config("test_drawn_table", test_alibi_exponent=1)).eval()
    model.save_pretrained(tmp_path)
    reloaded = hf_relpos.RelPosTransformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    for stack in ("encoder", "decoder"):
        assert torch.equal(getattr(reloaded.model, stack).positions.table,
                           getattr(model.model, stack).positions.table), stack
    input_ids = torch.randint(4, 40, (2, 6))
    with torch.no_grad():
        expected = model(input_ids=input_ids, decoder_input_ids=input_ids).logits
        assert torch.equal(reloaded(input_ids=input_ids, decoder_input_ids=input_ids).logits, expected)


def test_a_registered_schemes_config_field_has_its_default_validation_and_a_place_in_config_json(tmp_path):
    config = tiny_config("test_alibi", test_alibi_exponent=2)
    assert tiny_config("test_alibi").test_alibi_exponent == 1
    model = hf_relpos.RelPosTransformerForConditionalGeneration(config)
    assert torch.equal(model.model.decoder.positions.slopes[0], torch.tensor([0.25, 0.0625, 0.015625, 0.00390625]))
    for bad in (0, "2", True, None):
        with pytest.raises(ValueError, match=r"test_alibi_exponent must be an integer >= 1, got"):
            tiny_config("test_alibi", test_alibi_exponent=bad)
    with pytest.raises(ValueError, match="did you mean 'test_alibi_exponent'"):
        tiny_config("test_alibi", test_alibi_exponnt=2)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["test_alibi_exponent"] == 2
    assert "max_relative_position" not in saved and "clamp_len" not in saved   # given to tiny_config, not its scheme's
    assert hf_relpos.RelPosTransformerConfig.from_pretrained(tmp_path).test_alibi_exponent == 2


def test_a_config_holds_the_fields_of_its_own_scheme_only(tmp_path):
    """Another scheme's field at its default is accepted and dropped, in the config and in config.json; switching
    `position_scheme` gives the new scheme's defaults, validated."""
    config = tiny_config("shaw", test_alibi_exponent=1, clamp_len=None)
    assert config.max_relative_position == 3
    assert not hasattr(config, "test_alibi_exponent") and not hasattr(config, "clamp_len")
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    shaw_fields = {field.name for field in hf_relpos.POSITION_SCHEMES["shaw"].config_fields}
    other_fields = {field.name for scheme in hf_relpos.POSITION_SCHEMES.values()
                    for field in scheme.config_fields} - shaw_fields
    assert shaw_fields <= set(saved) and not other_fields & set(saved)
    config.position_scheme = "xl"
    model = hf_relpos.RelPosTransformerForConditionalGeneration(config)   # validates the changed config
    xl_defaults = {field.name: field.default for field in hf_relpos.POSITION_SCHEMES["xl"].config_fields}
    assert model.config.clamp_len == xl_defaults["clamp_len"]
    assert "max_relative_position" not in model.config.to_dict()
    config.position_scheme = "test_alibi"
    config.test_alibi_exponent = 0
    with pytest.raises(ValueError, match="test_alibi_exponent must be an integer >= 1"):
        hf_relpos.RelPosTransformerForConditionalGeneration(config)


def test_a_registered_scheme_without_card_text_still_gets_a_complete_card():
    """No `card` on the class: a generic title, and still the settings table from its fields and the note that its
    module must be imported before the model is loaded."""
    text = hub.render_model_card(tiny_config("test_alibi", test_alibi_exponent=2))
    for expected in ("uses the `test_alibi` position scheme", "## Position scheme: `test_alibi`",
                     "| `test_alibi_exponent` (e) | 2 | initial slopes 2^(-e h) |",
                     "(`test_registry_and_config.LearnedAlibi`), not one of hf_relpos' own: this model loads only "
                     "where hf_relpos is installed and the module that registers the scheme has been imported before "
                     "`from_pretrained`",
                     "import hf_relpos  # noqa: F401\nimport test_registry_and_config  # noqa: F401\n"
                     "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer"):
        assert expected in text, expected
    assert "trust_remote_code=True)" not in text   # the stored code lacks the scheme: no way that cannot work
    assert "trust_remote_code=True)" in hub.render_model_card(tiny_config("shaw"))


def test_the_card_of_a_scheme_registered_by_a_script_imports_a_module_that_can_exist(monkeypatch):
    """A scheme registered in a script or notebook has `__module__` "__main__", which no loading process can import:
    the usage shows a module that holds it instead, and says so."""
    monkeypatch.setattr(LearnedAlibi, "__module__", "__main__")
    text = hub.render_model_card(tiny_config("test_alibi"))
    assert "import __main__" not in text and "import my_schemes  # noqa: F401" in text
    assert "`LearnedAlibi` was registered by a script, so `my_schemes` stands for a module that holds it" in text


def test_the_training_cli_accepts_a_registered_schemes_fields(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model:\n  position_scheme: test_alibi\n  test_alibi_exponent: 3\n"
                      f"output_dir: {tmp_path / 'out'}\ndataset_name: demo\ndo_train: true\n")
    model_args, _, _ = parse_arguments([str(recipe), "--model.d_model", "64"])
    assert model_args.model_config["test_alibi_exponent"] == 3


def test_a_field_declared_differently_by_two_schemes_is_refused():
    clash = type("Clash", (PositionScheme,), {"config_fields": (integer_field("max_relative_position", 8, "other"),)})
    with pytest.raises(ValueError, match="'max_relative_position' of scheme 'test_clash' is already declared"):
        register_position_scheme("test_clash")(clash)
    assert "test_clash" not in hf_relpos.POSITION_SCHEMES


def test_two_schemes_may_declare_the_same_field_alike_but_not_with_other_bounds(registry_before):
    """The same declaration (name, default, help, allowed values, symbol) in two schemes is one field; a minimum of
    its own is another declaration, refused."""
    def declared(minimum):
        return (integer_field("test_shared_k", 4, "clipping distance", minimum=minimum, symbol="k"),)

    register_position_scheme("test_shared_a")(type("SharedA", (PositionScheme,), {"config_fields": declared(0)}))
    register_position_scheme("test_shared_b")(type("SharedB", (PositionScheme,), {"config_fields": declared(0)}))
    assert tiny_config("test_shared_b", test_shared_k=2).test_shared_k == 2
    with pytest.raises(ValueError, match="'test_shared_k' of scheme 'test_shared_c' is already declared differently"):
        register_position_scheme("test_shared_c")(type("SharedC", (PositionScheme,), {"config_fields": declared(1)}))


def test_a_check_config_that_is_not_a_classmethod_is_refused_at_registration(registry_before):
    """check_config is called on the class with the config; an instance method would fail only when a config is
    built (a TypeError about a missing argument)."""
    def check_config(self, config):
        pass

    scheme = type("InstanceCheck", (PositionScheme,), {"check_config": check_config})
    with pytest.raises(TypeError, match="check_config of scheme 'test_check' must be a classmethod"):
        register_position_scheme("test_check")(scheme)
    assert hf_relpos.POSITION_SCHEMES == registry_before


@pytest.mark.parametrize("name", [None, 3, "", "my alibi", "a/b"])
def test_a_scheme_name_that_is_not_letters_digits_and_underscores_is_refused(name, registry_before):
    with pytest.raises(ValueError, match="the name must be a non-empty string of letters, digits and underscores"):
        register_position_scheme(name)(type("Named", (PositionScheme,), {}))
    assert hf_relpos.POSITION_SCHEMES == registry_before


def test_a_scheme_field_whose_default_fails_its_own_check_is_refused_at_registration(registry_before):
    scheme = type("BadDefault", (PositionScheme,), {"config_fields": (number_field("test_scale", 0.0, "scale"),)})
    with pytest.raises(ValueError, match="config field 'test_scale' of scheme 'test_bad_default' has a default that "
                                         "its own check refuses: test_scale must be a positive number, got the "
                                         "default 0.0"):
        register_position_scheme("test_bad_default")(scheme)
    assert hf_relpos.POSITION_SCHEMES == registry_before


TERMS_MISTAKES = {   # what the decoder's terms() returns -> the error (the first decoding step has n = m = 1)
    "transposed bias": (lambda query, key: AttentionTerms(score_bias=torch.zeros(2, key.size(2), query.size(2))),
                        r"terms\(\)\.score_bias must be a floating-point tensor broadcastable to \[B, H, n, m\] = "
                        r"\[1, 2, 1, 2\], got a torch.float32 tensor of shape \[2, 2, 1\]"),
    "bool bias": (lambda query, key: AttentionTerms(score_bias=torch.ones(2, 1, 1, dtype=torch.bool)),
                  r"terms\(\)\.score_bias must be a floating-point tensor .* got a torch.bool tensor"),
    "float mask": (lambda query, key: AttentionTerms(mask=torch.ones(2, 1, 1)),
                   r"terms\(\)\.mask must be a boolean tensor broadcastable to \[B, H, n, m\] = \[1, 2, 1, 1\]"),
    "keys without the cache": (lambda query, key: AttentionTerms(key=key[:, :, -query.size(2):]),
                               r"terms\(\)\.key must be a tensor of the shape it replaces, \[1, 2, 2, 16\], got "
                               r"a torch.float32 tensor of shape \[1, 2, 1, 16\]"),
    "value bias of one key more": (lambda query, key: AttentionTerms(value_bias=torch.zeros(2, key.size(2) + 1, 16)),
                                   r"terms\(\)\.value_bias must be a floating-point tensor broadcastable to the "
                                   r"values \[B, H, m, d\] = \[1, 2, 1, 16\], got a torch.float32 tensor of shape "
                                   r"\[2, 2, 16\]"),
    "bool value bias": (lambda query, key: AttentionTerms(value_bias=torch.ones(16, dtype=torch.bool)),
                        r"terms\(\)\.value_bias must be a floating-point tensor .* got a torch.bool tensor"),
    "None": (lambda query, key: None, r"terms\(\) must return an AttentionTerms, got NoneType"),
    # a DenseBias is checked when a kernel builds it: the transposed bias was torch's broadcasting error, or eager's
    # matmul error further on, naming neither the scheme nor the term
    "transposed DenseBias": (
        lambda query, key: AttentionTerms(score_bias=DenseBias(lambda: torch.zeros(1, 2, key.size(2), query.size(2)))),
        r"terms\(\)\.score_bias \(the tensor its DenseBias builds\) must be a floating-point tensor broadcastable to "
        r"\[B, H, n, m\] = \[1, 2, 1, 2\], got a torch.float32 tensor of shape \[1, 2, 2, 1\]"),
    # FlexAttention's forms alone: eager and sdpa read score_bias / value_term and ran plain attention, silently
    "score_mod without score_bias": (
        lambda query, key: AttentionTerms(score_mod=lambda score, b, h, q, kv: score - (q - kv).abs()),
        r"terms\(\)\.score_mod is FlexAttention's form of a score bias: give the bias as score_bias too"),
    "fused_attention without its terms": (
        lambda query, key: AttentionTerms(fused_attention=lambda *args: None),
        r"terms\(\)\.fused_attention is FlexAttention's form of a score bias or value term: give score_bias or "
        r"value_term too"),
}


@pytest.mark.parametrize("mistake", TERMS_MISTAKES)
def test_terms_of_the_wrong_type_or_shape_are_one_error_naming_the_scheme_and_the_term(mistake, registry_before):
    """Checked where the attention layer receives them, in every call: a bias given as [H, m, n] (which passes while
    n = m: the encoder, the first decoding step) fails at the next cached step, not deep in torch; a bool bias is not
    added as 0/1."""
    make, message = TERMS_MISTAKES[mistake]
    register_position_scheme("test_terms")(type("Mistaken", (PositionScheme,), {
        "terms": lambda self, layer_idx, query, key, context: make(query, key) if self.is_causal else AttentionTerms()}))
    config = tiny_config("test_terms", encoder_attention_heads=2, decoder_attention_heads=2)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(config).eval()
    with torch.no_grad(), pytest.raises((ValueError, TypeError), match=f"^position scheme 'test_terms': {message}"):
        model.generate(input_ids=torch.randint(4, 40, (1, 5)), max_new_tokens=3, min_new_tokens=3, num_beams=1,
                       do_sample=False)


@pytest.fixture
def registry_before():
    """The registry as it was before the test, restored after it (a scheme registered by mistake leaves no trace)."""
    before = dict(hf_relpos.POSITION_SCHEMES)
    yield before
    hf_relpos.POSITION_SCHEMES.clear()
    hf_relpos.POSITION_SCHEMES.update(before)


@pytest.mark.parametrize("field_name", ["d_model", "hidden_size", "attention_type", "id2label"])
def test_a_scheme_field_named_as_the_configs_own_is_refused_at_registration(field_name, registry_before):
    """A field of the config, an alias (transformers' `hidden_size`, the deprecated `attention_type`) or one of
    transformers' own: registering is one error naming the scheme and the field, the registry stays as it was, and
    every other config still builds."""
    clash = type("Core", (PositionScheme,), {"config_fields": (integer_field(field_name, 3, "x", minimum=1),)})
    with pytest.raises(ValueError, match=f"config field '{field_name}' of scheme 'test_core' is a name "
                                         "RelPosTransformerConfig already has"):
        register_position_scheme("test_core")(clash)
    assert hf_relpos.POSITION_SCHEMES == registry_before
    assert tiny_config("shaw").position_scheme == "shaw"


@pytest.mark.parametrize("field_name, reason", [
    ("temperature", "a generation setting of transformers' GenerationConfig"),
    ("max_length", "a generation setting of transformers' GenerationConfig"),
    ("num_beams", "a generation setting of transformers' GenerationConfig"),
    ("forced_eos_token_id", "a generation setting of transformers' GenerationConfig"),
    ("auto_map", "a key transformers' PreTrainedConfig reads or writes itself"),
    ("custom_pipelines", "a key transformers' PreTrainedConfig reads or writes itself"),
    ("_attn_implementation", "a private name"),
])
def test_a_scheme_field_that_transformers_reads_from_a_config_is_refused_at_registration(field_name, reason,
                                                                                         registry_before):
    """A generation setting would be taken up by generate (and make save_pretrained fail), auto_map and the private
    attributes would break saving or building the model: registering is one error naming the field and why."""
    clash = type("Reader", (PositionScheme,), {"config_fields": (integer_field(field_name, 3, "x", minimum=1),)})
    with pytest.raises(ValueError, match=f"config field '{field_name}' of scheme 'test_reader' is {reason}"):
        register_position_scheme("test_reader")(clash)
    assert hf_relpos.POSITION_SCHEMES == registry_before


def test_reserving_a_name_a_registered_scheme_declares_is_refused():
    """The built-in schemes register before the config class exists; reserving its names then checks them."""
    with pytest.raises(ValueError, match="config field 'max_relative_position' of scheme 'shaw' is a name"):
        positions.reserve_config_names({"max_relative_position"})
    assert "max_relative_position" not in positions.CONFIG_NAMES and "d_model" in positions.CONFIG_NAMES


def test_a_scheme_not_registered_in_this_process_is_one_error_saying_to_import_its_module(tmp_path, monkeypatch):
    """A model saved with a scheme registered from user code, where that code was not imported (a fresh process: the
    scheme taken out of the registry): building its config and loading the model after `import hf_relpos` are one
    error that lists the registered schemes and says to import the module that registers the scheme first."""
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("test_alibi", test_alibi_exponent=2))
    model.save_pretrained(tmp_path)
    monkeypatch.delitem(hf_relpos.POSITION_SCHEMES, "test_alibi")
    expected = (r"^position_scheme must be one of \['absolute', 'alibi', .*'xl'\], got 'test_alibi'\. A scheme "
                r"registered outside hf_relpos .* imported the module that registers it: import that module before "
                r"the config or model is built or loaded")
    with pytest.raises(ValueError, match=expected):
        tiny_config("test_alibi", test_alibi_exponent=2)
    with pytest.raises(ValueError, match=expected):
        AutoModelForSeq2SeqLM.from_pretrained(tmp_path)


def test_a_scheme_of_ones_own_loaded_through_remote_code_is_one_error_saying_remote_code_cannot_hold_it(tmp_path):
    """The remote code saved with a model holds hf_relpos' built-in schemes only: loading a model of a scheme
    registered in one's own code with trust_remote_code, where hf_relpos is not installed, is one error that says so
    and what loads it (hf_relpos and the scheme's package imported), not advice to import a module that cannot be
    imported there."""
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("test_alibi", test_alibi_exponent=2))
    model.save_pretrained(tmp_path / "model")
    loaded = run_without_hf_relpos("""
        from transformers import AutoModelForSeq2SeqLM
        try:
            AutoModelForSeq2SeqLM.from_pretrained("model", trust_remote_code=True)
        except ValueError as error:
            print(error)
        """, tmp_path)
    assert loaded.returncode == 0, loaded.stderr
    assert "got 'test_alibi'" in loaded.stdout
    assert ("this is a model's remote code (trust_remote_code), which holds hf_relpos' built-in schemes only, never "
            "one registered elsewhere: install hf_relpos and the package that registers it") in loaded.stdout
    assert "import that module before" not in loaded.stdout


def test_registering_a_different_class_under_a_taken_name_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        register_position_scheme("shaw")(type("OtherShaw", (PositionScheme,), {}))
    with pytest.raises(TypeError, match="PositionScheme subclass"):
        register_position_scheme("not_a_scheme")(int)


def test_a_class_of_another_module_with_a_built_in_schemes_name_does_not_replace_it(registry_before):
    """A copy of positions_shaw.py registering "shaw" under the built-in class's own name, in a module of its own: one
    error naming the built-in registration; the same class defined again in its own module (a reload) is accepted."""
    built_in = hf_relpos.POSITION_SCHEMES["shaw"]
    copy = type(built_in.__name__, (PositionScheme,), {"__module__": "positions_shaw",
                                                       "__qualname__": built_in.__qualname__})
    with pytest.raises(ValueError, match="position_scheme 'shaw' is already registered by "
                                         "hf_relpos.model.positions_shaw.ShawPositions: register yours under another"):
        register_position_scheme("shaw")(copy)
    assert hf_relpos.POSITION_SCHEMES == registry_before
    redefined = type("LearnedAlibi", (PositionScheme,), {"__module__": LearnedAlibi.__module__,
                                                         "__qualname__": LearnedAlibi.__qualname__})
    assert register_position_scheme("test_alibi")(redefined) is hf_relpos.POSITION_SCHEMES["test_alibi"]


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"position_scheme": "sandwich"}, "position_scheme"),
        ({"max_relative_position": -1}, "max_relative_position"),
        ({"d_model": 30}, "d_model"),
        ({"decoder_attention_heads": 5}, "decoder_attention_heads"),
        ({"layer_norm_position": "sandwich"}, "layer_norm_position"),
        ({"pad_token_id": 40}, "pad_token_id"),
        ({"eos_token_id": -1}, "eos_token_id"),
        ({"decoder_start_token_id": 99}, "decoder_start_token_id"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"encoder_layers": -2}, "encoder_layers"),
        ({"dropout": 1.5}, "dropout"),
        ({"clamp_len": -3}, "clamp_len"),
        ({"activation_function": "swishy"}, "activation_function"),
        ({"position_scheme": "directional", "directional_heads": ["sideways"]}, "directional_heads"),
        ({"position_scheme": "directional", "directional_heads": []}, "directional_heads"),
        ({"d_model": "512"}, "d_model"),
        ({"max_relativ_position": 8}, "max_relative_position"),
        ({"use_relative_value": False}, "use_relative_values"),
        ({"use_relative_keys": "no"}, "use_relative_keys"),
        ({"untie_relative_biases": "x"}, "untie_relative_biases"),
        ({"init_std": -1.0}, "init_std"),
        ({"embedding_init_std": 0.0}, "embedding_init_std"),
        ({"embedding_init_std": "small"}, "embedding_init_std"),
        ({"relative_embedding_init_std": -0.1}, "relative_embedding_init_std"),
        ({"init_std": float("inf")}, "init_std"),
        ({"embedding_init_std": float("nan")}, "embedding_init_std"),
        ({"dropout": False}, "dropout"),
        ({"pad_token_id": True}, "pad_token_id"),
        ({"position_scheme": ["xl"]}, "position_scheme"),
        ({"activation_function": ["relu"]}, "activation_function"),
        ({"num_attention_heads": 7}, "encoder_attention_heads"),  # transformers' common names stand for the fields
        ({"hidden_size": 30}, "d_model"),
        ({"num_hidden_layers": -2}, "encoder_layers"),
        ({"is_encoder_decoder": "x"}, "is_encoder_decoder"),
        ({"decoder_layers": -1}, "decoder_layers"),
        ({"attention_dropout": 1.0}, "attention_dropout"),   # p = 1 drops every probability
        ({"position_randomization_at_inference": True}, "position_randomization_max"),   # the range it draws from
        ({"position_randomization_max": 0}, "position_randomization_max"),
    ],
)
def test_invalid_config_values_raise_a_clear_error(overrides, field):
    with pytest.raises(ValueError) as error:
        tiny_config(**overrides)
    assert field in str(error.value)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"d_model": 60}, r"position_scheme 'rope' rotates pairs of dimensions: the encoder's head dimension \(d_model / "
                      r"encoder_attention_heads = 60 / 4\) must be even, got 15"),
    ({"d_model": 66, "encoder_attention_heads": 3, "decoder_attention_heads": 2},
     r"the decoder's head dimension \(d_model / decoder_attention_heads = 66 / 2\) must be even, got 33"),
    ({"d_model": 60, "rotary_dim": 16}, r"rotary_dim must be null or an even integer <= the encoder's head dimension "
                                        r"\(15\)"),
    ({"d_model": 64, "rotary_dim": 5}, r"rotary_dim must be null or an even integer"),
])
def test_rope_refuses_heads_it_cannot_rotate(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(position_scheme="rope", **{"encoder_attention_heads": 4, "decoder_attention_heads": 4, **overrides})
    tiny_config(position_scheme="rope", encoder_attention_heads=4, decoder_attention_heads=4, d_model=60,
                rotary_dim=14)   # an odd head rotates an even part of itself


@pytest.mark.parametrize(("field", "value", "computed"), [
    ("encoder_layerdrop", 0.1, "no LayerDrop"), ("decoder_layerdrop", 0.2, "no LayerDrop"),
    ("layer_norm_eps", 1e-6, "epsilon, 1e-5"), ("share_encoder_decoder_embeddings", False, "tie_word_embeddings"),
    ("normalize_before", True, "layer_norm_position"), ("add_final_layer_norm", True, "layer_norm_position 'pre'"),
    ("normalize_embedding", True, "no layer norm on the embeddings"),
])
def test_marian_fields_the_model_does_not_implement_are_refused_unless_they_say_what_it_computes(field, value, computed):
    with pytest.raises(ValueError, match=rf"config field {field}={value!r} is not implemented by "
                                         rf"RelPosTransformerConfig \(it computes [^)]*{computed}"):
        tiny_config(**{field: value})
    tiny_config(**{field: hf_relpos.model.configuration_relpos.FIXED_MARIAN_FIELDS[field][0](True)})


@pytest.mark.parametrize("tied", [True, False])
def test_shared_encoder_decoder_embeddings_must_say_what_tie_word_embeddings_does(tied):
    """Marian's share_encoder_decoder_embeddings: here the source and target embeddings are one matrix exactly when
    tie_word_embeddings is true, so only that value is accepted."""
    tiny_config(tie_word_embeddings=tied, share_encoder_decoder_embeddings=tied)
    with pytest.raises(ValueError, match=rf"share_encoder_decoder_embeddings={not tied!r} is not implemented"):
        tiny_config(tie_word_embeddings=tied, share_encoder_decoder_embeddings=not tied)


def test_a_bad_value_given_when_a_config_is_loaded_is_one_error_naming_it(tmp_path):
    """transformers sets from_pretrained's keyword overrides after the config is built: they are validated too."""
    tiny_config().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"^dropout must be a number in \[0, 1\), got 1.5$"):
        hf_relpos.RelPosTransformerConfig.from_pretrained(tmp_path, dropout=1.5)


@pytest.mark.parametrize(("text", "kind"), [("[1, 2]", "list"), ('"shaw"', "str")])
def test_a_config_json_that_is_not_an_object_is_one_error_naming_the_folder(tmp_path, text, kind):
    """A config.json holding another JSON value than an object failed as "'list' object has no attribute 'get'"."""
    (tmp_path / "config.json").write_text(text, encoding="utf-8")
    message = rf"^{re.escape(str(tmp_path))}: its config.json must hold a JSON object of field: value, got {kind}$"
    for load in (hf_relpos.RelPosTransformerConfig.from_pretrained,
                 hf_relpos.RelPosTransformerForConditionalGeneration.from_pretrained):
        with pytest.raises(OSError, match=message):
            load(tmp_path)


def test_a_config_changed_after_it_was_built_is_validated_when_a_model_is_built():
    config = tiny_config()
    config.d_model = 33
    with pytest.raises(ValueError, match=r"d_model \(33\) must be divisible by encoder_attention_heads"):
        hf_relpos.RelPosTransformerForConditionalGeneration(config)


@pytest.mark.parametrize(("name", "value", "message"), [
    ("dropout", 5, r"^dropout must be a number in \[0, 1\), got 5$"),
    ("dropuot", 0.3, r"^unknown config field 'dropuot'; did you mean 'dropout'\?$"),
    ("layer_norm_eps", 1e-6, r"^config field layer_norm_eps=1e-06 is not implemented by RelPosTransformerConfig"),
])
@pytest.mark.parametrize("saved", ["config", "model"])
def test_a_config_changed_to_a_bad_value_after_it_was_built_is_refused_before_saving_writes_anything(
        tmp_path, saved, name, value, message):
    """A config set to a bad value, or given a misspelled or unimplemented field, after construction was saved, a
    config.json (and the model's remote code beside it) that from_pretrained refuses; transformers' own save-time
    `validate` knew none of this config's checks."""
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config())
    model.config.update({name: value})
    folder = tmp_path / "saved"
    with pytest.raises(ValueError, match=message):
        (model.config if saved == "config" else model).save_pretrained(folder)
    assert not folder.exists()
    if name != "dropout":
        delattr(model.config, name)
    model.config.update({"dropout": 0.3})
    (model.config if saved == "config" else model).save_pretrained(folder)
    assert hf_relpos.RelPosTransformerConfig.from_pretrained(folder).dropout == 0.3


def test_the_common_names_set_the_fields_they_stand_for():
    config = tiny_config(num_attention_heads=4, hidden_size=64, num_hidden_layers=3)
    assert (config.encoder_attention_heads, config.d_model, config.encoder_layers) == (4, 64, 3)


def test_the_common_layer_and_head_names_stand_for_the_decoders_fields_in_a_causal_lm_config():
    """A causal LM's config (is_encoder_decoder false) has only the decoder in use: transformers' num_hidden_layers
    (what it sizes the KV cache by) and num_attention_heads read and set the decoder's fields."""
    config = tiny_config(is_encoder_decoder=False, num_hidden_layers=3, num_attention_heads=2)
    assert (config.decoder_layers, config.decoder_attention_heads, config.encoder_layers) == (3, 2, 2)
    config.num_hidden_layers = 5
    assert (config.num_hidden_layers, config.decoder_layers, config.encoder_layers) == (5, 5, 2)


def test_a_generation_setting_given_to_the_config_is_one_error_and_a_saved_one_still_loads(tmp_path):
    """transformers' config drops generation settings without a word, so RelPosTransformerConfig(num_beams=4) built
    a model that searched with one beam; a config.json that holds them (saved before GenerationConfig) loads, and its
    settings reach the model's generation config, as transformers reads them."""
    with pytest.raises(ValueError, match=r"^max_length, num_beams: generation setting\(s\), not config fields \(the "
                                         r"config would drop them\): set them on model.generation_config, or pass "
                                         r"them to generate$"):
        tiny_config(num_beams=4, max_length=7)
    assert tiny_config(use_cache=False).use_cache is False   # a field of the config's own that generate also reads
    hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config()).save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").unlink()
    saved = json.loads((tmp_path / "config.json").read_text(encoding="utf-8"))
    (tmp_path / "config.json").write_text(json.dumps({**saved, "num_beams": 4, "max_length": 7}), encoding="utf-8")
    model = hf_relpos.RelPosTransformerForConditionalGeneration.from_pretrained(tmp_path)
    assert (model.generation_config.num_beams, model.generation_config.max_length) == (4, 7)
    assert hf_relpos.RelPosTransformerConfig.from_json_file(tmp_path / "config.json").to_diff_dict() == (
        model.config.to_diff_dict())
    (tmp_path / "config.json").write_text(json.dumps({**saved, "model_type": "marian"}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"^config model_type is 'marian'; RelPosTransformerConfig needs"):
        hf_relpos.RelPosTransformerConfig.from_json_file(tmp_path / "config.json")   # was built as this model's


@pytest.mark.parametrize(("values", "alias", "field"), [
    ({"d_model": 32, "hidden_size": 64}, "hidden_size", "d_model"),
    ({"encoder_layers": 2, "num_hidden_layers": 3}, "num_hidden_layers", "encoder_layers"),
    ({"encoder_attention_heads": 4, "num_attention_heads": 2}, "num_attention_heads", "encoder_attention_heads"),
    ({"decoder_layers": 2, "num_hidden_layers": 3, "is_encoder_decoder": False}, "num_hidden_layers", "decoder_layers"),
])
def test_a_common_name_and_its_field_with_different_values_are_one_error(tmp_path, values, alias, field):
    """Given both (keywords, a config.json, from_pretrained's overrides), one of them silently won: hidden_size 64
    with d_model 32 built d_model 64; the same value twice passes."""
    message = (rf"^{alias} stands for {field}, and they differ \({alias}={values[alias]}, {field}={values[field]}\): "
               rf"give {field} only$")
    base = {name: value for name, value in tiny_config().to_dict().items() if name not in values}
    with pytest.raises(ValueError, match=message):
        hf_relpos.RelPosTransformerConfig(**base, **values)
    hf_relpos.RelPosTransformerConfig(**base, **{**values, alias: values[field]})
    (tmp_path / "config.json").write_text(json.dumps({**base, **values}), encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        hf_relpos.RelPosTransformerConfig.from_pretrained(tmp_path)
    tiny_config().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=message):
        hf_relpos.RelPosTransformerConfig.from_pretrained(tmp_path, **values)


@pytest.mark.parametrize(
    "overrides, field",
    [({"layer_norm_position": "sandwich"}, "layer_norm_position"), ({"dropout": 1.5}, "dropout"),
     ({"max_relative_position": -1}, "max_relative_position"), ({"pad_token_id": 999}, "pad_token_id")],
)
def test_overrides_given_to_from_pretrained_are_validated(tmp_path, overrides, field):
    """transformers sets from_pretrained's keyword overrides after the config is built; they are checked too."""
    hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config()).save_pretrained(tmp_path)
    with pytest.raises(ValueError) as error:
        hf_relpos.RelPosTransformerForConditionalGeneration.from_pretrained(tmp_path, **overrides)
    assert field in str(error.value)


@pytest.mark.parametrize(("scheme", "field", "largest", "message"), [
    ("shaw", "max_relative_position", 65535, r"an integer from 0 to 65535 \(a table of 2k \+ 1 rows, sized for at most "
                                             r"65536 tokens; k >= n - 1 already gives every distance among n tokens "
                                             r"its own row\)"),
    ("t5", "relative_attention_max_distance", 65535, r"an integer from 1 to 65535 \(the band of offsets below it"),
    ("t5", "relative_attention_num_buckets", 131072, r"an integer from 4 to 131072 \(one bucket per offset"),
    ("shaw", "position_randomization_max", 65536, r"null \(off\) or an integer from 1 to 65536"),
])
def test_a_position_size_past_the_bound_is_one_error_naming_the_field(scheme, field, largest, message):
    """A Shaw k, a T5 bucket count or max_distance, or a randomized-position range of 10^9 allocated a table, band
    or permutation of that size at model build (or at the first training step): an allocator error that named no
    field. Past MAX_POSITIONS (65536 tokens) it is one ValueError naming the field and its range; at the bound the
    model builds."""
    for value in (largest + 1, 10**9):
        with pytest.raises(ValueError, match=rf"^{field} must be {message}.*, got {value}$"):
            tiny_config(scheme, **{field: value})
    if field != "relative_attention_num_buckets":   # its count of buckets is bounded by max_distance as well
        hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config(scheme, **{field: largest}))


@pytest.mark.parametrize("load", [hf_relpos.RelPosTransformerConfig.from_pretrained, AutoConfig.from_pretrained,
                                  hf_relpos.RelPosTransformerForConditionalGeneration.from_pretrained],
                         ids=["config", "AutoConfig", "model"])
@pytest.mark.parametrize(("override", "field"), [("dropuot", "dropout"),
                                                 ("max_relative_positon", "max_relative_position")])
def test_a_misspelled_override_given_to_from_pretrained_is_refused(tmp_path, load, override, field):
    """transformers drops an override that names no attribute of the config: a misspelled one would silently leave
    the field at its saved value. It is the constructor's error."""
    hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config()).save_pretrained(tmp_path)
    message = rf"unknown config field '{override}'; did you mean '{field}'\?"
    with pytest.raises(ValueError, match=message):
        tiny_config(**{override: 3})
    with pytest.raises(ValueError, match=message):
        load(tmp_path, **{override: 3})
    with pytest.raises(ValueError, match="clamp_len must be"):   # another scheme's field: checked
        load(tmp_path, clamp_len=-1)
    config = getattr(loaded := load(tmp_path, clamp_len=None, dropout=0.3), "config", loaded)   # at its default
    assert config.dropout == 0.3 and not hasattr(config, "clamp_len")


def test_another_schemes_field_given_another_value_than_its_default_is_refused(tmp_path):
    """A field only other schemes read, given with another value than its default (as a keyword, also beside the
    deprecated attention_type or the default scheme, or as a from_pretrained override), would do nothing: one
    ValueError naming it, the scheme that reads it and the config's. A saved config.json holding other schemes'
    fields with any value (as earlier versions saved every scheme's) still loads, and setting position_scheme on a
    built config still switches it."""
    shaw_k = "max_relative_position=8 is a field of position_scheme 'shaw', which position_scheme"
    with pytest.raises(ValueError, match=f"{shaw_k} 'rope' does not read: remove max_relative_position \\(or set "
                                         "position_scheme 'shaw'\\)"):
        tiny_config("rope", max_relative_position=8)
    with pytest.raises(ValueError, match=f"{shaw_k} 'directional' does not read"):   # the default scheme
        hf_relpos.RelPosTransformerConfig(max_relative_position=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(ValueError, match=f"{shaw_k} 'alibi' does not read"):
            hf_relpos.RelPosTransformerConfig(attention_type="alibi", max_relative_position=8)
    for scheme, field, value in (("shaw", "clamp_len", 6), ("alibi", "relative_attention_num_buckets", 64),
                                 ("t5", "use_relative_values", False), ("xl", "rope_theta", 500.0)):
        with pytest.raises(ValueError, match=f"{field}={value!r} is a field of .*position_scheme '{scheme}' does not"):
            tiny_config(scheme, **{field: value})
    hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config("rope")).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=f"{shaw_k} 'rope' does not read"):
        hf_relpos.RelPosTransformerConfig.from_pretrained(tmp_path, max_relative_position=8)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, "max_relative_position": 8, "clamp_len": 6}))
    loaded = hf_relpos.RelPosTransformerConfig.from_pretrained(tmp_path)
    assert loaded.position_scheme == "rope" and not hasattr(loaded, "max_relative_position")
    switched = tiny_config("shaw", max_relative_position=5)
    switched.position_scheme = "rope"
    switched.validate()
    assert "max_relative_position" not in switched.to_dict()


@pytest.mark.parametrize("load", [hf_relpos.RelPosTransformerConfig.from_pretrained, AutoConfig.from_pretrained,
                                  hf_relpos.RelPosTransformerForConditionalGeneration.from_pretrained],
                         ids=["config", "AutoConfig", "model"])
@pytest.mark.parametrize("scheme_name", ["position_scheme", "attention_type"])
def test_a_scheme_switched_in_from_pretrained_keeps_the_fields_given_for_it(tmp_path, load, scheme_name):
    """A t5 folder loaded with position_scheme='shaw' and max_relative_position=8 (or the deprecated attention_type)
    is a shaw config with k = 8, as the constructor gives: the field is not dropped as another scheme's."""
    hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config(position_scheme="t5")).save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model_class = hf_relpos.RelPosTransformerForConditionalGeneration
        extra = {"allow_missing_weights": True} if load == model_class.from_pretrained else {}   # no shaw tables saved
        loaded = load(tmp_path, **{scheme_name: "shaw"}, max_relative_position=8, **extra)
    config = getattr(loaded, "config", loaded)
    assert (config.position_scheme, config.max_relative_position) == ("shaw", 8)
    assert not hasattr(config, "relative_attention_num_buckets")
    if config is not loaded:
        assert loaded.model.encoder.positions.relative_keys.shape[1] == 2 * 8 + 1


@pytest.mark.parametrize("embedding_init_std", [None, 0.02])
def test_token_embeddings_start_at_embedding_init_std_or_d_model_to_the_minus_half(embedding_init_std):
    torch.manual_seed(0)
    config = tiny_config(d_model=64, vocab_size=4000, embedding_init_std=embedding_init_std)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(config)
    embeddings = model.get_input_embeddings().weight
    expected = 64**-0.5 if embedding_init_std is None else embedding_init_std
    assert embeddings[1:].std().item() == pytest.approx(expected, rel=0.02)
    assert embeddings[config.pad_token_id].abs().max() == 0


@pytest.mark.parametrize("relative_embedding_init_std", [None, 0.03])
def test_shaw_tables_start_at_relative_embedding_init_std_or_tensor2tensor_scale(relative_embedding_init_std):
    torch.manual_seed(0)
    config = tiny_config(d_model=64, encoder_attention_heads=4, decoder_attention_heads=4, max_relative_position=64,
                         init_std=0.05, relative_embedding_init_std=relative_embedding_init_std)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(config)
    head_dim = 64 // 4
    tensor2tensor_std = math.sqrt(2 / (2 * 64 + 1 + head_dim))   # fan-average variance of a (2k + 1) x d_z table
    expected = tensor2tensor_std if relative_embedding_init_std is None else relative_embedding_init_std
    for stack in (model.model.encoder, model.model.decoder):
        for tables in (stack.positions.relative_keys, stack.positions.relative_values):
            assert tables.std().item() == pytest.approx(expected, rel=0.05)
            assert tables.mean().abs().item() < expected * 0.1


def test_shaw_tables_are_drawn_at_exactly_the_tensor2tensor_std():
    """The null std is sqrt(2 / (2k + 1 + d_z)) itself: the tables are the normals torch draws at that std from the same
    seed. (At k = 64 the sampled std above cannot tell a fan of 2k + d_z, the 1 dropped, from the right one.)"""
    k, head_dim = 1, 2
    config = tiny_config(d_model=8, encoder_attention_heads=4, decoder_attention_heads=4, max_relative_position=k)
    scheme = positions.get_scheme_class("shaw")(config, 2, 4, head_dim, is_causal=False)
    torch.manual_seed(0)
    scheme.init_parameters(std=0.05)
    torch.manual_seed(0)
    std = math.sqrt(2 / (2 * k + 1 + head_dim))
    for tables in (scheme.relative_keys, scheme.relative_values):
        assert torch.equal(tables.detach(), torch.empty_like(tables).normal_(0.0, std))


@pytest.mark.parametrize("position_scheme", [name for name in positions.built_in_schemes()
                                             if any(True for _ in positions.get_scheme_class(name)(
                                                 tiny_config(name), 1, 4, 8, is_causal=False).parameters())])
def test_a_built_model_runs_each_schemes_own_initialisation(position_scheme, monkeypatch):
    """`PositionScheme.init_parameters(init_std)` runs for the scheme of each stack when a model is built, also for a
    scheme whose parameters all live in submodules (T5's table is an nn.Embedding): transformers skips a module of
    custom code whose own parameters (recurse=False) are all initialised, which a module without any of its own
    always is, so T5's init never ran before."""
    calls = []
    scheme_class = positions.get_scheme_class(position_scheme)
    original = scheme_class.init_parameters
    monkeypatch.setattr(scheme_class, "init_parameters",
                        lambda self, std: (calls.append((self, std)), original(self, std))[1])
    model = hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config(position_scheme, init_std=0.03))
    stacks = (model.model.encoder.positions, model.model.decoder.positions)
    assert sorted(map(id, (scheme for scheme, _ in calls))) == sorted(map(id, stacks))
    assert {std for _, std in calls} == {0.03}


def test_t5_buckets_start_at_init_std_not_at_the_token_embeddings_std(tmp_path):
    """T5's bucket table is drawn N(0, init_std) (`T5Positions.init_parameters`, as init_std's doc says of the schemes'
    parameters), not by the token embeddings' rule N(0, d_model^-0.5) that transformers' init gives an nn.Embedding
    (what it held before: the scheme's own init was skipped). A loaded model keeps the table it saved."""
    torch.manual_seed(0)
    config = tiny_config("t5", d_model=64, encoder_attention_heads=8, decoder_attention_heads=8,
                         relative_attention_num_buckets=64, init_std=0.005)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(config)
    tables = [stack.positions.relative_attention_bias.weight for stack in (model.model.encoder, model.model.decoder)]
    for table in tables:
        assert table.std().item() == pytest.approx(0.005, rel=0.1)   # 512 draws: the std within 3%
    model.save_pretrained(tmp_path)
    torch.manual_seed(1)
    reloaded = hf_relpos.RelPosTransformerForConditionalGeneration.from_pretrained(tmp_path)
    for stack, table in zip((reloaded.model.encoder, reloaded.model.decoder), tables, strict=True):
        assert torch.equal(stack.positions.relative_attention_bias.weight, table)


@pytest.mark.parametrize("model_class", [hf_relpos.RelPosTransformerForConditionalGeneration,
                                         hf_relpos.RelPosTransformerForCausalLM])
def test_reinitialising_with_apply_keeps_the_tied_embeddings_rule(model_class):
    """`model.apply(model._init_weights)` (re-initialising a built model) draws the tied token embeddings as a built
    model has them, N(0, d_model^-0.5) with the padding row zero: the output layer, whose weight they are, is not
    drawn again as a linear at N(0, init_std) over them. Untied, the output layer is a linear of its own and is."""
    config = tiny_config("shaw", d_model=64, vocab_size=400, init_std=0.002)
    torch.manual_seed(0)
    tied = model_class(config)
    tied.apply(tied._init_weights)
    embeddings = tied.get_input_embeddings().weight
    assert tied.get_output_embeddings().weight is embeddings
    assert embeddings.std().item() == pytest.approx(64**-0.5, rel=0.05)   # 25,600 draws: the std within 1%
    assert not embeddings[config.pad_token_id].any()
    untied = model_class(tiny_config("shaw", d_model=64, vocab_size=400, init_std=0.002, tie_word_embeddings=False))
    untied.apply(untied._init_weights)
    assert untied.get_output_embeddings().weight.std().item() == pytest.approx(0.002, rel=0.05)
    assert untied.get_input_embeddings().weight.std().item() == pytest.approx(64**-0.5, rel=0.05)


def test_unknown_scheme_error_lists_the_registered_ones():
    with pytest.raises(ValueError) as error:
        tiny_config("sandwich")
    for name in ("absolute", "shaw", "xl", "directional", "none", "alibi", "t5", "rope"):
        assert name in str(error.value)


def test_hf_bookkeeping_keys_are_still_accepted():
    config = tiny_config(auto_map={"AutoConfig": "configuration_relpos.RelPosTransformerConfig"}, name_or_path="x")
    assert config.auto_map["AutoConfig"].endswith("RelPosTransformerConfig")
