"""The Tether console: an HTTP API and web pages over one store (``tether serve``).

``create_app(ConsoleConfig(...))`` builds the ASGI application; it needs the ``server`` extra
(``pip install 'tether[server]'``). The console reads and acts only through ``tether.client.Tether``
and the store's public reads.
"""

from __future__ import annotations

from tether.console.app import create_app
from tether.console.auth import ConsoleConfig

__all__ = ["ConsoleConfig", "create_app"]
