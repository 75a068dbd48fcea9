"""`pipeline("translation")` for hf_relpos models: transformers 5 removed the built-in translation task.

`import hf_relpos` puts the task back into transformers' pipeline registry (`register_translation_task`), so
`pipeline("translation", model=FOLDER)` translates with a saved folder. Flat on purpose: hf_relpos.hub ships this
file with every pushed model and declares it in config.json (`custom_pipelines`), so that where hf_relpos is not
installed

    pipeline("translation", model=REPO, trust_remote_code=True)("A sentence.")

translates too (transformers then requires `trust_remote_code=True` for such a repo even with hf_relpos installed).
"""

from __future__ import annotations

from typing import Any

from transformers import Pipeline


class TranslationPipeline(Pipeline):
    """`pipeline("translation")` for encoder-decoder models: text (or a list of texts) in,
    `[{"translation_text": ...}]` out. Generation settings (`num_beams`, `max_new_tokens`, ...) come from the
    model's generation_config.json unless passed as keyword arguments."""

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True
    _pipeline_calls_generate = True

    def __call__(self, inputs: Any, **kwargs: Any) -> Any:
        outputs = super().__call__(inputs, **kwargs)
        if isinstance(inputs, list) and all(len(output) == 1 for output in outputs):
            return [output[0] for output in outputs]
        return outputs

    def _sanitize_parameters(self, **generate_kwargs: Any) -> tuple[dict, dict, dict]:
        return {}, {"generate_kwargs": generate_kwargs}, {}

    def preprocess(self, text: str) -> dict:
        return self.tokenizer(text, return_tensors="pt")

    def _forward(self, model_inputs: dict, generate_kwargs: dict) -> dict:
        return {"output_ids": self.model.generate(**model_inputs, **self._prepare_generate_kwargs(generate_kwargs))}

    def postprocess(self, model_outputs: dict) -> list[dict[str, str]]:
        output_ids = model_outputs["output_ids"]
        texts = self.tokenizer.batch_decode(output_ids.reshape(-1, output_ids.shape[-1]), skip_special_tokens=True)
        return [{"translation_text": text.strip()} for text in texts]


def register_translation_task() -> None:
    """Restore the "translation" task that transformers 5 removed, served by `TranslationPipeline`."""
    from transformers import AutoModelForSeq2SeqLM, pipelines

    pipelines.REMOVED_TASKS.pop("translation", None)
    pipelines.PIPELINE_REGISTRY.register_pipeline(
        "translation", pipeline_class=TranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
    )
