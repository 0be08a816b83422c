"""Isaac Lab's Cosmos camera protocol: the pack as the resident Sim-Transfer service that Isaac Lab's camera client
(isaac-sim/IsaacLab, source/isaaclab_experimental/isaaclab_experimental/cosmos/) connects to.

The wire (their `_protocol.py`, version 2): a 16-byte network-order header `!4sIQ` (magic b"ILCS", the metadata's
bytes, the arrays' bytes), the metadata as UTF-8 JSON (`version` 2, `arrays`: one {shape, dtype "uint8", nbytes}
each), then the arrays: contiguous uint8 THWC images of 3 channels. At most 64 KiB of metadata, 256 MiB of arrays
and 16 arrays; every descriptor is checked before a buffer is allocated, and nothing but JSON and raw bytes is read.
Replies carry `ok`, and `error` (a message) when it is false.

The operations (their `server/service.py`), each a message on a connection that lives as long as the client wants:
`status` (ready, capabilities, whether a session is active), `open` (one camera session: prompt, seed, canvas,
control modality, the episode's frame budget), `step` (a control chunk: the episode's first frame, then 4 frames an
update; a reset starts the next episode with its seed and, optionally, its prompt) answered by the generated frames,
`close`, and `shutdown`. One session at a time per service; any refusal is an error reply, after which the service
ends that connection (and its session), as theirs does. A connection that drops mid-message ends quietly.

What an episode is: a `session.TransferSession` of the episode's frame budget (`max_episode_frames`: the duration the
prompt states), at the checkpoint's own history window and sinks and the causal default of 30 fps; its frames are
those of the pack's batch rollout (`generate` with the same control frames, prompt and seed) of that many frames.
Blur controls arrive as the camera's RGB and are blurred here with the authors' filter (the medium preset), as
their service does; edge, depth and seg arrive ready. Updates of 4 frames are one latent frame: the service needs a
framewise checkpoint (`check_framewise`).
"""

import ipaddress
import json
import logging
import math
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress

import numpy as np
import torch

from . import controls
from .causal import CANVASES
from .errors import InputError
from .geometry import TEMPORAL_FACTOR
from .media import to_uint8
from .session import session_request

log = logging.getLogger(__name__)

VERSION = 2
MAGIC = b"ILCS"
HEADER = struct.Struct("!4sIQ")  # magic, metadata bytes, array bytes
MAX_METADATA_BYTES = 64 * 1024
MAX_ARRAY_BYTES = 256 * 1024 * 1024
MAX_ARRAYS = 16
MAX_UNIX_PATH_BYTES = 107
UPDATE_FRAMES = 4  # control frames an update brings after the episode's first (one latent frame)
DEFAULT_MAX_EPISODE_FRAMES = 201  # their service's default cap: the model's trained horizon
DEFAULT_ENDPOINT = (f"unix:///tmp/isaaclab-cosmos-{os.getuid()}.sock" if hasattr(socket, "AF_UNIX")  # (theirs)
                    else "tcp://127.0.0.1:5555")
WARMUP_CANVAS = (832, 480)  # (width, height): their camera's landscape canvas, which their warm-up runs
BLUR_PRESET = "medium"  # the authors' blur their service applies to the camera's RGB
OPEN = {"op", "version", "num_views", "seeds", "prompt", "modality", "height", "width", "max_episode_frames"}
STEP = {"op", "version", "reset_rows", "seeds"}
BARE = {"op", "version"}  # status, close, shutdown
SEED_LIMIT = 2**31
MAX_ERROR_CHARS = 4000  # of an error reply's message (within the metadata's limit whatever an exception says)


class ProtocolError(InputError):
    """A message that is not Isaac Lab's protocol: malformed, oversized, of another version."""


