"""``regen estimate``: tokens, engine-hours and days of a run, before it runs (docs/estimate.md).

command.py (the click command) → estimator.py (the steps, saving and loading) →
sample.py (the stratified draw) → ``python -m worker.engine.pilot`` (generation) →
arithmetic.py (totals, intervals, what-if) → render.py (text). compare.py puts a
saved estimate beside what the run took (``--compare``).
"""
