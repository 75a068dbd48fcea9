"""The package's layers: the model unit (what `save_pretrained` copies as remote code) imports only torch,
transformers, the standard library and itself (same-folder relative imports); a scheme file no other scheme nor the
model (pyproject.toml's import-linter contracts hold the layer rules import-linter can state); the package has no import cycle; `import hf_relpos` changes no table
of transformers' and, with the training stack (datasets, sacrebleu, accelerate) not installed, still loads, saves
and generates; docs/internals.md's layout names every module."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hf_relpos"
REPO = PACKAGE.parent
MODEL_FOLDER = PACKAGE / "model"
MODEL_UNIT = tuple(sorted(path.stem for path in MODEL_FOLDER.glob("*.py") if path.stem != "__init__"))
MODEL_UNIT_DEPENDENCIES = {"torch", "transformers"}
# optional kernel dependencies: allowed only in the one module that runs the kernel, which the rest of the model unit
# imports inside functions (never at module level), so that loading a model never needs them
OPTIONAL_KERNEL_DEPENDENCIES = {"triton_relative_kernels": {"triton"}}
# what a scheme file may import from the model unit: the scheme contract and the helpers every scheme may share
SCHEME_IMPORTS_ALLOWED = {"positions", "validation", "attention_functions"}
TRAINING_STACK = ("datasets", "sacrebleu", "accelerate")


def imports_of(path: Path) -> list[tuple[int, str, int]]:
    """(line, imported name, relative level) of every import statement in the file, at any depth; a relative
    `from . import name` yields the name, `from .module import name` the module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            if node.module is None:
                found += [(node.lineno, alias.name, node.level) for alias in node.names]
            else:
                found.append((node.lineno, node.module, node.level))
    return found


def package_modules() -> dict[str, Path]:
    """Every module of the package by dotted name below hf_relpos ("model.positions", "translation.training")."""
    return {".".join(path.relative_to(PACKAGE).with_suffix("").parts): path for path in PACKAGE.rglob("*.py")
            if path.stem != "__init__"}


def package_dependencies(module: str) -> set[str]:
    """The package modules that `module` imports (relatively, or as hf_relpos.<...>)."""
    modules = package_modules()
    folder = module.split(".")[:-1]
    dependencies = set()
    for _, name, level in imports_of(modules[module]):
        if level:
            base = folder[: len(folder) - (level - 1)]
            dependencies.add(".".join([*base, *name.split(".")]))
        elif name.startswith(f"{PACKAGE.name}."):
            dependencies.add(name.removeprefix(f"{PACKAGE.name}."))
    return dependencies & set(modules)


def model_unit_violations(path: Path) -> list[str]:
    """The imports of `path` (a file of the model unit) that remote code could not follow: anything but torch,
    transformers, the standard library and same-folder relative imports of the model unit."""
    wrong = []
    for line, name, level in imports_of(path):
        top = name.split(".")[0]
        if level == 1:
            allowed = top in MODEL_UNIT and "." not in name
        else:
            optional = OPTIONAL_KERNEL_DEPENDENCIES.get(path.stem, set())
            allowed = level == 0 and (top in MODEL_UNIT_DEPENDENCIES | optional or top in sys.stdlib_module_names)
        if not allowed:
            wrong.append(f"{path.name}:{line} imports {'.' * level}{name}")
    return wrong


def scheme_violations(path: Path) -> list[str]:
    """The model-unit modules a scheme file imports beyond the scheme contract and the shared helpers: a scheme
    never imports another scheme, the model or the config."""
    return [f"{path.name}:{line} imports .{name}" for line, name, level in imports_of(path)
            if level == 1 and name not in SCHEME_IMPORTS_ALLOWED]


def test_the_model_unit_imports_only_torch_transformers_the_standard_library_and_itself():
    """Remote code copies the model unit's files alone, flat: anything else it imported would be missing there."""
    assert set(MODEL_UNIT) >= {"configuration_relpos", "modeling_relpos", "positions_shaw", "positions_absolute"}
    wrong = [problem for module in MODEL_UNIT for problem in model_unit_violations(MODEL_FOLDER / f"{module}.py")]
    assert not wrong, "the model unit imports outside torch, transformers, the stdlib and itself:\n" + "\n".join(wrong)


