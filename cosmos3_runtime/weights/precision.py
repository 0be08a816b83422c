"""Precision per step: where a quantized checkpoint runs its own low-precision arithmetic and where it keeps the
activations in the compute dtype.

Formats whose files calibrate the activations too (official FP8: W8A8; NVFP4: W4A4 where FP4 matmuls run) can run
a layer two ways: natively (the activations quantized by the calibrated scale, one low-precision matmul) or with
16-bit activations (the weight expanded into the compute dtype: W8A16, W4A16). A `Policy` says which steps run which:
16-bit activations on the first and last N denoising steps of the media pathway, native between; the text pathway
(prompt encoding, the Reasoner) as its `text_a16` says. It is the checkpoint's (`quantization_config.runtime.
diffusion_step_policy`), or the request's (`precision_policy`, `precision_first_steps`, `precision_last_steps`; the
earlier names `fp8_policy`, `fp8_first_steps`, `fp8_last_steps` still work). Layers ask `runs_native(pathway)`; the
denoising loop sets it per step (`for_step`), prompt encoding for the text pathway (`for_text`).
"""

from contextlib import contextmanager
from dataclasses import dataclass



@dataclass(frozen=True)
class Policy:
    """16-bit activations on the first `first` and last `last` denoising steps (media pathway), native between;
    where the windows overlap (short runs), `overlap_a16` decides; the text pathway runs with 16-bit activations when
    `text_a16`. One-step runs stay native, as in diffusers and vLLM-Omni."""

    first: int = 3
    last: int = 3
    overlap_a16: bool = True
    text_a16: bool = True

    def high_precision(self, step: int, steps: int) -> bool:
        if steps <= 1:
            return False
        in_first, in_last = step < self.first, step >= steps - self.last
        if in_first and in_last:
            return self.overlap_a16
        return in_first or in_last

    def describe(self, native: str, a16: str) -> str:
        """In a format's words for its two arithmetics (`native` "W8A8", `a16` "W8A16")."""
        text = a16 if self.text_a16 else native
        return f"{a16} on the first {self.first} and last {self.last} steps, {native} between; text tower {text}"


def resolve(quantization, override: str, first: int | None, last: int | None, notes: list[str]) -> Policy | None:
    """The policy a run uses on a checkpoint that declares `quantization` (None: none; else it has `.policy`): the
    checkpoint's ("checkpoint"), none ("off": native throughout), or the first/last policy even where the checkpoint
    declares none ("on", 3 and 3 unless given); `first` / `last` override the counts. None: native throughout."""
    if quantization is None:
        if override != "checkpoint" or first is not None or last is not None:
            notes.append("precision policy ignored: this checkpoint's weights do not quantize the activations (only "
                         "official FP8 and NVFP4 checkpoints do)")
        return None
    if override == "off":
        return None
    policy = quantization.policy
    if policy is None and override == "checkpoint":
        if first is not None or last is not None:
            notes.append("precision first/last step counts ignored: this checkpoint declares no step policy (it runs "
                         "its own arithmetic throughout); set precision_policy 'on' to use them")
        return None
    policy = policy or Policy()
    return Policy(policy.first if first is None else first, policy.last if last is None else last,
                  policy.overlap_a16, policy.text_a16)


class _Precision:
    """Which pathways run natively now: (media, text); None outside a run (native everywhere). A plain attribute, not
    a ContextVar: torch.compile reads it inside a compiled block (guarding on its value), where a ContextVar breaks
    the graph at every linear. A process runs one generation at a time."""

    now: tuple[bool, bool] | None = None


_precision = _Precision()


@contextmanager
def precision(media_native: bool, text_native: bool):
    """Run the linears with calibrated activations natively or with 16-bit activations, per pathway, in the block."""
    before, _precision.now = _precision.now, (media_native, text_native)
    try:
        yield
    finally:
        _precision.now = before


def for_step(policy: Policy | None, step: int, steps: int):
    """The precision of denoising step `step` of `steps` (policy None: native throughout)."""
    if policy is None:
        return precision(True, True)
    return precision(not policy.high_precision(step, steps), not policy.text_a16)


def for_text(policy: Policy | None):
    """The precision of the text pathway outside the steps (prompt encoding, the Reasoner)."""
    return precision(True, policy is None or not policy.text_a16)


def runs_native(pathway: str | None) -> bool:
    """Whether a linear of `pathway` ("media", "text"; None for the patch and time projections, which the policy
    does not name and which keep their native arithmetic) runs natively now."""
    now = _precision.now
    if now is None or pathway is None:
        return True
    return now[0] if pathway == "media" else now[1]


def step_of_sigma(sigma: float, sigmas: list[float]) -> tuple[int, int]:
    """(step, steps) of a model call at `sigma` in a sampler's schedule `sigmas` (steps + 1 values, decreasing): the
    step whose interval holds it, so a sampler's extra evaluations inside a step (Heun, DPM++ 2S) count as that step."""
    steps = max(len(sigmas) - 1, 1)
    tolerance = 1e-5 * max(abs(sigma), 1e-3)
    return max(sum(s >= sigma - tolerance for s in sigmas[:steps]) - 1, 0), steps
