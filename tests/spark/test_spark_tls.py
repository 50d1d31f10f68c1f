"""The Spark source and sink against a broker that requires mutual TLS and
SCRAM-SHA-256 users with ACLs.

One embedded broker (TLS, client certificates required, a users file) for the
module, and the run's shared Spark session (tests/spark/conftest.py). The settings travel as the documented options
(``tls.ca``, ``tls.cert``, ``tls.key``, ``credentials.file``); the workers' readers
(the blocking puller) and writers (the producer) and the driver's planning client
all use them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pyspark = pytest.importorskip("pyspark")
trustme = pytest.importorskip("trustme")

from equeue import Message, wire  # noqa: E402
from equeue.acl import Acl, UsersFile  # noqa: E402
from equeue.broker import EmbeddedBroker  # noqa: E402
from equeue.client import Client  # noqa: E402
from equeue.config import BrokerConfig  # noqa: E402
from equeue.security import ClientSecurity, Credentials, TlsSettings  # noqa: E402
from equeue.users import make_user, update_users_file  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("spark-pki")
    ca = trustme.CA()
    files = {name: root / f"{name}.pem" for name in ("ca", "server", "client_cert", "client_key")}
    ca.cert_pem.write_to_path(str(files["ca"]))
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(files["server"]))
    client = ca.issue_cert("spark@example")
    client.cert_chain_pems[0].write_to_path(str(files["client_cert"]))
    client.private_key_pem.write_to_path(str(files["client_key"]))
    # users: an admin for the test's set-up, and "spark", who may only produce and
    # consume the tls-* topics
    files["users"] = root / "users.json"
    spark_acls = [Acl("topic", "tls-*", ["produce", "consume"])]
    update_users_file(
        files["users"],
        lambda d: UsersFile()
        .with_user(make_user("root", "root-pw", admin=True))
        .with_user(make_user("spark", "spark-pw", acls=spark_acls)),
    )
    files["spark_creds"] = root / "spark.creds"
    files["spark_creds"].write_text("spark:spark-pw\n")
    files["bad_creds"] = root / "bad.creds"
    files["bad_creds"].write_text("spark:wrong\n")
    return files


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: dict[str, Path]) -> Iterator[EmbeddedBroker]:
    cfg = BrokerConfig(
        data_dir=tmp_path_factory.mktemp("spark-tls-broker") / "data", port=0, map_size=1 << 30,
        flush="async", shutdown_grace=2.0, tls_cert=pki["server"], tls_ca=pki["ca"], tls_client_auth="required",
        users_file=pki["users"],
    )  # fmt: skip
    with EmbeddedBroker(cfg) as b:
        yield b


@pytest.fixture(scope="module")
def client(broker: EmbeddedBroker, pki: dict[str, Path]) -> Iterator[Client]:
    sec = ClientSecurity(
        tls=TlsSettings(ca_file=pki["ca"], cert_file=pki["client_cert"], key_file=pki["client_key"]),
        credentials=Credentials("root", "root-pw"),
    )
    with Client(broker.address, security=sec) as c:
        yield c


def tls_options(broker: EmbeddedBroker, pki: dict[str, Path]) -> dict[str, str]:
    return {
        "brokers": broker.address, "tls.ca": str(pki["ca"]),
        "tls.cert": str(pki["client_cert"]), "tls.key": str(pki["client_key"]),
        "credentials.file": str(pki["spark_creds"]),
    }  # fmt: skip


def test_source_and_sink_over_mutual_tls_with_scram(
    ss: Any, broker: EmbeddedBroker, client: Client, pki: dict[str, Path]
) -> None:
    client.create_topic("tls-in", 2)
    for q in range(2):
        entries = [wire.encode_entry(Message(f"in-{q}-{i}", key=f"k{i}")) for i in range(30)]
        client.produce(wire.ProduceRequest("tls-in", q, entries))
    opts = tls_options(broker, pki)
    df = ss.read.format("equeue").options(**opts).option("topic", "tls-in").load()
    bodies = sorted(bytes(r.body).decode() for r in df.select("body").collect())
    assert bodies == sorted(f"in-{q}-{i}" for q in range(2) for i in range(30))
    # the sink: the rows go back out to another topic over TLS
    client.create_topic("tls-out", 2)
    df.select("body", "key").write.format("equeue").options(**opts).option("topic", "tls-out").mode("append").save()
    d = client.describe_topic("tls-out")
    assert sum(qs.max_offset - qs.min_offset for qs in d.queues) == 60
    # without the client certificate the broker refuses the read, with a clear error
    no_cert = {"brokers": broker.address, "tls.ca": str(pki["ca"]), "credentials.file": str(pki["spark_creds"])}
    with pytest.raises(Exception, match="client certificate"):
        ss.read.format("equeue").options(**no_cert).option("topic", "tls-in").load().collect()
    # a wrong password, and a topic outside the user's ACLs, are clear refusals too
    with pytest.raises(Exception, match=r"AuthFailed"):
        ss.read.format("equeue").options(**{**opts, "credentials.file": str(pki["bad_creds"])}).option(
            "topic", "tls-in"
        ).load().collect()
    client.create_topic("other", 1)
    with pytest.raises(Exception, match=r"NotAuthorized: user .spark. has no .describe. permission on topic .other."):
        ss.read.format("equeue").options(**opts).option("topic", "other").load().collect()
