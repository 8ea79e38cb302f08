"""The start-up measurements behind a `KernelChoice` (see `models.tuning`).

Each `measure_*` times the candidates of one choice on this CPU, interleaved,
medians over repeats, over the model's own shapes (and, for GEMMs, its own
weights streamed from memory), and returns the winner with its timings (ms).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from models import attention as attn
from models import layers as lay
from models import native
from models.batch import DecodeGroup, SeqSpec, build_batch
from models.choices import PREFETCH, GemmChoice, LayerChoice
from models.config import ModelConfig
from models.kernels import layer_for
from models.kv_cache import KVCache
from models.layers import AttnDims, LayerWeights
from models.linear import Linear, onednn_available

GEMM_ROWS = (1, 16, 128, 512)
COMPUTE_BOUND_ROWS = 128  # from here GEMMs are compute-bound: a few layers' weights suffice
COMPUTE_BOUND_LAYERS = 3
NATIVE_ROWS = (1, 2, 4, 8)
PREFETCH_ROWS = (1, 2)
NORM_TOKENS = (1, 16, 128, 512)
GEMM_BUDGET_BYTES = 256 << 20  # weights timed per candidate: enough to stream from memory
PREFILL_SIZES = (16, 32, 64, 128, 256, 512)
DECODE_BATCHES = (1, 8, 32)
BLOCK = 16


def median_ms(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median wall time of each function, interleaved a, b, a, b, ... after one warm-up."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def gemm_candidates(dtype: torch.dtype) -> list[GemmChoice]:
    """Every backend for `dtype`; a half-precision model also tries them on float32
    copies of its weights (`upcast`)."""
    out = _backends(dtype, False)
    if dtype != torch.float32:
        out += _backends(torch.float32, True)
    return out


def _backends(dtype: torch.dtype, upcast: bool) -> list[GemmChoice]:
    aten = GemmChoice("aten", upcast=upcast)
    if not onednn_available(dtype):
        return [aten]
    return [aten, GemmChoice("onednn", upcast=upcast), GemmChoice("onednn", 16, upcast=upcast)]


def _budget_layers(layers: list[LayerWeights]) -> list[LayerWeights]:
    out: list[LayerWeights] = []
    for w in layers:
        if out and sum(x.nbytes for x in out) >= GEMM_BUDGET_BYTES:
            break
        out.append(w)
    return out


def _budget_linears(layers: list[LayerWeights]) -> list[Linear]:
    return [lin for w in _budget_layers(layers) for lin in w.linears()]


def _gemm_run(linears: list[Linear], rows: int, dtype: torch.dtype) -> Callable[[], None]:
    xs = {k: torch.randn(rows, k).to(dtype) for k in {lin.weight.shape[1] for lin in linears}}

    def run() -> None:
        for lin in linears:
            lin(xs[lin.weight.shape[1]])
    return run


def measure_gemm(layers: list[LayerWeights], dtype: torch.dtype,
                 repeats: int) -> tuple[GemmChoice, dict[str, dict[int, float]]]:
    """The backend with the least total time relative to the best at each row count."""
    plain = _budget_linears(layers)
    sets = {c: [Linear.build(lin.plain(), lin.plain_bias(), c) for lin in plain]
            for c in gemm_candidates(dtype)}
    ms: dict[str, dict[int, float]] = {c.name: {} for c in sets}
    few = 5 * COMPUTE_BOUND_LAYERS  # linears of that many layers
    for rows in GEMM_ROWS:
        subset = {c: (s if rows < COMPUTE_BOUND_ROWS else s[:few]) for c, s in sets.items()}
        got = median_ms({c.name: _gemm_run(s, rows, dtype) for c, s in subset.items()}, repeats)
        for name, t in got.items():
            ms[name][rows] = t
    best = {rows: min(ms[c.name][rows] for c in sets) for rows in GEMM_ROWS}
    score = {c: sum(ms[c.name][r] / best[r] for r in GEMM_ROWS) for c in sets}
    chosen = min(sets, key=lambda c: score[c])
    base = sets[chosen]
    if chosen.upcast:
        chosen, base = _half_rows(plain, sets, chosen, dtype, repeats, ms)
    if not native.supports(torch.float32 if chosen.upcast else dtype):
        return chosen, ms
    on_half = chosen.upcast and native.supports(dtype)  # the GEMV reads the model-dtype copy
    half_rows = max(NATIVE_ROWS) if on_half else chosen.half_rows
    gemvs = {pf: _gemv_linears(plain, chosen, pf, half_rows) for pf in PREFETCH}
    level, pf_ms = _prefetch_level(gemvs, dtype, repeats)
    ms.update({f"native@{pf}": t for pf, t in pf_ms.items()})
    rows, native_ms = _rows_won(gemvs[level], base, dtype, repeats)
    key = replace(chosen, half_rows=0).name  # NOTE: timings stay under the candidate's name
    ms["native"], ms[key] = native_ms["fast"], {**ms[key], **native_ms["base"]}
    half_rows = max(chosen.half_rows, rows) if on_half else chosen.half_rows
    return replace(chosen, native_rows=rows, half_rows=half_rows, prefetch=level), ms


def _gemv_linears(plain: list[Linear], chosen: GemmChoice, prefetch: str,
                  half_rows: int) -> list[Linear]:
    """`plain` with up to `max(NATIVE_ROWS)` rows on the native GEMV prefetching into
    `prefetch` (upcast: on the model-dtype copy up to `half_rows` rows, on the float32
    weights above), the rest as `chosen` runs them on the model's dtype (aten)."""
    choice = GemmChoice("aten", native_rows=max(NATIVE_ROWS), upcast=chosen.upcast,
                        half_rows=half_rows, prefetch=prefetch)
    return [Linear.build(lin.plain(), lin.plain_bias(), choice) for lin in plain]


