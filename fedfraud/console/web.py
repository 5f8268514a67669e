"""The console's web app: FastAPI routes, Jinja2 templates (autoescaped), htmx for the partial updates.

Authentication is the scorer's: the one API token (``$FEDFRAUD_API_TOKEN`` or ``serving.auth.token_file``),
checked by :class:`fedfraud.serving.auth.BearerAuth` in constant time. A script sends it as
``Authorization: Bearer``; a browser posts it once to ``/login`` and then carries it in an HttpOnly,
SameSite=Strict cookie. Without it every page but ``/login``, ``/healthz`` and ``/static`` answers 401 (the
login form); a wrong one 403. A POST authenticated by the cookie must also carry the form's CSRF field (an HMAC
of the token and the analyst's name), so another site cannot make a logged-in browser label.

The analyst's name (``source: analyst:<name>`` on the label) is typed at login, or sent as ``X-Analyst`` by a
script: with one shared token it is a declared name, not a proven identity (docs/console.md).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, PackageLoader, StrictUndefined
from starlette.concurrency import run_in_threadpool

from fedfraud.console.cases import CaseBuilder
from fedfraud.console.index import QueueFilter, TopicIndex, masked
from fedfraud.console.labels import LabelWriter, valid_analyst
from fedfraud.console.monitor import PSI_ACT, PSI_WATCH, DriftReferences, model_monitor
from fedfraud.core.errors import UserError
from fedfraud.serving.auth import BearerAuth
from fedfraud.serving.kafka import DeliveryError

__all__ = ["COOKIE", "USER_COOKIE", "Console", "create_app", "csrf_token"]

log = logging.getLogger(__name__)

COOKIE = "fedfraud_console_token"
USER_COOKIE = "fedfraud_console_user"
_MAX_FORM_BYTES = 8192
_MAX_ID = 256
_PAGE_SIZES = (25, 50, 100, 200)
_KINDS = ("anomaly", "fraud")
_DIGITS = re.compile(r"[0-9]{1,9}")
#: Sent with every answer. The pages load only their own script, style sheet and data: images (the drawings), post
#: only to themselves and may not be framed (clickjacking on the label buttons); htmx's eval, inline indicator
#: style and script-tag execution are switched off in base.html, so the policy needs no 'unsafe-*'.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@dataclass
class Console:
    """What the routes read and write: the index, the case builder, the label writer and the registry root.

    ``drift_min_rows``: the fewest decisions a PSI window of the Models page holds (the scorer's
    ``retrain.drift_min_rows``, so that both report PSI over at least as many rows).
    """

    index: TopicIndex
    cases: CaseBuilder
    labels: LabelWriter
    registry_root: Path | None
    token: str
    drift_min_rows: int = 500


def csrf_token(token: str, analyst: str) -> str:
    """The CSRF field of a logged-in browser's forms: an HMAC only the token's holder can compute."""
    return hmac.new(token.encode(), f"console-csrf:{analyst}".encode(), hashlib.sha256).hexdigest()


def _templates() -> Jinja2Templates:
    env = Environment(loader=PackageLoader("fedfraud.console", "templates"), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["fmt"] = _fmt
    env.filters["when"] = _when
    return Jinja2Templates(env=env)


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _when(us: int) -> str:
    from datetime import UTC, datetime

    if not us:
        return "–"
    return datetime.fromtimestamp(us / 1e6, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _float(name: str, raw: str | None) -> float | None:
    if raw is None or raw.strip() == "":
        return None
    if len(raw) > 32:
        raise HTTPException(422, f"{name} must be a number between 0 and 1")
    try:
        value = float(raw)
    except ValueError:
        raise HTTPException(422, f"{name} must be a number between 0 and 1") from None
    if not 0.0 <= value <= 1.0:  # NaN fails too
        raise HTTPException(422, f"{name} must be a number between 0 and 1")
    return value


def _int(name: str, raw: str | None, lo: int, hi: int, default: int | None) -> int | None:
    if raw is None or raw.strip() == "":
        return default
    # ASCII digits, a bounded count: str.isdigit() admits "²" (int() then raises) and int() refuses more than
    # 4300 digits; either was a 500
    if _DIGITS.fullmatch(raw.strip()) is None or not lo <= int(raw) <= hi:
        raise HTTPException(422, f"{name} must be a whole number from {lo} to {hi}")
    return int(raw)


def _text(name: str, raw: str | None, limit: int = 64) -> str | None:
    if raw is None or raw.strip() == "":
        return None
    if len(raw) > limit or not raw.isprintable():
        raise HTTPException(422, f"{name}: at most {limit} printable characters")
    return raw.strip()


def _queue_params(request: Request) -> tuple[QueueFilter, int, int, dict[str, str]]:
    """The queue's filters and page from the query string; 422 for a bad value (never a 500)."""
    q = request.query_params
    decision = q.get("decision") or "fraud"
    if decision not in ("fraud", "legit", "any"):
        raise HTTPException(422, "decision must be fraud, legit or any")
    flt = QueueFilter(bank=_int("bank", q.get("bank"), 0, 1_000_000, None),
                      min_score=_float("min_score", q.get("min_score")),
                      max_score=_float("max_score", q.get("max_score")),
                      reason=_text("reason", q.get("reason")), model=_text("model", q.get("model")),
                      decision=None if decision == "any" else decision)
    page = _int("page", q.get("page"), 1, 1_000_000, 1) or 1
    size = _int("size", q.get("size"), 1, 1000, 50) or 50
    if size not in _PAGE_SIZES:
        raise HTTPException(422, f"size must be one of {', '.join(map(str, _PAGE_SIZES))}")
    kept = {k: q[k] for k in ("bank", "min_score", "max_score", "reason", "model", "decision", "size")
            if q.get(k)}
    return flt, page, size, kept


