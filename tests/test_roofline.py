"""The roofline's physics: catalog facts with their sources, the §2 per-operator anchors,
the held-out §2 chunking figures of other model sizes, and monotone step times."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppas.core.errors import PpasError
from ppas.cost.base import CostModel, StepShape, largest_chunk_within, largest_fitting
from ppas.cost.catalog import ATTENTION_KERNELS, HARDWARE, MODELS
from ppas.cost.roofline import RooflineCostModel

GATE_UP = 2  # index in ModelArch.gemms


def test_catalog_throughputs_are_the_measured_ones() -> None:
    rtx = HARDWARE.get("rtx5090")
    # GeForce FP32-accumulate peak, not the 419 FP16-accumulate figure.
    assert rtx.bf16_tflops == 209.5
    m = MODELS.get("qwen2.5-3b")
    k, out = m.gemms[GATE_UP]
    assert (k, out) == (2048, 22016)
    # P-PAS §2: the 16384-token gate-up GEMM in 6.66 ms; FlashAttention over 16k causal
    # tokens of one layer in 5.83 ms.
    assert rtx.gemm_flops == pytest.approx(2 * 16384 * k * out / 6.66e-3, rel=0.005)
    assert rtx.attn_flops == pytest.approx(4 * m.q_width * 16384 * 16385 / 2 / 5.83e-3,
                                           rel=0.005)
    for name in HARDWARE.names():
        hw = HARDWARE.get(name)
        assert hw.source, name
        assert hw.gemm_flops <= 1.07 * hw.bf16_tflops * 1e12  # boost clocks at most
        assert hw.attn_flops < hw.gemm_flops and hw.bandwidth < hw.mem_bw_gbs * 1e9


def test_attention_backend_by_architecture() -> None:
    assert HARDWARE.get("h100-sxm-80gb").attention_backend == "flash-attn-3"
    assert HARDWARE.get("h200").attention_backend == "flash-attn-3"
    for name in ("a100-sxm-80gb", "rtx5090", "l40s"):
        assert HARDWARE.get(name).attention_backend == "flash-attn-2"


def test_section2_operator_anchors() -> None:
    """One Qwen2.5-3B decoder block on the RTX 5090 (§2): gate-up GEMM 7.16 ms as eight 2k
    chunks vs 6.66 ms as one 16k chunk; FlashAttention 7.21 vs 5.83 ms."""
    cm = RooflineCostModel("rtx5090", "qwen2.5-3b")
    assert 8 * cm.gemm_time(2048, GATE_UP) == pytest.approx(7.16e-3, rel=0.1)
    assert cm.gemm_time(16384, GATE_UP) == pytest.approx(6.66e-3, rel=0.1)
    attn2k = sum(cm.prefill_attention_time(StepShape.of([(2048, 2048 * i)], []))
                 for i in range(8))
    assert attn2k == pytest.approx(7.21e-3, rel=0.1)
    assert cm.prefill_attention_time(StepShape.of([(16384, 0)], [])) == pytest.approx(
        5.83e-3, rel=0.1)


@pytest.mark.parametrize("model,paper", [("qwen2.5-0.5b", -10.5), ("qwen2.5-3b", -11.6),
                                         ("qwen2.5-7b", -0.6)])
def test_section2_chunking_within_10_points(model: str, paper: float) -> None:
    """Held out of the calibration (only the 3B's per-operator anchors are fitted): the
    device time of a 25k prompt's prefill, 2k -> 16k chunks, within 10 points."""
    cm = RooflineCostModel("rtx5090", model)

    def device(chunk: int) -> float:
        return sum(cm.device_time(StepShape.of([(min(chunk, 25000 - d), d)], []))
                   for d in range(0, 25000, chunk))

    change = 100 * (device(16384) / device(2048) - 1)
    assert abs(change - paper) <= 10


def test_datacenter_gpus_are_faster_than_the_rtx5090() -> None:
    step = StepShape.of([(16384, 8192)], [])
    t = {g: RooflineCostModel(g, "qwen2.5-3b").device_time(step)
         for g in ("rtx5090", "a100-sxm-80gb", "h100-sxm-80gb")}
    assert t["h100-sxm-80gb"] < t["a100-sxm-80gb"] < t["rtx5090"]


@settings(max_examples=200, deadline=None)
@given(hw=st.sampled_from(HARDWARE.names()), model=st.sampled_from(MODELS.names()),
       c=st.integers(1, 20000), p=st.integers(0, 30000), d=st.integers(0, 64),
       k=st.integers(0, 30000), tp=st.sampled_from([1, 2, 4]))
def test_step_time_is_monotone_in_the_chunk(hw: str, model: str, c: int, p: int, d: int,
                                            k: int, tp: int) -> None:
    """``largest_chunk_within`` bisects on the chunk: one more token never costs less."""
    try:
        cm = RooflineCostModel(hw, model, tp=tp)
    except PpasError:  # the model does not fit this GPU at this tp
        return
    a = cm.step_time(StepShape.of([(c, p)], [k] * d))
    b = cm.step_time(StepShape.of([(c + 1, p)], [k] * d))
    assert b >= a > 0


@settings(max_examples=200, deadline=None)
@given(hw=st.sampled_from(HARDWARE.names()), model=st.sampled_from(MODELS.names()),
       target=st.floats(0.0, 0.5), d=st.integers(0, 64), k=st.integers(0, 30000),
       p=st.integers(0, 30000), c_max=st.integers(1, 16384), guess=st.integers(-5, 20000))
def test_largest_chunk_within_from_a_guess_is_the_bisection(
        hw: str, model: str, target: float, d: int, k: int, p: int, c_max: int,
        guess: int) -> None:
    """The search from any guess (sloweave passes its last chunk) ends where the one from
    [1, c_max] does, and that is the largest chunk that fits: the chunk that fits, the
    next one (if any) that does not."""
    try:
        cm = RooflineCostModel(hw, model)
    except PpasError:
        return
    plain = largest_chunk_within(cm, target, d, c_max, k, p)
    assert largest_chunk_within(cm, target, d, c_max, k, p, guess) == plain
    t = cm.chunk_time(p, d, k * d)
    assert plain == 0 or t(plain) <= target
    assert plain == c_max or t(plain + 1) > target


@settings(max_examples=300, deadline=None)
@given(hw=st.sampled_from(HARDWARE.names()), model=st.sampled_from(MODELS.names()),
       c=st.integers(0, 40000), p=st.integers(0, 200000), d=st.integers(0, 300),
       k=st.integers(0, 10**7), tp=st.sampled_from([1, 2, 4]),
       kernel=st.sampled_from([None, *ATTENTION_KERNELS]))
def test_chunk_time_is_step_time_of_one_chunk(hw: str, model: str, c: int, p: int, d: int,
                                              k: int, tp: int, kernel: str | None) -> None:
    """``chunk_time`` (the searches' inlined pricing) is ``step_time`` of the one-chunk
    shape, to the bit."""
    try:
        cm = RooflineCostModel(hw, model, tp=tp, attention_kernel=kernel)
    except PpasError:  # the model does not fit this GPU at this tp
        return
    k = k if d else 0
    assert cm.chunk_time(p, d, k)(c) == cm.step_time(StepShape.one_chunk(c, p, d, k))
    if c:
        assert cm.chunk_pricer()(c, p, d, k) == cm.chunk_time(p, d, k)(c)
        assert CostModel.chunk_pricer(cm)(c, p, d, k) == cm.chunk_time(p, d, k)(c)


@settings(max_examples=400, deadline=None)
@given(hw=st.sampled_from(HARDWARE.names()), model=st.sampled_from(MODELS.names()),
       c=st.integers(1, 8192), p=st.integers(0, 200000), d=st.integers(0, 300),
       k=st.integers(0, 10**7), c_max=st.integers(1, 8192), guess=st.integers(-3, 9000),
       at=st.sampled_from([-1, 0, 1]), tp=st.sampled_from([1, 2, 4]),
       kernel=st.sampled_from([None, *ATTENTION_KERNELS]), k_step=st.integers(0, 10**7))
def test_chunk_search_is_largest_fitting_on_chunk_time(
        hw: str, model: str, c: int, p: int, d: int, k: int, c_max: int, guess: int,
        at: int, tp: int, kernel: str | None, k_step: int) -> None:
    """``chunk_search`` (the search with ``chunk_time`` inlined) finds the chunk
    ``largest_fitting`` finds on ``chunk_time``, from any guess, with the target on the
    price of a chunk or one float either side of it (where a pricing off by one bit would
    answer otherwise); ``priced_chunk_search`` finds it too, with ``chunk_pricer``'s
    price of it beside ``k_step`` decode tokens (or ``k``'s), to the bit."""
    try:
        cm = RooflineCostModel(hw, model, tp=tp, attention_kernel=kernel)
    except PpasError:  # the model does not fit this GPU at this tp
        return
    k = k if d else 0
    t = cm.chunk_time(p, d, k)
    target = t(c)
    target = math.nextafter(target, math.inf * at) if at else target
    want = largest_fitting(t, target, c_max, guess)
    assert cm.chunk_search()(p, d, k, target, c_max, guess) == want
    assert CostModel.chunk_search(cm)(p, d, k, target, c_max, guess) == want
    for ks in (k, k_step if d else 0):
        priced = cm.priced_chunk_search()(p, d, k, target, c_max, guess, ks)
        assert priced == (want, cm.chunk_pricer()(want, p, d, ks) if want else 0.0)
        assert CostModel.priced_chunk_search(cm)(p, d, k, target, c_max, guess, ks) == priced


@settings(max_examples=300, deadline=None)
@given(hw=st.sampled_from(HARDWARE.names()), model=st.sampled_from(MODELS.names()),
       chunks=st.lists(st.tuples(st.integers(1, 20000), st.integers(0, 200000)), max_size=6),
       decodes=st.lists(st.integers(0, 200000), max_size=300),
       tp=st.sampled_from([1, 2, 4]), kernel=st.sampled_from([None, *ATTENTION_KERNELS]))
def test_pricer_is_step_time_of_the_fields(hw: str, model: str, chunks: list[tuple[int, int]],
                                           decodes: list[int], tp: int,
                                           kernel: str | None) -> None:
    """``pricer`` (the simulator's pricing of its tally) is ``step_time`` of the shape with
    those fields, to the bit; a subclass that overrides ``step_time`` is priced by it."""
    try:
        cm = RooflineCostModel(hw, model, tp=tp, attention_kernel=kernel)
    except PpasError:  # the model does not fit this GPU at this tp
        return
    shape = StepShape.of(chunks, decodes)
    fields = (shape.num_prefill_tokens, shape.num_prefill_reqs, shape.prefill_attn_work,
              shape.prefill_kv_tokens, shape.num_decodes, shape.decode_ctx_tokens)
    assert cm.pricer()(*fields) == cm.step_time(shape)

    class Doubled(RooflineCostModel):
        def step_time(self, step: StepShape) -> float:
            return 2 * super().step_time(step)

    doubled = Doubled(hw, model, tp=tp, attention_kernel=kernel)
    assert doubled.pricer()(*fields) == 2 * cm.step_time(shape)
    assert doubled.chunk_time(7, 3, 300)(512) == 2 * cm.chunk_time(7, 3, 300)(512)
    assert doubled.chunk_search() is not doubled._search  # (the generic search, its pricing)
    assert doubled.priced_chunk_search()(7, 3, 300, 1.0, 512, 0, 303) == (
        512, 2 * cm.chunk_time(7, 3, 303)(512))
    assert doubled.chunk_pricer()(512, 7, 3, 300) == 2 * cm.chunk_time(7, 3, 300)(512)


def test_attention_throughput_is_per_kernel_and_architecture_with_the_softmax_share() -> None:
    """Published figures at head dim 128 (catalog-facts.md): FlashAttention-2 ~230 TFLOP/s
    on the A100, ~35% of peak on Hopper, FlashAttention-3 620 on Hopper; the head-dimension
    dependence is d / (d + d0), d0 the tensor FLOP per clock per SM over 4 x 16 exps."""
    h100, a100, rtx = (HARDWARE.get(n) for n in ("h100-sxm-80gb", "a100-sxm-80gb", "rtx5090"))
    assert (h100.softmax_head_dim, a100.softmax_head_dim) == (
        pytest.approx(64, rel=0.01), pytest.approx(32, rel=0.01))
    assert rtx.softmax_head_dim == pytest.approx(8, rel=0.01)  # half-rate FP32 accumulate
    # At head dim 128 every GPU keeps its catalog figure for vLLM's kernel (the paper grid).
    for name in HARDWARE.names():
        hw = HARDWARE.get(name)
        assert hw.attention_flops(None, 128) == pytest.approx(hw.attn_flops)
        assert hw.attention_flops(None, 64) < hw.attn_flops < hw.attention_flops(None, 256)
    # A check, not a fit: FA3 reaches ~740 TFLOP/s at head dim 256 (Shah et al. 2024).
    assert h100.attention_flops("flash-attn-3", 256) == pytest.approx(740e12, rel=0.02)
    assert h100.attention_flops("flash-attn-2") == pytest.approx(0.35 * 989e12)
    assert h100.attention_flops("sdpa-flash-attn-2") == h100.attention_flops("flash-attn-2")
    assert h100.attention_flops("cudnn") == h100.attention_flops("flash-attn-3")
    with pytest.raises(PpasError, match="no published throughput"):
        a100.attention_flops("flash-attn-3")
    with pytest.raises(PpasError, match="unknown attention kernel"):
        h100.attention_flops("flash-attn-9")


def test_the_attention_kernel_is_a_parameter_of_the_cost_model() -> None:
    fa3 = RooflineCostModel("h200", "qwen3-8b")
    fa2 = RooflineCostModel("h200", "qwen3-8b", attention_kernel="flash-attn-2")
    assert fa3.describe()["attention_backend"] == "flash-attn-3"
    assert fa2.describe()["attention_backend"] == "flash-attn-2"
    big = StepShape.of([(16384, 8192)], [])
    ratio = fa2.prefill_attention_time(big) / fa3.prefill_attention_time(big)
    assert ratio == pytest.approx(620 / (0.35 * 989), rel=0.05)
    # The GEMMs and the decodes' KV read do not depend on the attention kernel.
    dec = StepShape.of([], [8192] * 8)
    assert fa2.step_time(dec) == fa3.step_time(dec)


def test_short_chunks_over_long_contexts_are_bound_by_reading_the_kv() -> None:
    cm = RooflineCostModel("h100-sxm-80gb", "qwen3-8b")
    m = cm.model
    kv_read = m.kv_bytes_per_token / m.layers / cm.hardware.bandwidth
    ctx = 32768
    short = StepShape.of([(8, ctx)], [])
    assert cm.prefill_attention_time(short) == pytest.approx(kv_read * (ctx + 8))
    long = StepShape.of([(4096, ctx)], [])
    assert cm.prefill_attention_time(long) > 2 * kv_read * (ctx + 4096)


@settings(max_examples=300, deadline=None)
@given(hw=st.sampled_from(HARDWARE.names()), model=st.sampled_from(MODELS.names()),
       chunks=st.lists(st.tuples(st.integers(1, 8192), st.integers(0, 100_000)), max_size=4),
       decodes=st.lists(st.integers(1, 100_000), max_size=300))
def test_step_time_is_device_time_plus_the_fixed_costs(hw: str, model: str,
                                                       chunks: list[tuple[int, int]],
                                                       decodes: list[int]) -> None:
    """``step_time`` (its device time inlined) is, bit for bit, ``device_time`` plus the
    step's and the requests' fixed costs."""
    try:
        cm = RooflineCostModel(hw, model)
    except PpasError:
        return  # the model does not fit on this GPU
    step = StepShape.of(chunks, decodes)
    n = step.num_tokens
    if n == 0:
        assert cm.step_time(step) == 0.0
        return
    fixed = cm._fixed + (cm._eager if n > cm._graph_max else 0.0)
    want = cm.device_time(step) + fixed + cm._per_req * (step.num_prefill_reqs + step.num_decodes)
    assert cm.step_time(step) == want
