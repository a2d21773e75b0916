"""TLS: the amqps listener, SASL EXTERNAL, HTTPS, the settings, and `warren tls generate`.

Real sockets with unmodified clients (pika, aio-pika, py-amqp) against a broker whose
certificates `warren tls generate` wrote; a second, unrelated CA plays the wrong one.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import stat
import subprocess
import urllib.request

import aio_pika
import pika
import pytest
from brokers import warren_serve
from cryptography import x509
from http_api import HttpApi
from raw_client import Closed, offered_mechanisms

import amqp as py_amqp  # py-amqp, not our folder: the repository root is off sys.path
from amqp import sasl as py_amqp_sasl
from warrenmq.server import cli, tls, tls_cli
from warrenmq.server import config as broker_config
from warrenmq.server.config import BrokerConfig, ConfigError

CLIENT_NAME = "guest"


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    directory = tmp_path_factory.mktemp("certificates")
    tls_cli.generate(directory, hosts=("localhost", "127.0.0.1"), client_name=CLIENT_NAME)
    return directory


@pytest.fixture(scope="module")
def wrong_certificates(tmp_path_factory):
    directory = tmp_path_factory.mktemp("other-ca")
    tls_cli.generate(directory, hosts=("localhost",), client_name=CLIENT_NAME)
    return directory


def tls_settings(certificates, **settings):
    return {
        "tls_port": 0,
        "ssl_options_certfile": str(certificates / tls_cli.SERVER_CERTIFICATE),
        "ssl_options_keyfile": str(certificates / tls_cli.SERVER_KEY),
        "ssl_options_cacertfile": str(certificates / tls_cli.CA_CERTIFICATE),
        "ssl_options_verify": "verify_peer",
        **settings,
    }


def client_context(certificates, *, with_certificate=True, client=None):
    """A client's context trusting `certificates`' CA, presenting `client`'s certificate
    (default: the same directory's)."""
    context = ssl.create_default_context(cafile=str(certificates / tls_cli.CA_CERTIFICATE))
    if with_certificate:
        client = client or certificates
        context.load_cert_chain(
            str(client / tls_cli.CLIENT_CERTIFICATE), str(client / tls_cli.CLIENT_KEY)
        )
    return context


@pytest.fixture(scope="module")
def tls_broker(certificates, tmp_path_factory):
    """verify_peer without fail_if_no_peer_cert, EXTERNAL users by common name."""
    from brokers import ThreadBroker

    running = ThreadBroker(
        tmp_path_factory.mktemp("broker"),
        **tls_settings(certificates, ssl_cert_login_from="common_name"),
    ).start()
    yield running
    running.stop()


def pika_parameters(port, context, **kwargs):
    return pika.ConnectionParameters(
        "localhost",
        port,
        ssl_options=pika.SSLOptions(context, "localhost"),
        connection_attempts=1,
        **kwargs,
    )


def round_trip(connection: pika.BlockingConnection) -> bytes:
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_publish("", queue, b"over tls")
    _, _, body = channel.basic_get(queue, auto_ack=True)
    return body


def mechanisms(port, context=None) -> list[str]:
    return offered_mechanisms("127.0.0.1", port, context)


# -- settings and the context ---------------------------------------------------------------


def test_ssl_options_take_rabbitmq_names_in_toml_and_the_environment(tmp_path, certificates):
    config_file = tmp_path / "warren.toml"
    config_file.write_text(
        f'ssl_options.certfile = "{certificates / tls_cli.SERVER_CERTIFICATE}"\n'
        f'ssl_options.keyfile = "{certificates / tls_cli.SERVER_KEY}"\n'
        f'ssl_options.cacertfile = "{certificates / tls_cli.CA_CERTIFICATE}"\n'
        'ssl_options.verify = "verify_peer"\n'
        "ssl_options.fail_if_no_peer_cert = true\n"
        "tls_port = 5999\n"
    )
    loaded = broker_config.load(config_file, environ={"WARREN_SSL_CERT_LOGIN_FROM": "common_name"})
    assert loaded.tls_enabled and loaded.tls_port == 5999
    assert loaded.ssl_options_verify == "verify_peer" and loaded.ssl_options_fail_if_no_peer_cert
    assert loaded.ssl_cert_login_from == "common_name"
    assert not BrokerConfig().tls_enabled and BrokerConfig().tls_port == 5671


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"ssl_options_verify": "verify_maybe"}, "ssl_options.verify must be one of"),
        ({"ssl_cert_login_from": "serial"}, "ssl_cert_login_from must be one of"),
        ({"ssl_options_certfile": "c.pem"}, "go together"),
        (
            {
                "ssl_options_certfile": "c",
                "ssl_options_keyfile": "k",
                "ssl_options_verify": "verify_peer",
            },
            "needs ssl_options.cacertfile",
        ),
        ({"http_tls": True}, "http_tls needs"),
        ({"tls_port": 70000}, "tls_port must be 0..65535"),
    ],
)
def test_bad_tls_settings_are_refused(settings, message):
    with pytest.raises(ConfigError, match=message):
        BrokerConfig(**settings)