def module_level_imports(path: Path) -> set[str]:
    """The names imported by the top-level statements of `path` (relative imports by their module name)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_optional_kernel_modules_are_imported_only_inside_functions():
    """A module with an optional dependency (triton) is never imported when the model unit loads."""
    for module in OPTIONAL_KERNEL_DEPENDENCIES:
        importers = [name for name in MODEL_UNIT if module in module_level_imports(MODEL_FOLDER / f"{name}.py")]
        assert not importers, f"{module} is imported at module level by {importers}"


def test_a_scheme_file_imports_no_other_scheme_nor_the_model():
    schemes = sorted(MODEL_FOLDER.glob("positions_*.py"))
    assert len(schemes) >= 8
    wrong = [problem for path in schemes for problem in scheme_violations(path)]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("source", [
    "from hf_relpos.model.positions import PositionScheme",   # absolute: remote code cannot follow it
    "import hf_relpos",
    "import scipy",
    "from numpy import zeros",
    "from ..translation import data",
    "from .positions.sub import name",
    "from .not_in_the_unit import name",
])
def test_the_model_unit_rule_refuses_what_remote_code_cannot_load(source, tmp_path):
    path = tmp_path / "module.py"
    path.write_text(f"import math\nimport torch\nfrom transformers import PreTrainedConfig\nfrom .positions import "
                    f"PositionScheme\n{source}\n")
    assert len(model_unit_violations(path)) == 1


@pytest.mark.parametrize("source", ["from .positions_shaw import ShawPositions",
                                    "from .modeling_relpos import RelPosAttention",
                                    "from .configuration_relpos import RelPosTransformerConfig"])
def test_the_scheme_rule_refuses_another_scheme_the_model_and_the_config(source, tmp_path):
    path = tmp_path / "positions_toy.py"
    path.write_text(f"from .positions import PositionScheme\nfrom .validation import require_int\n{source}\n")
    assert len(scheme_violations(path)) == 1


# What a scheme's name may be compared with outside the registry (positions.py) and the scheme files: (file, scheme)
# -> why that file names the scheme. Everything else asks the scheme (its class) or a table keyed by name.
SCHEME_NAME_TESTS_ALLOWED = {
    ("hf_relpos/tools/convert.py", "absolute"): "the scheme that computes Marian's sinusoids: the identity conversion",
}


def scheme_name_tests(path: Path, schemes: set[str]) -> list[tuple[int, str]]:
    """(line, scheme) of each comparison in `path` of an expression naming a scheme (`scheme`, `position_scheme`)
    with a scheme's name as a literal (`scheme == "shaw"`, `position_scheme in ("xl", "t5")`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        literals = [element for operand in operands
                    for element in (operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand])
                    if isinstance(element, ast.Constant) and element.value in schemes]
        if literals and any("scheme" in ast.unparse(operand) for operand in operands
                            if not isinstance(operand, ast.Constant)):
            found += [(node.lineno, literal.value) for literal in literals]
    return found


def test_only_the_registry_and_the_scheme_files_test_a_schemes_name():
    """The model, the card, the trainer, the tools and the benchmarks never switch on a scheme's name (DESIGN.md):
    what depends on the scheme is an attribute of its class, or an entry of a table keyed by its name."""
    from hf_relpos.model.positions import built_in_schemes

    schemes = set(built_in_schemes())
    files = [path for path in sorted([*PACKAGE.rglob("*.py"), *(REPO / "benchmarks").glob("*.py")])
             if path.parent != MODEL_FOLDER or not path.stem.startswith("positions")]
    switches = [f"{path.relative_to(REPO)}:{line} tests position_scheme == {scheme!r}" for path in files
                for line, scheme in scheme_name_tests(path, schemes)
                if (str(path.relative_to(REPO)), scheme) not in SCHEME_NAME_TESTS_ALLOWED]
    assert not switches, "\n".join(switches)


@pytest.mark.parametrize(("source", "named"), [('scheme == "shaw"', ["shaw"]),
                                              ('config.position_scheme != "xl"', ["xl"]),
                                              ('position_scheme in ("t5", "rope")', ["t5", "rope"]),
                                              ('"alibi" == scheme_name', ["alibi"])])
def test_the_scheme_name_rule_finds_a_switch_and_not_a_kernel_or_another_none(source, named, tmp_path):
    path = tmp_path / "module.py"
    path.write_text(f"if {source}:\n    pass\nif kernel == \"sdpa\" or launches == \"none\":\n    pass\n")
    assert scheme_name_tests(path, {"shaw", "xl", "t5", "rope", "alibi", "none"}) == [(1, name) for name in named]


def unannotated(path: Path) -> list[str]:
    """The public functions and methods of `path` (no leading underscore, at module or class level) with a
    parameter or return type left out; Triton kernels (`@triton.jit`, whose parameters Triton types) aside."""
    found = []

    def visit(body: list[ast.stmt], owner: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{owner}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    not node.name.startswith("_") or node.name == "__init__"):
                if any("triton" in ast.unparse(decorator) for decorator in node.decorator_list):
                    continue
                arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                missing = [argument.arg for argument in arguments
                           if argument.annotation is None and argument.arg not in ("self", "cls")]
                if node.returns is None and node.name != "__init__":
                    missing.append("return")
                if missing:
                    found.append(f"{path.name}:{node.lineno} {owner}{node.name} ({', '.join(missing)})")

    visit(ast.parse(path.read_text(encoding="utf-8")).body, "")
    return found


def test_the_public_functions_of_the_package_the_benchmarks_and_the_experiments_have_type_hints():
    files = sorted([*PACKAGE.rglob("*.py"), *(REPO / "benchmarks").glob("*.py"), *(REPO / "experiments").glob("*.py")])
    missing = [problem for path in files for problem in unannotated(path)]
    assert not missing, "\n".join(missing)


