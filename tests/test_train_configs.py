"""The shipped YAML recipes parse, and hold the paper settings they claim."""

from pathlib import Path

import pytest
import torch
from conftest import tiny_config
from transformers.utils import is_torch_bf16_gpu_available

from hf_relpos import RelPosTransformerForConditionalGeneration
from hf_relpos.publish.records import load_recipe
from hf_relpos.translation.arguments import ConfigError, run_model_config
from hf_relpos.translation.trainer import PromotedLabelSmoother
from hf_relpos.translation.training import parse_arguments

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SCHEMES = ("absolute", "shaw", "xl", "directional", "rope", "alibi", "t5")
# What each scheme's WMT14 base recipe sets beyond position_scheme (the papers' values, or the scheme's defaults).
SCHEME_FIELDS = {
    "absolute": {}, "alibi": {}, "directional": {},
    "shaw": {"max_relative_position": 16, "use_relative_keys": True, "use_relative_values": True},
    "xl": {"clamp_len": 1000, "untie_relative_biases": True},
    "rope": {"rope_theta": 10000.0, "rotary_dim": None},
    "t5": {"relative_attention_num_buckets": 32, "relative_attention_max_distance": 128},
}


def parse(name: str, *flags: str):
    return parse_arguments([str(CONFIGS / name), *flags])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_wmt14_base_recipes(scheme):
    model_args, data_args, training_args = parse(f"wmt14_en_de_base_{scheme}.yaml")
    model = model_args.model_config
    assert model["position_scheme"] == scheme and model["layer_norm_position"] == "post"
    assert (model["d_model"], model["encoder_layers"], model["decoder_layers"]) == (512, 6, 6)
    assert (model["encoder_attention_heads"], model["encoder_ffn_dim"], model["dropout"]) == (8, 2048, 0.1)
    assert model["tie_word_embeddings"] is True
    assert {name: model[name] for name in SCHEME_FIELDS[scheme]} == SCHEME_FIELDS[scheme]
    assert (data_args.dataset_name, data_args.dataset_config_name) == ("wmt/wmt14", "de-en")
    assert (data_args.source_lang, data_args.target_lang) == ("en", "de")
    assert model_args.tokenizer_vocab_size == 32768 and model_args.tokenizer_character_coverage == 0.9999
    assert (training_args.adam_beta1, training_args.adam_beta2, training_args.adam_epsilon) == (0.9, 0.98, 1e-9)
    assert training_args.lr_scheduler_type == "inverse_sqrt" and training_args.warmup_steps == 4000
    assert training_args.learning_rate == pytest.approx(512**-0.5 * 4000**-0.5, rel=0.01)
    assert training_args.label_smoothing_factor == 0.1 and training_args.weight_decay == 0.0
    assert (training_args.generation_num_beams, training_args.generation_length_penalty,
            training_args.generation_max_length_offset) == (4, 0.6, 50)
    assert training_args.max_tokens_per_batch * 8 == 25000
    assert training_args.bf16_if_supported and training_args.bf16 == is_torch_bf16_gpu_available()
    # Vaswani et al.: the last 5 checkpoints averaged, written every 10 minutes (1500 steps at 0.4 s a step)
    assert (training_args.save_strategy, training_args.save_steps, training_args.save_total_limit,
            training_args.average_checkpoints) == ("steps", 1500, 5, 5)
    header = (CONFIGS / f"wmt14_en_de_base_{scheme}.yaml").read_text().splitlines()[1]
    assert header.endswith(f"wmt14_en_de_base_{scheme}.yaml --gradient_accumulation_steps 8   # one GPU")

def test_wmt14_big_recipe():
    model_args, _, training_args = parse("wmt14_en_de_big_shaw.yaml")  # bf16_if_supported: parses on a CPU too
    model = model_args.model_config
    assert (model["d_model"], model["encoder_attention_heads"], model["encoder_ffn_dim"]) == (1024, 16, 4096)
    assert (model["dropout"], model["max_relative_position"]) == (0.3, 8)
    assert training_args.learning_rate == pytest.approx(1024**-0.5 * 4000**-0.5, rel=0.01)
    # Vaswani et al.: the last 20 checkpoints averaged, written every 10 minutes (600 steps at 1.0 s a step)
    assert (training_args.save_strategy, training_args.save_steps, training_args.save_total_limit,
            training_args.average_checkpoints) == ("steps", 600, 20, 20)


