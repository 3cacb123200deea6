"""Input rows to normalised samples, shared by ``regen submit`` and ``regen estimate``.

readers.py streams rows from JSONL and Parquet files; normalize.py turns each into
the sample of docs/CONTRACTS.md (sharegpt.py converts ShareGPT turns, jsontext.py
parses JSON strictly); reasons.py holds the codes of rows that are rejected.
"""
