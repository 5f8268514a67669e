"""What the neural fraud variants' banks send under ``aggregation: dsfl``, read off the loopback grid's wire.

:func:`recorded_train_messages` records every TRAIN message and its reply as they cross the loopback grid
(serialized as over the SuperLink; the grid's own delivery runs). :func:`noise_of` recovers, from one pair, the
bank's clipped update and which coordinates the exponential mechanism picked: with a fixed ``dsfl.seed`` the
bank's standard Laplace draws are reproducible (its generator is seeded ``[seed, partition-id, round]``, and
draws the m-of-n selection's Gumbel keys before them), so ``sent − received − draw × scale`` must be an update of
L1 norm ``l1_clip`` (training moves far more), for exactly m coordinates at scale ``l1_clip/epsilon_top``. Pick
the other scale ≫ ``l1_clip`` (a coordinate's group is then told apart by which scale leaves it small) and not so
large that float32 rounding of the sent values blurs the update's norm (:attr:`Noised.tolerance` bounds it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pytest
from flwr.app import Message, MessageType
from flwr.common.serde import message_from_proto, message_to_proto

from fedfraud.training.federated.config import DSFLConfig
from fedfraud.training.federated.dsfl import (
    contribution_errors,
    contribution_weights,
    dsfl_epsilon,
    noise_scales,
    selected_count,
)
from fedfraud.training.federated.dsfl_mod import ROUND_OFFSET_KEY
from fedfraud.training.fraud.gnn.loopback import LoopbackGrid


@contextmanager
def recorded_train_messages() -> Iterator[list[tuple[Message, Message]]]:
    """(train message, the bank's reply) pairs, in the order they crossed the loopback grid."""
    seen: list[tuple[Message, Message]] = []
    deliver = LoopbackGrid.send_and_receive

    def recording(self: LoopbackGrid, messages, *, timeout=None):
        messages = list(messages)
        sent = [message_from_proto(message_to_proto(m)) for m in messages]  # the strategy reuses its config record
        replies = list(deliver(self, messages, timeout=timeout))
        seen.extend((m, r) for m, r in zip(sent, replies, strict=True) if m.metadata.message_type == MessageType.TRAIN)
        return replies

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LoopbackGrid, "send_and_receive", recording)
        yield seen


@dataclass(frozen=True)
class Noised:
    """One bank's report, taken apart: its clipped update and the selected coordinates (flat, float keys)."""

    update: np.ndarray
    selected: np.ndarray
    tolerance: float


def _flat(record, keys: list[str]) -> np.ndarray:
    return np.concatenate([record[k].numpy().astype(np.float64).ravel() for k in keys])


def noise_of(msg: Message, reply: Message, cfg: DSFLConfig, fixed: tuple[str, ...]) -> Noised:
    """The clipped update and selection behind ``reply``; asserts the ``fixed`` arrays came back as sent."""
    received, sent = msg.content["arrays"], reply.content["arrays"]
    assert set(sent) == set(received)
    for key in fixed:
        np.testing.assert_array_equal(sent[key].numpy(), received[key].numpy())
    keys = [k for k in received if k not in fixed]
    base, out = _flat(received, keys), _flat(sent, keys)
    config = msg.content["config"]
    round_ = int(config["server-round"]) + int(config.get(ROUND_OFFSET_KEY, 0))
    rng = np.random.default_rng([cfg.seed, msg.metadata.dst_node_id - 1, round_])  # partition-id = node id − 1
    n = base.size
    if selected_count(n, cfg.top_fraction) < n:
        rng.gumbel(size=n)
    draw = rng.laplace(0.0, 1.0, size=n)
    b_top, b_rest = noise_scales(cfg)
    residual = out - base
    selected = np.abs(residual - draw * b_top) < np.abs(residual - draw * b_rest)
    update = residual - draw * np.where(selected, b_top, b_rest)
    # float32 rounding of the sent and the received values: half a spacing each, per coordinate
    tolerance = float(np.spacing(np.abs(out).astype(np.float32)).sum() + np.spacing(np.abs(base).astype(np.float32))
                      .sum())
    return Noised(update, selected, tolerance)


def assert_laplace_reports(pairs: list[tuple[Message, Message]], cfg: DSFLConfig, fixed: tuple[str, ...]) -> int:
    """Every report is an update of L1 norm ``l1_clip`` plus Laplace noise at the configured scale per dimension,
    the smaller scale on exactly m coordinates; returns the coordinates per report.
    """
    sizes = set()
    for msg, reply in pairs:
        got = noise_of(msg, reply, cfg, fixed)
        n = got.update.size
        sizes.add(n)
        assert int(got.selected.sum()) == selected_count(n, cfg.top_fraction)
        assert abs(np.abs(got.update).sum() - cfg.l1_clip) <= got.tolerance, (np.abs(got.update).sum(), got.tolerance)
    assert len(sizes) == 1
    return sizes.pop()


def assert_released(reports: list[tuple[Message, Message]], next_msg: Message) -> np.ndarray:
    """The model the server sends next is the one of ``reports`` (one round, in bank order) moved by the
    contribution-weighted mean of their updates; returns the weights.
    """
    keys = list(reports[0][0].content["arrays"])
    base = _flat(reports[0][0].content["arrays"], keys)
    updates = np.stack([_flat(r.content["arrays"], keys) - base for _, r in reports])
    weights = contribution_weights(contribution_errors(updates))
    assert weights.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(_flat(next_msg.content["arrays"], keys), base + weights @ updates, rtol=0, atol=1e-6)
    return weights


def assert_dsfl_card(version, cfg: DSFLConfig, rounds: int, banks: int, coordinates: int, side: str,
                     fixed: str) -> None:
    """The published card states DSFL's accountant for the run (both units) and names what it does not cover."""
    dp = version.privacy["client_dp"]
    assert dp["noise"] == "dsfl" and dp["rounds"] == rounds and dp["banks"] == banks
    assert dp["coordinates"] == coordinates
    assert dp["epsilon"] == pytest.approx(dsfl_epsilon(cfg, rounds, coordinates, cfg.delta, "cardholder"))
    assert dp["epsilon_bank"] == pytest.approx(dsfl_epsilon(cfg, rounds, coordinates, cfg.delta, "bank"))
    assert side in dp["not_covered"] and fixed in dp["returned_as_received"]
    assert version.privacy["formal_guarantee"].startswith(f"({dp['epsilon']:.3g}, {cfg.delta:g})-DP per cardholder")
    assert "**DSFL** on the model arrays" in version.model_card and "NOT covered" in version.model_card


def assert_dp_off(version) -> None:
    """The card of a run without DSFL says DP is off, as before DSFL reached the variant."""
    assert version.privacy["client_dp"]["dp"] == "off" and version.privacy["formal_guarantee"].startswith("none")
    assert "Differential privacy is **off**" in version.model_card
