"""Every command in the ```bash blocks of README.md and docs/*.md is checked: `--help` commands run, every other
command's program exists and its arguments parse with that program's own parser (recipes and accelerate configs must
exist); one test (in `make test`, not marked slow) runs the README's own-data quickstart end to end on the demo
corpus. docs/archive/ is history, kept as written, and not checked."""

from __future__ import annotations

import importlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import console_script, console_script_main, load_experiment, pyproject

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_CHECKED = {"cat", "cd", "git", "ls", "export"}   # shell helpers around the documented commands


def documented_commands() -> list[tuple[str, list[str]]]:
    """(page, argv) for each command of each ```bash block: continuation lines joined, comments dropped, pipelines
    and `&&` lists split into their commands, redirections dropped; synopsis lines (`[--field value ...]`) skipped."""
    commands = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.DOTALL):
            for line in block.replace("\\\n", " ").splitlines():
                tokens = shlex.split(line, comments=True)
                if not tokens or any(token.startswith("[") for token in tokens):
                    continue
                while "|" in tokens or "&&" in tokens:
                    split = min(tokens.index(sep) for sep in ("|", "&&") if sep in tokens)
                    commands.append((page.name, tokens[:split]))
                    tokens = tokens[split + 1 :]
                commands.append((page.name, tokens[: tokens.index(">")] if ">" in tokens else tokens))
    return commands


COMMANDS = documented_commands()


TRAINING = "hf_relpos.translation.training:main"   # what train_translation.py runs


def program_and_arguments(argv: list[str]) -> tuple[str, list[str]]:
    """The program a documented command runs (`MODULE` for `python -m MODULE`, `MODULE:FUNCTION` for a console script
    or train_translation.py, a script path) and its arguments: `python ...`, `accelerate launch [options] SCRIPT.py`,
    `hf-relpos-*`; ('', argv) for anything else."""
    argv = [token for token in argv if not re.fullmatch(r"[A-Z_]+=.*", token)]   # leading VAR=value assignments
    if argv and Path(argv[0]).name in ("python", "python3"):
        if argv[1] == "-m":
            return argv[2], argv[3:]
        script = ROOT / argv[1]
        assert script.is_file(), f"{argv[1]} does not exist"
        return (TRAINING if argv[1] == "train_translation.py" else str(script)), argv[2:]
    if argv[:2] == ["accelerate", "launch"]:
        options = argv[2:]
        config = options[options.index("--config_file") + 1]
        assert (ROOT / config).is_file(), f"accelerate config {config} does not exist"
        script = next(index for index, token in enumerate(options) if token.endswith(".py"))
        return program_and_arguments(["python", *options[script:]])
    if argv and argv[0].startswith("hf-relpos-"):
        return console_script(argv[0]), argv[1:]
    return "", argv


def recipe_outputs() -> dict[str, Path]:
    """output_dir -> recipe, for the recipes in configs/ (a documented command reusing a recipe's output)."""
    return {recipe_values(recipe).get("output_dir"): recipe for recipe in sorted((ROOT / "configs").glob("*.yaml"))}


def recipe_values(recipe: str | Path | None) -> dict:
    from hf_relpos.publish.records import load_recipe

    return load_recipe(recipe) if recipe else {}


def check_training_arguments(arguments: list[str], work: Path) -> None:
    """train_translation.py's own `parse_arguments`, run in `work`: the local `model_name_or_path` folder the command
    or its recipe names is made there first (holding the config of the recipe whose output_dir it is, else of the
    command's recipe), and a `tokenizer_name` that is a recipe's output_dir (the run that saved it). On a machine without a GPU, the command is parsed with `--bf16 false` (the Trainer refuses bf16
    without one)."""
    import torch

    import hf_relpos
    from hf_relpos import RelPosTransformerConfig
    from hf_relpos.translation.training import parse_arguments

    arguments = [str(ROOT / token) if token.startswith("configs/") else token for token in arguments]
    recipe = arguments[0] if arguments[0].endswith(".yaml") else None
    folder = (arguments[arguments.index("--model_name_or_path") + 1] if "--model_name_or_path" in arguments
              else recipe_values(recipe).get("model_name_or_path"))
    if folder:
        source = recipe_outputs().get(folder, recipe)
        RelPosTransformerConfig(**recipe_values(source).get("model", {})).save_pretrained(work / folder)
    tokenizer = arguments[arguments.index("--tokenizer_name") + 1] if "--tokenizer_name" in arguments else None
    if tokenizer in recipe_outputs():   # the output_dir of the run that saved it
        (work / tokenizer).mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        arguments = [*arguments, "--bf16", "false"]
    if "--import_modules" not in arguments:
        parse_arguments(arguments)
        return
    # the module of the command is extending.md's example scheme (its first block, up to where it builds a config)
    example = re.search(r"```python\n(.*?)\nconfig = ", (ROOT / "docs" / "extending.md").read_text(encoding="utf-8"),
                        flags=re.DOTALL).group(1)
    module = arguments[arguments.index("--import_modules") + 1]
    (work / f"{module}.py").write_text(example, encoding="utf-8")
    registry = dict(hf_relpos.POSITION_SCHEMES)
    try:
        parse_arguments(arguments)
    finally:   # the scheme registered for this command only
        sys.modules.pop(module, None)
        hf_relpos.POSITION_SCHEMES.clear()
        hf_relpos.POSITION_SCHEMES.update(registry)


