"""The settings of an experiment script, for its report, and the command line that gives them back."""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Collection, Iterable
from pathlib import Path

from hf_relpos.translation.safety import output_folder


def json_settings(args: argparse.Namespace) -> dict:
    """A script's parsed command line as JSON values (paths as strings), for its report's settings."""
    return {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}


def command_line(script: str, parser: argparse.ArgumentParser, settings: dict, leave_out: Collection[str] = (),
                 always: Collection[str] = ()) -> str:
    """`python <script>` with the options of `parser` that give back a record's `settings` (its `json_settings`, keyed
    by dest): every option whose recorded value differs from the parser's default, in the parser's order (an option
    taking the rest of the line last). A path option, and an option in `always`, is written whatever its value (their
    defaults depend on the machine: where the checkout lies, whether it has a GPU); one the record lacks that the
    script requires, or a path, is written as its placeholder (its metavar, else its dest in capitals). An option the
    record lacks otherwise took its default (the script had no such option then). `leave_out`: options that are no
    setting of the measurement (e.g. `collect_only`, the mode of the invocation that collected the runs)."""
    words, rest = [], []
    for action in parser._actions:
        if not action.option_strings or action.dest in leave_out or isinstance(action, argparse._HelpAction):
            continue
        written = action.type in (Path, output_folder) or action.dest in always
        if action.dest not in settings:
            if written or action.required:
                words += [action.option_strings[-1], action.metavar or action.dest.upper()]
            continue
        value = settings[action.dest]
        if value == action.default and not written:
            continue
        option = action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction):
            words += [option] if value else []
        elif isinstance(action, argparse._AppendAction):
            words += [word for item in value for word in (option, str(item))]
        elif action.nargs == argparse.REMAINDER:
            rest = [option, *map(str, value)]
        elif isinstance(value, list):
            words += [option, *map(str, value)]
        elif value is not None:
            words += [option, str(value)]
    return shlex.join(["python", script, *words, *rest])


def adopt_run_settings(args: argparse.Namespace, runs: Iterable[dict], names: Collection[str], script: str) -> None:
    """Set the `names` of `args` (settings that shape what a run trains and scores, which each run records) to the
    runs' own: a --collect-only describes and tests the runs it collects, not its own command line (runs recorded
    before a setting was recorded keep the command line's). Runs that differ in one are one error naming it."""
    runs = list(runs)
    for name in names:
        values = {json.dumps(run[name]) for run in runs if name in run}
        if len(values) > 1:
            raise SystemExit(f"{script}: the runs collected differ in {name}: {', '.join(sorted(values))}")
        if values:
            setattr(args, name, json.loads(values.pop()))
