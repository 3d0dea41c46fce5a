"""Parent watch: a child process (the EngineCore, a worker) exits within a second of its parent's death.

A parent killed with SIGKILL runs no clean-up, so its children must notice by themselves; otherwise an orphaned
EngineCore keeps computing its whole queue, and a supervisor that restarts the server ends up with two engines.
Polling the parent pid from a daemon thread works while the main thread is busy in a long step, which a check in
the busy loop would not.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

logger = logging.getLogger(__name__)

POLL_S = 0.2  # how often the parent pid is checked
GRACE_S = 0.5  # how long the process's own SIGTERM handling may take before a hard exit


def watch_parent(process_name: str, *, poll_s: float = POLL_S, grace_s: float = GRACE_S) -> threading.Thread:
    """Start a daemon thread that ends this process once its parent has exited.

    On the parent's death the thread logs one line, sends SIGTERM to its own process (so a handler can shut down
    children and sockets), and after ``grace_s`` exits hard with status 1. Call it first thing in the child, while
    the parent is certainly alive.

    Args:
        process_name: how the log line names this process ("engine", "worker rank 1").
    Returns:
        The started thread.
    """
    parent_pid = os.getppid()

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        logger.error("%s: parent process %d is gone; exiting", process_name, parent_pid)
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        finally:
            time.sleep(grace_s)
            os._exit(1)

    thread = threading.Thread(target=watch, daemon=True, name="brigade-parent-watch")
    thread.start()
    return thread
