"""The management API's pure parts: list sorting, paging and columns as rabbit_mgmt_util does
them, JSON to AMQP values and back, bindings' properties keys, and RabbitMQ's password hashes."""

from __future__ import annotations

import base64
import datetime
import decimal
import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warrenmq.server.http import listing, values
from warrenmq.server.http.errors import ApiError
from warrenmq.server.metadata import passwords


def test_sort_follows_erlang_term_order_then_the_defaults():
    items = [
        {"name": "b", "n": "text"},
        {"name": "a", "n": 2},
        {"name": "c"},
        {"name": "d", "n": None},
        {"name": "e", "n": {"k": 1}},
        {"name": "f", "n": [1]},
    ]
    ordered = listing.sort_items(items, ["name"], {"sort": "n"})
    # A missing field counts as 0; numbers < atoms < maps < lists < strings.
    assert [item["name"] for item in ordered] == ["c", "a", "d", "e", "f", "b"]
    assert listing.sort_items(items, ["name"], {"sort": ""}) == items
    reverse = listing.sort_items(items, ["name"], {"sort_reverse": "true"})
    assert [item["name"] for item in reverse] == ["f", "e", "d", "c", "b", "a"]


def test_sort_by_a_dotted_field():
    items = [
        {"name": "x", "stats": {"rate": 3}},
        {"name": "y", "stats": {"rate": 1}},
        {"name": "z"},
    ]
    ordered = listing.sort_items(items, ["name"], {"sort": "stats.rate"})
    assert [item["name"] for item in ordered] == ["z", "y", "x"]


@given(st.integers(0, 40), st.integers(1, 500), st.integers(1, 10))
def test_pages_cover_the_filtered_list_once(count, size, page):
    items = [{"name": f"n{i:03}"} for i in range(count)]
    query = {"page": str(page), "page_size": str(size)}
    start = (page - 1) * size
    if start > count:
        with pytest.raises(ApiError) as excinfo:
            listing.listing(items, ["name"], query, pageable=True)
        assert excinfo.value.error == "page_out_of_range"
        return
    reply = listing.listing(items, ["name"], query, pageable=True)
    assert reply["items"] == items[start : start + size]
    assert reply["page_count"] == (count + size - 1) // size
    assert reply["total_count"] == reply["filtered_count"] == count


def test_columns_keep_nested_fields():
    item = {"name": "q", "message_stats": {"publish": 1, "publish_details": {"rate": 2.0}}, "x": 1}
    kept = listing.keep_columns([item], listing.columns({"columns": "name,message_stats.publish"}))
    assert kept == [{"name": "q", "message_stats": {"publish": 1}}]


def test_a_bad_name_regex_is_a_400():
    with pytest.raises(ApiError) as excinfo:
        listing.listing(
            [{"name": "a"}],
            ["name"],
            {"page": "1", "name": "(", "use_regex": "true"},
            pageable=True,
        )
    assert excinfo.value.status == 400


QUERIES = st.fixed_dictionaries(
    {"page": st.sampled_from(["1", "2", "3"]), "page_size": st.sampled_from(["1", "4", "100"])},
    optional={
        "sort": st.sampled_from(["", "name", "vhost", "depth", "stats.rate"]),
        "sort_reverse": st.sampled_from(["true", "false"]),
        "name": st.sampled_from(["", "q1", "Q", "^b"]),
        "use_regex": st.sampled_from(["true", "false"]),
        "columns": st.sampled_from(["name", "name,depth"]),
    },
)


@given(st.lists(st.tuples(st.sampled_from(["/", "b"]), st.text("qQ1b", max_size=3))), QUERIES)
def test_a_list_built_per_page_replies_as_the_whole_list_does(names, query):
    entries = [(vhost, name, depth) for depth, (vhost, name) in enumerate(names)]
    built = []

    def build(entry):
        built.append(entry)
        vhost, name, depth = entry
        return {"vhost": vhost, "name": name, "depth": depth % 3, "stats": {"rate": -depth}}

    def whole():
        return listing.listing([build(e) for e in entries], ["vhost", "name"], query, pageable=True)

    try:
        expected = whole()
    except ApiError as error:
        expected = error.error
    built.clear()
    try:
        reply = listing.listing_built_per_page(
            entries, lambda e: {"vhost": e[0], "name": e[1]}, build, ["vhost", "name"], query
        )
    except ApiError as error:
        reply = error.error
    assert reply == expected
    if query.get("sort") in (None, "", "name", "vhost") and isinstance(reply, dict):
        assert len(built) == reply["item_count"], "items off the page were built"


