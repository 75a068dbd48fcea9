"""Smoke tests of the benchmark suite (benchmarks/): tiny shapes, one round, no timing assertions."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import checkout_first_on_path, requires_relpos_triton

from benchmarks import bench_decoding, bench_training, command_line, compile_triton_kernels
from benchmarks.common import SCHEMES


@pytest.fixture(autouse=True)
def _restore_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _table_rows(markdown: str, scheme: str) -> list[str]:
    return [line for line in markdown.splitlines() if line.startswith("|") and f"| {scheme} |" in line]


def test_sass_counts_read_every_instruction_of_a_long_kernel() -> None:
    """The `--sass` counts read cuobjdump's listing itself: every instruction past the 4096th (five hex digits of
    address, where triton's parser before 3.9 stopped), predicated ones by their opcode, encoding lines not counted."""
    opcodes = ["FFMA", "@P0 STL.64 [R1+0x8], R2", "@!P1 LDL R4, [R1]", "LDL.64 R6, [R1+0x10]", "BRA 0x40"]
    listing = "\t\tFunction : relative_forward_kernel\n" + "".join(
        f"        /*{16 * index:04x}*/                   {opcodes[index % 5]} ;     /* 0x000fe20000000800 */\n"
        f"                                                      /* 0x000fca00078e00ff */\n" for index in range(5000))
    assert compile_triton_kernels.sass_counts(listing) == "SASS 5000 instructions, STL 1000, LDL 2000"


def test_training_benchmark_reports_every_scheme(tmp_path: Path, monkeypatch) -> None:
    """Every scheme's rows, table lines and memory growth; the collections between measurements leave the process's
    earlier objects out (frozen; a whole-heap pass was most of this test's time), which are unfrozen at the end."""
    import gc

    argv = ["--device", "cpu", "--threads", "1", "--shapes", "tiny", "--lengths", "8", "16", "--tokens", "32",
            "--layers", "1", "--vocab-size", "64", "--warmup", "0", "--repeats", "2", "--out", str(tmp_path)]
    collect, frozen_at_collections = gc.collect, []
    monkeypatch.setattr(gc, "collect", lambda *args: frozen_at_collections.append(gc.get_freeze_count()) or collect(*args))
    frozen_by_the_suite = gc.get_freeze_count()   # tests/conftest.py freezes the imports
    gc.unfreeze()   # as in a process of the benchmark's own
    try:
        data = bench_training.main(argv)
        assert frozen_at_collections and min(frozen_at_collections) > 0 and gc.get_freeze_count() == 0
    finally:
        if frozen_by_the_suite:
            gc.freeze()
    assert data == json.loads((tmp_path / "training.json").read_text())
    assert (tmp_path / "training.png").stat().st_size > 0
    markdown = (tmp_path / "training.md").read_text()
    for benchmark in bench_training.BENCHMARKS:
        for length in (8, 16):
            rows = {r["scheme"]: r for r in data["training"] if (r["benchmark"], r["length"]) == (benchmark, length)}
            assert sorted(rows) == sorted(SCHEMES)
            assert rows["absolute"]["ratio"] == 1.0 and rows["absolute"]["memory_overhead"] == 0.0
            assert all(r["tokens_per_s"] > 0 and r["ratio"] > 0 and r["peak_mib"] > 0 for r in rows.values())
    for scheme in SCHEMES:
        assert len(_table_rows(markdown, scheme)) == 2 * 2 + 2  # (attention, model) x 2 lengths + 2 growth rows
    assert {(g["benchmark"], g["scheme"]) for g in data["memory_growth"]} == {
        (b, s) for b in bench_training.BENCHMARKS for s in SCHEMES
    }


def recorded_configs(monkeypatch, benchmark) -> list:
    """The configs `benchmark`'s make_config builds, in order."""
    configs = []
    make_config = benchmark.make_config

    def recording_make_config(*args, **kwargs):
        configs.append(make_config(*args, **kwargs))
        return configs[-1]

    monkeypatch.setattr(benchmark, "make_config", recording_make_config)
    return configs


@pytest.mark.parametrize("kernel", ["sdpa", "flex_attention"])
def test_decoding_benchmark_reports_every_scheme(tmp_path: Path, kernel: str, monkeypatch) -> None:
    """Also with --kernel flex_attention (unfused on CPU, forward only): every model generates through it."""
    configs = recorded_configs(monkeypatch, bench_decoding)
    argv = ["--device", "cpu", "--threads", "1", "--shape", "tiny", "--batch", "1", "--source-length", "4",
            "--new-tokens", "4", "--warmup", "0", "--repeats", "1", "--kernel", kernel, "--out", str(tmp_path)]
    data = bench_decoding.main(argv)
    assert [config._attn_implementation for config in configs] == [kernel] * len(SCHEMES)
    assert data["meta"]["kernel"] == kernel
    assert f"attention kernel {kernel}" in (tmp_path / "decoding.md").read_text()
    assert data == json.loads((tmp_path / "decoding.json").read_text())
    rows = {r["scheme"]: r for r in data["decoding"]}
    assert sorted(rows) == sorted(SCHEMES)
    assert rows["absolute"]["cached_ratio_to_absolute"] == 1.0
    assert all(r["cached_tokens_per_s"] > 0 and r["uncached_tokens_per_s"] > 0 for r in rows.values())
    markdown = (tmp_path / "decoding.md").read_text()
    assert all(len(_table_rows(markdown, scheme)) == 1 for scheme in SCHEMES)


def test_decoding_benchmark_runs_its_cached_generation_on_the_static_cache_when_asked(tmp_path: Path, monkeypatch) -> None:
    """--cache-implementation static: the cached runs generate on transformers' StaticCache (the record says so)."""
    from transformers import StaticCache

    caches = []
    original = StaticCache.__init__

    def recording(self, *args, **kwargs):
        caches.append(type(self).__name__)
        original(self, *args, **kwargs)

    monkeypatch.setattr(StaticCache, "__init__", recording)
    data = bench_decoding.main(["--device", "cpu", "--threads", "1", "--shape", "tiny", "--batch", "1",
                                "--source-length", "4", "--new-tokens", "4", "--warmup", "0", "--repeats", "1",
                                "--schemes", "absolute", "shaw", "--cache-implementation", "static",
                                "--out", str(tmp_path)])
    assert caches and data["meta"]["cache_implementation"] == "static"
    assert "cached runs on the static cache" in (tmp_path / "decoding.md").read_text()
    assert [row["scheme"] for row in data["decoding"]] == ["absolute", "shaw"]


def test_training_benchmark_compares_kernels_with_absolute_on_its_fastest(tmp_path: Path) -> None:
    """--kernels: every scheme on each kernel in one round-robin; each ratio is to absolute on its fastest kernel."""
    argv = ["--device", "cpu", "--threads", "1", "--shapes", "tiny", "--lengths", "8", "--tokens", "16",
            "--benchmarks", "attention", "--schemes", "absolute", "shaw", "--kernels", "sdpa", "eager",
            "--warmup", "0", "--repeats", "3", "--out", str(tmp_path)]
    rows = {r["scheme"]: r for r in bench_training.main(argv)["training"]}
    assert sorted(rows) == ["absolute@eager", "absolute@sdpa", "shaw@eager", "shaw@sdpa"]
    assert {r["kernel"] for r in rows.values()} == {"sdpa", "eager"}
    baseline = rows["absolute@sdpa"]["baseline"]
    assert baseline in ("absolute@sdpa", "absolute@eager") and all(r["baseline"] == baseline for r in rows.values())
    assert rows[baseline]["ratio"] == 1.0
    other = "absolute@eager" if baseline == "absolute@sdpa" else "absolute@sdpa"
    assert statistics.median(rows[other]["seconds"]) >= statistics.median(rows[baseline]["seconds"])


def test_training_record_names_the_one_kernel_given_by_kernels(tmp_path: Path) -> None:
    """--kernels eager alone: the record's header names eager, the kernel every row ran, not --kernel's default."""
    data = bench_training.main([*TINY_TRAINING, "--lengths", "8", "--kernels", "eager", "--out", str(tmp_path)])
    assert {row["kernel"] for row in data["training"]} == {"eager"} and data["meta"]["kernel"] == "eager"
    assert "attention kernel eager" in (tmp_path / "training.md").read_text()


def test_cpu_clock_times_the_one_thread_and_is_recorded_with_the_code_version(tmp_path: Path, monkeypatch) -> None:
    """--clock cpu reads the timing thread's CPU time (time.thread_time), and the record says which clock and code;
    with more than one thread (or a GPU) it is one clear error, as the other threads' time would be missed."""
    from benchmarks import common

    calls = []
    monkeypatch.setitem(common.CLOCKS, "cpu", lambda: calls.append(1) or float(len(calls)))
    argv = ["--device", "cpu", "--shapes", "tiny", "--lengths", "8", "--tokens", "16", "--benchmarks", "attention",
            "--schemes", "absolute", "xl", "--warmup", "0", "--repeats", "2", "--clock", "cpu", "--out", str(tmp_path)]
    data = bench_training.main([*argv, "--threads", "1"])
    assert len(calls) == 2 * 2 * 2   # start and stop of 2 schemes x 2 rounds, every one on the CPU clock
    assert all(r["seconds"] == [1.0, 1.0] for r in data["training"])
    assert data["meta"]["clock"] == "cpu" and data["meta"]["code"] != ""
    assert f"- code `{data['meta']['code']}`, clock: cpu" in (tmp_path / "training.md").read_text()
    with pytest.raises(SystemExit, match="--clock cpu: needs --device cpu and --threads 1"):
        bench_training.main([*argv, "--threads", "2"])


TINY_TRAINING = ["--device", "cpu", "--threads", "1", "--shapes", "tiny", "--benchmarks", "attention", "--tokens",
                 "16", "--schemes", "absolute", "shaw", "--warmup", "0", "--repeats", "1"]


