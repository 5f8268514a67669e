"""Ray Serve deployment of the registered tokenizer: ``/tokenize``, ``/detokenize``, ``/tokenizer``.

Every route needs ``Authorization: Bearer <token>`` (:mod:`fedfraud.serving.auth`; ``args.auth`` says where the
replica reads the token). The POST routes take the raw :class:`Request` and read the body themselves, capped at
``max_body_bytes`` (:func:`fedfraud.serving.http_body.read_capped_body`), after the token check: a pydantic body
parameter would be read and parsed before any dependency ran.

(No ``from __future__ import annotations`` here: FastAPI must see the real request types.)
Self-contained so the main serving app can mount it: build it with
:func:`build_tokenizer_app` (typed args, FastAPI ingress). Requests from many
clients are grouped with ``@serve.batch`` and encoded with one
``encode_batch`` call. A background task polls the registry and swaps in a
newly published version with one reference assignment, so a request sees either
the old or the new tokenizer, never a mix.
"""


import asyncio
import logging
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from ray import serve
from ray.serve import Application
from tokenizers import Tokenizer

from fedfraud.serving.auth import BearerAuth, api_token, require_bearer
from fedfraud.serving.config import AuthSettings
from fedfraud.serving.follow import moved
from fedfraud.serving.http_body import read_capped_body
from fedfraud.serving.grpc_bind import confine_replica_grpc
from fedfraud.training.registry import ModelRegistry, ModelVersion
from fedfraud.training.tokenizer.export import TOKENIZER_FILE

__all__ = [
    "TokenizerServiceArgs",
    "TokenizeRequest",
    "TokenizeResponse",
    "DetokenizeRequest",
    "TokenizerService",
    "build_tokenizer_app",
]

log = logging.getLogger(__name__)
KIND = "tokenizer"


class TokenizerServiceArgs(BaseModel):
    """Arguments of the tokenizer application (``fedfraud.serving.tokenizer_service:build_tokenizer_app``)."""

    model_config = ConfigDict(extra="forbid")

    registry_root: str = Field(..., description="model registry folder")
    version: str = Field("latest", description="'latest' follows new versions; 'v3' or '3' pins one")
    poll_seconds: float = Field(2.0, gt=0, description="how often to look for a newer version")
    max_batch_size: int = Field(256, ge=1, description="texts encoded together by @serve.batch")
    batch_wait_timeout_s: float = Field(0.002, ge=0)
    max_texts_per_request: int = Field(4096, ge=1)
    max_chars_per_request: int = Field(
        1_000_000, ge=1, description="total characters of one request; a 10 MB text cost 14 s of CPU (issue 14)"
    )
    max_body_bytes: int = Field(
        1 << 20, ge=1024, description="POST bodies larger than this get 413 before they are read "
        "(serving.guards.http_max_body_bytes where the CLI or the runtime starts the service)")
    num_replicas: int = Field(1, ge=1)
    auth: AuthSettings = Field(default_factory=AuthSettings, description="where replicas read the API token")


class TokenizeRequest(BaseModel):
    texts: list[str] = Field(..., min_length=1)
    add_special_tokens: bool = False


class TokenizedText(BaseModel):
    ids: list[int]
    tokens: list[str]


class TokenizeResponse(BaseModel):
    version: int
    results: list[TokenizedText]


class DetokenizeRequest(BaseModel):
    ids: list[list[int]] = Field(..., min_length=1)
    skip_special_tokens: bool = False


class DetokenizeResponse(BaseModel):
    version: int
    texts: list[str]


_Body = TypeVar("_Body", TokenizeRequest, DetokenizeRequest)


@dataclass(frozen=True)
class _Loaded:
    version: ModelVersion
    tokenizer: Tokenizer


def _load(registry: ModelRegistry, version: str) -> _Loaded:
    found = registry.get(KIND, version)
    return _Loaded(found, Tokenizer.from_file(str(found.file(TOKENIZER_FILE))))


api = FastAPI(title="fedfraud tokenizer")


