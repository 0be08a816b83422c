"""Cosmos3 sampling schedules and the two steppers that walk them.

Flow matching: x_t = (1 - s) x0 + s noise, the model predicts the velocity v = noise - x0, so
x0 = x - s v. A `Schedule` is the sigma grid (float32, ending in 0) plus the timesteps the model is
given (UniPC: int64, truncated from the float64 grid; Euler: float32 sigma * 1000).

- `unipc_schedule`: the shifted flow grid linspace(1, 1/1000, n+1)[:-1], s -> shift*s / (1 + (shift-1)*s).
- `checkpoint_schedule`: the shipped scheduler config as diffusers applies it: UniPC (Karras flow sigmas
  when `use_karras_sigmas`, in which case the flow shift has no effect), or FlowMatch Euler for a
  multi-step checkpoint that ships one without a fixed sigma list.
- `distilled_schedule`: a distilled checkpoint's fixed sigma list, used as given (shift 1).

`UniPC` is the multistep predictor-corrector (order 2, B(h) variants, x0 form) and `FlowEuler` the
Euler / SDE step of distilled checkpoints. Grids are computed in float64 and every coefficient as a
float32 scalar tensor, in the reference's operation order, so results match diffusers to float
rounding.
"""

from dataclasses import dataclass

import numpy as np
import torch

from .errors import CheckpointError

TRAIN_TIMESTEPS = 1000
KARRAS_RHO = 7.0

# Keys of a UniPC scheduler_config.json this runtime understands; a key not listed here is ignored.
# A listed key set to something other than its default (in UNSUPPORTED_UNIPC) is an error, because
# ignoring it would silently change the schedule.
UNSUPPORTED_UNIPC = {
    "prediction_type": "flow_prediction",
    "predict_x0": True,
    "use_flow_sigmas": True,
    "thresholding": False,
    "use_dynamic_shifting": False,
    "shift_terminal": None,
    "use_exponential_sigmas": False,
    "use_beta_sigmas": False,
}


def in_interval(interval: tuple[float, float] | None, t: float) -> bool:
    """Whether guidance with this (parsed, inclusive) interval of timesteps applies at `t`; None: always."""
    return interval is None or interval[0] <= t <= interval[1]


FLOW_MATCH_EULER = "FlowMatchEulerDiscreteScheduler"
UNSUPPORTED_FLOW_MATCH = {
    "use_dynamic_shifting": False,
    "shift_terminal": None,
    "use_karras_sigmas": False,
    "use_exponential_sigmas": False,
    "use_beta_sigmas": False,
    "invert_sigmas": False,
}


@dataclass(frozen=True)
class Schedule:
    sigmas: torch.Tensor  # float32 [n + 1], sigmas[n] == final sigma (0)
    timesteps: torch.Tensor  # [n], int64 (UniPC) or float32 (Euler)
    stepper: str  # "unipc" or "euler"
    stochastic: bool = False  # Euler: re-noise every step (SDE)
    solver_type: str = "bh2"
    disable_corrector: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.timesteps)


def _flow_grid(steps: int, shift: float, sigmas: np.ndarray | None = None) -> np.ndarray:
    if sigmas is None:
        sigmas = np.linspace(1, 1 / TRAIN_TIMESTEPS, steps + 1)[:-1]
    sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
    if np.fabs(sigmas[0] - 1) < 1e-6:
        sigmas[0] -= 1e-6
    return sigmas


def _karras_flow_grid(steps: int, sigma_min: float, sigma_max: float) -> np.ndarray:
    ramp = np.linspace(0, 1, steps)
    lo, hi = sigma_min ** (1 / KARRAS_RHO), sigma_max ** (1 / KARRAS_RHO)
    karras = (hi + ramp * (lo - hi)) ** KARRAS_RHO
    return karras / (karras + 1)


def _unipc(grid: np.ndarray, final_sigma: str = "zero", **options) -> Schedule:
    last = 0.0 if final_sigma == "zero" else grid[-1]
    timesteps = torch.from_numpy(grid * TRAIN_TIMESTEPS).to(torch.int64)
    sigmas = torch.from_numpy(np.concatenate([grid, [last]]).astype(np.float32))
    return Schedule(sigmas, timesteps, "unipc", **options)


def unipc_schedule(steps: int, shift: float) -> Schedule:
    """Flow UniPC on the shifted flow grid: the runtime's default for multi-step checkpoints."""
    return _unipc(_flow_grid(steps, shift))


