"""The sessions open on this server, whatever protocol drives them: one per checkpoint, each bound to what opened it,
taking its chunks in order, one at a time; a retried chunk answered again; closed when asked, when a chunk fails, or
when idle for COSMOS3_SESSION_IDLE_S seconds (300), which frees its cache.

A route reads its protocol's fields off the event loop, then claims the chunk in one step on the loop (`claim`): no
other chunk, close or reaping comes between the checks and the claim. After the chunk ran (or failed), `finish`.
Refusals (`Refusal`) name what of the request is at fault in the registry's words ("session", "chunk", or a field of
the binding); the route answers them in its protocol's.
"""

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import services
from .fields import FieldError
from .http import answer

CLOSE_ROUTE = "/cosmos3/v1/sessions/{session_id}"
IDLE_ENV = "COSMOS3_SESSION_IDLE_S"
IDLE_S = 300.0

log = logging.getLogger(__name__)


class Refusal(Exception):
    """A chunk the registry refuses: `about` is what is at fault ("session", "chunk", or a binding's field),
    `status` the HTTP status it is answered with."""

    def __init__(self, about: str, message: str, status: int = 400):
        super().__init__(message)
        self.about, self.message, self.status = about, message, status


@dataclass
class OpenSession:
    """One checkpoint's open session: what it is bound to, the next chunk it takes, the runtime's session."""

    session_id: str
    binding: dict  # what opened it (the prompt, the opening options, the first image): later chunks keep it
    next_chunk: int = 0
    session: object | None = None  # the runtime's, made by the opening chunk's run
    busy: bool = False
    last: tuple | None = None  # (request_id, *answer) of the last chunk: answered again to a retry
    used: float = field(default_factory=time.monotonic)

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
        self.session = None


@dataclass
class Claim:
    """A chunk claimed against its checkpoint's open session (marked busy until `finish`), or a retry's `replay`."""

    model: str
    open: OpenSession
    request_id: str
    chunk: int
    opens: bool  # this chunk (0) starts the session
    payload: object = None  # what the route read of the chunk (`claim`'s `read`)
    replay: tuple | None = None  # a retry of the last chunk: its answer, nothing runs


SESSIONS: dict[str, OpenSession] = {}  # checkpoint name -> its open session
_reaper: list = []  # the task closing idle sessions (`keep_reaping`)


def idle_seconds() -> float:
    try:
        return float(os.environ.get(IDLE_ENV, IDLE_S))
    except ValueError:
        return IDLE_S


def reap(now: float | None = None) -> list[str]:
    """Close the sessions idle past the timeout (their caches freed); the checkpoints they held."""
    now = time.monotonic() if now is None else now
    gone = [name for name, s in SESSIONS.items() if not s.busy and now - s.used > idle_seconds()]
    for name in gone:
        SESSIONS.pop(name).close()
    if gone:
        services.memory.empty_cache()
    return gone


def holding(session_id: str) -> str | None:
    """The checkpoint whose open session `session_id` is, if any."""
    return next((name for name, s in list(SESSIONS.items()) if s.session_id == session_id), None)


def claim(model: str, session_id: str, request_id: str, chunk: int, opens: bool, binding: dict,
          read: Callable[[dict], object], late: str | None = None, chunk_field: str = "chunk") -> Claim:
    """Chunk `chunk` of `session_id` on `model`, checked against the open session and claimed. `opens`: it starts
    the session (chunk 0, a reset), bound to `binding`; a later chunk's `binding` holds the fields it gave, which must
    equal the session's. `read(binding)`: the route's own reading of the chunk against the binding it runs under,
    after the registry's checks and before anything changes (its refusal leaves the sessions as they were). `late`: a
    field that only an opening chunk may carry, given by a later one. `chunk_field`: what the protocol calls the chunk's
    index, in the messages."""
    reap()
    current = SESSIONS.get(model)
    if current is not None and current.session_id != session_id:
        raise Refusal("session", f"{model!r} has session {current.session_id!r} open (one session per model): close "
                                 f"it (DELETE {CLOSE_ROUTE}) or let it idle out ({idle_seconds():.0f} s)", 409)
    if current is not None and current.busy:
        raise Refusal("session", f"session {current.session_id!r} is running a tick; send the next when it has "
                                 "answered", 409)
    if opens:
        if chunk != 0:
            raise Refusal("chunk", f"a reset starts the session again at {chunk_field} 0")
    else:
        if current is None:
            raise Refusal("session", f"no open session {session_id!r} on {model!r} (closed, failed or idled out): "
                                     f"start it again at {chunk_field} 0", 404)
        last = current.last
        if last is not None and request_id and request_id == last[0] and chunk == current.next_chunk - 1:
            current.used = time.monotonic()  # a client's retry of a chunk that ran
            return Claim(model, current, request_id, chunk, False, replay=last[1:])
        if late is not None:
            raise Refusal(late, f"the {late} opens the session ({chunk_field} 0): send reset with it to start again "
                                "from another one")
        if chunk != current.next_chunk:
            raise Refusal("chunk", f"out of order: session {current.session_id!r} takes chunk {current.next_chunk} "
                                   "next; send reset to start again", 409)
        changed = [k for k, v in binding.items() if v is not None and current.binding.get(k) != v]
        if changed:
            raise Refusal(changed[0], f"session {current.session_id!r} is bound to its {', '.join(changed)}: a "
                                      f"change needs reset ({chunk_field} 0 with the opening fields)", 409)
    payload = read(binding if opens else current.binding)
    if opens:
        if current is not None:
            drop(model, current)
        current = OpenSession(session_id, binding)
    SESSIONS[model], current.busy = current, True
    return Claim(model, current, request_id, chunk, opens, payload)


def drop(model: str, session: OpenSession) -> None:
    """Close `session` and take it off the registry if it is still `model`'s."""
    if SESSIONS.get(model) is session:
        SESSIONS.pop(model)
    session.close()


def finish(claim: Claim, answer: tuple | None, close: bool = False) -> None:
    """After a claimed chunk, its answer or None: the session moves on, keeping the answer for a retry (or, with
    `close`, goes), or a failed chunk closes it."""
    claim.open.busy, claim.open.used = False, time.monotonic()
    if answer is not None:
        claim.open.next_chunk, claim.open.last = claim.chunk + 1, (claim.request_id, *answer)
    if answer is None or close:
        drop(claim.model, claim.open)


async def close(request):
    """`DELETE /cosmos3/v1/sessions/{session_id}`: the open session closed (its cache freed), whoever opened it."""
    session_id = request.match_info["session_id"]
    for model, s in list(SESSIONS.items()):
        if s.session_id == session_id:
            if s.busy:
                return answer(request, FieldError("session_id", "is running a tick; close it when it answers",
                                                  409).body(), 409)
            drop(model, s)
            services.memory.empty_cache()
            return answer(request, {"closed": session_id, "model": model})
    return answer(request, FieldError("session_id", f"no open session {session_id!r}", 404).body(), 404)


def keep_reaping() -> None:
    """Close idle sessions every few seconds from now on while the server runs (once; on the event loop)."""
    if not _reaper:
        _reaper.append(asyncio.ensure_future(_reap_every_few_seconds()))


async def _reap_every_few_seconds() -> None:
    """Close idle sessions every few seconds while the server runs (a claim also reaps first)."""
    while True:
        await asyncio.sleep(max(1.0, min(30.0, idle_seconds() / 4)))
        try:
            reap()
        except Exception:  # noqa: BLE001 (one failed close must not end the reaping)
            log.exception("closing idle Cosmos3 sessions")