def _transaction_id(raw: str) -> str:
    if not raw or len(raw) > _MAX_ID or not raw.isprintable():
        raise HTTPException(404, "no such decision")
    return raw


async def _form(request: Request) -> dict[str, str]:
    """A small urlencoded form (what a browser and htmx post), read with a cap: 413 past it."""
    declared = request.headers.get("content-length")
    if declared is not None and (_DIGITS.fullmatch(declared) is None or int(declared) > _MAX_FORM_BYTES):
        raise HTTPException(413, "form too large")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > _MAX_FORM_BYTES:
            raise HTTPException(413, "form too large")
    try:
        parsed = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=16)
    except (UnicodeDecodeError, ValueError):
        raise HTTPException(422, "the form is not url-encoded UTF-8") from None
    return {k: v[0] for k, v in parsed.items()}


def create_app(console: Console) -> FastAPI:
    """The console's FastAPI app over ``console``'s parts (the CLI and the tests build one each)."""
    app = FastAPI(title="fedfraud console", docs_url=None, redoc_url=None, openapi_url=None)
    templates = _templates()
    bearer = BearerAuth(console.token)
    references = DriftReferences(console.registry_root)
    app.mount("/static", StaticFiles(directory=str(Path(__file__).parent / "static")), name="static")

    def authenticate(request: Request) -> tuple[str, str | None]:
        """(how, analyst): ``header`` or ``cookie``; 401 without a token, 403 with a wrong one."""
        header = request.headers.get("authorization")
        if header:
            bearer.check(header)
            analyst = request.headers.get("x-analyst")
            return "header", analyst if analyst and valid_analyst(analyst) else None
        cookie = request.cookies.get(COOKIE)
        if cookie:
            bearer.check(f"Bearer {cookie}")
            analyst = request.cookies.get(USER_COOKIE)
            return "cookie", analyst if analyst and valid_analyst(analyst) else None
        bearer.check(None)  # raises 401
        raise HTTPException(401, "not authenticated")

    def page(request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
        how, analyst = getattr(request.state, "auth", (None, None))
        base = {"analyst": analyst, "csrf": csrf_token(console.token, analyst) if analyst else "",
                "index_error": console.index.error, "counts": console.index.counts()}
        return templates.TemplateResponse(request, name, {**base, **context}, status_code=status)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> Response:
        headers = getattr(exc, "headers", None)
        if exc.status_code in (401, 403):
            return templates.TemplateResponse(request, "login.html", {"error": "wrong token" if exc.status_code == 403
                                                                      else None, "analyst": None},
                                              status_code=exc.status_code, headers=headers)
        return templates.TemplateResponse(request, "error.html", {"status": exc.status_code, "detail": exc.detail,
                                                                  "analyst": None},
                                          status_code=exc.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        return templates.TemplateResponse(request, "error.html", {"status": 422, "detail": "invalid request",
                                                                  "analyst": None}, status_code=422)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok" if console.index.error is None else "index not reading"},
                            status_code=200 if console.index.error is None else 503)

    @app.get("/login")
    async def login_form(request: Request) -> Response:
        return templates.TemplateResponse(request, "login.html", {"error": None, "analyst": None})

    @app.post("/login")
    async def login(request: Request) -> Response:
        form = await _form(request)
        token, analyst = form.get("token", ""), form.get("analyst", "").strip()
        if not valid_analyst(analyst):
            return templates.TemplateResponse(request, "login.html", {
                "error": "name: letters, digits and ._@- only, at most 48 characters", "analyst": None},
                status_code=422)
        bearer.check(f"Bearer {token}")  # 401 empty, 403 wrong
        response = RedirectResponse("/", status_code=303)
        secure = request.url.scheme == "https"
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict", secure=secure, max_age=12 * 3600)
        response.set_cookie(USER_COOKIE, analyst, httponly=True, samesite="strict", secure=secure, max_age=12 * 3600)
        return response

    @app.post("/logout")
    async def logout(request: Request) -> Response:
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE)
        response.delete_cookie(USER_COOKIE)
        return response

    @app.middleware("http")
    async def _auth(request: Request, call_next: Any) -> Response:
        path = request.url.path
        if path in ("/login", "/healthz") or path.startswith("/static/"):
            return await call_next(request)
        try:
            request.state.auth = authenticate(request)
        except HTTPException as exc:
            return await _http_error(request, exc)
        return await call_next(request)

    @app.middleware("http")
    async def _headers(request: Request, call_next: Any) -> Response:
        """Outermost (added last): the security headers on every answer, 401s and errors included; pages that
        show cases are not cached (``no-store``), the vendored static files are.
        """
        response: Response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        if not request.url.path.startswith("/static/"):
            response.headers["Cache-Control"] = "no-store"
        return response

    @app.get("/")
    async def queue(request: Request) -> Response:
        flt, number, size, kept = _queue_params(request)
        result = console.index.page(flt, number, size)
        context = {"page": result, "filters": kept, "facets": console.index.facets(),
                   "query": lambda **extra: urlencode({**kept, **{k: v for k, v in extra.items() if v is not None}})}
        if request.headers.get("hx-request"):
            return page(request, "_queue_table.html", context)
        return page(request, "queue.html", context)

    @app.get("/queue")
    async def queue_fragment(request: Request) -> Response:
        return await queue(request)

    @app.get("/case/{transaction_id:path}")
    async def case(request: Request, transaction_id: str) -> Response:
        found = console.cases.build(_transaction_id(transaction_id))
        if found is None:
            raise HTTPException(404, "no such decision")
        return page(request, "case.html", {"case": found})

    @app.post("/label/{transaction_id:path}")
    async def label(request: Request, transaction_id: str) -> Response:
        tx = _transaction_id(transaction_id)
        how, analyst = request.state.auth
        form = await _form(request)
        if analyst is None:
            raise HTTPException(400, "no analyst name: log in with one, or send X-Analyst")
        # bytes: compare_digest raises TypeError on a str with non-ASCII characters (a 500)
        sent = form.get("csrf", "").encode("utf-8", "replace")
        if how == "cookie" and not hmac.compare_digest(sent, csrf_token(console.token, analyst).encode()):
            raise HTTPException(403, "the form's CSRF field is missing or wrong; reload the page")
        verdict = form.get("label", "")
        if verdict not in ("fraud", "genuine"):
            raise HTTPException(422, "label must be fraud or genuine")
        if console.index.decision(tx) is None:
            raise HTTPException(404, "no such decision")
        try:
            done = console.labels.label(tx, verdict, analyst)
        except UserError as exc:
            raise HTTPException(422, str(exc)) from None
        except DeliveryError as exc:
            log.warning("console label not acknowledged: %s", exc)
            raise HTTPException(503, "the broker did not acknowledge the label; try again") from None
        context = {"done": done, "transaction_id": tx}
        if request.headers.get("hx-request"):
            return page(request, "_label_done.html", context)
        return page(request, "label_done.html", context)

    @app.get("/models")
    async def models(request: Request) -> Response:
        # off the event loop: the figures and their drawings take tens of milliseconds the queue should not wait
        monitor = await run_in_threadpool(model_monitor, console.index, references, console.drift_min_rows)
        return page(request, "models.html", {"kinds": _registry_view(console.registry_root), "monitor": monitor,
                                             "shadow_topic": console.index.shadow_topic,
                                             "psi_watch": PSI_WATCH, "psi_act": PSI_ACT})

    return app


