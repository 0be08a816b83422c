"""Several local GPUs from one process: a pool of worker processes that hold the model.

`WorkerPool` starts one process per device. The workers form a torch.distributed job on this machine
(NCCL on GPUs, gloo on CPU), each loads the checkpoint onto its device, and every `generate` call runs
on all of them with sequence and/or CFG parallelism (see `parallel`). The calling process holds no
weights; it sends requests, relays progress, and receives rank 0's result. This is how the ComfyUI
sampler uses several GPUs: the pool has the public surface of `Cosmos3Pipeline` (`generate`, `decode`,
`encode`, `variant`, `checkpoint`).

Cancelling works like a single-process run (raise from the step callback or from `interrupt`), except that
the workers stop at the next step boundary, not between layers: they agree at every step whether to stop,
so no rank is left waiting in a collective (`cancel`), and the pool stays usable. If a
worker fails on its own (out of memory on one GPU, say), the pool is shut down and the error raised;
the next pool starts fresh.
"""

import atexit
import importlib
import os
import queue
import shutil
import socket
import sys
import tempfile
import time
import types
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from .checkpoint import Checkpoint, resolve
from .errors import Cosmos3Error, InputError
from .request import Request

START_TIMEOUT_S = 600  # loading tens of GB takes a while
REPLY_TIMEOUT_S = 30  # after one rank failed, how long the others get to report
POLL_S = 2  # how often a waiting parent checks that its workers are alive


class Cancelled(Exception):
    """All workers stopped a generation at the same step."""


