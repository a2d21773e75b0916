"""Policies in the metadata state machine: set, replace, clear, list, a vhost's deletion, the
validation texts RabbitMQ gives (checked against rabbitmqctl set_policy on 3.10.8 where 3.10
and 4.2 agree, read in 4.2.9's sources where they differ), snapshots, and the store: persistence
across a reopen and changes another process made."""

from __future__ import annotations

import asyncio

import pytest

from warrenmq.server.metadata import commands as c
from warrenmq.server.metadata.errors import BadRequest, NotFound, PreconditionFailed
from warrenmq.server.metadata.policies import erlang_term
from warrenmq.server.metadata.records import Policy
from warrenmq.server.metadata.state import Limits, MetadataState
from warrenmq.server.metadata.store import MetadataStore


def fresh(limits: Limits | None = None) -> MetadataState:
    state = MetadataState(limits)
    state.apply(c.DeclareVhost("/"))
    state.apply(c.DeclareVhost("v1"))
    return state


def refusal(**fields) -> str:
    """The text of the BadRequest a SetPolicy with these fields (over good ones) gets."""
    command = {"pattern": ".*", "definition": {"max-length": 1}, **fields}
    with pytest.raises(BadRequest) as refused:
        fresh().apply(c.SetPolicy("/", "p", **command))
    assert refused.value.reply_code == 400
    return refused.value.reply_text


def test_set_replace_clear_and_list():
    state = fresh()
    outcome = state.apply(
        c.SetPolicy("/", "ttl", "^q\\.", {"message-ttl": 5000, "max-length": 10}, 3, "queues")
    )
    assert outcome.changed and outcome.created
    policy = Policy("/", "ttl", "^q\\.", "queues", 3, {"max-length": 10, "message-ttl": 5000})
    assert outcome.writes == (("put_policy", policy),)
    assert state.policies("/") == {"ttl": policy}
    # Stored with its keys sorted, as RabbitMQ's map holds them.
    assert list(state.policies("/")["ttl"].definition) == ["max-length", "message-ttl"]
    assert state.policies("v1") == {}

    # The same again changes nothing and writes nothing; a new definition replaces the old.
    assert state.apply(
        c.SetPolicy("/", "ttl", "^q\\.", {"max-length": 10, "message-ttl": 5000}, 3, "queues")
    ) == type(outcome)(False)
    replaced = state.apply(c.SetPolicy("/", "ttl", ".*", {"expires": 1}))
    assert replaced.changed and not replaced.created
    assert state.policies("/")["ttl"] == Policy("/", "ttl", ".*", "all", 0, {"expires": 1})

    cleared = state.apply(c.ClearPolicy("/", "ttl"))
    assert cleared.writes == (("delete_policy", "/", "ttl"),)
    assert state.policies("/") == {}


def test_every_change_replaces_the_vhosts_mapping_and_no_change_keeps_it():
    """What lets the broker tell, by identity, that a vhost's policies changed."""
    state = fresh()
    before = state.policies("/")
    state.apply(c.SetPolicy("/", "p", ".*", {"max-length": 1}))
    after_set = state.policies("/")
    assert after_set is not before and before == {}
    state.apply(c.SetPolicy("/", "p", ".*", {"max-length": 1}))
    assert state.policies("/") is after_set
    state.apply(c.ClearPolicy("/", "p"))
    assert state.policies("/") is not after_set


def test_missing_vhost_and_missing_policy():
    state = fresh()
    with pytest.raises(NotFound, match="no vhost 'nope'"):
        state.apply(c.SetPolicy("nope", "p", ".*", {"max-length": 1}))
    with pytest.raises(NotFound, match="no vhost 'nope'"):
        state.policies("nope")
    with pytest.raises(NotFound) as missing:
        state.apply(c.ClearPolicy("/", "p"))
    assert missing.value.reply_text == "Parameter does not exist"


def test_names_any_text_up_to_a_shortstr():
    state = fresh()
    # RabbitMQ accepts an empty policy name (rabbitmqctl set_policy "" ... on 3.10.8).
    state.apply(c.SetPolicy("/", "", ".*", {"max-length": 1}))
    state.apply(c.SetPolicy("/", "é" * 127, ".*", {"max-length": 1}))
    with pytest.raises(PreconditionFailed, match="policy name longer than 255 bytes"):
        state.apply(c.SetPolicy("/", "é" * 128, ".*", {"max-length": 1}))


