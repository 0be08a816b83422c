"""Guardrails as NVIDIA ships them: the prompt checked before anything runs, faces pixelated in the decoded frames
before they leave.

The checks are the optional `cosmos-guardrail` package's (`pip install cosmos-guardrail`, which needs
transformers>=5): a keyword blocklist (fuzzy and lemmatized matching) and the Qwen3Guard-Gen-0.6B classifier on the
prompt, RetinaFace pixelating faces on the video (its video classifier is disabled upstream for false positives, so
a video is filtered, not blocked; `Guardrails` takes video checks of a caller's own). The package's own
`CosmosSafetyChecker` is not used whole, for three reasons:
- it fails open: its classifier answers "safe" on any exception. Here an exception inside a check blocks, with the
  reason, unless the caller turns that off (`fail_closed=False`);
- it fetches its files from the Hugging Face Hub when built. Here they come from the local cache unless downloads are
  allowed (`allow_download`), so a server never fetches;
- its messages quote the words that matched. A blocked run here names what blocked it, never the words.
`Guardrails` holds the checks as plain callables, so hosts (and tests) can hand it their own.
"""

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from unittest import mock

import torch

from .errors import InputError

log = logging.getLogger(__name__)

PACKAGE = "cosmos-guardrail"
INSTALL = ("install it into ComfyUI's Python, which has torch and torchvision already (`python -m pip install "
           "cosmos-guardrail`, the pack's `guardrails` extra); it needs transformers>=5")
GUARDRAIL_REPO = "nvidia/Cosmos-1.0-Guardrail"  # the blocklist and the face detector
CLASSIFIER_REPO = "Qwen/Qwen3Guard-Gen-0.6B"
REMEMBERED = 256  # prompt verdicts kept (a robot loop or a route's pre-check asks about the same prompt again)
FACE_BATCH = 8  # frames per call of the face filter: progress and Cancel between calls
_BUILDING = threading.Lock()  # the package's module is patched while it builds (one build at a time)


class GuardrailBlocked(InputError):
    """A prompt or a video the guardrail blocked; `by` names what blocked it."""

    def __init__(self, message: str, by: str):
        super().__init__(message)
        self.by = by


@dataclass(frozen=True)
class Check:
    """One check: `run(value)` is True when the value is safe (it may raise: the guardrail then fails closed)."""

    name: str  # what blocked, as the message says it ("the keyword blocklist")
    run: Callable


class Guardrails:
    """Prompt checks, video checks and a face filter (frames [F, H, W, 3] uint8 -> the same with faces pixelated),
    with the modules they run on. `device`: where the modules run; with `offload` they are there only during a
    check and in CPU memory between checks. One check runs at a time (a server's routes and its prompt worker share
    one guardrail)."""

    def __init__(self, prompt_checks: list[Check], video_checks: list[Check] = (),
                 face_filter: Callable | None = None, modules: Iterable[torch.nn.Module] = (),
                 device: str | torch.device = "cpu", offload: bool = True, fail_closed: bool = True):
        self.prompt_checks, self.video_checks, self.face_filter = list(prompt_checks), list(video_checks), face_filter
        self.modules = list(modules)
        self.device, self.offload, self.fail_closed = torch.device(device), offload, fail_closed
        self._safe: OrderedDict[str, None] = OrderedDict()  # prompts found safe, most recent last
        self.make_room: Callable[[int], None] | None = None  # a host's memory manager, asked before the modules move
        self._lock = threading.RLock()
        self._place(self.device if not offload else torch.device("cpu"))

    @property
    def bytes(self) -> int:
        """The bytes of the modules' weights."""
        return sum(t.numel() * t.element_size() for m in self.modules for t in (*m.parameters(), *m.buffers()))

    def resident_bytes(self, device: torch.device) -> int:
        """What the guardrail keeps on `device` while a generation runs there (nothing when it offloads)."""
        same = torch.device(device).type == self.device.type and self.device.type != "cpu"
        return self.bytes if same and not self.offload else 0

    def check_prompts(self, prompts: Iterable[str], move: bool = True) -> None:
        """Raise `GuardrailBlocked` for the first prompt a check blocks (a check that raises blocks too, unless the
        guardrail fails open), naming the check, never the words. An empty prompt is blocked, as NVIDIA's blocklist
        blocks it. `move=False`: run where the modules are (a thread other than the host's worker must not ask its
        memory manager for room)."""
        with self._lock:
            for prompt in prompts:
                if not prompt.strip():
                    raise GuardrailBlocked("the prompt is empty, and the guardrail blocks empty prompts (as NVIDIA's "
                                           "blocklist does); write a prompt", "keyword blocklist")
                if prompt in self._safe:
                    self._safe.move_to_end(prompt)
                    continue
                with self._on_device(move):
                    judged = all([self._judge(check, prompt, "the prompt") for check in self.prompt_checks])
                if judged:  # (a check that failed open is asked again next time)
                    self._safe[prompt] = None
                    if len(self._safe) > REMEMBERED:
                        self._safe.popitem(last=False)

    def filter_frames(self, frames: torch.Tensor, progress: Callable[[int, int], None] | None = None) -> torch.Tensor:
        """Frames [F, H, W, 3] in 0..1 (CPU) after the video checks, faces pixelated: `GuardrailBlocked` for a
        blocked video. Only the pixels the filter changed differ from the input (the rest are not rounded to 8 bits).
        `progress(done, total)` runs after every few frames; raise from it to cancel."""
        pixels = (frames.clamp(0, 1) * 255).round().to(torch.uint8).numpy()
        with self._lock, self._on_device():
            for check in self.video_checks:
                self._judge(check, pixels, "the video")
            if self.face_filter is None:
                return frames
            filtered = pixels.copy()
            for start in range(0, len(pixels), FACE_BATCH):
                end = min(start + FACE_BATCH, len(pixels))
                try:  # (the package's filter pixelates the frames it is given in place: a copy)
                    filtered[start:end] = self.face_filter(pixels[start:end].copy())
                except Exception as exc:  # noqa: BLE001 - any failure of the filter is the guardrail's verdict
                    self._failed("face filter", exc, "the video")
                if progress is not None:
                    progress(end, len(pixels))
        changed = torch.from_numpy(filtered != pixels)
        return torch.where(changed, torch.from_numpy(filtered).float() / 255, frames)

    def _judge(self, check: Check, value, what: str) -> bool:
        """Raise for a blocked value; True when the check passed it, False when it failed and the guardrail is open."""
        try:
            safe = check.run(value)
        except Exception as exc:  # noqa: BLE001 - any failure of a check is the guardrail's verdict
            self._failed(check.name, exc, what)
            return False
        if not safe:
            raise GuardrailBlocked(f"{what} was blocked by the guardrail's {check.name}; change it and run again",
                                   check.name)
        return True

    def _failed(self, name: str, exc: Exception, what: str) -> None:
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        if self.fail_closed:
            raise GuardrailBlocked(f"{what} was blocked: the guardrail's {name} failed ({reason}), and the guardrail "
                                   "fails closed; fix the cause, or turn fail_closed off to let such runs through",
                                   name) from exc
        log.warning("the guardrail's %s failed (%s); %s passed, as fail_closed is off", name, reason, what)

    @contextmanager
    def _on_device(self, move: bool = True):
        if not move or not self.offload or self.device.type == "cpu":
            yield
            return
        if self.make_room is not None:
            self.make_room(self.bytes)
        self._place(self.device)
        try:
            yield
        finally:
            self._place(torch.device("cpu"))

    def _place(self, device: torch.device) -> None:
        for module in self.modules:
            module.to(device)


