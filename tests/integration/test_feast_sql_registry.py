"""The Feast registry on the running PostgreSQL, shared by two "replicas", with the online store on Redis.

Replica A renders its repo, runs the plain ``feast apply`` CLI (Feast itself
expands ``${FEDFRAUD_FEAST_REGISTRY_PASSWORD}`` in the URL) and materializes.
Replica B renders an empty folder with the same config and reads the same
views and rows: nothing was copied between the folders, everything came
through PostgreSQL (registry) and Redis (online store). A scratch role and
database are created for the run and dropped afterwards; Redis uses db 15 and a
per-run project whose keys are torn down.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from fedfraud.config import FedfraudConfig
from fedfraud.core.credentials import new_token
from fedfraud.core.errors import UserError
from fedfraud.core.net import free_port
from fedfraud.feature_store.feast_store import DATA_DIR, materialize_repo, open_store, render_repo
from fedfraud.feature_store.offline import CARDHOLDER_FILE, write_offline
from fedfraud.feature_store.store_config import FeatureStoreConfig
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import generate_dataset

from tests.prerequisites import PG_HOST, PG_PORT, missing, require_redis

pytestmark = pytest.mark.integration

PG_ADMIN = os.environ.get("PGUSER", "postgres")
REDIS_URL = "127.0.0.1:6379,db=15"
PASSWORD_ENV = "FEDFRAUD_FEAST_REGISTRY_PASSWORD"


def _admin():
    import psycopg

    return psycopg.connect(host=PG_HOST, port=PG_PORT, user=PG_ADMIN, dbname="postgres", autocommit=True,
                           connect_timeout=3)


@pytest.fixture(scope="module")
def scratch_db():
    """A login role with a random password and a database it owns; both dropped at the end, whatever happens."""
    import psycopg
    from psycopg import sql

    try:
        admin = _admin()
    except psycopg.OperationalError as exc:
        missing(f"no PostgreSQL at {PG_HOST}:{PG_PORT} ({exc})")
    name = f"fedfraud_reg_{uuid.uuid4().hex[:10]}"
    password = new_token()
    with admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(name), sql.Literal(password)))
        admin.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name), sql.Identifier(name)))
        try:
            yield name, password
        finally:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def _features(role: str, port: int = PG_PORT) -> FeatureStoreConfig:
    base = FedfraudConfig().features
    return base.model_copy(update={
        "profile": "redis",
        "project": f"fedfraud_sqlreg_{os.getpid()}",
        "redis": base.redis.model_copy(update={"connection_string": REDIS_URL}),
        "registry": base.registry.model_validate({
            "type": "sql", "path": f"postgresql+psycopg://{role}@{PG_HOST}:{port}/{role}", "cache_ttl_seconds": 0,
        }),
    })


def test_sql_registry_shared_by_two_replicas(
    scratch_db: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    require_redis()
    role, password = scratch_db
    monkeypatch.setenv(PASSWORD_ENV, password)
    features = _features(role)
    cfg = FedfraudConfig()
    data, repo_a, repo_b = tmp_path / "data", tmp_path / "replica-a", tmp_path / "replica-b"
    generate_dataset(data, GeneratorConfig(banks=1, cardholders=20, days=7, seed=11), raw_csv=False, progress=False)
    write_offline(data, repo_a, cfg.encoder, cfg.privacy, cfg.egograph, features.location_cell_deg, banks=[0],
                  progress=False)

    # the rendered file holds a reference to the variable, never the password
    rendered = (render_repo(features, repo_a) / "feature_store.yaml").read_text(encoding="utf-8")
    assert password not in rendered
    assert f"{role}:${{{PASSWORD_ENV}}}@{PG_HOST}:{PG_PORT}/{role}" in rendered

    # replica A: the plain Feast CLI applies, as an operator would in the rendered folder
    cli = Path(sys.executable).with_name("feast")
    done = subprocess.run([str(cli), "apply"], cwd=repo_a, env=os.environ.copy(), capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    store_a = open_store(features, repo_a)
    try:
        materialize_repo(store_a)
        table = pq.read_table(repo_a / DATA_DIR / CARDHOLDER_FILE).to_pandas()
        probe = table.sort_values(["event_timestamp", "created"]).groupby("cardholder").tail(1).iloc[:5]
        rows = [{"cardholder": h} for h in probe["cardholder"]]

        # the registry lives in PostgreSQL: Feast's tables hold this project's views
        with psycopg.connect(host=PG_HOST, port=PG_PORT, user=role, password=password, dbname=role) as conn:
            names = {r[0] for r in conn.execute(
                "SELECT feature_view_name FROM feature_views WHERE project_id = %s", (features.project,))}
        assert {"cardholder_ego_state", "cardholder_activity"} <= names

        # replica B: an empty folder, same config; no apply, no parquet, no registry file
        store_b = open_store(features, repo_b)
        assert not (repo_b / "data" / "registry.db").exists()
        assert {v.name for v in store_b.list_feature_views()} == {v.name for v in store_a.list_feature_views()}
        got = store_b.get_online_features(
            features=store_b.get_feature_service("anomaly_scoring_v1"), entity_rows=rows
        ).to_dict()
        assert got["ego_state"] == list(probe["ego_state"])
        assert got["state_version"] == list(probe["state_version"])
        unknown = store_b.get_online_features(
            features=["cardholder_ego_state:state_version"], entity_rows=[{"cardholder": "never-seen"}]).to_dict()
        assert unknown["state_version"] == [None]
    finally:
        store_a.teardown()
    with psycopg.connect(host=PG_HOST, port=PG_PORT, user=role, password=password, dbname=role) as conn:
        left = conn.execute("SELECT count(*) FROM feature_views WHERE project_id = %s", (features.project,)).fetchone()
    assert left == (0,)


def test_unreachable_registry_is_one_line_error(tmp_path: Path) -> None:
    features = _features("nobody", port=free_port())
    with pytest.raises(UserError) as info:
        open_store(features, tmp_path / "repo")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("Feast sql registry at postgresql+psycopg://nobody@127.0.0.1:")
    assert "cannot be reached" in message


def test_password_in_url_is_refused() -> None:
    with pytest.raises(ValueError, match="no password in registry.path"):
        FeatureStoreConfig.model_validate(
            {"registry": {"type": "sql", "path": "postgresql+psycopg://feast:secret@127.0.0.1:5432/feast"}})
