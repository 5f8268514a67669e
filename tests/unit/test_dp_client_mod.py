"""The bank's side of client-level DP: Flower's fixedclipping_mod when asked, a refusal when the run says DP but sends
no clipping norm, a pass-through otherwise (the real mod on real Flower messages, no Ray)."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedfraud.training.anomaly.federated.client_app import CLIPPING_KEY, dp_clipping_mod

GLOBAL = np.zeros(4, dtype=np.float32)
TRAINED = np.array([3.0, 4.0, 0.0, 0.0], dtype=np.float32)  # an update of norm 5


@pytest.fixture(autouse=True)
def flower_task(monkeypatch):
    """The identity Flower's runtime gives a task; Messages cannot be built without it."""
    for name, value in (("_task_id", 1), ("_run_id", 1), ("_node_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)


def _train_message(config: dict) -> Message:
    content = RecordDict({"arrays": ArrayRecord({"w": Array(GLOBAL)}), "config": ConfigRecord(config)})
    return Message(content=content, dst_node_id=1, message_type="train")


def _local_training(msg: Message, context: Context) -> Message:
    return Message(RecordDict({"arrays": ArrayRecord({"w": Array(TRAINED.copy())})}), reply_to=msg)


def _sent(config: dict) -> np.ndarray:
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    reply = dp_clipping_mod(_train_message(config), context, _local_training)
    return reply.content["arrays"]["w"].numpy()


def test_update_is_clipped_when_the_server_asks():
    sent = _sent({"dp-enabled": True, CLIPPING_KEY: 1.0})
    assert np.linalg.norm(sent - GLOBAL) == pytest.approx(1.0, rel=1e-6)
    assert np.allclose(sent, TRAINED / 5.0)


def test_private_run_without_a_clipping_norm_is_refused():
    with pytest.raises(ValueError, match="refusing to send an unclipped update"):
        _sent({"dp-enabled": True})


def test_without_dp_the_update_passes_unchanged():
    assert np.array_equal(_sent({"dp-enabled": False}), TRAINED)