def program_module(program: str, monkeypatch):
    """The module a documented program runs: `MODULE` or `MODULE:FUNCTION` imported, a script (experiments/X.py)
    loaded from its path as when it runs as a script (`load_experiment`)."""
    module = program.split(":")[0]
    return load_experiment(Path(module), monkeypatch) if module.endswith(".py") else importlib.import_module(module)


def check_arguments(program: str, arguments: list[str], work: Path, monkeypatch) -> None:
    """Parse `arguments` with the program's own parser, in this process: train_translation.py's `parse_arguments`
    (which also reads the recipe), else the module's `build_parser()` (every documented program has one, or a
    `parse_args(argv)` that checks more after parsing). A `--device cuda` command is parsed as its CPU twin on a
    machine without a GPU."""
    import torch

    if not torch.cuda.is_available():
        arguments = ["cpu" if re.fullmatch(r"cuda(:\d+)?", token) else token for token in arguments]
    if program == TRAINING:
        check_training_arguments(arguments, work)
        return
    loaded = program_module(program, monkeypatch)
    if hasattr(loaded, "parse_args"):
        loaded.parse_args(arguments)
    else:
        assert hasattr(loaded, "build_parser"), f"{program} has neither build_parser() nor parse_args(argv)"
        loaded.build_parser().parse_args(arguments)


def check_make(arguments: list[str]) -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for argument in arguments:
        if "=" in argument:
            assert re.search(rf"^{argument.split('=')[0]} \?=", makefile, re.MULTILINE), argument
        else:
            assert re.search(rf"^{argument}:", makefile, re.MULTILINE), f"make has no target {argument}"


def check_pip(arguments: list[str]) -> None:
    """Extras named in `pip install` (`.[train]`, `hf_relpos[train]`) must be extras of pyproject.toml."""
    extras = pyproject()["project"]["optional-dependencies"]
    for argument in arguments:
        for extra in re.findall(r"\[([^\]]+)\]", argument):
            for name in extra.split(","):
                assert name in extras, f"pip install {argument}: no extra {name!r} in pyproject.toml"


@pytest.mark.parametrize("page,argv", COMMANDS, ids=[f"{page}:{' '.join(argv)[:60]}" for page, argv in COMMANDS])
def test_documented_command_parses(page, argv, tmp_path, monkeypatch, capsys):
    if argv[0] == "make":
        check_make(argv[1:])
    elif argv[:2] == ["pip", "install"]:
        check_pip(argv[2:])
    elif Path(argv[0]).name in NOT_CHECKED:
        pass
    elif argv[0] == "cut" or argv[:2] == ["python", "-c"]:  # data one-liners: tests/test_data.py runs their lines
        runner = 'docs_command("cut -f1' if argv[0] == "cut" else 'docs_command("python -c'
        assert runner in (ROOT / "tests" / "test_data.py").read_text(encoding="utf-8")
    else:
        program, arguments = program_and_arguments(argv)
        assert program, f"{page}: no rule checks {argv[0]!r}"
        if program == "pytest":
            assert all((ROOT / path).exists() for path in arguments if path.startswith("tests/"))
        elif "--help" in arguments:   # the help printed, with a recipe's values as defaults after a recipe
            arguments = [token.replace("configs/NAME.yaml", "configs/demo.yaml") for token in arguments]
            monkeypatch.chdir(tmp_path)
            with pytest.raises(SystemExit) as exit:
                check_arguments(program, arguments, tmp_path, monkeypatch)
            assert exit.value.code == 0 and "--output_dir" in capsys.readouterr().out
        else:
            monkeypatch.chdir(tmp_path)
            check_arguments(program, arguments, tmp_path, monkeypatch)


def test_the_readme_documents_the_commands_a_user_needs():
    readme = [argv for page, argv in COMMANDS if page == "README.md"]
    programs = {argv[0] if argv[0] != "make" else f"make {argv[1]}" for argv in readme}
    assert {"make demo", "make test", "hf-relpos-train", "hf-relpos-translate"} <= programs


def test_the_readme_says_how_many_processes_its_multi_gpu_command_starts():
    """The README's `accelerate launch` command starts as many processes as its config says, whatever the GPUs: the
    README names that count and the flag that changes it."""
    import yaml

    (argv,) = [argv for page, argv in COMMANDS if page == "README.md" and argv[:2] == ["accelerate", "launch"]]
    config = yaml.safe_load((ROOT / argv[argv.index("--config_file") + 1]).read_text(encoding="utf-8"))
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert f"the config starts {config['num_processes']} processes, one per GPU" in readme
    assert "add `--num_processes N`" in readme


