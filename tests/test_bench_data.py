"""benchmarks/bench_data.py: its corpus is reused only when a finished generation for the same size wrote it; its tables
say what each size's tokenizer was trained on."""

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


def test_tables_name_the_tokenizer_sample_and_sort_the_sizes() -> None:
    run = {"wall_seconds": 1.0, "cpu_seconds": 1.0, "peak_rss_gib": 1.0, "peak_anonymous_gib": 0.5,
           "phases": [{"phase": "train the tokenizer", "seconds": 1.0, "cpu_seconds": 1.0, "peak_rss_gib": 1.0}]}

    def size(pairs: int, sample: int | None, **extra) -> dict:
        return {"pairs": pairs, "tokenizer_training_pairs": sample, "train_text_mib": 1, "prepared_mib": 1, "command": "x",
                "first_run": run, "second_run": run, "sampler": {"epoch_seconds": 0.1}, **extra}

    record = {"meta": {"command": "bench", "hardware": "cpu", "python": "3.11", "code": "abc", "date": "today",
                       "preprocessing_num_workers": 2},
              "sizes": [size(1000, 500), size(300, 500), size(1000, None, machine="busy")]}
    table = bench_data.render_markdown(record)
    rows = [line for line in table.splitlines() if line.startswith("| 1,000 |") or line.startswith("| 300 |")]
    assert [row.split(" | ")[1] for row in rows] == ["every pair", "a 500-pair sample", "every pair"]
    assert "- 1,000 pairs (every pair): code `abc`, today; busy" in table
    note = bench_data.render_cost_note(record)
    assert note.index("300 pairs") < note.index("1,000 pairs (1 MiB of text; tokenizer trained on a 500-pair sample)")
    assert "(busy)" in note