def test_deleting_a_vhost_deletes_its_policies():
    state = fresh()
    state.apply(c.SetPolicy("v1", "p", ".*", {"max-length": 1}))
    state.apply(c.SetPolicy("/", "p", ".*", {"max-length": 1}))
    state.apply(c.DeleteVhost("v1"))
    state.apply(c.DeclareVhost("v1"))
    assert state.policies("v1") == {}
    assert list(state.policies("/")) == ["p"]


def test_limit_counts_every_vhost_and_frees_on_clear_and_vhost_deletion():
    state = fresh(Limits(policies_max=2))
    state.apply(c.SetPolicy("/", "a", ".*", {"max-length": 1}))
    state.apply(c.SetPolicy("v1", "b", ".*", {"max-length": 1}))
    # Replacing one is no new policy.
    state.apply(c.SetPolicy("v1", "b", ".*", {"max-length": 2}))
    with pytest.raises(BadRequest) as refused:
        state.apply(c.SetPolicy("/", "c", ".*", {"max-length": 1}))
    assert refused.value.reply_text == "Validation failed\n\ncomponent policy is limited to 2\n"
    state.apply(c.DeleteVhost("v1"))
    state.apply(c.SetPolicy("/", "c", ".*", {"max-length": 1}))
    state.apply(c.ClearPolicy("/", "a"))
    state.apply(c.SetPolicy("/", "d", ".*", {"max-length": 1}))


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("definition", "line"),
    [
        # Seen from rabbitmqctl set_policy against 3.10.8:
        ({"max-length": "abc"}, '<<"abc">> is not a valid maximum length'),
        ({"max-length": -1}, "-1 is not a valid maximum length"),
        ({"max-length": 1.5}, "1.5 is not a valid maximum length"),
        ({"max-length": None}, "null is not a valid maximum length"),
        ({"message-ttl": True}, "true is not a valid message TTL"),
        ({"expires": 0}, "0 is not a valid queue expiry"),
        ({"overflow": "x"}, '<<"x">> is not a valid overflow value'),
        ({"dead-letter-exchange": 5}, "5 is not a valid dead letter exchange name"),
        ({}, "no policy provided"),
        ({"foo": 1}, '[{<<"foo">>,1}] are not recognised policy settings'),
        (
            {"max-length": 1, "foo": 2, "bar": [1]},
            '[{<<"bar">>,[1]},{<<"foo">>,2}] are not recognised policy settings',
        ),
        # 4.2's own (3.10 differs or lacks the key):
        ({"max-length": "é"}, '<<"é"/utf8>> is not a valid maximum length'),
        ({"consumer-timeout": -1}, "-1 is not a valid consumer timeout"),
        ({"max-length-bytes": 1.0}, "1.0 is not a valid maximum length in bytes"),
        ({"dead-letter-routing-key": []}, "[] is not a valid dead letter routing key"),
        ({"dead-letter-strategy": "x"}, '<<"x">> is not a valid dead letter strategy'),
        ({"delivery-limit": "5"}, '<<"5">> is not a valid delivery limit'),
        ({"queue-version": True}, "true is not a valid queue-version value"),
        ({"queue-mode": "eager"}, '<<"eager">> is not a valid queue-mode value'),
        ({"max-age": "0D"}, '<<"0D">> is not a valid max age'),
        ({"max-age": 5}, "5 is not a valid max age"),
        ({"stream-filter-size-bytes": 15}, "15 is not a valid filter size. Valid range is 16-255"),
        ({"target-group-size": 0}, "0 is not a valid qq target count value"),
        ({"queue-leader-locator": "x"}, '<<"x">> is not a valid queue leader locator value'),
        # 4.3's delayed retries (rabbit_quorum_queue's validate_policy/1):
        (
            {"delayed-retry-type": "some"},
            '<<"some">> is not a valid delayed retry type. Must be one of: all, failed, '
            "returned, disabled",
        ),
        (
            {"delayed-retry-min": 0, "delayed-retry-type": "all"},
            "0 is not a valid delayed retry minimum delay. Must be a positive integer",
        ),
        (
            {"delayed-retry-max": "9"},
            '<<"9">> is not a valid delayed retry maximum delay. Must be a positive integer',
        ),
        (
            {"delayed-retry-type": "failed"},
            "delayed-retry-min is required when delayed-retry-type is failed",
        ),
        (
            {"delayed-retry-type": "all", "delayed-retry-min": 10, "delayed-retry-max": 5},
            "delayed-retry-max (5) must not be smaller than delayed-retry-min (10)",
        ),
        (
            {"alternate-exchange": {"a": 1}},
            '#{<<"a">> => 1} is not a valid alternate exchange name',
        ),
        # A key's value is checked before unknown keys are reported; keys in sorted order.
        ({"zzz": 1, "message-ttl": -1, "max-length": -2}, "-2 is not a valid maximum length"),
        ([], "no policy provided"),
        ([1], "definition must be a dictionary: [1]"),
        ("x", 'parse error while reading policy definition: <<"x">>. Validator: policy_validator.'),
    ],
)
def test_definition_refusals(definition, line):
    assert refusal(definition=definition) == f"Validation failed\n\n{line}\n"


