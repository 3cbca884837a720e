"""Cluster building blocks: config files, routers, the pool queue, KV transfer, the
deflection ladder (no engine needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppas.cluster.config import ClusterConfig, LinkConfig, PoolConfig, load_cluster
from ppas.cluster.deflection import make_deflection
from ppas.cluster.events import Arrival, StepStart, TransferLanded
from ppas.cluster.queue import make_queue
from ppas.cluster.router import make_router, router_names
from ppas.cluster.transfer import Link, kv_bytes_per_token
from ppas.core.errors import PpasError
from ppas.core.view import RequestSnapshot, SchedulerView
from ppas.cost.base import CostModel, StepShape
from ppas.cost.catalog import MODELS
from ppas.cost.roofline import RooflineCostModel
from ppas.policies import make_policy
from ppas.policies.deflection import ladder_chunk, parse_ladder

DISAGG = """
router = {name = "round-robin"}
[link]
bandwidth_gbs = 50
latency_s = 0.001
[slo]
ttft_s = 2.0
[[pools]]
name = "p"
role = "prefill"
instances = 2
hardware = "h200"
model = "llama3.2-3b"
policy = "mbt:8192"
queue = "laps:short_tokens=128"
[[pools]]
name = "d"
role = "decode"
instances = 6
hardware = "h200"
model = "llama3.2-3b"
policy = "tbt-ladder:tbt_slo=0.04"
deflection = "ladder:tbt_slo=0.04"
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_load_disaggregated(tmp_path: Path) -> None:
    c = load_cluster(write(tmp_path, DISAGG))
    assert c.disaggregated and c.num_instances == 8 and c.router == "round-robin"
    assert c.link == LinkConfig(50.0, 0.001) and c.slo.ttft_s == 2.0
    assert c.pool("prefill").queue == "laps:short_tokens=128"
    r = c.with_instances(16, 0.25)
    assert (r.pool("prefill").instances, r.pool("decode").instances) == (4, 12)
    assert c.with_instances(16).pool("prefill").instances == 4  # keeps 1:3


TOP = "allowed: pools, router, link, slo"


@pytest.mark.parametrize("edit, needle", [
    (lambda t: t.replace('"round-robin"', '"random"'), "router: unknown router 'random'; allowed"),
    (lambda t: t.replace('role = "decode"', 'role = "decoder"'),
     "pools[1].role: must be one of mixed, prefill, decode, got 'decoder'"),
    (lambda t: t.replace('role = "decode"', 'role = "mixed"')
     .replace('deflection = "ladder:tbt_slo=0.04"', ''), "exactly one 'prefill'"),
    (lambda t: t.replace("instances = 2", "instances = 0"),
     "pools[0].instances: must be >= 1, got 0"),
    (lambda t: t.replace("instances = 2", 'instances = "2"'),
     "pools[0].instances: must be an integer, got '2'"),
    (lambda t: t.replace("bandwidth_gbs = 50", "bandwidth_gbs = 0"),
     "link.bandwidth_gbs: must be > 0"),
    (lambda t: t.replace('queue = "laps', 'queue = "sjf'),
     "pools[0].queue: unknown queue discipline 'sjf'"),
    (lambda t: t.replace("mbt:8192", "fast"), "pools[0].policy: unknown policy 'fast'; allowed: "),
    (lambda t: t.replace("[slo]", "[slos]"), f"slos: unknown key; {TOP}"),
    (lambda t: t.replace("latency_s", "delay_s"),
     "link.delay_s: unknown key; allowed: bandwidth_gbs, latency_s"),
    (lambda t: t.replace('deflection = "ladder', 'deflection = "always'), "deflection rule"),
    (lambda t: t + "\n[[pools]]\nname='x'\nhardware='h200'\nmodel='qwen2.5-3b'\n",
     "exactly one"),
    (lambda t: t.replace("[[pools]]", "[[pool]]", 1), f"pool: unknown key; {TOP}"),
    (lambda t: t.replace("[link]", "[link"), "invalid TOML"),
    (lambda t: t.replace('router = {name = "round-robin"}', 'router = {kind = "rr"}'),
     "router.kind: unknown key; allowed: name"),
])
def test_bad_files_one_line(tmp_path: Path, edit, needle: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PpasError) as e:
        load_cluster(write(tmp_path, edit(DISAGG)))
    assert needle in str(e.value) and "\n" not in str(e.value)