def checkpoint_schedule(config: dict, steps: int, shift: float | None = None, native_flow: bool = False) -> Schedule:
    """The checkpoint's own UniPCMultistepScheduler config, applied the way diffusers applies it.

    `shift` overrides the config's `flow_shift` (it has no effect on a Karras grid). `native_flow` is the
    pipeline flag `use_native_flow_schedule`: supply linspace(1 - 1/1000, 0) as the unshifted grid.
    """
    source = "scheduler/scheduler_config.json"
    class_name = config.get("_class_name", "UniPCMultistepScheduler")
    if class_name == FLOW_MATCH_EULER:
        return _flow_match_schedule(config, steps, shift, native_flow)
    if class_name != "UniPCMultistepScheduler":
        raise CheckpointError(f"{source}: the 'checkpoint' schedule needs a UniPCMultistepScheduler or "
                              f"{FLOW_MATCH_EULER} config, not {class_name!r}")
    for key, default in UNSUPPORTED_UNIPC.items():
        if config.get(key, default) != default:
            raise CheckpointError(f"{source}: {key}={config[key]!r} is not supported (expected {default!r})")
    if config.get("solver_order", 2) > 2:
        raise CheckpointError(f"{source}: solver_order {config['solver_order']} is not supported (1 or 2)")
    options = dict(
        final_sigma=config.get("final_sigmas_type", "zero"),
        solver_type=config.get("solver_type", "bh2"),
        disable_corrector=tuple(config.get("disable_corrector") or ()),
    )
    if options["solver_type"] not in ("bh1", "bh2"):
        raise CheckpointError(f"{source}: solver_type {options['solver_type']!r} is not supported (bh1 or bh2)")
    if config.get("use_karras_sigmas", False):
        sigma_min, sigma_max = config.get("sigma_min"), config.get("sigma_max")
        if sigma_min is None or sigma_max is None:
            sigma_min, sigma_max = _vp_sigma_range(config)
        return _unipc(_karras_flow_grid(steps, sigma_min, sigma_max), **options)
    shift = config.get("flow_shift", 1.0) if shift is None else shift
    supplied = np.linspace(1.0 - 1.0 / TRAIN_TIMESTEPS, 0.0, steps + 1)[:-1] if native_flow else None
    return _unipc(_flow_grid(steps, shift, supplied), **options)


def _flow_match_schedule(config: dict, steps: int, shift: float | None, native_flow: bool) -> Schedule:
    """A multi-step FlowMatchEulerDiscreteScheduler config (no fixed sigma list), as diffusers' set_timesteps runs it:
    timesteps linspace(1000, 1, n) (or the native grid), sigmas = t / 1000 shifted, Euler steps on them."""
    for key, default in UNSUPPORTED_FLOW_MATCH.items():
        if config.get(key, default) != default:
            raise CheckpointError(f"scheduler/scheduler_config.json: {key}={config[key]!r} is not supported "
                                  f"(expected {default!r})")
    n = config.get("num_train_timesteps", TRAIN_TIMESTEPS)
    shift = config.get("shift", 1.0) if shift is None else shift
    if native_flow:
        grid = np.linspace(1.0 - 1.0 / n, 0.0, steps + 1)[:-1].astype(np.float32)
    else:  # from sigma_max = 1 to the shifted training grid's sigma_min, then shifted once more (as diffusers does)
        sigma_min = shift * (1 / n) / (1 + (shift - 1) * (1 / n))
        grid = np.linspace(1.0 * n, sigma_min * n, steps) / n
    grid = shift * grid / (1 + (shift - 1) * grid)
    sigmas = torch.from_numpy(grid).to(torch.float32)
    return Schedule(torch.cat([sigmas, torch.zeros(1)]), sigmas * n, "euler",
                    stochastic=bool(config.get("stochastic_sampling", False)))


def _vp_sigma_range(config: dict) -> tuple[float, float]:
    """Karras end points from the training noise table when the config gives none (linear betas)."""
    if config.get("beta_schedule", "linear") != "linear":
        raise CheckpointError("scheduler/scheduler_config.json: set sigma_min and sigma_max for Karras sigmas")
    n = config.get("num_train_timesteps", TRAIN_TIMESTEPS)
    betas = torch.linspace(config.get("beta_start", 1e-4), config.get("beta_end", 0.02), n, dtype=torch.float32)
    alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)
    sigmas = (((1 - alphas_cumprod) / alphas_cumprod) ** 0.5).numpy()
    return float(sigmas[0]), float(sigmas[-1])


def distilled_schedule(sigmas: tuple[float, ...], stochastic: bool) -> Schedule:
    """A distilled checkpoint's fixed sigma list (shift 1: the list already is the schedule)."""
    grid = torch.tensor(np.array(sigmas, dtype=np.float32))
    timesteps = grid * TRAIN_TIMESTEPS
    return Schedule(torch.cat([grid, torch.zeros(1)]), timesteps, "euler", stochastic=stochastic)


def _lambda(sigma: torch.Tensor) -> torch.Tensor:
    """Half log-SNR of flow matching: log(1 - s) - log(s)."""
    return torch.log(1 - sigma) - torch.log(sigma)