def _registry_view(root: Path | None) -> list[dict[str, Any]]:
    """Per kind: versions with aliases and headline metrics, and the audit log newest first (read-only), its
    text masked like the topics' (an operator may paste a card number into a promotion's reason).
    """
    if root is None or not root.is_dir():
        return []
    from fedfraud.training.registry import ModelRegistry

    reg = ModelRegistry(root)
    out = []
    for kind in _KINDS:
        versions = reg.versions(kind)
        if not versions:
            continue
        aliases = reg.aliases(kind)
        champion = aliases.get("champion", versions[-1].version)
        rows = []
        for v in reversed(versions):
            tags = [a for a, n in aliases.items() if n == v.version]
            if "champion" not in aliases and v.version == champion:
                tags.append("champion (newest; none promoted)")
            metrics = {k: m for k, m in v.metrics.items() if isinstance(m, int | float) and not isinstance(m, bool)}
            rows.append({"version": v.version, "created_at": v.created_at, "aliases": tags,
                         "metrics": dict(list(metrics.items())[:6])})
        audit = [{"at": masked(e.get("at"), 64), "alias": masked(e.get("alias"), 64), "from": masked(e.get("from"), 64),
                  "to": masked(e.get("to"), 64), "actor": masked(e.get("actor"), 128),
                  "reason": masked(e.get("reason"), 1000),
                  "evidence": masked(json.dumps(e.get("evidence"), indent=1, sort_keys=True, default=str), 20_000)}
                 for e in list(reversed(reg.audit(kind)))[:200] if isinstance(e, dict)]
        out.append({"kind": kind, "champion": champion, "challenger": aliases.get("challenger"),
                    "versions": rows, "audit": audit})
    return out
