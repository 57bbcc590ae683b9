"""An OpenAI-compatible HTTP server around one ``SpeculativeDecoder`` (``quickdraft serve``).

``quickdraft.server.app.create_app(decoder, ServerConfig(...))`` builds the ASGI app. It needs
the ``server`` extra (fastapi, uvicorn, prometheus-client), imported only when a server is built,
so the rest of the command line works without them. See docs/server.md.
"""
