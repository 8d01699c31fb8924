"""The local stack's paths: a second stack from the same checkout (the chaos tier's)."""

from __future__ import annotations

from pathlib import Path

from streams.devtools.stack.layout import Layout
from streams.settings import Settings


def test_default_layout_keeps_everything_under_the_checkouts_local(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    assert layout.local == tmp_path / ".local"
    assert layout.data == tmp_path / ".local" / "data"
    assert layout.java == tmp_path / ".local" / "java"


def test_a_state_dir_moves_configs_data_logs_and_sockets_but_shares_the_jars(
    tmp_path: Path,
) -> None:
    state = tmp_path / "second"
    layout = Layout(tmp_path, state)
    for path in (layout.conf, layout.data, layout.logs, layout.run, layout.maildir):
        assert path.is_relative_to(state), path
    assert layout.java == tmp_path / ".local" / "java"
    assert layout.supervisor_socket.is_relative_to(state)


def test_the_state_dir_setting_reaches_the_stacks_local_dir(tmp_path: Path) -> None:
    settings = Settings.model_validate({"stack": {"home": tmp_path, "state_dir": tmp_path / "s"}})
    assert settings.stack.local_dir == tmp_path / "s"
    assert Settings.model_validate({"stack": {"home": tmp_path}}).stack.local_dir == (
        tmp_path / ".local"
    )