def test_make_install_gives_pip_the_documented_torch_spec_as_its_arguments(tmp_path):
    """TORCH_SPEC, as benchmarks/README.md sets it for a CUDA build (a spec and pip's --index-url), reaches pip as
    those arguments (`make -n` prints the commands without running them)."""
    (documented,) = re.findall(r'^make install TORCH_SPEC="([^"]+)"$',
                               (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8"), re.MULTILINE)
    printed = subprocess.run(["make", "-n", "install", f"TORCH_SPEC={documented}", f"VENV={tmp_path / 'venv'}"],
                             capture_output=True, text=True, cwd=ROOT, timeout=60, check=True).stdout
    pip_torch = next(shlex.split(line) for line in printed.splitlines() if "--upgrade" not in line
                     and shlex.split(line)[1:3] == ["install", "--quiet"] and "-e" not in shlex.split(line))
    assert pip_torch[3:] == documented.split()


def test_make_demo_runs_what_the_readme_says_it_runs():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^demo:.*\n\t(.*)$", makefile, re.MULTILINE).group(1)
    command = recipe.replace("$(BIN)/python", "python")
    assert f"`{command}`" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_quickstart_trains_and_translates_plain_parallel_files(tmp_path, monkeypatch, capsys):
    """The README's own-data path on the demo corpus written as data/{train,valid,test}.{en,de}: its training command
    (the recipe shrunk to a few steps of a tiny model), then its translate command scoring the test set; then its
    Deploy commands in order: training the scheme it names for CTranslate2, the export, and translating the exported
    folder. Each runs its console script's function in this process, from the folder the commands run in (a process
    each cost seconds of imports; test_cli runs the installed commands themselves)."""
    from hf_relpos.translation.demo_corpus import write_demo_corpus

    corpus = write_demo_corpus(tmp_path / "jsonl", 120, 8, 8, seed=3)
    data = tmp_path / "data"
    data.mkdir()
    for split, prefix in (("train", "train"), ("validation", "valid"), ("test", "test")):
        pairs = [json.loads(line)["translation"] for line in corpus[split].read_text(encoding="utf-8").splitlines()]
        for language in ("en", "de"):
            (data / f"{prefix}.{language}").write_text("".join(f"{pair[language]}\n" for pair in pairs),
                                                       encoding="utf-8")
    (tmp_path / "configs").symlink_to(ROOT / "configs")  # the README's commands run from the repository root
    readme = [argv for page, argv in COMMANDS if page == "README.md"]
    train = next(argv for argv in readme if argv[0] == "hf-relpos-train" and "--help" not in argv)
    translate = next(argv for argv in readme if argv[0] == "hf-relpos-translate")
    tiny = ["--tokenizer_vocab_size", "400", "--model.d_model", "16", "--model.encoder_layers", "1",
            "--model.decoder_layers", "1", "--model.encoder_ffn_dim", "32", "--model.decoder_ffn_dim", "32",
            "--max_steps", "3", "--warmup_steps", "1", "--max_tokens_per_batch", "512", "--eval_strategy", "no",
            "--save_strategy", "no", "--num_train_epochs", "1", "--generation_num_beams", "1", "--cpu_threads", "1"]

    monkeypatch.chdir(tmp_path)

    def run(argv: list[str]) -> str:
        """`argv` run as its console script (a `main(argv)` returns on success); what it printed on stdout."""
        capsys.readouterr()
        console_script_main(argv[0])(argv[1:])
        return capsys.readouterr().out

    run([*train, *tiny])
    test_results = json.loads((tmp_path / "outputs" / "my_model" / "test_results.json").read_text())
    translate = [token if token != "cuda" else "cpu" for token in translate]
    translate = [token if token != "bfloat16" else "float32" for token in translate]
    translated = run(translate)
    from sacrebleu.metrics import BLEU

    hypotheses = (tmp_path / "hyp.de").read_bytes().decode("utf-8").split("\n")[:-1]
    references = (data / "test.de").read_text(encoding="utf-8").splitlines()
    assert len(hypotheses) == len(references) and "test_bleu" in test_results
    printed = float(re.search(r"sacreBLEU (\d+\.\d+)", translated).group(1))
    assert printed == round(BLEU().corpus_score(hypotheses, [references]).score, 2)

    pytest.importorskip("ctranslate2")   # the dev extra installs it; the Deploy commands need it
    deploy = (ROOT / "README.md").read_text(encoding="utf-8").split("## Deploy")[1].split("\n## ")[0]
    deployed = [argv for argv in readme if argv[0].startswith("hf-relpos-") and " ".join(argv) in " ".join(
        deploy.replace("\\\n", " ").split())]
    assert [argv[0] for argv in deployed] == ["hf-relpos-train", "hf-relpos-export", "hf-relpos-translate"]
    for argv in deployed:
        run([*argv, *tiny] if argv[0] == "hf-relpos-train" else argv)
    assert len((tmp_path / "hyp_ct2.de").read_text(encoding="utf-8").splitlines()) == len(references)