def test_multi30k_recipes_differ_only_in_the_scheme():
    texts = {scheme: load_recipe(CONFIGS / f"multi30k_small_{scheme}.yaml") for scheme in SCHEMES}
    for scheme, config in texts.items():
        assert config["model"].pop("position_scheme") == scheme
        assert config.pop("output_dir") == f"outputs/multi30k_small_{scheme}"
        assert config["model"]["attention_dropout"] == 0.1
    assert all(config == texts["shaw"] for config in texts.values())
    model_args, data_args, _ = parse("multi30k_small_shaw.yaml")
    assert data_args.dataset_name == "bentrevett/multi30k" and data_args.dataset_config_name is None
    assert model_args.tokenizer_character_coverage == 1.0   # every character: the recorded tokenizers stay valid
    _, local, _ = parse("multi30k_small_shaw.yaml", "--train_file", "t.jsonl", "--validation_file", "v.jsonl")
    assert local.uses_local_files


def test_a_field_of_another_scheme_than_the_runs_is_one_config_error_where_its_source_chose_the_scheme(tmp_path,
                                                                                                       caplog):
    """A field only another scheme reads, set to another value than its default, would do nothing: one ConfigError
    naming the field, the scheme that reads it and the run's, where the recipe file sets it beside the scheme (or
    under the default one), or a flag sets it (also for a saved model's run, one that only evaluates included). A
    recipe written for one scheme and run with another by a flag keeps working, the field ignored with a warning;
    at its default (the multi30k recipes' shared max_relative_position: 16) it passes without a word."""
    message = ("^model: max_relative_position=8 is a field of position_scheme 'shaw', which position_scheme 'rope' "
               "does not read: remove max_relative_position")
    recipe = tmp_path / "rope_k8.yaml"
    recipe.write_text((CONFIGS / "multi30k_small_rope.yaml").read_text().replace("max_relative_position: 16",
                                                                               "max_relative_position: 8"))
    with pytest.raises(ConfigError, match=message):
        parse_arguments([str(recipe)])
    with pytest.raises(ConfigError, match=message.replace("'rope'", "'directional'")):   # the default scheme
        parse_arguments([str(recipe), "--model.position_scheme", "directional", "--model.max_relative_position", "8"])
    with caplog.at_level("WARNING"):
        model_args, _, _ = parse("wmt14_en_de_big_shaw.yaml", "--model.position_scheme", "rope")
    assert "max_relative_position" not in model_args.model_config
    assert ("model: max_relative_position=8, set by the recipe file, only other schemes than this run's "
            "position_scheme 'rope' read: ignored") in caplog.text
    caplog.clear()
    assert "max_relative_position" not in parse("multi30k_small_rope.yaml")[0].model_config
    assert "max_relative_position" not in caplog.text
    RelPosTransformerForConditionalGeneration(tiny_config("rope")).save_pretrained(tmp_path / "rope")
    for flags in ((), ("--do_train", "false", "--do_eval", "true")):
        with pytest.raises(ConfigError, match=message):
            parse("multi30k_small_rope.yaml", "--model_name_or_path", str(tmp_path / "rope"),
                  "--model.max_relative_position", "8", *flags)


def test_demo_recipe_uses_the_generated_corpus():
    model_args, data_args, training_args = parse("demo.yaml")
    assert data_args.dataset_name == "demo" and training_args.do_train and training_args.do_predict
    assert model_args.tokenizer_vocab_size == 400 + 256  # 400 pieces as before byte fallback
    assert model_args.tokenizer_character_coverage == 1.0
    assert training_args.cpu_threads == 1 and training_args.max_tokens_per_batch == 512


