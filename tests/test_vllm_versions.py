"""The version gate reads the scheduler's source (no vLLM needed: fake schedulers written
like vLLM's loops). The real 0.32/0.33 schedulers are checked in test_vllm_scheduler.py."""

from __future__ import annotations

from typing import Any

import pytest

from ppas.core.errors import PpasError
from ppas.live.versions import (
    RELEASE_LINES,
    CallSites,
    check_scheduler,
    find_call_sites,
    release_line,
)

# ruff: noqa: B007, SIM102 (the fakes mirror vLLM's loop shapes, not our style)


class Base:
    """The scheduler shape both lines share: hook signature, admission limit."""

    def __init__(self) -> None:
        self.max_num_active_reqs = 8
        self.running: list[Any] = []
        self.waiting: list[Any] = []

    def _reserve_prefill_lookahead(self, request: Any, num_computed_tokens: int,
                                   num_new_tokens: int) -> int:
        return num_new_tokens

    def _free_request(self, request: Any, delay_free_blocks: bool = False) -> None:
        pass

    def _preempt_request(self, request: Any, timestamp: float) -> None:
        pass


class Like032(Base):
    def schedule(self, throttle_prefills: bool = False) -> None:
        req_index = 0
        while req_index < len(self.running):
            request = self.running[req_index]
            num_new_tokens = self._reserve_prefill_lookahead(request, 0, 1)
            if num_new_tokens == 0:
                req_index += 1
                continue
            req_index += 1
        while self.waiting:
            num_running = len(self.running)
            if num_running >= self.max_num_active_reqs:
                break
            request = self.waiting[0]
            if request:
                num_new_tokens = self._reserve_prefill_lookahead(request, 0, 1)
                if num_new_tokens == 0:
                    # The request cannot be scheduled.
                    break
            self.running.append(self.waiting.pop(0))


class SchedulingPolicy:
    PRIORITY = "priority"


class RequestStatus:
    PREEMPTED = "preempted"


class Like033(Like032):
    def __init__(self) -> None:
        super().__init__()
        self.local_prefill_interval = 1
        self.policy = SchedulingPolicy.PRIORITY

    def schedule(self, throttle_prefills: bool = False) -> None:
        req_index = 0
        while req_index < len(self.running):
            request = self.running[req_index]
            num_new_tokens = self._reserve_prefill_lookahead(request, 0, 1)
            if num_new_tokens == 0:
                req_index += 1
                continue
            if (
                self.policy == SchedulingPolicy.PRIORITY
                and request.status == RequestStatus.PREEMPTED
            ):
                continue
            req_index += 1
        while self.waiting:
            num_running = len(self.running)
            if num_running >= self.max_num_active_reqs:
                break
            request = self.waiting[0]
            if request:
                num_new_tokens = self._reserve_prefill_lookahead(request, 0, 1)
                if num_new_tokens == 0:
                    self.waiting.append(self.waiting.pop(0))
                    continue
            self.running.append(self.waiting.pop(0))


class HookOnlyInRunningLoop(Base):
    def schedule(self) -> None:
        for request in self.running:
            num_new_tokens = self._reserve_prefill_lookahead(request, 0, 1)
            if num_new_tokens == 0:
                continue


class NoZeroTest(Base):
    def schedule(self) -> None:
        for request in self.running:
            num_new_tokens = self._reserve_prefill_lookahead(request, 0, 1)
            if num_new_tokens == 0:
                continue
        for request in self.waiting:
            num_new_tokens = self._reserve_prefill_lookahead(request, 0, 1)
            self.running.append(num_new_tokens)


class NoAdmissionLimit(Like033):
    def schedule(self, throttle_prefills: bool = False) -> None:
        for request in self.running:
            num_new_tokens = self._reserve_prefill_lookahead(request, 0, 1)
            if num_new_tokens == 0:
                continue
        for request in self.waiting:
            num_new_tokens = self._reserve_prefill_lookahead(request, 0, 1)
            if num_new_tokens == 0:
                continue


