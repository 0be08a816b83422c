"""Sessions: a causal rollout driven one chunk at a time, its frames returned as soon as they are made.

Sim-Bimanual (`Session`), as NVIDIA's framework's `open_bimanual_session` and vLLM-Omni's typed ticks drive it:

    with pipe.session("The robot folds the towel.", action=ActionRequest(mode="forward_dynamics", image=first,
                                                                          domain="agibotworld")) as s:
        frames = s.tick(actions)  # [16, 29] -> the 17 frames of tick 0 (the first image's and 16 more), then 16 a tick

Sim-Transfer (`TransferSession`), as a simulator's camera drives it (an episode of `num_frames`, its frame budget):

    with pipe.session("A red ball rolls.", control="edge", num_frames=201, width=832, height=480, seed=1) as s:
        frames = s.tick(edges[:1])   # the episode's first control frame -> its first frame
        frames = s.tick(edges[1:5])  # then 4 control frames -> their 4 frames (16 on a chunkwise checkpoint)
        s.reset("A blue ball rolls.", seed=2)  # the next episode

A session is bound to its checkpoint, size and fps, and Sim-Bimanual's to its prompt, first image and embodiment: a
change is a new session (or, over HTTP, a reset); a Sim-Transfer reset may bring the next episode's prompt and seed.
Each tick extends the rollout by one chunk, commits its frames to the K/V history (sliding past the checkpoint's
window, so memory stays that of one window), encodes its controls and decodes its frames through the VAE's causal
state, so the frames of every tick join into exactly those of one batch run of the same actions or controls. A
session is planned at open as a batch run (Sim-Bimanual: one whose history fills the window; Sim-Transfer: the
episode's): refused then, not mid-run.
"""

from collections.abc import Callable

import torch

from . import causal, runs
from .causal_run import CausalRun
from .conditioning import frame_count, preprocess_video
from .errors import InputError
from .geometry import TEMPORAL_FACTOR
from .guardrails import Guardrails
from .request import Request
from .running import running
from .tracks import Parts
from .transformer import media_block


def check_checkpoint(variant) -> None:
    """Refuse a checkpoint that has no sessions, by name."""
    if variant.causal is None:
        raise InputError("sessions drive a causal checkpoint (Cosmos3-Nano-Sim-Bimanual, Cosmos3-Nano-Sim-Transfer); "
                         "this checkpoint is not one: use generate")


def session_request(variant, request: Request | None, control: str | None, **options) -> Request:
    """The request a session is planned with. Sim-Transfer's is the batch rollout of its episode: `num_frames` (its
    frame budget) at `width` x `height`, with a stand-in `control` clip (one black frame repeated: no memory) that
    the ticks' control frames replace."""
    if variant.causal.takes_actions:
        if control is not None:
            raise InputError("control names a Sim-Transfer session's controls; a Sim-Bimanual session takes actions "
                             "(action=ActionRequest(mode='forward_dynamics', image=..., domain=...))")
        return Request.build(request, **options)
    r = Request.build(request, **options)
    if control is None or r.control_videos is not None:
        raise InputError(f"a Sim-Transfer session takes its control frames a tick at a time: name their hint as "
                         f"control ({', '.join(variant.causal.hints)}) and leave control_videos unset")
    missing = [name for name in ("num_frames", "width", "height") if getattr(r, name) is None]
    if missing:
        raise InputError(f"a Sim-Transfer session needs {', '.join(missing)}: its episode's frame budget (the "
                         "duration its prompt states) and size")
    stand_in = torch.zeros(1, r.height, r.width, 3, dtype=torch.uint8).expand(r.num_frames, -1, -1, -1)
    return Request.build(r, control_videos={control: stand_in})


