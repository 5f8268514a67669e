"""Building and running the console from the project's one config: its parts, and uvicorn in a thread.

``fedfraud console``, the bench and the tests all come through :func:`open_console`, so what they run is the
same app over the same readers.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedfraud.console.cases import CaseBuilder
from fedfraud.console.index import OffsetReader, TopicIndex
from fedfraud.console.labels import LabelWriter
from fedfraud.core.net import host_port
from fedfraud.console.web import Console, create_app
from fedfraud.core.errors import UserError

if TYPE_CHECKING:
    from fedfraud.config import FedfraudConfig

__all__ = ["ConsoleServer", "close_console", "console_token", "open_console"]

log = logging.getLogger(__name__)


def console_token(cfg: FedfraudConfig) -> str:
    """The scorer's API token; the console never runs open (one line naming where the token is read from)."""
    from fedfraud.serving.auth import api_token

    if cfg.serving.auth.disabled:
        raise UserError("the console always needs the API token: serving.auth.disabled (--insecure-no-auth) does "
                        "not apply to it; set $FEDFRAUD_API_TOKEN or serving.auth.token_file")
    token = api_token(cfg.serving.auth)
    if token is None:  # api_token returns None only when disabled, refused above
        raise UserError("no API token")
    return token


def open_console(cfg: FedfraudConfig, bootstrap_servers: str, audit_log: Path, registry: Path | None = None,
                 repo: Path | None = None, history: int | None = None, wait_s: float = 60.0,
                 token: str | None = None) -> Console:
    """The console's parts on ``bootstrap_servers``: the index (started, and caught up with what the topics
    held when it started, within ``wait_s``), the offset reader, the label writer, the case builder over the
    online store of ``repo`` (default ``features.repo_dir``; left out with a note when it is not applied) and
    the registry (default ``serving.registry_root``).
    """
    s = cfg.serving
    token = token if token is not None else console_token(cfg)
    index = TopicIndex(bootstrap_servers, s.topics, s.kafka_security, default_bank=s.bank_id, history=history).start()
    reader = OffsetReader(bootstrap_servers, (s.topics.decisions, s.topics.transactions), s.kafka_security)
    labels = LabelWriter(bootstrap_servers, audit_log, s.topics, s.producer, s.kafka_security)
    registry_root = Path(registry if registry is not None else s.registry_root)
    client, featurizer, note = _store(cfg, repo)
    from fedfraud.training.registry import ModelRegistry

    cases = CaseBuilder(index, reader, client, featurizer, ModelRegistry(registry_root) if registry_root.is_dir()
                        else None, s.bank_id, note)
    if not index.wait_caught_up(wait_s):
        log.warning("console: the index has not caught up with the topics after %.0f s; serving what it has", wait_s)
    return Console(index=index, cases=cases, labels=labels, registry_root=registry_root, token=token,
                   drift_min_rows=cfg.retrain.drift_min_rows)


def _store(cfg: FedfraudConfig, repo: Path | None) -> tuple[Any, Any, str]:
    """The online-state client and the bank's featurizer, or (None, None, why) when the repo is not applied."""
    from fedfraud.feature_store.online import OnlineStateClient
    from fedfraud.feature_store.privacy import PrivateFeaturizer

    folder = Path(repo if repo is not None else cfg.features.repo_dir)
    if not folder.is_dir():  # opening renders the repo: no folder is made for a console that has no store
        log.warning("console: no feature repo at %s; cases show no ego graph", folder)
        return None, None, f"no feature repo at {folder} (fedfraud features apply)"
    try:
        client = OnlineStateClient.open(cfg.features, cfg.egograph, folder)
    except (UserError, OSError) as exc:
        log.warning("console: no online store (%s); cases show no ego graph", exc)
        return None, None, f"no online store: {exc}"
    return client, PrivateFeaturizer.for_bank(cfg.encoder, cfg.privacy, cfg.serving.bank_id), ""


def close_console(console: Console) -> None:
    """Stop the index's reader and close the Kafka clients."""
    console.index.stop()
    console.cases.reader.close()
    console.labels.close()


@dataclass
class ConsoleServer:
    """uvicorn serving a console app in a thread of this process (the CLI's foreground, the bench, the tests)."""

    console: Console
    host: str = "127.0.0.1"
    port: int = 8600

    def __post_init__(self) -> None:
        import uvicorn

        self.app = create_app(self.console)
        config = uvicorn.Config(self.app, host=self.host, port=self.port, log_level="warning",
                                access_log=False, lifespan="off", ws="none")
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{host_port(self.host, self.port)}"

    def start(self, timeout_s: float = 20.0) -> ConsoleServer:
        self._thread = threading.Thread(target=self._server.run, name="console-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise UserError(f"the console could not listen on {self.host}:{self.port}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