class WorkerError(Cosmos3Error, RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, device, source, load_options, layout, requests, replies, cancel):
    """One worker process: join the job, load the model, serve requests until told to stop."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      LOCAL_RANK=str(torch.device(device).index or 0))
    import torch.distributed as dist

    from .parallel import init_from_env
    from .pipeline import load

    try:
        parallel, device = init_from_env(*layout)
        pipe = load(source, device=device, **load_options)
    except BaseException as exc:  # report and end: the parent turns it into an error
        replies.put(("error", rank, f"{type(exc).__name__}: {exc}"))
        return
    replies.put(("ready", rank, None))
    while True:
        kind, payload = requests.get()
        if kind == "stop":
            break
        try:
            if kind == "generate":

                def agree_and_report(step, total, latents):
                    stop = torch.tensor([float(cancel.is_set())], device=device)
                    dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # every rank takes the same decision
                    if stop.item():
                        raise Cancelled
                    if rank == 0:
                        replies.put(("progress", rank, (step, total, latents[:, :, -1:].cpu())))

                prompt, options = payload
                result = pipe.generate(prompt, callback=agree_and_report, parallel=parallel, **options)
            else:  # VAE work on rank 0: decode / encode report progress and honour the same cancel flag
                args, options = payload

                def report(done, total):
                    if cancel.is_set():
                        raise Cancelled
                    replies.put(("progress", rank, (done, total)))

                if kind in ("decode", "encode"):
                    options = {**options, "progress": report}
                result = getattr(pipe, kind)(*args, **options)
            replies.put(("done", rank, result if rank == 0 else None))
        except Cancelled:
            replies.put(("cancelled", rank, None))
        except BaseException as exc:
            replies.put(("error", rank, f"{type(exc).__name__}: {exc}"))
    dist.destroy_process_group()


_runtime_home: str | None = None


def _runtime_only_folder() -> str:
    """A folder that holds nothing but `cosmos3_runtime` (a link to this package), for the workers' sys.path.

    Inside ComfyUI this module lives in the pack's package (named after its folder), which a spawned
    process cannot import; the runtime never imports ComfyUI, so the workers import it as a top-level
    package instead. The pack's own folder must not go on sys.path for that: its `nodes/` package would
    shadow the host's `nodes` module (ComfyUI's nodes.py).
    """
    global _runtime_home
    if _runtime_home is None:
        home = tempfile.mkdtemp(prefix="cosmos3-workers-")
        package = Path(__file__).resolve().parent
        try:
            (Path(home) / "cosmos3_runtime").symlink_to(package, target_is_directory=True)
        except OSError:  # no symlinks here (Windows without the privilege): a copy of the sources
            shutil.copytree(package, Path(home) / "cosmos3_runtime", ignore=shutil.ignore_patterns("__pycache__"))
        atexit.register(shutil.rmtree, home, ignore_errors=True)
        _runtime_home = home
    return _runtime_home


@contextmanager
def _spawning(log_path: str):
    """The worker entry point, with what `spawn` hands a child set up so that the host is never re-run.

    `spawn` starts each child by re-running the parent's main script (ComfyUI's main.py) unless the
    parent's `__main__` has no file; for the starts, `__main__` is a bare module. The children's
    stderr goes to `log_path` (a child that dies before it can report leaves its traceback there).
    """
    folder = _runtime_only_folder()
    sys.path.insert(0, folder)
    host_main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    saved_stderr = os.dup(2)
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield importlib.import_module("cosmos3_runtime.workers")._worker
    finally:
        os.dup2(saved_stderr, 2)
        os.close(saved_stderr)
        sys.modules["__main__"] = host_main
        sys.path.remove(folder)


def _tail(path: str, chars: int = 4000) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return text[-chars:].strip()


class WorkerPool:
    """A checkpoint loaded in worker processes, one per GPU (a `runner.Runner` whose weights live elsewhere)."""

    local = False

    def __init__(self, source: str, devices: list[str], sp: int = 1, cfg_parallel: bool = False, **load_options):
        """Start len(devices) workers on `devices` and load `source` on each (world = sp x (2 if cfg_parallel))."""
        if len(devices) != sp * (2 if cfg_parallel else 1):
            raise WorkerError(f"{len(devices)} devices cannot run sp={sp} with cfg_parallel={cfg_parallel}")
        self.checkpoint = Checkpoint(resolve(source, local_files_only=load_options.get("local_files_only")))
        self.devices = devices
        self.dtype = load_options.get("dtype")
        self.planner = None  # made on the first plan
        self.device = torch.device("cpu")  # where results arrive
        context = torch.multiprocessing.get_context("spawn")
        self.requests = [context.Queue() for _ in devices]
        self.replies = context.Queue()
        self.cancel = context.Event()
        port = _free_port()
        layout = (sp, cfg_parallel)
        handle, self.log_path = tempfile.mkstemp(prefix="cosmos3-workers-", suffix=".log")
        os.close(handle)
        with _spawning(self.log_path) as worker:
            self.processes = [
                context.Process(target=worker, args=(rank, len(devices), port, device, str(self.checkpoint.root),
                                                     load_options, layout, self.requests[rank], self.replies,
                                                     self.cancel), daemon=True)
                for rank, device in enumerate(devices)
            ]
            for process in self.processes:
                process.start()
        self._finalizer = weakref.finalize(self, _stop, self.requests, self.processes, self.log_path)
        self._collect(range(len(devices)), timeout=START_TIMEOUT_S)

    @property
    def variant(self):
        return self.checkpoint.variant

    def __repr__(self) -> str:
        return f"WorkerPool({str(self.checkpoint.root)!r}, {self.variant.describe()}, devices={self.devices})"

    def _collect(self, ranks, timeout: float | None, on_progress=None, interrupt=None) -> Any:
        """Wait until every rank in `ranks` reported; return rank 0's result, raise on failure. `interrupt()` is
        asked at every reply and every poll; an exception from it or from `on_progress` stops the workers.

        A failure that every rank reports alike (a bad request) leaves the pool usable; anything else
        (one rank failing or dying, or no answer in time) shuts it down.
        """
        waiting, result, failures, cancelled, failed_at = set(ranks), None, {}, None, 0.0
        deadline = None if timeout is None else time.monotonic() + timeout

        def stopping_on_raise(call, *args) -> None:
            nonlocal cancelled
            try:
                call(*args)
            except BaseException as exc:  # stop every worker; re-raised once all have stopped
                self.cancel.set()
                cancelled = exc

        while waiting:
            if interrupt is not None and cancelled is None:
                stopping_on_raise(interrupt)
            try:
                kind, rank, payload = self.replies.get(timeout=POLL_S)
            except queue.Empty:
                dead = [r for r in waiting if not self.processes[r].is_alive()]
                late = deadline is not None and time.monotonic() > deadline
                if dead or late or (failures and time.monotonic() > failed_at + REPLY_TIMEOUT_S):
                    output = _tail(self.log_path)
                    self.close()
                    reason = f"workers {dead} died" if dead else f"workers {sorted(waiting)} stopped answering"
                    raise WorkerError(f"{reason} ({'; '.join(failures.values()) or 'no error reported'}); "
                                      "the worker pool was shut down"
                                      + (f". Their output ended with:\n{output}" if output else "")) from None
                continue
            if kind == "progress":
                if on_progress is not None and cancelled is None:
                    stopping_on_raise(on_progress, *payload)
                continue
            waiting.discard(rank)
            if kind == "error":
                failures[rank], failed_at = payload, time.monotonic()
            elif rank == 0:
                result = payload
        if failures:
            if len(failures) < len(set(ranks)) or len(set(failures.values())) > 1:
                self.close()
            raise WorkerError("; ".join(f"rank {r}: {m}" for r, m in sorted(failures.items())))
        if cancelled is not None:
            raise cancelled
        return result

    def plan(self, prompt, request: Request | None = None, **options):
        """The request planned here from the checkpoint's configs and tokenizer (a bad one fails in the caller, not in
        the workers); its estimate is for one device in the pool's dtype."""
        from .pipeline import planner

        if self.planner is None:
            self.planner = planner(self.checkpoint.root, "cpu", self.dtype)
        return self.planner.plan(prompt, request, **options)

    def generate(self, prompt, request: Request | None = None, *, callback=None, progress=None, interrupt=None,
                 **options):
        """Same arguments and result as `Cosmos3Pipeline.generate` (latents only, decode them with `decode`; a
        transfer's frames, which it decodes chunk by chunk). `callback` hears every step of every chunk; the stages
        around them (`progress`: prompts, chunks begun, decode) stay inside the workers. `interrupt` is asked here
        while they run; once it raises, the workers stop at their next step boundary."""
        from .pipeline import Plan

        options.pop("parallel", None)
        plan = prompt if isinstance(prompt, Plan) else self.plan(prompt, request, **options)
        prompt, request = plan.prompt, plan.request
        if request.control_videos is None:
            request = Request.build(request, output="latents")
        self.cancel.clear()
        for requests in self.requests:
            requests.put(("generate", (prompt, request.plain())))
        return self._collect(range(len(self.devices)), timeout=None, on_progress=callback, interrupt=interrupt)

    def session(self, prompt, request: Request | None = None, guardrails=None, control=None, **options):
        """Refused by name: a session keeps its history between ticks in one process; the workers run whole
        generations."""
        raise InputError("sessions run in one process: load the model on one GPU (gpus 1) to open a session")

    def decode(self, latents: torch.Tensor, tile=None, progress=None, raw: bool = False) -> torch.Tensor:
        return self._on_first(("decode", ((latents.cpu(), tile), {"raw": raw})), progress)

    def encode(self, frames: torch.Tensor, progress=None, raw: bool = False) -> torch.Tensor:
        return self._on_first(("encode", ((frames.cpu(),), {"raw": raw})), progress)

    def raw_latents(self, latents: torch.Tensor) -> torch.Tensor:
        return self._on_first(("raw_latents", ((latents.cpu(),), {})), None)

    def _on_first(self, request, progress):
        """Run a VAE request on rank 0 (`progress(done, total)` relayed; raising from it cancels)."""
        self.cancel.clear()
        self.requests[0].put(request)
        return self._collect([0], timeout=None, on_progress=progress)

    def to(self, device) -> "WorkerPool":
        return self  # the workers own their devices

    def close(self) -> None:
        self._finalizer()  # also runs when the pool is garbage-collected unclosed (ComfyUI dropped it)


def _stop(requests, processes, log_path: str) -> None:
    """Stop a pool's workers and reap them."""
    for inbox, process in zip(requests, processes):
        if process.is_alive():
            inbox.put(("stop", None))
    for process in processes:
        process.join(timeout=10)
        if process.is_alive():  # stuck (in a collective with a dead peer, say): end it and reap it
            process.terminate()
            process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join()
    Path(log_path).unlink(missing_ok=True)
