"""The GPU side: the Celery worker that turns batch messages into committed output shards.

The batch path, in order::

    launcher.py      regen worker: one process per GPU group, supervised
      reaper.py      beside it: stops every process of its workers once the launcher is gone
    process.py       one worker process: Celery consumer, threads pool (runtime.py: its state,
                     heartbeats, the reconciler; options.py: every setting and its default)
    tasks.py         the Celery task: thin, takes ids
    batch_task.py    one delivery, claim to commit:
      batch_ledger.py  claim (fenced by attempt), heartbeat, release, fail, commit
      generation.py    the batch on the shared engine (engine.py), each conversation turn by turn,
                       once admission.py's gate lets it in (oldest batch first, engine kept full)
        dialogue.py    on-policy regeneration of one conversation
        rendering.py   the model's own chat template, to token ids (and the run's parsers back)
        turn_parsers.py  a generated turn back to an assistant message: vLLM's parsers by name
                       (vllm_compat.py finds them across versions; parsing.py: regen's Qwen fallback)
      then the output shard to S3 and batch_ledger.py's commit

Beside it: probe.py (the engine half of ``regen estimate``), engine_args.py (``--engine-arg``
pairs), occupancy.py / holding.py (how full the engine is kept, and the batches held for it),
engine_stats.py (vLLM's scheduler stats, for a diagnosis only: ``REGEN_ENGINE_STATS=1``),
fake_engine.py (a benchmark and test device, never real data), engine_loop.py (the event-loop
thread both engine hosts share), and tiny/ (the offline tiny model for the demo and the tests).
"""
