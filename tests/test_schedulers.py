"""Schedules and steppers against diffusers' schedulers directly (synthetic velocities, no model)."""

import numpy as np
import pytest
from conftest import require
import torch

from cosmos3_runtime.schedulers import FlowEuler, UniPC, checkpoint_schedule, distilled_schedule, unipc_schedule
from cosmos3_runtime.tiny import DISTILLED_SCHEDULER, DISTILLED_SIGMAS, UNIPC_SCHEDULER

diffusers = require("diffusers", minversion="0.42.1")
from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler  # noqa: E402

FLOW = {**UNIPC_SCHEDULER, "use_karras_sigmas": False}


def reference_unipc(config, steps, native=False):
    scheduler = UniPCMultistepScheduler.from_config(config)
    sigmas = np.linspace(1.0 - 1.0 / 1000, 0.0, steps + 1)[:-1] if native else None
    scheduler.set_timesteps(steps, sigmas=sigmas)
    return scheduler


CASES = [
    ("karras", UNIPC_SCHEDULER, None, False),
    ("flow shift 10", {**FLOW, "flow_shift": 10.0}, None, False),
    ("flow shift 3", {**FLOW, "flow_shift": 3.0}, None, False),
    ("flow shift 1 (s0 nudged)", FLOW, None, False),
    ("native flow shift 5", {**FLOW, "flow_shift": 5.0}, None, True),
    ("karras from the beta table", {**UNIPC_SCHEDULER, "sigma_min": None, "sigma_max": None}, None, False),
    ("bh1, final sigma_min", {**FLOW, "flow_shift": 5.0, "solver_type": "bh1", "final_sigmas_type": "sigma_min"},
     None, False),
]


@pytest.mark.parametrize("steps", [1, 2, 4, 35, 50])
@pytest.mark.parametrize("name, config, shift, native", CASES, ids=[c[0] for c in CASES])
def test_checkpoint_schedule_grid_equals_diffusers(name, config, shift, native, steps):
    expected = reference_unipc(config, steps, native)
    got = checkpoint_schedule(config, steps, shift, native)
    assert torch.equal(got.timesteps, expected.timesteps)
    assert torch.equal(got.sigmas, expected.sigmas)


def test_documented_timesteps():
    assert checkpoint_schedule(UNIPC_SCHEDULER, 4).timesteps.tolist() == [995, 973, 798, 128]
    assert unipc_schedule(4, 10.0).timesteps.tolist() == [999, 967, 909, 769]
    t = unipc_schedule(35, 10.0).timesteps.tolist()
    assert t[:3] == [999, 997, 993] and t[-3:] == [486, 381, 233]
    assert checkpoint_schedule({**FLOW, "flow_shift": 10.0}, 4, native_flow=True).timesteps.tolist() == [999, 967, 908, 768]


def test_flow_shift_overrides_the_config_but_not_karras():
    assert torch.equal(checkpoint_schedule(FLOW, 8, 10.0).sigmas, unipc_schedule(8, 10.0).sigmas)
    assert torch.equal(checkpoint_schedule(UNIPC_SCHEDULER, 8, 10.0).sigmas, checkpoint_schedule(UNIPC_SCHEDULER, 8).sigmas)


@pytest.mark.parametrize("steps", [1, 2, 3, 6, 12])
@pytest.mark.parametrize("name, config, shift, native", CASES, ids=[c[0] for c in CASES])
def test_unipc_steps_equal_diffusers(name, config, shift, native, steps):
    """A whole run with velocities that depend on the sample, so every corrector/predictor path is used."""
    reference = reference_unipc(config, steps, native)
    ours = UniPC(checkpoint_schedule(config, steps, shift, native))
    g = torch.Generator().manual_seed(steps)
    weights = torch.randn(2, 3, 4, 5, generator=g)
    x_ref = x_ours = torch.randn(1, 2, 3, 4, 5, generator=g)
    for t in reference.timesteps:
        v_ref, v_ours = torch.tanh(x_ref * weights), torch.tanh(x_ours * weights)
        x_ref = reference.step(v_ref.unsqueeze(0), t, x_ref.unsqueeze(0), return_dict=False)[0].squeeze(0)
        x_ours = ours.step(v_ours, x_ours)
    assert x_ref.abs().max() > 0.1
    assert torch.equal(x_ours, x_ref)


