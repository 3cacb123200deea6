"""Benchmarks: ``python -m bench.throughput`` (engine saturation on the CPU), ``python -m bench.gpu.throughput``
(the same on a GPU node, bench/gpu/README.md) and ``python -m bench.submit_scale`` (control plane at dataset
scale). bench/lengths.py says what a throughput workload really generated. Current results:
docs/performance.md; every dated run: docs/results/."""
