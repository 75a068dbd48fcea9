"""The settings of an experiment script, for its report."""

from __future__ import annotations

import argparse
from pathlib import Path


def json_settings(args: argparse.Namespace) -> dict:
    """A script's parsed command line as JSON values (paths as strings), for its report's settings."""
    return {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