# Issue 23: every TOML number has the bound of its flag (ppas.core.limits): (text in DISAGG,
# its replacement, the one-line error).
BOUNDS = [
    ("instances = 2", "instances = 100000000", "pools[0].instances: must be <= 4096, got 1"),
    ("instances = 2", "instances = 4091", "the pools hold 4097 instances; the limit is 4096"),
    ("instances = 2", "instances = 2\nnum_kv_blocks = 1000000000000000",
     "pools[0].num_kv_blocks: must be <= 1099511627776, got 1000000000000000"),
    ("instances = 2", "instances = 2\nmax_num_seqs = 1000000000000",
     "pools[0].max_num_seqs: must be <= 1048576"),
    ("instances = 2", "instances = 2\ntp = 100000", "pools[0].tp: must be <= 1024, got 100000"),
    ("bandwidth_gbs = 50", "bandwidth_gbs = true", "link.bandwidth_gbs: must be a number"),
    ("bandwidth_gbs = 50", "bandwidth_gbs = 1e300", "link.bandwidth_gbs: must be > 0 and <= 1e"),
    ("latency_s = 0.001", "latency_s = 1e300", "link.latency_s: must be in [0, 1e+07] s"),
    ("ttft_s = 2.0", "ttft_s = 1e-300", "slo.ttft_s: must be in [1e-06, 1e+07] s, got 1e-300"),
    ("ladder:tbt_slo=0.04", "ladder:tbt_slo=1e-300", "tbt_slo: must be in [1e-06"),
]


@pytest.mark.parametrize("old, new, needle", BOUNDS)
def test_toml_numbers_are_bounded(tmp_path: Path, old: str, new: str, needle: str) -> None:
    with pytest.raises(PpasError) as e:
        load_cluster(write(tmp_path, DISAGG.replace(old, new)))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_missing_file() -> None:
    with pytest.raises(PpasError, match="does not exist"):
        load_cluster("/nonexistent/c.toml")


def test_queue_only_on_prefill_pools() -> None:
    with pytest.raises(PpasError, match="prefill pools only"):
        PoolConfig("m", queue="laps", hardware="h200", model="qwen2.5-3b")
    with pytest.raises(PpasError, match="decode pools only"):
        PoolConfig("m", deflection="ladder", hardware="h200", model="qwen2.5-3b")


class _Inst:
    def __init__(self, load: int, finish: float) -> None:
        self.outstanding_tokens = load
        self.finish = finish

    def predicted_finish(self, prompt_tokens: int, output_tokens: int, now: float) -> float:
        return now + self.finish


def test_routers() -> None:
    insts = [_Inst(30, 2.0), _Inst(10, 3.0), _Inst(20, 1.0)]
    rr = make_router("round-robin")
    assert [rr.route(1, 1, insts, 0.0) for _ in range(4)] == [0, 1, 2, 0]
    assert make_router("least-outstanding-tokens").route(1, 1, insts, 0.0) == 1
    assert make_router("earliest-completion").route(1, 1, insts, 0.0) == 2
    assert make_router("pass-through").route(1, 1, insts, 0.0) == 0
    assert set(router_names()) >= {"round-robin", "least-outstanding-tokens",
                                   "earliest-completion", "pass-through"}


def test_fcfs_batches_in_arrival_order() -> None:
    q = make_queue("fcfs")
    for i, n in enumerate([5000, 100, 200, 4000, 50]):
        q.push(i, n)
    assert q.queued_tokens == 9350
    assert q.pop_batch(8192) == [0, 1, 2]  # 5300 tokens; + 4000 would exceed
    assert q.pop_batch(8192) == [3, 4]
    assert q.pop_batch(8192) == [] and q.queued_tokens == 0


def test_laps_serves_short_prompts_first() -> None:
    q = make_queue("laps")  # short_tokens = 256
    for i, n in enumerate([9000, 100, 3000, 256, 257, 10]):
        q.push(i, n)
    assert q.pop_batch(8192) == [1, 3, 5]  # every short one, batched
    assert q.pop_batch(8192) == [0]  # a long one alone exceeds the budget: it still goes
    q.push(6, 30)
    assert q.pop_batch(8192) == [6]  # a new short one jumps the long ones
    assert q.pop_batch(8192) == [2, 4]
    assert len(q) == 0 and q.queued_tokens == 0


