"""The translation application behind train_translation.py (`hf-relpos-train`): arguments, data, batching,
tokenizers, the trainer and its run, output-folder checks and checkpoints. Needs the `hf_relpos[train]` extra."""

from __future__ import annotations

import importlib.util

# The import names of the `train` extra's packages (pyproject.toml; pyyaml is `yaml`).
TRAIN_EXTRA_MODULES = ("datasets", "sacrebleu", "accelerate", "tokenizers", "numpy", "tqdm", "yaml")
# pyproject.toml's [project.scripts]: every one of them runs on this application.
TRAIN_EXTRA_COMMANDS = ("hf-relpos-train", "hf-relpos-translate", "hf-relpos-score", "hf-relpos-convert",
                        "hf-relpos-average", "hf-relpos-export")


def missing_train_modules() -> list[str]:
    """The modules of the `train` extra that are not installed."""
    return [name for name in TRAIN_EXTRA_MODULES if importlib.util.find_spec(name) is None]


if missing := missing_train_modules():  # a plain `pip install hf_relpos` installs the commands, not what they need
    raise ModuleNotFoundError(f"hf_relpos' translation application and the commands {', '.join(TRAIN_EXTRA_COMMANDS)} "
                              f"need the train extra: pip install 'hf_relpos[train]' (from a checkout: pip install "
                              f"'.[train]'); missing: {', '.join(missing)}", name=missing[0])