def test_amqp_values_as_json():
    when = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    shown = values.to_json(
        {"s": "x", "b": b"\xff", "d": decimal.Decimal("1.5"), "t": when, "l": [b"ok", None], "n": 1}
    )
    assert shown == {
        "s": "x",
        "b": "Not UTF-8, base64 is: /w==",
        "d": 1.5,
        "t": 1704067200,
        "l": ["ok", None],
        "n": 1,
    }


def test_json_to_amqp_refuses_null_and_deep_nesting():
    assert values.to_amqp_table({"a": [1, {"b": True}], "c": 1.5}) == {
        "a": [1, {"b": True}],
        "c": 1.5,
    }
    with pytest.raises(ApiError, match="null_not_allowed"):
        values.to_amqp_table({"a": None})
    deep: dict = {}
    for _ in range(values.DEPTH_MAX + 2):
        deep = {"d": deep}
    with pytest.raises(ApiError, match="nested deeper"):
        values.to_amqp_table(deep)


@given(
    st.text(max_size=30),
    st.dictionaries(
        st.text(min_size=1, max_size=5), st.integers() | st.text(max_size=5), max_size=3
    ),
)
def test_properties_keys_split_back_into_key_and_arguments_hash(routing_key, arguments):
    key = values.properties_key(routing_key, arguments)
    parsed_key, hashed = values.split_properties_key(key)
    assert parsed_key == routing_key
    assert hashed == (values.arguments_hash(arguments) if arguments else None)


def test_properties_keys_are_rabbitmqs_for_plain_keys():
    assert values.properties_key("a.#", {}) == "a.%23"
    assert values.properties_key("a b~c", {}) == "a+b%7Ec"
    assert values.properties_key("", {}) == "~"


def test_message_properties_from_json_refuse_wrong_types():
    properties = values.properties_from_json(
        {"delivery_mode": 2, "headers": {"k": "v"}, "type": "t", "timestamp": 1, "unknown": 1}
    )
    assert (properties.delivery_mode, properties.message_type, properties.headers) == (
        2,
        "t",
        {"k": "v"},
    )
    for bad in (
        {"delivery_mode": "2"},
        {"priority": 300},
        {"content_type": 1},
        {"timestamp": 10**20},
    ):
        with pytest.raises(ApiError):
            values.properties_from_json(bad)


@pytest.mark.parametrize(
    "algorithm, digest",
    [
        ("rabbit_password_hashing_sha256", hashlib.sha256),
        ("rabbit_password_hashing_sha512", hashlib.sha512),
        ("rabbit_password_hashing_md5", hashlib.md5),
    ],
)
def test_rabbitmq_password_hashes_verify(algorithm, digest):
    salt = b"\x01\x02\x03\x04"
    encoded = base64.b64encode(salt + digest(salt + b"s3cret").digest()).decode()
    stored = passwords.imported(algorithm, encoded)
    assert stored is not None and passwords.is_password_hash(stored)
    assert passwords.verify_password("s3cret", stored)
    assert not passwords.verify_password("s3cret!", stored)
    assert passwords.exported(stored) == (algorithm, encoded)


def test_unknown_or_malformed_imported_hashes_are_refused():
    assert passwords.imported("rabbit_password_hashing_sha256", "not base64!") is None
    assert (
        passwords.imported("rabbit_password_hashing_sha256", base64.b64encode(b"short").decode())
        is None
    )
    assert passwords.imported("bcrypt", "x") is None
    ours = passwords.hash_password("pw", log2_n=2)
    assert passwords.imported("warren_scrypt", ours) == ours
    assert passwords.exported(ours) == ("warren_scrypt", ours)
