from models.bench_first import first_and_second


def test_first_and_second_runs_time_every_op_of_the_chain() -> None:
    rows = first_and_second("tiny-random", (37, 53), threads=1)
    assert [r["tokens"] for r in rows] == [37, 53]
    for r in rows:
        first, second = r["first_s"], r["second_s"]
        assert isinstance(first, list) and isinstance(second, list)
        assert len(first) == len(second) == len(r["ops"])  # type: ignore[arg-type]
        assert all(t > 0 for t in first + second)
