"""The Python examples of the README and of the pages split from it (docs/internals.md, docs/extending.md) run as
written (each in a fresh process, in an empty folder); those that open a training run's folder with
pipeline("translation") (docs/hub.md's too) run in this process on such a folder, as does docs/training.md's LoRA
example on a saved model."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MEMORISED_PAIRS, tiny_model
from huggingface_hub import ModelCard

from hf_relpos.publish import hub

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "docs" / "internals.md", ROOT / "docs" / "extending.md"]


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.DOTALL)


BLOCKS = [block for page in PAGES for block in python_blocks(page)]
SELF_CONTAINED = [block for block in BLOCKS if "outputs/" not in block]
# (code, folder) of each example that opens a folder under outputs/ with pipeline("translation")
PIPELINE_EXAMPLES = [(block, folder) for page in [*PAGES, ROOT / "docs" / "hub.md"] for block in python_blocks(page)
                     for folder in re.findall(r'pipeline\("translation", model="(outputs/\w+)"', block)]


def test_the_docs_have_self_contained_examples():
    assert len(SELF_CONTAINED) >= 2 and any("register_position_scheme" in block for block in SELF_CONTAINED)


def extending_example_module() -> str:
    """docs/extending.md's example scheme (its first block, up to where it builds a config): the `my_schemes` module
    that its later examples import."""
    return re.search(r"```python\n(.*?)\nconfig = ", (ROOT / "docs" / "extending.md").read_text(encoding="utf-8"),
                     flags=re.DOTALL).group(1)


# an example that imports the example scheme's module and defines tests (docs/extending.md's check of it): its tests
# are called after it runs
RUN_ITS_TESTS = """
for _name, _test in list(globals().items()):
    if _name.startswith("test_") and callable(_test):
        _test()
        print("PASSED", _name)
"""


@pytest.mark.parametrize("block", SELF_CONTAINED, ids=[f"block{index}" for index in range(len(SELF_CONTAINED))])
def test_readme_example_runs(block, tmp_path):
    code = block
    if "import my_schemes" in block:
        (tmp_path / "my_schemes.py").write_text(extending_example_module(), encoding="utf-8")
        code = block + RUN_ITS_TESTS
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                               timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    if code != block:
        assert "PASSED test_" in completed.stdout, completed.stdout[-3000:]


def test_the_extending_guide_shows_a_users_scheme_checked_from_its_tests():
    """docs/extending.md's check of its ALiBi example is a self-contained example that runs (above) and calls
    hf_relpos.testing.check_position_scheme with an oracle."""
    assert any("import my_schemes" in block and "check_position_scheme(" in block and "oracle=" in block
               for block in SELF_CONTAINED)


def test_the_readme_custom_scheme_gets_a_complete_model_card(tmp_path):
    """The ALiBi example (docs/extending.md) registers a scheme from user code; the card it prints names it, shows its equation, its
    settings from the config and its citation, all taken from the class (hub.py knows no scheme by name)."""
    (block,) = [block for block in SELF_CONTAINED if "register_position_scheme" in block]
    completed = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, cwd=tmp_path,
                               timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    card = ModelCard(completed.stdout)
    assert set(card.data.tags) == {"translation", "relative-position", "my_alibi", "hf_relpos"}
    for expected in ("uses ALiBi linear distance biases (Press et al. 2022)", "## Position scheme: `my_alibi`",
                     "$m_h = 2^{-b h / H}$", "| `alibi_max_bias` (b) | 4 | slopes m_h = 2^(-b h / H)",
                     "the module that registers the scheme has been imported before `from_pretrained`",
                     "@inproceedings{press2022alibi", "@inproceedings{vaswani2017attention"):
        assert expected in card.text, expected


def test_the_pipeline_examples_translate_a_trained_folder(memorised_model_folder, tmp_path, monkeypatch):
    """Each example that opens a training run's folder with pipeline("translation") runs as written on such a folder
    (it declares its own pipeline, `add_translation_pipeline`, as the training app leaves it) at the example's path,
    and the pipeline it builds translates."""
    assert len(PIPELINE_EXAMPLES) >= 3
    monkeypatch.chdir(tmp_path)
    for index, (code, folder) in enumerate(PIPELINE_EXAMPLES):
        target = tmp_path / str(index) / folder
        shutil.copytree(memorised_model_folder, target)
        hub.add_translation_pipeline(target)
        monkeypatch.chdir(tmp_path / str(index))
        namespace = {}
        exec(compile(code, f"example {index}", "exec"), namespace)
        translate = namespace.get("translate")
        if translate is not None:
            assert translate(MEMORISED_PAIRS[0][0]) == [{"translation_text": MEMORISED_PAIRS[0][1]}]


def test_the_training_guides_lora_example_runs_as_written_on_a_saved_model(tmp_path, monkeypatch):
    """docs/training.md's LoRA example, given nothing but its own imports, wraps the model folder it names (a saved
    Shaw model there) in adapters, the scheme's own parameters trained beside them."""
    from peft import PeftModel

    (block,) = [block for block in python_blocks(ROOT / "docs" / "training.md") if "get_peft_model(" in block]
    tiny_model("shaw").save_pretrained(tmp_path / "outputs" / "demo")
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(block, "docs/training.md LoRA example", "exec"), namespace)
    model = namespace["model"]
    assert isinstance(model, PeftModel)
    trainable = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
    assert any("lora_A" in name for name in trainable) and any("positions" in name for name in trainable)
