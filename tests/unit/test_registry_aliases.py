"""Champion/challenger aliases: resolution, promotion, rollback, the append-only audit log and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedfraud.cli.app import main
from fedfraud.training.registry import ModelRegistry, RegistryError


def _publish(reg: ModelRegistry, n: int, kind: str = "fraud") -> None:
    for i in range(n):
        with reg.publish(kind, config={"i": i}, metrics={"pr_auc": 0.5 + i / 10}) as folder:
            (folder / "model.json").write_text("{}", encoding="utf-8")


def test_champion_is_the_newest_version_until_one_is_promoted(tmp_path: Path) -> None:
    reg = ModelRegistry(tmp_path)
    _publish(reg, 2)
    assert reg.get("fraud", "champion").version == 2
    with pytest.raises(RegistryError, match="challenger"):
        reg.get("fraud", "challenger")
    reg.promote("fraud", 1, actor="test", reason="pin the first")
    _publish(reg, 1)  # a new version alone does not take over once a champion is chosen
    assert reg.get("fraud", "champion").version == 1 and reg.get("fraud", "latest").version == 3


def test_promote_clears_the_challenger_and_rollback_restores_the_previous_champion(tmp_path: Path) -> None:
    reg = ModelRegistry(tmp_path)
    _publish(reg, 3)
    reg.promote("fraud", "v1", actor="test", reason="first")
    reg.set_alias("fraud", "challenger", 3, actor="retrain", reason="cycle 7")
    reg.promote("fraud", "challenger", actor="policy", reason="better beyond the interval",
                evidence={"pr_auc_diff": [0.02, 0.05]})
    assert reg.aliases("fraud") == {"champion": 3}
    reg.rollback("fraud", actor="oncall", reason="alert")
    assert reg.aliases("fraud") == {"champion": 1}
    log = reg.audit("fraud")
    assert [(e["alias"], e["from"], e["to"], e["actor"]) for e in log] == [
        ("champion", None, 1, "test"), ("challenger", None, 3, "retrain"), ("champion", 1, 3, "policy"),
        ("challenger", 3, None, "policy"), ("champion", 3, 1, "oncall")]
    assert log[2]["evidence"] == {"pr_auc_diff": [0.02, 0.05]}
    with pytest.raises(RegistryError, match="no earlier champion"):
        ModelRegistry(tmp_path / "other").rollback("fraud", actor="x", reason="y")


def test_unknown_versions_and_aliases_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    reg = ModelRegistry(tmp_path)
    _publish(reg, 1)
    with pytest.raises(RegistryError, match="not in registry"):
        reg.promote("fraud", 9, actor="t", reason="r")
    with pytest.raises(RegistryError, match="not a version"):
        reg.get("fraud", "best")
    assert reg.audit("fraud") == [] and reg.aliases("fraud") == {}
    capsys.readouterr()  # log lines of the set-up above (logging may be configured by an earlier CLI test)
    assert main(["--set", f"serving.registry_root={tmp_path}", "models", "promote", "fraud", "7", "--reason", "x"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: fraud:v7 is not in registry {tmp_path}"]
    assert main(["--set", f"serving.registry_root={tmp_path}", "models", "list", "nope"]) == 2


def test_cli_promote_list_rollback(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    reg = ModelRegistry(tmp_path)
    _publish(reg, 2)
    root = ["--set", f"serving.registry_root={tmp_path}", "models"]
    assert main([*root, "promote", "fraud", "1", "--reason", "baseline"]) == 0
    assert main([*root, "promote", "fraud", "v2", "--reason", "retrained"]) == 0
    assert main([*root, "rollback", "fraud", "--reason", "drift alarm"]) == 0
    out = capsys.readouterr().out
    assert "fraud champion: v2 -> v1 (rolled back)" in out
    assert main([*root, "list", "fraud", "--audit"]) == 0
    listing = capsys.readouterr().out
    row = next(line for line in listing.splitlines() if " v1 " in line)
    assert "champion" in row and "rollback: drift alarm" in listing
    lines = (tmp_path / "fraud" / "audit.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(x)["reason"] for x in lines] == ["baseline", "retrained", "rollback: drift alarm"]


def test_cli_registry_on_the_subcommand_and_list_as_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    reg = ModelRegistry(tmp_path / "reg")
    _publish(reg, 2)
    assert main(["models", "promote", "fraud", "2", "--reason", "r", "--registry", str(tmp_path / "reg")]) == 0
    capsys.readouterr()
    assert main(["models", "list", "fraud", "--json", "--registry", str(tmp_path / "reg")]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [v["version"] for v in listing["fraud"]] == [1, 2]
    assert listing["fraud"][1]["aliases"] == ["champion"] and listing["fraud"][0]["aliases"] == []
    assert main(["models", "--registry", str(tmp_path / "reg"), "list", "fraud"]) == 0  # the group's, as before
    row = next(line for line in capsys.readouterr().out.splitlines() if " v2 " in line)
    assert "champion" in row


def test_cli_list_is_a_table_of_the_headline_metrics(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    reg = ModelRegistry(tmp_path)
    for pr_auc in (0.61234, 0.7):
        with reg.publish("fraud", config={}, metrics={"test_pr_auc": pr_auc, "n_rows": 12}) as folder:
            (folder / "model.json").write_text("{}", encoding="utf-8")
    capsys.readouterr()
    assert main(["models", "list", "--registry", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if "version" in line)
    assert "test_pr_auc" in header and "n_rows" not in header  # chosen metrics only; --json has the rest
    assert "0.6123" in next(line for line in lines if " v1 " in line)
    assert main(["models", "list", "--registry", str(tmp_path / "empty")]) == 0
    assert capsys.readouterr().err.strip() == f"no models in {tmp_path / 'empty'}"


def test_model_ref_is_the_one_reader_of_model_tags(tmp_path: Path) -> None:
    from fedfraud.training.registry import ModelRef

    reg = ModelRegistry(tmp_path)
    _publish(reg, 3)
    ref = ModelRef.parse("fraud:v3")
    assert (ref.kind, ref.version, str(ref)) == ("fraud", 3, "fraud:v3") and reg.latest("fraud").ref == ref
    assert reg.get_ref("fraud:v2").version == 2 and reg.get_ref(ref).path.name == "v0003"
    for bad in ("fraud", "fraud:3", "fraud:vx", ":v3", "fraud:v" + "9" * 10):
        with pytest.raises(RegistryError, match="not a model tag"):
            ModelRef.parse(bad)
        assert ModelRef.maybe(bad) is None
    assert ModelRef.parse("my:kind:v7") == ModelRef("my:kind", 7)  # the last ":v" splits, as the tags are built
