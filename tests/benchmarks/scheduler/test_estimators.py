import pytest

from benchmarks.scheduler import estimators


@pytest.mark.parametrize(("mape", "cov", "met"), [(0.029, 0.0, True), (0.031, 0.01, False),
                                                  (0.14, 0.10, True), (0.16, 0.10, False)])
def test_operator_goal_is_max_of_3_percent_and_1_5_cov(mape: float, cov: float,
                                                       met: bool) -> None:
    g = estimators.goal({"groups": {"operators": {"mape": mape, "cov": cov}}})
    assert g["met"] is met
    assert g["bound"] == pytest.approx(max(0.03, 1.5 * cov))
