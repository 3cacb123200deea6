"""Watching a farm: ``regen status`` (status.py), its live view ``--watch`` (watch.py), and the
Prometheus exporter ``regen metrics`` (metrics.py). All read the ledger; none writes it.
"""
