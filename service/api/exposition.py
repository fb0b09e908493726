"""Prometheus's text format (version 0.0.4), written with plain string formatting."""

from __future__ import annotations

import math
from collections.abc import Mapping

from prometheus_client.core import Metric

# Family types whose text names the family with a suffix the samples carry.
_SUFFIXED = {"counter": "_total"}


def family_text(metric: Metric) -> str:
    """One family: its HELP and TYPE lines, then its samples, each line ended.

    prometheus-client's ``generate_latest`` checks and escapes every label name and metric
    name of every sample: about 10 µs a sample, 9 ms for the ~650 samples of a
    twenty-service policy. A router scraping 20 times a second cannot wait for that, so
    ``/metrics`` writes its families here instead, at a fraction of the cost: names are
    vramd's own constants and need no checking; label values and help texts are escaped as
    the format requires, and labels are sorted by name, as prometheus-client writes them.
    Families are the ones prometheus-client's collectors yield (``Metric``); counters' and
    histograms' ``_created`` samples are left out, as prometheus-client leaves them out
    when ``PROMETHEUS_DISABLE_CREATED_SERIES`` is set.
    """
    name = metric.name + _SUFFIXED.get(metric.type, "")
    help_text = metric.documentation.replace("\\", "\\\\").replace("\n", "\\n")
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {metric.type}"]
    lines += [
        sample_line(s.name, s.labels, s.value)
        for s in metric.samples
        if not s.name.endswith("_created")
    ]
    return "\n".join(lines) + "\n"


def sample_line(name: str, labels: Mapping[str, str], value: float) -> str:
    if not labels:
        return f"{name} {number(value)}"
    pairs = ",".join(f'{key}="{escape(text)}"' for key, text in sorted(labels.items()))
    return f"{name}{{{pairs}}} {number(value)}"


def escape(text: str) -> str:
    """A label value as the format wants it: backslash, quote and newline escaped."""
    if "\\" in text or '"' in text or "\n" in text:
        return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return text


def number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))
