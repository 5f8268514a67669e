"""What a hot-swapping deployment sees move in a real registry: publishes, promotions, rollbacks, pinned versions."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfraud.serving.follow import moved
from fedfraud.training.registry import ModelRegistry, RegistryError


def _publish(reg: ModelRegistry, kind: str) -> str:
    with reg.publish(kind, config={}) as folder:
        (folder / "model.json").write_text("{}", encoding="utf-8")
    return reg.get(kind, "latest").tag


def test_followed_names_move_and_pinned_ones_do_not(tmp_path: Path) -> None:
    reg = ModelRegistry(tmp_path)
    a1, f1 = _publish(reg, "anomaly"), _publish(reg, "fraud")
    follow = {"anomaly": "champion", "fraud": "latest"}
    assert moved(reg, follow, {"anomaly": a1, "fraud": f1}) == {}

    f2 = _publish(reg, "fraud")
    assert {k: v.tag for k, v in moved(reg, follow, {"anomaly": a1, "fraud": f1}).items()} == {"fraud": f2}
    assert moved(reg, {"anomaly": "champion", "fraud": "v1"}, {"anomaly": a1, "fraud": f1}) == {}  # pinned

    a2 = _publish(reg, "anomaly")  # champion falls back to latest while none was promoted
    assert moved(reg, follow, {"anomaly": a1, "fraud": f2})["anomaly"].tag == a2
    reg.promote("anomaly", 1, actor="test", reason="pin")
    reg.promote("anomaly", 2, actor="test", reason="newer")
    reg.rollback("anomaly", actor="test", reason="alert")  # an older version is a move too
    assert moved(reg, follow, {"anomaly": a2, "fraud": f2})["anomaly"].tag == a1


def test_a_missing_kind_raises_for_the_caller_to_keep_serving(tmp_path: Path) -> None:
    with pytest.raises(RegistryError):
        moved(ModelRegistry(tmp_path), {"tokenizer": "latest"}, {"tokenizer": "tokenizer:v1"})
