"""What `pip install` of the package gets: its dependency floors, its extras, the commands without the `train` extra,
and the files of its wheel and sdist."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import pyproject
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from hf_relpos.translation import TRAIN_EXTRA_COMMANDS, TRAIN_EXTRA_MODULES

REPO = Path(__file__).resolve().parents[1]
PROJECT = pyproject()["project"]
IMPORT_NAMES = {"pyyaml": "yaml"}   # a distribution whose import name differs from its name


def requirement(requirements: list[str], name: str) -> Requirement:
    return next(parsed for parsed in map(Requirement, requirements) if parsed.name == name)


def floor(parsed: Requirement) -> Version:
    return max(Version(spec.version) for spec in parsed.specifier if spec.operator == ">=")


def python_floor() -> Version:
    """The lowest Python `requires-python` admits."""
    return floor(Requirement(f"python{PROJECT['requires-python']}"))


def test_the_python_floor_is_not_below_the_one_transformers_installs_on():
    """pip installs no transformers (of our range) on an older Python, so it cannot install hf_relpos there."""
    ours = python_floor()
    theirs = floor(Requirement(f"python{importlib.metadata.metadata('transformers')['Requires-Python']}"))
    assert ours >= theirs, f"requires-python >={ours} admits a Python transformers does not install on"


def test_no_floor_is_below_the_one_transformers_requires():
    """transformers' own requirements, and its `torch` extra's (it disables an older torch, and `import hf_relpos` then
    fails; its Trainer refuses an older accelerate), raise the floors of the packages we name too: pip must not keep
    an older version that satisfies our floor."""
    ours = {canonicalize_name(parsed.name): parsed
            for parsed in map(Requirement, PROJECT["dependencies"] + PROJECT["optional-dependencies"]["train"])}
    theirs = [parsed for parsed in map(Requirement, importlib.metadata.requires("transformers") or [])
              if canonicalize_name(parsed.name) in ours and any(spec.operator == ">=" for spec in parsed.specifier)
              and (parsed.marker is None or parsed.marker.evaluate({"extra": "torch"}))]
    assert {canonicalize_name(parsed.name) for parsed in theirs} >= {"torch", "accelerate", "huggingface-hub"}
    for parsed in theirs:
        name = canonicalize_name(parsed.name)
        assert floor(ours[name]) >= floor(parsed), f"{ours[name]} admits a {name} transformers will not use"


def test_the_readme_states_the_declared_python_torch_and_transformers_floors():
    """The README's install paragraph names the floors pyproject.toml declares."""
    python = python_floor()
    torch, transformers = (floor(requirement(PROJECT["dependencies"], name)) for name in ("torch", "transformers"))
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    assert (f"Python {python} or newer, torch {torch} or newer and transformers {transformers} or newer"
            in readme)


def test_model_cards_state_the_declared_transformers_range():
    """A card tells a user without hf_relpos which transformers the stored modeling code needs: the declared range."""
    from hf_relpos.publish.hub import transformers_requirement

    declared = next(parsed for parsed in map(Requirement, PROJECT["dependencies"]) if parsed.name == "transformers")
    assert transformers_requirement() == str(declared.specifier)


def test_the_transformers_range_is_known_without_package_metadata(monkeypatch):
    """Run from a source checkout that pip never installed (`PYTHONPATH=. python train_translation.py`), a training
    run's card still states the range: read from the checkout's pyproject.toml (the metadata lookup raised
    PackageNotFoundError after a whole run had trained)."""
    from hf_relpos.publish.hub import transformers_requirement

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "requires", not_installed)
    declared = next(parsed for parsed in map(Requirement, PROJECT["dependencies"]) if parsed.name == "transformers")
    assert transformers_requirement() == str(declared.specifier)


