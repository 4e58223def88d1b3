"""Container ids carry the RM's HA epoch as YARN's do (container_e<epoch>_...), and parse back."""
from __future__ import annotations

import pytest

from protocol.ids import ApplicationId, AttemptId, ContainerId

ATTEMPT = AttemptId(ApplicationId(1700000000000, 3), 2)


def test_no_epoch_keeps_the_plain_form():
    cid = ContainerId(ATTEMPT, 5)
    assert str(cid) == "container_1700000000000_0003_02_000005"
    assert ContainerId.parse(str(cid)) == cid


@pytest.mark.parametrize("epoch,text", [(1, "container_e01_1700000000000_0003_02_000005"),
                                        (17, "container_e17_1700000000000_0003_02_000005"),
                                        (123, "container_e123_1700000000000_0003_02_000005")])
def test_an_epoch_is_written_and_parsed_back(epoch, text):
    cid = ContainerId(ATTEMPT, 5, epoch)
    assert str(cid) == text
    back = ContainerId.parse(text)
    assert back == cid and back.app == ATTEMPT.app and back.epoch == epoch


def test_the_same_attempt_and_sequence_in_two_terms_are_two_ids():
    assert str(ContainerId(ATTEMPT, 1, 1)) != str(ContainerId(ATTEMPT, 1, 2))
