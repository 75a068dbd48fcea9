"""The README's Python examples run as written (each in a fresh process, in an empty folder)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)
SELF_CONTAINED = [block for block in BLOCKS if "outputs/" not in block]


def test_the_readme_has_self_contained_examples():
    assert len(SELF_CONTAINED) >= 2 and any("register_attention" in block for block in SELF_CONTAINED)


@pytest.mark.parametrize("block", SELF_CONTAINED, ids=[f"block{index}" for index in range(len(SELF_CONTAINED))])
def test_readme_example_runs(block, tmp_path):
    completed = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, cwd=tmp_path,
                               timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