def test_training_benchmark_writes_each_length_as_it_goes(tmp_path: Path, monkeypatch) -> None:
    """A run cut off during its second length (a time limit) leaves the first length's rows on disk."""
    measure = bench_training.measure
    calls = []

    def cut_off_at_the_second_length(cases, args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("time limit")
        return measure(cases, args)

    monkeypatch.setattr(bench_training, "measure", cut_off_at_the_second_length)
    with pytest.raises(KeyboardInterrupt):
        bench_training.main([*TINY_TRAINING, "--lengths", "8", "16", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "training.json").read_text())["training"]
    assert {(r["length"], r["scheme"]) for r in rows} == {(8, "absolute"), (8, "shaw")}
    assert "| shaw |" in (tmp_path / "training.md").read_text()
    assert all(r["compiled_graphs"] == rows[0]["compiled_graphs"] for r in rows)


def test_the_training_plot_cut_short_keeps_the_previous_one_whole(tmp_path: Path, monkeypatch) -> None:
    """training.png is replaced whole or not at all: a run stopped while matplotlib wrote it (a time limit's
    KeyboardInterrupt) left the image cut short in place of the previous run's."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    rows = [{"benchmark": "attention", "shape": "tiny", "scheme": scheme, "length": length, "ratio": 1.0,
             "peak_mib": 1.0} for scheme in ("absolute", "shaw") for length in (8, 16)]
    path = tmp_path / "training.png"
    path.write_bytes(b"the previous plot")

    def cut_short(figure, target, **kwargs):
        with open(target, "wb") as file:
            file.write(b"\x89PNG")
        raise KeyboardInterrupt("time limit")

    monkeypatch.setattr(Figure, "savefig", cut_short)
    with pytest.raises(KeyboardInterrupt):
        bench_training.plot(rows, ["absolute", "shaw"], path)
    assert path.read_bytes() == b"the previous plot" and [entry.name for entry in tmp_path.iterdir()] == [path.name]


def test_a_benchmark_called_from_code_records_the_command_that_reproduces_its_run(tmp_path: Path, monkeypatch) -> None:
    """The record's command is `python -m benchmarks.<module>` with the arguments main parsed (quoted for a shell),
    not the calling process's command line; sys.argv's arguments only where main was given none."""
    argv = [*TINY_TRAINING, "--lengths", "8", "--out", str(tmp_path / "a folder")]
    data = bench_training.main(argv)
    assert data["meta"]["command"] == shlex.join(["python", "-m", "benchmarks.bench_training", *argv])
    monkeypatch.setattr(sys, "argv", ["/repo/benchmarks/bench_training.py", "--quick"])
    assert command_line("benchmarks.bench_training", None) == "python -m benchmarks.bench_training --quick"


def test_training_benchmark_fails_when_graphs_are_compiled_in_the_timed_rounds(tmp_path: Path, monkeypatch) -> None:
    """A compile after the warm-up (a shape or mask the warm-up did not see, a recompile) fails the benchmark
    instead of timing the compiler."""
    graphs = iter(range(100))
    monkeypatch.setattr(bench_training, "compiled_graph_count", lambda: next(graphs))
    with pytest.raises(bench_training.GraphsGrew, match="FlexAttention compiled 1 and torch.compile 0 graph"):
        bench_training.main([*TINY_TRAINING, "--lengths", "8", "--out", str(tmp_path)])


def test_compiled_models_are_timed_after_their_compiles_and_the_record_says_so(tmp_path: Path, monkeypatch) -> None:
    """--compile runs every full model through torch.compile with the chosen backend (the Trainer's torch_compile),
    compiles in the warm-up only, and the record names the backend; the one-layer benchmark is refused."""
    import torch._dynamo

    compiled = []
    compile_model = torch.compile

    def recorded_compile(model, **options):
        compiled.append((type(model).__name__, options))
        return compile_model(model, **options)

    monkeypatch.setattr(torch, "compile", recorded_compile)
    torch._dynamo.reset()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    data = bench_training.main(["--device", "cpu", "--threads", "1", "--shapes", "tiny", "--benchmarks", "model",
                                "--model-tokens", "16", "--layers", "1", "--vocab-size", "64", "--lengths", "8",
                                "--schemes", "absolute", "shaw", "--warmup", "1", "--repeats", "2", "--compile",
                                "--compile_backend", "aot_eager", "--out", str(tmp_path)])
    assert compiled == [("RelPosTransformerForConditionalGeneration", {"backend": "aot_eager"})] * 2
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs
    assert data["meta"]["torch_compile"] == "aot_eager" and len(data["training"]) == 2
    assert "- every model through torch.compile (backend aot_eager)" in (tmp_path / "training.md").read_text()
    with pytest.raises(SystemExit, match="--compile: compiles the model benchmark only"):
        bench_training.main([*TINY_TRAINING, "--lengths", "8", "--compile", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--compile_backend: names the backend of --compile"):
        bench_training.main([*TINY_TRAINING, "--lengths", "8", "--compile_backend", "eager", "--out", str(tmp_path)])


def test_attention_dropout_reaches_every_model_and_the_record(tmp_path: Path, monkeypatch) -> None:
    """--attention_dropout sets the attention dropout of every measured model, in the form its kernel runs
    (probabilities, or key dropout on flex_attention), and is recorded with the form per kernel."""
    configs = recorded_configs(monkeypatch, bench_training)
    data = bench_training.main([*TINY_TRAINING, "--lengths", "8", "--attention_dropout", "0.1", "--out",
                                str(tmp_path)])
    assert [config.attention_dropout for config in configs] == [0.1, 0.1]
    assert data["meta"]["attention_dropout"] == 0.1
    assert data["meta"]["attention_dropout_kinds"] == {"sdpa": "probabilities"}
    assert [config.attention_dropout_kind for config in configs] == ["probabilities", "probabilities"]
    assert "- attention dropout: 0.1 (on the probabilities: sdpa)" in (tmp_path / "training.md").read_text()
    # flex_attention cannot drop probabilities: it runs the same dropout as key dropout, the fused path's form
    from benchmarks.common import SHAPES, make_config

    flex = make_config("xl", SHAPES["base"], layers=1, kernel="flex_attention", attention_dropout=0.1)
    assert (flex.attention_dropout, flex.attention_dropout_kind) == (0.1, "keys")
    assert make_config("xl", SHAPES["base"], layers=1, kernel="relpos_triton",
                       attention_dropout=0.1).attention_dropout_kind == "probabilities"
    meta = {"attention_dropout": 0.1, "attention_dropout_kinds": {"sdpa": "probabilities", "flex_attention": "keys",
                                                                  "relpos_triton": "probabilities"}}
    assert bench_training.dropout_kinds_text(meta) == (
        " (on the probabilities: sdpa, relpos_triton; key dropout: flex_attention)")


def test_gpu_check_times_relpos_tritons_goal_setting_first_one_process_per_step_within_eight_minutes(
        tmp_path: Path) -> None:
    """benchmarks/gpu_check.sh with a stand-in for `python -m` (every step's command recorded, none run): (a) the
    setting of relpos_triton's goals (attention dropout 0.1, absolute and shaw on sdpa and relpos_triton, n = 512 first), then
    where the full model's step time goes, at n = 512 and at n = 16 (the host's own work), where that extra host work
    goes (the fused launches real or no-ops, the backward's thread), every CUDA kernel's time
    in that setting (with triton; else the operator profile of one layer), then the CUDA tests; every step writes its own record; the limits sum to at
    most 8 minutes. KEY_DROPOUT=1 adds key dropout on the fused path, FLEX=1 the fused path at dropout 0 in two
    processes and TRITON_TESTS=1 the Triton kernel's tests compiled for the GPU (when triton is installed),
    PRECISION=1, ABLATE=1 and DECODING=1 their benchmarks (decoding on the dynamic, then the static cache), COMPILE=1
    (a) at n = 512 with torch.compile'd models."""
    import importlib
    import importlib.util
    import subprocess
    import sys

    calls = tmp_path / "calls.txt"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nif [ "$1" = "-m" ]; then echo "$*" >> {calls}; exit 0; fi\n'
                      f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    repo = Path(__file__).resolve().parents[1]

    def check(out: str, **flags: str) -> tuple[list[str], list[str]]:
        calls.unlink(missing_ok=True)
        subprocess.run(["bash", str(repo / "benchmarks" / "gpu_check.sh"), str(tmp_path / out), "test"], cwd=repo,
                       env={"PATH": "/usr/bin:/bin", "PYTHON": str(python), "PYTHONPATH": checkout_first_on_path(),
                            **flags}, check=True,
                       capture_output=True)
        log = (tmp_path / out / "log.txt").read_text().splitlines()
        return [line for line in log if line.startswith("== ") and "(limit " in line], calls.read_text().splitlines()

    ends, commands = check("out")
    triton = " relpos_triton" if importlib.util.find_spec("triton") else ""
    environment = (tmp_path / "out" / "environment.txt").read_text()   # the versions a record's figures depend on
    assert (f"triton {importlib.import_module('triton').__version__}" if triton else "triton not installed"
            ) in environment
    assert f"accelerate {importlib.import_module('accelerate').__version__}" in environment
    assert [end.split(" ")[1] for end in ends] == ["(a)", "(t)", "(u)", "(v)", "(c)", "(d)"] + (["(d)"] if triton else [])
    assert sum(int(end.rsplit("(limit ", 1)[1].split(" ")[0]) for end in ends) <= 8 * 60
    assert (f"--lengths 512 128 1024 --kernels sdpa{triton} --schemes absolute shaw --attention_dropout 0.1"
            in commands[0])
    assert commands[1].startswith("-m benchmarks.step_timeline --device cuda --dtype bfloat16 --shape base --length "
                                  "512 --tokens 16384 --attention_dropout 0.1 --steps 5 --series absolute@sdpa "
                                  f"shaw@{triton.strip() or 'sdpa'} --host_profile")
    # the host's own work per step, Triton's launch path included: a length where the device's work is small
    assert commands[2].startswith("-m benchmarks.step_timeline --device cuda --dtype bfloat16 --shape base --length "
                                  "16 --tokens 512 --attention_dropout 0.1 --steps 10 --series absolute@sdpa "
                                  f"shaw@{triton.strip() or 'sdpa'} --out")
    # where that extra host work goes: the fused launches as they are or no-ops, the backward's thread
    assert commands[3].startswith("-m benchmarks.host_split --device cuda --dtype bfloat16 --shape base --length 16 "
                                  "--batch 32 --attention_dropout 0.1 --rounds 5 --series absolute@sdpa "
                                  f"shaw@{triton.strip() or 'sdpa'} --out")
    commands = commands[:1] + commands[4:]
    if triton:   # every CUDA kernel's time with the package's blocks (the operator profile misses Triton's forward)
        assert commands[1].startswith("-m benchmarks.tune_relpos_triton --device cuda --dtype bfloat16 --shape base "
                                      "--length 512 --tokens 16384 --attention_dropout 0.1 --candidates package")
    else:
        assert commands[1].startswith("-m benchmarks.profile_attention --device cuda --dtype bfloat16")
        assert "--lengths 512 128 --kernel sdpa --schemes absolute shaw --attention_dropout 0.1" in commands[1]
    assert commands[2].startswith("-m pytest") and 'tests/test_positions.py tests/test_kernels.py -k cuda and not flex' in commands[2]
    if triton:   # the fused kernels compiled for the GPU, against the oracle
        assert "tests/test_triton_shaw.py -k bfloat16_within" in commands[3]
    assert len(commands) == (4 if triton else 3)

    ends, commands = check("more", KEY_DROPOUT="1", FLEX="1", TRITON_TESTS="1", PRECISION="1", DECODING="1",
                           ABLATE="1", FLEX_TESTS="1", COMPILE="1", TESTS="0")
    assert [command for command in commands if "tests/test_kernels.py" in command] == [
        "-m pytest -q -rs -p no:cacheprovider tests/test_kernels.py -k cuda and flex"]
    assert "--kernels sdpa flex_attention --schemes absolute xl --attention_dropout 0.1" in commands[5]
    assert "--kernels sdpa flex_attention --schemes absolute xl t5 --out" in commands[6]
    assert "--kernels sdpa flex_attention --schemes absolute shaw alibi --out" in commands[7]
    outs = [command.split("--out ")[1].split()[0] for command in commands if "--out " in command]
    assert len(set(outs)) == len(outs) == (13 if triton else 11)   # bench_precision and the ablation need triton
    assert any(f"--lengths 512 --kernels sdpa{triton} --schemes absolute shaw --attention_dropout 0.1 --compile --warmup 2 --out"
               in command for command in commands)   # a second compiled model recompiles the first's frames once
    assert any(command.startswith("-m benchmarks.ablate_relpos_triton --length 512") for command in commands) == bool(
        triton)
    triton_tests = [command for command in commands if "pytest" in command and "tests/test_triton_shaw.py" in command]
    assert len(triton_tests) == (1 if triton else 0)   # the kernel compiled for the GPU, not only interpreted
    decoding = [command for command in commands if "benchmarks.bench_decoding --device cuda" in command]
    assert len(decoding) == 2 and "--cache-implementation static --schemes absolute shaw" in decoding[1]
    assert any("benchmarks.bench_precision --device cuda --kernel relpos_triton --scheme shaw --steps 300" in command
               for command in commands) == bool(triton)


def test_the_benchmark_docs_name_every_switch_of_the_gpu_check() -> None:
    """docs/benchmarks.md describes the prepared GPU check: every switch of benchmarks/gpu_check.sh (TESTS=0 and each
    optional step's NAME=1) is named there, so that a session plans its device time from the whole list."""
    import re

    repo = Path(__file__).resolve().parents[1]
    script = (repo / "benchmarks" / "gpu_check.sh").read_text()
    switches = re.findall(r'"\$\{([A-Z_]+):-([01])\}" = 1', script)
    assert len(switches) > 5
    docs = (repo / "docs" / "benchmarks.md").read_text()
    assert [name for name, default in switches if f"`{name}={1 - int(default)}`" not in docs] == []


def test_the_tuned_kernel_names_are_relpos_tritons_autotuned_kernels() -> None:
    """bench_training, host_overhead and tune_relpos_triton read relpos_triton's autotuners by the names in
    TUNED_KERNELS: each names one of the kernel module's autotuners, and every autotuner there is named."""
    triton = pytest.importorskip("triton")
    from benchmarks.bench_training import TUNED_KERNELS
    from hf_relpos.model import triton_relative_kernels as kernels

    autotuners = {name for name, value in vars(kernels).items() if isinstance(value, triton.runtime.Autotuner)}
    assert set(TUNED_KERNELS) == autotuners


def test_block_tuning_records_every_timing_as_it_comes_and_marks_the_packages_configs() -> None:
    """tune_relpos_triton without a GPU: the wrapped autotuner benchmark records each config's time with the kernel's
    causal flag and saves after each; the report ranks configs per kernel and flag set against the package's best
    (BLOCK_CONFIGS, marked) and lists a profile's kernels by time."""
    triton = pytest.importorskip("triton")
    from benchmarks import tune_relpos_triton as tune
    from hf_relpos.model.triton_relative_kernels import BLOCK_CONFIGS

    class Tuner:
        nargs = {"length_bucket": 512}

        def _bench(self, *args, config, **meta):
            return [{(64, 32): 0.2, (128, 128): 0.5}.get((config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"]), 0.3)]

    timings, saves = [], []
    tuner = Tuner()
    tune.record_timings(tuner, "tuned_forward", timings, lambda: saves.append(len(timings)))
    for block_m, block_n in ((64, 32), (128, 128)):
        tuner._bench(1, config=triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n}, num_warps=4, num_stages=3),
                     CAUSAL=block_m == 64)
    assert saves == [1, 2]
    keys = ["causal True, dropout False, a^K False, a^V False, length bucket 512",
            "causal False, dropout False, a^K False, a^V False, length bucket 512"]
    assert timings == [{"kernel": "tuned_forward", "causal": True, "key": keys[0], "config": "64x32 w4 s3", "ms": 0.2},
                       {"kernel": "tuned_forward", "causal": False, "key": keys[1], "config": "128x128 w4 s3",
                        "ms": 0.5}]
    assert (64, 32, 4, 3) in BLOCK_CONFIGS and not set(tune.HOPPER_CONFIGS) & set(BLOCK_CONFIGS)
    meta = {"command": "c", "device": "cuda", "device_name": "GPU", "cpu_threads": 1, "dtype": "bfloat16",
            "kernel": "relpos_triton", "torch": "t", "transformers": "t", "python": "p", "date": "d", "code": "x",
            "clock": "wall", "shape": "base", "scheme": "shaw", "length": 512, "batch": 32, "attention_dropout": 0.1,
            "package_configs": [list(config) for config in BLOCK_CONFIGS]}
    timings.append({"kernel": "tuned_forward", "causal": True, "key": keys[0], "config": "128x128 w8 s2", "ms": 0.4})
    profiles = {"shaw@relpos_triton": {"relative_forward_kernel": 0.5, "copy": 0.1}}
    markdown = tune.render_markdown(meta, timings, profiles)
    assert "| 64x32 w4 s3 * | 0.2000 | 1.000 |\n| 128x128 w8 s2 | 0.4000 | 2.000 |" in markdown
    assert f"## tuned_forward, {keys[1]}" in markdown   # no package config timed there: ratio nan, row kept
    timings.append({"kernel": "tuned_forward", "causal": False, "config": "64x32 w4 s3", "ms": 0.3})
    assert "## tuned_forward, causal False\n" in tune.render_markdown(meta, timings, {})   # a record without keys
    assert "## CUDA kernels of one training step: shaw@relpos_triton (0.600 ms)" in markdown


@requires_relpos_triton
def test_ablation_times_the_fused_op_with_each_term_off_beside_sdpa(tmp_path: Path) -> None:
    """ablate_relpos_triton under Triton's interpreter with a stand-in timer: every variant (all of a^K, a^V and
    dropout, each off in turn, none) runs the fused op forward and forward + backward and sdpa on the same inputs, and
    the record has a row per variant with the four times and the ratios."""
    from benchmarks import ablate_relpos_triton as ablate
    from hf_relpos.model import triton_relative

    if not triton_relative.interpreting():
        pytest.skip("runs the kernels under Triton's interpreter")
    calls = []

    def timer(function) -> float:
        calls.append(function.__name__)
        function()
        return float(len(calls))

    data = ablate.main(["--shape", "tiny", "--length", "16", "--tokens", "32", "--max_distance", "2", "--out",
                        str(tmp_path)], timer=timer, device="cpu")
    assert [row["variant"] for row in data["rows"]] == [variant[0] for variant in ablate.VARIANTS]
    assert calls == ["forward", "training", "sdpa_forward", "sdpa_training"] * len(ablate.VARIANTS)
    assert json.loads((tmp_path / "ablation.json").read_text()) == json.loads(json.dumps(data))
    assert "| a^K, a^V, dropout | 1.0000 | 2.0000 | 3.0000 | 4.0000 | 0.33x | 0.50x |" in (
        tmp_path / "ablation.md").read_text()


def test_profile_records_each_schemes_time_per_operator_at_every_length(tmp_path: Path) -> None:
    """profile_attention on the CPU: per length and scheme the ops' own times per step, their total and the total
    beyond absolute's, and the wall time of a step without the profiler, written to profile.json and profile.md; the scheme's extra ops (Shaw's bucketed tables) appear
    in its profile and not in absolute's."""
    from benchmarks import profile_attention

    data = profile_attention.main(["--device", "cpu", "--shape", "tiny", "--lengths", "16", "32", "--tokens", "64",
                                   "--schemes", "absolute", "shaw", "--threads", "1", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "profile.json").read_text()) == json.loads(json.dumps(data))
    assert [(profile["length"], profile["batch"]) for profile in data["profiles"]] == [(16, 4), (32, 2)]
    for profile in data["profiles"]:
        absolute, shaw = profile["schemes"]["absolute"], profile["schemes"]["shaw"]
        assert shaw["extra_ms"] == pytest.approx(shaw["total_ms"] - absolute["total_ms"])
        assert shaw["extra_wall_ms"] == pytest.approx(shaw["wall_ms"] - absolute["wall_ms"])
        assert absolute["extra_ms"] == absolute["extra_wall_ms"] == 0 and absolute["wall_ms"] > 0
        for entry in (absolute, shaw):
            times = list(entry["ops_ms"].values())
            assert times == sorted(times, reverse=True) and min(times) >= profile_attention.RECORDED_MS
            assert entry["total_ms"] >= sum(times)
        assert "aten::scatter_add_" in shaw["ops_ms"] and "aten::scatter_add_" not in absolute["ops_ms"]
    markdown = (tmp_path / "profile.md").read_text()
    assert "## n = 16, batch 4" in markdown and "## n = 32, batch 2" in markdown


def test_precision_benchmark_trains_three_runs_from_one_start_and_measures_their_deviation(tmp_path: Path) -> None:
    """bench_precision --quick: three runs of the same steps (float32 eager, bf16 eager, bf16 sdpa) from the same
    weights and batches; float32 on another kernel repeats float32 eager's curve (so the runs differ only by what
    they are meant to), the bf16 runs deviate from it, and the verdict follows the deviations and the tolerance."""
    from benchmarks import bench_precision

    data = bench_precision.main(["--quick", "--device", "cpu", "--out", str(tmp_path)])
    runs = data["runs"]
    assert [(entry["dtype"], entry["kernel"]) for entry in runs] == [
        ("float32", "eager"), ("bfloat16", "sdpa"), ("bfloat16", "eager")]
    assert all(len(entry["losses"]) == 6 for entry in runs)
    assert (data["meta"]["layers"], data["meta"]["vocab_size"], data["meta"]["batch"]) == (1, 64, 4)   # tiny's, 64 // 16
    assert all(entry["max_deviation"] > 0 for entry in runs[1:])
    assert data["within_bf16"] == bench_precision.within_bf16(runs[1], runs[2], 2.0)
    assert json.loads((tmp_path / "precision.json").read_text())["within_bf16"] == data["within_bf16"]
    assert (tmp_path / "precision.md").read_text().count("\n| ") >= 8

    def config_of(kernel: str):
        return bench_precision.precision_config("shaw", bench_precision.SHAPES["tiny"], None, None, kernel)

    torch.manual_seed(0)
    initial = bench_precision.RelPosTransformerForConditionalGeneration(config_of("eager")).state_dict()
    batches = bench_precision.copy_batches(4, 4, 16, 64, 0)
    curves = [bench_precision.train_curve(initial, config_of, kernel, "float32", batches, "cpu", 1e-3, 2)
              for kernel in ("eager", "sdpa")]
    assert curves[0] == pytest.approx(curves[1], abs=1e-5)


def test_precision_verdict_and_deviations_on_hand_made_curves() -> None:
    """The largest and the last-tenth deviations from the reference, and the verdict: within when both are at most
    the tolerance times bf16 eager's (equal included), not within when either exceeds it."""
    from benchmarks import bench_precision

    reference = [4.0] * 10
    eager = bench_precision.deviations([4.0] * 9 + [4.1], reference)
    assert eager["max_deviation"] == pytest.approx(0.1) and eager["final_deviation"] == pytest.approx(0.1)
    close = bench_precision.deviations([4.15] + [4.0] * 8 + [4.18], reference)
    far_early = bench_precision.deviations([4.5] + [4.0] * 9, reference)
    assert far_early == {"max_deviation": pytest.approx(0.5), "final_deviation": 0.0}
    assert bench_precision.within_bf16(close, eager, 2.0)
    assert not bench_precision.within_bf16(close, eager, 1.5)
    assert not bench_precision.within_bf16(far_early, eager, 2.0)
    at_tolerance = {"max_deviation": 1.0, "final_deviation": 0.5}   # exactly 2 x 0.5 and 2 x 0.25
    assert bench_precision.within_bf16(at_tolerance, {"max_deviation": 0.5, "final_deviation": 0.25}, 2.0)


def test_step_timeline_reads_busy_time_gaps_and_blocking_calls_from_profiler_events():
    """step_timeline.timeline on stand-in events: busy time is the union of device intervals, the gaps are the
    rest of the step (largest first) with the host operators inside each, and blocking runtime calls are counted
    with the operators and our code's Python functions that issued them."""
    from types import SimpleNamespace

    from benchmarks import step_timeline

    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA

    def event(name, device, start, end, parent=None, python=False):
        return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end),
                               cpu_parent=parent, is_python_function=python, self_cpu_time_total=(end - start) / 2)

    # with stacks recorded, Python functions are parents of the operators: they name the code, not host work
    function = event("hf_relpos/model/triton_relative.py(403): key_ranges", cpu, 405, 960,
                     event("torch/nn/modules/module.py(1783): _call_impl", cpu, 400, 970, python=True), python=True)
    item = event("aten::item", cpu, 410, 950, function)
    events = [event("k1", cuda, 100, 300), event("k2", cuda, 250, 400), event("k3", cuda, 1400, 1500),
              event("cudaStreamSynchronize", cpu, 420, 900, event("aten::_local_scalar_dense", cpu, 415, 940, item)),
              item, function, event("cudaLaunchKernel", cpu, 1300, 1310), event("step", cpu, 0, 5000),
              event(step_timeline.STEP_MARKER, cuda, 100, 1500),   # the annotation's GPU range is no device work
              event("cudaDeviceSynchronize", cpu, 1460, 1600)]   # the harness's drain after the step
    assert [(gap["offset_ms"], gap["gap_ms"]) for gap in step_timeline.timeline(events, 0, 1700)["gaps"]] == [
        (0.4, 1.0), (1.5, 0.2), (0.0, 0.1)]   # a trailing gap too
    result = step_timeline.timeline(events, 0, 1450)
    assert result["wall_ms"] == 1.5 and result["busy_ms"] == 0.4 and result["idle_ms"] == 1.1
    assert [(gap["offset_ms"], gap["gap_ms"]) for gap in result["gaps"]] == [(0.4, 1.0), (0.0, 0.1)]
    assert set(result["gaps"][0]["host_ops"]) == {"cudaStreamSynchronize x1", "aten::item x1", "cudaLaunchKernel x1"}
    assert result["blocking"] == {"cudaStreamSynchronize": {"count": 1, "host_ms": 0.48, "issued_by": {
        "aten::_local_scalar_dense < aten::item (hf_relpos/model/triton_relative.py(403): key_ranges)": 1}}}
    assert result["kernels"] == 3 and result["launches"] == 1
    assert result["kernel_ms"] == {"k1": 0.2, "k2": 0.15, "k3": 0.1}
    # the step's host operators by self time (not Python functions, not the harness's drain), largest first
    operators = result["host_operators"]
    assert [(name, row["count"]) for name, row in operators.items()] == [
        ("step", 1), ("aten::item", 1), ("cudaStreamSynchronize", 1), ("cudaLaunchKernel", 1)]
    assert [row["self_ms"] for row in operators.values()] == pytest.approx([2.5, 0.27, 0.24, 0.005], rel=1e-12)
    # against a baseline: the operators with the most extra self time first, an operator absent there counted as 0
    baseline = {"step": {"count": 1, "self_ms": 2.0}, "aten::item": {"count": 2, "self_ms": 0.5}}
    assert step_timeline.extra_host_time(result["host_operators"], baseline)[:2] == [
        ["step", "1", "1", "2.500", "2.000", "+0.500"], ["cudaStreamSynchronize", "1", "0", "0.240", "0.000", "+0.240"]]
    assert step_timeline.extra_host_time(result["host_operators"], baseline)[-1] == [
        "aten::item", "1", "2", "0.270", "0.500", "-0.230"]


def test_step_timeline_runs_every_series_on_the_cpu(tmp_path):
    """step_timeline end to end on the CPU (no device timeline there): a row per series, baseline ratio 1."""
    from benchmarks import step_timeline

    data = step_timeline.main(["--device", "cpu", "--dtype", "float32", "--shape", "tiny", "--length", "8",
                               "--tokens", "16", "--series", "absolute@sdpa", "shaw@eager", "--steps", "1",
                               "--warmup", "0", "--host_profile", "--out", str(tmp_path)])
    assert list(data["results"]) == ["absolute@sdpa", "shaw@eager"]
    assert any("modeling_relpos.py" in row["function"] for row in data["results"]["shaw@eager"]["host_functions"])
    assert all(0 < result["timing"]["forward_enqueue_ms"] < result["timing"]["enqueue_ms"] <= result["timing"]["drained_ms"]
               for result in data["results"].values())
    assert "| absolute@sdpa |" in (tmp_path / "timeline.md").read_text()
    # every operator the profiled step ran on the host, shaw@eager's against absolute@sdpa's
    assert data["results"]["shaw@eager"]["profile"]["host_operators"]["aten::mm"]["count"] > 0
    assert "## shaw@eager: the host operators with the most self time beyond absolute@sdpa's" in (
        tmp_path / "timeline.md").read_text()


def test_host_overhead_times_every_series_with_the_fused_launches_stubbed(tmp_path, monkeypatch):
    """host_overhead on the CPU: a row per series (the first is the baseline), relpos_triton's calls reach the
    stubbed launches instead of the interpreter, and the module's launch functions are restored afterwards."""
    pytest.importorskip("triton")  # the stubs replace the launches, not the kernels' module (the dev extra: Linux only)
    from benchmarks import host_overhead
    from hf_relpos.model import triton_relative

    launch = triton_relative.launch
    monkeypatch.delenv("TRITON_INTERPRET")
    calls = []
    original = host_overhead.kernels_stubbed

    @contextlib.contextmanager
    def counted():
        with original():
            assert os.environ["TRITON_INTERPRET"] == "1"
            stub = triton_relative.launch
            triton_relative.launch = lambda *args, **settings: calls.append(args[0].__name__) or stub()
            yield

    monkeypatch.setattr(host_overhead, "kernels_stubbed", counted)
    data = host_overhead.main(["--series", "absolute@sdpa", "shaw@relpos_triton", "--steps", "1", "--rounds", "1",
                               "--out", str(tmp_path)])
    assert [row["series"] for row in data["rows"]] == ["absolute@sdpa", "shaw@relpos_triton"]
    assert data["rows"][0]["extra_ms"] == 0 and all(row["ms"] > 0 for row in data["rows"])
    assert set(calls) == {"relative_forward_kernel", "relative_backward_keys_kernel", "relative_backward_queries_kernel"}
    assert triton_relative.launch is launch
    assert "TRITON_INTERPRET" not in os.environ
    assert "| shaw@relpos_triton |" in (tmp_path / "host_overhead.md").read_text()


def test_host_split_refuses_cuda_without_a_gpu_before_anything_runs(tmp_path, monkeypatch):
    """host_split's default --device cuda on a machine without a GPU is one error naming the flag, as
    step_timeline's and bench_training's are; it was torch's AssertionError traceback from the environment record."""
    from benchmarks import host_split

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match=r"--device cuda: torch.cuda.is_available\(\) is False"):
        host_split.main(["--shape", "tiny", "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_host_split_runs_each_variant_as_it_says(tmp_path, monkeypatch):
    """host_split: a row per series and variant (`none` launches only for relpos_triton's series), each call of a
    step or forward made with relpos_triton's launches as they are or as the no-ops, and the backward threads
    enabled or not, as its row says; forwards timed for the `device` rows only; the garbage collector's passes
    within each row's timed steps counted (a stand-in step of shaw's runs one, absolute's none, the automatic
    passes switched off); everything restored afterwards."""
    import gc

    from benchmarks import bench_training, host_split
    from hf_relpos.model import triton_relative

    launch = triton_relative.launch
    calls = []

    def recorded_case(scheme, *args, **kwargs):
        case = bench_training.Case(torch.nn.Linear(1, 1), None, 1, None)

        def call(phase):
            def run():
                calls.append((scheme, phase, triton_relative.launch is launch, torch._C._is_multithreading_enabled()))
                if (scheme, phase) == ("shaw", "step"):
                    gc.collect()
            return run
        case.step, case.forward = call("step"), call("forward")
        return case

    monkeypatch.setattr(host_split, "model_case", recorded_case)
    collecting = gc.isenabled()
    gc.disable()
    try:
        data = host_split.main(["--device", "cpu", "--shape", "tiny", "--steps", "2", "--rounds", "1",
                                "--series", "absolute@sdpa", "shaw@relpos_triton", "--out", str(tmp_path)])
    finally:
        if collecting:
            gc.enable()
    assert [(row["series"], row["launches"], row["backward_thread"]) for row in data["rows"]] == [
        ("absolute@sdpa", "real", "device"), ("absolute@sdpa", "real", "caller"),
        ("shaw@relpos_triton", "real", "device"), ("shaw@relpos_triton", "real", "caller"),
        ("shaw@relpos_triton", "none", "device"), ("shaw@relpos_triton", "none", "caller")]
    assert data["rows"][0]["extra_step_ms"] == 0
    assert [row["forward_ms"] is None for row in data["rows"]] == [False, True] * 3
    assert [row["collector_passes"] for row in data["rows"]] == [0, 0, 1, 1, 1, 1]
    assert all((row["collector_ms"] > 0) == (row["series"] == "shaw@relpos_triton") for row in data["rows"])
    assert not any(entry.__class__.__name__ == "CollectorTime" for entry in gc.callbacks)
    expected = {("absolute", "step", True, True), ("absolute", "step", True, False), ("absolute", "forward", True, True),
                ("shaw", "step", True, True), ("shaw", "step", True, False), ("shaw", "forward", True, True),
                ("shaw", "step", False, True), ("shaw", "step", False, False), ("shaw", "forward", False, True)}
    assert set(calls) == expected and len(calls) == len(expected) * 2 * 2   # 2 calls a round, 1 untimed + 1 timed
    assert triton_relative.launch is launch and torch._C._is_multithreading_enabled()
    assert "| shaw@relpos_triton | none | caller |" in (tmp_path / "host_split.md").read_text()


def test_host_split_trains_the_model_with_the_fused_launches_as_no_ops(tmp_path):
    """host_split on the CPU with the real model: relpos_triton's steps under the interpreter and with the launches
    as no-ops, absolute's on sdpa, every row timed."""
    from benchmarks import host_split

    data = host_split.main(["--device", "cpu", "--dtype", "float32", "--shape", "tiny", "--length", "8", "--batch",
                            "1", "--steps", "1", "--rounds", "1", "--out", str(tmp_path)])
    assert len(data["rows"]) == 6 and all(row["step_ms"] > 0 for row in data["rows"])


def test_host_overhead_through_tritons_launch_path_counts_every_launch(tmp_path):
    """host_overhead --launches triton, in a process without Triton's interpreter (bfloat16 autocast, as the GPU
    trains): each of shaw's 12 self-attentions launches its forward and both backward kernels (the dq/dT kernel
    storing Delta: no third backward launch) through Triton's launch path with the stand-in driver (36 a step),
    absolute none; with the kernels' compile options given (triton 3.9 warns where enable_fp_fusion is left unset)."""
    pytest.importorskip("triton")
    import subprocess

    environment = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    environment["PYTHONPATH"] = checkout_first_on_path()
    result = subprocess.run([sys.executable, "-m", "benchmarks.host_overhead", "--launches", "triton", "--dtype",
                             "bfloat16", "--series", "absolute@sdpa", "shaw@relpos_triton", "--steps", "1", "--rounds",
                             "1", "--out", str(tmp_path)], cwd=Path(__file__).resolve().parents[1], env=environment,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "FP_FUSION" not in result.stderr
    data = json.loads((tmp_path / "host_overhead.json").read_text())
    assert (data["meta"]["launches"], data["meta"]["dtype"]) == ("triton", "bfloat16")   # under autocast
    assert [(row["series"], row["triton_launches"]) for row in data["rows"]] == [("absolute@sdpa", 0),
                                                                                 ("shaw@relpos_triton", 36)]
    assert all(row["operators"] > 1000 for row in data["rows"])   # one whole step's aten operators
    assert "through Triton's launch path" in (tmp_path / "host_overhead.md").read_text()


def test_host_overhead_through_tritons_launch_path_refuses_interpreted_kernels(tmp_path, capsys):
    """Where the kernels were built for Triton's interpreter (this test process), --launches triton is one error
    saying why, before anything is timed."""
    pytest.importorskip("triton")
    from benchmarks import host_overhead
    from hf_relpos.model import triton_relative_kernels  # noqa: F401  (imported under TRITON_INTERPRET=1)

    message = one_line_error(host_overhead.main, ["--launches", "triton", "--rounds", "1", "--out",
                                                  str(tmp_path / "out")], capsys)
    assert message.startswith("--launches triton: relpos_triton's kernels were built for Triton's interpreter")


def test_decoding_host_work_counts_each_series_cached_step(tmp_path):
    """decoding_host_work on the CPU: a row per series and search (the first series the baseline), with a step's
    operators and host syncs: the difference of two generate calls per token between them, so the encoder and
    generate's setup cancel; rope dispatches more per step than absolute (its rotations), none no more."""
    from benchmarks import decoding_host_work

    data = decoding_host_work.main(["--series", "absolute", "rope", "none", "--num_beams", "1", "2", "--rounds", "1",
                                    "--base_tokens", "1", "--new_tokens", "3", "--out", str(tmp_path)])
    rows = {(row["series"], row["num_beams"]): row for row in data["rows"]}
    assert list(rows) == [(series, beams) for beams in (1, 2) for series in ("absolute", "rope", "none")]
    for beams in (1, 2):
        assert rows[("absolute", beams)]["extra_operators"] == 0 and rows[("absolute", beams)]["ratio"] == 1
        assert rows[("rope", beams)]["extra_operators"] > 0 >= rows[("none", beams)]["extra_operators"]
        assert all(float(count).is_integer() for count in rows[("absolute", beams)]["syncs"].values())
    assert "| rope | beam 2 |" in (tmp_path / "decoding_host_work.md").read_text()


def test_decoding_host_work_series_default_to_every_scheme_hf_relpos_ships(monkeypatch, tmp_path):
    """Without --series, the baseline and then every scheme of the model unit, read from the registry: a scheme
    added there (one file, one registration) is measured without an edit here."""
    from benchmarks import decoding_host_work
    from benchmarks.common import BASELINE
    from hf_relpos.model import positions

    toy = type("ToyPositions", (positions.PositionScheme,), {"__module__": "hf_relpos.model.positions_toy"})
    monkeypatch.setitem(positions.POSITION_SCHEMES, "toy", toy)
    series = []

    def stop_after_parsing(labels: list[str]) -> None:
        series.extend(labels)
        raise SystemExit(0)

    monkeypatch.setattr(decoding_host_work, "check_series", stop_after_parsing)
    with pytest.raises(SystemExit):
        decoding_host_work.main(["--out", str(tmp_path / "out")])
    assert series == [BASELINE, *(name for name in positions.built_in_schemes() if name != BASELINE)]
    assert "toy" in series


def test_a_benchmark_refuses_a_kernel_as_the_model_does_before_any_work(monkeypatch):
    """check_kernels_run applies the model's rule (`check_kernel_device`), as the apps do: relpos_triton on
    --device cuda where triton is not installed is one line naming the flag, not the kernels' ImportError at the
    first forward after the models were built."""
    import hf_relpos.model
    from benchmarks.common import check_kernels_run

    monkeypatch.delitem(sys.modules, "hf_relpos.model.triton_relative_kernels", raising=False)
    monkeypatch.delattr(hf_relpos.model, "triton_relative_kernels", raising=False)
    monkeypatch.setattr("transformers.utils.import_utils.is_triton_available", lambda: False)
    with pytest.raises(SystemExit, match=r"^--kernels relpos_triton: attn_implementation 'relpos_triton' needs "
                                         r"triton: pip install triton"):
        check_kernels_run(["sdpa", "relpos_triton"], "cuda", "--kernels")
    check_kernels_run(["sdpa", "eager", "flex_attention"], "cuda", "--kernels")


def one_line_error(main, argv: list[str], capsys) -> str:
    """The one line a benchmark's `main(argv)` exits with: SystemExit's message, or argparse's error line."""
    with pytest.raises(SystemExit) as raised:
        main(argv)
    if isinstance(raised.value.code, str):
        message = raised.value.code
    else:
        message = capsys.readouterr().err.strip().splitlines()[-1]
    assert "\n" not in message
    return message


TINY_DECODING = ["--device", "cpu", "--threads", "1", "--shape", "tiny", "--batch", "1", "--source-length", "4",
                 "--new-tokens", "4", "--warmup", "0", "--repeats", "1", "--schemes", "absolute"]
TINY_PROFILE = ["--device", "cpu", "--threads", "1", "--shape", "tiny", "--lengths", "8", "--tokens", "16",
                "--schemes", "absolute"]
TINY_PRECISION = ["--device", "cpu", "--shape", "tiny", "--steps", "2", "--length", "4", "--tokens", "8"]


@pytest.mark.parametrize(("script", "argv", "message"), [
    ("bench_training", ["--lengths", "0"], "argument --lengths: must be a positive integer, got 0"),
    ("bench_training", ["--lengths", "8", "--repeats", "0"], "argument --repeats: must be a positive integer, got 0"),
    ("bench_training", ["--lengths", "8", "--warmup", "-1"], "argument --warmup: must be 0 or more, got -1"),
    ("bench_training", ["--lengths", "8", "--tokens", "0"], "argument --tokens: must be a positive integer, got 0"),
    ("bench_training", ["--lengths", "8", "--benchmarks", "model", "--layers", "0"],
     "argument --layers: must be a positive integer, got 0"),
    ("bench_training", ["--lengths", "8", "--benchmarks", "model", "--vocab-size", "0"],
     "argument --vocab-size: must be a positive integer, got 0"),
    ("bench_training", ["--lengths", "8", "--tokens", "4"],
     "--tokens 4: fewer than the longest of --lengths (8); a batch holds at least one whole sequence"),
    ("bench_training", ["--lengths", "8", "--benchmarks", "model", "--model-tokens", "4"],
     "--model-tokens 4: fewer than the longest of --model-lengths (8)"),
    ("bench_training", ["--lengths", "8", "--kernel", "relpos_triton"],
     "--kernel relpos_triton: attn_implementation 'relpos_triton' runs on CUDA GPUs (on the CPU only under Triton's "
     "interpreter, TRITON_INTERPRET=1, for tests), not on 'cpu': use 'sdpa' or 'eager' on this device"),
    ("bench_training", ["--lengths", "8", "--kernels", "sdpa", "flex_attention"],
     "--kernels flex_attention: training needs --device cuda (FlexAttention has no backward on the CPU)"),
    ("bench_decoding", ["--new-tokens", "0"], "argument --new-tokens: must be a positive integer, got 0"),
    ("bench_decoding", ["--batch", "0"], "argument --batch: must be a positive integer, got 0"),
    ("bench_decoding", ["--layers", "0"], "argument --layers: must be a positive integer, got 0"),
    ("bench_decoding", ["--kernel", "relpos_triton"], "--kernel relpos_triton: attn_implementation 'relpos_triton' "
                                                      "runs on CUDA GPUs"),
    ("bench_decoding", ["--attention_dropout", "0.1"],
     "--attention_dropout 0.1: generate() runs the model in eval mode, where attention dropout is off"),
    ("profile_attention", ["--repeats", "0"], "argument --repeats: must be a positive integer, got 0"),
    ("profile_attention", ["--tokens", "4"], "--tokens 4: fewer than the longest of --lengths (8)"),
    ("profile_attention", ["--kernel", "flex_attention"], "--kernel flex_attention: training needs --device cuda"),
    ("profile_attention", ["--quick"], "unrecognized arguments: --quick"),
    ("host_overhead", ["--series", "absolute@sdpa", "foo@bar"], "--series foo@bar: must be scheme@kernel, scheme one of"),
    ("host_overhead", ["--steps", "0"], "argument --steps: must be a positive integer, got 0"),
    ("host_split", ["--series", "absolute@sdpa", "foo@bar"], "--series foo@bar: must be scheme@kernel, scheme one of"),
    ("host_split", ["--attention_dropout", "1"], "--attention_dropout: must be in [0, 1), got 1.0"),
    ("decoding_host_work", ["--series", "absolute", "foo"], "--series foo: must be scheme@kernel, scheme one of"),
    ("decoding_host_work", ["--new_tokens", "4"], "--new_tokens 4: must be more than --base_tokens (4)"),
    ("host_overhead", ["--series", "absolute@sdpa", "shaw@flex_attention"],
     "--series flex_attention: training needs --device cuda"),
    ("step_timeline", ["--series", "absolute@sdpa", "shaw@nope"], "--series shaw@nope: must be scheme@kernel"),
    ("step_timeline", ["--series", "absolute@sdpa", "shaw@relpos_triton"],
     "--series relpos_triton: attn_implementation 'relpos_triton' runs on CUDA GPUs"),
    ("bench_inference", ["/nonexistent/model", "--test_file", "test.jsonl"], "model: no model folder at /nonexistent/model"),
    ("tune_relpos_triton", ["--steps", "0"], "argument --steps: must be a positive integer, got 0"),
    ("tune_relpos_triton", ["--length", "0"], "argument --length: must be a positive integer, got 0"),
    ("tune_relpos_triton", ["--tokens", "4", "--length", "8"],
     "--tokens 4: fewer than --length (8); a batch holds at least one whole sequence"),
    ("tune_relpos_triton", ["--scheme", "shawx"], "argument --scheme: invalid choice: 'shawx'"),
    ("tune_relpos_triton", ["--attention_dropout", "1"], "--attention_dropout: must be in [0, 1), got 1.0"),
    ("ablate_relpos_triton", ["--max_distance", "0"], "argument --max_distance: must be a positive integer, got 0"),
    ("ablate_relpos_triton", ["--tokens", "0"], "argument --tokens: must be a positive integer, got 0"),
    ("ablate_relpos_triton", ["--tokens", "4", "--length", "8"],
     "--tokens 4: fewer than --length (8); a batch holds at least one whole sequence"),
    ("ablate_relpos_triton", ["--attention_dropout", "1"], "--attention_dropout: must be in [0, 1), got 1.0"),
    ("bench_precision", ["--steps", "0"], "--steps: must be at least 1, got 0"),
    ("bench_precision", ["--warmup_steps", "0"], "--warmup_steps: must be at least 1, got 0"),
    ("bench_precision", ["--tolerance", "0"], "--tolerance: must be a positive number, got 0.0"),
    ("bench_precision", ["--tolerance", "inf"], "--tolerance: must be a positive number, got inf"),
    ("bench_precision", ["--layers", "0"], "argument --layers: must be a positive integer, got 0"),
    ("bench_precision", ["--vocab_size", "0"], "--vocab_size: must be at least 5 (ids 0-3 are the special tokens), got 0"),
    ("bench_precision", ["--vocab_size", "4"], "--vocab_size: must be at least 5 (ids 0-3 are the special tokens), got 4"),
    ("bench_precision", ["--learning_rate", "-1"], "--learning_rate: must be a positive number, got -1.0"),
    ("bench_precision", ["--tokens", "3"], "--tokens 3: fewer than --length (4); a batch holds at least one whole sequence"),
    ("bench_precision", ["--kernel", "flex_attention"], "--kernel flex_attention: training needs --device cuda"),
    ("bench_precision", ["--kernel", "relpos_triton"], "--kernel relpos_triton: attn_implementation 'relpos_triton' "
                                                       "runs on CUDA GPUs"),
])
def test_bad_flags_end_in_one_line_naming_the_flag(script: str, argv: list[str], message: str, tmp_path: Path,
                                                   monkeypatch, capsys) -> None:
    """Each bad value ends the run before any work with one line that names the flag: no traceback, and no value the
    user gave replaced by a default (0 layers, batch 0 or 0 rounds used to run the default or fail deep inside)."""
    import importlib

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    module = importlib.import_module(f"benchmarks.{script}")
    tiny = {"bench_training": TINY_TRAINING, "bench_decoding": TINY_DECODING, "profile_attention": TINY_PROFILE,
            "host_overhead": ["--steps", "1", "--rounds", "1", "--series", "absolute@sdpa"],
            "host_split": ["--device", "cpu", "--shape", "tiny", "--steps", "1", "--rounds", "1", "--series",
                           "absolute@sdpa"],
            "decoding_host_work": ["--rounds", "1", "--series", "absolute"],
            "step_timeline": ["--device", "cpu", "--dtype", "float32", "--shape", "tiny", "--length", "8", "--tokens",
                              "16", "--steps", "1", "--warmup", "0"],
            "bench_inference": [], "tune_relpos_triton": [], "ablate_relpos_triton": [],
            "bench_precision": TINY_PRECISION}[script]
    assert message in one_line_error(module.main, [*tiny, *argv, "--out", str(tmp_path)], capsys)
    assert not any(tmp_path.iterdir())


def test_profile_keeps_the_warmup_repeats_and_clock_given(tmp_path: Path, monkeypatch) -> None:
    """profile_attention --warmup 0 --repeats 2 --clock cpu: no unprofiled step (0 is not replaced by the default),
    two profiled and two wall-timed steps, timed on the CPU clock, and the record says so."""
    from benchmarks import common, profile_attention

    clock_calls = []
    monkeypatch.setitem(common.CLOCKS, "cpu", lambda: clock_calls.append(1) or float(len(clock_calls)))
    steps = []
    attention_case = profile_attention.attention_case

    def counted_case(*args, **kwargs):
        case = attention_case(*args, **kwargs)
        step = case.step
        case.step = lambda: steps.append(1) or step()
        return case

    monkeypatch.setattr(profile_attention, "attention_case", counted_case)
    data = profile_attention.main([*TINY_PROFILE, "--warmup", "0", "--repeats", "2", "--clock", "cpu", "--out",
                                   str(tmp_path)])
    assert (data["meta"]["warmup"], data["meta"]["steps"], data["meta"]["clock"]) == (0, 2, "cpu")
    assert len(steps) == 2 + 2   # profiled + wall-timed, none unprofiled
    assert len(clock_calls) == 2 * 2   # start and stop of each wall-timed step
    assert data["profiles"][0]["schemes"]["absolute"]["wall_ms"] == 1000.0
    assert "clock: cpu" in (tmp_path / "profile.md").read_text()


def test_training_record_names_the_layers_and_vocabulary_of_the_shapes_used(tmp_path: Path) -> None:
    """Without --layers and --vocab-size the full model has each shape's own, and the record names the shapes run,
    not base's."""
    data = bench_training.main([*TINY_TRAINING, "--benchmarks", "model", "--lengths", "8", "--out", str(tmp_path)])
    assert {row["layers"] for row in data["training"]} == {bench_training.SHAPES["tiny"].layers}
    assert "full model: the shape's layers (tiny 1 + 1), vocabulary of the shape (tiny 64)" in (
        tmp_path / "training.md").read_text()


def test_inference_report_has_the_versions_and_date_and_no_empty_notes() -> None:
    """bench_inference's Markdown carries the JSON's torch, transformers and CTranslate2 versions and date; notes
    appear only where given."""
    from benchmarks import bench_inference

    record = {"environment": {"device": "cpu", "command": "python -m benchmarks.bench_inference m", "code": "abc1234",
                              "device_name": "a CPU", "torch": "2.9.0", "transformers": "4.57.0", "python": "3.11.9",
                              "date": "2026-11-30T12:00:00+00:00"},
              "model": "models/tiny", "model_note": "", "hardware_note": "", "ctranslate2": "4.6.0",
              "sentences": 1, "runs": []}
    markdown = bench_inference.render_markdown(record)
    assert ("- torch 2.9.0, transformers 4.57.0, ctranslate2 4.6.0, python 3.11.9, 2026-11-30T12:00:00+00:00"
            in markdown.splitlines())
    assert "- model: models/tiny" in markdown.splitlines() and "()" not in markdown
    assert markdown.splitlines()[-3] == "- code `abc1234`, a CPU"
    noted = bench_inference.render_markdown(record | {"model_note": "12 epochs", "hardware_note": "shared"})
    assert "- model: models/tiny (12 epochs)" in noted and "- code `abc1234`, a CPU; shared" in noted


class FakeClock:
    """A clock that only the stand-in steps move: `advance(seconds)`; read it with `now()`."""

    def __init__(self) -> None:
        self.time = 0.0

    def now(self) -> float:
        return self.time

    def advance(self, seconds: float) -> None:
        self.time += seconds


def test_round_robin_times_only_the_rounds_after_the_warmup_and_rotates_the_first_entry(monkeypatch) -> None:
    """warmup 1 + repeats 2: three rounds, the first untimed; each round starts one entry later; each entry's seconds
    are its own calls' in the timed rounds."""
    from benchmarks import common

    clock, calls = FakeClock(), []
    monkeypatch.setitem(common.CLOCKS, "wall", clock.now)

    def entry(name: str):
        return lambda: calls.append(name) or clock.advance(len(calls))   # the n-th call takes n seconds

    seconds = common.round_robin({name: entry(name) for name in "abc"}, 1, 2, "cpu")
    assert calls == list("abc" "bca" "cab")
    assert seconds == {"a": [6.0, 8.0], "b": [4.0, 9.0], "c": [5.0, 7.0]}


def test_timed_drains_the_device_queue_before_and_after_the_call(monkeypatch) -> None:
    """The clock starts after a drain and stops after another, so queued work of before stays out and the call's
    own asynchronous work is in."""
    from benchmarks import common

    events = []
    monkeypatch.setattr(common, "synchronize", lambda device: events.append(f"drain {device}"))
    monkeypatch.setitem(common.CLOCKS, "wall", lambda: events.append("clock") or 0.0)
    common.timed(lambda: events.append("run"), "cuda")
    assert events == ["drain cuda", "clock", "run", "drain cuda", "clock"]


def test_paired_ratio_is_the_median_of_the_baselines_time_over_the_own_time_round_by_round() -> None:
    from benchmarks.common import paired_ratio

    # rounds: 1/4, 2/6, 9/3: median 1/3; not the ratio of medians (2/4), the mean, the minimum or the inverse
    assert paired_ratio([4.0, 6.0, 3.0], [1.0, 2.0, 9.0]) == pytest.approx(1 / 3)


def test_cuda_peak_memory_is_the_calls_own_peak_above_what_was_allocated_before(monkeypatch) -> None:
    """With a stand-in CUDA allocator: the peak of an earlier call (500) is reset, and what was allocated before
    the call (10) is not counted: a call that allocates 30 and frees 20 peaks at 30."""
    allocator = {"allocated": 10, "peak": 500}

    def allocate(size: int) -> None:
        allocator["allocated"] += size
        allocator["peak"] = max(allocator["peak"], allocator["allocated"])

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: allocator.update(peak=allocator["allocated"]))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: allocator["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: allocator["peak"])
    from benchmarks.common import peak_memory

    assert peak_memory(lambda: (allocate(30), allocate(-20)), "cuda") == 30


def test_cpu_peak_memory_counts_a_tensor_freed_before_the_call_returns() -> None:
    from benchmarks.common import peak_memory

    assert peak_memory(lambda: torch.ones(2**18).sum(), "cpu") >= 2**20   # 1 MiB of float32, freed inside the call


def test_training_rows_take_medians_and_ratios_against_absolute_on_its_fastest_kernel(monkeypatch) -> None:
    """run_benchmarks with stand-in steps on a fake clock and stand-in peaks: the first (warm-up) call is recorded
    apart and no other untimed round runs, tokens/s is the real tokens (batch = tokens // length) over the median,
    the ratio is the median of paired ratios to absolute on its fastest kernel (eager here, by the median, though
    sdpa comes first), memory is against that same series, and each row names its own kernel and the baseline's.
    Gradients are cleared before the peak is measured."""
    import argparse

    from benchmarks import common

    clock = FakeClock()
    monkeypatch.setitem(common.CLOCKS, "wall", clock.now)
    durations = {"absolute@sdpa": [100.0, 4.0, 4.0, 4.0], "absolute@eager": [100.0, 1.0, 2.0, 9.0],
                 "shaw@sdpa": [100.0, 4.0, 6.0, 3.0], "shaw@eager": [100.0, 2.0, 2.0, 2.0]}
    peaks = {"absolute@sdpa": 50 * 2**20, "absolute@eager": 100 * 2**20, "shaw@sdpa": 150 * 2**20,
             "shaw@eager": 120 * 2**20}
    cases = {}

    def stand_in_case(scheme, shape, length, batch, device, dtype, kernel, attention_dropout):
        label, module = f"{scheme}@{kernel}", torch.nn.Linear(1, 1)
        remaining = iter(durations[label])

        def step() -> None:
            module.weight.grad = torch.ones_like(module.weight)
            clock.advance(next(remaining))

        cases[step] = label, module
        return bench_training.Case(module, step, batch * length)

    def stand_in_peak(step, device) -> int:
        label, module = cases[step]
        assert module.weight.grad is None
        return peaks[label]

    monkeypatch.setattr(bench_training, "attention_case", stand_in_case)
    monkeypatch.setattr(bench_training, "peak_memory", stand_in_peak)
    monkeypatch.setattr(bench_training, "compiled_graph_count", lambda: 0)
    args = argparse.Namespace(benchmarks=["attention"], tokens=20, lengths=[8], shapes=["tiny"], kernels=["sdpa", "eager"],
                              schemes=["absolute", "shaw"], device="cpu", dtype="float32", attention_dropout=0.0,
                              warmup=1, repeats=3, clock="wall", vocab_size=None, compile_backend=None)
    rows = {row["scheme"]: row for row in bench_training.run_benchmarks(args)}
    shaw = rows["shaw@sdpa"]
    assert shaw["seconds"] == [4.0, 6.0, 3.0] and shaw["first_call_s"] == 100.0
    assert shaw["batch"] == 2 and shaw["tokens_per_s"] == 16 / 4.0
    assert (shaw["baseline"], shaw["kernel"], shaw["baseline_kernel"]) == ("absolute@eager", "sdpa", "eager")
    assert shaw["ratio"] == pytest.approx(1 / 3)   # rounds: 1/4, 2/6, 9/3
    assert shaw["peak_mib"] == 150 and shaw["memory_overhead"] == pytest.approx(0.5)
    assert rows["absolute@eager"]["ratio"] == 1.0 and rows["absolute@sdpa"]["memory_overhead"] == pytest.approx(-0.5)


@pytest.mark.parametrize("benchmark", bench_training.BENCHMARKS)
def test_no_gradient_a_step_computes_is_held_when_its_peak_memory_is_measured(benchmark: str, monkeypatch) -> None:
    """Every gradient a step computes (the weights', and the attention benchmark's input's) is freed before its peak
    is measured: on CUDA the peak is counted above what was allocated before the call, so a gradient left from the
    timed rounds, freed and computed again inside the call, would be missing from it (the input's, 32 MiB of the
    base shape at 16384 tokens, was)."""
    import argparse
    import gc

    def held_gradients() -> dict[int, torch.Tensor]:
        return {id(tensor): tensor.grad for tensor in gc.get_objects()
                if issubclass(type(tensor), torch.Tensor) and tensor.is_leaf and tensor.grad is not None}

    recomputed = []

    def stand_in_peak(step, device) -> int:
        before = held_gradients()
        step()
        after = held_gradients()
        recomputed.extend(grad.shape for key, grad in before.items() if after.get(key) is not grad)
        return 2**20

    monkeypatch.setattr(bench_training, "peak_memory", stand_in_peak)
    args = argparse.Namespace(benchmarks=[benchmark], tokens=16, lengths=[8], model_tokens=16, model_lengths=[8],
                              shapes=["tiny"], layers=1, vocab_size=64, kernels=["sdpa"], schemes=["absolute", "shaw"],
                              device="cpu", dtype="float32", attention_dropout=0.0, warmup=0, repeats=1, clock="wall",
                              compile_backend=None)
    rows = bench_training.run_benchmarks(args)
    assert [row["scheme"] for row in rows] == ["absolute", "shaw"] and recomputed == []


def test_model_case_counts_source_and_target_tokens() -> None:
    from benchmarks.common import SHAPES

    case = bench_training.model_case("absolute", SHAPES["tiny"], 8, 3, "cpu", "float32", 1, 64)
    assert case.tokens == 2 * 3 * 8


def test_memory_growth_on_hand_made_peaks() -> None:
    """Peaks built as 1000 B per token + c B per sequence and squared length: shaw's c is absolute's + 40 B per score
    element (heads 4; one self-attention layer in the attention benchmark, two in the model), so 40 B beyond
    absolute's per score, at or above the bfloat16 n^2 d threshold (head_dim 8 x 2 B); growth from n = 8 to 16."""
    import argparse
    import math

    args = argparse.Namespace(dtype="bfloat16", kernels=["sdpa"], schemes=["absolute", "shaw"])
    quadratic = {("attention", "absolute"): 16, ("attention", "shaw"): 16 + 4 * 40,
                 ("model", "absolute"): 16, ("model", "shaw"): 16 + 4 * 2 * 40}
    rows = [{"benchmark": benchmark, "shape": "tiny", "scheme": scheme, "layers": 1, "length": length, "batch": batch,
             "peak_mib": (1000 * 32 + quadratic[(benchmark, scheme)] * batch * length**2) / 2**20}
            for benchmark in ("attention", "model") for scheme in ("absolute", "shaw")
            for length, batch in ((8, 4), (16, 2))]
    growth = {(g["benchmark"], g["scheme"]): g for g in bench_training.memory_growth(rows, args)}
    for benchmark in ("attention", "model"):
        shaw, peaks = growth[(benchmark, "shaw")], (1000 * 32 + quadratic[(benchmark, "shaw")] * n for n in (256, 512))
        assert shaw["extra_bytes_per_score"] == pytest.approx(40.0)
        assert growth[(benchmark, "absolute")]["extra_bytes_per_score"] == pytest.approx(0.0, abs=1e-6)
        small, large = peaks
        assert shaw["peak_ratio_2n"] == pytest.approx(large / small)
        assert shaw["exponent"] == pytest.approx(math.log2(large / small * 4 / 2))   # per sequence: batch 4 -> 2
        assert (shaw["n2d_threshold_bytes"], shaw["grows_like"]) == (16, "n^2 d")


def test_decoding_rows_count_generated_tokens_over_the_median_and_compare_cached_speeds(monkeypatch) -> None:
    """bench_decoding.run_benchmark with stand-in timings: tokens/s = batch x new tokens / median seconds, the
    speed-up is cached over uncached (exactly 5x meets the goal), and the cached speed is compared with absolute's
    cached speed."""
    import argparse

    seconds = {"absolute/True": [1.0, 1.0, 4.0], "absolute/False": [5.0, 5.0, 5.0],
               "shaw/True": [2.0, 3.0, 3.0], "shaw/False": [4.0, 6.0, 8.0]}
    monkeypatch.setattr(bench_decoding, "round_robin", lambda runs, *settings: seconds)
    args = argparse.Namespace(shape="tiny", schemes=["absolute", "shaw"], layers=1, vocab_size=64, kernel="sdpa",
                              attention_dropout=0.0, device="cpu", batch=2, source_length=4, new_tokens=3,
                              dtype="float32", cache_implementation="dynamic", warmup=0, repeats=3, clock="wall")
    rows = {row["scheme"]: row for row in bench_decoding.run_benchmark(args)}
    assert rows["absolute"]["cached_tokens_per_s"] == 6.0 and rows["absolute"]["uncached_tokens_per_s"] == 6 / 5
    assert rows["absolute"]["speedup"] == 5.0 and rows["absolute"]["meets_5x"]
    assert rows["shaw"]["cached_tokens_per_s"] == 2.0 and rows["shaw"]["speedup"] == 2.0
    assert not rows["shaw"]["meets_5x"] and rows["shaw"]["cached_ratio_to_absolute"] == pytest.approx(1 / 3)


def test_step_timeline_times_steps_drained_consecutive_and_enqueued_on_a_fake_clock(monkeypatch) -> None:
    """time_steps with a stand-in step (forward 1 s, backward 2 s of host time) and drains of 3, 3 and 12 s: drained
    = median of host + drain, enqueue = host time until step() returns (before the drain), consecutive = one drain
    for all steps, per step; the report's ratios are the baseline's time over the series'."""
    from types import SimpleNamespace

    from benchmarks import step_timeline

    clock, drains = FakeClock(), iter([0.0, 3.0, 0.0, 3.0, 0.0, 12.0, 0.0, 6.0])   # (before, after) each step
    monkeypatch.setattr(step_timeline, "time", SimpleNamespace(perf_counter=clock.now))
    monkeypatch.setattr(step_timeline, "synchronize", lambda device: clock.advance(next(drains, 0.0)))

    def forward():
        clock.advance(1.0)
        return SimpleNamespace(backward=lambda: clock.advance(2.0))

    case = SimpleNamespace(forward=forward, step=lambda: forward().backward())
    timing = step_timeline.time_steps(case, "cuda", 3)
    assert timing == {"drained_ms": 6e3, "enqueue_ms": 3e3, "forward_enqueue_ms": 1e3,
                      "consecutive_ms": pytest.approx(1e3 * (3 * 3.0 + 6.0) / 3)}
    meta = {"command": "c", "device": "cuda", "device_name": "d", "cpu_threads": 1, "dtype": "bfloat16", "kernel": "k",
            "torch": "t", "transformers": "t", "python": "p", "date": "today", "shape": "tiny", "layers": 1,
            "length": 8, "batch": 2, "attention_dropout": 0.0, "steps": 3, "warmup": 0}
    slower = {"drained_ms": 8.0, "consecutive_ms": 10.0, "enqueue_ms": 1.0}
    markdown = step_timeline.render_markdown(meta, {"a": {"timing": {**slower, "drained_ms": 4.0, "consecutive_ms": 5.0}},
                                                    "b": {"timing": slower}})
    assert "| b | 8.00 | 10.00 | 0.500 | 0.500 |" in markdown


def test_host_overhead_ms_per_step_is_the_median_rounds_time_per_step_after_one_untimed_round(tmp_path, monkeypatch):
    """host_overhead with stand-in steps on a fake clock (--steps 2 --rounds 3): one untimed round then three timed,
    ms per step = median round / steps, extra ms against the first series, spread = slowest / fastest round - 1."""
    from types import SimpleNamespace

    from benchmarks import common, host_overhead

    clock = FakeClock()
    monkeypatch.setitem(common.CLOCKS, "wall", clock.now)
    step_seconds = {"absolute@sdpa": iter([9.0] * 2 + [0.001] * 6 + [0.0]),   # then one step counted
                    "shaw@sdpa": iter([9.0] * 2 + [0.002] * 2 + [0.004] * 2 + [0.003] * 2 + [0.0])}

    def stand_in_case(scheme, *settings):
        label = f"{scheme}@{settings[7]}"
        return SimpleNamespace(step=lambda: clock.advance(next(step_seconds[label])))

    monkeypatch.setattr(host_overhead, "model_case", stand_in_case)
    rows = host_overhead.main(["--series", "absolute@sdpa", "shaw@sdpa", "--steps", "2", "--rounds", "3",
                               "--out", str(tmp_path)])["rows"]
    assert [row["ms"] for row in rows] == pytest.approx([1.0, 3.0])
    assert [row["extra_ms"] for row in rows] == pytest.approx([0.0, 2.0])
    assert [row["spread"] for row in rows] == pytest.approx([0.0, 1.0])
    assert all(next(steps, None) is None for steps in step_seconds.values())


def test_inference_batches_run_longest_first_through_every_engine_with_the_first_engine_rotating(monkeypatch):
    """bench_inference: fixed batches in length-sorted order, longest first; one untimed warm-up batch per engine,
    then each batch through every engine, the first engine rotating, each engine's seconds summed over batches."""
    from types import SimpleNamespace

    from benchmarks import bench_inference

    assert bench_inference.fixed_batches([3, 1, 2, 5, 4], 2) == [[3, 4], [0, 2], [1]]
    clock, calls = FakeClock(), []
    monkeypatch.setattr(bench_inference, "time", SimpleNamespace(perf_counter=clock.now))

    def engine(name: str, seconds: float):
        def run(batch):
            calls.append(name)
            clock.advance(seconds)
            return [f"{name} {ids[0]}" for ids in batch]
        return run

    encoded = [[10], [11], [12]]
    translations, seconds = bench_inference.run_engines({"a": engine("a", 1.0), "b": engine("b", 2.0)}, encoded,
                                                        [[2, 0], [1]], "cpu")
    assert calls == ["a", "b", "a", "b", "b", "a"]
    assert seconds == {"a": 2.0, "b": 4.0}
    assert translations["b"] == ["b 10", "b 11", "b 12"]


def test_inference_rows_give_sentences_per_second_and_speed_against_pytorch(monkeypatch) -> None:
    """bench_inference.measure with stand-in model, tokenizer, timings and scores: sentences/s = test sentences /
    the engine's seconds, the speed-up is PyTorch's seconds over the engine's, identical lines against PyTorch's."""
    import argparse
    from types import SimpleNamespace

    from benchmarks import bench_inference

    stand_in = SimpleNamespace(to=lambda device: SimpleNamespace(eval=lambda: None))
    monkeypatch.setattr(bench_inference.AutoTokenizer, "from_pretrained",
                        lambda folder: lambda texts: {"input_ids": [[1] * len(text) for text in texts]})
    monkeypatch.setattr(bench_inference.AutoModelForSeq2SeqLM, "from_pretrained", lambda folder, dtype: stand_in)
    lines = {"pytorch": ["x", "y", "z", "w"], "pytorch (early_stopping=False)": ["x", "y", "q", "w"]}
    monkeypatch.setattr(bench_inference, "run_engines", lambda engines, encoded, batches, device: (
        lines, {"pytorch": 8.0, "pytorch (early_stopping=False)": 2.0}))
    monkeypatch.setattr(bench_inference, "score_translations", lambda hypotheses, references, target_lang: {
        "bleu": 1.0, "chrf": 2.0, "bleu_signature": "s"})
    args = argparse.Namespace(model="m", device="cpu", num_beams=4, skip_default_search=False, batch_size=2,
                              target_lang="de")
    rows = bench_inference.measure(args, None, {}, ["a", "bb", "ccc", "dddd"], ["r"] * 4)["engines"]
    default = rows["pytorch (early_stopping=False)"]
    assert (default["sentences_per_second"], default["speedup"], default["identical_lines"]) == (2.0, 4.0, 3)
    assert (rows["pytorch"]["sentences_per_second"], rows["pytorch"]["speedup"]) == (0.5, 1.0)


def test_block_tuning_reads_the_median_and_reports_device_ms_per_profiled_step(monkeypatch) -> None:
    """tune_relpos_triton with a stand-in profiler: each CUDA kernel's device time summed over the profiled steps,
    per step, after one unprofiled step; an autotuner timing given as quantiles is read as their first, the median."""
    from types import SimpleNamespace

    from benchmarks import tune_relpos_triton as tune

    assert tune.milliseconds([0.3, 0.2, 0.4]) == 0.3 and tune.milliseconds(0.5) == 0.5
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    events = [SimpleNamespace(device_type=cuda, key="k", device_time_total=3000.0),
              SimpleNamespace(device_type=cuda, key="m", device_time_total=6000.0),
              SimpleNamespace(device_type=cpu, key="aten::add", device_time_total=0.0)]
    profiler = SimpleNamespace(key_averages=lambda: events)
    monkeypatch.setattr(torch.profiler, "profile", lambda activities: contextlib.nullcontext(profiler))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    steps = []
    assert tune.kernel_times_ms(lambda: steps.append(1), 3) == {"m": 2.0, "k": 1.0}
    assert len(steps) == 1 + 3


@pytest.mark.parametrize("lengths_and_batches,constant", [
    (((8, 3), (16, 1)), {"absolute": 0, "shaw": 0}),
    (((8, 5), (16, 2), (24, 1)), {"absolute": 5000, "shaw": 5600}),
], ids=["two lengths", "three lengths, each scheme's own constant"])
def test_memory_growth_fits_each_rows_own_tokens(lengths_and_batches, constant) -> None:
    """--tokens 24 at n = 8 and 16 gives batches of 3 and 1 (24 and 16 tokens), --tokens 40 at n = 8, 16 and 24
    batches of 5, 2 and 1: every peak holds 1000 B (absolute) or 1200 B (shaw) per token of its own batch, and in the
    second case what a step holds at any length differs by scheme (the gradients of shaw's tables beside the
    weights'): shaw's 40 B per score beyond absolute's is found."""
    import argparse

    args = argparse.Namespace(dtype="float32", kernels=["sdpa"], schemes=["absolute", "shaw"])
    per_token, quadratic = {"absolute": 1000, "shaw": 1200}, {"absolute": 16, "shaw": 16 + 4 * 40}
    rows = [{"benchmark": "attention", "shape": "tiny", "scheme": scheme, "layers": 1, "length": length, "batch": batch,
             "peak_mib": (constant[scheme] + per_token[scheme] * batch * length
                          + quadratic[scheme] * batch * length**2) / 2**20}
            for scheme in ("absolute", "shaw") for length, batch in lengths_and_batches]
    growth = {g["scheme"]: g for g in bench_training.memory_growth(rows, args)}
    assert growth["shaw"]["extra_bytes_per_score"] == pytest.approx(40.0)
    assert growth["absolute"]["extra_bytes_per_score"] == pytest.approx(0.0, abs=1e-6)


def test_ablation_steps_give_the_fused_op_and_sdpa_each_variants_terms_on_token_major_inputs(monkeypatch) -> None:
    """ablate_relpos_triton.steps with stand-ins for the fused op, sdpa and autograd.grad: each variant's label says
    which terms are on (a^K: a [B, H, n, 2k + 1] bias table, a^V: masses 2k + 1 rounded up to 8 columns that enter
    the loss, dropout: the rate given, else 0, for sdpa too); scaling 1/sqrt(d), every key of every row attended,
    encoder self-attention (offset 0, not causal); gradients for the fused op's inputs, sdpa's for its three."""
    from benchmarks import ablate_relpos_triton as ablate
    from hf_relpos.model import triton_relative

    fused_calls, sdpa_calls, gradients, mass_gradients = [], [], [], []

    def fused(query, key, value, table, key_start, key_end, seed, scaling, dropout, offset, max_distance, causal,
              mass_columns):
        fused_calls.append(locals().copy())
        masses = query[..., :1].expand(*query.shape[:3], mass_columns) * 1.0
        masses.register_hook(lambda grad: mass_gradients.append(True))
        return query * 1.0, masses, query.sum(-1)

    def sdpa(query, key, value, dropout_p):
        sdpa_calls.append((query, key, value, dropout_p))
        return query * 1.0

    grad = torch.autograd.grad
    monkeypatch.setattr(triton_relative, "relative_attention", fused)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    monkeypatch.setattr(torch.autograd, "grad", lambda loss, inputs: gradients.append(tuple(inputs)) or grad(
        loss, inputs, allow_unused=True))
    labels = [variant[0] for variant in ablate.VARIANTS]
    assert labels[0] == "a^K, a^V, dropout" and labels[-1] == "plain" and len(set(labels)) == 6
    for variant in ablate.VARIANTS:
        for calls in (fused_calls, sdpa_calls, gradients, mass_gradients):
            calls.clear()
        label = variant[0]
        with_bias, with_masses, with_dropout = "a^K" in label, "a^V" in label, "dropout" in label
        for function in ablate.steps(2, 3, 5, 4, 2, 0.25, "cpu", torch.float32, variant).values():
            function()
        forward, training = fused_calls
        query, key, value, table = forward["query"], forward["key"], forward["value"], forward["table"]
        ids = [id(query), id(key), id(value)]
        assert training["query"] is query and [list(map(id, call[:3])) for call in sdpa_calls] == [ids] * 2
        assert query.shape == key.shape == value.shape == (2, 3, 5, 4)
        assert query.transpose(1, 2).is_contiguous() and not query.is_contiguous()   # [B, n, H, d] in memory
        assert (table is not None) == with_bias
        if with_bias:
            assert table.shape == (2, 3, 5, 5) and table.transpose(1, 2).is_contiguous()
        assert forward["mass_columns"] == (8 if with_masses else 0) and mass_gradients == [True] * with_masses
        assert forward["dropout"] == training["dropout"] == (0.25 if with_dropout else 0.0)
        assert [sdpa_call[3] for sdpa_call in sdpa_calls] == [forward["dropout"]] * 2
        assert forward["key_start"].tolist() == [0, 0] and forward["key_end"].tolist() == [5, 5]
        assert triton_relative.SEED_RANGE[0] <= forward["seed"].item() < triton_relative.SEED_RANGE[1]
        assert (forward["scaling"], forward["offset"], forward["max_distance"], forward["causal"]) == (0.5, 0, 2, False)
        fused_ids = [*ids, id(table)] if with_bias else ids
        assert [list(map(id, inputs)) for inputs in gradients] == [fused_ids, ids]   # fused op's, then sdpa's


def test_ablation_runs_each_variant_at_the_flags_shape_and_writes_the_record_after_every_row(tmp_path, monkeypatch):
    """ablate_relpos_triton.main with a stand-in for the steps: batch = tokens // length, the shape's heads and head
    width, --max_distance and --attention_dropout reach every variant; a run stopped in the second variant leaves
    the first row written; --device cuda without CUDA is one error."""
    from benchmarks import ablate_relpos_triton as ablate

    calls = []

    def stand_in_steps(*settings):
        calls.append(settings)
        return {name: name for name in ("forward", "training", "sdpa_forward", "sdpa_training")}

    monkeypatch.setattr(ablate, "steps", stand_in_steps)
    times = {"forward": 1.0, "training": 3.0, "sdpa_forward": 4.0, "sdpa_training": 2.0}
    argv = ["--shape", "tiny", "--dtype", "float32", "--length", "16", "--tokens", "40", "--max_distance", "3",
            "--attention_dropout", "0.2", "--out", str(tmp_path)]
    data = ablate.main(argv, timer=times.__getitem__, device="cpu")
    assert calls == [(2, 4, 16, 8, 3, 0.2, "cpu", torch.float32, variant) for variant in ablate.VARIANTS]
    assert (data["meta"]["batch"], data["meta"]["heads"], data["meta"]["head_dim"]) == (2, 4, 8)
    assert "| plain | 1.0000 | 3.0000 | 4.0000 | 2.0000 | 0.25x | 1.50x |" in (tmp_path / "ablation.md").read_text()

    def stopping_timer(name):
        if len(calls) == 2:
            raise KeyboardInterrupt
        return times[name]

    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        ablate.main(argv, timer=stopping_timer, device="cpu")
    assert [row["variant"] for row in json.loads((tmp_path / "ablation.json").read_text())["rows"]] == [
        ablate.VARIANTS[0][0]]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        ablate.main(argv, timer=times.__getitem__, device="cuda")


def test_profile_sums_each_operators_own_time_per_step_from_operator_events(monkeypatch) -> None:
    """self_times_ms with a stand-in profiler: on CUDA each operator's own device time (kernels' own events left
    out, operators with none dropped), on the CPU its own CPU time, in ms per profiled step, after `warmup` steps."""
    from types import SimpleNamespace

    from benchmarks import profile_attention

    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    events = [SimpleNamespace(device_type=cpu, key="aten::mm", self_device_time_total=6000.0, self_cpu_time_total=300.0),
              SimpleNamespace(device_type=cpu, key="aten::view", self_device_time_total=0.0, self_cpu_time_total=30.0),
              SimpleNamespace(device_type=cuda, key="gemm_kernel", self_device_time_total=6000.0,
                              self_cpu_time_total=0.0)]
    profiled = []

    def profile(activities):
        profiled.append(activities)
        return contextlib.nullcontext(SimpleNamespace(key_averages=lambda: events))

    monkeypatch.setattr(torch.profiler, "profile", profile)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    steps = []
    assert profile_attention.self_times_ms(lambda: steps.append(1), 3, "cuda", warmup=2) == {"aten::mm": 2.0}
    assert len(steps) == 2 + 3 and torch.profiler.ProfilerActivity.CUDA in profiled[0]
    assert profile_attention.self_times_ms(lambda: None, 3, "cpu", warmup=0) == pytest.approx(
        {"aten::mm": 0.1, "aten::view": 0.01})
    assert profiled[1] == [torch.profiler.ProfilerActivity.CPU]


def test_profile_extra_ops_rank_by_time_beyond_the_baselines_and_the_baseline_by_its_own() -> None:
    from benchmarks.profile_attention import extra_ops

    own, base = {"a": 5.0, "b": 3.0, "c": 1.0}, {"a": 4.5, "c": 0.25, "d": 9.0}
    assert extra_ops(own, base, 2) == [("b", 3.0, 3.0), ("c", 1.0, 0.75)]
    assert extra_ops(base, base, 2) == [("d", 9.0, 0.0), ("a", 4.5, 0.0)]


def test_profile_rows_compare_with_absolute_wherever_it_is_listed_and_keep_small_ops_in_the_total(tmp_path,
                                                                                                  monkeypatch):
    """profile_attention.main with stand-in cases, op times and a fake clock (--schemes shaw absolute, --lengths 20 8
    --tokens 20: batches 1 and 2): each case gets the flags' shape, length, batch, kernel and dropout; totals count
    every op, the record keeps ops from 0.005 ms up, largest first; extra times are against absolute's; wall time is
    the median step; a run stopped at the second length leaves the first written."""
    from types import SimpleNamespace

    from benchmarks import common, profile_attention

    clock, cases = FakeClock(), []
    monkeypatch.setitem(common.CLOCKS, "wall", clock.now)
    seconds = {"shaw": [1.0, 9.0, 2.0], "absolute": [1.0, 1.0, 1.0]}
    ops = {"shaw": {"aten::mm": 3.0, "aten::tiny": 0.004, "aten::edge": 0.005, "aten::scatter_add_": 2.0},
           "absolute": {"aten::add": 0.5, "aten::mm": 2.5}}

    def stand_in_case(*settings):
        cases.append(settings)
        durations = iter(seconds[settings[0]])
        return SimpleNamespace(scheme=settings[0], step=lambda: clock.advance(next(durations)))

    def stand_in_times(step, steps, device, warmup):
        if cases[-1][2] == failing_length:
            raise RuntimeError("stopped")
        return dict(ops[cases[-1][0]])

    monkeypatch.setattr(profile_attention, "attention_case", stand_in_case)
    monkeypatch.setattr(profile_attention, "self_times_ms", stand_in_times)
    argv = ["--device", "cpu", "--threads", "1", "--shape", "tiny", "--lengths", "20", "8", "--tokens", "20",
            "--kernel", "eager", "--attention_dropout", "0.1", "--schemes", "shaw", "absolute", "--top", "2",
            "--out", str(tmp_path)]
    failing_length = None
    data = profile_attention.main(argv)
    tiny = common.SHAPES["tiny"]
    assert cases == [(scheme, tiny, length, batch, "cpu", "float32", "eager", 0.1)
                     for length, batch in ((20, 1), (8, 2)) for scheme in ("shaw", "absolute")]
    shaw, absolute = data["profiles"][0]["schemes"]["shaw"], data["profiles"][0]["schemes"]["absolute"]
    assert list(shaw["ops_ms"].items()) == [("aten::mm", 3.0), ("aten::scatter_add_", 2.0), ("aten::edge", 0.005)]
    assert shaw["total_ms"] == pytest.approx(5.009) and shaw["extra_ms"] == pytest.approx(2.009)
    assert (shaw["wall_ms"], shaw["extra_wall_ms"], absolute["extra_ms"]) == (2000.0, 1000.0, 0.0)
    markdown = (tmp_path / "profile.md").read_text()
    assert "shaw: 5.01 ms per step (+2.01 ms vs absolute); wall 2000.00 ms (+1000.00 ms)" in markdown
    assert "| aten::scatter_add_ | 2.000 | +2.000 |\n| aten::mm | 3.000 | +0.500 |\n\n" in markdown
    failing_length = 8
    with pytest.raises(RuntimeError, match="stopped"):
        profile_attention.main(argv)
    assert [profile["length"] for profile in json.loads((tmp_path / "profile.json").read_text())["profiles"]] == [20]


def test_precision_run_trains_three_runs_from_the_flags_and_measures_both_bf16_runs_against_float32(monkeypatch):
    """bench_precision.run with a stand-in train_curve and hand-made curves (8 steps: the last tenth is the last
    step): batch = tokens // length, --vocab_size, --layers, --learning_rate and --warmup_steps reach the
    runs, every dropout is 0, both bf16 runs are measured against float32 eager (not against the run before), the
    verdict is the kernel's deviations against --tolerance times bf16 eager's, and the record is saved after each
    run and after the verdict; --device cuda without CUDA is one error."""
    from benchmarks import bench_precision

    curves = {("eager", "float32"): [4.0] * 8, ("sdpa", "bfloat16"): [5.0] + [4.0] * 6 + [4.5],
              ("eager", "bfloat16"): [4.5] + [4.0] * 6 + [3.75]}
    runs = []

    def stand_in_curve(initial, config_of, kernel, dtype, batches, device, learning_rate, warmup):
        config = config_of(kernel)
        runs.append((kernel, dtype, [tuple(ids.shape) for ids in batches], device, learning_rate, warmup,
                     config.vocab_size, config.encoder_layers, config._attn_implementation,
                     (config.dropout, config.activation_dropout, config.attention_dropout)))
        assert all(4 <= int(ids.min()) and int(ids.max()) < 32 for ids in batches)
        return curves[(kernel, dtype)]

    monkeypatch.setattr(bench_precision, "train_curve", stand_in_curve)
    args = bench_precision.parse_args(["--device", "cpu", "--shape", "tiny", "--kernel", "sdpa", "--steps", "8",
                                       "--length", "16", "--tokens", "24", "--vocab_size", "32", "--layers", "2",
                                       "--learning_rate", "0.01", "--warmup_steps", "3", "--tolerance", "1.5"])
    saved = []
    data = bench_precision.run(args, "python -m benchmarks.bench_precision ...",
                               lambda data: saved.append(json.loads(json.dumps(data))))
    assert runs == [(kernel, dtype, [(1, 16)] * 8, "cpu", 0.01, 3, 32, 2, kernel, (0.0, 0.0, 0.0))
                    for kernel, dtype in (("eager", "float32"), ("sdpa", "bfloat16"), ("eager", "bfloat16"))]
    assert (data["meta"]["batch"], data["meta"]["layers"], data["meta"]["vocab_size"]) == (1, 2, 32)
    assert data["meta"]["command"] == "python -m benchmarks.bench_precision ..."
    kernel, eager = data["runs"][1], data["runs"][2]
    assert (kernel["max_deviation"], kernel["final_deviation"]) == (1.0, 0.5)
    assert (eager["max_deviation"], eager["final_deviation"]) == (0.5, 0.25)
    assert data["within_bf16"] is False   # 1.0 > 1.5 x 0.5 (within at 2.0, and bf16 eager within the kernel's)
    assert [(len(record["runs"]), record["within_bf16"]) for record in saved] == [(1, None), (2, None), (3, None),
                                                                                (3, False)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match=r"--device cuda: torch.cuda.is_available\(\) is False"):
        bench_precision.parse_args(["--device", "cuda"])


def test_precision_quick_sizes_only_what_the_command_line_leaves_unset() -> None:
    """bench_precision --quick is CPU-sized defaults, as in the other benchmarks: a --steps, --length, --tokens,
    --warmup_steps or --shape given beside it is kept (they were all replaced by --quick's)."""
    from benchmarks import bench_precision

    quick = bench_precision.parse_args(["--quick", "--device", "cpu"])
    assert (quick.shape, quick.steps, quick.length, quick.tokens, quick.warmup_steps) == ("tiny", 6, 16, 64, 2)
    given = bench_precision.parse_args(["--quick", "--device", "cpu", "--shape", "small", "--steps", "20",
                                        "--length", "8", "--tokens", "32", "--warmup_steps", "5"])
    assert (given.shape, given.steps, given.length, given.tokens, given.warmup_steps) == ("small", 20, 8, 32, 5)
    full = bench_precision.parse_args(["--device", "cpu"])
    assert (full.shape, full.steps, full.length, full.tokens, full.warmup_steps) == ("base", 300, 128, 8192, 50)


def test_precision_training_warms_up_the_learning_rate_and_clips_each_steps_gradient(monkeypatch) -> None:
    """train_curve on a one-weight stand-in model (loss = w x the batch's mean id, so the gradient is the mean id),
    from the given weights: the losses match AdamW written out by hand with lr x min(1, step / warmup) at steps
    1, 2, ... and each step's own gradient clipped at norm 1."""
    from types import SimpleNamespace

    from benchmarks import bench_precision

    class OneWeight(torch.nn.Module):
        def __init__(self, config) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros((), dtype=torch.float64))

        def forward(self, input_ids, labels):
            return SimpleNamespace(loss=self.weight * input_ids.double().mean())

    monkeypatch.setattr(bench_precision, "RelPosTransformerForConditionalGeneration", OneWeight)
    gradients = [4.0, 8.0, 0.5, 2.0, -3.0]
    batches = [torch.tensor([[int(2 * g), 0]]) for g in gradients]   # mean id = g
    losses = bench_precision.train_curve({"weight": torch.tensor(0.5, dtype=torch.float64)}, lambda kernel: None,
                                         "eager", "float32", batches, "cpu", 0.1, 3)
    weight, first, second, expected = 0.5, 0.0, 0.0, []
    for step, gradient in enumerate(gradients, 1):
        expected.append(weight * gradient)
        rate = 0.1 * min(1.0, step / 3)
        gradient *= min(1.0, 1.0 / (abs(gradient) + 1e-6))
        first, second = 0.9 * first + 0.1 * gradient, 0.999 * second + 0.001 * gradient**2
        weight *= 1 - rate * 0.01   # AdamW's decoupled weight decay (0.01)
        weight -= rate * (first / (1 - 0.9**step)) / ((second / (1 - 0.999**step)) ** 0.5 + 1e-8)
    assert losses == pytest.approx(expected, rel=1e-9)


def test_precision_copy_batches_are_seeded_ids_past_the_special_tokens() -> None:
    from benchmarks.bench_precision import copy_batches

    batches = copy_batches(3, 2, 20, 7, seed=5)
    assert [tuple(ids.shape) for ids in batches] == [(2, 20)] * 3
    assert set(torch.cat(batches).flatten().tolist()) == {4, 5, 6}
    assert all(torch.equal(a, b) for a, b in zip(batches, copy_batches(3, 2, 20, 7, seed=5), strict=True))
    assert not torch.equal(batches[0], copy_batches(1, 2, 20, 7, seed=6)[0])


def test_precision_report_shows_every_tenth_step_and_the_last_and_the_verdict() -> None:
    """render_markdown for 32 steps shows steps 1, 4, ..., 31 and 32 (numbered from 1), and the verdict: within,
    NOT within, or not decided before bf16 eager ran."""
    from benchmarks import bench_precision

    meta = {"command": "c", "device": "cpu", "device_name": "d", "cpu_threads": 1, "dtype": "bf16", "torch": "t",
            "transformers": "t", "python": "p", "date": "today", "kernel": "sdpa", "scheme": "shaw", "shape": "tiny",
            "layers": 1, "vocab_size": 64, "length": 16, "batch": 4, "steps": 32, "learning_rate": 1e-3,
            "warmup_steps": 2, "seed": 0, "tolerance": 2.0}
    runs = [{"kernel": "eager", "dtype": "float32", "losses": [float(step) for step in range(32)]},
            {"kernel": "sdpa", "dtype": "bfloat16", "losses": [0.5] * 32, "max_deviation": 1.0,
             "final_deviation": 0.25}]
    markdown = bench_precision.render_markdown({"meta": meta, "runs": runs, "within_bf16": None})
    steps = [int(line.split("|")[1]) for line in markdown.splitlines() if line[:2] == "| " and line[2:3].isdigit()]
    assert steps == [*range(1, 32, 3), 32]
    assert "| 32 | 31.0000 | 0.5000 |" in markdown and "| bfloat16 sdpa | 1.0000 | 0.2500 |" in markdown
    assert markdown.endswith("not decided yet (bf16 eager not run).")
    assert bench_precision.render_markdown({"meta": meta, "runs": runs, "within_bf16": True}).endswith(": within.")
    assert bench_precision.render_markdown({"meta": meta, "runs": runs, "within_bf16": False}).endswith(
        ": NOT within.")


def test_console_rows_of_the_training_and_decoding_benchmarks() -> None:
    """format_row's one line per row: the training row's throughput, ratio to absolute and peak with its overhead as
    a percentage; the decoding row's cached and uncached speeds and speed-up, flagged below 5x."""
    training = {"benchmark": "attention", "shape": "tiny", "length": 8, "batch": 4, "scheme": "shaw@sdpa",
                "tokens_per_s": 1234.4, "ratio": 0.75, "peak_mib": 12.5, "memory_overhead": 0.125}
    assert " ".join(bench_training.format_row(training).split()) == (
        "attention tiny n=8 batch=4 shaw@sdpa 1234 tok/s x0.750 peak 12.5 MiB (+12.5%)")
    decoding = {"scheme": "shaw", "cached_tokens_per_s": 123.46, "uncached_tokens_per_s": 20.0, "speedup": 6.17,
                "meets_5x": True}
    assert " ".join(bench_decoding.format_row(decoding).split()) == (
        "shaw cached 123.5 tok/s uncached 20.0 tok/s speed-up x6.2")
    assert bench_decoding.format_row(decoding | {"speedup": 4.96, "meets_5x": False}).endswith(
        "speed-up x5.0  (below 5x)")
