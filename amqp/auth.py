"""SASL responses of connection.start-ok: PLAIN, AMQPLAIN and EXTERNAL, parsed as RabbitMQ does.

The machine only extracts credentials; checking them is the broker's job (it answers the
``AuthenticationRequested`` event). Matched against RabbitMQ:

* PLAIN (``rabbit_auth_mechanism_plain``): the response must be exactly ``\\0user\\0pass`` —
  an empty authorization identity, and no further NUL. Anything else is
  ``{protocol_error, "response ~tp invalid"}``, which ``rabbit_reader:auth_phase`` raises as
  502 SYNTAX_ERROR.
* AMQPLAIN (``rabbit_auth_mechanism_amqplain``): a field table without its length prefix,
  holding string ``LOGIN`` and ``PASSWORD`` entries; a missing entry or a non-string one is a
  502 with RabbitMQ's texts.
* EXTERNAL (``rabbit_auth_mechanism_ssl``): the response is ignored; the user is the one the
  TLS client certificate names, which the broker knows and the machine does not, so the
  username here is empty. The broker offers it (``ConnectionConfig.mechanisms``) on TLS
  connections only, and refuses it without a verified client certificate.
* A mechanism that is not offered: 503 COMMAND_INVALID "unknown authentication mechanism 'X'"
  (``rabbit_reader:auth_mechanism_to_module``).
"""

from . import frames, replies

EXTERNAL = "EXTERNAL"
MECHANISMS = ("PLAIN", "AMQPLAIN", EXTERNAL)
# What a connection offers unless the broker says otherwise: the password mechanisms.
PASSWORD_MECHANISMS = ("PLAIN", "AMQPLAIN")


def _text(value):
    return value.decode("utf-8") if isinstance(value, bytes) else value


def parse_response(mechanism, response, class_id, method_id):
    """(username, password) from a start-ok response; raises AMQPConnectionError if malformed."""
    if mechanism not in MECHANISMS:
        raise replies.AMQPConnectionError(
            replies.COMMAND_INVALID,
            f"unknown authentication mechanism '{mechanism}'",
            class_id,
            method_id,
        )
    if mechanism == EXTERNAL:
        return "", ""
    raw = response.encode("utf-8") if isinstance(response, str) else bytes(response)
    try:
        if mechanism == "PLAIN":
            return _parse_plain(raw)
        return _parse_amqplain(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise replies.AMQPConnectionError(
            replies.SYNTAX_ERROR, str(error), class_id, method_id
        ) from error


def _parse_plain(raw):
    parts = raw.split(b"\x00")
    if len(parts) != 3 or parts[0] != b"":
        raise ValueError(f"response {frames.erlang_binary(raw)} invalid")
    return parts[1].decode("utf-8"), parts[2].decode("utf-8")


def _parse_amqplain(raw):
    table = frames.decode_field_table(raw)
    if "LOGIN" not in table or "PASSWORD" not in table:
        raise ValueError(f"AMQPLAIN auth info {table} is missing LOGIN or PASSWORD field")
    login, password = table["LOGIN"], table["PASSWORD"]
    if not isinstance(login, (str, bytes)) or not isinstance(password, (str, bytes)):
        raise ValueError(
            f"AMQPLAIN auth info {table} uses unsupported type for LOGIN or PASSWORD field"
        )
    return _text(login), _text(password)
