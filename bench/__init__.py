"""Benchmarks: ``python -m bench.throughput`` (engine saturation) and ``python -m bench.submit_scale``
(control plane at dataset scale). Results and the commands that produced them: docs/performance.md."""
