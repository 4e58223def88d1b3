"""The tests' poll helpers: they return the condition's value, and a timeout names what was
awaited and the last value seen."""
import pytest

from polling import async_wait_until, wait_until


def counter(reach: int):
    """A condition that holds on its `reach`-th call; returns the number of calls so far."""
    calls = []

    def cond():
        calls.append(1)
        return len(calls) if len(calls) >= reach else 0
    return cond


def test_wait_until_returns_the_first_truthy_value():
    assert wait_until(counter(3), 10, "three calls", interval_s=0) == 3


def test_wait_until_names_what_and_the_last_value_on_timeout():
    with pytest.raises(AssertionError, match=r"the ready file: not met within 0s \(last value: \[\]\)"):
        wait_until(lambda: [], 0, "the ready file")


def test_wait_until_passes_the_condition_s_own_failure_through():
    def dead():
        raise AssertionError("the process exited with 3")
    with pytest.raises(AssertionError, match="exited with 3"):
        wait_until(dead, 10, "ready")


async def test_async_wait_until_returns_the_value_and_awaits_async_conditions():
    assert await async_wait_until(counter(2), 10, "two calls", interval_s=0) == 2
    check = counter(2)

    async def async_cond():
        return check()
    assert await async_wait_until(async_cond, 10, "two awaited calls", interval_s=0) == 2


async def test_async_wait_until_names_what_and_the_last_value_on_timeout():
    async def still_running():
        return None
    with pytest.raises(AssertionError, match=r"COMPLETE: not met within 0s \(last value: None\)"):
        await async_wait_until(still_running, 0, "COMPLETE")
    with pytest.raises(AssertionError, match=r"last value: 0"):
        await async_wait_until(lambda: 0, 0, "a count")