class NoPrioritySkip(Like033):
    """0.33's loops without its running loop's skip of a self-preempted request."""

    def schedule(self, throttle_prefills: bool = False) -> None:
        for request in self.running:
            num_new_tokens = self._reserve_prefill_lookahead(request, 0, 1)
            if num_new_tokens == 0:
                continue
        while self.waiting:
            if len(self.running) >= self.max_num_active_reqs:
                break
            num_new_tokens = self._reserve_prefill_lookahead(self.waiting[0], 0, 1)
            if num_new_tokens == 0:
                continue


class RenamedHookArgs(Like032):
    def _reserve_prefill_lookahead(self, req: Any, computed: int, new: int) -> int:  # type: ignore[override]
        return new


class NoHook:
    def schedule(self) -> None:
        pass


class NoFree(Like033):
    _free_request = None  # type: ignore[assignment]


class NoPreempt(Like033):
    _preempt_request = None  # type: ignore[assignment]


def test_call_sites_of_each_line() -> None:
    assert find_call_sites(Like032) == CallSites("continue", "break", True, False, "break")
    assert find_call_sites(Like033) == CallSites("continue", "continue", True, True,
                                                 "continue")
    assert check_scheduler("0.32.1", Like032) == RELEASE_LINES["0.32"]
    assert check_scheduler("0.33.0+cpu", Like033) == RELEASE_LINES["0.33"]
    assert not RELEASE_LINES["0.32"].stops_admission_via_limit
    assert RELEASE_LINES["0.33"].stops_admission_via_limit


@pytest.mark.parametrize(
    ("version", "cls", "match"),
    [
        ("0.33.0", Like032, r"0\.33\.0 is untested \(its scheduler differs .*waiting_zero='break'"),
        ("0.32.0", Like033, r"0\.32\.0 is untested \(its scheduler differs"),
        ("0.33.0", HookOnlyInRunningLoop, r"must call self\._reserve_prefill_lookahead\(\) once "
                                          r"in each loop.*found 1 call"),
        ("0.33.0", NoZeroTest, r"found 2 call\(s\) followed by \['continue', None\]"),
        ("0.33.0", NoAdmissionLimit, r"has_admission_limit=False"),
        ("0.33.0", NoPrioritySkip, r"has_local_prefill_interval=True, "
                                   r"priority_self_preemption='break'\), expected"),
        ("0.32.0", RenamedHookArgs, r"differs from \('self', 'request'"),
        ("0.32.0", NoHook, r"has no _reserve_prefill_lookahead\(\)"),
        ("0.33.0", NoFree, r"has no _free_request\(\) to note where requests stop"),
        ("0.33.0", NoPreempt, r"has no _preempt_request\(\) to see preemptions in"),
        ("0.31.9", Like032, r"unknown release line.*supported: 0\.32\.x, 0\.33\.x$"),
        ("1.0.0", Like033, r"unknown release line"),
    ],
)
def test_gate_refuses(version: str, cls: type, match: str) -> None:
    with pytest.raises(PpasError, match=match):
        check_scheduler(version, cls)


def test_release_line_parsing() -> None:
    assert release_line("0.33.0").line == "0.33"
    assert release_line("0.32.4+cpu").line == "0.32"
    with pytest.raises(PpasError, match="unknown release line"):
        release_line("garbage")


@pytest.mark.parametrize(
    ("line", "interval", "dp", "moe", "applies"),
    [
        ("0.32", 1, 1, False, False),
        ("0.32", 4, 1, False, False),  # 0.32: only the DP engine core throttles
        ("0.32", 4, 2, False, False),  # dense DP ranks run independent engine cores
        ("0.32", 4, 2, True, True),  # data-parallel MoE: DPEngineCoreProc
        ("0.33", 1, 1, False, False),
        ("0.33", 2, 1, False, True),  # local cadence
        ("0.33", 4, 2, True, True),
    ],
)
def test_prefill_interval_applies(line: str, interval: int, dp: int, moe: bool,
                                  applies: bool) -> None:
    assert RELEASE_LINES[line].prefill_interval_applies(interval, dp, moe) is applies