def parse_endpoint(endpoint: str) -> tuple[int, object]:
    """(socket family, address) of `unix:///absolute/path` or `tcp://host:port`; anything else refused by name."""
    forms = "unix:///absolute/path or tcp://host:port"
    if isinstance(endpoint, str) and endpoint.startswith("unix://"):
        path = endpoint[len("unix://"):]
        if not hasattr(socket, "AF_UNIX"):
            raise InputError(f"{endpoint}: Unix sockets need Linux or macOS; use tcp://127.0.0.1:PORT here")
        if not path.startswith("/") or "\0" in path or len(path.encode()) > MAX_UNIX_PATH_BYTES:
            raise InputError(f"endpoint {endpoint!r} must be {forms}, a socket path of at most {MAX_UNIX_PATH_BYTES} "
                             "bytes")
        return socket.AF_UNIX, path
    scheme, _, rest = str(endpoint).partition("://")
    host, _, port = rest.rpartition(":")
    host = host.strip("[]")  # [::1]:5555
    if scheme != "tcp" or not host or not port.isdigit() or not 0 <= int(port) < 65536 or "/" in rest or "@" in rest:
        raise InputError(f"endpoint {endpoint!r} must be {forms}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return family, (host, int(port))


@contextmanager
def listening(endpoint: str, allow_remote: bool = False) -> Iterator[socket.socket]:
    """A socket listening at `endpoint`: a Unix socket only this user can open (a stopped service's socket file is
    replaced; a live service's, or another file, is refused), or TCP on a loopback address unless `allow_remote`
    (the protocol has no authentication). Closed on exit, a Unix socket's file removed."""
    family, address = parse_endpoint(endpoint)
    listener, unix = socket.socket(family, socket.SOCK_STREAM), family == getattr(socket, "AF_UNIX", None)
    bound = False  # (a refused bind leaves the file it found, a live service's perhaps)
    try:
        if unix:
            _bind_private(listener, address)
        else:
            host = address[0]
            try:
                loopback = ipaddress.ip_address(socket.getaddrinfo(host, None, family)[0][4][0]).is_loopback
            except (OSError, ValueError) as exc:
                raise InputError(f"endpoint {endpoint}: cannot resolve host {host!r} ({exc})") from None
            if not loopback and not allow_remote:
                raise InputError(f"endpoint {endpoint} listens beyond this machine, and the protocol has no "
                                 "authentication: use tcp://127.0.0.1:PORT or a Unix socket, or allow it explicitly "
                                 "(--allow-remote) behind a trusted network or tunnel")
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                listener.bind(address)
            except OSError as exc:
                raise InputError(f"cannot listen at {endpoint}: {exc.strerror or exc}; choose another port") from None
        bound = True
        listener.listen(16)
        listener.settimeout(0.25)  # the accept loop notices a shutdown this often
        yield listener
    finally:
        listener.close()
        if unix and bound:
            with suppress(OSError):
                os.unlink(address)


def _bind_private(listener: socket.socket, path: str) -> None:
    with suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise InputError(f"{path} exists and is not a socket; choose another endpoint")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(1.0)
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)  # a stopped service's
            else:
                raise InputError(f"a service is already running at unix://{path}; stop it or choose another endpoint")
    previous = os.umask(0o177)  # owner-only from the moment the file exists
    try:
        listener.bind(path)
    except OSError as exc:
        raise InputError(f"cannot listen at unix://{path}: {exc.strerror or exc}") from None
    finally:
        os.umask(previous)


def endpoint_of(listener: socket.socket) -> str:
    """The endpoint a listening socket serves (a TCP port 0 resolved to the port it got)."""
    if listener.family == getattr(socket, "AF_UNIX", None):
        return f"unix://{listener.getsockname()}"
    host, port = listener.getsockname()[:2]
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


# --- messages --------------------------------------------------------------------------------------------------