def load(device: str | torch.device = "cpu", offload: bool = True, fail_closed: bool = True,
         allow_download: bool = False) -> Guardrails:
    """NVIDIA's guardrails from the `cosmos-guardrail` package, their files from the Hugging Face cache (fetched only
    with `allow_download`). Refused by name without the package, with transformers older than 5, or without the files."""
    checker = _package()
    try:
        blocklist, classifier, faces = _package_parts(checker, allow_download)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - the package's files or models could not be read: say which and why
        raise InputError(f"the guardrails could not load ({type(exc).__name__}: {exc}); check the Hugging Face "
                         f"cache's copies of {GUARDRAIL_REPO} and {CLASSIFIER_REPO}") from exc
    return Guardrails(
        prompt_checks=[Check("keyword blocklist", lambda prompt: blocklist.is_safe(prompt)[0]),
                       # the package's own is_safe answers "safe" on any exception: its inner call raises instead
                       Check("classifier (Qwen3Guard)", lambda prompt: classifier.extract_label_and_categories(prompt)[0])],
        face_filter=faces.postprocess, modules=[classifier, faces], device=device, offload=offload,
        fail_closed=fail_closed)


def _package():
    """The package's module, or a refusal saying how to install it."""
    try:
        import transformers
    except ImportError:
        raise InputError(f"the guardrails need transformers>=5 and {PACKAGE}: {INSTALL}") from None
    if int(transformers.__version__.split(".")[0]) < 5:
        raise InputError(f"the guardrails need transformers>=5, and {transformers.__version__} is installed: "
                         f"upgrade it (pip install 'transformers>=5'); {PACKAGE}'s classifier does not load with older")
    try:
        import cosmos_guardrail.cosmos_guardrail as checker
    except Exception as exc:  # noqa: BLE001 - missing, or installed and failing to import
        if isinstance(exc, ImportError) and (exc.name or "").split(".")[0] == "cosmos_guardrail":
            raise InputError(f"the guardrails need the {PACKAGE} package, which is not installed: {INSTALL}") from None
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        raise InputError(f"{PACKAGE} is installed but does not import ({reason}); fix what it names (its "
                         "requirements: torchvision matching your torch, transformers>=5)") from exc
    return checker


def _package_parts(checker, allow_download: bool):
    """The package's blocklist, classifier and face filter, built from the local cache (or fetched, when allowed)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    def files(repo: str, **options) -> str:
        try:
            return snapshot_download(repo, local_files_only=not allow_download, **options)
        except LocalEntryNotFoundError:
            raise InputError(f"the guardrail's files from {repo} are not in the Hugging Face cache: turn on "
                             f"allow_download once, or run `hf download {repo}` first") from None

    with _BUILDING, mock.patch.object(checker, "snapshot_download", files):  # the package fetches while it builds
        blocklist, faces = checker.Blocklist(), checker.RetinaFaceFilter()
    classifier = checker.Qwen3Guard(model_id=files(CLASSIFIER_REPO))  # a local folder: no fetch
    classifier.model.eval()
    return blocklist, classifier, faces