class UniPC:
    """Multistep UniPC (predictor UniP, corrector UniC) in x0 form, order <= 2, for flow prediction.

    Holds the per-run history; make a new one for every generation (and every modality).
    """

    def __init__(self, schedule: Schedule, order: int = 2, lower_order_final: bool = True):
        self.schedule = schedule
        self.order = order
        self.lower_order_final = lower_order_final
        self.index = 0
        self.x0_history: list[torch.Tensor] = []  # last `order` x0 predictions, oldest first
        self.last_sample: torch.Tensor | None = None
        self.last_order = 0
        self.warmup = 0

    def _coefficients(self, sigma_to: torch.Tensor, sigma_from: torch.Tensor):
        """alpha(sigma_to), h, hh = -h, expm1(hh) and B(h) for a move sigma_from -> sigma_to."""
        h = _lambda(sigma_to) - _lambda(sigma_from)
        hh = -h
        e = torch.expm1(hh)
        b = hh if self.schedule.solver_type == "bh1" else e
        return 1 - sigma_to, h, hh, e, b

    def step(self, velocity: torch.Tensor, sample: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """The next sample (`generator` unused: UniPC draws no noise; it keeps one interface with FlowEuler)."""
        sigmas = self.schedule.sigmas.to(sample.device)
        k = self.index
        x0 = sample - sigmas[k] * velocity  # from the uncorrected sample
        if k > 0 and self.last_sample is not None and (k - 1) not in self.schedule.disable_corrector:
            sample = self._correct(x0, sigmas, k)
        self.x0_history = (self.x0_history + [x0])[-self.order :]
        order = min(self.order, len(self.schedule) - k) if self.lower_order_final else self.order
        order = min(order, self.warmup + 1)
        self.last_sample, self.last_order = sample, order
        result = self._predict(sample, sigmas, k, order)
        self.warmup = min(self.warmup + 1, self.order)
        self.index += 1
        return result

    def _predict(self, x: torch.Tensor, sigmas: torch.Tensor, k: int, order: int) -> torch.Tensor:
        alpha_t, h, hh, e, b = self._coefficients(sigmas[k + 1], sigmas[k])
        m0 = self.x0_history[-1]
        x_next = sigmas[k + 1] / sigmas[k] * x - alpha_t * e * m0
        if order == 2:
            r = (_lambda(sigmas[k - 1]) - _lambda(sigmas[k])) / h
            d1 = (self.x0_history[-2] - m0) / r
            x_next = x_next - alpha_t * b * (0.5 * d1)
        return x_next

    def _correct(self, x0: torch.Tensor, sigmas: torch.Tensor, k: int) -> torch.Tensor:
        alpha_t, h, hh, e, b = self._coefficients(sigmas[k], sigmas[k - 1])
        m_prev = self.x0_history[-1]
        x = sigmas[k] / sigmas[k - 1] * self.last_sample - alpha_t * e * m_prev
        if self.last_order == 1:
            return x - alpha_t * b * (0.5 * (x0 - m_prev))
        r = (_lambda(sigmas[k - 2]) - _lambda(sigmas[k - 1])) / h
        d1 = (self.x0_history[-2] - m_prev) / r
        phi = e / hh - 1
        b1 = phi / b
        b2 = (phi / hh - 0.5) * 2 / b
        # The reference solves this 2x2 system with LU; the closed form differs in the last bit.
        rho = torch.linalg.solve(torch.stack([torch.stack([torch.ones_like(r), torch.ones_like(r)]),
                                              torch.stack([r, torch.ones_like(r)])]), torch.stack([b1, b2]))
        return x - alpha_t * b * (rho[0] * d1 + rho[1] * (x0 - m_prev))


class FlowEuler:
    """Distilled step: Euler (x + (s' - s) v) or, with `stochastic`, SDE (x0 = x - s v, then re-noise to s')."""

    def __init__(self, schedule: Schedule):
        self.schedule = schedule
        self.index = 0

    def step(self, velocity: torch.Tensor, sample: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        sigma, sigma_next = self.schedule.sigmas[self.index], self.schedule.sigmas[self.index + 1]
        self.index += 1
        if not self.schedule.stochastic:
            return sample + (sigma_next - sigma).to(sample.device) * velocity
        x0 = sample - sigma.to(sample.device) * velocity
        noise = torch.randn(sample.shape, generator=generator, dtype=torch.float32).to(sample.device)
        return (1.0 - sigma_next).to(sample.device) * x0 + sigma_next.to(sample.device) * noise


def stepper_for(schedule: Schedule) -> "UniPC | FlowEuler":
    """A fresh stepper for one run (and one modality) of `schedule`: `step(velocity, sample, generator=None)`."""
    return FlowEuler(schedule) if schedule.stepper == "euler" else UniPC(schedule)
