"""The shipped YAML recipes parse, and hold the paper settings they claim."""

from pathlib import Path

import pytest
from transformers.utils import is_torch_bf16_gpu_available

from hf_relpos.publish.hub import load_recipe
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
