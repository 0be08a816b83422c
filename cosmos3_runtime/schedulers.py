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

    Every coefficient depends on the schedule alone, so all of them are computed once, on the CPU in float32 (as the
    reference does, its 2x2 corrector system solved there with LU), and moved to the samples' device once: a step
    then only combines tensors, with no host round trip. Holds the per-run history; make a new one for every
    generation (and every modality).
    """

    def __init__(self, schedule: Schedule, order: int = 2, lower_order_final: bool = True):
        self.schedule = schedule
        self.index = 0
        self.x0_history: list[torch.Tensor] = []  # last `order` x0 predictions, oldest first
        self.last_sample: torch.Tensor | None = None
        n = len(schedule)
        # the order of each step: lower at the start (no history yet) and, with lower_order_final, at the end
        self.orders = [min(order, n - k if lower_order_final else order, k + 1) for k in range(n)]
        self.table = _unipc_table(schedule, self.orders)  # [steps, COLUMNS], float32

    def step(self, velocity: torch.Tensor, sample: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """The next sample (`generator` unused: UniPC draws no noise; it keeps one interface with FlowEuler)."""
        if self.table.device != sample.device:
            self.table = self.table.to(sample.device)
        k = self.index
        c = dict(zip(COLUMNS, self.table[k].unbind()))  # 0-d views on the device
        x0 = sample - c["sigma"] * velocity  # from the uncorrected sample
        if k > 0 and self.last_sample is not None and (k - 1) not in self.schedule.disable_corrector:
            sample = self._correct(x0, c, self.orders[k - 1])
        self.x0_history = (self.x0_history + [x0])[-2:]
        self.last_sample = sample
        m0 = self.x0_history[-1]
        x_next = c["ratio"] * sample - c["ae"] * m0
        if self.orders[k] == 2:
            x_next = x_next - c["ab"] * (0.5 * ((self.x0_history[-2] - m0) / c["r"]))
        self.index += 1
        return x_next

    def _correct(self, x0: torch.Tensor, c: dict, last_order: int) -> torch.Tensor:
        m_prev = self.x0_history[-1]
        x = c["c_ratio"] * self.last_sample - c["c_ae"] * m_prev
        if last_order == 1:
            return x - c["c_ab"] * (0.5 * (x0 - m_prev))
        d1 = (self.x0_history[-2] - m_prev) / c["c_r"]
        return x - c["c_ab"] * (c["rho0"] * d1 + c["rho1"] * (x0 - m_prev))


# Per step k: sigma_k; the predictor's sigma ratio, alpha * expm1(-h), alpha * B(h) and r (order 2); the corrector's
# (for the move that ended at step k) the same, and its two rho weights (order 2).
COLUMNS = ("sigma", "ratio", "ae", "ab", "r", "c_ratio", "c_ae", "c_ab", "c_r", "rho0", "rho1")


def _unipc_table(schedule: Schedule, orders: list[int]) -> torch.Tensor:
    sigmas, bh1 = schedule.sigmas, schedule.solver_type == "bh1"

    def move(to: int, start: int):
        """alpha(sigma_to) * expm1(-h), alpha * B(h), h and expm1(-h) for the move sigma_start -> sigma_to."""
        h = _lambda(sigmas[to]) - _lambda(sigmas[start])
        e = torch.expm1(-h)
        b = -h if bh1 else e
        alpha = 1 - sigmas[to]
        return alpha * e, alpha * b, h, e

    rows = []
    zero = torch.zeros((), dtype=torch.float32)
    for k in range(len(schedule)):
        c = dict.fromkeys(COLUMNS, zero)
        c["sigma"] = sigmas[k]
        c["ratio"] = sigmas[k + 1] / sigmas[k]
        c["ae"], c["ab"], h, _ = move(k + 1, k)
        if orders[k] == 2:
            c["r"] = (_lambda(sigmas[k - 1]) - _lambda(sigmas[k])) / h
        if k > 0:
            c["c_ratio"] = sigmas[k] / sigmas[k - 1]
            c["c_ae"], c["c_ab"], h, e = move(k, k - 1)
            if orders[k - 1] == 2:
                c["c_r"] = r = (_lambda(sigmas[k - 2]) - _lambda(sigmas[k - 1])) / h
                hh = -h
                b = hh if bh1 else e
                phi = e / hh - 1
                b1, b2 = phi / b, (phi / hh - 0.5) * 2 / b
                # The reference solves this 2x2 system with LU; the closed form differs in the last bit.
                one = torch.ones_like(r)
                c["rho0"], c["rho1"] = torch.linalg.solve(torch.stack([torch.stack([one, one]), torch.stack([r, one])]),
                                                          torch.stack([b1, b2])).unbind()
        rows.append(torch.stack([c[name].float() for name in COLUMNS]))
    return torch.stack(rows)


class FlowEuler:
    """Distilled step: Euler (x + (s' - s) v) or, with `stochastic`, SDE (x0 = x - s v, then re-noise to s'). Its
    sigmas go to the samples' device once."""

    def __init__(self, schedule: Schedule):
        self.schedule = schedule
        self.index = 0
        sigmas = schedule.sigmas
        # per step: sigma, sigma' - sigma, 1 - sigma', sigma'
        self.table = torch.stack([sigmas[:-1], sigmas[1:] - sigmas[:-1], 1.0 - sigmas[1:], sigmas[1:]], dim=1)

    def step(self, velocity: torch.Tensor, sample: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        if self.table.device != sample.device:
            self.table = self.table.to(sample.device)
        sigma, delta, keep, sigma_next = self.table[self.index].unbind()
        self.index += 1
        if not self.schedule.stochastic:
            return sample + delta * velocity
        x0 = sample - sigma * velocity
        noise = torch.randn(sample.shape, generator=generator, dtype=torch.float32).to(sample.device)
        return keep * x0 + sigma_next * noise


def stepper_for(schedule: Schedule) -> "UniPC | FlowEuler":
    """A fresh stepper for one run (and one modality) of `schedule`: `step(velocity, sample, generator=None)`."""
    return FlowEuler(schedule) if schedule.stepper == "euler" else UniPC(schedule)
