"""What a run produced: ``regen report`` and ``regen export``.

outputs.py reads committed samples and output shards the way the ledger vouches for
them; report.py (with report_plots.py) writes the HTML report; export.py (with
export_rows.py) writes training data.
"""