@pytest.mark.parametrize("name", ["multi_gpu.yaml", "fsdp.yaml"])
def test_accelerate_configs_are_valid(name):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(CONFIGS / "accelerate" / name))
    assert config.num_processes == 8 and config.distributed_type.value in ("MULTI_GPU", "FSDP")


def test_cpu_accelerate_config_launches_two_processes():
    """accelerate launches several processes only for a multi-device type; use_cpu there would start one process.
    The Trainer is told the CPU by train_translation.py's --use_cpu true (tests/test_train_distributed.py runs it)."""
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(CONFIGS / "accelerate" / "cpu_2proc.yaml"))
    assert (config.num_processes, config.distributed_type.value, config.use_cpu) == (2, "MULTI_GPU", False)


def test_bf16_if_supported_turns_bf16_on_only_where_the_gpu_has_it(monkeypatch):
    import transformers.training_args

    import hf_relpos.translation.arguments

    for module in (hf_relpos.translation.arguments, transformers.training_args):
        monkeypatch.setattr(module, "is_torch_bf16_gpu_available", lambda: False)
    assert not parse("wmt14_en_de_base_shaw.yaml")[2].bf16
    for module in (hf_relpos.translation.arguments, transformers.training_args):
        monkeypatch.setattr(module, "is_torch_bf16_gpu_available", lambda: True)
    assert parse("wmt14_en_de_base_shaw.yaml")[2].bf16
    assert not parse("wmt14_en_de_base_shaw.yaml", "--bf16_if_supported", "false")[2].bf16
    assert not parse("wmt14_en_de_base_shaw.yaml", "--use_cpu", "true")[2].bf16
    assert not parse("demo.yaml")[2].bf16  # off unless a recipe asks for it


def test_the_yaml_precision_wins_over_the_launch_configs_mixed_precision(monkeypatch):
    """`accelerate launch` exports its config's mixed_precision (fsdp.yaml said bf16), which transformers took when the
    YAML's bf16 was off: --bf16_if_supported false, or a GPU without bf16, trained (or failed) in bf16 anyway."""
    import hf_relpos.translation.arguments

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    monkeypatch.setattr(hf_relpos.translation.arguments, "is_torch_bf16_gpu_available", lambda: False)
    assert parse("wmt14_en_de_big_shaw.yaml")[2].mixed_precision == "no"
    monkeypatch.setattr(hf_relpos.translation.arguments, "is_torch_bf16_gpu_available", lambda: True)
    assert parse("wmt14_en_de_big_shaw.yaml", "--bf16_if_supported", "false")[2].mixed_precision == "no"


@pytest.mark.parametrize("logs", [True, False], ids=["process-that-logs", "other-rank"])
def test_the_unused_launch_precision_is_said_once_by_the_process_that_logs(monkeypatch, caplog, logs):
    """The warning that accelerate's mixed_precision is not used comes from the process that logs (one per machine,
    `should_log`), not from every rank of the launch (8 copies on 8 GPUs)."""
    from hf_relpos.translation.arguments import TranslationTrainingArguments

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    monkeypatch.setattr(TranslationTrainingArguments, "should_log", property(lambda self: logs))
    with caplog.at_level("WARNING", logger="hf_relpos.translation.arguments"):
        assert parse("demo.yaml")[2].mixed_precision == "no"
    said = [record for record in caplog.records
            if "accelerate's mixed_precision 'bf16' is not used" in record.getMessage()]
    assert len(said) == (1 if logs else 0)


@pytest.mark.parametrize("name", sorted(path.name for path in CONFIGS.glob("*.yaml") if not path.name.startswith("finetune")))
def test_every_recipe_parses_with_a_valid_model_config(name):
    """parse_arguments builds the recipe's RelPosTransformerConfig, so each scheme checks its own fields here."""
    model_args, _, _ = parse(name)
    assert model_args.model_config["position_scheme"] in name or name == "demo.yaml"


# --- every parameter trains in each step: every recipe's `ddp_find_unused_parameters: false` ---------------------

