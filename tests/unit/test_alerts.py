"""The alert rules only name metrics the code defines."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def defined_metrics() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "streams").rglob("*.py"):
        names |= set(re.findall(r'"(invoicing_[a-z_]+)"', path.read_text()))
    return names


def test_alert_rules_name_defined_metrics() -> None:
    rules = yaml.safe_load((ROOT / "ops" / "prometheus-alerts.yml").read_text())
    defined = defined_metrics()
    used: set[str] = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert rule["alert"] and rule["expr"] and rule["labels"]["severity"]
            used |= {
                m.removesuffix("_bucket") for m in re.findall(r"invoicing_[a-z_]+", rule["expr"])
            }
    missing = used - defined
    assert not missing, f"alert rules name undefined metrics: {sorted(missing)}"
    assert len(used) >= 10