def _prefetch_level(gemvs: dict[str, list[Linear]], dtype: torch.dtype,
                    repeats: int) -> tuple[str, dict[str, dict[int, float]]]:
    """The cache level the native GEMV streams its weights fastest through, by total time at
    the row counts decode steps run most (1 and 2), and the timings."""
    ms: dict[str, dict[int, float]] = {pf: {} for pf in gemvs}
    for rows in PREFETCH_ROWS:
        got = median_ms({pf: _gemm_run(lins, rows, dtype) for pf, lins in gemvs.items()}, repeats)
        for pf, t in got.items():
            ms[pf][rows] = t
    return min(ms, key=lambda pf: sum(ms[pf].values())), ms


def _half_rows(plain: list[Linear], sets: dict[GemmChoice, list[Linear]], chosen: GemmChoice,
               dtype: torch.dtype, repeats: int, ms: dict[str, dict[int, float]]
               ) -> tuple[GemmChoice, list[Linear]]:
    """`chosen` (upcast) with the rows up to which the model-dtype weights beat it (a step of
    few rows streams the weights, and float32 ones are twice the bytes), and its linears;
    the timings go into `ms`."""
    half = next(s for c, s in sets.items() if c.backend == "aten" and not c.upcast)
    rows, few_ms = _rows_won(half, sets[chosen], dtype, repeats)
    ms["half"], ms[chosen.name] = few_ms["fast"], {**ms[chosen.name], **few_ms["base"]}
    if not rows:
        return chosen, sets[chosen]
    chosen = replace(chosen, half_rows=rows)
    return chosen, [Linear.build(lin.plain(), lin.plain_bias(), chosen) for lin in plain]


def _rows_won(fast: list[Linear], base: list[Linear], dtype: torch.dtype,
              repeats: int) -> tuple[int, dict[str, dict[int, float]]]:
    """Largest row count (of `NATIVE_ROWS`) up to which `fast` takes less time than `base`
    summed over the measured counts, and at which it is faster itself (0: none): where the
    two run about as fast at one count, the machine's noise does not decide the counts above
    it (`rows_rule`)."""
    ms: dict[str, dict[int, float]] = {"fast": {}, "base": {}}
    for rows in NATIVE_ROWS:
        got = median_ms({"fast": _gemm_run(fast, rows, dtype),
                         "base": _gemm_run(base, rows, dtype)}, repeats)
        ms["fast"][rows], ms["base"][rows] = got["fast"], got["base"]
    return rows_rule(ms), ms