def test_an_installed_package_reads_the_transformers_range_from_its_metadata(monkeypatch, tmp_path):
    """Installed into site-packages, next to no pyproject.toml of hf_relpos (another project's is ignored), the
    range comes from the package metadata."""
    from hf_relpos.publish import hub

    (tmp_path / "pyproject.toml").write_text('[project]\nname = "other"\ndependencies = ["transformers<3"]\n')
    monkeypatch.setattr(hub, "PACKAGE_CHECKOUT", tmp_path)
    monkeypatch.setattr(importlib.metadata, "requires",
                        lambda name: ["torch>=2", "transformers<9,>=7.1", "triton; extra == 'dev'"]
                        if name == "hf_relpos" else None)
    assert hub.transformers_requirement() == "<9,>=7.1"


def test_the_train_extra_modules_are_the_train_extra():
    """`TRAIN_EXTRA_MODULES` (the check the commands make) names every package of pyproject.toml's train extra."""
    names = {Requirement(line).name.lower() for line in PROJECT["optional-dependencies"]["train"]}
    assert set(TRAIN_EXTRA_MODULES) == {IMPORT_NAMES.get(name, name) for name in names}


@pytest.mark.parametrize("platform_system", ["Darwin", "Windows"])
def test_the_dev_extra_installs_where_triton_has_no_wheels(platform_system):
    """triton publishes Linux wheels only: `make test` and `make demo` install the dev extra on every system."""
    triton = requirement(PROJECT["optional-dependencies"]["dev"], "triton")
    assert triton.marker is not None and not triton.marker.evaluate({"platform_system": platform_system})
    assert triton.marker.evaluate({"platform_system": "Linux"})


def test_ci_stops_where_the_triton_kernel_tests_would_be_skipped(monkeypatch):
    """.ci/run sets HF_RELPOS_TESTS_REQUIRE_TRITON=1: where triton is missing or too old for its interpreter, pytest
    stops with a usage error naming why, instead of passing without the relpos_triton tests; unset, they skip."""
    import conftest

    assert f"export {conftest.REQUIRE_RELPOS_TRITON}=1\n" in (REPO / ".ci" / "run").read_text(encoding="utf-8")
    monkeypatch.setattr(conftest, "RELPOS_TRITON_UNAVAILABLE", "needs triton")
    monkeypatch.setenv(conftest.REQUIRE_RELPOS_TRITON, "1")
    with pytest.raises(pytest.UsageError, match="HF_RELPOS_TESTS_REQUIRE_TRITON=1, .*: needs triton$"):
        conftest.pytest_configure(None)
    monkeypatch.delenv(conftest.REQUIRE_RELPOS_TRITON)
    conftest.pytest_configure(None)
    monkeypatch.setenv(conftest.REQUIRE_RELPOS_TRITON, "1")
    monkeypatch.setattr(conftest, "RELPOS_TRITON_UNAVAILABLE", None)
    conftest.pytest_configure(None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU runs the kernels without Triton's interpreter")
def test_a_pytest_run_that_requires_triton_stops_before_any_test_where_it_cannot_run():
    """The hook as pytest calls it, on a CPU where the interpreter is switched off: exit status 4 (usage error) and
    the reason, before a test is collected."""
    import conftest

    environment = dict(os.environ, PYTHONPATH=conftest.checkout_first_on_path(), TRITON_INTERPRET="0",
                       **{conftest.REQUIRE_RELPOS_TRITON: "1"})
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                             str(REPO / "tests" / "test_packaging.py")], capture_output=True, text=True, cwd=REPO,
                            timeout=300, env=environment)
    assert result.returncode == 4, result.stdout[-2000:] + result.stderr[-2000:]
    assert "the relpos_triton tests cannot run here: needs a GPU or Triton's interpreter" in result.stderr
    assert "test_packaging.py::" not in result.stdout


def checkout_environment() -> dict[str, str]:
    """The environment for a Python process a test starts in another folder: this checkout's hf_relpos first on its
    path (a relative PYTHONPATH such as `.` would name that other folder)."""
    import conftest

    return dict(os.environ, PYTHONPATH=conftest.checkout_first_on_path())


