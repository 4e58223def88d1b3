"""protocol.codec: typed JSON bodies decoded in one pass, the same errors for every way a body is wrong."""
from __future__ import annotations

import orjson
import pytest

from protocol import codec
from protocol import internal_api as api
from protocol.records import Resource

HEARTBEAT = {"node_id": "n1:1", "response_id": 3, "used": {"memory": 512, "vCores": 1},
             "container_statuses": [{"container_id": "container_1_0001_01_000002", "state": "RUNNING"}],
             "utilization": {"cpu_cores": 1.5, "containers": [{"container_id": "c", "app_id": "a",
                                                               "cpu_cores": 0.5, "memory_mb": 64.0}]}}


def test_bytes_str_and_decoded_objects_give_the_same_struct():
    raw = orjson.dumps(HEARTBEAT)
    from_bytes = codec.decode_as(raw, api.NodeHeartbeatRequest)
    assert from_bytes == codec.decode_as(raw.decode(), api.NodeHeartbeatRequest)
    assert from_bytes == codec.decode_as(orjson.loads(raw), api.NodeHeartbeatRequest)
    assert from_bytes.used == Resource(512, 1)
    assert from_bytes.utilization is not None and from_bytes.utilization.containers is not None
    assert isinstance(from_bytes.utilization.containers, tuple)   # the field's declared type
    assert from_bytes.container_statuses[0].state == "RUNNING"


def test_decoding_generic_types_too():
    assert codec.decode_as(b"[1, 2]", list[int]) == [1, 2]
    with pytest.raises(codec.DecodeError, match=r"\$\[1\]"):
        codec.decode_as(b'[1, "2"]', list[int])


@pytest.mark.parametrize("raw, message", [
    (b"{bad", "malformed JSON"),
    (b"", "malformed JSON"),
    (b'{"node_id": "n", "response_id": NaN}', "non-finite number NaN"),
    (b"[1]", "Expected `object`, got `array`"),
    (b'{"node_id": 7}', "at `$.node_id`"),
    (b'{"node_id": "n", "response_id": "3"}', "at `$.response_id`"),     # strict: no str -> int
    (b'{"node_id": "n", "used": {"memory": 1, "vCores": 1}, "response_id": 1e400}', "response_id: number 1E+400 is not finite"),
])
def test_a_wrong_body_raises_decode_error_naming_what_is_wrong(raw, message):
    with pytest.raises(codec.DecodeError) as e:
        codec.decode_as(raw, api.NodeHeartbeatRequest)
    assert message in str(e.value)


def test_a_struct_encodes_as_its_builtins_would():
    resp = api.NodeHeartbeatResponse(response_id=5, heartbeat_interval_ms=1000, containers_to_cleanup=["c1"],
                                     apps_to_cleanup=[])
    assert orjson.loads(codec.dumps(resp)) == codec.to_builtins(resp)
    # inside other containers Structs still encode (orjson's default hook)
    assert orjson.loads(codec.dumps({"r": resp})) == {"r": codec.to_builtins(resp)}
    with pytest.raises(TypeError):
        codec.dumps({"x": object()})