@pytest.mark.parametrize(
    "definition",
    [
        {"max-length": 0, "max-length-bytes": 0, "message-ttl": 0, "expires": 1},
        {"delivery-limit": -1, "consumer-timeout": 0, "overflow": "reject-publish-dlx"},
        {"dead-letter-exchange": "", "dead-letter-routing-key": "k"},
        {"dead-letter-strategy": "at-least-once", "queue-version": 2, "queue-mode": "lazy"},
        {"max-age": "7D", "stream-max-segment-size-bytes": 3_000_000_000},
        {"stream-filter-size-bytes": 255, "initial-cluster-size": 3, "target-group-size": 1},
        {"queue-leader-locator": "balanced", "queue-master-locator": "min-masters"},
        {"alternate-exchange": "ae", "max-in-memory-length": 0, "max-in-memory-bytes": 0},
        {"delayed-retry-type": "returned", "delayed-retry-min": 5, "delayed-retry-max": 5},
        {"delayed-retry-type": "disabled"},
    ],
)
def test_every_known_key_with_a_good_value_is_accepted(definition):
    state = fresh()
    state.apply(c.SetPolicy("/", "p", ".*", definition))
    assert state.policies("/")["p"].definition == definition


def test_pattern_apply_to_and_priority_refusals_in_rabbitmqs_order():
    # rabbitmqctl set_policy p1 '(' '{"max-length":"a"}' --apply-to bogus on 3.10.8 listed the
    # definition's error, then apply-to's, then the pattern's; 4.2 names the queue types too.
    assert refusal(pattern="(", definition={"max-length": "a"}, apply_to="bogus", priority="x") == (
        "Validation failed\n\n"
        '<<"a">> is not a valid maximum length\n'
        "apply-to 'bogus' unrecognised; should be one of: 'queues', 'classic_queues',  "
        "'quorum_queues', 'streams', 'exchanges', or 'all'\n"
        'pattern should be regular expression but is invalid: {"missing ), unterminated '
        'subpattern",0}\n'
        'priority should be a number, actually was <<"x">>\n'
    )
    assert refusal(pattern=5) == "Validation failed\n\npattern should be a binary but was 5\n"
    assert (
        refusal(pattern="a" * 1025) == "Validation failed\n\npattern must not exceed 1024 bytes\n"
    )
    assert refusal(priority=True).endswith("priority should be a number, actually was true\n")
    assert refusal(priority=float("nan")).endswith("actually was nan\n")
    # PCRE-only syntax is refused rather than run as something else.
    assert refusal(pattern="\\Qa.b\\E") == (
        'Validation failed\n\npattern should be regular expression but is invalid: {"bad escape '
        '\\\\Q",0}\n'
    )


@pytest.mark.parametrize(
    "apply_to", ["all", "queues", "exchanges", "classic_queues", "quorum_queues", "streams"]
)
def test_apply_to_accepts_what_4_2_accepts(apply_to):
    state = fresh()
    state.apply(c.SetPolicy("/", "p", "a" * 1024, {"max-length": 1}, 1.5, apply_to))
    assert state.policies("/")["p"].apply_to == apply_to


def test_a_refused_policy_changes_nothing():
    state = fresh()
    state.apply(c.SetPolicy("/", "p", ".*", {"max-length": 1}))
    before = state.snapshot()
    with pytest.raises(BadRequest):
        state.apply(c.SetPolicy("/", "p", ".*", {"max-length": -1}))
    with pytest.raises(BadRequest):
        # A lone surrogate has no UTF-8 form: it could never be stored.
        state.apply(c.SetPolicy("/", "q", ".*", {"dead-letter-exchange": "\ud800"}))
    assert state.snapshot() == before


