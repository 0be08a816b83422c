"""SeaCache: the step cache NVIDIA's Cosmos3 framework runs by default, in the pack's sampling loop.

"SeaCache: Spectral-Evolution-Aware Cache for Accelerating Diffusion Models" (arXiv 2602.18993), as NVIDIA's
cosmos-framework applies it to Cosmos3 now (`cosmos_framework/model/generator/mot/diffusion_cache.py` after PR #225:
threshold 0.25, at most 2 reuses in a row). Each step, the noisy video latents, in the model's dtype, pass a Wiener
filter matched to the step's noise level (`sea_filter`: the "indicator"). Per guidance pass (the first pass of every
step is one pathway, the second another, ...), the relative L1 change of the indicator since the previous step is
added up; while the sum stays under the threshold, the pass does not run the transformer's layer stack: its media
hidden states become the stack's input plus the stack's residual (normed output minus input: the stack ends with the
final norm) from the pass's last full runs, extrapolated to this step through Newton's divided differences
(`residual_order` 1: linear). A full run resets the sum; `max_consecutive` reuses in a row force one. The first
`ret_steps` and the last `cutoff_from_end` steps always run in full. The embeddings before the stack and the heads
after it (projections to velocity, sound and action) run every time; the text K/V are computed once per prompt
anyway. Threshold 0 never skips: the output is bit-identical to the cache turned off.

Where diffusers 0.42.1 (`SeaCacheConfig`) differs, the framework is followed: the filter's noise level is the
scheduler's timestep / 1000 (UniPC's timesteps are whole numbers, so up to 1e-3 under the exact sigma diffusers
takes), and the distance is computed in the model's dtype (diffusers: fp32). In fp32 only the first differs.
"""

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .parallel import Group

EPS = 1e-16


@dataclass(frozen=True)
class CacheConfig:
    threshold: float = 0.25  # accumulated relative L1 change of the indicator before a pass runs in full
    max_consecutive: int = 2  # reuses in a row before a pass runs in full (0: no cap)
    residual_order: int = 1  # 0: reuse the last residual, 1: linear, 2: quadratic extrapolation
    ret_steps: int = 1  # the first steps always run in full
    cutoff_from_end: int = 1  # and the last ones
    power_exp: float = 3.0  # the clean signal's assumed spectrum, 1 / |f|^power_exp
    timestep_max: float = 1000.0  # timesteps above 1 are divided by this to give the noise level


def sea_filter(latents: torch.Tensor, sigma: float, power_exp: float = 3.0) -> torch.Tensor:
    """The indicator of noisy latents [C, T, H, W] at noise level `sigma`: over T, H and W (not channels), the
    separable Wiener gain a S / (a^2 S + b^2) with a = 1 - sigma, b = sigma and S = 1 / |f|^power_exp per axis,
    scaled to unit mean, applied in the Fourier domain in fp32; as [T, H, W, C] in the latents' dtype."""
    dtype = latents.dtype
    x = latents.movedim(0, -1).float()
    dims = (0, 1, 2)
    a, b = 1.0 - sigma, sigma
    gain = None
    for axis in dims:
        f = torch.fft.fftfreq(x.shape[axis], device=x.device, dtype=torch.float32)
        s = 1.0 / (f.abs() ** power_exp + EPS)
        one = (a * s) / (a * a * s + b * b + EPS)
        shape = [1] * x.ndim
        shape[axis] = one.shape[0]
        gain = one.view(shape) if gain is None else gain * one.view(shape)
    mean = gain.mean()
    gain = torch.where(torch.isfinite(mean) & (mean > 0), gain / mean, gain)  # decided on the device: no host read
    return torch.fft.ifftn(torch.fft.fftn(x, dim=dims) * gain, dim=dims).real.to(dtype)


def noise_level(timestep: float, config: CacheConfig) -> float:
    """The timestep as a noise level in (0, 1): divided by timestep_max when above 1, kept off the ends."""
    sigma = float(timestep)
    if sigma > 1.0:
        sigma /= config.timestep_max
    return max(1e-6, min(1.0 - 1e-6, sigma))


