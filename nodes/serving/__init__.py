"""Serving Cosmos3 to programs on ComfyUI's server: actions to robot clients, the Reasoner to chat clients.

- `requests`: the request and answer shapes every transport shares (SGLang's action envelope).
- `http`: `POST /cosmos3/v1/actions/generations` (JSON, msgpack, multipart) and `GET .../metadata`.
- `realtime`: `WS /cosmos3/v1/actions/realtime`, SGLang's msgpack websocket.
- `openpi`: `WS /cosmos3/openpi/policy`, the openpi protocol DROID clients speak.
- `sessions`: the websocket session both websockets run; `graph`: the queued graph every request becomes.
- `msgpack_numpy`: msgpack with numpy arrays.
- `chat`: `POST /cosmos3/v1/chat/completions` and `GET /cosmos3/v1/models`, the Reasoner for OpenAI-style clients.
- `ticks`: `POST /cosmos3/v1/sessions/ticks`, Sim-Bimanual sessions driven one action chunk at a time with
  vLLM-Omni's typed tick.
- `session_registry`: the sessions open on the server whatever drives them (one per checkpoint, chunks in order,
  retries, idle timeout) and `DELETE /cosmos3/v1/sessions/{id}`.
Every route is also served under /api, as ComfyUI mirrors its routes.
"""

from .. import services
from .chat import Cosmos3APIChat
from .graph import Cosmos3APIObservation, Cosmos3APIResult
from .ticks import Cosmos3APISessionTick


def register_routes() -> bool:
    """Add the routes to ComfyUI's server (False outside it)."""
    from . import chat, http, openpi, realtime, session_registry, ticks

    server = services.prompt_server()
    if server is None:
        return False
    server.routes.post(http.ROUTE)(http.generations)
    server.routes.get(http.METADATA_ROUTE)(http.metadata_route)
    server.routes.get(realtime.ROUTE)(realtime.realtime)
    server.routes.get(openpi.ROUTE)(openpi.policy)
    server.routes.post(chat.ROUTE)(chat.completions)
    server.routes.get(chat.MODELS_ROUTE)(chat.models_route)
    server.routes.post(ticks.ROUTE)(ticks.ticks)
    server.routes.delete(session_registry.CLOSE_ROUTE)(session_registry.close)
    return True


__all__ = ["Cosmos3APIChat", "Cosmos3APIObservation", "Cosmos3APIResult", "Cosmos3APISessionTick", "register_routes"]