def test_a_command_without_the_train_extra_names_the_extra(tmp_path):
    """A plain `pip install hf_relpos` installs every console command; one that needs the train extra says so, naming
    what is missing, instead of failing on its first third-party import."""
    code = ("import sys; sys.modules['accelerate'] = sys.modules['sacrebleu'] = None\n"
            "import hf_relpos\n"
            "import hf_relpos.tools.translate\n")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                               timeout=300, env=checkout_environment())
    assert completed.returncode == 1
    last_line = completed.stderr.strip().splitlines()[-1]
    assert last_line.startswith("ModuleNotFoundError: ") and "pip install 'hf_relpos[train]'" in last_line
    assert last_line.endswith("missing: sacrebleu, accelerate")


def test_the_train_extra_commands_are_every_console_command():
    """`TRAIN_EXTRA_COMMANDS`, which the missing-extra error lists, are pyproject.toml's console commands: each
    imports the translation application, so each needs the extra."""
    assert set(TRAIN_EXTRA_COMMANDS) == set(PROJECT["scripts"])


def test_a_command_without_the_train_extra_is_named_in_the_error(tmp_path):
    """hf-relpos-export (like every command) stops with the missing-extra error, which names the command run."""
    code = ("import sys; sys.modules['accelerate'] = sys.modules['sacrebleu'] = None\n"
            "import hf_relpos.tools.export\n")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                               timeout=300, env=checkout_environment())
    assert completed.returncode == 1
    last_line = completed.stderr.strip().splitlines()[-1]
    assert "pip install 'hf_relpos[train]'" in last_line
    assert not [name for name in PROJECT["scripts"] if name not in last_line], last_line


def test_the_memory_trainer_without_accelerate_names_the_train_extra(tmp_path):
    """hf_relpos.tools.lm_memory trains with transformers' Trainer, which needs accelerate: without it the import
    stops with one error naming accelerate and the extra, not transformers' "Could not import module 'Trainer'"."""
    code = "import sys; sys.modules['accelerate'] = None\nimport hf_relpos.tools.lm_memory\n"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                               timeout=300, env=checkout_environment())
    assert completed.returncode == 1
    last_line = completed.stderr.strip().splitlines()[-1]
    assert last_line.startswith("ModuleNotFoundError: hf_relpos.tools.lm_memory trains with transformers' Trainer, "
                                "which needs accelerate") and "pip install '.[train]'" in last_line, last_line


def built_files(tmp_path: Path, kind: str) -> set[str]:
    """The files of the wheel or the sdist that setuptools builds from a copy of the checkout's package sources."""
    try:
        if Version(importlib.metadata.version("setuptools")) < Version("77"):
            pytest.skip("needs setuptools >= 77 (the dev extra installs it), as pyproject.toml's build-system does")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("needs setuptools >= 77 (the dev extra installs it)")
    source = tmp_path / "source"
    for name in ("hf_relpos", "tests"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "MANIFEST.in", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, source / name)
    out = tmp_path / "out"
    code = f"from setuptools import build_meta; print(build_meta.build_{kind}({str(out)!r}))"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=source, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    archive = out / completed.stdout.strip().splitlines()[-1]
    if kind == "wheel":
        with zipfile.ZipFile(archive) as wheel:
            return set(wheel.namelist())
    with tarfile.open(archive) as sdist:
        return {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}


def package_sources() -> set[str]:
    return {path.relative_to(REPO).as_posix() for path in (REPO / "hf_relpos").rglob("*")
            if path.is_file() and "__pycache__" not in path.parts}


def test_the_wheel_holds_the_whole_package_and_nothing_else(tmp_path):
    """Every file of hf_relpos/ (the remote code saved beside a model, pipeline_relpos.py, ...) is in the wheel, and
    only the package and its metadata are."""
    files = built_files(tmp_path, "wheel")
    assert package_sources() <= files, sorted(package_sources() - files)
    assert {name for name in files if not name.startswith(("hf_relpos/", "hf_relpos-"))} == set()
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in files)   # the text of pyproject's license


def test_the_sdist_holds_the_package_without_a_partial_test_suite(tmp_path):
    """The sdist builds the same package; tests/ (which runs only in a checkout) is not shipped half."""
    files = built_files(tmp_path, "sdist")
    assert package_sources() <= files, sorted(package_sources() - files)
    assert not [name for name in files if name.startswith("tests/")]