def relative_l1(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """mean |a - b| / mean |b|, a 0-d tensor on their device, in their dtype (the framework's rounding)."""
    return (a - b).abs().mean() / (b.abs().mean() + EPS)


def extrapolate(history: list[tuple[int, torch.Tensor]], step: int, order: int) -> torch.Tensor:
    """The residual at `step` from the last `order + 1` stored (step, residual) pairs: Newton's divided differences
    at their (uneven) steps, evaluated by Horner's rule; with fewer pairs, the highest order they allow."""
    k = max(0, min(order, len(history) - 1))
    steps = [s for s, _ in history[-(k + 1) :]]
    coefficients = [r.clone() for _, r in history[-(k + 1) :]]
    for level in range(1, k + 1):
        for j in range(k, level - 1, -1):
            coefficients[j] = (coefficients[j] - coefficients[j - 1]) / float(steps[j] - steps[j - level])
    result = coefficients[k]
    for j in range(k - 1, -1, -1):
        result = result * float(step - steps[j]) + coefficients[j]
    return result


@dataclass
class Pathway:
    """One guidance pass's state: the accumulated change, the last indicator, the last full runs' residuals, the
    reuses since the last full run."""

    accumulated: float = 0.0
    consecutive: int = 0
    indicator: torch.Tensor | None = None
    history: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    change: float = 0.0  # this step's relative L1 change of the indicator since `indicator`


class StepCache:
    """SeaCache over one generation (or one transfer chunk after another): `begin(steps)` per sampling loop,
    `step(i, latents, timestep)` per step, then `layers(k)` is the layer-stack hook of the step's k-th pass."""

    def __init__(self, config: CacheConfig, dtype: torch.dtype = torch.float32):
        self.config = config
        self.dtype = dtype  # the model's: the framework filters the latents as the model sees them
        self.full = self.skipped = 0  # forwards of the whole generation
        self.begin(0)

    def begin(self, num_steps: int) -> None:
        """A new sampling loop (a generation, or a transfer chunk): every pathway starts afresh."""
        self.num_steps, self.pathways, self.index, self.current = num_steps, {}, -1, None

    def step(self, index: int, latents: torch.Tensor, timestep: float, group: Group | None = None) -> None:
        """Step `index` begins with these noisy latents [1, C, T, h, w] at this timestep. Every pathway that may skip
        gets its indicator's change now, read to the host once for the step; under sequence parallelism the
        ranks' figures are all-reduced first, so that every rank takes the same decision (a rank that skipped
        the layer stack while another ran it would wait forever in the stack's all-to-alls)."""
        self.index = index
        c = self.config
        self.current = sea_filter(latents[0].to(self.dtype), noise_level(timestep, c), c.power_exp)
        if index < c.ret_steps or index >= self.num_steps - c.cutoff_from_end:
            return  # every pass runs in full: nothing to measure
        pending = [p for p in self.pathways.values() if p.history and p.indicator is not None and not self.capped(p)]
        if not pending:
            return
        changes = {id(p.indicator): p.indicator for p in pending}  # pathways that share an indicator share its change
        measured = torch.stack([relative_l1(self.current, indicator) for indicator in changes.values()]).float()
        if group is not None:
            dist.all_reduce(measured, op=dist.ReduceOp.MAX, group=group.group)
        by_indicator = dict(zip(changes, measured.tolist()))  # the step's one host read
        for p in pending:
            p.change = by_indicator[id(p.indicator)]

    def capped(self, p: Pathway) -> bool:
        return bool(self.config.max_consecutive) and p.consecutive >= self.config.max_consecutive

    def runs_in_full(self, pass_index: int) -> bool:
        """The decision for this step's pass: forced (the ends, no history yet, the cap), or the accumulated change
        over the threshold."""
        p = self.pathways.setdefault(pass_index, Pathway())
        c = self.config
        forced = (self.index < c.ret_steps or self.index >= self.num_steps - c.cutoff_from_end or not p.history
                  or p.indicator is None or self.capped(p))
        if forced:
            p.accumulated, p.indicator = 0.0, self.current
            return True
        p.accumulated += p.change
        p.indicator = self.current
        if p.accumulated < c.threshold:
            return False
        p.accumulated = 0.0
        return True

    def layers(self, pass_index: int):
        """The layer-stack hook (`Hooks.stack`) of this step's pass `pass_index`, which the transformer calls with
        the stack's input and a function that runs it: a full run stores its residual; a skipped one returns the
        input plus the extrapolated residual."""
        full = self.runs_in_full(pass_index)
        p = self.pathways[pass_index]

        def stack(hidden: torch.Tensor, run) -> torch.Tensor:
            if p.history and p.history[-1][1].shape != hidden.shape:
                # the pass's tokens changed (a transfer's pass outside its control interval): start over, as the
                # framework does, whatever the decision; a skip would extrapolate across two shapes
                p.accumulated, p.history = 0.0, []
            if not full and p.history:
                self.skipped += 1
                p.consecutive += 1
                return hidden + extrapolate(p.history, self.index, self.config.residual_order).to(hidden.dtype)
            self.full += 1
            p.consecutive = 0
            out = run(hidden)
            p.history = (p.history + [(self.index, (out - hidden).detach().clone())])[-(self.config.residual_order + 1) :]
            return out

        return stack

    def report(self) -> str:
        return f"SeaCache: {self.full} forwards run, {self.skipped} skipped"
