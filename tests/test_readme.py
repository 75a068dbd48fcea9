"""The Python examples of the README and of the pages split from it (docs/internals.md, docs/extending.md) run as
written (each in a fresh process, in an empty folder)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "docs" / "internals.md", ROOT / "docs" / "extending.md"]
BLOCKS = [block for page in PAGES
          for block in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.DOTALL)]
SELF_CONTAINED = [block for block in BLOCKS if "outputs/" not in block]


def test_the_docs_have_self_contained_examples():
    assert len(SELF_CONTAINED) >= 2 and any("register_position_scheme" in block for block in SELF_CONTAINED)


@pytest.mark.parametrize("block", SELF_CONTAINED, ids=[f"block{index}" for index in range(len(SELF_CONTAINED))])
def test_readme_example_runs(block, tmp_path):
    completed = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, cwd=tmp_path,
                               timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]


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
                     "its code must be importable wherever this model is loaded",
                     "@inproceedings{press2022alibi", "@inproceedings{vaswani2017attention"):
        assert expected in card.text, expected
