"""OpenAI-compatible HTTP endpoint (``edgespec serve``).

Contract: one model, one generation worker fed by a queue (``edgespec/worker.py``,
shared with the Python API); FastAPI routes that
validate, queue and answer in OpenAI's shapes (``app.py``, ``convert.py``, ``responses.py``);
every error mapped from its type in ``errors.py``. Importing this package loads fastapi;
``edgespec.server.cli`` does not, so the CLI starts without it.

    state = ServerState.start(ServerSettings(model="demo"))
    app = create_app(state)          # any ASGI server; ``edgespec serve`` uses uvicorn
"""

from .app import create_app
from .state import ServerSettings, ServerState

__all__ = ["ServerSettings", "ServerState", "create_app"]
