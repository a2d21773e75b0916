"""AMQP field-table values seen the way RabbitMQ (Erlang) sees them.

Arguments and headers reach `exchanges/` as decoded Python values (pamqp's model): `str` or
`bytes` for a long string, `bytearray` for a byte array, `bool`, `int`, `float`, `Decimal`,
`datetime` for a timestamp, `dict` for a table, `list` for an array and `None` for void.
RabbitMQ holds the same data as `{Type, Value}` Erlang terms. Three things here depend on that
Erlang view, so they are computed from it rather than from Python equality:

* the type name RabbitMQ puts in error texts (`longstr`, `signedint`, ...), inferred the way
  pika and pamqp encode (an int is `signedint` when it fits 32 bits, else `long`), since the
  decoded value has lost the wire width;
* `~p`/`~s` rendering of a value inside an error text;
* equality: Python says `True == 1` and `"a" != b"a"`; Erlang says the opposite, and a headers
  binding must match as Erlang does.
"""

from __future__ import annotations

import calendar
import datetime
import decimal
from collections.abc import Mapping
from typing import Any

_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1


def amqp_type_name(value: Any) -> str:
    """RabbitMQ's type atom for `value`, as a client library would have encoded it."""
    if isinstance(value, (str, bytes)):
        return "longstr"
    if isinstance(value, bytearray):
        return "binary"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if _INT32_MIN <= value <= _INT32_MAX else "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, decimal.Decimal):
        return "decimal"
    if isinstance(value, datetime.datetime):
        return "timestamp"
    if isinstance(value, Mapping):
        return "table"
    if isinstance(value, (list, tuple)):
        return "array"
    if value is None:
        return "void"
    raise TypeError(f"not an AMQP field value: {type(value).__name__}")


def erlang_key(value: Any) -> tuple:
    """A key equal for two values exactly when Erlang's `==` holds between their terms.

    At the top level Erlang compares values only (the `{Type, Value}` tag is not part of
    `==`), so 1 == 1.0, a timestamp equals its integer seconds and a byte array equals the
    long string with the same bytes. Inside a table or an array the type tags are part of the
    term, so nested values compare type and value.
    """
    if isinstance(value, bool):
        return ("atom", value)
    if isinstance(value, (int, float)):
        return ("number", value)
    if isinstance(value, str):
        return ("binary", value.encode())
    if isinstance(value, (bytes, bytearray)):
        return ("binary", bytes(value))
    if isinstance(value, decimal.Decimal):
        return ("tuple", _decimal_scale_value(value))
    if isinstance(value, datetime.datetime):
        return ("number", _timestamp_seconds(value))
    if isinstance(value, Mapping):
        return (
            "list",
            tuple(
                (_binary(key), amqp_type_name(item), erlang_key(item))
                for key, item in value.items()
            ),
        )
    if isinstance(value, (list, tuple)):
        return ("list", tuple((amqp_type_name(item), erlang_key(item)) for item in value))
    if value is None:
        return ("atom", "undefined")
    raise TypeError(f"not an AMQP field value: {type(value).__name__}")


def typed_key(value: Any) -> tuple:
    """A hashable key equal only for the same type and value, as RabbitMQ stores `{K, T, V}`."""
    return (amqp_type_name(value), erlang_key(value))


def arguments_key(arguments: Mapping[str, Any] | None) -> tuple:
    """Identity of a binding's arguments: RabbitMQ sorts the table and compares it exactly."""
    if not arguments:
        return ()
    return tuple(sorted((key, typed_key(value)) for key, value in arguments.items()))