@serve.deployment(ray_actor_options={"num_cpus": 0.5})
@serve.ingress(api)
class TokenizerService:
    """Serves the current registry version of the federated tokenizer and follows new versions."""

    def __init__(self, args: dict[str, Any]) -> None:
        confine_replica_grpc()  # before Serve opens this replica's gRPC server on [::] (serving/grpc_bind.py)
        self.args = TokenizerServiceArgs.model_validate(args)
        self.bearer = BearerAuth.from_settings(self.args.auth)
        self.registry = ModelRegistry(self.args.registry_root)
        self.current = _load(self.registry, self.args.version)
        self._encode.set_max_batch_size(self.args.max_batch_size)
        self._encode.set_batch_wait_timeout_s(self.args.batch_wait_timeout_s)
        self._watcher: asyncio.Task | None = None
        log.info("tokenizer service loaded %s", self.current.version.tag)

    def _ensure_watcher(self) -> None:
        if self._watcher is None and self.args.version == "latest":
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        """Poll the registry; publish is an atomic rename, so a listed version is complete."""
        while True:
            await asyncio.sleep(self.args.poll_seconds)
            try:
                changed = moved(self.registry, {KIND: self.args.version}, {KIND: self.current.version.tag})
                if KIND in changed:
                    loaded = await asyncio.to_thread(_load, self.registry, str(changed[KIND].version))
                    self.current = loaded  # the swap: one reference assignment
                    log.info("tokenizer service reloaded %s", loaded.version.tag)
            except Exception:  # keep serving the old version if a new one cannot be read
                log.exception("tokenizer reload failed; keeping %s", self.current.version.tag)

    @serve.batch(max_batch_size=256, batch_wait_timeout_s=0.002)
    async def _encode(self, items: list[tuple[str, bool]]) -> list[tuple[int, list[int], list[str]]]:
        loaded = self.current
        plain = [t for t, special in items if not special]
        with_special = [t for t, special in items if special]
        tok = loaded.tokenizer
        encs = iter(tok.encode_batch(plain, add_special_tokens=False) if plain else [])
        encs_sp = iter(tok.encode_batch(with_special, add_special_tokens=True) if with_special else [])
        out = []
        for _, special in items:
            enc = next(encs_sp) if special else next(encs)
            out.append((loaded.version.version, enc.ids, enc.tokens))
        return out

    async def _body(self, request: Request, model: type[_Body]) -> _Body:
        """The request body as ``model``: 413 past ``max_body_bytes`` (before reading beyond it), 422 if invalid."""
        raw = await read_capped_body(request, self.args.max_body_bytes)
        try:
            return model.model_validate_json(raw)
        except ValidationError as exc:
            raise RequestValidationError(exc.errors(include_url=False, include_context=False, include_input=False),
                                         body=None) from None

    @api.post("/tokenize", dependencies=[Depends(require_bearer)])
    async def tokenize(self, request: Request) -> TokenizeResponse:
        """Batch of texts -> token ids and token strings (byte-level alphabet); body: :class:`TokenizeRequest`."""
        req = await self._body(request, TokenizeRequest)
        self._ensure_watcher()
        if len(req.texts) > self.args.max_texts_per_request:
            raise HTTPException(413, f"at most {self.args.max_texts_per_request} texts per request")
        chars = sum(len(t) for t in req.texts)
        if chars > self.args.max_chars_per_request:
            raise HTTPException(413, f"{chars} characters; at most {self.args.max_chars_per_request} per request")
        encoded = await asyncio.gather(*(self._encode((t, req.add_special_tokens)) for t in req.texts))
        return TokenizeResponse(
            version=min(v for v, _, _ in encoded),
            results=[TokenizedText(ids=ids, tokens=toks) for _, ids, toks in encoded],
        )

    @api.post("/detokenize", dependencies=[Depends(require_bearer)])
    async def detokenize(self, request: Request) -> DetokenizeResponse:
        """Token ids -> text (lossless for ids produced by /tokenize of the same version); body:
        :class:`DetokenizeRequest`.
        """
        req = await self._body(request, DetokenizeRequest)
        self._ensure_watcher()
        loaded = self.current
        size = loaded.tokenizer.get_vocab_size()
        for seq in req.ids:
            bad = [i for i in seq if not 0 <= i < size]
            if bad:
                raise HTTPException(422, f"token id {bad[0]} outside vocabulary of size {size}")
        texts = loaded.tokenizer.decode_batch(req.ids, skip_special_tokens=req.skip_special_tokens)
        return DetokenizeResponse(version=loaded.version.version, texts=texts)

    @api.get("/tokenizer", dependencies=[Depends(require_bearer)])
    async def info(self) -> dict[str, Any]:
        """Version, vocabulary size and the privacy parameters recorded at training time."""
        self._ensure_watcher()
        v = self.current.version
        return {
            "kind": v.kind,
            "version": v.version,
            "tag": v.tag,
            "created_at": v.created_at,
            "vocab_size": self.current.tokenizer.get_vocab_size(),
            "privacy": v.privacy,
            "metrics": v.metrics,
        }


def build_tokenizer_app(args: TokenizerServiceArgs) -> Application:
    """Typed builder (STYLE §7): the tokenizer deployment bound to its arguments."""
    if isinstance(args, dict):  # ``serve run`` passes the YAML args as a dict
        args = TokenizerServiceArgs.model_validate(args)
    api_token(args.auth)  # fail fast, one line, if no API token is configured
    ModelRegistry(args.registry_root).get(KIND, args.version)  # ... and if nothing is registered
    return TokenizerService.options(num_replicas=args.num_replicas).bind(args.model_dump())