class CausalSession:
    """What the sessions share: one `CausalRun` opened for ticks over the plan, the codec's decode stream, a tick's
    run (`running`, as a generation's) that loses the history when it fails (`_run`), close. `Cosmos3Pipeline.session`
    opens one (the only door: it admits the plan, its prompt through the guardrail, first)."""

    def __init__(self, parts: Parts, plan, replan: Callable, guardrails: Guardrails | None = None):
        """`parts`: the model's denoiser and codec; `plan`: of `session_request(...)`, admitted;
        `replan(prompt, request, **changes)`: a reset's plan, admitted alike; `guardrails`: every tick's frames checked
        and their faces pixelated."""
        self.parts, self.plan, self.replan, self.guardrails = parts, plan, replan, guardrails
        self.closed = False
        self._start()

    @property
    def settings(self):
        return self.plan.settings

    def _start(self) -> None:
        self.run = None  # the old history's (and decoder state's) memory goes first
        p = self.plan
        self.run = CausalRun(self.parts, p.settings, p.request, p.cond_ids, p.uncond_ids, None, open=True)
        self.block = media_block(p.request.compile, self.parts.device)  # one a session: its chunk step keys on it
        self.chunk_index, self.lost = 0, False

    def _resume(self) -> None:
        """Refuse a closed session; start again at chunk 0 after a tick that failed."""
        self._refuse_closed()
        if self.lost:
            self._start()

    def _run(self, extend, callback, progress, interrupt) -> torch.Tensor:
        """One tick: `extend(rollout)` gives it the tick's conditions, its chunks run, their frames are decoded (beside
        the chunk's commits, on a GPU: `ChunkDecode`) and filtered by the guardrails. A tick that fails or is cancelled
        loses the history (half-committed): its memory is freed at once and the next tick starts again at chunk 0."""
        try:
            with running(self.parts, self.plan.settings, self.block, interrupt, self.guardrails) as guarded:
                extend(self.run)
                runs.execute(self.run, self.parts, int(self.plan.request.seed), callback, None, progress, None)
                frames = guarded(self.run.decoder.take())
        except BaseException:
            self.run = None  # freed now, rebuilt by the next tick (not while this error holds it)
            self.lost = True
            raise
        self.chunk_index += 1
        return frames

    def close(self) -> None:
        """Free the history and the decoder's state; a closed session refuses ticks and resets."""
        self.run = None
        self.closed = True

    def _refuse_closed(self) -> None:
        if self.closed:
            raise InputError("this session is closed; open a new one")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Session(CausalSession):
    """A Sim-Bimanual rollout, tick by tick (`Cosmos3Pipeline.session`)."""

    def __init__(self, parts: Parts, plan, replan: Callable, guardrails: Guardrails | None = None):
        """`plan`: of a request whose action (mode forward_dynamics, the first image, the embodiment) carries no
        actions: the settings plan it as a run long enough that its history fills the window."""
        if plan.request.action.actions is not None:
            raise InputError("a session takes its actions a tick at a time: leave the action request's actions unset")
        self.rows = plan.settings.kind.rollout.config.chunk_size * causal.ACTION_TOKENS  # actions a tick takes
        self.width = plan.settings.kind.rollout.embodiment.width
        super().__init__(parts, plan, replan, guardrails)

    def reset(self) -> None:
        """Back to chunk 0: the history, the decoder's state and the actions are dropped; the first image stays. A
        closed session stays closed."""
        self._refuse_closed()
        self._start()

    def tick(self, actions, callback=None, progress=None, interrupt=None, image=None) -> torch.Tensor:
        """The next chunk's actions [16, width] (raw, the embodiment's units) -> its frames [F, H, W, 3] float32 in
        0..1 on the CPU: 17 for tick 0 (the first image's frame and 16), 16 after. Bad actions are refused before
        anything runs, the session unchanged; a tick that fails or is cancelled loses the history (`_run`). `image`
        is refused: the first image opens a session (as over HTTP, where only the opening tick carries one)."""
        self._resume()
        if image is not None:
            raise InputError("a tick takes actions only: the first image belongs to the session, given when it opens "
                             "(pipe.session(prompt, action=ActionRequest(image=...))); open a new session to start "
                             "from another image")
        table = torch.as_tensor(actions, dtype=torch.float32).cpu()
        if table.shape != (self.rows, self.width):
            raise InputError(f"a tick takes {self.rows} actions of {self.width} values (one per frame), got "
                             f"{list(table.shape)}")
        self.plan.settings.kind.rollout.embodiment.check(table)  # NaN and infinities refused before anything runs
        return self._run(lambda run: run.extend(table), callback, progress, interrupt)


