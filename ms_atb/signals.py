"""Signals with MindSpore in the process: Ctrl-C during engine work, and Ctrl-C told apart from an external
SIGTERM in a command-line job.

interrupts_raise(): while engine work runs, Ctrl-C raises KeyboardInterrupt instead of killing the process.
MindSpore installs its own SIGINT handler at every graph run, and that handler sends the process SIGTERM, whose
default action kills it: every result held in memory would be lost. Inside interrupts_raise() SIGTERM raises
KeyboardInterrupt, so a run stops as an interrupted Python call does (finished outputs ride on the exception,
the engine stays usable); afterwards Python's SIGINT handler is back. Left alone outside the main thread, or
when the program has its own SIGTERM handler (watch_signals() installs one).

watch_signals(): by MindSpore's handler alone, Ctrl-C and `kill <pid>` look the same. The sender does not: MindSpore's SIGTERM comes
from the process itself. So once watch_signals() has run:
  1. SIGTERM is blocked in every thread started after it (the engine's included) and a watcher thread
     takes it with sigwaitinfo, which names the sender;
  2. a SIGTERM the process sent itself is Ctrl-C: the main thread gets KeyboardInterrupt;
  3. a SIGTERM from another process: the main thread gets Terminated (a KeyboardInterrupt), so the
     command can exit 128 + 15 = 143 instead of 130;
  4. a SIGINT outside a graph run reaches Python's own handler: KeyboardInterrupt.
Call it from the main thread before any other thread exists: before MindSpore, and numpy (its BLAS thread
pool), are imported. Threads inherit the blocked SIGTERM; one started earlier would take SIGTERM itself.
"""
from __future__ import annotations

import _thread
import contextlib
import os
import signal
import threading

EXIT_INTERRUPTED = 128 + signal.SIGINT      # 130
EXIT_TERMINATED = 128 + signal.SIGTERM      # 143


class Terminated(KeyboardInterrupt):
    """Another process sent SIGTERM."""


def _raise_terminated(signum, frame):
    raise Terminated("terminated (SIGTERM from another process)")


def watch_signals() -> bool:
    """Starts the watcher for the rest of the process's life (a command-line job's: nothing restores it);
    True if it runs. Does nothing outside the main thread, without sigwaitinfo, or when the program has
    its own SIGTERM handler."""
    if (threading.current_thread() is not threading.main_thread() or not hasattr(signal, "sigwaitinfo")
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        return False
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    signal.signal(signal.SIGTERM, _raise_terminated)     # what _thread.interrupt_main(SIGTERM) calls
    pid = os.getpid()

    def watch():
        while True:
            info = signal.sigwaitinfo({signal.SIGTERM})
            _thread.interrupt_main(signal.SIGINT if info.si_pid == pid else signal.SIGTERM)

    threading.Thread(target=watch, name="ms-atb-signals", daemon=True).start()
    return True


@contextlib.contextmanager
def interrupts_raise():
    """While engine work runs, Ctrl-C raises KeyboardInterrupt instead of killing the process (above)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return
    sigint = signal.getsignal(signal.SIGINT)     # Python's record; MindSpore replaced the C handler
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if sigint is not None:
            signal.signal(signal.SIGINT, sigint)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"interrupted (signal {signum}: MindSpore turns Ctrl-C into SIGTERM)")
