"""What `pip install` of the package gets: its dependency floors, its extras, and the commands without the `train`
extra."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]


def project() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(REPO / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["project"]


def requirement(requirements: list[str], name: str) -> Requirement:
    return next(parsed for parsed in map(Requirement, requirements) if parsed.name == name)


def floor(parsed: Requirement) -> Version:
    return max(Version(spec.version) for spec in parsed.specifier if spec.operator == ">=")


def test_the_torch_floor_is_not_below_the_one_transformers_imports_torch_with():
    """transformers disables torch below its own floor (the `torch` extra's), and `import hf_relpos` then fails: pip
    must not keep an older torch that satisfies hf_relpos' floor."""
    ours = floor(requirement(project()["dependencies"], "torch"))
    transformers_torch = [parsed for parsed in map(Requirement, importlib.metadata.requires("transformers") or [])
                          if parsed.name == "torch" and parsed.marker and parsed.marker.evaluate({"extra": "torch"})]
    assert transformers_torch, "transformers' metadata has no torch extra"
    assert ours >= floor(transformers_torch[0]), f"torch>={ours} admits a torch transformers will not use"


@pytest.mark.parametrize("platform_system", ["Darwin", "Windows"])
def test_the_dev_extra_installs_where_triton_has_no_wheels(platform_system):
    """triton publishes Linux wheels only: `make test` and `make demo` install the dev extra on every system."""
    triton = requirement(project()["optional-dependencies"]["dev"], "triton")
    assert triton.marker is not None and not triton.marker.evaluate({"platform_system": platform_system})
    assert triton.marker.evaluate({"platform_system": "Linux"})
