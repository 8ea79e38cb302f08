from pathlib import Path

import pytest

import models
from models.choices import GemmChoice, KernelChoice, LayerChoice
from models.layers import EXACT_ROWS, padded_rows
from models.warmup import rows_to_warm, warm_limit, warm_rows


def test_every_padded_row_count_above_the_native_gemv_is_run(tiny_model_dir: Path) -> None:
    padded = KernelChoice(GemmChoice("aten", native_rows=16), LayerChoice(pad_rows=16))
    model = models.load(tiny_model_dir, dtype="float32", kernel_choice=padded)
    small = list(range(17, EXACT_ROWS + 1))  # exact: never padded
    assert warm_rows(model, threads=1, up_to=100) == [*small, 80, 96, 112]


def test_nothing_is_run_where_rows_are_not_padded(tiny_model_dir: Path) -> None:
    model = models.load(tiny_model_dir, dtype="float32", kernel_choice=KernelChoice())
    assert warm_rows(model, threads=1) == []


def test_every_row_count_a_plan_of_the_recipes_prompts_meets_is_warmed() -> None:
    # NOTE: the saturating recipe's prompts go up to 1,024 tokens, the batch tenant's are 1,024;
    # the server feeds up to max_batch_tokens (2,048 by default) per plan
    up_to = warm_limit(2048)
    rows = set(rows_to_warm(pad=16, native_rows=16, up_to=up_to))
    missing = [n for n in range(17, 1025) if padded_rows(n, 16) not in rows]
    assert up_to == 1024 and not missing
    assert len(rows) <= 128  # NOTE: oneDNN's primitive cache holds about 128 row counts


def test_the_warm_up_stops_at_what_a_plan_can_carry() -> None:
    assert warm_limit(300) == 300
    assert max(rows_to_warm(pad=16, native_rows=16, up_to=warm_limit(300))) == 304
    assert rows_to_warm(pad=0, native_rows=16, up_to=1024) == []
    with pytest.raises(ValueError, match="max_batch_tokens"):
        warm_limit(0)

