"""Running a model in eval mode for one call and giving each of its modules its own mode back afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


@contextmanager
def evaluation_mode(model: nn.Module) -> Iterator[nn.Module]:
    """`model.eval()` inside the block; on leaving it (also on an error) every module gets back its own `training`
    flag as it was on entry, so submodules put in eval mode on their own (frozen dropout) stay so in a model that
    trains (`model.train(flag)` would set one flag on all of them)."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in modes:
            module.training = training