class TransferSession(CausalSession):
    """A Sim-Transfer episode, control chunk by control chunk (`Cosmos3Pipeline.session` with `control`).

    The episode is planned as the batch rollout of `num_frames` frames, its budget: the duration its prompt states,
    the history it keeps. Its frames are exactly the first frames of that batch (`generate` with the same prompt,
    seed, size and fps, and a control clip that starts with the ticks' control frames): the rollout is causal, so
    control frames not sent yet change nothing before them."""

    def __init__(self, parts: Parts, plan, replan: Callable, guardrails: Guardrails | None = None):
        chunk_size = plan.settings.kind.rollout.config.chunk_size
        if plan.settings.kind.rollout.mode != "kv":
            raise InputError("a session rolls its K/V history on (causal_cache 'kv'); 'recompute' reruns the whole "
                             "clip at every forward: leave causal_cache unset")
        if plan.settings.num_frames != plan.request.num_frames:
            raise InputError(f"an episode of {plan.request.num_frames} frames is not whole chunks of "
                             f"{chunk_size} latent frames: give {plan.settings.num_frames} "
                             f"(1 + {TEMPORAL_FACTOR * chunk_size}k)")
        self.update = TEMPORAL_FACTOR * chunk_size  # control frames a tick after the first takes
        super().__init__(parts, plan, replan, guardrails)

    def _start(self) -> None:
        super()._start()
        self.frames = 0  # made this episode

    def tick(self, controls, callback=None, progress=None, interrupt=None) -> torch.Tensor:
        """The episode's next control frames [F, H, W, 3] (uint8, or floats in 0..1; resized to the session's size as
        a batch resizes its clip) -> the frames made for them [F, H, W, 3] float32 in 0..1 on the CPU: the first tick
        takes 1 frame, each later one 4 a latent frame of a chunk (4 framewise, 16 chunkwise). Controls refused are
        refused before anything runs, the episode unchanged; a tick that fails or is cancelled loses the history
        (`_run`) and the next starts the episode again."""
        self._resume()
        s, count = self.plan.settings, frame_count(controls)
        expected = self.takes()
        if count != expected:
            raise InputError(f"this tick takes {expected} control frame{'s' * (expected > 1)} (an episode's first "
                             f"tick 1, each later one {self.update}), got {count}")
        if self.frames + count > s.num_frames:
            raise InputError(f"this episode has made all {s.num_frames} frames of its budget: reset to start the next "
                             "episode (or open one with a larger budget)")
        pixels = preprocess_video(controls, s.height, s.width)
        frames = self._run(lambda run: run.extend(pixels), callback, progress, interrupt)
        self.frames += count
        return frames

    def takes(self, reset: bool = False) -> int:
        """Control frames the next tick takes (`reset`: after one): an episode's first tick 1, each later one
        `update`."""
        return 1 if reset or self.lost or self.chunk_index == 0 else self.update

    def reset(self, prompt: str | None = None, seed: int | None = None) -> None:
        """Start the next episode: the history and the VAE's states are dropped. `prompt` (planned again, and checked
        by the session's guardrails) and `seed` are the next episode's (None: this one's). A closed session stays
        closed."""
        self._refuse_closed()
        if prompt is not None or seed is not None:
            self.plan = self.replan(self.plan.prompt if prompt is None else prompt, self.plan.request,
                                    seed=self.plan.request.seed if seed is None else seed)
        self._start()