@given(st.lists(st.integers(1, 20000), max_size=40), st.integers(1, 16384),
       st.sampled_from(["fcfs", "laps", "laps:short_tokens=1000"]))
def test_queue_pops_everything_once(sizes: list[int], budget: int, spec: str) -> None:
    q = make_queue(spec)
    for i, n in enumerate(sizes):
        q.push(i, n)
    seen: list[int] = []
    while len(q):
        b = q.pop_batch(budget)
        assert b and (len(b) == 1 or sum(sizes[i] for i in b) <= budget)
        seen += b
    assert sorted(seen) == list(range(len(sizes))) and q.queued_tokens == 0


def test_kv_bytes_and_link() -> None:
    cm = RooflineCostModel("h200", "qwen2.5-3b")
    assert kv_bytes_per_token(cm, None) == 36864 == MODELS.get("qwen2.5-3b").kv_bytes_per_token
    # 36 layers x 2 kv heads x 128 x 2 (K, V) x 2 bytes
    assert kv_bytes_per_token(cm, None) == 36 * 2 * 128 * 2 * 2
    link = Link(LinkConfig(bandwidth_gbs=10.0, latency_s=0.001), 36864)
    assert link.duration(10000) == pytest.approx(0.001 + 10000 * 36864 / 10e9)
    s1, e1 = link.schedule(1.0, 10000)
    s2, e2 = link.schedule(1.01, 10000)  # queues behind the first
    s3, _ = link.schedule(5.0, 1)
    assert s1 == 1.0 and s2 == e1 and e2 > s2 and s3 == 5.0


class _Lin(CostModel):
    def step_time(self, step: StepShape) -> float:
        return 0.005 + 1e-5 * step.num_prefill_tokens + 1e-4 * step.num_decodes


def test_ladder_chunk_and_policy() -> None:
    cm = _Lin()
    # 10 decodes: 6 ms + 1e-5 c; SLO 12 ms -> c <= 600 -> 512 on the ladder.
    assert ladder_chunk(cm, 0.012, 10, 0) == 512
    assert ladder_chunk(cm, 0.05, 10, 0) == 2048
    assert ladder_chunk(cm, 0.006, 10, 0) == 0
    assert parse_ladder("128/2048/512") == (2048, 512, 128)
    with pytest.raises(PpasError):
        parse_ladder("a/b")
    pol = make_policy("tbt-ladder:tbt_slo=0.012")
    pol.bind_cost_model(cm)
    reqs = [RequestSnapshot(str(i), 0.0, 10, 10, 1, 5, True) for i in range(10)]
    reqs.append(RequestSnapshot("p", 0.0, 5000))
    view = SchedulerView(0.0, reqs, 1, 10, 4096, 256)
    assert pol.decide(view).prefill_budget == 512
    assert pol.decide(SchedulerView(0.0, reqs[-1:], 1, 0, 4096, 256)).prefill_budget == 4096
    tight = make_policy("tbt-ladder:tbt_slo=0.001")
    tight.bind_cost_model(cm)
    assert tight.decide(view).prefill_budget == 128  # nothing fits: smallest (progress)


@settings(max_examples=300, deadline=None)
@given(hw=st.sampled_from(["h100-sxm-80gb", "a100-sxm-80gb", "l40s", "h200"]),
       model=st.sampled_from(["qwen3-8b", "qwen2.5-3b", "qwen2.5-0.5b"]),
       slo=st.floats(0.002, 0.2), d=st.integers(1, 300), k=st.integers(0, 4000),
       p=st.integers(0, 120000),
       ladder=st.sampled_from(["2048/1024/512/256/128", "4096/1024/64", "512", "8192/16"]),
       start=st.integers(0, 9))
def test_a_guessed_ladder_search_is_the_scan_from_the_largest(
        hw: str, model: str, slo: float, d: int, k: int, p: int, ladder: str,
        start: int) -> None:
    """``ladder_chunk`` from any guess (``tbt-ladder``'s last answer) gives the scan
    from the largest chunk's answer (the roofline's step time is monotone in the chunk)."""
    cm = RooflineCostModel(hw, model)
    rungs = parse_ladder(ladder)
    t = cm.chunk_time(p, d, d * k)
    scan = next((c for c in rungs if t(c) <= slo), 0)
    assert ladder_chunk(cm, slo, d, d * k, p, rungs, start % len(rungs)) == scan
    assert ladder_chunk(cm, slo, d, d * k, p, rungs) == scan


