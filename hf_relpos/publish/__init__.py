"""Publishing: model cards rendered from a typed record of a run, the Hub push, the translation pipeline, and
writing folders and files without ever leaving them half-written. Imports the model unit only."""