@pytest.mark.parametrize("stochastic", [True, False])
def test_distilled_steps_equal_diffusers(stochastic):
    config = {**DISTILLED_SCHEDULER, "stochastic_sampling": stochastic}
    reference = FlowMatchEulerDiscreteScheduler.from_config(config)
    reference.set_timesteps(sigmas=DISTILLED_SIGMAS)
    schedule = distilled_schedule(tuple(DISTILLED_SIGMAS), stochastic)
    assert torch.equal(schedule.timesteps, reference.timesteps) and torch.equal(schedule.sigmas, reference.sigmas)
    ours = FlowEuler(schedule)
    g_ref, g_ours = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    x_ref = x_ours = torch.randn(1, 2, 3, 4, 5, generator=torch.Generator().manual_seed(1))
    for t in reference.timesteps:
        x_ref = reference.step(torch.sin(x_ref).unsqueeze(0), t, x_ref.unsqueeze(0), generator=g_ref,
                               return_dict=False)[0].squeeze(0)
        x_ours = ours.step(torch.sin(x_ours), x_ours, g_ours)
    assert torch.equal(x_ours, x_ref)
    assert torch.equal(g_ours.get_state(), g_ref.get_state())  # the same number of draws


def test_unsupported_scheduler_options_are_errors():
    from cosmos3_runtime import CheckpointError

    with pytest.raises(CheckpointError, match="thresholding=True is not supported"):
        checkpoint_schedule({**UNIPC_SCHEDULER, "thresholding": True}, 4)
    with pytest.raises(CheckpointError, match="solver_order 3 is not supported"):
        checkpoint_schedule({**UNIPC_SCHEDULER, "solver_order": 3}, 4)
    with pytest.raises(CheckpointError, match="needs a UniPCMultistepScheduler or FlowMatchEulerDiscreteScheduler"):
        checkpoint_schedule({"_class_name": "DDIMScheduler"}, 4)
    with pytest.raises(CheckpointError, match="use_dynamic_shifting=True is not supported"):
        checkpoint_schedule({**DISTILLED_SCHEDULER, "use_dynamic_shifting": True}, 4)
    checkpoint_schedule({**UNIPC_SCHEDULER, "a_key_from_the_future": 1}, 4)  # unknown keys are ignored


@pytest.mark.parametrize("shift, native", [(1.0, False), (3.0, False), (5.0, True)])
def test_multi_step_flow_match_grid_equals_diffusers(shift, native):
    """A FlowMatch Euler checkpoint with no fixed sigmas: set_timesteps(n) (or the native grid) as diffusers runs it."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    config = {k: v for k, v in DISTILLED_SCHEDULER.items() if not k.startswith("fixed_step")}
    config.update(shift=shift, stochastic_sampling=False)
    reference = FlowMatchEulerDiscreteScheduler.from_config(config)
    steps = 7
    if native:
        reference.set_timesteps(steps, sigmas=np.linspace(1 - 1 / 1000, 0, steps + 1)[:-1])
    else:
        reference.set_timesteps(steps)
    ours = checkpoint_schedule({**config, "_class_name": "FlowMatchEulerDiscreteScheduler"}, steps, native_flow=native)
    assert ours.stepper == "euler" and not ours.stochastic
    assert torch.equal(ours.sigmas, reference.sigmas) and torch.equal(ours.timesteps, reference.timesteps)


@pytest.mark.parametrize("make", [lambda: UniPC(unipc_schedule(6, 5.0)),
                                  lambda: UniPC(checkpoint_schedule({**FLOW, "solver_type": "bh1"}, 6)),
                                  lambda: FlowEuler(distilled_schedule(tuple(DISTILLED_SIGMAS), False))],
                         ids=["unipc bh2", "unipc bh1", "euler"])
def test_a_step_copies_and_solves_nothing(make):
    """A stepper's coefficients depend on the schedule alone: computed once on the CPU (as the reference does) and
    moved to the samples' device with the first step (the meta device stands in for a GPU here); every later step
    only combines tensors there. Before: the sigmas copied to the device at every step, and a 2x2 solve whose
    error check waits for the GPU."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(func.__name__)
            return func(*args, **(kwargs or {}))

    stepper = make()
    x = torch.empty(1, 48, 2, 4, 4, device="meta")
    per_step = []
    for _ in range(len(stepper.schedule)):
        with Ops() as ops:
            x = stepper.step(torch.empty_like(x), x)
        per_step.append(ops.seen)
    later = {op for ops in per_step[1:] for op in ops}
    assert not later & {"_to_copy.default", "copy_.default", "_linalg_solve_ex.default", "_linalg_check_errors.default",
                        "_local_scalar_dense.default"}, later