def send(sock: socket.socket, metadata: dict, arrays: Sequence[np.ndarray] = ()) -> None:
    """One message: `metadata` (JSON-serializable, finite) and uint8 THWC arrays of 3 channels."""
    if len(arrays) > MAX_ARRAYS:
        raise ProtocolError(f"{len(arrays)} arrays in one message; the protocol carries at most {MAX_ARRAYS}")
    descriptors, body = [], 0
    for array in arrays:
        if array.dtype != np.uint8 or array.ndim != 4 or array.shape[-1] != 3 or 0 in array.shape:
            raise ProtocolError(f"arrays are non-empty uint8 THWC images of 3 channels, got {array.dtype} "
                                f"{list(array.shape)}")
        body += array.nbytes
        descriptors.append({"shape": list(array.shape), "dtype": "uint8", "nbytes": array.nbytes})
    if body > MAX_ARRAY_BYTES:
        raise ProtocolError(f"{body} bytes of arrays; the protocol carries at most {MAX_ARRAY_BYTES} a message")
    encoded = json.dumps({**metadata, "version": VERSION, "arrays": descriptors}, separators=(",", ":"),
                         allow_nan=False).encode()
    if len(encoded) > MAX_METADATA_BYTES:
        raise ProtocolError(f"{len(encoded)} bytes of metadata; the protocol carries at most {MAX_METADATA_BYTES}")
    sock.sendall(HEADER.pack(MAGIC, len(encoded), body) + encoded)  # one write: a small message leaves whole
    for array in arrays:
        sock.sendall(memoryview(np.ascontiguousarray(array)).cast("B"))


def receive(sock: socket.socket) -> tuple[dict, list[np.ndarray]]:
    """One message, every limit and descriptor checked before its arrays are allocated; a connection that closes
    part way raises ConnectionError."""
    magic, metadata_bytes, body = HEADER.unpack(_exactly(sock, HEADER.size))
    if magic != MAGIC:
        raise ProtocolError(f"not an Isaac Lab Cosmos message: the header starts with {magic!r}, not {MAGIC!r}")
    if not 0 < metadata_bytes <= MAX_METADATA_BYTES or body > MAX_ARRAY_BYTES:
        raise ProtocolError(f"a message of {metadata_bytes} bytes of metadata and {body} of arrays is over the "
                            f"protocol's limits (1 to {MAX_METADATA_BYTES}, at most {MAX_ARRAY_BYTES})")
    try:
        metadata = json.loads(_exactly(sock, metadata_bytes).decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"the metadata is not UTF-8 JSON with finite numbers ({exc})") from None
    if not isinstance(metadata, dict) or type(metadata.get("version")) is not int:
        raise ProtocolError("the metadata must be a JSON object with an integer protocol version")
    if metadata["version"] != VERSION:
        raise ProtocolError(f"protocol version {metadata['version']}: this service speaks version {VERSION}; use an "
                            "Isaac Lab whose Cosmos client speaks it")
    descriptors = metadata.pop("arrays", None)
    if not isinstance(descriptors, list) or len(descriptors) > MAX_ARRAYS:
        raise ProtocolError(f"the metadata's arrays must be a list of at most {MAX_ARRAYS} descriptors")
    shapes = [_shape(d) for d in descriptors]
    if sum(math.prod(shape) for shape in shapes) != body:
        raise ProtocolError(f"the array descriptors add up to {sum(map(math.prod, shapes))} bytes; the header says "
                            f"{body}")
    return metadata, [np.frombuffer(_exactly(sock, math.prod(s)), np.uint8).reshape(s) for s in shapes]


def _shape(descriptor) -> tuple[int, ...]:
    if not isinstance(descriptor, dict) or set(descriptor) != {"shape", "dtype", "nbytes"}:
        raise ProtocolError("an array descriptor is {shape, dtype, nbytes}")
    shape, size = descriptor["shape"], descriptor["nbytes"]
    if (descriptor["dtype"] != "uint8" or not isinstance(shape, list) or len(shape) != 4 or shape[-1] != 3
            or any(type(n) is not int or n <= 0 for n in shape) or type(size) is not int or size != math.prod(shape)
            or size > MAX_ARRAY_BYTES):
        raise ProtocolError(f"arrays are non-empty uint8 THWC images of 3 channels within {MAX_ARRAY_BYTES} bytes, "
                            f"described by their shape and byte count; got {descriptor}")
    return tuple(shape)


