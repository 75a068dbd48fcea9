"""Where a run ran, for the metadata of benchmark and experiment reports."""

from __future__ import annotations

import contextlib
import platform
from pathlib import Path


def cpu_model_name() -> str:
    """The processor's model name (/proc/cpuinfo on Linux, `platform.processor()` elsewhere)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"
