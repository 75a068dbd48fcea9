"""The model unit: configuration, model, attention kernels, the position-scheme contract and one file per scheme.
What `save_pretrained` copies as remote code, so it imports only torch, transformers and itself (flat relative
imports)."""