def _exactly(sock: socket.socket, size: int) -> bytearray:
    buffer, done = bytearray(size), 0
    view = memoryview(buffer)
    while done < size:
        count = sock.recv_into(view[done:])
        if count == 0:
            raise ConnectionError("the connection closed part way through a message")
        done += count
    return buffer


def _drain(sock: socket.socket, seconds: float = 1.0) -> None:
    """Read (and drop) what a refused client still sends, for a moment: closing with unread input would reset the
    connection, and a reset can discard the error reply before the client reads it."""
    deadline = time.monotonic() + seconds
    sock.settimeout(seconds)
    while time.monotonic() < deadline and sock.recv(65536):
        pass


def _no_constant(value: str):
    raise ValueError(f"{value} is not a finite number")


def _fields(metadata: dict, expected: set[str], arrays: list, takes_arrays: bool = False) -> None:
    missing, unknown = expected - set(metadata), set(metadata) - expected
    if missing or unknown:
        raise ProtocolError(f"{metadata.get('op')!r} takes the fields {', '.join(sorted(expected))}"
                            + (f"; missing {', '.join(sorted(missing))}" if missing else "")
                            + (f"; not {', '.join(sorted(unknown))}" if unknown else ""))
    if arrays and not takes_arrays:
        raise ProtocolError(f"{metadata['op']!r} takes no image arrays")


def _seeds(values, count: int, what: str) -> list[int]:
    if (not isinstance(values, list) or len(values) != count
            or any(type(seed) is not int or not 0 <= seed < SEED_LIMIT for seed in values)):
        raise ProtocolError(f"{what} takes {count} integer seed(s) in [0, 2**31), got {values!r:.80}")
    return values


# --- the service -------------------------------------------------------------------------------------------------


def check_framewise(variant, source) -> None:
    """Refuse, by name, a checkpoint that cannot take the camera's updates of 4 frames (one latent frame a chunk)."""
    c = variant.causal
    if c is None or c.takes_actions:
        raise InputError(f"{source}: Isaac Lab's camera service runs a causal Sim-Transfer checkpoint (control frames "
                         "in, frames out); this one is " + ("not causal" if c is None else "Sim-Bimanual (actions)"))
    if c.chunk_size != 1:
        raise InputError(f"{source}: a chunkwise Sim-Transfer checkpoint ({c.chunk_size} latent frames, "
                         f"{TEMPORAL_FACTOR * c.chunk_size} frames, a chunk): Isaac Lab's camera sends updates of "
                         f"{UPDATE_FRAMES} frames, one latent frame, so its service needs a framewise one (chunk_size "
                         "1), as Isaac Lab's own service does")


def probe(planner, options: dict):
    """The plan of a short episode on the warm-up canvas: what the service's sessions refuse whatever the camera
    asks (a checkpoint that is not framewise Sim-Transfer, request options causal rollouts do not take) is refused
    here, before any weight is read when `planner` is `pipeline.planner(...)`."""
    check_framewise(planner.variant, planner.checkpoint.root)
    width, height = WARMUP_CANVAS
    hint = planner.variant.causal.hints[0]
    return planner.plan("", session_request(planner.variant, None, hint, num_frames=1 + UPDATE_FRAMES, width=width,
                                            height=height, **options))