class _Node:
    def __init__(self, n_dec: int, backlog: int, free: int) -> None:
        self.cost_model = _Lin()
        self.kv_free_tokens = free
        self._load = (backlog, n_dec, 0)

    def load(self) -> tuple[int, int, int]:
        return self._load


def test_deflection_rule() -> None:
    d = make_deflection("ladder:tbt_slo=0.012")
    assert d is not None and make_deflection("off") is None
    # 10 decodes -> chunk 512 -> a 1000-token prompt takes 2 steps of 6 ms + 5.12 ms.
    assert d.predicted_ttft(_Node(10, 0, 10**6), 1000) == pytest.approx(2 * (0.006 + 512e-5))
    nodes = [_Node(10, 5000, 10**6), _Node(10, 0, 10**6), _Node(10, 0, 100)]
    assert d.choose(1000, 10, nodes, pool_ttft=1.0) == 1  # node 2 lacks KV room
    assert d.choose(1000, 10, nodes, pool_ttft=0.01) is None  # the pool is faster
    assert d.choose(1000, 10, [_Node(80, 0, 10**6)], pool_ttft=9.0) is None  # nothing fits


def test_cluster_config_validates_strings() -> None:
    pool = PoolConfig("m", hardware="h200", model="qwen2.5-3b")
    with pytest.raises(PpasError, match="unknown router"):
        ClusterConfig((pool,), router="nearest")
    c = ClusterConfig((pool, PoolConfig("n", hardware="h200", model="qwen2.5-3b",
                                        instances=3)))
    assert not c.disaggregated and c.with_instances(8).num_instances == 8


def test_routers_and_queues_register_once() -> None:
    """Issue 12: a router or queue is named only by its registration (``register_class``
    sets ``name``); the config-string errors are the policies' (one line, allowed values)."""
    from ppas.cluster.queue import QUEUES
    from ppas.cluster.router import ROUTERS

    for reg, make in ((ROUTERS, make_router), (QUEUES, make_queue)):
        for name in reg.names():
            cls = reg.get(name)
            assert "name" in vars(cls) and cls.name == name
            obj = make(f" {name} ")
            assert type(obj) is cls and obj.spec == name
        allowed = ", ".join(reg.names())
        for bad, msg in (("", f"empty {reg.kind} config; allowed: {allowed}"),
                         ("nosuch:x=1", f"unknown {reg.kind} 'nosuch'; allowed: {allowed}")):
            with pytest.raises(PpasError) as e:
                make(bad)
            assert str(e.value) == msg
    with pytest.raises(PpasError, match=r"^laps\.x: unknown key; allowed: short_tokens$"):
        make_queue("laps:x=1")
    from ppas.cluster.deflection import DEFLECTIONS, Deflection

    assert DEFLECTIONS.names() == ["ladder", "off"]
    assert make_deflection("off") is None and type(make_deflection(" ladder ")) is Deflection
    for bad, msg in (("", "empty deflection rule config; allowed: ladder, off"),
                     ("always", "unknown deflection rule 'always'; allowed: ladder, off")):
        with pytest.raises(PpasError) as e:
            make_deflection(bad)
        assert str(e.value) == msg
    with pytest.raises(PpasError, match=r"^off\b.*\bx\b"):  # off takes no parameters
        make_deflection("off:x=1")
    with pytest.raises(PpasError, match=r"^empty policy config; allowed: .*mbt"):
        make_policy(" ")


def test_events_at_equal_times_land_transfers_then_arrivals_then_steps() -> None:
    evs = [StepStart(1.0, 0, 1), Arrival(1.0, 3), TransferLanded(1.0, 2, 0), Arrival(0.5, 1)]
    assert sorted(evs, key=lambda e: (e.time, e.order)) == [
        Arrival(0.5, 1), TransferLanded(1.0, 2, 0), Arrival(1.0, 3), StepStart(1.0, 0, 1)]
    with pytest.raises(AttributeError):
        evs[0].time = 2.0  # type: ignore[misc]
