"""An experiment's ``[[arms]]``: one server configuration each, the ppas plugin with a
policy or stock vLLM with its own knobs (``ppas.experiment.spec``, the file)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from ppas.core.config import (
    FieldError,
    check_at_most,
    check_fields,
    check_keys,
    config_error,
    from_table,
    require,
)
from ppas.core.decision import Knob
from ppas.core.errors import PpasError
from ppas.core.limits import MAX_NUM_SEQS, MAX_PREFILL_INTERVAL, MAX_PROMPT_TOKENS
from ppas.cost import make_cost_model
from ppas.live.versions import simulated_line
from ppas.policies import make_policy
from ppas.policies.vllm_stock import KNOB_PARAMS

FITTED_AUTO = "fitted:auto"
#: Stock vLLM scheduler knobs an arm may set (no plugin): every knob of the supported
#: release lines (``ppas.live.versions``) that shapes prefill or admission. Each becomes
#: ``Knob.flag`` N (a boolean: the flag alone when true). The simulator models those that
#: are ``vllm:`` parameters (``KNOB_PARAMS``); an arm setting another gets no prediction.
STOCK_ARGS = (Knob.MAX_NUM_BATCHED_TOKENS, Knob.LONG_PREFILL_TOKEN_THRESHOLD,
              Knob.LONG_PREFILL_TOKEN_THRESHOLD_ADAPTIVE, Knob.PREFILL_SCHEDULE_INTERVAL,
              Knob.MAX_NUM_SEQS, Knob.MAX_NUM_ACTIVE_SEQS)
#: The stock knobs that are switches (true or false in the file; 1 or 0 in ``ArmSpec.stock``);
#: every other one is an integer >= 1.
_STOCK_SWITCHES = (Knob.LONG_PREFILL_TOKEN_THRESHOLD_ADAPTIVE,)
#: the largest value of each integer knob: a step's tokens stay within a context, sequences
#: within the engine's slots
_STOCK_MAX = {Knob.MAX_NUM_BATCHED_TOKENS: MAX_PROMPT_TOKENS,
              Knob.LONG_PREFILL_TOKEN_THRESHOLD: MAX_PROMPT_TOKENS,
              Knob.PREFILL_SCHEDULE_INTERVAL: MAX_PREFILL_INTERVAL,
              Knob.MAX_NUM_SEQS: MAX_NUM_SEQS,
              Knob.MAX_NUM_ACTIVE_SEQS: MAX_NUM_SEQS}
_ARM_NAME = re.compile(r"^[\w.:,=+-]+$")
_ONE_KIND = ("give exactly one of policy = \"NAME:...\" (the ppas plugin) or [arms.stock] "
             "(stock vLLM scheduler arguments)")


@dataclass(frozen=True)
class ArmSpec:
    """One server configuration: the ppas plugin with ``policy``, or stock vLLM with
    ``stock`` scheduler arguments (the file's ``[arms.stock]`` table, in ``STOCK_ARGS``
    order). ``baseline`` arms are what improvements are relative to."""

    name: str
    policy: str | None = None
    stock: tuple[tuple[str, int], ...] = ()
    cost_model: str | None = None
    max_num_batched_tokens: int | None = None  # None: the policy's own (after binding)
    baseline: bool = False

    def __post_init__(self) -> None:
        require(bool(_ARM_NAME.match(self.name)), "must be letters, digits and _.:,=+- only, "
                f"got {self.name!r}", key="name")
        if self.policy is not None:
            try:
                make_policy(self.policy)
            except PpasError as e:
                raise FieldError("policy", str(e)) from None
        check_fields(self, "max_num_batched_tokens", at_least=1)
        check_at_most(self, MAX_PROMPT_TOKENS, "max_num_batched_tokens")
        require(self.plugin or Knob.MAX_NUM_BATCHED_TOKENS in self.stock_dict(),
                "required for a stock arm", key=f"stock.{Knob.MAX_NUM_BATCHED_TOKENS}")
        require(not (self.plugin and self.stock), _ONE_KIND)
        sim, _ = self.sim_policy()
        if not self.plugin and sim is not None:
            make_policy(sim)  # vLLM's own range checks (max_num_seqs <= mbt, ...)

    @property
    def plugin(self) -> bool:
        return self.policy is not None

    @property
    def auto_fitted(self) -> bool:
        return self.cost_model == FITTED_AUTO

    @property
    def calibrates(self) -> bool:
        """Its step log feeds ``fitted:auto``: a plugin arm that does not need the fit."""
        return self.plugin and not self.auto_fitted

    def stock_dict(self) -> dict[str, int]:
        return dict(self.stock)

    def stock_flags(self) -> list[str]:
        """``vllm serve`` flags for the stock knobs, but the two every server gets from its
        launch (``max_num_batched_tokens``, ``max_num_seqs``)."""
        out: list[str] = []
        for k, v in self.stock:
            if k in (Knob.MAX_NUM_BATCHED_TOKENS, Knob.MAX_NUM_SEQS):
                continue
            if k in _STOCK_SWITCHES:
                out += [Knob(k).flag] if v else []
            else:
                out += [Knob(k).flag, str(v)]
        return out

    def sim_policy(self, vllm_version: str | None = None) -> tuple[str | None, str]:
        """(policy string the simulator runs for this arm, or None; why not). A stock arm
        runs as the ``vllm:`` policy of the release line of ``vllm_version`` (the vLLM
        the runs used; ``ppas.live.versions.simulated_line``)."""
        if self.policy is not None:
            return self.policy, ""
        s = self.stock_dict()
        other = [k for k in s if Knob(k) not in KNOB_PARAMS]
        if other:
            modelled = ", ".join(k for k in STOCK_ARGS if k in KNOB_PARAMS)
            return None, (f"stock vLLM {', '.join(other)} is not modelled by the simulator, "
                          f"which models {modelled}")
        args = [f"{KNOB_PARAMS[Knob(k)]}="
                + (("true" if v else "false") if k in _STOCK_SWITCHES else str(v))
                for k, v in s.items()]
        return f"vllm:{','.join(args)},version={simulated_line(vllm_version)}", ""

    @staticmethod
    def parse(obj: object, i: int) -> ArmSpec:
        """``[[arms]]`` number ``i``; a stock arm's ``max_num_batched_tokens`` is its stock
        one, a plugin arm's (without a cost model) its policy's."""
        w = f"arms[{i}]"
        t = check_keys(obj, w, ArmSpec)
        if ("policy" in t) == ("stock" in t):
            raise config_error(w, "", _ONE_KIND)
        if "stock" in t:
            for k in ("cost_model", "max_num_batched_tokens"):
                if k in t:
                    raise config_error(w, k, "applies to plugin arms (policy = ...) only; a "
                                       "stock arm sets [arms.stock] max_num_batched_tokens")
            st = check_keys(t["stock"], f"{w}.stock", STOCK_ARGS)
            for k, v in st.items():
                if k in _STOCK_SWITCHES:
                    if not isinstance(v, bool):
                        raise config_error(f"{w}.stock", k, f"must be true or false, got {v!r}")
                elif isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise config_error(f"{w}.stock", k, f"must be an integer >= 1, got {v!r}")
                if k not in _STOCK_SWITCHES and v > _STOCK_MAX[Knob(k)]:
                    raise config_error(f"{w}.stock", k, f"must be <= {_STOCK_MAX[Knob(k)]}, "
                                       f"got {v!r}")
            # a switch is kept as 1 or 0 (the arm's stock values are integers)
            t["stock"] = tuple((str(k), int(st[k])) for k in STOCK_ARGS if k in st)
            t["max_num_batched_tokens"] = st.get(Knob.MAX_NUM_BATCHED_TOKENS)
        arm = from_table(ArmSpec, t, w)
        _check_cost_model(arm.cost_model, w)
        if arm.policy is not None and arm.max_num_batched_tokens is None \
                and arm.cost_model is None:
            arm = replace(arm, max_num_batched_tokens=make_policy(arm.policy)
                          .max_num_batched_tokens)
        return arm


def _check_cost_model(cost: str | None, where: str) -> None:
    if cost is None or cost == FITTED_AUTO:
        return
    if cost == "roofline":
        raise config_error(where, "cost_model", "roofline needs a catalog model and GPU; use "
                           f"{FITTED_AUTO} or fitted:FILE on a live engine")
    if not cost.startswith("fitted:") or len(cost) == 7:
        raise config_error(where, "cost_model", f"must be {FITTED_AUTO}, fitted:FILE or "
                           f"roofline, got {cost!r}")
    if not Path(cost[7:]).is_file():
        raise config_error(where, "cost_model", f"no file {cost[7:]!r}")
    try:
        make_cost_model(cost)  # the file must be a fitted cost model
    except PpasError as e:
        raise config_error(where, "cost_model", str(e)) from None
