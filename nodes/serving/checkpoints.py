"""Which installed checkpoint serves a request.

In order: the checkpoint the request names (the body's `model`, an openpi observation's `model` key); the URL's
`?model=NAME` (a robot client that cannot add a key can carry it in its URI); the server's COSMOS3_ACTION_MODEL
environment variable (read at every request, so it can change without a restart); and last the one installed
checkpoint that can do the work, decided from its config files, never from its folder name: for actions, a
multi-step checkpoint whose transformer/config.json has an action head (`action_gen`). With several such
checkpoints and none of the other choices, the request is refused with a message naming every way to choose.
"""

import os
from dataclasses import dataclass

from ...cosmos3_runtime import Cosmos3Error
from ...cosmos3_runtime.checkpoint import detect_variant
from .fields import FieldError

ACTION_MODEL_ENV = "COSMOS3_ACTION_MODEL"
QUERY_KEY = "model"


@dataclass(frozen=True)
class Checkpoints:
    """The installed checkpoints (names as the loader lists them) and the server-side choice for a request."""

    names: tuple[str, ...]
    capable: tuple[str, ...]  # those that can serve the route, by their config files
    url_choice: str | None = None  # the URL's ?model=
    env: str = ACTION_MODEL_ENV
    capability: str = "an action head (action_gen in transformer/config.json)"
    unknown_status: int = 400  # of a request naming a checkpoint that is not installed

    @property
    def ways(self) -> str:
        return (f"name it in the request's `model` field (openpi: the observation's `model` key), add "
                f"?{QUERY_KEY}=NAME to the URL, or set {self.env} on the server; without them the one installed "
                f"checkpoint with {self.capability} serves")

    def default(self) -> str | None:
        """The checkpoint a request that names none gets (None: it must name one)."""
        try:
            return self.choose(None)
        except FieldError:
            return None

    def choose(self, name) -> str:
        """The checkpoint for a request's `model` value (None when it names none)."""
        if name is not None:
            return self._installed(name, "model", "")
        if self.url_choice:
            return self._installed(self.url_choice, "model", f"the URL's ?{QUERY_KEY}= ")
        if os.environ.get(self.env):
            return self._installed(os.environ[self.env], "model", f"{self.env} ")
        if len(self.capable) == 1:
            return self.capable[0]
        found = (f"{len(self.capable)} are installed: {', '.join(self.capable)}" if self.capable
                 else f"none is installed (installed: {', '.join(self.names) or 'none; put one in models/cosmos3'})")
        raise FieldError("model", f"this request names no checkpoint and no single one can serve it: {self.ways}, "
                                  f"and {found}")

    def _installed(self, name, where: str, source: str) -> str:
        if not isinstance(name, str) or name not in self.names:
            raise FieldError(where, f"{source}{name!r} is not an installed checkpoint; installed: "
                                    f"{', '.join(self.names) or 'none'}", self.unknown_status)
        return name


def installed(can, url_choice: str | None = None, **choice) -> Checkpoints:
    """The installed checkpoints, with those whose variant `can` serve the route (`choice`: its env variable and the
    capability it names, as `Checkpoints` takes them)."""
    from ..loader import checkpoint_names, checkpoint_path

    names = checkpoint_names()
    capable = []
    for name in names:
        try:
            variant = detect_variant(checkpoint_path(name))  # config files only, cached per folder
        except (Cosmos3Error, OSError):  # a broken folder serves nothing; naming it explains why
            continue
        if can(variant):
            capable.append(name)
    return Checkpoints(tuple(names), tuple(capable), url_choice or None, **choice)


def action_checkpoints(url_choice: str | None = None) -> Checkpoints:
    """The installed checkpoints, with those that can generate actions (multi-step, with an action head)."""
    return installed(lambda variant: variant.has_action and not variant.is_distilled, url_choice)


def named_in_url(request) -> str | None:
    """The checkpoint an aiohttp request's URL names (?model=NAME), if any."""
    return request.query.get(QUERY_KEY)


async def for_request(request) -> Checkpoints:
    """`action_checkpoints` for an aiohttp request, read off the event loop."""
    import asyncio

    return await asyncio.get_running_loop().run_in_executor(None, action_checkpoints, named_in_url(request))
