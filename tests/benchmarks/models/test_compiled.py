import pytest

from benchmarks.models.compiled import compare


# NOTE: importing inductor warns from inside torch (torch.jit.script_method is deprecated)
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_compiled_layer_group_is_timed_beside_the_tuned_and_portable_ones() -> None:
    rows = compare("tiny-random", threads=1, repeats=1, cases=(("prefill", 24), ("decode", 2)))
    assert [r["case"] for r in rows] == ["prefill 24", "decode 2"]
    for r in rows:
        assert all(float(r[k]) > 0 for k in ("tuned", "portable", "compiled", "compile_s"))
