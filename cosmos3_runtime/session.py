"""Sim-Bimanual sessions: a causal action rollout driven one chunk of actions at a time, as NVIDIA's framework's
`open_bimanual_session` and vLLM-Omni's typed ticks drive it.

    with pipe.session("The robot folds the towel.", action=ActionRequest(mode="forward_dynamics", image=first,
                                                                          domain="agibotworld")) as s:
        frames = s.tick(actions)  # [16, 29] -> the 17 frames of tick 0 (the first image's and 16 more), then 16 a tick

A session is bound to its prompt, first image, size, fps, embodiment and checkpoint: a change is a new session (or,
over HTTP, a reset). Each tick extends the rollout by one chunk (4 latent frames, 16 actions), commits its frames to
the K/V history (sliding past the checkpoint's window, so memory stays that of one window) and decodes them through
the VAE's causal state, so the frames of every tick join into exactly those of one batch run of the same actions.
The session is planned at open as a batch run whose history fills the window: refused then, not mid-run.
"""

from dataclasses import replace

import torch

from . import cancel, causal, runs
from .errors import InputError
from .transformer import DecoderLayer
from .vae import image_frames
from .weights import precision


def check_checkpoint(variant) -> None:
    """Refuse a checkpoint that has no sessions, by name."""
    if variant.causal is None or not variant.causal.takes_actions:
        raise InputError("sessions drive a causal action checkpoint (Cosmos3-Nano-Sim-Bimanual); this checkpoint "
                         "is not one: use generate")


class Session:
    """One rollout, tick by tick (`Cosmos3Pipeline.session`)."""

    def __init__(self, pipe, plan, guardrails=None):
        """`plan`: `pipe.plan(prompt, request)` of a request whose action (mode forward_dynamics, the first image, the
        embodiment) carries no actions: the settings plan it as a run long enough that its history fills the window.
        `Cosmos3Pipeline.session` makes one and checks it (and its prompt, against `guardrails`) first; `guardrails`
        then checks every tick's frames and pixelates their faces."""
        check_checkpoint(pipe.variant)
        c = pipe.variant.causal
        if plan.request.action.actions is not None:
            raise InputError("a session takes its actions a tick at a time: leave the action request's actions unset")
        self.plan, self.pipe, self.run, self.guardrails = plan, pipe, None, guardrails
        self.rows = c.chunk_size * causal.ACTION_TOKENS  # actions a tick takes
        self.width = plan.settings.rollout.embodiment.width
        self.closed = False
        self._start()

    @property
    def settings(self):
        return self.plan.settings

    def reset(self) -> None:
        """Back to chunk 0: the history, the decoder's state and the actions are dropped; the first image stays. A
        closed session stays closed."""
        self._refuse_closed()
        self._start()

    def _start(self) -> None:
        self.run = self.decoder = None  # the old history's memory goes first
        self.run = runs.Rollout(self.pipe.parts, self.plan.settings, self.plan.request, self.plan.cond_ids, None,
                                open=True)
        self.decoder = self.pipe.vae.decode_stream()
        self.chunk_index, self.lost = 0, False

    def tick(self, actions, callback=None, progress=None, interrupt=None, image=None) -> torch.Tensor:
        """The next chunk's actions [16, width] (raw, the embodiment's units) -> its frames [F, H, W, 3] float32 in
        0..1 on the CPU: 17 for tick 0 (the first image's frame and 16), 16 after. Bad actions are refused before
        anything runs, the session unchanged; a tick that fails or is cancelled loses the history (half-committed):
        the session starts again at chunk 0 with its next tick. `image` is refused: the first image opens a session
        (as over HTTP, where only the opening tick carries one)."""
        self._refuse_closed()
        if image is not None:
            raise InputError("a tick takes actions only: the first image belongs to the session, given when it opens "
                             "(pipe.session(prompt, action=ActionRequest(image=...))); open a new session to start "
                             "from another image")
        table = torch.as_tensor(actions, dtype=torch.float32).cpu()
        if table.shape != (self.rows, self.width):
            raise InputError(f"a tick takes {self.rows} actions of {self.width} values (one per frame), got "
                             f"{list(table.shape)}")
        self.plan.settings.rollout.embodiment.check(table)  # NaN and infinities refused before anything runs
        if self.lost:
            self._start()
        pipe, s = self.pipe, self.plan.settings
        try:
            with torch.inference_mode(), precision.for_text(s.precision), cancel.checking(interrupt):
                self.run.extend(table)
                pipe.denoiser.hooks = replace(pipe.transformer.hooks, block=DecoderLayer.media)
                runs.execute(self.run, pipe.parts, int(self.plan.request.seed), callback, None, progress, None)
                frames = image_frames(self.decoder(pipe.vae.denormalize(self.run.latents)).float())
                if self.guardrails is not None:  # a blocked tick is a failed one
                    frames = self.guardrails.filter_frames(frames)
        except BaseException:
            self.run = self.decoder = None  # freed now, rebuilt by the next tick (not while this error holds them)
            self.lost = True
            raise
        self.chunk_index += 1
        return frames

    def close(self) -> None:
        """Free the history and the decoder's state; a closed session refuses ticks and resets."""
        self.run = self.decoder = None
        self.closed = True

    def _refuse_closed(self) -> None:
        if self.closed:
            raise InputError("this session is closed; open a new one")

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