def erlang_repr(value: Any) -> str:
    """The value's Erlang term as `~p` prints it (best effort for floats and odd binaries)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _erlang_float(value)
    if isinstance(value, str):
        return _erlang_binary(value.encode())
    if isinstance(value, (bytes, bytearray)):
        return _erlang_binary(bytes(value))
    if isinstance(value, decimal.Decimal):
        scale, unscaled = _decimal_scale_value(value)
        return f"{{{scale},{unscaled}}}"
    if isinstance(value, datetime.datetime):
        return str(_timestamp_seconds(value))
    if isinstance(value, Mapping):
        items = ",".join(
            f"{{{_erlang_binary(_binary(key))},{amqp_type_name(item)},{erlang_repr(item)}}}"
            for key, item in value.items()
        )
        return f"[{items}]"
    if isinstance(value, (list, tuple)):
        items = ",".join(f"{{{amqp_type_name(item)},{erlang_repr(item)}}}" for item in value)
        return f"[{items}]"
    if value is None:
        return "undefined"
    raise TypeError(f"not an AMQP field value: {type(value).__name__}")


def erlang_str(value: Any) -> str:
    """`~s` of a binary is its bytes as text; anything else prints as `~p` would."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("latin-1")
    return erlang_repr(value)


def describe_typed(value: Any) -> str:
    """`rabbit_misc:val({Type, Value})`: how an argument appears in an equivalence error."""
    shown = erlang_str(value) if isinstance(value, (str, bytes, bytearray)) else erlang_repr(value)
    return f"the value '{shown}' of type '{amqp_type_name(value)}'"


ABSENT: Any = object()
"""An argument missing from a table, unlike one present with a void value."""

# rabbit_misc:type_class/1: integer types compare with each other, as do the floats.
_TYPE_CLASSES = {
    "byte": "int",
    "short": "int",
    "signedint": "int",
    "long": "int",
    "decimal": "int",
    "unsignedbyte": "int",
    "unsignedshort": "int",
    "unsignedint": "int",
    "float": "float",
    "double": "float",
}


def type_class(value: Any) -> str:
    type_name = amqp_type_name(value)
    return _TYPE_CLASSES.get(type_name, type_name)


def argument_mismatch(current: Any, received: Any) -> tuple[str, str] | None:
    """rabbit_misc:assert_args_equivalence1 for one argument (either may be ABSENT).

    None when the two are equivalent; else the (received, current) texts RabbitMQ prints: bare
    values when both are present, {Type, Value} pairs ("the value … of type …") beside "none".
    """
    if current is ABSENT and received is ABSENT:
        return None
    if current is not ABSENT and received is not ABSENT:
        if type_class(current) == type_class(received) and erlang_key(current) == erlang_key(
            received
        ):
            return None
        return f"'{erlang_str(received)}'", f"'{erlang_str(current)}'"
    return (
        "none" if received is ABSENT else describe_typed(received),
        "none" if current is ABSENT else describe_typed(current),
    )


def _binary(key: str | bytes) -> bytes:
    return key.encode() if isinstance(key, str) else bytes(key)


def _decimal_scale_value(value: decimal.Decimal) -> tuple[int, int]:
    # AMQP decimals are {Scale, Unscaled}; Decimal('1.00') arrives as exponent -2, digits 100.
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        raise TypeError(f"not an AMQP decimal: {value}")
    unscaled = int("".join(map(str, digits)) or "0")
    return max(-exponent, 0), (-unscaled if sign else unscaled) * 10 ** max(exponent, 0)


def _timestamp_seconds(value: datetime.datetime) -> int:
    if value.tzinfo is None:
        return calendar.timegm(value.utctimetuple())
    return int(value.timestamp())


_ERLANG_ESCAPES = {
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
    ord("\v"): "\\v",
    ord("\b"): "\\b",
    ord("\f"): "\\f",
    0x1B: "\\e",
    ord('"'): '\\"',
    ord("\\"): "\\\\",
}


def _erlang_binary(data: bytes) -> str:
    # io_lib:printable_latin1_list/1 decides between <<"text">> and <<1,2,3>>.
    if all(32 <= byte < 127 or byte >= 160 or byte in _ERLANG_ESCAPES for byte in data):
        text = "".join(_ERLANG_ESCAPES.get(byte, chr(byte)) for byte in data)
        return f'<<"{text}">>'
    return "<<" + ",".join(str(byte) for byte in data) + ">>"


def _erlang_float(value: float) -> str:
    text = repr(value)
    if "e" not in text:
        return text
    mantissa, exponent = text.split("e")
    if "." not in mantissa:
        mantissa += ".0"
    return f"{mantissa}e{int(exponent)}"
