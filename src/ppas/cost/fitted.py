"""A step-time model fitted to measured engine steps (the vLLM plugin's step log).

    step_time = overhead_s                                      (launch, sampling, host sync)
              + per_prefill_token_s    * num_prefill_tokens     (GEMMs over prefill tokens)
              + per_attn_pair_s        * prefill_attn_work      (causal query-key pairs)
              + per_decode_s           * num_decodes            (GEMM rows of the decodes)
              + per_decode_ctx_token_s * decode_ctx_tokens      (KV read by decode attention)
              + per_prefill_req_s      * num_prefill_reqs       (host: a chunk's metadata)
              + eager_s * [num_tokens > cudagraph_max_tokens]   (eager launch, no CUDA graph)

The last two are the host overhead's shape beyond its constant: vLLM replays CUDA graphs
for steps of up to ``cudagraph_max_tokens`` tokens and launches larger ones kernel by
kernel; every scheduled chunk adds host work. A log identifies ``eager_s`` when it holds
steps on both sides of the capture size (``ppas profile``'s chunk sizes do), and
``per_prefill_req_s`` when some steps carry several chunks; otherwise they stay 0 and are
named in the fit statistics. Files written before they existed load with both at 0.

Features are ``StepShape``'s (``ppas.cost.base``). Every coefficient is >= 0 (non-negative
least squares), so the prediction is monotone in every feature, which
``largest_chunk_within``'s binary search relies on, and ``overhead_s > 0``, so every step
costs time. Least squares on absolute seconds keeps the summed step time, i.e. what
request latencies add up to, close to the measured sum.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from ppas.core.config import require
from ppas.core.errors import PpasError
from ppas.cost.base import CostModel, StepShape
from ppas.cost.catalog import CUDAGRAPH_MAX_TOKENS

COEFFICIENTS = ("overhead_s", "per_prefill_token_s", "per_attn_pair_s", "per_decode_s",
                "per_decode_ctx_token_s", "per_prefill_req_s", "eager_s")
#: Coefficients every model file gives (the later ones default to 0: older files).
REQUIRED = COEFFICIENTS[:5]
FORMAT = "ppas-fitted-cost-model/1"


def features(step: StepShape, cudagraph_max_tokens: int = CUDAGRAPH_MAX_TOKENS
             ) -> tuple[float, ...]:
    """The regressors, in ``COEFFICIENTS`` order."""
    return (1.0, float(step.num_prefill_tokens), float(step.prefill_attn_work),
            float(step.num_decodes), float(step.decode_ctx_tokens),
            float(step.num_prefill_reqs),
            1.0 if step.num_tokens > cudagraph_max_tokens else 0.0)


@dataclass(frozen=True)
class FitStats:
    """How well the model reproduces the steps it was fitted on."""

    num_steps: int
    mape: float  # mean |predicted - measured| / measured, over steps with measured > 0
    r2: float  # coefficient of determination (1 = perfect)
    rmse_s: float
    total_error: float  # (sum predicted - sum measured) / sum measured
    unfitted: tuple[str, ...] = ()  # coefficients no step exercised (left at 0)
    # coefficients the log exercised but cannot tell apart from the others (left at 0)
    unidentified: tuple[str, ...] = ()

    def line(self) -> str:
        s = (f"{self.num_steps} steps: MAPE {self.mape:.1%}, R^2 {self.r2:.4f}, "
             f"RMSE {self.rmse_s * 1e3:.3f} ms, total-time error {self.total_error:+.2%}")
        if self.unfitted:
            s += f"; not exercised (left 0): {', '.join(self.unfitted)}"
        if self.unidentified:
            s += (f"; not identifiable from this log (left 0, vary the step shapes, e.g. "
                  f"with ppas profile): {', '.join(self.unidentified)}")
        return s


@dataclass(frozen=True)
class FittedCostModel(CostModel):
    """Linear, non-negative step-time model (see the module doc for the formula)."""

    overhead_s: float
    per_prefill_token_s: float = 0.0
    per_attn_pair_s: float = 0.0
    per_decode_s: float = 0.0
    per_decode_ctx_token_s: float = 0.0
    per_prefill_req_s: float = 0.0
    eager_s: float = 0.0
    kv_capacity_tokens: int | None = None  # the server's KV cache size, when known
    cudagraph_max_tokens: int = CUDAGRAPH_MAX_TOKENS  # larger steps run eagerly
    stats: FitStats | None = field(default=None, compare=False)
    sources: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        for name in COEFFICIENTS:
            v = getattr(self, name)
            require(isinstance(v, int | float) and math.isfinite(v) and v >= 0,
                    f"fitted cost model: {name} must be a finite number >= 0, got {v!r}")
        require(self.overhead_s > 0, "fitted cost model: overhead_s must be > 0")
        require(self.kv_capacity_tokens is None or self.kv_capacity_tokens > 0,
                f"fitted cost model: kv_capacity_tokens must be > 0, got "
                f"{self.kv_capacity_tokens}")

    @property
    def coefficients(self) -> tuple[float, ...]:
        return tuple(float(getattr(self, n)) for n in COEFFICIENTS)

    def coefficients_line(self) -> str:
        """The coefficients in readable units (what calibrate and profile print)."""
        units = {"overhead_s": ("ms", 1e3), "per_prefill_token_s": ("us", 1e6),
                 "per_attn_pair_s": ("ns", 1e9), "per_decode_s": ("us", 1e6),
                 "per_decode_ctx_token_s": ("ns", 1e9), "per_prefill_req_s": ("us", 1e6),
                 "eager_s": ("ms", 1e3)}
        return "coefficients: " + ", ".join(
            f"{n.removesuffix('_s')} {getattr(self, n) * k:.4g} {u}"
            for n, (u, k) in units.items())

    def step_time(self, step: StepShape) -> float:
        return sum(c * x for c, x in zip(self.coefficients,
                                         features(step, self.cudagraph_max_tokens), strict=True))

    # ------------------------------------------------------------ files

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "formula": "step_time = " + " + ".join(
                ["overhead_s"] + [f"{c} * {f}" for c, f in zip(COEFFICIENTS[1:], (
                    "num_prefill_tokens", "prefill_attn_work", "num_decodes",
                    "decode_ctx_tokens", "num_prefill_reqs",
                    "[num_tokens > cudagraph_max_tokens]"), strict=True)]),
            "coefficients": {n: getattr(self, n) for n in COEFFICIENTS},
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "cudagraph_max_tokens": self.cudagraph_max_tokens,
            "fit": None if self.stats is None else asdict(self.stats),
            "sources": list(self.sources),
        }

    def to_file(self, path: str | Path) -> None:
        """Write JSON atomically (``ppas.core.outputs``)."""
        from ppas.core.outputs import write_json_atomic

        write_json_atomic(path, self.to_dict())

    @classmethod
    def from_file(cls, path: str | Path) -> FittedCostModel:
        """Load a file written by ``to_file``; any problem is a one-line PpasError."""
        p = Path(path)
        if not p.is_file():
            raise PpasError(f"fitted cost model file {str(p)!r} does not exist "
                            "(write one with: ppas calibrate STEPLOG -o FILE)")
        try:
            obj = json.loads(p.read_text())
        except (OSError, UnicodeDecodeError) as e:
            raise PpasError(f"{p}: cannot read fitted cost model: {e}") from None
        except json.JSONDecodeError as e:
            raise PpasError(f"{p}:{e.lineno}: not a fitted cost model: invalid JSON ({e.msg})"
                            ) from None
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise PpasError(f"{p}: not a fitted cost model (expected \"format\": {FORMAT!r})")
        coef = obj.get("coefficients")
        if not isinstance(coef, dict) or any(n not in coef for n in REQUIRED):
            raise PpasError(f"{p}: \"coefficients\" must give {', '.join(REQUIRED)}")
        coef = {n: coef.get(n, 0.0) for n in COEFFICIENTS}
        graph_max = obj.get("cudagraph_max_tokens", CUDAGRAPH_MAX_TOKENS)
        if not isinstance(graph_max, int) or isinstance(graph_max, bool) or graph_max < 0:
            raise PpasError(f"{p}: cudagraph_max_tokens must be an integer >= 0, got "
                            f"{graph_max!r:.40}")
        kv = obj.get("kv_capacity_tokens")
        if kv is not None and (not isinstance(kv, int) or isinstance(kv, bool)):
            raise PpasError(f"{p}: kv_capacity_tokens must be an integer or null, got {kv!r}")
        for n in COEFFICIENTS:
            if not isinstance(coef[n], int | float) or isinstance(coef[n], bool):
                raise PpasError(f"{p}: coefficient {n} must be a number, got {coef[n]!r}")
        sources = obj.get("sources") or []
        if not isinstance(sources, list) or not all(isinstance(x, str) for x in sources):
            raise PpasError(f"{p}: \"sources\" must be a list of file names, got {sources!r:.60}")
        stats = None
        if isinstance(obj.get("fit"), dict):
            try:
                st = obj["fit"]
                stats = FitStats(**{f.name: st[f.name] for f in fields(FitStats)
                                    if f.name not in ("unfitted", "unidentified")},
                                 unfitted=tuple(st.get("unfitted", ())),
                                 unidentified=tuple(st.get("unidentified", ())))
            except (KeyError, TypeError):
                stats = None  # fit statistics are informative only
        try:
            return cls(**{n: float(coef[n]) for n in COEFFICIENTS}, kv_capacity_tokens=kv,
                       cudagraph_max_tokens=graph_max, stats=stats, sources=tuple(sources))
        except PpasError as e:
            raise PpasError(f"{p}: {e}") from None


# ---------------------------------------------------------------- fitting


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0 (Lawson and Hanson's active-set method).

    Columns are scaled to unit norm first (features span ~15 orders of magnitude);
    all-zero columns get 0."""
    m, n = a.shape
    norms = np.linalg.norm(a, axis=0)
    live = norms > 0
    scaled = np.zeros_like(a)
    scaled[:, live] = a[:, live] / norms[live]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 10 * np.finfo(float).eps * max(m, n) * max(1.0, float(np.abs(scaled).sum(0).max()))
    w = scaled.T @ (b - scaled @ x)
    for _ in range(3 * n + 10):  # each outer round adds one variable; inner rounds drop
        candidates = ~passive & live
        if not candidates.any() or w[candidates].max() <= tol:
            break
        passive[np.argmax(np.where(candidates, w, -np.inf))] = True
        for _inner in range(n + 1):  # each round drops >= 1 variable from the passive set
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(scaled[:, passive], b, rcond=None)[0]
            if (z[passive] > tol).all():
                break
            bad = passive & (z <= tol)
            denom = x[bad] - z[bad]
            safe = np.where(denom > 0, denom, 1.0)
            alpha = float(np.min(np.where(denom > 0, x[bad] / safe, 0.0)))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        x = np.maximum(z, 0.0)
        w = scaled.T @ (b - scaled @ x)
    out = np.zeros(n)
    out[live] = x[live] / norms[live]
    return out


