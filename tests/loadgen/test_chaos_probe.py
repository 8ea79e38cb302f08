"""The chaos probe's readings of /metrics (pure: parsed samples in, figures out)."""

from __future__ import annotations

from loadgen.chaos_probe import metric_samples, slo_by_class

ONE = """\
slicegate_slo_attainment{model_name="default",priority="high"} 0.98
slicegate_slo_attainment{model_name="default",priority="low"} 1.0
"""
TWO = ONE + """\
slicegate_slo_attainment{model_name="batch",priority="high"} 0.5
"""


def test_one_model_reads_per_class_and_several_per_model_and_class() -> None:
    assert slo_by_class(metric_samples(ONE, "slicegate_slo_attainment")) == {
        "high": 0.98, "low": 1.0}
    assert slo_by_class(metric_samples(TWO, "slicegate_slo_attainment")) == {
        "default/high": 0.98, "default/low": 1.0, "batch/high": 0.5}
