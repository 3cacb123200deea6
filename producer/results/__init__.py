"""What a run produced: ``regen report`` and ``regen export``.

outputs.py reads committed samples and output shards the way the ledger vouches for
them; report.py (with report_plots.py) writes the HTML report; export.py (with
export_rows.py) writes training data, export_split.py decides a sample's side of the
train/eval split, token_stats.py counts the loss-mask tokens, draft_vocab.py writes the
drafter's d2t/t2d vocabulary mapping.
"""
