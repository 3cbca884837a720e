"""Feather: prefix-homogeneous batches via a chunked hash tree (arXiv 2605.06046).

Spec related-policies.md [R code structure]. On prefix-sharing workloads, a batch whose
requests share prefixes beats a larger mixed one: shared blocks are computed once and
stay cached (our simulator and vLLM's prefix cache model this part) and decode attention
over a shared prefix is cheaper on kernels that read it once (not modelled: our cost
model and vLLM-CPU have no cascade attention).

* Chunked hash tree [R]: a request's level-``j`` key is the cumulative hash of its first
  ``(j + 1) * chunk`` prompt tokens (``chunk`` = 512), read off the engine's chained block
  hashes (``RequestView.block_hashes``: block ``(j + 1) * chunk / block_size - 1``). The
  keys of the running batch form a reference-counted working set; a waiting request's
  overlap with the batch is ``1 + max{j : key_j in working set}`` levels (chained keys:
  level j present implies every lower level is). A lazy max-heap over waiting requests
  returns the one with most overlap; entries are pushed again when a key enters the
  working set and stale ones are skipped on pop, so a greedy batch costs O(levels)
  amortised per request instead of radix-tree walks.
* ADD/STOP, our reading [I] (the paper trains an RL agent for it): take the best waiting
  request while it shares at least ``min_overlap`` levels with the batch, or at least
  ``cached_fraction`` of its prompt is in the prefix cache anyway
  (``RequestView.num_cached_tokens``: admitting it costs little and evicts little), or
  the batch (running + added) has fewer than ``min_batch`` requests; STOP at the first
  that does none of these. Stopped requests get no budget this step (the prefill budget
  covers exactly the running prefills and the added requests' uncached prompt tokens).
* Starvation bound (ours): a request waiting ``max_wait_s`` or longer goes before every
  other waiting request, FCFS among such requests, regardless of ADD/STOP. So no request
  that arrived later is first scheduled after ``arrival + max_wait_s`` ahead of it
  (tested with hypothesis in the simulator).

The policy is pure: the tree is rebuilt from the view every step (O(total levels)); the
paper maintains it incrementally across steps, which a stateless policy cannot.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from heapq import heappop, heappush

from ppas.core.config import check_times, require
from ppas.core.decision import Decision
from ppas.core.view import BLOCK_SIZE, RequestView, SchedulerView, uncached_prompt_tokens
from ppas.policies.base import Policy
from ppas.policies.registry import register


@dataclass(frozen=True)
class FeatherConfig:
    budget: int = 8192  # the engine's max_num_batched_tokens
    chunk: int = 512  # tokens per hash-tree level [R]
    min_overlap: int = 1  # levels shared with the batch for ADD [I]
    min_batch: int = 4  # ADD regardless of overlap below this batch size [I]
    cached_fraction: float = 0.5  # ADD a request this much of whose prompt is cached [I]
    max_wait_s: float = 30.0  # starvation bound (ours)
    block_size: int = BLOCK_SIZE  # tokens per entry of RequestView.block_hashes

    def __post_init__(self) -> None:
        require(self.budget >= 1, f"budget must be >= 1, got {self.budget}")
        require(self.block_size >= 1, "block_size must be >= 1")
        require(self.chunk >= self.block_size and self.chunk % self.block_size == 0,
                f"chunk must be a multiple of block_size={self.block_size}, "
                f"got {self.chunk}")
        require(self.min_overlap >= 0, "min_overlap must be >= 0")
        require(self.min_batch >= 0, "min_batch must be >= 0")
        require(0 < self.cached_fraction <= 1,
                f"cached_fraction must be in (0, 1], got {self.cached_fraction}")
        check_times(self, "max_wait_s")


def level_keys(r: RequestView, chunk: int, block_size: int) -> list[Hashable]:
    """The request's hash-tree keys: the chained hash of its first (j + 1) * chunk prompt
    tokens, for every whole chunk of the prompt its engine has hashed."""
    hashes = r.block_hashes
    per = chunk // block_size
    n = min(r.prompt_tokens // chunk, len(hashes) // per)
    return [hashes[(j + 1) * per - 1] for j in range(n)]


class ChunkedHashTree:
    """Working set of the batch's level keys (reference-counted), an index from key to
    the waiting requests that have it, and a lazy max-heap of waiting requests by overlap
    (ties: lower ``rank``, i.e. engine order)."""

    def __init__(self) -> None:
        self.working: dict[Hashable, int] = {}
        self.index: dict[Hashable, list[tuple[int, int]]] = {}  # key -> (request, level)
        self.overlap: list[int] = []
        self.taken: list[bool] = []
        self.heap: list[tuple[int, int]] = []  # (-overlap, request)

    def add_waiting(self, keys: Sequence[Hashable]) -> int:
        i = len(self.overlap)
        ov = 0
        for j, k in enumerate(keys):
            self.index.setdefault(k, []).append((i, j))
            if k in self.working:
                ov = j + 1
        self.overlap.append(ov)
        self.taken.append(False)
        heappush(self.heap, (-ov, i))
        return i

    def add_batch(self, keys: Sequence[Hashable]) -> None:
        """A request joins the batch: its keys enter the working set; waiting requests
        that gain overlap get a fresh heap entry (the old one goes stale)."""
        for k in keys:
            c = self.working.get(k, 0)
            self.working[k] = c + 1
            if c:
                continue
            for i, j in self.index.get(k, ()):
                if not self.taken[i] and j + 1 > self.overlap[i]:
                    self.overlap[i] = j + 1
                    heappush(self.heap, (-(j + 1), i))

    def pop_best(self) -> tuple[int, int] | None:
        """(request, overlap) of the untaken waiting request with most overlap."""
        while self.heap:
            neg, i = heappop(self.heap)
            if self.taken[i] or -neg != self.overlap[i]:
                continue  # stale entry
            self.taken[i] = True
            return i, -neg
        return None


@register("feather")
class Feather(Policy):
    Config = FeatherConfig

    @property
    def max_num_batched_tokens(self) -> int:
        return int(self.config.budget)

    def decide(self, view: SchedulerView) -> Decision:
        cfg = self.config
        waiting = [r for r in view.requests if not r.is_running]
        if not waiting:
            return Decision(cfg.budget)
        tree = ChunkedHashTree()
        budget = 0
        batch = 0
        for r in view.requests:
            if r.is_running:
                batch += 1
                tree.add_batch(level_keys(r, cfg.chunk, cfg.block_size))
                budget += max(0, r.prompt_tokens - r.num_computed_tokens)
        order: list[str] = []
        aged = [r for r in waiting if view.now - r.arrival_time >= cfg.max_wait_s]
        aged.sort(key=lambda r: r.arrival_time)
        fresh = [r for r in waiting if view.now - r.arrival_time < cfg.max_wait_s]
        keys = [level_keys(r, cfg.chunk, cfg.block_size) for r in fresh]
        for r in aged:  # starvation bound: first, FCFS
            order.append(r.request_id)
            tree.add_batch(level_keys(r, cfg.chunk, cfg.block_size))
            budget += uncached_prompt_tokens(r)
            batch += 1
        for k in keys:
            tree.add_waiting(k)
        stopped = False
        while len(order) < len(waiting):
            best = tree.pop_best()
            if best is None:
                break
            i, ov = best
            r = fresh[i]
            if (batch > 0 and batch >= cfg.min_batch and ov < cfg.min_overlap
                    and r.num_cached_tokens < cfg.cached_fraction * r.prompt_tokens):
                stopped = True  # STOP: the best candidate does not belong to this batch
                break
            order.append(r.request_id)
            tree.add_batch(keys[i])
            budget += uncached_prompt_tokens(r)
            batch += 1
        if not stopped:
            return Decision(cfg.budget, tuple(order))
        return Decision(min(cfg.budget, budget), tuple(order))
