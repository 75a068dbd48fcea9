"""Where and with what a run ran: the facts a run record keeps beside its settings and scores."""

from __future__ import annotations

import contextlib
import platform
import subprocess
from pathlib import Path


def cpu_model_name() -> str:
    """The processor's model name (/proc/cpuinfo on Linux, `platform.processor()` elsewhere)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def source_version(checkout: Path) -> str:
    """`git describe --always --dirty` of the git checkout at `checkout` (which code ran; "unknown" outside one)."""
    described = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=checkout, capture_output=True, text=True)
    return described.stdout.strip() or "unknown"


def software_versions() -> dict[str, str]:
    """The releases a run trained and was scored with: python, torch, transformers, sacrebleu."""
    import sacrebleu
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "sacrebleu": sacrebleu.__version__}
