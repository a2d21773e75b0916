"""AMQP 0-9-1 reply codes, RabbitMQ-style reply texts, and the errors the broker raises.

Hard and soft are the spec's classes: a soft error closes one channel (``channel.close``), a
hard error closes the whole connection (``connection.close``). The split below is RabbitMQ's
``rabbit_framing_amqp_0_9_1:lookup_amqp_exception/1``, which follows the spec XML: note that
504 CHANNEL_ERROR and 540 NOT_IMPLEMENTED are hard, so they close the connection.

Reply texts are formatted as RabbitMQ's ``rabbit_binary_generator:amqp_exception_explanation``
does: ``"<CODE_NAME> - <explanation>"``, cut to 255 characters (a shortstr holds 255 bytes,
so the cut here is by UTF-8 bytes, never splitting a character).
"""

REPLY_SUCCESS = 200
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

CODE_NAMES = {
    REPLY_SUCCESS: "REPLY_SUCCESS",
    CONTENT_TOO_LARGE: "CONTENT_TOO_LARGE",
    NO_ROUTE: "NO_ROUTE",
    NO_CONSUMERS: "NO_CONSUMERS",
    CONNECTION_FORCED: "CONNECTION_FORCED",
    INVALID_PATH: "INVALID_PATH",
    ACCESS_REFUSED: "ACCESS_REFUSED",
    NOT_FOUND: "NOT_FOUND",
    RESOURCE_LOCKED: "RESOURCE_LOCKED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED",
    FRAME_ERROR: "FRAME_ERROR",
    SYNTAX_ERROR: "SYNTAX_ERROR",
    COMMAND_INVALID: "COMMAND_INVALID",
    CHANNEL_ERROR: "CHANNEL_ERROR",
    UNEXPECTED_FRAME: "UNEXPECTED_FRAME",
    RESOURCE_ERROR: "RESOURCE_ERROR",
    NOT_ALLOWED: "NOT_ALLOWED",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    INTERNAL_ERROR: "INTERNAL_ERROR",
}

SOFT_CODES = frozenset(
    {
        CONTENT_TOO_LARGE,
        NO_ROUTE,
        NO_CONSUMERS,
        ACCESS_REFUSED,
        NOT_FOUND,
        RESOURCE_LOCKED,
        PRECONDITION_FAILED,
    }
)
HARD_CODES = frozenset(CODE_NAMES) - SOFT_CODES - {REPLY_SUCCESS}

REPLY_TEXT_BYTES_MAX = 255


def is_hard(code):
    """True when ``code`` must close the connection rather than one channel."""
    assert code in CODE_NAMES, f"unknown reply code {code}"
    return code in HARD_CODES


def format_reply_text(code, explanation):
    """``"NOT_FOUND - no queue 'x' in vhost '/'"``: RabbitMQ's reply text, fitted to a shortstr."""
    text = f"{CODE_NAMES[code]} - {explanation}" if explanation else CODE_NAMES[code]
    encoded = text.encode("utf-8")
    if len(encoded) <= REPLY_TEXT_BYTES_MAX:
        return text
    return encoded[:REPLY_TEXT_BYTES_MAX].decode("utf-8", errors="ignore")


class ProtocolError(Exception):
    """An AMQP exception: a reply code, an explanation, and the failing method's ids.

    ``text`` is the explanation alone ("no queue 'x' in vhost '/'"); ``reply_text`` is what
    goes on the wire ("NOT_FOUND - no queue 'x' in vhost '/'"). Class and method ids of 0
    mean "not given": the connection machine fills in the method it was processing.
    """

    def __init__(self, code, text, class_id=0, method_id=0):
        assert code in CODE_NAMES and code != REPLY_SUCCESS, f"not an error code: {code}"
        super().__init__(code, text, class_id, method_id)
        self.code = code
        self.text = text
        self.class_id = class_id
        self.method_id = method_id

    @property
    def reply_text(self):
        return format_reply_text(self.code, self.text)

    def __str__(self):
        return f"{self.reply_text} (class {self.class_id}, method {self.method_id})"


class ChannelError(ProtocolError):
    """A soft error: the channel is closed with ``channel.close``; the connection carries on."""

    def __init__(self, code, text, class_id=0, method_id=0):
        assert code in SOFT_CODES, f"{code} is a hard error code; raise AMQPConnectionError"
        super().__init__(code, text, class_id, method_id)


class AMQPConnectionError(ProtocolError):
    """A hard error: the connection is closed with ``connection.close``.

    Named with the prefix so that it does not shadow the builtin ``ConnectionError`` (an
    ``OSError``) that the asyncio shell around this package also has to catch.
    """


def protocol_error(code, text, class_id=0, method_id=0):
    """The right exception for ``code``: soft codes give a ChannelError, hard ones a connection
    error.
    """
    if code in SOFT_CODES:
        return ChannelError(code, text, class_id, method_id)
    return AMQPConnectionError(code, text, class_id, method_id)
