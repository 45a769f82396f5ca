"""Tether: durable workflow runs for Python."""

from tether.errors import TetherError
from tether.store import Store, open_store

__all__ = ["Store", "TetherError", "open_store"]
__version__ = "0.1.0"
