"""Training and evaluating `RelPosTransformerForCausalLM` over a long token stream with Transformer-XL memory.

The stream is cut into `batch_size` parallel rows (Dai et al.'s batchify); step t reads segment t of every row, so
row r of batch t continues row r of batch t-1 and the memory returned by one step is the right context for the next.
Targets are the next tokens of the stream, including the one after each segment's last position, so every token is
predicted exactly once per epoch.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, SequentialSampler

# transformers' own error would say only "Could not import module 'Trainer'"
if importlib.util.find_spec("accelerate") is None:
    raise ModuleNotFoundError("hf_relpos.tools.lm_memory trains with transformers' Trainer, which needs accelerate (in "
                              "the train extra): pip install '.[train]' in the hf_relpos checkout", name="accelerate")

from transformers import Trainer  # noqa: E402

from ..model.modeling_relpos import token_cross_entropy
from ..model.validation import require_int
from .modes import evaluation_mode


class SegmentedStream(Dataset):
    """Item k = segment k // batch_size of row k % batch_size: `input_ids` [L], `targets` [L], `segment` index.

    Read sequentially with batch size `batch_size`, batch t holds segment t of every row. The tail that does not
    fill a whole segment in every row is dropped (as in Transformer-XL's LMOrderedIterator).
    """

    def __init__(self, tokens: torch.Tensor, batch_size: int, segment_length: int) -> None:
        if tokens.dim() != 1:
            raise ValueError(f"tokens must be a 1-D stream, got shape {tuple(tokens.shape)}")
        require_int("batch_size", batch_size, minimum=1)
        require_int("segment_length", segment_length, minimum=1)
        row_length = (tokens.numel() - 1) // batch_size
        self.segments_per_row = row_length // segment_length
        if self.segments_per_row <= 0:   # an empty stream gives -1 (floor division of -1)
            raise ValueError(
                f"a stream of {tokens.numel()} tokens is too short for batch_size={batch_size} x "
                f"segment_length={segment_length}"
            )
        usable = self.segments_per_row * segment_length
        rows = torch.stack([tokens[r * row_length : r * row_length + usable + 1] for r in range(batch_size)])
        self.inputs, self.targets = rows[:, :-1], rows[:, 1:]
        self.batch_size = batch_size
        self.segment_length = segment_length

    def __len__(self) -> int:
        return self.batch_size * self.segments_per_row

    def __getitem__(self, index: int) -> dict[str, torch.Tensor | int]:
        row, segment = index % self.batch_size, index // self.batch_size
        window = slice(segment * self.segment_length, (segment + 1) * self.segment_length)
        return {"input_ids": self.inputs[row, window], "targets": self.targets[row, window], "segment": segment}


class MemoryTrainer(Trainer):
    """A `Trainer` that carries Transformer-XL `mems` from one step to the next (one memory for training, one for
    evaluation), resetting it when a batch starts a new pass over the stream. Use it with `SegmentedStream` and
    `per_device_train_batch_size` (and eval batch size) equal to the stream's `batch_size`; single process."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.args.world_size > 1:
            raise ValueError("MemoryTrainer carries one memory per stream row and runs in a single process only")
        if self.args.label_smoothing_factor:
            raise ValueError(f"label_smoothing_factor must be 0 for MemoryTrainer (its loss is the plain next-token "
                             f"cross-entropy of the stream), got {self.args.label_smoothing_factor}")
        for split, dataset, batch_size in (("train", self.train_dataset, self.args.per_device_train_batch_size),
                                           ("eval", self.eval_dataset, self.args.per_device_eval_batch_size)):
            if isinstance(dataset, SegmentedStream) and batch_size != dataset.batch_size:
                raise ValueError(f"per_device_{split}_batch_size ({batch_size}) must equal the stream's batch_size "
                                 f"({dataset.batch_size}): each batch row carries the memory of one stream row")
        self._memory: dict[bool, tuple[torch.Tensor, ...] | None] = {True: None, False: None}

    def _get_collator_with_removed_columns(self, data_collator: Callable, description: str | None = None) -> Callable:
        """Keep `targets` and `segment`, which the model's forward does not take but `compute_loss` needs."""
        return data_collator

    def _get_train_sampler(self, *args, **kwargs) -> SequentialSampler:
        return SequentialSampler(self.train_dataset)

    def _get_eval_sampler(self, eval_dataset: Dataset) -> SequentialSampler:
        return SequentialSampler(eval_dataset)

    def compute_loss(
        self, model: nn.Module, inputs: dict[str, torch.Tensor], return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        targets, segment = inputs.pop("targets"), inputs.pop("segment")
        training = model.training
        if bool((segment == 0).all()):
            self._memory[training] = None
        outputs = model(input_ids=inputs["input_ids"], mems=self._memory[training])
        self._memory[training] = outputs.mems
        loss = token_cross_entropy(outputs.logits, targets)
        return (loss, outputs) if return_outputs else loss

    def prediction_step(
        self, model: nn.Module, inputs: dict[str, torch.Tensor], prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[torch.Tensor, None, None]:
        with torch.no_grad():
            loss = self.compute_loss(model, self._prepare_inputs(inputs))
        return loss.detach(), None, None


@torch.no_grad()
def stream_perplexity(
    model: nn.Module, tokens: torch.Tensor, segment_length: int, mem_len: int, batch_size: int = 1
) -> float:
    """Perplexity of `tokens` read in consecutive segments of `segment_length`, each seeing the previous `mem_len`
    positions through the memory (mem_len=0: segments are independent). Every predicted token counts once. The model
    reads in eval mode (no dropout); each of its modules is left in the mode it was given in, also when the call
    fails (`evaluation_mode`)."""
    with evaluation_mode(model):
        stream = SegmentedStream(tokens, batch_size, segment_length)
        device = next(model.parameters()).device
        total_loss, total_tokens, mems = 0.0, 0, None
        for segment in range(stream.segments_per_row):
            window = slice(segment * segment_length, (segment + 1) * segment_length)
            inputs, targets = stream.inputs[:, window].to(device), stream.targets[:, window].to(device)
            outputs = model(input_ids=inputs, mems=mems, mem_len=mem_len)
            mems = outputs.mems if mem_len > 0 else None
            total_loss += token_cross_entropy(outputs.logits, targets).item() * targets.numel()
            total_tokens += targets.numel()
    return math.exp(total_loss / total_tokens)
