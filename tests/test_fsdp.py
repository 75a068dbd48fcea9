"""FSDP as configs/accelerate/fsdp.yaml sets it up, proven on CPUs. accelerate shards only over GPUs (on the CPU it
runs an FSDP launch as DDP), so the launched worker sets the plugin that the launch built from fsdp.yaml's settings
by hand and wraps the model with accelerate's own `fsdp2_prepare_model`, what the Trainer calls on GPUs: one FSDP unit
per `RelPosLayer`, the tied embeddings sharded once, two gloo processes training the model a single process trains
on the whole batch, and a full state dict that `from_pretrained` loads. train_translation.py itself refuses an FSDP
launch on the CPU instead of training it unsharded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy
from conftest import tiny_config
from test_train_distributed import launch, write_config

from hf_relpos import RelPosTransformerForConditionalGeneration
from hf_relpos.model.modeling_relpos import RelPosLayer
from hf_relpos.translation.preflight import PreflightError, check_sharding

REPO = Path(__file__).resolve().parents[1]
FSDP_CONFIG = REPO / "configs" / "accelerate" / "fsdp.yaml"
ON_TWO_CPU_PROCESSES = ("--num_processes", "2", "--mixed_precision", "no")
SCHEMES = ("shaw", "xl", "t5")

# Each process: accelerate's plugin from the launch's FSDP_* settings (fsdp.yaml), the model wrapped by accelerate's
# fsdp2_prepare_model, three AdamW steps on this rank's half of a batch; rank 0 then trains a reference on the whole
# batch in one process and saves both (the FSDP model from its full state dict) with save_pretrained.
WORKER = '''
import json, os, sys
import torch
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.fsdp_utils import fsdp2_prepare_model
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule
from hf_relpos import RelPosTransformerConfig, RelPosTransformerForConditionalGeneration

accelerator = Accelerator(cpu=True)
accelerator.state.fsdp_plugin = FullyShardedDataParallelPlugin()
rank, out = accelerator.process_index, os.environ["RECORD_DIR"]
generator = torch.Generator().manual_seed(5)
sources, targets = torch.randint(3, 40, (4, 6), generator=generator), torch.randint(3, 40, (4, 5), generator=generator)
record = {}

def build(scheme):
    torch.manual_seed(0)
    config = RelPosTransformerConfig(vocab_size=40, d_model=32, encoder_layers=2, decoder_layers=2,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, dropout=0.0, position_scheme=scheme,
                                     **RelPosTransformerConfig.held_fields(scheme, {"max_relative_position": 3}))
    return RelPosTransformerForConditionalGeneration(config).double().train()

def train(model, rows):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        optimizer.zero_grad()
        model(input_ids=sources[rows], labels=targets[rows]).loss.backward()
        optimizer.step()

for scheme in sys.argv[1:]:
    model = fsdp2_prepare_model(accelerator, build(scheme))
    units = [name for name, module in model.named_modules() if isinstance(module, FSDPModule)]
    train(model, slice(2 * rank, 2 * rank + 2))
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        embeddings = [full[name] for name in ("model.shared.weight", "model.encoder.embed_tokens.weight",
                                              "model.decoder.embed_tokens.weight", "lm_head.weight")]
        record[scheme] = {"units": units, "tied": all(torch.equal(e, embeddings[0]) for e in embeddings)}
        saved = build(scheme)
        saved.load_state_dict(full)
        saved.save_pretrained(os.path.join(out, scheme, "fsdp"))
        reference = build(scheme)
        train(reference, slice(0, 4))
        reference.save_pretrained(os.path.join(out, scheme, "reference"))
if rank == 0:
    with open(os.path.join(out, "record.json"), "w") as handle:
        json.dump(record, handle)
accelerator.wait_for_everyone()
accelerator.end_training()
'''


def test_fsdp_yaml_wraps_each_relpos_layer_in_its_own_unit(monkeypatch):
    """The plugin accelerate builds from fsdp.yaml's settings (as `accelerate launch` exports them) resolves its
    transformer-based wrap policy to exactly the model's RelPosLayer modules."""
    settings = yaml.safe_load(FSDP_CONFIG.read_text(encoding="utf-8"))["fsdp_config"]
    monkeypatch.setenv("FSDP_VERSION", str(settings["fsdp_version"]))
    monkeypatch.setenv("FSDP_AUTO_WRAP_POLICY", settings["fsdp_auto_wrap_policy"])
    monkeypatch.setenv("FSDP_TRANSFORMER_CLS_TO_WRAP", settings["fsdp_transformer_layer_cls_to_wrap"])
    model = RelPosTransformerForConditionalGeneration(tiny_config("shaw"))
    layers = [*model.model.encoder.layers, *model.model.decoder.layers]
    assert set(model._no_split_modules) == {RelPosLayer.__name__}
    for named in (True, False):   # the class named in fsdp.yaml, or none: the model's _no_split_modules
        if not named:
            monkeypatch.delenv("FSDP_TRANSFORMER_CLS_TO_WRAP")
        policy = fsdp2_prepare_auto_wrap_policy(FullyShardedDataParallelPlugin(), model)
        wrapped = [module for module in model.modules() if policy(module)]
        assert len(wrapped) == len(layers) == 4 and all(a is b for a, b in zip(wrapped, layers, strict=True))


def test_tied_stacks_call_the_shared_embedding_module():
    """FSDP2 shards `shared` with lm_head (accelerate's tail group) and refuses the same weight under another module
    of the root group ('shared with a parameter already managed by another FSDP group'): tied, both stacks call the
    `shared` module itself."""
    model = RelPosTransformerForConditionalGeneration(tiny_config("shaw"))
    assert model.model.encoder.embed_tokens is model.model.shared is model.model.decoder.embed_tokens
    assert model.lm_head.weight is model.model.shared.weight
    untied = RelPosTransformerForConditionalGeneration(tiny_config("shaw", tie_word_embeddings=False))
    assert untied.model.encoder.embed_tokens is not untied.model.decoder.embed_tokens