def test_server_context_follows_verify_and_fail_if_no_peer_cert(certificates):
    modes = {}
    for verify, fail in (("verify_none", False), ("verify_peer", False), ("verify_peer", True)):
        settings = tls_settings(
            certificates, ssl_options_verify=verify, ssl_options_fail_if_no_peer_cert=fail
        )
        context = tls.server_context(BrokerConfig(**settings))
        assert context.minimum_version == ssl.TLSVersion.TLSv1_2
        modes[verify, fail] = context.verify_mode
    assert modes == {
        ("verify_none", False): ssl.CERT_NONE,
        ("verify_peer", False): ssl.CERT_OPTIONAL,
        ("verify_peer", True): ssl.CERT_REQUIRED,
    }


def test_certificate_user_from_each_field(certificates):
    client = x509.load_pem_x509_certificate(
        (certificates / tls_cli.CLIENT_CERTIFICATE).read_bytes()
    )
    server = x509.load_pem_x509_certificate(
        (certificates / tls_cli.SERVER_CERTIFICATE).read_bytes()
    )
    # RFC 4514 order, most significant last, as RabbitMQ prints a subject.
    assert tls.certificate_user(client, "distinguished_name") == f"CN={CLIENT_NAME},O=Warren"
    assert tls.certificate_user(client, "common_name") == CLIENT_NAME
    assert tls.certificate_user(client, "subject_alternative_name") is None
    assert tls.certificate_user(server, "subject_alternative_name") == "localhost"


def test_generate_writes_keys_for_the_owner_only(certificates):
    for name in (tls_cli.CA_KEY, tls_cli.SERVER_KEY, tls_cli.CLIENT_KEY):
        assert stat.S_IMODE(os.stat(certificates / name).st_mode) == 0o600
    server = x509.load_pem_x509_certificate(
        (certificates / tls_cli.SERVER_CERTIFICATE).read_bytes()
    )
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)


# -- the amqps listener ---------------------------------------------------------------------


def test_external_is_offered_on_tls_connections_only(tls_broker, certificates):
    assert mechanisms(tls_broker.port) == ["PLAIN", "AMQPLAIN"]
    without = client_context(certificates, with_certificate=False)
    for context in (without, client_context(certificates)):
        assert mechanisms(tls_broker.broker.tls_port, context) == [
            "PLAIN",
            "AMQPLAIN",
            "EXTERNAL",
        ]


def test_external_without_a_client_certificate_is_access_refused(tls_broker, certificates):
    parameters = pika_parameters(
        tls_broker.broker.tls_port,
        client_context(certificates, with_certificate=False),
        credentials=pika.credentials.ExternalCredentials(),
    )
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused:
        pika.BlockingConnection(parameters)
    assert "ACCESS_REFUSED - Login was refused using authentication mechanism EXTERNAL" in str(
        refused.value
    )


