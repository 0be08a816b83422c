"""What callers rely on from a loaded generator (`runner.Runner`): the pipeline in this process and the worker pool
both offer every method it names, with parameters that take what callers pass."""

import inspect

import pytest

from cosmos3_runtime.errors import InputError
from cosmos3_runtime.pipeline import Cosmos3Pipeline
from cosmos3_runtime.runner import Runner
from cosmos3_runtime.workers import WorkerPool

METHODS = [name for name, value in vars(Runner).items() if callable(value) and not name.startswith("_")]


def test_the_protocol_names_what_callers_use():
    assert {"plan", "generate", "session", "decode", "encode", "raw_latents"} <= set(METHODS)


def test_the_worker_pool_refuses_a_session_by_name():
    """A session's history lives between ticks in one process: the pool says so before it touches a worker."""
    with pytest.raises(InputError, match="sessions run in one process: load the model on one GPU"):
        WorkerPool.session(object.__new__(WorkerPool), "the robot folds a towel")


@pytest.mark.parametrize("runner, local", [(Cosmos3Pipeline, True), (WorkerPool, False)])
@pytest.mark.parametrize("name", METHODS)
def test_each_runner_takes_every_call_the_protocol_names(runner, local, name):
    assert runner.local is local
    wanted, offered = inspect.signature(getattr(Runner, name)), inspect.signature(getattr(runner, name))
    takes_any = any(p.kind is p.VAR_KEYWORD for p in offered.parameters.values())
    for parameter in wanted.parameters.values():
        if parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
            assert any(p.kind is parameter.kind for p in offered.parameters.values()), (name, parameter)
        else:
            assert parameter.name in offered.parameters or takes_any, (name, parameter.name)
    assert isinstance(getattr(runner, "variant"), property)