class Service:
    """One resident pipeline serving Isaac Lab's cameras, one session at a time (`serve`). `options`: the request
    options every session is planned with (causal_history, compile, ...)."""

    def __init__(self, pipe, max_episode_frames: int | None = DEFAULT_MAX_EPISODE_FRAMES, **options):
        if max_episode_frames is not None and (max_episode_frames < 1 + UPDATE_FRAMES
                                               or (max_episode_frames - 1) % UPDATE_FRAMES):
            raise InputError(f"max_episode_frames {max_episode_frames}: an episode cap is 1 + {UPDATE_FRAMES}k frames "
                             f"(k >= 1), or none")
        self.fps = probe(pipe.planner, options).settings.fps
        self.pipe, self.cap, self.options = pipe, max_episode_frames, options
        self.stopping = threading.Event()
        self.lock = threading.Lock()  # guards `owner` and `connections`
        self.owner = None  # the connection whose session holds the model
        self.connections: set[socket.socket] = set()

    @property
    def capabilities(self) -> dict:
        c = self.pipe.variant.causal
        return {"num_views": 1, "max_concurrent_streams": 1, "modalities": list(c.hints), "initial_frames": 1,
                "update_frames": UPDATE_FRAMES, "canvases": [[h, w] for w, h in CANVASES],
                "max_episode_frames": self.cap, "fps": int(self.fps) if self.fps.is_integer() else self.fps,
                "partial_resets": False, "kv_window": c.window_frames, "attention_sink": c.sink_frames,
                "transports": ["socket"], "pci_bus_id": None, "device": str(self.pipe.device)}

    def warm_up(self, width: int = WARMUP_CANVAS[0], height: int = WARMUP_CANVAS[1]) -> None:
        """A disposable episode of blank controls through the history window's filling and one update past it
        (within the cap; two updates where the checkpoint keeps all history), before any camera connects."""
        c = self.pipe.variant.causal
        frames = 1 + UPDATE_FRAMES * ((c.window_frames or 1) + 1)
        frames = frames if self.cap is None else min(frames, self.cap)
        with self.pipe.session("", control=c.hints[0], num_frames=frames, width=width, height=height,
                               **self.options) as s:
            s.tick(torch.zeros(1, height, width, 3, dtype=torch.uint8))
            for _ in range((frames - 1) // UPDATE_FRAMES):
                s.tick(torch.zeros(UPDATE_FRAMES, height, width, 3, dtype=torch.uint8))

    def serve(self, listener: socket.socket) -> None:
        """Accept cameras at `listener` (`listening`) until a shutdown or an interrupt; then every connection is
        ended and its session closed."""
        threads = []
        try:
            while not self.stopping.is_set():
                try:
                    connection, _ = listener.accept()
                except TimeoutError:
                    continue
                connection.settimeout(600.0)  # a client silent this long mid-message is dropped
                if connection.family != getattr(socket, "AF_UNIX", None):
                    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small replies leave at once
                with self.lock:
                    self.connections.add(connection)
                threads = [t for t in threads if t.is_alive()]
                threads.append(threading.Thread(target=self.handle, args=(connection,), daemon=True,
                                                name="isaaclab-camera"))
                threads[-1].start()
        finally:
            self.stopping.set()
            with self.lock:
                ending = list(self.connections)
            for connection in ending:
                with suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
            for thread in threads:
                thread.join()

    def handle(self, connection: socket.socket) -> None:
        """One connection's messages in order. A refusal is an error reply and the connection's end (its session
        closed, the model kept); a connection that drops, even mid-message, ends quietly."""
        camera = Camera(self)
        try:
            while not self.stopping.is_set():
                metadata, arrays = receive(connection)
                op = metadata.get("op")
                if op not in ("status", "open", "step", "close", "shutdown"):
                    raise ProtocolError(f"unknown operation {op!r}: status, open, step, close or shutdown")
                if op == "step":
                    _fields(metadata, STEP | ({"prompt"} if "prompt" in metadata else set()), arrays, True)
                    send(connection, {"ok": True}, [camera.step(metadata, arrays)])
                    continue
                _fields(metadata, OPEN | ({"transport", "ipc"} if "transport" in metadata else set())
                        if op == "open" else BARE, arrays)
                if op == "status":
                    send(connection, {"ok": True, "ready": not self.stopping.is_set(),
                                      "capabilities": self.capabilities, "session_active": self.owner is not None})
                elif op == "open":
                    camera.open(metadata)
                    send(connection, {"ok": True})
                elif op == "close":
                    camera.close()
                    send(connection, {"ok": True})
                else:
                    send(connection, {"ok": True})
                    self.stopping.set()
                    return
        except (ConnectionError, TimeoutError, OSError):
            pass
        except Exception as exc:  # noqa: BLE001 (a refusal, or a failed generation: the service goes on)
            if not isinstance(exc, InputError):
                log.exception("an Isaac Lab camera session failed")
            camera.close()  # the model is free by the time the client reads why
            with suppress(OSError):
                send(connection, {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]})
                connection.shutdown(socket.SHUT_WR)  # the reply, then the end of the connection
                _drain(connection)
        finally:
            camera.close()
            with self.lock:
                self.connections.discard(connection)
            connection.close()


