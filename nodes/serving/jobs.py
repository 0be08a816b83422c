"""One queued job, the lifecycle every HTTP and websocket route shares.

A route's request becomes an API prompt of the pack's nodes, queued as POST /prompt queues one. What the request
carries (observations, a conversation) stays in this process's memory in a `Job`, under a key the prompt's nodes
carry; they read it (`Job.of`) and hand their results back to it. The route waits for the prompt, takes it off the
queue when its client goes away (before its turn; a running one sees `cancelled`), and maps what happened to an
HTTP status: ComfyUI's refusal at validation (`Refused`), a run that failed or gave no result (`RunError`).
"""

import asyncio
import inspect
import time
import uuid

from ...cosmos3_runtime import InputError
from ...cosmos3_runtime.guardrails import GuardrailBlocked
from .. import services

POLL_S = 0.05  # how often a waiting route looks at its prompt and its client
JOBS: dict[str, "Job"] = {}  # key -> the job of a request in flight


class Refused(Exception):
    """ComfyUI refused the prompt when it was queued; `refusal` holds its validation errors."""

    def __init__(self, refusal: dict):
        super().__init__(refusal_text(refusal))
        self.refusal = refusal


class RunError(Exception):
    """A queued request that did not produce its results; `status` is its HTTP status, `body` the JSON answer."""

    def __init__(self, status: int, message: str, prompt_id: str | None = None, kind: str = "generation_error"):
        super().__init__(message)
        self.status = status
        self.body = {"detail": message, "error": {"message": message, "type": kind, "param": None,
                                                  "prompt_id": prompt_id}}


class Job:
    """A request in flight: its `payload` for the prompt's nodes, the `results` they hand back (`expected` of them
    make a success), its queued prompt. Registered while the `with` block runs."""

    def __init__(self, payload: dict, expected: int):
        self.key = uuid.uuid4().hex
        self.payload, self.results, self.expected = payload, {}, expected
        self.cancelled = False  # the client went away: a node still running it stops
        self.prompt_id: str | None = None
        self.done: asyncio.Future | None = None  # the prompt's history record, once it has run

    def __enter__(self) -> "Job":
        JOBS[self.key] = self
        return self

    def __exit__(self, *exc) -> None:
        JOBS.pop(self.key, None)

    @staticmethod
    def of(key: str, what: str) -> "Job":
        """The job a node of the prompt serves (`what`: the route, for the message when its client has gone)."""
        job = JOBS.get(key)
        if job is None:
            raise InputError(f"the {what} request {key!r} is gone (its client disconnected)")
        return job

    async def start(self, graph: dict, texts: tuple[str, ...] | list[str] = ()) -> None:
        """Queue the prompt; `Refused` when ComfyUI's validation refuses it. With the server-wide guardrail on, the
        request's `texts` are checked first: a blocked one is `RunError` (400) and nothing is queued."""
        if texts and services.guardrails.on():
            await asyncio.get_running_loop().run_in_executor(None, _check, list(texts))
        prompt_id, refusal = await queue_prompt(graph)
        if prompt_id is None:
            raise Refused(refusal)
        self.prompt_id = prompt_id
        self.done = asyncio.ensure_future(finished(prompt_id))

    def cancel(self) -> None:
        """The client went away: off the queue if it has not started, and a running node sees `cancelled`."""
        self.cancelled = True
        if self.prompt_id is not None:
            unqueue(self.prompt_id)
        if self.done is not None:
            self.done.cancel()

    async def wait(self, gone=lambda: False) -> dict:
        """The results once the prompt has run; cancelled (and `ConnectionResetError`) when `gone()` turns true or
        the waiting task is cancelled."""
        try:
            while not self.done.done():
                if gone():
                    raise ConnectionResetError
                await asyncio.sleep(POLL_S)
        except (ConnectionResetError, asyncio.CancelledError):
            self.cancel()
            raise
        return self.outcome()

    def outcome(self) -> dict:
        """The results of a finished prompt, or `RunError` with the status its failure maps to."""
        record = self.done.result()
        if record["status"].get("status_str") == "success" and len(self.results) == self.expected:
            return self.results
        raise RunError(*failure(record), self.prompt_id, failure_kind(record))


def _check(texts: list[str]) -> None:
    """The server-wide guardrail's verdict on a request's texts (off the event loop: the classifier takes a while)."""
    try:
        services.guardrails.server_wide().check_prompts(texts, move=False)  # (ComfyUI's worker owns the GPU)
    except GuardrailBlocked as exc:
        raise RunError(400, str(exc), kind="guardrail_blocked") from None
    except InputError as exc:  # the guardrail cannot load (the package, its files): every request is refused
        raise RunError(503, f"the server's guardrail is on and cannot run: {exc}", kind="guardrail_unavailable") from None


async def queue_prompt(prompt: dict) -> tuple[str | None, dict]:
    """Queue an API prompt the way POST /prompt does: (its id, {}), or (None, ComfyUI's validation errors)."""
    import execution

    server, prompt_id = services.prompt_server(), str(uuid.uuid4())
    valid = execution.validate_prompt(prompt_id, prompt, None)
    valid = await valid if inspect.isawaitable(valid) else valid
    if not valid[0]:
        return None, {"error": valid[1], "node_errors": valid[3]}
    number, server.number = server.number, server.number + 1
    item = (number, prompt_id, prompt, {"create_time": int(time.time() * 1000)}, valid[2])
    server.prompt_queue.put(item + ({},) if hasattr(execution, "SENSITIVE_EXTRA_DATA_KEYS") else item)
    return prompt_id, {}


async def finished(prompt_id: str, poll: float = POLL_S) -> dict:
    """The history record of a queued prompt once it has run (success, error or interrupted)."""
    queue = services.prompt_server().prompt_queue
    while prompt_id not in (history := queue.get_history(prompt_id=prompt_id)):
        await asyncio.sleep(poll)
    return history[prompt_id]


def unqueue(prompt_id: str) -> None:
    """Take a prompt off the queue if it has not started."""
    services.prompt_server().prompt_queue.delete_queue_item(lambda item: item[1] == prompt_id)


def refusal_text(refusal: dict) -> str:
    """ComfyUI's validation errors in one line."""
    details = [f"{e.get('message')}: {e.get('details')}" for node in refusal.get("node_errors", {}).values()
               for e in node.get("errors", [])]
    error = refusal.get("error") or {}
    return "; ".join(details) or f"{error.get('message')}: {error.get('details')}"


def failure(record: dict) -> tuple[int, str]:
    """(HTTP status, message) of a prompt that did not succeed: 400 for what the request asked (the runtime's
    input and checkpoint errors), 503 when it was cancelled, else 500."""
    for event, data in record["status"].get("messages", []):
        if event == "execution_error":
            kind = str(data.get("exception_type", ""))
            status = 400 if kind.endswith(("InputError", "CheckpointError", "GuardrailBlocked")) else 500
            return status, f"{data.get('node_type')}: {data.get('exception_message', '').strip()}"
        if event == "execution_interrupted":
            return 503, "the run was cancelled on the server"
    return 500, "the run ended without its result"


def failure_kind(record: dict) -> str:
    """The error object's type for a prompt that did not succeed: a guardrail's verdict is one of its own."""
    blocked = any(event == "execution_error" and str(data.get("exception_type", "")).endswith("GuardrailBlocked")
                  for event, data in record["status"].get("messages", []))
    return "guardrail_blocked" if blocked else "generation_error"
