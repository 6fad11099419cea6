"""gRPC addresses in the config (inference.pool.endpoints, trainer.endpoint, inference.server.follow_trainer) are
checked at load, each bad one named; an eval job's inference_endpoints get the same check."""

from __future__ import annotations

import pytest

from t1.config.loader import ConfigError, load_config
from t1.config.shared import host_port

GOOD = ["127.0.0.1:50051", "localhost:1", "t1-trainer.t1.svc.cluster.local:50061", "[::1]:8000", "host_1:65535"]
BAD = ["", "127.0.0.1", ":50051", "host:0", "host:65536", "host:http", "http://host:80", "ho st:80", "host/x:80",
       "[zz]:80", "-x:80", "h" * 300 + ":80"]


@pytest.mark.parametrize("value", GOOD)
def test_good_addresses(value: str) -> None:
    assert host_port(value) == value


@pytest.mark.parametrize("value", BAD)
def test_bad_addresses_are_named(value: str) -> None:
    with pytest.raises(ValueError, match=r"host|port|address"):
        host_port(value)


@pytest.mark.parametrize("key", ["inference.pool.endpoints=[\"10.0.0.1:50051\",\"bad\"]", "trainer.endpoint=bad:0",
                                 "inference.server.follow_trainer=http://x:1"])
def test_the_config_refuses_a_bad_address_naming_the_key(key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [key])
    assert key.split("=")[0] in str(err.value)
