"""A Flower ``Grid`` that delivers every message to a ClientApp in this process (the ``loopback`` engine).

The ServerApp's code (:func:`fedfraud.training.fraud.gnn.server_app.run_jobs`) and the ClientApp run unchanged;
each message and each reply is serialized to Flower's wire format and back, as over the SuperLink, so nothing
passes between server and bank that could not pass in a deployment. Banks run one after the other. What it saves
is Ray's start-up (about 20 s here) and its worker processes: tests, and studies on a 2-core machine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from uuid import uuid4

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.serverapp import Grid
from flwr.common import Error
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

__all__ = ["LoopbackGrid", "bank_contexts", "run_federated", "server_identity"]

logger = logging.getLogger(__name__)


@contextmanager
def server_identity(run_id: int = 1) -> Iterator[None]:
    """The process-wide identity Flower's ServerApp runtime sets before a ServerApp creates messages (restored)."""
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = 1, run_id, SUPERLINK_NODE_ID
    try:
        yield
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


def bank_contexts(banks: int, run_id: int = 1) -> dict[int, Context]:
    """One node context per bank (node ids 1..banks, ``partition-id`` 0..banks − 1), each with its own state."""
    return {k + 1: Context(run_id, k + 1, {"partition-id": k, "num-partitions": banks}, RecordDict(), {})
            for k in range(banks)}


class LoopbackGrid(Grid):
    """Delivers each message to ``app`` with the destination node's context, serialized both ways; a ClientApp's
    exception becomes an error reply, as a SuperNode sends it, so the server's code meets what it meets deployed.
    """

    def __init__(self, app: ClientApp, contexts: dict[int, Context], run_id: int = 1) -> None:
        self.app, self.contexts, self._run = app, contexts, Run.create_empty(run_id)
        self._replies: dict[str, Message] = {}  # pushed messages' replies, by the message id they answer

    def set_run(self, run: Any) -> None:
        self._run = run

    @property
    def run(self) -> Any:
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Deliver each message now (banks one after the other) and keep its reply for :meth:`pull_messages`."""
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid4().hex  # what the SuperLink assigns
            wire = message_from_proto(message_to_proto(msg))
            try:
                reply = self.app(wire, self.contexts[msg.metadata.dst_node_id])
            except Exception as ex:  # noqa: BLE001 - as a SuperNode does: the bank's failure is an error reply
                logger.error("ClientApp raised an exception", exc_info=ex)
                reason = str(type(ex)) + ":<'" + str(ex) + "'>"  # flwr's run_clientapp format
                reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=wire)
            self._replies[msg.metadata.message_id] = message_from_proto(message_to_proto(reply))
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The kept replies to these message ids (each handed out once)."""
        return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))


def run_federated(engine: str, client_app: ClientApp, run_jobs: Callable[[Grid, dict[str, Any], Any], None],
                  build_server_app: Callable[[dict[str, Any], Any], Any], settings: dict[str, Any],
                  on_result: Callable[[Any], None], banks: int, torch_threads: int | None = None) -> None:
    """One federated session (GNN, FED-SPFD, the FedByteBPE tokenizer): the same ServerApp code (``run_jobs``) and
    ClientApp over this loopback grid (``engine="loopback"``, torch limited to ``torch_threads`` meanwhile; None:
    an app without torch, which is then not imported), or on Flower's simulation engine (Ray, one CPU per bank,
    bound to the loopback interface). Each loopback session has a run id of its own, as Flower's runs do.
    """
    if engine == "loopback":
        threads = None
        if torch_threads is not None:
            import torch

            threads = torch.get_num_threads()
            torch.set_num_threads(torch_threads)
        run_id = uuid4().int >> 65  # a fresh run per session, as Flower draws one: per-run client caches stay apart
        try:
            with server_identity(run_id):
                run_jobs(LoopbackGrid(client_app, bank_contexts(banks, run_id), run_id), settings, on_result)
        finally:
            if threads is not None:
                torch.set_num_threads(threads)
        return
    from flwr.simulation import run_simulation

    from fedfraud.core.net import ray_bind

    run_simulation(
        server_app=build_server_app(settings, on_result), client_app=client_app, num_supernodes=banks,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                        "init_args": {"num_cpus": 2, "logging_level": "ERROR", **ray_bind()}},  # loopback interface
    )
