"""docs/metrics.md documents every metric /metrics exposes, with its type and exactly its labels, and
nothing else (issue 47 point 5: documented cardinality)."""

import re
from pathlib import Path

from tests.ops.exported import families

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
ROW = re.compile(r"^\| `(gateway_\w+)` \| (\w+) \| ([^|]*) \| ([^|]+) \|", re.M)


def test_every_exported_metric_is_documented_with_its_type_and_labels():
    documented = {
        name: (kind, tuple(re.findall(r"`(\w+)`", labels)), series.strip())
        for name, kind, labels, series in ROW.findall(DOC.read_text())
    }
    exported = {f.name: (f.type, f.labels) for f in families()}
    assert {name: value[:2] for name, value in documented.items()} == exported
    assert all(series for _, _, series in documented.values())  # each says its cardinality