class Camera:
    """One connection's side of the service: its session, if it holds one, and whether it blurs the camera's RGB."""

    def __init__(self, service: Service):
        self.service, self.session, self.blur = service, None, False

    def open(self, metadata: dict) -> None:
        service = self.service
        if self.session is not None:
            raise ProtocolError("this connection already has a session open: close it first")
        if metadata.get("transport", "socket") != "socket":
            raise ProtocolError(f"transport {metadata['transport']!r}: this service moves images through the socket "
                                "only; set the camera's transport to 'socket' (or 'auto')")
        views = metadata["num_views"]
        if type(views) is not int or views != 1:
            raise ProtocolError(f"num_views {views!r}: this service generates one camera view a session")
        (seed,) = _seeds(metadata["seeds"], 1, "open")
        prompt = metadata["prompt"]
        prompt = prompt[0] if isinstance(prompt, list) and len(prompt) == 1 else prompt  # (one per view)
        if prompt is not None and not isinstance(prompt, str):
            raise ProtocolError("the prompt is text or null (one for the view)")
        modality, hints = metadata["modality"], service.pipe.variant.causal.hints
        if modality not in hints:
            raise ProtocolError(f"modality {modality!r}: this checkpoint takes {', '.join(hints)}")
        for name in ("height", "width", "max_episode_frames"):
            if type(metadata[name]) is not int or metadata[name] <= 0:
                raise ProtocolError(f"{name} must be a positive integer, got {metadata[name]!r:.40}")
        budget = metadata["max_episode_frames"]
        if budget < 1 + UPDATE_FRAMES or (budget - 1) % UPDATE_FRAMES:
            raise InputError(f"max_episode_frames {budget}: an episode is its first frame and updates of "
                             f"{UPDATE_FRAMES}, 1 + {UPDATE_FRAMES}k frames (k >= 1)")
        if service.cap is not None and budget > service.cap:
            raise InputError(f"max_episode_frames {budget} is over this service's cap of {service.cap} frames: start "
                             "it with a larger --max-episode-frames (0: none), or capture less often")
        if modality == "blur":
            controls.opencv()  # the service blurs the camera's RGB: refused now, not at the first frame
        with service.lock:
            if service.stopping.is_set():
                raise InputError("the service is shutting down: start it again to open a session")
            if service.owner is not None:
                raise InputError("the service already has an active session (one at a time); close it first")
            service.owner = self
        try:
            self.session = service.pipe.session(prompt or "", control=modality, num_frames=budget,
                                                width=metadata["width"], height=metadata["height"], seed=seed,
                                                **service.options)
        except BaseException:
            self.close()
            raise
        self.blur = modality == "blur"

    def step(self, metadata: dict, arrays: list[np.ndarray]) -> np.ndarray:
        s = self.session
        if s is None:
            raise ProtocolError("open a session before sending controls")
        resets = metadata["reset_rows"]
        if resets not in ([], [0]):
            raise ProtocolError(f"reset_rows {resets!r:.40}: [] or [0] (this session has one view)")
        seeds = _seeds(metadata["seeds"], len(resets), "a step's reset")
        if "prompt" in metadata and not resets:
            raise ProtocolError("a prompt changes only with an episode reset")
        if "prompt" in metadata and metadata["prompt"] is not None and not isinstance(metadata["prompt"], str):
            raise ProtocolError("the prompt is text or null")
        settings = s.settings
        if len(arrays) != 1 or arrays[0].shape[1:] != (settings.height, settings.width, 3):
            raise ProtocolError(f"a step carries one control chunk [T, {settings.height}, {settings.width}, 3] (the "
                                f"session's canvas), got {[list(a.shape) for a in arrays]}")
        expected = s.takes(reset=bool(resets))  # checked before a reset or a blur does any work
        if len(arrays[0]) != expected:
            raise ProtocolError(f"this step carries {expected} control frame{'s' * (expected > 1)} (an episode's "
                                f"first 1, each update {UPDATE_FRAMES}), got {len(arrays[0])}")
        if resets:
            s.reset((metadata["prompt"] or "") if "prompt" in metadata else None, seeds[0])
        chunk = controls.blur(arrays[0], BLUR_PRESET) if self.blur else arrays[0]
        return to_uint8(s.tick(torch.from_numpy(chunk)))

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None
        with self.service.lock:
            if self.service.owner is self:
                self.service.owner = None


