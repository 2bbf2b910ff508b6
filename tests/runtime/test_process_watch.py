"""ProcessWatch: the one waiter on a child process. Its exit code survives
other reapers racing it, and `stop` escalates SIGTERM -> SIGKILL."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

from pagoda.runtime.process_watch import ProcessWatch

# fork: the targets are trivial and need not be importable by a spawned child.
CTX = multiprocessing.get_context("fork")


def _exit_with(code: int, delay: float = 0.0) -> None:
    time.sleep(delay)
    os._exit(code)


def _sleep_forever(ignore_sigterm: bool) -> None:
    if ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(1)


def start(target, *args) -> multiprocessing.Process:
    proc = CTX.Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


def test_the_exit_code_reaches_waiters_and_the_callback():
    seen: list[int | None] = []
    watch = ProcessWatch(start(_exit_with, 3, 0.2), on_exit=seen.append)
    assert watch.alive
    assert watch.wait(10)
    assert not watch.alive
    assert watch.exitcode == 3
    assert seen == [3]


def test_the_exit_code_survives_another_reaper_racing_the_watch():
    # multiprocessing reaps every child whenever a process starts or
    # active_children() runs; a plain Process.join() in a second thread lost
    # such races with ECHILD and reported the child as still running.
    stop = threading.Event()

    def reap_all_the_time():
        while not stop.is_set():
            multiprocessing.active_children()

    racer = threading.Thread(target=reap_all_the_time, daemon=True)
    racer.start()
    try:
        watches = [ProcessWatch(start(_exit_with, 7, 0.05 * (i % 4))) for i in range(12)]
        for watch in watches:
            assert watch.wait(10)
        assert [w.exitcode for w in watches] == [7] * 12
    finally:
        stop.set()
        racer.join()


def test_many_threads_waiting_all_see_the_exit():
    watch = ProcessWatch(start(_exit_with, 0, 0.3))
    results: list[bool] = []
    threads = [threading.Thread(target=lambda: results.append(watch.wait(10))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 8
    assert watch.exitcode == 0


def test_stop_sends_sigterm_to_a_process_that_stays():
    watch = ProcessWatch(start(_sleep_forever, False))
    assert watch.stop(0.2) == -signal.SIGTERM
    assert not watch.alive


def test_stop_sends_sigkill_when_sigterm_is_ignored():
    watch = ProcessWatch(start(_sleep_forever, True))
    time.sleep(0.2)  # let it install its handler
    assert watch.stop(0.2) == -signal.SIGKILL


def test_signals_to_a_reaped_process_go_nowhere():
    watch = ProcessWatch(start(_exit_with, 0))
    assert watch.wait(10)
    watch.kill()  # no error, and no signal to a pid the kernel may reuse
    assert watch.stop(0.1) == 0
