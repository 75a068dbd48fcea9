"""Benchmark suite: the cost of each position scheme against `absolute`; run each script as a module from the
repository root, e.g. `python -m benchmarks.bench_training --quick`."""

import shlex
import sys


def command_line(module: str, argv: list[str] | None) -> str:
    """The command that reproduces a run: `python -m <module>` and the arguments its main parsed, sys.argv's where
    main was given none (as argparse reads them), never the command line of a process that called main from code."""
    return shlex.join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)])
