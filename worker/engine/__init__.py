"""The engine room: one vLLM engine per worker process, and how full it is kept.

In the order a conversation passes through::

    admission.py   the gate: which held batch's conversations enter the engine, oldest first
      kv_level.py  the level a KV-cache-limited engine runs without preempting (REGEN_KV_ADMISSION)
      sizing.py    how many requests a KV cache holds at a workload's lengths (the arithmetic)
      cache_plan.py  vLLM's pool for a model, dense or hybrid (recurrent states in padded pages): what it holds
    host.py        EngineHost: vLLM's AsyncLLM on its own event loop (loop.py), shared by all batches
      args.py      ``--engine-arg k=v`` pairs to vLLM's engine arguments
      gpu_memory.py  the share of its card the engine takes (more than vLLM's on a card of its own)
      kv_tier.py   a CPU tier for the KV cache, when asked for: keeps generated blocks, fits the host
      mtp.py       the model's own MTP head as lossless speculative decoding: engine args, acceptance, choice
    occupancy.py   how full the engine was, sampled (read by worker/batches/holding.py)
    stats.py       vLLM's scheduler stats, for a diagnosis only (REGEN_ENGINE_STATS=1)

Beside it: fake.py (a fake engine for benchmarks and control-plane tests, never real data)
and pilot.py (the engine half of ``regen estimate``: the drawn sample generated as the
workers would, ``python -m worker.engine.pilot``).
"""
