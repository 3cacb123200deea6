"""worker/measure/thread_cpu.py: a process's CPU by thread kind, read from /proc, as the worker logs it."""

import sys
import threading
import time

import pytest

from worker.measure import thread_cpu

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_busy_thread_is_charged_its_cpu_under_its_kind():
    cpu = thread_cpu.ThreadCpu()
    burned, stop = threading.Event(), threading.Event()

    def burn_then_wait() -> None:
        _burn(0.4)
        burned.set()
        stop.wait()  # a thread that ended takes its time with it: read while it lives

    t = threading.Thread(target=burn_then_wait, name="burner-7")
    t.start()
    try:
        assert burned.wait(30)
        delta = cpu.take()
    finally:
        stop.set()
        t.join()
    assert delta["burner"] >= 0.3, delta
    assert list(delta)[0] == "burner", f"busiest first: {delta}"
    assert cpu.take().get("burner", 0.0) < 0.1, "a second take counts from the first"


def test_pool_threads_are_one_kind_per_pool():
    assert thread_cpu.group_name("ThreadPoolExecutor-0_3") == "ThreadPoolExecutor-0"
    assert thread_cpu.group_name("ThreadPoolExecutor-1_0") == "ThreadPoolExecutor-1"
    assert thread_cpu.group_name("Thread-12 (run)") == "Thread"
    assert thread_cpu.group_name("vllm-engine-loop") == "vllm-engine-loop"


def test_logged_lines_add_up_for_scripts():
    lines = [thread_cpu.line(5, {"vllm-engine-loop": 2.5, "ThreadPoolExecutor-0": 0.25}),
             "some other log line",
             thread_cpu.line(5, {"vllm-engine-loop": 1.0, "other": 0.5})]
    assert "vllm-engine-loop 2.5 s" in lines[0]
    assert thread_cpu.parse_lines(lines) == {"vllm-engine-loop": 3.5, "other": 0.5, "ThreadPoolExecutor-0": 0.25}
