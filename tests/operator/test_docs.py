"""docs/operator.md documents every field of the spec and every chart value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pagoda.operator import crd

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "operator.md").read_text()


def _paths(schema: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for name, sub in schema.get("properties", {}).items():
        path = f"{prefix}.{name}" if prefix else name
        out.append(path)
        if prefix.count(".") < 1:  # two levels: deeper ones are core API objects
            out += _paths(sub, path)
    return out


def test_every_spec_field_is_in_the_reference() -> None:
    spec = crd.build()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    missing = [p for p in _paths(spec) if f"`{p}`" not in DOC and not _covered_by_parent(p)]
    assert missing == []


def _covered_by_parent(path: str) -> bool:
    # Objects documented through their fields (resources, engine, ...) need no row.
    return any(f"`{path}." in line for line in DOC.splitlines())


def test_every_status_field_is_documented() -> None:
    status = crd.build()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert [name for name in status["properties"] if f"`{name}`" not in DOC] == []


def test_every_top_level_chart_value_is_documented() -> None:
    values = yaml.safe_load((REPO / "charts" / "pagoda" / "values.yaml").read_text())
    assert [key for key in values if f"`{key}" not in DOC] == []