# --- a client, the camera's side ---------------------------------------------------------------------------------


class Client:
    """The camera's side of the protocol, for the pack's own checks and `isaaclab-camera`: one connection, each call
    one message and its reply (a failed reply raises InputError with the service's message)."""

    def __init__(self, endpoint: str = DEFAULT_ENDPOINT, timeout: float = 600.0, wait: float = 0.0):
        """Connect to the service at `endpoint`, trying again for `wait` seconds (one starting in the background)."""
        family, address = parse_endpoint(endpoint)
        deadline = time.monotonic() + wait
        while True:
            self.sock = socket.socket(family, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            try:
                self.sock.connect(address)
                return
            except OSError as exc:
                self.sock.close()
                if time.monotonic() >= deadline:
                    raise InputError(f"no service at {endpoint} ({exc.strerror or exc}); start it with python -m "
                                     "cosmos3_runtime serve-isaaclab") from None
            time.sleep(0.2)

    def request(self, metadata: dict, arrays: Sequence[np.ndarray] = ()) -> tuple[dict, list[np.ndarray]]:
        send(self.sock, metadata, arrays)
        reply, images = receive(self.sock)
        if reply.get("ok") is not True:
            raise InputError(f"the service refused {metadata.get('op')!r}: {reply.get('error')}")
        return reply, images

    def status(self) -> dict:
        return self.request({"op": "status"})[0]

    def open(self, prompt: str | None, modality: str, height: int, width: int, max_episode_frames: int,
             seed: int = 0) -> None:
        self.request({"op": "open", "num_views": 1, "seeds": [seed], "prompt": prompt, "modality": modality,
                      "height": height, "width": width, "max_episode_frames": max_episode_frames})

    def step(self, frames: np.ndarray, reset_seed: int | None = None, **prompt) -> np.ndarray:
        """A control chunk [T, H, W, 3] uint8 -> its generated frames; `reset_seed` starts the next episode (with
        `prompt=...`, its prompt)."""
        resets = [] if reset_seed is None else [0]
        return self.request({"op": "step", "reset_rows": resets, "seeds": [reset_seed] * len(resets), **prompt},
                            [frames])[1][0]

    def close(self) -> None:
        self.request({"op": "close"})

    def shutdown(self) -> None:
        self.request({"op": "shutdown"})

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.sock.close()
