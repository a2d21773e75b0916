"""TLS for the broker's listeners: one server context built from the ssl_options settings,
used by the amqps listener and (with ``http_tls``) the HTTP ones, and the user name a
verified client certificate gives SASL EXTERNAL.

As RabbitMQ: ``verify_none`` asks for no client certificate; ``verify_peer`` asks for one and
refuses one the CA bundle does not verify, and also refuses none at all only with
``fail_if_no_peer_cert``. TLS 1.2 is the oldest version accepted (RabbitMQ 3.x's default
``ssl_options.versions``).

The user name follows rabbitmq_auth_mechanism_ssl's ``ssl_cert_login_from``:
``distinguished_name`` (its default) is the subject in RFC 4514 form, most significant RDN
last, as RabbitMQ prints it ("CN=client,O=Warren"); ``common_name`` is the subject's CN;
``subject_alternative_name`` the first DNS name of the certificate's SAN extension.
"""

from __future__ import annotations

import ssl

from cryptography import x509
from cryptography.x509.oid import NameOID

from .config import BrokerConfig


def server_context(config: BrokerConfig) -> ssl.SSLContext:
    """The server-side context of the ssl_options settings (files read now: a bad path or
    a key that does not match fails the start, not the first client)."""
    assert config.tls_enabled
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.ssl_options_certfile, config.ssl_options_keyfile)
    if config.ssl_options_cacertfile:
        context.load_verify_locations(cafile=config.ssl_options_cacertfile)
    if config.ssl_options_verify == "verify_peer":
        context.verify_mode = (
            ssl.CERT_REQUIRED if config.ssl_options_fail_if_no_peer_cert else ssl.CERT_OPTIONAL
        )
    else:
        context.verify_mode = ssl.CERT_NONE
    return context


def peer_certificate(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> x509.Certificate | None:
    """The client's certificate if it sent one and the handshake verified it, else None.

    With CERT_NONE OpenSSL asks for no certificate, and with CERT_OPTIONAL a certificate that
    fails verification fails the handshake: one present here was verified.
    """
    if ssl_object is None or ssl_object.context.verify_mode == ssl.CERT_NONE:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der) if der else None


def certificate_user(certificate: x509.Certificate, login_from: str) -> str | None:
    """The user name `certificate` stands for (None when it has no such field)."""
    subject = certificate.subject
    if login_from == "distinguished_name":
        return subject.rfc4514_string()
    if login_from == "common_name":
        names = subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        return str(names[0].value) if names else None
    assert login_from == "subject_alternative_name", login_from
    try:
        extension = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return None
    dns_names = extension.value.get_values_for_type(x509.DNSName)
    return dns_names[0] if dns_names else None