# A recipe's model shrunk to test size by flags; every position and architecture field stays the recipe's.
TINY_SIZES = ("--model.d_model", "16", "--model.encoder_layers", "2", "--model.decoder_layers", "2",
              "--model.encoder_attention_heads", "2", "--model.decoder_attention_heads", "2",
              "--model.encoder_ffn_dim", "32", "--model.decoder_ffn_dim", "32")
TINY_VOCABULARY = 40


def padded_batch_with_labels(vocab_size: int = TINY_VOCABULARY) -> dict[str, torch.Tensor]:
    """Three pairs: a source padded after its </s>, a target padded with -100 (as DataCollatorForSeq2Seq pads)."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, vocab_size, (3, 9), generator=generator)
    input_ids[:, -1] = 1
    input_ids[1, 5], input_ids[1, 6:] = 1, 0
    labels = torch.randint(4, vocab_size, (3, 7), generator=generator)
    labels[:, -1] = 1
    labels[2, 3], labels[2, 4:] = 1, -100
    return {"input_ids": input_ids, "attention_mask": (input_ids != 0).long(), "labels": labels}


def parameters_without_a_gradient(model: torch.nn.Module, label_smoothing_factor: float) -> list[str]:
    """One training step's backward pass (dropout on, a padded batch, the run's label-smoothed loss,
    `PromotedLabelSmoother`): the trainable parameters it leaves without a gradient, which DDP under
    ddp_find_unused_parameters false stops a launch of several processes for at its second step."""
    model.train()
    batch = padded_batch_with_labels(model.config.vocab_size)
    outputs = model(**batch)
    loss = (PromotedLabelSmoother(epsilon=label_smoothing_factor)(outputs, batch["labels"])
            if label_smoothing_factor > 0 else outputs.loss)
    loss.backward()
    return [name for name, parameter in model.named_parameters() if parameter.requires_grad and parameter.grad is None]


def tiny_recipe_model(name: str, *flags: str) -> tuple[RelPosTransformerForConditionalGeneration, float]:
    """The model the recipe `name` trains (the app's `run_model_config`), shrunk (`TINY_SIZES`), with its label
    smoothing factor."""
    model_args, _, training_args = parse(name, *TINY_SIZES, *flags)
    config = run_model_config(model_args)
    config.vocab_size = TINY_VOCABULARY
    torch.manual_seed(0)
    return RelPosTransformerForConditionalGeneration(config), training_args.label_smoothing_factor


@pytest.mark.parametrize("name", sorted(path.name for path in CONFIGS.glob("*.yaml") if not path.name.startswith("finetune")))
def test_one_training_step_of_every_recipe_gives_every_parameter_a_gradient(name):
    """Each recipe's model (shrunk, every position and architecture field kept) on sdpa and eager: the recipes'
    ddp_find_unused_parameters false says every parameter takes part in each step."""
    for kernel in ("sdpa", "eager"):
        model, label_smoothing = tiny_recipe_model(name, "--attn_implementation", kernel)
        assert parameters_without_a_gradient(model, label_smoothing) == [], kernel


@pytest.mark.parametrize("name", sorted(path.name for path in CONFIGS.glob("*.yaml")))
def test_every_recipe_tells_ddp_that_every_parameter_trains(name):
    """Every recipe sets ddp_find_unused_parameters false (the tests below show each parameter gets a gradient): left
    unset, the Trainer passes find_unused_parameters=True for a PreTrainedModel, and under `accelerate launch` DDP
    then walks the autograd graph after every step and every rank warns that it found no unused parameter."""
    assert load_recipe(CONFIGS / name).get("ddp_find_unused_parameters") is False


@pytest.mark.parametrize("scheme", ["absolute", "shaw", "xl", "directional", "rope", "alibi", "t5", "none"])
def test_the_fine_tuning_recipe_gives_every_parameter_of_a_converted_marian_model_a_gradient(tmp_path, scheme):
    """configs/finetune_marian_en_de_shaw.yaml on a tiny MarianMT model converted to each scheme (its new position
    parameters start at zero, Marian's weights copied), and to Shaw's with Marian's sinusoids kept."""
    from test_convert import marian_model

    from hf_relpos.tools.convert import marian_to_relpos

    for kept in (False, True) if scheme in ("shaw", "xl", "t5", "none") else (False,):
        folder = tmp_path / f"{scheme}-{kept}"
        marian_to_relpos(marian_model(vocab_size=TINY_VOCABULARY), scheme,
                         keep_absolute_positions=kept).save_pretrained(folder)
        model_args, _, training_args = parse("finetune_marian_en_de_shaw.yaml", "--model_name_or_path", str(folder))
        torch.manual_seed(0)
        model = RelPosTransformerForConditionalGeneration(run_model_config(model_args))
        assert parameters_without_a_gradient(model, training_args.label_smoothing_factor) == [], kept


# Options a user may add to a recipe (model fields and training arguments that change the model's graph), each on
# top of the WMT14 base recipe of every scheme that takes it.
RECIPE_OPTIONS = {
    "key dropout": ("--model.attention_dropout", "0.2", "--model.attention_dropout_kind", "keys"),
    "probability dropout": ("--model.attention_dropout", "0.2"),
    "window": ("--model.self_attention_window", "1"),
    "length scaling": ("--model.cross_attention_length_scaling", "true"),
    "randomized positions": ("--model.position_randomization_max", "300"),
    "randomized at inference": ("--model.position_randomization_max", "300",
                                "--model.position_randomization_at_inference", "true"),
    "kept sinusoids faded out": ("--model.keep_absolute_positions", "true", "--model.absolute_positions_scale", "0"),
    "untied embeddings": ("--model.tie_word_embeddings", "false"),
    "pre-LN": ("--model.layer_norm_position", "pre"),
    "no label smoothing": ("--label_smoothing_factor", "0"),
}


@pytest.mark.parametrize("option", list(RECIPE_OPTIONS))
def test_the_options_a_recipe_may_add_leave_no_parameter_without_a_gradient(option):
    for scheme in SCHEMES:
        if scheme == "absolute" and option == "kept sinusoids faded out":   # refused: it has them already
            continue
        model, label_smoothing = tiny_recipe_model(f"wmt14_en_de_base_{scheme}.yaml", *RECIPE_OPTIONS[option])
        assert parameters_without_a_gradient(model, label_smoothing) == [], scheme


@pytest.mark.parametrize("scheme", SCHEMES)
def test_an_encoder_without_layers_under_ddp_find_unused_parameters_false_is_refused_where_it_leaves_parameters_out(
        scheme):
    """`--model.encoder_layers 0` on a WMT recipe: the encoder's position scheme keeps its parameters (Shaw's tables,
    XL's biases, T5's buckets), which no step reads; under the recipe's ddp_find_unused_parameters false a launch of
    several processes stopped at its second step. It is one ConfigError naming both fields and those parameters,
    when the arguments are read; with ddp_find_unused_parameters true, or for a scheme without parameters, the run
    is accepted."""
    name = f"wmt14_en_de_base_{scheme}.yaml"
    model, label_smoothing = tiny_recipe_model(name, "--model.encoder_layers", "0", "--ddp_find_unused_parameters",
                                               "true")
    left_out = parameters_without_a_gradient(model, label_smoothing)
    if not left_out:
        parse(name, "--model.encoder_layers", "0")
        return
    assert all(parameter.startswith("model.encoder.positions.") for parameter in left_out)
    with pytest.raises(ConfigError) as refused:
        parse(name, "--model.encoder_layers", "0")
    assert str(refused.value) == (
        "ddp_find_unused_parameters false says every parameter takes part in each training step, but model: "
        f"encoder_layers 0 leaves the encoder's position parameters out of every step ({', '.join(left_out)}): DDP "
        "would stop a launch of several processes at its second step; set ddp_find_unused_parameters true, or "
        "encoder_layers 1 or more")