def test_pika_logs_in_with_external_and_its_certificate(tls_broker, certificates):
    parameters = pika_parameters(
        tls_broker.broker.tls_port,
        client_context(certificates),
        credentials=pika.credentials.ExternalCredentials(),
    )
    with pika.BlockingConnection(parameters) as connection:
        assert round_trip(connection) == b"over tls"


def test_the_api_lists_the_tls_listener_and_tls_connections(tls_broker, certificates):
    api = HttpApi(tls_broker.management_url)
    listeners = api.get("/api/overview").json["listeners"]
    assert {"protocol": "amqp/ssl", "port": tls_broker.broker.tls_port} in [
        {"protocol": listener["protocol"], "port": listener["port"]} for listener in listeners
    ]
    parameters = pika_parameters(
        tls_broker.broker.tls_port,
        client_context(certificates),
        credentials=pika.credentials.ExternalCredentials(),
        client_properties={"connection_name": "tls-listed"},
    )
    with pika.BlockingConnection(parameters):
        listed = [
            connection
            for connection in api.get("/api/connections").json
            if connection["client_properties"].get("connection_name") == "tls-listed"
        ]
    assert [(c["ssl"], c["auth_mechanism"], c["user"]) for c in listed] == [
        (True, "EXTERNAL", CLIENT_NAME)
    ]


def test_pika_logs_in_with_a_password_over_tls_without_a_certificate(tls_broker, certificates):
    parameters = pika_parameters(
        tls_broker.broker.tls_port, client_context(certificates, with_certificate=False)
    )
    with pika.BlockingConnection(parameters) as connection:
        assert round_trip(connection) == b"over tls"


def test_aio_pika_logs_in_with_external(tls_broker, certificates):
    async def run():
        connection = await aio_pika.connect(
            f"amqps://localhost:{tls_broker.broker.tls_port}/?auth=external",
            ssl_context=client_context(certificates),
            timeout=10,
        )
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue(exclusive=True)
            await channel.default_exchange.publish(aio_pika.Message(b"aio"), queue.name)
            message = await queue.get(timeout=10)
            await message.ack()
            return message.body

    assert asyncio.run(run()) == b"aio"


def test_py_amqp_logs_in_with_external(tls_broker, certificates):
    connection = py_amqp.Connection(
        f"localhost:{tls_broker.broker.tls_port}",
        ssl={
            "ca_certs": str(certificates / tls_cli.CA_CERTIFICATE),
            "certfile": str(certificates / tls_cli.CLIENT_CERTIFICATE),
            "keyfile": str(certificates / tls_cli.CLIENT_KEY),
            "cert_reqs": ssl.CERT_REQUIRED,
            "server_hostname": "localhost",
        },
        authentication=(py_amqp_sasl.EXTERNAL(),),
        connect_timeout=10,
    )
    connection.connect()
    try:
        channel = connection.channel()
        queue, _, _ = channel.queue_declare(exclusive=True)
        channel.basic_publish(py_amqp.Message(b"py-amqp"), routing_key=queue)
        message = channel.basic_get(queue, no_ack=True)
        assert message.body == b"py-amqp"
    finally:
        connection.close()


def test_a_certificate_from_another_ca_is_refused(tls_broker, certificates, wrong_certificates):
    context = client_context(certificates, client=wrong_certificates)
    with pytest.raises((ssl.SSLError, Closed)):
        mechanisms(tls_broker.broker.tls_port, context)
    parameters = pika_parameters(
        tls_broker.broker.tls_port, context, credentials=pika.credentials.ExternalCredentials()
    )
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(parameters)


def test_a_client_trusting_another_ca_refuses_the_broker(tls_broker, wrong_certificates):
    context = client_context(wrong_certificates)
    with pytest.raises(ssl.SSLCertVerificationError):
        mechanisms(tls_broker.broker.tls_port, context)


