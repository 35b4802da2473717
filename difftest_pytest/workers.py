"""pytest-xdist: the controller's seed reaches every worker (so all of them collect the same cases),
and each worker on --difftest-device cuda takes its own GPU when several are visible. Results come
back to the controller in the test reports (results.py), so its summary covers every worker."""

from __future__ import annotations

import re
from typing import Any

import pytest

from difftest_pytest.options import WORKER_SEED

WORKER_ID = re.compile(r"gw(\d+)")


def gpu_for_worker(worker_id: str, device_count: int) -> int | None:
    """The GPU index worker `worker_id` ('gw0', 'gw1', ...) uses: its number modulo `device_count`.

    None for the controller (or any id that is not an xdist worker's) and when there is no GPU.
    """
    match = WORKER_ID.fullmatch(worker_id)
    if match is None or device_count < 1:
        return None
    return int(match.group(1)) % device_count


def pin_gpu(config: pytest.Config) -> None:
    """On an xdist worker, make its GPU (gpu_for_worker) torch's current device."""
    worker = getattr(config, "workerinput", None)
    if worker is None:
        return
    import torch

    index = gpu_for_worker(worker["workerid"], torch.cuda.device_count())
    if index is not None:
        torch.cuda.set_device(index)


class SeedToWorkers:
    """Controller side: hands the run's seed to each worker node; registered only when xdist is loaded."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """Put the seed into the worker's workerinput (read back by options.read_settings)."""
        node.workerinput[WORKER_SEED] = self.seed
