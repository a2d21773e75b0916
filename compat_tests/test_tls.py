"""AMQP over TLS, against Warren and RabbitMQ alike: both listen with `warren tls generate`'s
certificates, ``verify_peer`` without ``fail_if_no_peer_cert``, EXTERNAL enabled (RabbitMQ:
rabbitmq_auth_mechanism_ssl) and users named by the certificate's distinguished name.

Skipped against a broker without a TLS listener (one given by WARREN_REFERENCE_URL).
"""

from __future__ import annotations

import ssl

import pika
import pytest
from compat_harness import tls_certificates
from raw_client import Closed, offered_mechanisms

from warrenmq.server.tls_cli import CA_CERTIFICATE, CLIENT_CERTIFICATE, CLIENT_KEY, generate


@pytest.fixture
def tls_port(broker) -> int:
    if broker.tls_port is None:
        pytest.skip(f"{broker.name} has no TLS listener here")
    return broker.tls_port


def context(client_certificates=None) -> ssl.SSLContext:
    """A client trusting the brokers' CA, presenting `client_certificates`' client
    certificate (None: none)."""
    result = ssl.create_default_context(cafile=str(tls_certificates() / CA_CERTIFICATE))
    if client_certificates is not None:
        result.load_cert_chain(
            str(client_certificates / CLIENT_CERTIFICATE), str(client_certificates / CLIENT_KEY)
        )
    return result


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory):
    directory = tmp_path_factory.mktemp("other-ca")
    generate(directory, hosts=("localhost",), client_name="guest")
    return directory


def mechanisms(port: int, client: ssl.SSLContext | None = None) -> set[str]:
    return set(offered_mechanisms("127.0.0.1", port, client))


def parameters(port: int, client: ssl.SSLContext, **kwargs) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        "localhost",
        port,
        ssl_options=pika.SSLOptions(client, "localhost"),
        connection_attempts=1,
        **kwargs,
    )


def test_a_password_login_over_tls_round_trips_a_message(tls_port, uid):
    with pika.BlockingConnection(parameters(tls_port, context())) as connection:
        channel = connection.channel()
        channel.queue_declare(uid, exclusive=True)
        channel.basic_publish("", uid, b"over tls")
        _, _, body = channel.basic_get(uid, auto_ack=True)
    assert body == b"over tls"


def test_external_is_offered_on_tls_connections_only(broker, tls_port):
    # rabbitmq_auth_mechanism_ssl offers it on any TLS socket, with or without a certificate.
    assert mechanisms(broker.port) == {"PLAIN", "AMQPLAIN"}
    assert mechanisms(tls_port, context()) == {"PLAIN", "AMQPLAIN", "EXTERNAL"}
    assert mechanisms(tls_port, context(tls_certificates())) == {"PLAIN", "AMQPLAIN", "EXTERNAL"}


def test_a_client_certificate_from_another_ca_is_refused(tls_port, other_ca):
    with pytest.raises((ssl.SSLError, Closed)):
        mechanisms(tls_port, context(other_ca))


@pytest.mark.parametrize("with_certificate", [True, False])
def test_external_without_a_matching_user_or_certificate_is_access_refused(
    tls_port, with_certificate
):
    # "CN=guest,O=Warren" is the user the client certificate names: there is none.
    client = context(tls_certificates() if with_certificate else None)
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused:
        pika.BlockingConnection(
            parameters(tls_port, client, credentials=pika.credentials.ExternalCredentials())
        )
    assert (
        "ACCESS_REFUSED - Login was refused using authentication mechanism EXTERNAL. "
        "For details see the broker logfile." in str(refused.value)
    )
