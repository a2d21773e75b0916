"""Broker settings: defaults < TOML file < WARREN_* environment < flags; bad values refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from warrenmq.server.config import BrokerConfig, ConfigError, load


def test_embedded_defaults_match_the_issue():
    config = load(environ={})
    assert (config.port, config.bind, config.data_dir, config.log_level) == (
        5672,
        "0.0.0.0",
        Path("./data"),
        "info",
    )
    assert config.loopback_users == ("guest",)


def test_precedence_file_then_environment_then_flags(tmp_path):
    toml = tmp_path / "warren.toml"
    toml.write_text(
        'port = 6000\nbind = "127.0.0.1"\ndata_dir = "/srv/warren"\n'
        'log_level = "debug"\nchannel_max = 16\n'
    )
    config = load(
        toml,
        environ={"WARREN_PORT": "6001", "WARREN_LOG_LEVEL": "WARNING"},
        overrides={"port": 6002, "bind": None},
    )
    assert config.port == 6002
    assert config.bind == "127.0.0.1"
    assert config.data_dir == Path("/srv/warren")
    assert config.log_level == "warning"
    assert config.channel_max == 16


def test_config_file_named_by_environment(tmp_path):
    toml = tmp_path / "w.toml"
    toml.write_text("heartbeat_s = 5\n")
    assert load(environ={"WARREN_CONFIG": str(toml)}).heartbeat_s == 5


def test_unknown_environment_variables_are_ignored():
    assert load(environ={"WARREN_NOT_A_SETTING": "1", "HOME": "/"}).port == 5672


def test_list_settings_from_environment():
    assert load(environ={"WARREN_LOOPBACK_USERS": "guest, admin"}).loopback_users == (
        "guest",
        "admin",
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("nonsense = 1\n", "unknown setting"),
        ("port = 70000\n", "port must be"),
        ('port = "x"\n', "bad value for port"),
        ('log_level = "loud"\n', "log_level must be"),
        ("frame_bytes_max = 100\n", "frame_bytes_max must be"),
        ("channel_tx_message_max = 0\n", "channel_tx_message_max must be positive"),
        ("port = [\n", "cannot read config file"),
    ],
)
def test_bad_files_are_refused_with_the_reason(tmp_path, text, message):
    toml = tmp_path / "bad.toml"
    toml.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load(toml, environ={})


def test_bad_environment_value_is_refused():
    with pytest.raises(ConfigError, match="bad value for heartbeat_s"):
        load(environ={"WARREN_HEARTBEAT_S": "soon"})


def test_unknown_override_is_refused():
    with pytest.raises(ConfigError, match="unknown setting"):
        load(environ={}, overrides={"colour": "blue"})


def test_bounds_are_checked_on_construction():
    with pytest.raises(ConfigError):
        BrokerConfig(read_buffer_bytes_max=0)
    with pytest.raises(ConfigError):
        BrokerConfig(shutdown_timeout_s=-1)


def test_log_open_files_max_sizes_the_brokers_descriptor_pool(tmp_path):
    from warrenmq.log.descriptors import default_capacity
    from warrenmq.server.broker import Broker

    assert load(environ={"WARREN_LOG_OPEN_FILES_MAX": "300"}).log_open_files_max == 300
    toml = tmp_path / "w.toml"
    toml.write_text("log_open_files_max = 64\n")
    config = load(toml, environ={})
    assert Broker(config).descriptors.capacity == 64
    assert Broker(BrokerConfig()).descriptors.capacity == default_capacity()
    with pytest.raises(ConfigError, match="log_open_files_max"):
        BrokerConfig(log_open_files_max=-1)


def test_the_transaction_limit_is_a_setting():
    assert load(environ={"WARREN_CHANNEL_TX_MESSAGE_MAX": "5"}).channel_tx_message_max == 5


def test_cluster_settings_from_file_environment_and_flags(tmp_path):
    from warrenmq.server.broker import Broker

    config_file = tmp_path / "warren.toml"
    config_file.write_text('cluster = "1=10.0.0.1:25672,2=10.0.0.2:25672"\nnode_id = 2\n')
    config = load(config_file, environ={"WARREN_JOIN": "true"})
    assert config.cluster_peers == {1: ("10.0.0.1", 25672), 2: ("10.0.0.2", 25672)}
    assert (config.node_id, config.join, config.node_host) == (2, True, "10.0.0.2")
    flagged = load(config_file, environ={}, overrides={"advertise_host": "broker-2"})
    assert flagged.node_host == "broker-2"
    assert load(environ={}).cluster_peers == {}
    assert load(environ={}).node_host == "127.0.0.1"
    compacting = load(environ={"WARREN_METADATA_SNAPSHOT_ENTRIES": "50"})
    assert compacting.metadata_snapshot_entries == 50
    proxied = load(environ={"WARREN_FORWARD_ADDRESSES": "2=127.0.0.1:4002, 3=127.0.0.1:4003"})
    assert proxied.forward_peers == {2: ("127.0.0.1", 4002), 3: ("127.0.0.1", 4003)}
    assert load(environ={}).forward_peers == {}
    # Links for forwarded work are dialled there, not at the address node 2 registered.
    assert Broker(proxied).node_address(2) == ("127.0.0.1", 4002)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"cluster": "1=a:1,2=b"}, "'2=b' is not ID=HOST:PORT"),
        ({"cluster": "1=a:1,x=b:2"}, "'x=b:2' is not ID=HOST:PORT"),
        ({"cluster": "1=a:70000"}, "port must be 1..65535"),
        ({"cluster": "1=a:1,1=b:2"}, "lists node 1 twice"),
        ({"cluster": "1=a:1,2=a:1"}, "the same address"),
        ({"cluster": "1=a:1,2=b:1", "node_id": 3}, "node_id 3 is not in cluster"),
        ({"node_id": 0}, "node_id must be at least 1"),
        ({"join": True}, "join needs cluster"),
        ({"metadata_snapshot_entries": 0}, "metadata_snapshot_entries must be at least 1"),
        ({"forward_addresses": "2=b"}, "forward_addresses entry '2=b' is not ID=HOST:PORT"),
        ({"forward_addresses": "1=a:1"}, r"forward_addresses lists this node \(1\) itself"),
    ],
)
def test_bad_cluster_settings_are_refused_with_the_reason(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load(environ={}, overrides=overrides)


def test_tail_cache_bytes_max_bounds_one_cache_every_queue_log_shares(tmp_path):
    from warrenmq.server.broker import Broker

    assert load(environ={"WARREN_TAIL_CACHE_BYTES_MAX": "1024"}).tail_cache_bytes_max == 1024
    broker = Broker(BrokerConfig(tail_cache_bytes_max=32 << 20, data_dir=str(tmp_path)))
    budget = broker.message_log_config.tail_cache_budget
    assert budget is not None and budget.bytes_max == 32 << 20
    assert broker.message_log_config.tail_cache_bytes_max == 32 << 20
    assert {id(c.message_log.tail_cache_budget) for c in broker._queue_configs.values()} == {
        id(budget)
    }
    assert broker._delayed_log_config.message_log.tail_cache_budget is budget
    with pytest.raises(ConfigError, match="tail_cache_bytes_max"):
        BrokerConfig(tail_cache_bytes_max=-1)
    # A quarter of the memory high watermark at most.
    small = Broker(BrokerConfig(memory_high_watermark_bytes=100 << 20, data_dir=str(tmp_path)))
    assert small.message_log_config.tail_cache_budget.bytes_max == 25 << 20
