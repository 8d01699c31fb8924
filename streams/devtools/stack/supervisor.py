"""The local stack's process supervisor: supervisord, driven over its XML-RPC socket.

We do not write a process manager: supervisord (a well-kept, widely deployed one)
starts each service with its own log file, knows their pids, stops exactly the
processes it started (``stopasgroup``/``killasgroup``), and its XML-RPC API lets
``stack`` commands and chaos tests start, stop and signal one service by name.

Every program is ``autostart=false, autorestart=false``: ``stack up`` starts them
one at a time in dependency order and waits for each to be healthy, and a
service that dies stays dead until someone looks (a chaos test must see the
fault it injected, not a silent restart).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import xmlrpc.client
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from streams.devtools.stack.errors import StackError
from streams.devtools.stack.layout import Layout


@dataclass(frozen=True)
class Program:
    """One supervised service.

    ``command`` is a list of arguments (rendered shell-quoted into supervisord's
    config); ``user`` runs it as another OS user (needs supervisord as root).
    """

    name: str
    command: Sequence[str]
    directory: Path
    environment: Mapping[str, str] = field(default_factory=dict)
    user: str | None = None
    stopsignal: str = "TERM"
    stopwaitsecs: int = 60
    startsecs: int = 2


def _quote(arg: str) -> str:
    # supervisord splits `command` with shlex; '%' must be doubled (it expands %(ENV_X)s).
    import shlex

    return shlex.quote(arg).replace("%", "%%")


def render_config(layout: Layout, programs: Sequence[Program]) -> str:
    """supervisord.conf for ``programs``; deterministic (same inputs, same text)."""
    lines = [
        "; Rendered by `invoicing stack up`; edits are overwritten.",
        "[unix_http_server]",
        f"file={layout.supervisor_socket}",
        "chmod=0700",
        "",
        "[supervisord]",
        f"logfile={layout.log('supervisord')}",
        f"pidfile={layout.supervisor_pid}",
        f"childlogdir={layout.logs}",
        "nodaemon=false",
        "identifier=invoicing-stack",
        "minfds=8192",
    ]
    if os.geteuid() == 0:
        lines.append("user=root")
    lines += [
        "",
        "[rpcinterface:supervisor]",
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
        "",
        "[supervisorctl]",
        f"serverurl=unix://{layout.supervisor_socket}",
        "",
    ]
    for program in programs:
        env = ",".join(f'{k}="{v}"' for k, v in sorted(program.environment.items()))
        lines += [
            f"[program:{program.name}]",
            "command=" + " ".join(_quote(str(a)) for a in program.command),
            f"directory={program.directory}",
            "autostart=false",
            "autorestart=false",
            f"startsecs={program.startsecs}",
            f"stopsignal={program.stopsignal}",
            f"stopwaitsecs={program.stopwaitsecs}",
            "stopasgroup=true",
            "killasgroup=true",
            "redirect_stderr=true",
            f"stdout_logfile={layout.log(program.name)}",
            "stdout_logfile_maxbytes=50MB",
            "stdout_logfile_backups=2",
        ]
        if env:
            lines.append(f"environment={env}")
        if program.user:
            lines.append(f"user={program.user}")
        lines.append("")
    return "\n".join(lines)


class Supervisor:
    """Control of the stack's supervisord: start it, and start/stop/signal programs."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    def _call(self, method: str, *args: Any) -> Any:
        """One XML-RPC call over supervisord's unix socket (supervisor's own
        transport), closing the connection afterwards."""
        from supervisor.xmlrpc import SupervisorTransport

        transport = SupervisorTransport(
            None, None, serverurl=f"unix://{self.layout.supervisor_socket}"
        )
        try:
            proxy = xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)
            return getattr(proxy.supervisor, method)(*args)
        finally:
            transport.close()

    def running(self) -> bool:
        """Whether supervisord answers on its socket."""
        if not self.layout.supervisor_socket.exists():
            return False
        try:
            state = self._call("getState")
        except (OSError, xmlrpc.client.Error):
            return False
        return cast(dict[str, Any], state).get("statename") == "RUNNING"

    def write_config(self, programs: Sequence[Program]) -> bool:
        """Write supervisord.conf; True when it changed."""
        text = render_config(self.layout, programs)
        path = self.layout.supervisor_conf
        if path.exists() and path.read_text() == text:
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return True

    def start_daemon(self, timeout_s: float = 20.0) -> None:
        """Start supervisord (it daemonises) and wait until it answers.

        Raises:
            StackError: it did not come up; its log is named.
        """
        exe = shutil.which("supervisord") or str(Path(sys.executable).parent / "supervisord")
        subprocess.run([exe, "-c", str(self.layout.supervisor_conf)], check=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.running():
                return
            time.sleep(0.2)
        raise StackError(
            f"supervisord did not answer within {timeout_s:.0f}s; see {self.layout.log('supervisord')}"
        )

    def apply_config_changes(self) -> None:
        """Like ``supervisorctl update``: reload the config, re-add changed programs
        (a changed program is stopped and re-added, to be started again by ``up``)."""
        added, changed, removed = self._call("reloadConfig")[0]
        for name in removed + changed:
            with contextlib.suppress(xmlrpc.client.Fault):
                self._call("stopProcessGroup", name)
            self._call("removeProcessGroup", name)
        for name in changed + added:
            self._call("addProcessGroup", name)

    def info(self, name: str) -> dict[str, Any]:
        """supervisord's process info for ``name`` (``statename``, ``pid``, …)."""
        return cast(dict[str, Any], self._call("getProcessInfo", name))

    def all_info(self) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], self._call("getAllProcessInfo"))

    def is_running(self, name: str) -> bool:
        try:
            return self.info(name).get("statename") == "RUNNING"
        except (OSError, xmlrpc.client.Error):
            return False

    def start(self, name: str) -> None:
        """Start ``name`` unless it runs already.

        Raises:
            StackError: supervisord could not start it (its log is named).
        """
        if self.is_running(name):
            return
        try:
            self._call("startProcess", name, True)
        except xmlrpc.client.Fault as exc:
            if "ALREADY_STARTED" in exc.faultString:
                return
            raise StackError(
                f"{name} failed to start ({exc.faultString}); see {self.layout.log(name)}"
            ) from exc

    def stop(self, name: str) -> None:
        """Stop ``name`` (graceful signal, then SIGKILL after its stopwaitsecs)."""
        try:
            self._call("stopProcess", name, True)
        except xmlrpc.client.Fault as exc:
            if "NOT_RUNNING" not in exc.faultString:
                raise StackError(f"{name} failed to stop: {exc.faultString}") from exc

    def signal(self, name: str, signal_name: str) -> None:
        """Send ``signal_name`` (e.g. ``"STOP"``, ``"CONT"``, ``"KILL"``) to ``name``."""
        self._call("signalProcess", name, signal_name)

    def shutdown(self, timeout_s: float = 120.0) -> None:
        """Stop every program, then supervisord itself; wait until its socket is gone."""
        try:
            self._call("stopAllProcesses", True)
            self._call("shutdown")
        except (OSError, xmlrpc.client.Error):
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.running():
            time.sleep(0.2)
        pid_file = self.layout.supervisor_pid
        while time.monotonic() < deadline and pid_file.exists():
            time.sleep(0.2)
