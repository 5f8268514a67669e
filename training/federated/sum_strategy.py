"""A Flower strategy base for rounds whose product is a SecAgg+ sum: no evaluation round on the banks or the server.

The DP-FedSGD anomaly rounds and the merchant-risk release both send only masked vectors; an evaluate round
would be a second message from each bank that the privacy argument does not cover, so neither has one here. (The
deployed DP-FedSGD app opts into one evaluation per block, on validation and test cardholders only:
:class:`~fedfraud.training.federated.dp_fedsgd.DPFedSGDStrategy`'s ``evaluate_every``.)
"""

from __future__ import annotations

from typing import Any

from flwr.common import EvaluateIns, EvaluateRes, Parameters, Scalar
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

__all__ = ["SumOnlyStrategy"]


class SumOnlyStrategy(Strategy):
    """:class:`flwr.server.strategy.Strategy` with no federated or server-side evaluation (subclasses fit only)."""

    def configure_evaluate(self, server_round: int, parameters: Parameters, client_manager: ClientManager
                           ) -> list[tuple[ClientProxy, EvaluateIns]]:
        return []

    def aggregate_evaluate(self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]],
                           failures: list[Any]) -> tuple[float | None, dict[str, Scalar]]:
        return None, {}

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        return None
