"""Issue 37 finding 5: a checkpoint or bank-data cache that would run code when unpickled is refused, unrun.

Each crafted file holds an object whose ``__reduce__`` makes the unpickler call ``exec`` to create a marker file.
The control at the end of each test loads the same file the old way (``weights_only=False``) and the marker
appears, so the file really is an exploit; through the project's loaders it is refused and the marker never is.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch


class _Exploit:
    """Unpickling it runs ``exec``, which creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return exec, (f"open({str(self.marker)!r}, 'w').close()",)


def _exploit_checkpoint(directory: Path, marker: Path) -> Path:
    from fedfraud.training.anomaly.run import CHECKPOINT_FILE

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CHECKPOINT_FILE
    torch.save({"round": 3, "state_dict": {"w": torch.ones(2)}, "history": [], "settings": _Exploit(marker)}, path)
    return path


def _proves_the_exploit_works(path: Path, marker: Path) -> None:
    """The control: the old ``torch.load(weights_only=False)`` runs the file's code."""
    assert not marker.exists()
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_a_checkpoint_that_would_run_code_is_refused_in_one_line_and_a_real_one_loads(tmp_path: Path) -> None:
    from fedfraud.core.errors import UserError
    from fedfraud.training.anomaly.run import Checkpoint

    marker = tmp_path / "pwned"
    path = _exploit_checkpoint(tmp_path / "ckpt", marker)
    with pytest.raises(UserError, match=r"refusing to load checkpoint .*builtins\.exec.*could run code") as err:
        Checkpoint.load(tmp_path / "ckpt")
    assert "\n" not in str(err.value)
    assert not marker.exists()
    _assert_a_real_checkpoint_round_trips(tmp_path / "real")
    _proves_the_exploit_works(path, marker)


def _assert_a_real_checkpoint_round_trips(folder: Path) -> None:
    """Everything a resumed run needs loads under ``weights_only=True``: weights, Adam state, history, privacy,
    the DP ledger (numpy scalars included, as older checkpoints may hold them) and the best round."""
    from fedfraud.training.anomaly.run import Checkpoint, RoundRecord

    model = torch.nn.Linear(3, 2)
    adam = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.ones(4, 3)).sum().backward()
    adam.step()
    record = RoundRecord(1, 0.7, {0: {"val_loss": 0.5}}, 1.0, {"val_loss_mean": 0.5})
    ckpt = Checkpoint(0, {}, [], {"seed": 7, "lr": 0.01, "name": "x"}, optimizer={"adam": adam.state_dict()},
                      privacy={0: {"mu_gdp": 1.5, "cardholders": 24}},
                      dp_ledger=[{"noise_multiplier": np.float64(0.8), "banks": np.int64(3)}])
    ckpt.offer(record, model.state_dict())
    ckpt.save(folder)
    back = Checkpoint.load(folder)
    assert back is not None and back.round == 1 and back.best_round == 1 and back.best_val_loss == 0.5
    assert torch.equal(back.state_dict["weight"], model.state_dict()["weight"])
    assert back.optimizer["adam"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert back.privacy == {0: {"mu_gdp": 1.5, "cardholders": 24}}
    assert float(back.dp_ledger[0]["noise_multiplier"]) == 0.8 and math.isinf(Checkpoint(0, {}, [], {}).best_val_loss)
    fresh = torch.optim.Adam(model.parameters(), lr=0.01)
    fresh.load_state_dict(back.optimizer["adam"])  # usable to resume


def test_a_bank_data_cache_that_would_run_code_is_refused_and_rebuilt(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    from fedfraud.feature_store.config import EgoGraphConfig, EncoderConfig, PrivacyConfig
    from fedfraud.training.anomaly.config import AnomalyConfig
    from fedfraud.training.anomaly.data import BankData, load_bank_data
    from fedfraud.training.data.config import GeneratorConfig
    from fedfraud.training.data.synthetic import generate_dataset

    root = tmp_path / "data"
    generate_dataset(root, GeneratorConfig(banks=1, cardholders=24, days=21, fraud_rate=0.03, seed=11),
                     raw_csv=False, progress=False)
    cfg = AnomalyConfig(max_train_pairs=100, max_test_pairs=30, max_eval_normal=40)
    enc, ego = EncoderConfig(dim=16, merchant_buckets=64), EgoGraphConfig()

    def load() -> BankData:
        return load_bank_data(root, 0, cfg, enc, PrivacyConfig(), ego, cache_dir=tmp_path / "cache")

    built = load()
    (cache,) = (tmp_path / "cache").glob("bank_0-*.pt")
    assert isinstance(load(), BankData)  # the cache this code writes is read back under weights_only=True
    marker = tmp_path / "pwned"
    torch.save(_Exploit(marker), cache)  # someone with write access to the cache folder
    with caplog.at_level(logging.ERROR, logger="fedfraud.training.anomaly.data"):
        again = load()
    assert not marker.exists()
    assert any("refusing to load bank-data cache" in r.getMessage() and "builtins.exec" in r.getMessage()
               for r in caplog.records)
    assert len(again.train) == len(built.train) and torch.equal(again.train.current[0].x, built.train.current[0].x)
    assert isinstance(load(), BankData)  # rebuilt over the bad file
    torch.save(_Exploit(marker), cache)
    _proves_the_exploit_works(cache, marker)
