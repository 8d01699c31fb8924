"""docs/configuration.md is generated from the settings and kept current (the drift
check CI runs); ``invoicing config show`` masks every secret; every field named like
a secret is a ``SecretStr``, so that the masking rule covers it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from streams.apps.ops.config import effective, env_name, is_secret, reference, show_value
from streams.devtools.configref import PAGE, is_current, render
from streams.entrypoints.app import app
from streams.settings import Settings

ROOT = Path(__file__).resolve().parents[2]

#: Field names that hold a secret (a password, a key, a token), whatever their section.
SECRET_NAME = re.compile(r"(password|secret|secrets|token|api_key)$")


def test_configuration_page_is_current() -> None:
    """Fails when a setting was added, removed or redescribed without regenerating."""
    assert is_current(ROOT), (
        f"{PAGE} is out of date: run `invoicing config reference` (or "
        "python -m streams.devtools.configref) and commit the result"
    )


def test_drift_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / PAGE).write_text(render().replace("kafka.bootstrap_servers", "kafka.brokers"))
    assert not is_current(tmp_path)
    assert not is_current(tmp_path / "missing")


def test_every_leaf_setting_has_a_row_with_env_and_meaning() -> None:
    rows = {row.key: row for row in reference()}
    page = render()

    def leaves(model: type[BaseModel], prefix: str) -> list[str]:
        out: list[str] = []
        for name, info in model.model_fields.items():
            ann = info.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                out += leaves(ann, f"{prefix}{name}.")
            else:
                out.append(f"{prefix}{name}")
        return out

    expected = leaves(Settings, "")
    assert list(rows) == expected
    for key in expected:
        row = rows[key]
        assert row.description, f"{key} has no description= in streams/settings.py"
        assert f"`{key}`" in page and f"`{row.env}`" in page
    assert rows["postgres.worker.password"].env == "INVOICING_POSTGRES__WORKER__PASSWORD"
    assert rows["view.store"].type == '"rocksdb" | "memory"'
    assert rows["worker.max_jobs"].default == "8"
    # a computed default reads the same on every machine (no local path)
    assert rows["stack.home"].default.startswith("computed: ")
    assert str(ROOT) not in page


def test_env_names_are_the_ones_pydantic_settings_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variable the reference names is the variable that sets the value."""
    monkeypatch.setenv(env_name(("worker", "max_jobs")), "7")
    monkeypatch.setenv(env_name(("postgres", "close", "password")), "pw-from-env")
    s = Settings()
    assert s.worker.max_jobs == 7
    assert s.postgres.close.password.get_secret_value() == "pw-from-env"


def test_fields_named_like_secrets_are_secretstr() -> None:
    for row in reference():
        name = row.key.rsplit(".", 1)[-1]
        if SECRET_NAME.search(name):
            assert row.secret, f"{row.key} looks like a secret but is not a SecretStr"
    assert is_secret(Settings.model_fields["redis"].annotation) is False


def test_show_masks_every_secret_in_table_and_json(monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {
        "INVOICING_POSTGRES__WORKER__PASSWORD": "pw-worker-XYZ",
        "INVOICING_POSTGRES__OWNER__PASSWORD": "pw-owner-XYZ",
        "INVOICING_REDIS__URL": "redis://acl-user:pw-redis-XYZ@redis.internal:6380/0",
        "INVOICING_PORTAL__TOKEN_SECRET": "tok-" + "x" * 40,
        "INVOICING_PORTAL__PREVIOUS_SECRETS": '["old-secret-XYZ-000000000000000000000"]',
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    runner = CliRunner()
    table = runner.invoke(app, ["config", "show"], env={"COLUMNS": "200"})
    as_json = runner.invoke(app, ["config", "show", "--json"])
    assert table.exit_code == 0, table.output
    assert as_json.exit_code == 0, as_json.output
    for output in (table.output, as_json.output):
        assert "XYZ" not in output and "x" * 40 not in output
        assert "redis://***@redis.internal:6380/0" in output
    rows = {row["key"]: row for row in json.loads(as_json.output)}
    assert rows["postgres.worker.password"] == {
        "key": "postgres.worker.password",
        "env": "INVOICING_POSTGRES__WORKER__PASSWORD",
        "value": "***",
        "secret": True,
        "given": True,
    }
    assert rows["portal.previous_secrets"]["value"] == "(1 secret)"
    assert rows["worker.max_jobs"]["given"] is False
    assert rows["worker.max_jobs"]["value"] == str(Settings().worker.max_jobs)


def test_effective_shows_values_and_what_the_environment_gave(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INVOICING_TAX__MAX_ATTEMPTS", "9")
    rows = {row.key: row for row in effective(Settings())}
    assert rows["tax.max_attempts"].value == "9" and rows["tax.max_attempts"].given
    assert not rows["tax.backoff_max_s"].given


def test_show_value_rules() -> None:
    assert show_value(None, secret=True, name="token_secret") == "(unset)"
    assert show_value("", secret=False, name="topic_prefix") == '""'
    assert show_value(3, secret=False, name="port") == "3"


def test_reference_command_check_and_write(tmp_path: Path) -> None:
    runner = CliRunner()
    (tmp_path / "docs").mkdir()
    stale = runner.invoke(app, ["config", "reference", "--check", "--root", str(tmp_path)])
    assert stale.exit_code == 1
    wrote = runner.invoke(app, ["config", "reference", "--root", str(tmp_path)])
    assert wrote.exit_code == 0, wrote.output
    assert (tmp_path / PAGE).read_text() == render()
    current = runner.invoke(app, ["config", "reference", "--check", "--root", str(tmp_path)])
    assert current.exit_code == 0