def test_fail_if_no_peer_cert_refuses_a_client_without_one(tmp_path, start_broker, certificates):
    running = start_broker(
        tmp_path, **tls_settings(certificates, ssl_options_fail_if_no_peer_cert=True)
    )
    without = client_context(certificates, with_certificate=False)
    with pytest.raises((ssl.SSLError, Closed)):
        mechanisms(running.broker.tls_port, without)
    assert "EXTERNAL" in mechanisms(running.broker.tls_port, client_context(certificates))


def test_external_for_a_user_that_does_not_exist_is_access_refused(
    tmp_path, start_broker, certificates
):
    # The default, distinguished_name, names "CN=guest,O=Warren": no such user.
    running = start_broker(tmp_path, **tls_settings(certificates))
    parameters = pika_parameters(
        running.broker.tls_port,
        client_context(certificates),
        credentials=pika.credentials.ExternalCredentials(),
    )
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused:
        pika.BlockingConnection(parameters)
    assert "ACCESS_REFUSED - Login was refused using authentication mechanism EXTERNAL" in str(
        refused.value
    )


def test_http_tls_adds_https_listeners_beside_the_plain_ones(
    tmp_path, start_broker, certificates, capsys
):
    running = start_broker(tmp_path, **tls_settings(certificates, http_tls=True))
    ports = running.broker.http.ports()
    assert set(ports) == {"management", "management-ssl", "metrics", "metrics-ssl"}
    whoami = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}
    context = client_context(certificates, with_certificate=False)
    request = urllib.request.Request(
        f"https://localhost:{ports['management-ssl']}/api/whoami", headers=whoami
    )
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        assert response.status == 200
    with urllib.request.urlopen(
        f"https://localhost:{ports['metrics-ssl']}/metrics", context=context, timeout=10
    ) as response:
        assert response.status == 200
    # The plain listeners still speak plain HTTP, as RabbitMQ's beside management.ssl.
    plain = urllib.request.Request(f"http://127.0.0.1:{ports['management']}/api/overview")
    plain.add_header("Authorization", whoami["Authorization"])
    with urllib.request.urlopen(plain, timeout=10) as response:
        listeners = {
            (entry["protocol"], entry["port"]) for entry in json.load(response)["listeners"]
        }
    assert {
        ("http", ports["management"]),
        ("https", ports["management-ssl"]),
        ("http/prometheus", ports["metrics"]),
        ("https/prometheus", ports["metrics-ssl"]),
    } <= listeners
    with urllib.request.urlopen(f"http://127.0.0.1:{ports['metrics']}/metrics", timeout=10):
        pass

    # The CLI's API client over HTTPS: verified against --cacertfile, refused without it.
    url = f"https://localhost:{ports['management-ssl']}"
    ca = str(certificates / tls_cli.CA_CERTIFICATE)
    capsys.readouterr()
    assert cli.main(["status", "--url", url, "--cacertfile", ca]) == 0
    assert "Error" not in capsys.readouterr().err
    assert cli.main(["status", "--url", url]) == 1
    assert "CERTIFICATE_VERIFY_FAILED" in capsys.readouterr().err


def test_serve_announces_the_amqps_listener(tmp_path, certificates):
    command = warren_serve(
        tmp_path,
        0,
        "--tls-port",
        "0",
        "--ssl-certfile",
        str(certificates / tls_cli.SERVER_CERTIFICATE),
        "--ssl-keyfile",
        str(certificates / tls_cli.SERVER_KEY),
        "--log-level",
        "warning",
    )
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert "; amqps on 127.0.0.1:" in line, line
        port = int(line.split("; amqps on 127.0.0.1:")[1].split(";")[0])
        without = client_context(certificates, with_certificate=False)
        assert "EXTERNAL" in mechanisms(port, without)
    finally:
        process.terminate()
        process.wait(30)