def rows_rule(ms: dict[str, dict[int, float]]) -> int:
    """The largest count r with sum(fast[c] for c <= r) < sum(base[c] for c <= r) and
    fast[r] < base[r], else 0 (pure).

    NOTE: the limit must win on its own too: fast counts below it must not carry one it
    loses (on an AVX2-only AMD EPYC, a bf16 GEMV 2-5x faster at 1-4 rows carried 8 rows,
    where it ran on the float32 copies at 2.4x the time: decode b=8 took 1.5x as long)."""
    limit, fast, base = 0, 0.0, 0.0
    for rows in sorted(ms["fast"]):
        fast, base = fast + ms["fast"][rows], base + ms["base"][rows]
        if fast < base and ms["fast"][rows] < ms["base"][rows]:
            limit = rows
    return limit


def _prefill_ms(n: int, cfg: ModelConfig, dtype: torch.dtype, kernels: list[str],
                repeats: int) -> dict[str, float]:
    h, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q = torch.randn(n, h, d).to(dtype)  # [n, H, d]
    k, v = torch.randn(hkv, n, d).to(dtype), torch.randn(hkv, n, d).to(dtype)  # [Hkv, n, d]
    nb = -(-n // BLOCK)
    table = torch.randperm(nb)  # [nb]: the sequence's blocks, in some order
    keys, values = (torch.zeros(hkv, nb * BLOCK, d, dtype=dtype) for _ in range(2))
    keys[:, :n], values[:, :n] = k, v
    keys, values = (t.view(hkv, nb, BLOCK, d)[:, table.argsort()].contiguous()
                    for t in (keys, values))  # [Hkv, nb, bs, d]: token c in block table[c // bs]
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    fns = {"matmul": lambda: attn.attend_matmul(q, k, v, mask),
           "sdpa": lambda: attn.attend_sdpa(q, k, v, None),
           "native": lambda: native.prefill_attention(q, keys, values, table, 0),
           "amx": lambda: native.prefill_attention(q, keys, values, table, 0, "amx")}
    return median_ms({name: fns[name] for name in kernels}, repeats)


def measure_prefill(cfg: ModelConfig, dtype: torch.dtype,
                    repeats: int) -> tuple[int, str, dict[int, dict[str, float]]]:
    """The kernel past the explicit matmuls (SDPA, or a native one over the paged cache: fp32
    vector arithmetic, or AMX tiles for bf16 where `native.amx_ready`) by total time over the
    sizes, and the largest n*n query-key pairs up to which explicit
    matmuls beat it at every size."""
    ok = native.supports(dtype) and native.prefill_supported(cfg.num_heads, cfg.num_kv_heads,
                                                             cfg.head_dim)
    amx = ok and dtype == torch.bfloat16 and native.amx_ready()
    kernels = ["matmul", "sdpa", *(["native"] if ok else []), *(["amx"] if amx else [])]
    ms = {n: _prefill_ms(n, cfg, dtype, kernels, repeats) for n in PREFILL_SIZES}
    beyond = min(kernels[1:], key=lambda k: sum(m[k] for m in ms.values()))
    limit = 0
    for n in PREFILL_SIZES:
        if ms[n]["matmul"] >= ms[n][beyond]:
            break
        limit = n * n
    return limit, beyond, ms


def _decode_inputs(cfg: ModelConfig, dtype: torch.dtype, b: int) -> tuple[
        torch.Tensor, DecodeGroup, torch.Tensor, torch.Tensor]:
    ctx = torch.tensor([64 + (448 * i) // max(1, b - 1) for i in range(b)])  # 64..512
    nb = -(-int(ctx.max()) // BLOCK)
    mask = (torch.arange(nb * BLOCK)[None, :] < ctx[:, None])[None, :, None, :]  # [1, B, 1, C]
    blocks = torch.randperm(b * nb).view(b, nb)  # scattered, as in a long-running cache
    g = DecodeGroup(torch.arange(b), blocks, mask, ctx)
    q = torch.randn(b, cfg.num_heads, cfg.head_dim).to(dtype)  # [B, H, d]
    keys = torch.randn(cfg.num_kv_heads, b * nb, BLOCK, cfg.head_dim).to(dtype)
    return q, g, keys, torch.randn_like(keys)  # keys, values: [Hkv, num_blocks, bs, d]


def _decode_kernels(cfg: ModelConfig, dtype: torch.dtype) -> list[str]:
    ok = native.supports(dtype) and native.decode_supported(cfg.num_heads, cfg.num_kv_heads,
                                                            cfg.head_dim)
    return ["sdpa", "matmul", "native"] if ok else ["sdpa", "matmul"]


def _decode_ms(cfg: ModelConfig, dtype: torch.dtype, b: int, kernels: list[str],
               repeats: int) -> dict[str, float]:
    q, g, keys, values = _decode_inputs(cfg, dtype, b)

    def gathered(kernel: Callable[..., torch.Tensor]) -> Callable[[], torch.Tensor]:
        return lambda: kernel(q, g, attn.gather(keys, g.blocks), attn.gather(values, g.blocks))
    fns = {"sdpa": gathered(attn.decode_sdpa), "matmul": gathered(attn.decode_matmul),
           "native": lambda: native.decode_attention(q, keys, values, g.blocks, g.lens)}
    return median_ms({k: fns[k] for k in kernels}, repeats)


def measure_decode(cfg: ModelConfig, dtype: torch.dtype,
                   repeats: int) -> tuple[str, dict[int, dict[str, float]]]:
    """The decode attention kernel with the least total time over batches 1, 8, 32."""
    kernels = _decode_kernels(cfg, dtype)
    ms = {b: _decode_ms(cfg, dtype, b, kernels, repeats) for b in DECODE_BATCHES}
    return min(kernels, key=lambda k: sum(m[k] for m in ms.values())), ms


def _norm_rope_ms(cfg: ModelConfig, dtype: torch.dtype, t: int, repeats: int) -> dict[str, float]:
    dims = AttnDims(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps)
    width = (dims.num_heads + 2 * dims.num_kv_heads) * dims.head_dim
    w = torch.randn(cfg.hidden_size).to(dtype)  # [D]
    kv = KVCache(range(1), -(-t // BLOCK), BLOCK, cfg.num_kv_heads, cfg.head_dim, dtype,
                 torch.device("cpu"))
    x = torch.randn(t, cfg.hidden_size).to(dtype)  # [T, D]
    qkv = torch.randn(t, width).to(dtype)  # [T, (H + 2*Hkv) * d]
    slots = torch.arange(t)
    cos, sin = lay.rope_cos_sin(slots, torch.rand(cfg.head_dim // 2), 1.0, dtype)

    def step(kernel: str) -> Callable[[], object]:
        return lambda: (lay.norm(x, w, 1e-6, kernel), lay.norm(x, w, 1e-6, kernel),
                        lay.rope_and_write(qkv, cos, sin, dims, kv, 0, slots, kernel))
    return median_ms({"aten": step("aten"), "native": step("native")}, repeats)


def measure_norm_rope(cfg: ModelConfig, dtype: torch.dtype,
                      repeats: int) -> tuple[str, dict[int, dict[str, float]]]:
    """aten against native RMSNorm + RoPE + KV write (one layer's), by total relative time."""
    if not native.supports(dtype):
        return "aten", {}
    ms = {t: _norm_rope_ms(cfg, dtype, t, repeats) for t in NORM_TOKENS}
    score = {k: sum(m[k] / min(m.values()) for m in ms.values()) for k in ("aten", "native")}
    return min(score, key=lambda k: score[k]), ms


def _decode_step(lw: list[LayerWeights], cfg: ModelConfig, dtype: torch.dtype, rows: int,
                 choice: LayerChoice, whole: bool) -> Callable[[], object]:
    dims = AttnDims(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps)
    kv = KVCache(range(len(lw)), rows * 8, BLOCK, cfg.num_kv_heads, cfg.head_dim, dtype,
                 torch.device("cpu"))
    seqs = [SeqSpec(f"r{i}", [1], 100, list(range(8 * i, 8 * i + 8))) for i in range(rows)]
    batch = build_batch(seqs, BLOCK, torch.device("cpu"))
    cos, sin = lay.rope_cos_sin(batch.positions, torch.rand(cfg.head_dim // 2), 1.0, dtype)
    x = torch.randn(rows, cfg.hidden_size).to(dtype)  # [B, D]

    def run() -> None:
        y = x
        for i, w in enumerate(lw):
            y = (lay.native_decoder_layer(y, w, dims, cos, sin, batch, kv, i) if whole
                 else lay.decoder_layer(y, w, dims, cos, sin, batch, kv, i, choice))
    return run


def measure_decode_layer(layers: list[LayerWeights], cfg: ModelConfig, dtype: torch.dtype,
                         gemm: GemmChoice, choice: LayerChoice,
                         repeats: int) -> tuple[str, dict[int, dict[str, float]]]:
    """Op by op (as `choice` runs them) against one native call per layer, for decode steps of
    1 and the most rows the native GEMV takes on weights of the model's dtype (`Linear.gemv_for`:
    upcast, only within `half_rows`), where it takes any."""
    rows = min(gemm.native_rows, gemm.half_rows) if gemm.upcast else gemm.native_rows
    if not (rows and native.supports(dtype) and native.decode_supported(
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)):
        return "ops", {}
    lw = [layer_for(w, gemm) for w in _budget_layers(layers)]
    ms = {}
    for r in sorted({1, rows}):
        ms[r] = median_ms({k: _decode_step(lw, cfg, dtype, r, choice, k == "native")
                           for k in ("ops", "native")}, repeats)
    score = {k: sum(m[k] for m in ms.values()) for k in ("ops", "native")}
    return min(score, key=lambda k: score[k]), ms


PAD = 16  # the row multiple tried: AMX's tile height, and oneDNN's row blocking
PAD_PROBE_ROWS = (73, 137, 217)  # 7 rows short of a multiple (the mean pad); met by no other probe


def layer_gemms(w: LayerWeights, rows: int, dtype: torch.dtype) -> Callable[[], object]:
    """One decoder layer's GEMMs at `rows` rows, with the epilogues `models.layers` fuses."""
    x = torch.randn(rows, w.qkv.weight.shape[1]).to(dtype)  # NOTE: packed weights keep [N, K]
    a = torch.randn(rows, w.o.weight.shape[1]).to(dtype)
    act = torch.randn(rows, w.down.weight.shape[1]).to(dtype)

    def run() -> None:
        w.qkv(x)
        w.o.add(a, x)
        w.down.add(act, x)
        w.up.mul(x, w.gate.silu(x))
    return run


def measure_pad(layers: list[LayerWeights], dtype: torch.dtype, gemm: GemmChoice,
                repeats: int) -> tuple[int, dict[int, dict[str, float]]]:
    """`PAD` when a layer's first run at a row count new to the process (oneDNN builds its
    GEMM primitives then) costs more than running every batch on rows padded to a multiple
    of `PAD`, else 0. Timed on the first layer at counts no earlier probe ran."""
    w = layer_for(layers[0], gemm)
    ms: dict[int, dict[str, float]] = {}
    for rows in PAD_PROBE_ROWS:
        exact, padded = layer_gemms(w, rows, dtype), layer_gemms(w, -(-rows // PAD) * PAD, dtype)
        t0 = time.perf_counter()
        exact()
        first = (time.perf_counter() - t0) * 1e3
        ms[rows] = {"first": first, **median_ms({"exact": exact, "padded": padded}, repeats)}
    return pad_rule(ms), ms


def pad_rule(ms: dict[int, dict[str, float]]) -> int:
    """`PAD` when the median first-run extra ("first" - "exact") exceeds the median cost of
    padding ("padded" - "exact") over the probed row counts, else 0 (pure)."""
    extra = statistics.median(m["first"] - m["exact"] for m in ms.values())
    cost = statistics.median(m["padded"] - m["exact"] for m in ms.values())
    return PAD if extra > cost else 0
