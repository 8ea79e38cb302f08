from benchmarks.models.first_runs import first_and_second, steady
from models import layers
from models.probes import PAD


def test_first_and_second_runs_time_every_op_of_the_chain_exact_and_padded() -> None:
    rows = first_and_second("tiny-random", (67, 85), threads=1)
    assert [r["tokens"] for r in rows] == [67, 85]
    assert [r["padded_rows"] for r in rows] == [80, 96]  # 71 and 89 tokens, up to PAD
    for r in rows:
        runs = [r[k] for k in ("first_s", "second_s", "padded_first_s", "padded_second_s",
                               "padded_other_first_s")]
        for times in runs:
            assert isinstance(times, list) and len(times) == len(r["ops"])  # type: ignore[arg-type]
            assert all(t > 0 for t in times)
    assert PAD == 16


def test_the_steady_cost_of_padding_times_each_case_both_ways() -> None:
    costs = steady("tiny-random", threads=1, repeats=1, prefills=(67,), decodes=(3,))
    assert [c["case"] for c in costs] == ["prefill 67", "decode b=3"]
    assert all(float(c[k]) > 0 for c in costs for k in ("exact", "padded"))  # type: ignore[arg-type]
    assert layers.EXACT_ROWS == 64  # restored
