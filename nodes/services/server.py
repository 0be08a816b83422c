"""ComfyUI's prompt queue: flags set on it (what POST /free sets) reach its worker."""

import threading

from . import guardrails


NUDGES, NUDGE_S = 20, 0.25  # how long flags set by /free are pressed on ComfyUI's prompt worker: 5 s


def wake_for_flags(queue) -> bool:
    """Make flags set on ComfyUI's prompt queue (what POST /free sets) reach its worker.

    The worker reads the flags only after its queue wait returns, and a flag's wake-up is lost when it comes while
    the worker is not waiting: right after a run it collects garbage between reading the flags and waiting again,
    and a /free arriving then sat unread until the next prompt (measured: about one /free in five under load). So
    after a flag is set, the queue is woken again every quarter second while flags are pending, for 5 s at most
    (a running prompt reads them itself when it ends). False when the queue is not ComfyUI's kind."""
    if not all(hasattr(queue, name) for name in ("set_flag", "flags", "mutex", "not_empty")):
        return False
    set_flag = queue.set_flag

    def nudge(left: int) -> None:
        with queue.mutex:
            if not queue.flags:
                return
            queue.not_empty.notify()
        if left > 1:
            timer = threading.Timer(NUDGE_S, nudge, (left - 1,))
            timer.daemon = True
            timer.start()

    def set_flag_and_wake(name, data):
        if name == "unload_models" and data:  # /free: the server-wide guardrail goes with the models
            guardrails.release()
        set_flag(name, data)
        timer = threading.Timer(NUDGE_S, nudge, (NUDGES,))
        timer.daemon = True
        timer.start()

    queue.set_flag = set_flag_and_wake
    return True
