"""The kinds of run, as `Settings.kind` holds them: each owns what only it has (a long video's chunks and prompts per
chunk, a transfer's controls, a causal rollout) and says its shape (`geometry`) and the most frames one VAE encode of
it takes (`encoded_frames`). `runs.RUNS` maps each to the run that executes it; a window of any kind is a `Single`
(`replace(s, kind=SINGLE, ...)`)."""

from dataclasses import dataclass

from .causal import Rollout
from .chunks import Chunks
from .geometry import RunGeometry, latent_frames, pixel_frames
from .transfer import Controls


@dataclass(frozen=True)
class Single:
    """The request in one window; each window of the other kinds is one too."""

    chunks = None  # (no chunks: one window)

    def geometry(self, s) -> RunGeometry:
        return RunGeometry(s.height, s.width, s.num_frames, s.num_frames, guided=s.guidance_scale != 1.0)

    def encoded_frames(self, s, latent_input: bool) -> int:
        """The conditioning frames (none where they come as latents, `latent_input`): an action run's whole clip
        (its canvas), else up to the last held latent frame."""
        if not s.condition_frames or latent_input:
            return 0
        return s.num_frames if s.action is not None else pixel_frames(s.condition_frames[-1] + 1)


SINGLE = Single()


@dataclass(frozen=True)
class Continued:
    """A long video: its chunks, each after the first continuing from the last frames of the one before; with one
    prompt per chunk, each one's token ids (`Planner.prepare` fills them)."""

    chunks: Chunks
    prompt_ids: tuple[list[int], ...] | None = None

    def geometry(self, s) -> RunGeometry:
        c = self.chunks
        return RunGeometry(s.height, s.width, c.chunk, c.total, c.count, c.overlap, 0, guided=s.guidance_scale != 1.0)

    def encoded_frames(self, s, latent_input: bool) -> int:
        """The first chunk's conditioning frames, or a later chunk's start, its overlap encoded again."""
        return max(SINGLE.encoded_frames(s, latent_input), pixel_frames(latent_frames(self.chunks.overlap)))


@dataclass(frozen=True)
class Controlled:
    """A transfer: its controls and their guidance, over its chunks."""

    controls: Controls

    @property
    def chunks(self) -> Chunks:
        return self.controls

    def geometry(self, s) -> RunGeometry:
        c = self.controls
        return RunGeometry(s.height, s.width, c.chunk, c.total, c.count, c.overlap, len(c.hints),
                           guided=s.guidance_scale != 1.0, control_guided=c.control_guidance != 1.0)

    def encoded_frames(self, s, latent_input: bool) -> int:
        """A chunk's controls."""
        return self.controls.chunk


@dataclass(frozen=True)
class Causal:
    """A causal checkpoint's rollout: its chunks, history and noise."""

    rollout: Rollout
    chunks = None  # (its chunks are the rollout's, over one K/V history: no windows continuing one another)

    def geometry(self, s) -> RunGeometry:
        r = self.rollout
        return RunGeometry(s.height, s.width, r.chunk_pixels, s.num_frames, len(r.chunks),
                           history_frames=r.history_frames(), history_memory=r.history, decoded_frames=s.num_frames,
                           history_extra_rows=r.action_tokens, decoded_piece=1 + r.chunk_pixels)

    def encoded_frames(self, s, latent_input: bool) -> int:
        """Its control clip, encoded whole; or Sim-Bimanual's first image."""
        return s.num_frames if self.rollout.hint is not None else int(self.rollout.embodiment is not None)


Kind = Single | Continued | Controlled | Causal
