"""Benchmark suite of issue #5; run each script as a module from the repository root, e.g.
`python -m benchmarks.bench_training --quick`."""