def test_two_gloo_processes_train_with_fsdp2_as_one_process_does(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER, encoding="utf-8")
    (tmp_path / "records").mkdir()
    completed = launch(tmp_path, worker, *SCHEMES, config_file=FSDP_CONFIG, launch_flags=ON_TWO_CPU_PROCESSES)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    record = json.loads((tmp_path / "records" / "record.json").read_text())
    layers = [f"model.{stack}.layers.{index}" for stack in ("encoder", "decoder") for index in range(2)]
    for scheme in SCHEMES:
        assert sorted(record[scheme]["units"]) == sorted(["", "model.shared", "lm_head", *layers])
        assert record[scheme]["tied"]
        sharded = RelPosTransformerForConditionalGeneration.from_pretrained(tmp_path / "records" / scheme / "fsdp")
        reference = RelPosTransformerForConditionalGeneration.from_pretrained(
            tmp_path / "records" / scheme / "reference")
        expected = reference.state_dict()
        for name, weight in sharded.state_dict().items():
            torch.testing.assert_close(weight, expected[name], rtol=0, atol=1e-12, msg=f"{scheme}: {name}")
        assert sharded.lm_head.weight is sharded.model.shared.weight


@pytest.mark.parametrize(("world_size", "device", "use_fsdp", "refused"), [
    (2, "cpu", "true", True), (2, "cuda", "true", False), (1, "cpu", "true", False), (2, "cpu", "false", False)])
def test_only_an_fsdp_launch_of_several_cpu_processes_is_refused(monkeypatch, world_size, device, use_fsdp, refused):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", use_fsdp)
    if refused:
        with pytest.raises(PreflightError, match="accelerate shards only over GPUs"):
            check_sharding(world_size, torch.device(device))
    else:
        check_sharding(world_size, torch.device(device))


@pytest.mark.slow
def test_train_translation_refuses_an_fsdp_launch_on_the_cpu(tmp_path):
    """accelerate would run it as DDP (each process holding the whole model) and the run record would say sharded."""
    config_path, output_dir = write_config(tmp_path)
    completed = launch(tmp_path, REPO / "train_translation.py", str(config_path), "--use_cpu", "true",
                       config_file=FSDP_CONFIG, launch_flags=ON_TWO_CPU_PROCESSES)
    assert completed.returncode != 0
    assert completed.stderr.count("train_translation.py: error: an FSDP launch (ACCELERATE_USE_FSDP") == 1
    assert "configs/accelerate/cpu_2proc.yaml" in completed.stderr
    assert not output_dir.exists()


# Each process: the model wrapped as the Trainer wraps it under fsdp.yaml, then `average_final_weights` of a run
# folder holding two checkpoints (other seeds' weights); rank 0 records which tensors of the full state dict differ
# from the mean of the two checkpoints.
AVERAGE_WORKER = '''
import json, os
from pathlib import Path
from types import SimpleNamespace
import torch
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.fsdp_utils import fsdp2_prepare_model
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from hf_relpos import RelPosTransformerConfig, RelPosTransformerForConditionalGeneration
from hf_relpos.translation.final_model import average_final_weights

accelerator = Accelerator(cpu=True)
accelerator.state.fsdp_plugin = FullyShardedDataParallelPlugin()
rank, out = accelerator.process_index, Path(os.environ["RECORD_DIR"])
run = out / "run"

def build(seed):
    torch.manual_seed(seed)
    config = RelPosTransformerConfig(vocab_size=40, d_model=32, encoder_layers=2, decoder_layers=2,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, dropout=0.0, max_relative_position=3, position_scheme="shaw")
    return RelPosTransformerForConditionalGeneration(config)

if rank == 0:
    for step, seed in ((2, 1), (4, 2)):
        build(seed).save_pretrained(run / f"checkpoint-{step}")
        (run / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
accelerator.wait_for_everyone()
model = fsdp2_prepare_model(accelerator, build(0))
average_final_weights(SimpleNamespace(accelerator=accelerator, args=SimpleNamespace(output_dir=str(run)),
                                      state=SimpleNamespace(global_step=4), model=model,
                                      saves_on_schedule=lambda step: True), 2)
full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
if rank == 0:
    first, second = build(1).state_dict(), build(2).state_dict()
    differing = [name for name, tensor in full.items()
                 if not torch.allclose(tensor, (first[name] + second[name]) / 2, rtol=0, atol=1e-6)]
    (out / "record.json").write_text(json.dumps({"tensors": len(full), "differing": differing}))
accelerator.wait_for_everyone()
accelerator.end_training()
'''


def test_average_checkpoints_loads_the_average_into_an_fsdp2_sharded_model(tmp_path):
    """`average_checkpoints` under fsdp.yaml (the big recipe's launch): the model's parameters are DTensor shards, and
    copying the full average into them failed after training ('aten.copy_.default got mixed torch.Tensor and
    DTensor'); each process now takes its shard of the average."""
    worker = tmp_path / "worker.py"
    worker.write_text(AVERAGE_WORKER, encoding="utf-8")
    (tmp_path / "records").mkdir()
    completed = launch(tmp_path, worker, config_file=FSDP_CONFIG, launch_flags=ON_TWO_CPU_PROCESSES)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    record = json.loads((tmp_path / "records" / "record.json").read_text())
    assert record["tensors"] > 0 and record["differing"] == []
