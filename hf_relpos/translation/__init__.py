"""The translation application behind train_translation.py (`hf-relpos-train`): arguments, data, batching,
tokenizers, the trainer and its run, output-folder checks and checkpoints. Needs the `hf_relpos[train]` extra."""
