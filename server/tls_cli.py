"""`warren tls generate DIR`: a private CA, and a server and a client certificate it signed,
for local use and tests (RabbitMQ's tls-gen "basic" profile, with its file names).

Keys are ECDSA P-256 and written readable by the owner only; certificates last a year. The
server certificate names ``localhost`` and ``127.0.0.1`` (and any ``--host``); the client
certificate's subject is ``CN=<--client-name>,O=Warren``, the user name SASL EXTERNAL takes
from it depends on ``ssl_cert_login_from``.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 365
ORGANISATION = "Warren"
CA_CERTIFICATE = "ca_certificate.pem"
CA_KEY = "ca_key.pem"
SERVER_CERTIFICATE = "server_certificate.pem"
SERVER_KEY = "server_key.pem"
CLIENT_CERTIFICATE = "client_certificate.pem"
CLIENT_KEY = "client_key.pem"


def register(commands: Any) -> None:
    parser = commands.add_parser("tls", help="TLS certificates for local use")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    generate_parser = actions.add_parser(
        "generate", help="write a CA, a server and a client certificate into DIR"
    )
    generate_parser.add_argument("dir", help="directory to write the PEM files into")
    generate_parser.add_argument(
        "--host",
        action="append",
        default=[],
        help="another name or IP address the server certificate is valid for (repeatable)",
    )
    generate_parser.add_argument(
        "--client-name", default="guest", help="the client certificate's CN (default guest)"
    )
    generate_parser.set_defaults(handler=_generate_command)


def _generate_command(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    generate(directory, hosts=("localhost", "127.0.0.1", *args.host), client_name=args.client_name)
    print(f"wrote the CA, server and client certificates and keys to {directory}")
    print("warren.toml:")
    print(f'ssl_options.cacertfile = "{directory / CA_CERTIFICATE}"')
    print(f'ssl_options.certfile = "{directory / SERVER_CERTIFICATE}"')
    print(f'ssl_options.keyfile = "{directory / SERVER_KEY}"')
    print('ssl_options.verify = "verify_peer"')
    return 0


def generate(directory: Path, hosts: tuple[str, ...], client_name: str) -> None:
    """Write the CA, server and client certificates and keys (PEM) into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"Warren local CA {now:%Y-%m-%d %H:%M:%S}")
    ca_certificate = (
        _builder(ca_name, ca_name, ca_key, now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(directory / CA_KEY, ca_key)
    _write_certificate(directory / CA_CERTIFICATE, ca_certificate)
    for certificate_file, key_file, common_name, usage, alternative_names in (
        (
            SERVER_CERTIFICATE,
            SERVER_KEY,
            hosts[0],
            ExtendedKeyUsageOID.SERVER_AUTH,
            [_alternative_name(host) for host in hosts],
        ),
        (CLIENT_CERTIFICATE, CLIENT_KEY, client_name, ExtendedKeyUsageOID.CLIENT_AUTH, []),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            _builder(_name(common_name), ca_name, key, now)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if alternative_names:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(alternative_names), critical=False
            )
        _write_key(directory / key_file, key)
        _write_certificate(directory / certificate_file, builder.sign(ca_key, hashes.SHA256()))


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANISATION),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, now: datetime.datetime
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
    )


def _alternative_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(pem)


def _write_certificate(path: Path, certificate: x509.Certificate) -> None:
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
