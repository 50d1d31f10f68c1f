"""The cluster's incarnation record in etcd (equeue/placement.py ``ClusterRecord``,
``/equeue/cluster``): its key, its one encoder and decoder, and malformed values."""

from __future__ import annotations

import pytest

from equeue.errors import ClusterDataInvalid
from equeue.placement import CLUSTER_KEY, ClusterRecord, decode_cluster, encode_cluster, parse_key


def test_the_key_is_one_key_under_the_root() -> None:
    assert CLUSTER_KEY == "/equeue/cluster"
    assert parse_key(CLUSTER_KEY) == ("cluster", ())
    for other in ("/equeue/cluster/x", "/equeue/clusters", "/equeue/cluste"):
        assert parse_key(other) is None


def test_round_trip_and_unknown_fields() -> None:
    rec = ClusterRecord("0f1e2d", 1_700_000_000_000)
    assert encode_cluster(rec) == b'{"id":"0f1e2d","created_ms":1700000000000}'
    assert decode_cluster(encode_cluster(rec)) == rec
    assert decode_cluster(b'{"id":"0f1e2d","created_ms":1700000000000,"later":1}') == rec


@pytest.mark.parametrize(
    "value",
    [b"", b"[]", b"{}", b'{"id":"","created_ms":1}', b'{"id":"a","created_ms":-1}', b'{"id":7,"created_ms":1}',
     b'{"created_ms":1}', b"\xff"],
)  # fmt: skip
def test_a_malformed_record_is_cluster_data_invalid(value: bytes) -> None:
    with pytest.raises(ClusterDataInvalid, match="ClusterRecord"):
        decode_cluster(value)