def layout_file_names(layout: str) -> set[str]:
    """The .py file names a layout block names: `a.py b.py` each, `positions_{shaw,xl}.py` as positions_shaw.py and
    positions_xl.py."""
    names = set()
    for stem, alternatives in re.findall(r"(\w+)(?:\{([\w,]+)\})?\.py\b", layout):
        names |= {f"{stem}{alternative}.py" for alternative in alternatives.split(",")} if alternatives else {f"{stem}.py"}
    return names


def test_the_internals_layout_names_every_module_of_the_package():
    """docs/internals.md's Layout block names each module of hf_relpos, so that a reader finds every command and
    layer in it."""
    page = (REPO / "docs" / "internals.md").read_text(encoding="utf-8")
    layout = re.search(r"## Layout\n\n```\n(.*?)```", page, flags=re.DOTALL).group(1)
    modules = {path.name for path in PACKAGE.rglob("*.py") if path.name != "__init__.py"}
    assert modules - layout_file_names(layout) == set()


def test_the_package_has_no_import_cycle():
    graph = {module: package_dependencies(module) for module in package_modules()}
    assert graph["translation.run_outputs"] >= {"translation.arguments", "publish.hub", "model.modeling_relpos"}
    visiting, done = [], set()

    def visit(module: str) -> None:
        if module in done:
            return
        if module in visiting:
            cycle = visiting[visiting.index(module):] + [module]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        visiting.append(module)
        for dependency in sorted(graph[module]):
            visit(dependency)
        visiting.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


def run_python(*parts: str) -> str:
    """Run the code parts (each dedented), one after the other, in a fresh interpreter at the repository root."""
    code = "\n".join(textwrap.dedent(part) for part in parts)
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_import_adds_only_the_causal_lm_to_transformers_table_and_registers_through_the_auto_classes():
    """`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` keeps its content and type but for one entry, the causal LM's class name
    under the model type (the Trainer's label smoother shifts the labels of the class names it lists,
    `name_the_causal_lm_for_the_trainer`); the Auto classes still find the models (their public `register`)."""
    output = run_python("""
        from transformers.models.auto import modeling_auto
        table = modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        before, kind = dict(table), type(table)
        import hf_relpos
        from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM
        after = modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        assert after is table and type(after) is kind, "the mapping was replaced"
        assert dict(after) == {**before, "relpos_transformer": "RelPosTransformerForCausalLM"}, "the mapping changed"
        config = hf_relpos.RelPosTransformerConfig(d_model=16, encoder_layers=1, decoder_layers=1,
            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, vocab_size=20)
        print(type(AutoModelForCausalLM.from_config(config)).__name__,
              type(AutoModelForSeq2SeqLM.from_config(config)).__name__)
    """)
    assert output.split() == ["RelPosTransformerForCausalLM", "RelPosTransformerForConditionalGeneration"]


MODEL_ROUND_TRIP = """
    import sys, tempfile
    import torch
    import hf_relpos
    from transformers import AutoModelForSeq2SeqLM
    config = hf_relpos.RelPosTransformerConfig(d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, vocab_size=20, pad_token_id=0,
        eos_token_id=1, bos_token_id=2, decoder_start_token_id=2)
    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_config(config).eval()
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        loaded = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    inputs = torch.tensor([[5, 6, 7, 1]])
    expected = model.generate(inputs, num_beams=2, max_new_tokens=5)
    assert torch.equal(loaded.generate(inputs, num_beams=2, max_new_tokens=5), expected)
    print(" ".join(sorted(name for name in {TRAINING_STACK} if name in sys.modules)))
"""


def test_the_model_needs_no_training_stack():
    """`import hf_relpos`, `from_config`, `save_pretrained`, `from_pretrained` and beam search import neither
    datasets nor sacrebleu (accelerate is transformers' own optional import, see the next test)."""
    imported = run_python(MODEL_ROUND_TRIP.replace("{TRAINING_STACK}", repr(TRAINING_STACK))).split()
    assert "datasets" not in imported and "sacrebleu" not in imported


def test_the_model_works_where_the_training_stack_is_not_installed():
    """The same round trip with datasets, sacrebleu and accelerate hidden from the import system (as if
    `pip install hf_relpos` without the [train] extra): nothing fails. Importing the training app there fails with
    the missing package's name."""
    blocker = f"""
        import importlib.machinery, sys
        HIDDEN = {TRAINING_STACK!r}

        class WithoutTrainingStack(importlib.machinery.PathFinder):
            @classmethod
            def find_spec(cls, name, path=None, target=None):
                return None if name.partition(".")[0] in HIDDEN else super().find_spec(name, path, target)

        sys.meta_path = [WithoutTrainingStack if finder is importlib.machinery.PathFinder else finder
                         for finder in sys.meta_path]
    """
    imported = run_python(blocker, MODEL_ROUND_TRIP.replace("{TRAINING_STACK}", repr(TRAINING_STACK))).split()
    assert imported == []
    output = run_python(blocker, """
        try:
            import hf_relpos.translation.training
        except ModuleNotFoundError as error:
            print(error.name)
    """)
    assert output.strip() in TRAINING_STACK
