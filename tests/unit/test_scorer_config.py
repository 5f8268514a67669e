"""The scorer deployment's own config section (issue 19: each deployment receives only its typed section).

``fedfraud.serving.app.build_app`` binds :class:`fedfraud.serving.config.ScorerConfig`, cut from the whole config by
field name; the replicas rebuild it from JSON. The deployment itself runs in
``tests/integration/test_streaming_pipeline.py``.
"""

from __future__ import annotations

from fedfraud.config import FedfraudConfig, apply_overrides
from fedfraud.serving.config import ScorerConfig


def test_every_scorer_section_is_the_same_typed_section_of_the_whole_config() -> None:
    whole = FedfraudConfig.model_fields
    for name, field in ScorerConfig.model_fields.items():
        assert name in whole, name
        assert field.annotation == whole[name].annotation, name


def test_the_scorer_gets_its_sections_with_their_values_and_nothing_else() -> None:
    cfg = FedfraudConfig.model_validate(apply_overrides({}, [
        "serving.bank_id=3", "serving.decision_ring=7", "fraud.top_reasons=5", "retrain.drift_window_rows=1234",
        "tokenizer.vocab_size=999"]))
    scorer = ScorerConfig.of(cfg)
    assert (scorer.serving.bank_id, scorer.serving.decision_ring) == (3, 7)
    assert scorer.fraud.top_reasons == 5 and scorer.retrain.drift_window_rows == 1234
    bound = scorer.model_dump(mode="json")
    assert set(bound) == {"serving", "features", "egograph", "encoder", "privacy", "fraud", "retrain"}
    assert ScorerConfig.model_validate(bound) == scorer  # what a replica on another node rebuilds
