from pathlib import Path

import pytest

from scheduler.bench import estimators as bench_est
from scheduler.bench import machine

CPUINFO = """processor\t: 0
model name\t: Test CPU
flags\t\t: fpu avx2 avx512f amx_tile amx_bf16

processor\t: 1
model name\t: Test CPU
flags\t\t: fpu avx2 avx512f amx_tile amx_bf16 avx512_bf16
"""


def test_capability_line_reads_the_first_cpu(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(CPUINFO)
    monkeypatch.setattr(machine, "_CPUINFO", info)
    line = machine.capability_line()
    assert line.startswith("Test CPU, ")
    assert "AMX yes, AVX512-BF16 no, AVX512 yes, AVX2 yes" in line  # first block only
    assert "dispatches" in line


def test_capability_line_without_cpuinfo(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "_CPUINFO", tmp_path / "absent")
    assert machine.capability_line().startswith("unknown CPU, ")
    assert "load average" in machine.machine_line()


@pytest.mark.parametrize(("mape", "cov", "met"), [(0.029, 0.0, True), (0.031, 0.01, False),
                                                  (0.14, 0.10, True), (0.16, 0.10, False)])
def test_operator_goal_is_max_of_3_percent_and_1_5_cov(mape: float, cov: float,
                                                       met: bool) -> None:
    g = bench_est.goal({"groups": {"operators": {"mape": mape, "cov": cov}}})
    assert g["met"] is met
    assert g["bound"] == pytest.approx(max(0.03, 1.5 * cov))
