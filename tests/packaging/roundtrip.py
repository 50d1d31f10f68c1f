"""Run inside a venv where only the built wheel is installed: a producer/consumer round trip
against an embedded broker, using the short public imports. Prints ``ROUNDTRIP OK``."""

import sys
import tempfile
from pathlib import Path

from equeue import Consumer, Message, Producer
from equeue.broker import EmbeddedBroker
from equeue.config import BrokerConfig

with tempfile.TemporaryDirectory() as d, EmbeddedBroker(BrokerConfig(data_dir=Path(d), port=0)) as b:
    with Producer(b.address) as p:
        sent = [p.send("wheel-check", f"m{i}".encode(), key=f"k{i}") for i in range(5)]
    got: list[Message] = []
    with Consumer(b.address, group="wheel", topics=["wheel-check"], start_from="earliest") as c:
        for msg in c:
            got.append(msg)
            if len(got) == len(sent):
                break
    assert sorted(m.body for m in got) == [f"m{i}".encode() for i in range(5)], got
print("ROUNDTRIP OK", file=sys.stdout)
