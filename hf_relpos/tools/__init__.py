"""Command-line tools on top of the model and the application: translate a file (`hf-relpos-translate`), convert a
MarianMT model (`hf-relpos-convert`), average checkpoints (`hf-relpos-average`), attention plots, Transformer-XL
memory evaluation."""