def fit_stats(model: CostModel, records: Sequence[tuple[StepShape, float]],
              unfitted: tuple[str, ...] = (), unidentified: tuple[str, ...] = ()) -> FitStats:
    """Errors of ``model`` on measured ``(step, seconds)`` records."""
    require(len(records) > 0, "no steps to evaluate")
    y = np.array([t for _, t in records], dtype=float)
    pred = np.array([model.step_time(s) for s, _ in records], dtype=float)
    pos = y > 0
    mape = float(np.mean(np.abs(pred[pos] - y[pos]) / y[pos])) if pos.any() else math.nan
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    ss_res = float(np.sum((pred - y) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
    total = float(y.sum())
    return FitStats(len(records), mape, r2, math.sqrt(ss_res / len(records)),
                    float(pred.sum() - total) / total if total > 0 else math.nan, unfitted,
                    unidentified)


#: Order in which coefficients enter the fit when the log cannot tell them all apart: the
#: per-step overhead first (every step pays it), then the terms that usually dominate.
_PRIORITY = ("overhead_s", "per_prefill_token_s", "per_attn_pair_s", "per_decode_ctx_token_s",
             "per_decode_s", "eager_s", "per_prefill_req_s")
#: A feature whose unit-norm column lies within this relative distance of the span of the
#: features already in the fit adds nothing the log can separate (collinear).
COLLINEAR_TOL = 0.02


def _residual_share(col: np.ndarray, basis: np.ndarray) -> float:
    """|col - its projection on span(basis)| / |col| (1 = independent, 0 = collinear)."""
    norm = float(np.linalg.norm(col))
    if norm == 0:
        return 0.0
    if basis.shape[1] == 0:
        return 1.0
    coef = np.linalg.lstsq(basis, col, rcond=None)[0]
    return float(np.linalg.norm(col - basis @ coef)) / norm


def fit(records: Iterable[tuple[StepShape, float]], *,
        kv_capacity_tokens: int | None = None, sources: Sequence[str] = (),
        cudagraph_max_tokens: int = CUDAGRAPH_MAX_TOKENS) -> FittedCostModel:
    """Fit the coefficients to measured ``(step, seconds)`` records by non-negative least
    squares, on the coefficients the log can identify.

    A coefficient stays 0 and is named in ``stats.unfitted`` when its feature is zero in
    every step (never exercised), and in ``stats.unidentified`` when the log cannot tell it
    apart from the others: its feature is (nearly) a linear combination of those already
    fitted (e.g. a light run with one decode in almost every step makes the per-decode
    cost collinear with the per-step overhead), or fitting it would drive the per-step
    overhead to zero. The model then carries the log's information in the identified
    coefficients (their sums still match the measured step times)."""
    recs = list(records)
    if not recs:
        raise PpasError("the step log has no steps to fit")
    a = np.array([features(s, cudagraph_max_tokens) for s, _ in recs], dtype=float)
    y = np.array([t for _, t in recs], dtype=float)
    if not np.all(np.isfinite(y)) or np.any(y < 0):
        raise PpasError("step times must be finite and >= 0")
    if not np.any(y > 0):
        raise PpasError("every step of the log took 0 s; nothing to fit")
    idx = {n: i for i, n in enumerate(COEFFICIENTS)}
    unfitted = tuple(n for n in COEFFICIENTS if not a[:, idx[n]].any())
    norms = np.linalg.norm(a, axis=0)
    unit = a / np.where(norms > 0, norms, 1.0)
    chosen: list[str] = []
    unidentified: list[str] = []
    for name in _PRIORITY:
        if name in unfitted:
            continue
        basis = unit[:, [idx[n] for n in chosen]]
        if (len(chosen) >= len(recs)
                or _residual_share(unit[:, idx[name]], basis) < COLLINEAR_TOL):
            unidentified.append(name)
        else:
            chosen.append(name)
    while True:
        cols = [idx[n] for n in chosen]
        x = np.zeros(len(COEFFICIENTS))
        x[cols] = nnls(a[:, cols], y)
        if x[0] > 0 or len(chosen) == 1:
            break
        # No room left for a per-step overhead: the last-entered term absorbs it. Drop
        # the term most aligned with the constant (the overhead's own feature) and refit.
        ones = unit[:, 0]
        worst = max(chosen[1:], key=lambda n: abs(float(unit[:, idx[n]] @ ones)))
        chosen.remove(worst)
        unidentified.append(worst)
    if x[0] <= 0:  # only the overhead left and still 0: impossible with some y > 0
        raise PpasError("the fit gives no per-step overhead; is the step log from one server?")
    c = [float(v) for v in x]  # COEFFICIENTS order
    model = FittedCostModel(c[0], c[1], c[2], c[3], c[4], c[5], c[6],
                            kv_capacity_tokens=kv_capacity_tokens,
                            cudagraph_max_tokens=cudagraph_max_tokens)
    ordered = tuple(n for n in COEFFICIENTS if n in unidentified)
    return dataclasses.replace(model, stats=fit_stats(model, recs, unfitted, ordered),
                               sources=tuple(sources))


__all__ = ["COEFFICIENTS", "FitStats", "FittedCostModel", "features", "fit", "fit_stats", "nnls"]
