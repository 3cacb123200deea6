"""Measurement a worker can switch on without a profiler: by-thread CPU, ledger-call latency.

    thread_cpu.py     where a process's CPU goes, by thread (/proc/self/task)
    ledger_timing.py  client-side latency of the ledger calls, by kind (REGEN_LEDGER_TIMING)
"""
