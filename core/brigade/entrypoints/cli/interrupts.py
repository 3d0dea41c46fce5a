"""Ctrl-C and SIGTERM while a command starts or runs: one line, every child process stopped, exit 128 + signal.

Python's default SIGINT raises ``KeyboardInterrupt`` wherever the main thread is: in an import, inside the engine's
start-up (which then reports "the engine failed to start: KeyboardInterrupt"), or in uvicorn's start-up, each with
its own traceback. ``exit_on_interrupt`` replaces that with a handler that ends the process at once. Child
processes (the engine, its workers) ignore SIGINT themselves (``core_proc.py``, ``worker_proc.py``): the front
end stops them.
"""

from __future__ import annotations

import os
import signal
import time

__all__ = ["descendant_pids", "exit_on_interrupt", "kill_descendants", "restore_default_signals"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_on_interrupt(command: str) -> None:
    """Make SIGINT and SIGTERM end this process within a moment: one stderr line, child processes killed, and
    exit status 130 (SIGINT) or 143 (SIGTERM), with no traceback and no ``atexit`` noise.

    ``brigade serve`` replaces these handlers with uvicorn's graceful shutdown once it serves. A forked child
    inherits the handlers; in it they ignore the signal, as its parent is the one that stops it.

    Args:
        command: how the line names the command, e.g. "brigade serve".
    """
    owner = os.getpid()

    def handle(signum: int, frame) -> None:
        if os.getpid() != owner:  # a forked child that has not set its own handlers yet
            return
        name = signal.Signals(signum).name
        try:
            os.write(2, f"{command}: interrupted by {name}; stopped\n".encode())
        except OSError:
            pass
        kill_descendants()
        os._exit(128 + signum)

    for sig in _SIGNALS:
        signal.signal(sig, handle)


def restore_default_signals() -> None:
    """Python's own handlers again: SIGINT raises ``KeyboardInterrupt``, SIGTERM ends the process."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def descendant_pids(pid: int | None = None) -> list[int]:
    """The ids of every live process below ``pid`` (default: this one), parents before their children.

    Read from ``/proc`` (Linux); elsewhere, only multiprocessing's direct children of this process.
    """
    root = os.getpid() if pid is None else pid
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        import multiprocessing

        return [p.pid for p in multiprocessing.active_children() if p.pid is not None]
    children: dict[int, list[int]] = {}
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != b"Z":  # a zombie is already dead
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, queue = [], [root]
    while queue:
        kids = children.get(queue.pop(0), [])
        found.extend(kids)
        queue.extend(kids)
    return found


def kill_descendants(rounds: int = 3) -> None:
    """SIGKILL every process below this one. All are stopped (SIGSTOP) first, so that none notices another's death
    and logs about it, and the tree is read again in case one was forking; direct children are then reaped."""
    seen: list[int] = []
    for _ in range(rounds):
        new = [pid for pid in descendant_pids() if pid not in seen]
        if not new:
            break
        for pid in new:
            _send(pid, signal.SIGSTOP)
        seen.extend(new)
    for pid in seen:
        _send(pid, signal.SIGKILL)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # reap our own children, so none is left as a zombie
        try:
            done, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if done == 0:
            time.sleep(0.01)


def _send(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:  # already gone
        pass
