"""benchmarks/bench_data.py's corpus: reused only when a finished generation for the same size wrote it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_data


@pytest.fixture
def multi30k(tmp_path, monkeypatch) -> Path:
    """A three-pair stand-in for the Multi30k files the corpus samples from."""
    folder = tmp_path / "multi30k"
    folder.mkdir()
    pairs = [{"translation": {"en": f"A dog runs {index}.", "de": f"Ein Hund läuft {index}."}} for index in range(3)]
    for name in ("train", "validation", "test"):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(pair) + "\n" for pair in pairs), encoding="utf-8")
    monkeypatch.setattr(bench_data, "MULTI30K", folder)
    return folder


def test_an_interrupted_regeneration_is_not_reused(multi30k, tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    prefixes = bench_data.generate_corpus(corpus, 5)
    assert len(Path(f"{prefixes['train']}.en").read_text(encoding="utf-8").splitlines()) == 5
    real_random = bench_data.random.Random

    class Interrupted(real_random):
        def randint(self, *args):
            raise KeyboardInterrupt("killed while writing the train files")
    monkeypatch.setattr(bench_data.random, "Random", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        bench_data.generate_corpus(corpus, 7)   # another size: the train files are rewritten, then killed
    monkeypatch.setattr(bench_data.random, "Random", real_random)
    assert not (corpus / "corpus.json").exists()
    prefixes = bench_data.generate_corpus(corpus, 5)
    assert len(Path(f"{prefixes['train']}.en").read_text(encoding="utf-8").splitlines()) == 5
