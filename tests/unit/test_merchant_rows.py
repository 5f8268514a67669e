"""Merchant-table rows under the federation's key: the same at every bank, not computable without the key."""

from __future__ import annotations

import numpy as np
import pytest

from fedfraud.feature_store.config import EncoderConfig, PrivacyConfig
from fedfraud.feature_store.encoders import merchant_bucket
from fedfraud.feature_store.privacy import FEDERATION_KEY_ENV, PrivateFeaturizer

IDS = [f"merchant-{i}" for i in range(2000)]
ENC = EncoderConfig()


def test_every_bank_maps_a_merchant_to_the_same_row_and_the_public_hash_does_not_find_it():
    a = PrivateFeaturizer.for_bank(ENC, PrivacyConfig(), 0).merchant(IDS)
    b = PrivateFeaturizer.for_bank(ENC, PrivacyConfig(), 3).merchant(IDS)
    np.testing.assert_array_equal(a, b)  # no shared vocabulary needed
    public = merchant_bucket(IDS, ENC)
    assert np.mean(a == public) < 0.01  # ~1/buckets by chance


def test_the_production_key_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    simulated = PrivateFeaturizer.for_bank(ENC, PrivacyConfig(), 0).merchant(IDS)
    monkeypatch.setenv(FEDERATION_KEY_ENV, "a secret the banks share")
    keyed = PrivateFeaturizer.for_bank(ENC, PrivacyConfig(), 0)
    assert np.mean(keyed.merchant(IDS) == simulated) < 0.01
    np.testing.assert_array_equal(keyed.merchant(IDS), keyed.merchant_hash(IDS) % np.uint64(ENC.merchant_buckets))


def test_a_production_bank_without_the_federation_key_is_refused(monkeypatch: pytest.MonkeyPatch):
    from fedfraud.core.errors import UserError

    monkeypatch.setenv("FEDFRAUD_BANK_SECRET", "this bank's own secret")
    monkeypatch.delenv(FEDERATION_KEY_ENV, raising=False)
    with pytest.raises(UserError, match="FEDFRAUD_FEDERATION_KEY is not"):
        PrivateFeaturizer.for_bank(ENC, PrivacyConfig(), 0)
