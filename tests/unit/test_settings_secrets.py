"""Settings keep secrets out of what they show: repr, JSON, validation errors, and the
connection strings are built by libpq's quoting rules (``make_conninfo``)."""

from __future__ import annotations

import pydantic
import pytest
from psycopg.conninfo import conninfo_to_dict

from streams.adapters.postgres.migrate import url
from streams.settings import PostgresSettings, Settings

SECRET = "s3cr3t pass@host/db=x 'q' hostaddr=10.0.0.1"


def test_a_validation_error_never_echoes_a_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INVOICING_POSTGRES__PASSWORD", SECRET)  # the old single-role name
    with pytest.raises(pydantic.ValidationError) as info:
        Settings()
    assert "postgres.password" in str(info.value)
    assert SECRET not in str(info.value) and "s3cr3t" not in str(info.value)


def test_a_wrong_type_for_a_password_is_not_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INVOICING_POSTGRES__WORKER__USER", "Not A Role")
    monkeypatch.setenv("INVOICING_POSTGRES__WORKER__PASSWORD", SECRET)
    with pytest.raises(pydantic.ValidationError) as info:
        Settings()
    assert "Not A Role" not in str(info.value) and "s3cr3t" not in str(info.value)


def test_the_dsn_keeps_a_hostile_password_one_parameter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INVOICING_POSTGRES__WORKER__PASSWORD", SECRET)
    pg = Settings().postgres
    parsed = conninfo_to_dict(pg.dsn("worker"))
    assert parsed["password"] == SECRET
    assert parsed["host"] == pg.host and "hostaddr" not in parsed
    assert parsed["user"] == pg.worker.user and parsed["dbname"] == pg.database
    assert SECRET not in repr(pg) and SECRET not in pg.model_dump_json()


def test_the_alembic_url_keeps_the_password_as_given() -> None:
    pg = PostgresSettings.model_validate({"owner": {"user": "owner", "password": SECRET}})
    built = url(pg)
    assert built.password == SECRET and built.host == pg.host and built.database == pg.database
    assert SECRET not in repr(built) and SECRET not in str(built)
    rendered = built.render_as_string(hide_password=False)
    assert pydantic.TypeAdapter(str).validate_python(rendered)  # a URL string, escaped
    from sqlalchemy.engine import make_url

    assert make_url(rendered).password == SECRET  # what a string would have to survive
