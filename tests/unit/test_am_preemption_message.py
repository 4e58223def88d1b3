"""The AM library surfaces the RM's preemption message (capacity preemption): kept on the AM while
it stands, logged with the containers, deadline and reason when it changes."""
import logging

from appmaster.am_client import ApplicationMaster
from appmaster.rm_client import AmIdentity
from protocol import internal_api as api
from protocol.records import Resource


async def test_the_preemption_message_is_kept_and_logged(fake_cluster, caplog) -> None:
    am = ApplicationMaster(AmIdentity.from_env(fake_cluster.env))
    await am.register("amhost", 1234, "http://amhost:1234/", start_heartbeats=False)
    try:
        msg = api.PreemptionMessage(containers=[api.PreemptionContainer(container_id="container_1_0001_01_000007",
                                                                        resource=Resource(1024, 1))],
                                    deadline_ms=1_700_000_015_000, reason="queue b waits for its guarantee")
        with caplog.at_level(logging.WARNING, logger="appmaster.am_client"):
            await am.on_allocate_response(api.AllocateResponse(response_id=1, preemption=msg))
            await am.on_allocate_response(api.AllocateResponse(response_id=2, preemption=msg))
        assert am.preemption == msg
        lines = [r.getMessage() for r in caplog.records if "preempt" in r.getMessage()]
        assert len(lines) == 1      # logged once, when it changed
        assert "container_1_0001_01_000007" in lines[0] and "queue b waits" in lines[0]
        await am.on_allocate_response(api.AllocateResponse(response_id=3))
        assert am.preemption is None
    finally:
        await am.close()
