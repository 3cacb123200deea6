"""The control plane: the ``regen`` command and what it runs. No vLLM or torch import.

Command → module::

    regen submit           submit_checks.py (before anything is written) → submit.py (run_config.py: the
                           run's configuration and hash)
    regen retry            retry.py
    regen clean            clean.py
    regen estimate         estimate/  command.py → sample.py (draw) → worker.engine.pilot (generate)
                                      → arithmetic.py → render.py; compare.py for --compare
    regen status [--watch] monitoring/status.py, monitoring/watch.py
    regen metrics          monitoring/metrics.py
    regen report           results/report.py (report_plots.py), reading through results/outputs.py
    regen export           results/export.py (export_rows.py), reading through results/outputs.py
    regen requeue, resume  ledger/reconcile.py, ledger/quality.py
    regen worker           cli_worker.py → worker/process/slurm.py (a SLURM job's node, GPUs, end),
                           worker/process/launcher.py
    regen tiny-model       worker/tiny/family_model.py

``cli.py`` declares the commands, ``cli_common.py`` what they share (settings, the
ledger block, the run-config options), ``cli_errors.py`` the one line a ledger, broker or S3
failure of any command is said in. ``dataset/`` reads and normalises input rows
for submit and estimate: readers.py → normalize.py (sharegpt.py, jsontext.py), with
the rejection codes of reasons.py.
"""