@pytest.mark.parametrize(
    ("value", "printed"),
    [
        ('a"b\\c\n', '<<"a\\"b\\\\c\\n">>'),
        ("\x01", "<<1>>"),
        ([104, 105], '"hi"'),
        ([1, 2], "[1,2]"),
        ({"b": [], "a": None}, '#{<<"a">> => null,<<"b">> => []}'),
        (1e20, "1.0e20"),
        (1e-05, "1.0e-5"),
        (-0.5, "-0.5"),
        (False, "false"),
    ],
)
def test_values_print_as_erlang_prints_them(value, printed):
    assert erlang_term(value) == printed


# --- snapshots and the store ------------------------------------------------------------------


def test_snapshot_round_trip_keeps_policies():
    state = fresh()
    state.apply(c.SetPolicy("v1", "b", "^x", {"message-ttl": 1, "dead-letter-exchange": "é"}, 2.5))
    state.apply(c.SetPolicy("/", "a", ".*", {"max-length": 1}, -1, "quorum_queues"))
    snapshot = state.snapshot()
    copy = MetadataState.from_snapshot(snapshot)
    assert copy.snapshot() == snapshot
    assert copy.policies("v1") == state.policies("v1")
    assert copy.policies("/") == state.policies("/")


def test_policies_survive_a_reopen_and_leave_with_their_vhost(tmp_path):
    path = tmp_path / "m.sqlite3"

    async def scenario():
        store = await MetadataStore.open(path)
        await store.apply(c.DeclareVhost("v1"))
        await store.apply(c.SetPolicy("/", "a", "^q", {"max-length": 2, "overflow": "drop-head"}))
        await store.apply(c.SetPolicy("/", "b", ".*", {"message-ttl": 5}, 1.5, "classic_queues"))
        await store.apply(c.SetPolicy("v1", "c", ".*", {"expires": 10}, 7))
        await store.apply(c.ClearPolicy("/", "b"))
        await store.close()

        store = await MetadataStore.open(path)
        assert store.state.policies("/") == {
            "a": Policy("/", "a", "^q", "all", 0, {"max-length": 2, "overflow": "drop-head"})
        }
        assert store.state.policies("v1")["c"] == Policy("v1", "c", ".*", "all", 7, {"expires": 10})
        await store.apply(c.SetPolicy("/", "b", ".*", {"message-ttl": 5}, 1.5, "classic_queues"))
        await store.apply(c.DeleteVhost("v1"))
        await store.close()

        store = await MetadataStore.open(path)
        assert store.state.policies("/")["b"].priority == 1.5
        assert "v1" not in store.state.vhosts
        await store.apply(c.DeclareVhost("v1"))
        assert store.state.policies("v1") == {}
        await store.close()

    asyncio.run(scenario())


def test_policy_changes_from_another_process_are_synced(tmp_path):
    path = tmp_path / "m.sqlite3"

    async def scenario():
        broker = await MetadataStore.open(path)
        await broker.apply(c.DeclareVhost("v1"))
        await broker.apply(c.SetPolicy("/", "kept", ".*", {"max-length": 1}))
        await broker.apply(c.SetPolicy("/", "changed", ".*", {"max-length": 1}))
        await broker.apply(c.SetPolicy("/", "cleared", ".*", {"max-length": 1}))
        await broker.apply(c.SetPolicy("v1", "gone-with-v1", ".*", {"max-length": 1}))
        kept = broker.state.policies("/")["kept"]

        cli = await MetadataStore.open(path)  # what `warren policies ...` does
        await cli.apply(c.SetPolicy("/", "changed", "^x", {"max-length": 2}, 4, "queues"))
        await cli.apply(c.ClearPolicy("/", "cleared"))
        await cli.apply(c.SetPolicy("/", "new", ".*", {"expires": 9}))
        await cli.apply(c.DeclareVhost("v2"))
        await cli.apply(c.SetPolicy("v2", "in-a-new-vhost", ".*", {"message-ttl": 3}))
        await cli.apply(c.DeleteVhost("v1"))
        await cli.close()

        await broker.sync_external_changes()
        policies = broker.state.policies("/")
        assert sorted(policies) == ["changed", "kept", "new"]
        assert policies["kept"] is kept  # untouched, not re-made
        assert policies["changed"] == Policy("/", "changed", "^x", "queues", 4, {"max-length": 2})
        assert broker.state.policies("v2") == {
            "in-a-new-vhost": Policy("v2", "in-a-new-vhost", ".*", "all", 0, {"message-ttl": 3})
        }
        assert "v1" not in broker.state.vhosts
        assert await broker.sync_external_changes() == []
        await broker.close()

    asyncio.run(scenario())
