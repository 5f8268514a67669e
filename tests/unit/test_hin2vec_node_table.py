"""Serving's G-HIN2Vec state (issue 38): the per-node table kept in the KV store, and the pinned encoder version."""

from __future__ import annotations

import numpy as np
import pytest

from fedfraud.config import FedfraudConfig
from fedfraud.feature_store.cardholder import prepare_batch
from fedfraud.feature_store.privacy import PrivateFeaturizer
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import generate_frame
from fedfraud.training.embeddings.features import hin2vec_version_for
from fedfraud.training.embeddings.graph import HinState

CFG = FedfraudConfig()


@pytest.fixture(scope="module")
def state() -> HinState:
    """One cardholder's HinState after its whole (generated) history."""
    frame, _ = generate_frame(GeneratorConfig(banks=1, cardholders=4, days=20, seed=3))
    rows = frame[frame["cardholder_id"] == frame["cardholder_id"].iloc[0]]
    batch = prepare_batch(rows, PrivateFeaturizer.for_bank(CFG.encoder, CFG.privacy, 0))
    out = HinState(CFG.egograph)
    for i in range(len(batch)):
        out.apply(batch, i)
    assert out.ego.num_nodes > 1
    return out


def test_node_table_round_trip_gives_the_same_graph(state: HinState) -> None:
    again = HinState(ego=state.ego)
    assert not again.complete()  # an ego graph without its node table: serving embeds it as no graph
    again.load_info(state.info_bytes())
    assert again.complete()
    a, b = state.graph(512, 1.0), again.graph(512, 1.0)
    assert a is not None and b is not None
    for name in ("merchant_loc", "category", "merchant_category", "location", "merchant_location"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    # loading twice (a redelivered batch's table) changes nothing
    again.load_info(state.info_bytes())
    assert again.info_bytes() == state.info_bytes()


@pytest.mark.parametrize("damage", [lambda b: b[:10], lambda b: b[:-1] + bytes([b[-1] ^ 1]), lambda b: b"XXXX" + b[4:]])
def test_a_corrupt_node_table_is_refused(state: HinState, damage) -> None:
    with pytest.raises(ValueError, match="hin2vec node table"):
        HinState(ego=state.ego).load_info(damage(state.info_bytes()))


def test_the_encoder_version_a_fraud_model_pins() -> None:
    fraud = {"extra_features": ["hin2vec"], "hin2vec_version": "latest"}
    assert hin2vec_version_for({"fraud": fraud, "hin2vec_model": "hin2vec:v3"}) == "v3"
    assert hin2vec_version_for({"fraud": fraud}) == "latest"  # trained before the tag was recorded
    assert hin2vec_version_for({"fraud": {**fraud, "extra_features": []}}) is None
    assert hin2vec_version_for({}) is None
