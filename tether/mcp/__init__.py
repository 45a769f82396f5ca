"""Workflows an agent can drive: Tether's tools over the Model Context Protocol (``tether mcp``).

``tether.mcp.tools`` is the catalogue (each tool's schema and its call through the client);
``tether.mcp.server`` serves it on stdio and needs the ``mcp`` extra (``pip install 'tether[mcp]'``).
"""
