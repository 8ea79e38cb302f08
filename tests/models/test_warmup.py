from pathlib import Path

import models
from models.choices import GemmChoice, KernelChoice, LayerChoice
from models.layers import EXACT_ROWS
from models.warmup import warm_rows


def test_every_padded_row_count_above_the_native_gemv_is_run(tiny_model_dir: Path) -> None:
    padded = KernelChoice(GemmChoice("aten", native_rows=16), LayerChoice(pad_rows=16))
    model = models.load(tiny_model_dir, dtype="float32", kernel_choice=padded)
    small = list(range(17, EXACT_ROWS + 1))  # exact: never padded
    assert warm_rows(model, threads=1, up_to=100) == [*small, 80, 96, 112]


def test_nothing_is_run_where_rows_are_not_padded(tiny_model_dir: Path) -> None:
    model = models.load(tiny_model_dir, dtype="float32", kernel_choice=KernelChoice())
    assert warm_rows(model, threads=1) == []
