import threading
import time

import pytest

from difftest.core.prefetch import Prefetched


def _squares(limit: int, log: list[str] | None = None):
    for i in range(limit):
        if log is not None:
            log.append(f"take {i}")
        yield i


def test_items_come_out_in_order_each_with_its_work():
    with Prefetched(_squares(20), lambda i: i * i, depth=3) as ahead:
        assert list(ahead) == [(i, i * i) for i in range(20)]


def test_the_work_runs_in_another_thread_after_setup_there():
    seen = []
    setup = lambda: seen.append(("setup", threading.current_thread().name))  # noqa: E731
    with Prefetched(_squares(2), lambda i: seen.append(("work", threading.current_thread().name)), 1, setup) as ahead:
        list(ahead)
    assert [kind for kind, _ in seen] == ["setup", "work", "work"]
    assert {name for _, name in seen} == {"difftest-prefetch"}


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_no_more_than_depth_jobs_are_taken_and_not_yet_handed_out(depth):
    log: list[str] = []
    leads = []
    with Prefetched(_squares(10, log), lambda i: i, depth=depth) as ahead:
        for handed, (job, _) in enumerate(ahead, start=1):
            assert job == handed - 1
            time.sleep(0.05)  # room for the thread to run ahead as far as it may
            leads.append(sum(entry.startswith("take") for entry in log) - handed)
    assert max(leads) == depth  # it does run ahead, and never further


def test_an_error_of_the_work_comes_in_its_place_after_the_items_before_it():
    def work(i: int) -> int:
        if i == 3:
            raise ValueError("job 3")
        return i

    got = []
    with pytest.raises(ValueError, match="job 3"), Prefetched(_squares(10), work, depth=2) as ahead:
        for job, _ in ahead:
            got.append(job)
    assert got == [0, 1, 2]


def test_an_error_of_the_source_comes_in_its_place():
    def source():
        yield 1
        raise KeyError("planner")

    with pytest.raises(KeyError, match="planner"), Prefetched(source(), lambda i: i) as ahead:
        assert next(iter(ahead)) == (1, 1)
        next(iter(ahead))


def test_closing_early_stops_a_thread_waiting_for_room_and_leaves_the_rest_untaken():
    log: list[str] = []
    ahead = Prefetched(_squares(1000, log), lambda i: i, depth=2)
    assert next(iter(ahead)) == (0, 0)
    ahead.close()
    assert not ahead._thread.is_alive()
    assert len(log) <= 3


def test_depth_below_one_is_refused():
    with pytest.raises(ValueError, match="depth"):
        Prefetched(_squares(1), lambda i: i, depth=0)
