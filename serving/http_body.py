"""Reading an HTTP request body with a cap, so a client cannot make a replica buffer more than the config allows.

Every POST route that takes a body (``/score``, ``/tokenize``, ``/detokenize``) reads it through
:func:`read_capped_body` *inside* the handler, after the bearer-token dependency has run: a route with a pydantic
body parameter would have FastAPI read and parse the whole body before any dependency (``fastapi.routing``
reads the body, then solves the dependencies), so an unauthenticated client could make it buffer anything.
"""

from __future__ import annotations

import logging

from fastapi import HTTPException, Request

__all__ = ["HARD_BODY_CAP", "read_capped_body"]

log = logging.getLogger(__name__)

#: No configuration may let a body past this size (a configured cap above it is lowered to it).
HARD_BODY_CAP = 64 << 20


async def read_capped_body(request: Request, limit: int) -> bytes:
    """The raw body, or 413 before a byte past ``limit`` (the configured cap; never above :data:`HARD_BODY_CAP`).

    Why both checks: a declared ``Content-Length`` over the cap is refused without reading anything, and a body
    without one (chunked) or lying about it is read chunk by chunk and refused as soon as it passes the cap, so
    at most one chunk beyond ``limit`` is ever held. A ``Content-Length`` that is not a number is a 400.
    """
    cap = min(int(limit), HARD_BODY_CAP)
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise HTTPException(400, "Content-Length is not a number")
        if int(declared) > cap:
            raise HTTPException(413, f"body over {cap} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise HTTPException(413, f"body over {cap} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
