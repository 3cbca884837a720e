"""Arms in parallel, one worker thread per device (``run.devices``).

Invariants: each arm runs on one device, whole, in one worker; a ``fitted:auto`` arm starts
only once every calibration arm is finished (or failed: then the experiment stops, and it
never starts); the first failure stops every worker between runs and is raised in the
calling thread once all workers are done.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from ppas.experiment.spec import ArmSpec
from ppas.experiment.stopping import Interrupted, StopFlag


def run_on_devices(order: Sequence[ArmSpec], devices: Sequence[str],
                   run_arm: Callable[[ArmSpec, str], None], stop: StopFlag) -> None:
    """``run_arm(arm, device)`` for every arm of ``order``, ``len(devices)`` at a time."""
    queue = list(order)
    running_cal = {a.name for a in order if a.calibrates}
    errors: list[BaseException] = []

    def next_arm() -> ArmSpec | None:
        with stop.cond:
            while True:
                if stop.is_set() or errors or not queue:
                    return None
                for a in queue:
                    if not a.auto_fitted or not running_cal:
                        queue.remove(a)
                        return a
                stop.cond.wait(0.5)

    def worker(dev: str) -> None:
        while (arm := next_arm()) is not None:
            try:
                run_arm(arm, dev)
            except BaseException as e:  # noqa: BLE001 (reported by the calling thread)
                if not isinstance(e, Interrupted):
                    errors.append(e)
                stop.set()
            finally:
                with stop.cond:
                    running_cal.discard(arm.name)
                    stop.cond.notify_all()

    threads = [threading.Thread(target=worker, args=(d,), daemon=True) for d in devices]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.2)
    if errors:
        raise errors[0]
