"""Serving Cosmos3 actions to robot clients on ComfyUI's server.

- `requests`: the request and answer shapes every transport shares (SGLang's action envelope).
- `http`: `POST /cosmos3/v1/actions/generations` (JSON, msgpack, multipart) and `GET .../metadata`.
- `realtime`: `WS /cosmos3/v1/actions/realtime`, SGLang's msgpack websocket.
- `openpi`: `WS /cosmos3/openpi/policy`, the openpi protocol DROID clients speak.
- `sessions`: the websocket session both websockets run; `graph`: the queued graph every request becomes.
- `msgpack_numpy`: msgpack with numpy arrays.
Every route is also served under /api, as ComfyUI mirrors its routes.
"""

from .. import services
from .graph import Cosmos3APIObservation, Cosmos3APIResult


def register_routes() -> bool:
    """Add the routes to ComfyUI's server (False outside it)."""
    from . import http, openpi, realtime

    server = services.prompt_server()
    if server is None:
        return False
    server.routes.post(http.ROUTE)(http.generations)
    server.routes.get(http.METADATA_ROUTE)(http.metadata_route)
    server.routes.get(realtime.ROUTE)(realtime.realtime)
    server.routes.get(openpi.ROUTE)(openpi.policy)
    return True


__all__ = ["Cosmos3APIObservation", "Cosmos3APIResult", "register_routes"]
