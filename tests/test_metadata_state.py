"""The metadata state machine: every command, its errors (codes and RabbitMQ texts), durability
of the rows it asks for, and snapshots, including a model-free property over random commands."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warrenmq.exchanges.errors import RoutingError
from warrenmq.server.metadata import commands as c
from warrenmq.server.metadata import passwords
from warrenmq.server.metadata.errors import (
    AccessRefused,
    NotAllowed,
    NotFound,
    PreconditionFailed,
    ResourceLocked,
)
from warrenmq.server.metadata.state import Limits, MetadataState

# A cheap hash keeps the tests fast; the state only checks that it is well formed.
HASH = passwords.hash_password("secret", log2_n=2, salt=b"saltsalt")


def fresh() -> MetadataState:
    state = MetadataState()
    state.apply(c.DeclareVhost("/"))
    state.apply(c.AddUser("guest", HASH, ("administrator",)))
    state.apply(c.SetPermissions("guest", "/", ".*", ".*", ".*"))
    return state


def kinds(outcome) -> list[str]:
    return [write[0] for write in outcome.writes]


# --- vhosts ---------------------------------------------------------------------------------


def test_declare_vhost_creates_router_with_predeclared_exchanges():
    state = fresh()
    outcome = state.apply(c.DeclareVhost("v1", "test", ("a", "a", "b")))
    assert outcome.created and kinds(outcome) == ["put_vhost"]
    assert state.vhosts["v1"].tags == ("a", "b")
    names = {e.name for e in state.exchanges("v1")}
    assert {"", "amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"} <= names
    assert state.queues("v1") == {}


def test_declare_vhost_twice_and_empty_name_refused():
    state = fresh()
    with pytest.raises(PreconditionFailed, match="vhost '/' already exists"):
        state.apply(c.DeclareVhost("/"))
    with pytest.raises(PreconditionFailed):
        state.apply(c.DeclareVhost(""))


def test_delete_vhost_cascades_and_reports_queues():
    state = fresh()
    state.apply(c.DeclareVhost("v1"))
    state.apply(c.SetPermissions("guest", "v1", ".*", ".*", ".*"))
    state.apply(c.DeclareExchange("v1", "e", "fanout", durable=True))
    state.apply(c.DeclareQueue("v1", "q2", durable=True))
    state.apply(c.DeclareQueue("v1", "q1"))
    outcome = state.apply(c.DeleteVhost("v1"))
    assert outcome.deleted_queues == ("q1", "q2")
    assert outcome.deleted_exchanges == ("e",)
    assert outcome.writes == (("delete_vhost", "v1"),)
    assert "v1" not in state.vhosts and ("guest", "v1") not in state.permissions
    with pytest.raises(NotFound, match="no vhost 'v1'"):
        state.router("v1")


def test_delete_missing_and_default_vhost_refused():
    state = fresh()
    with pytest.raises(NotFound):
        state.apply(c.DeleteVhost("nope"))
    with pytest.raises(PreconditionFailed, match="default vhost"):
        state.apply(c.DeleteVhost("/"))


def test_vhost_limit():
    state = MetadataState(Limits(vhosts_max=1))
    state.apply(c.DeclareVhost("/"))
    with pytest.raises(PreconditionFailed, match="limit"):
        state.apply(c.DeclareVhost("v2"))


# --- users ----------------------------------------------------------------------------------


def test_add_user_twice_refused_and_bad_hash_refused():
    state = fresh()
    with pytest.raises(PreconditionFailed, match="user 'guest' already exists"):
        state.apply(c.AddUser("guest", HASH))
    with pytest.raises(PreconditionFailed, match="password hash"):
        state.apply(c.AddUser("bob", "plaintext"))
    with pytest.raises(PreconditionFailed):
        state.apply(c.AddUser("", HASH))
    assert "bob" not in state.users


def test_delete_user_removes_permissions():
    state = fresh()
    outcome = state.apply(c.DeleteUser("guest"))
    assert outcome.writes == (("delete_user", "guest"),)
    assert state.users == {} and state.permissions == {}
    with pytest.raises(NotFound, match="no user 'guest'"):
        state.apply(c.DeleteUser("guest"))


def test_change_password_and_tags_keep_the_rest():
    state = fresh()
    other = passwords.hash_password("other", log2_n=2)
    state.apply(c.ChangePassword("guest", other))
    state.apply(c.SetUserTags("guest", ("monitoring",)))
    user = state.users["guest"]
    assert user.password_hash == other and user.tags == ("monitoring",)
    with pytest.raises(NotFound):
        state.apply(c.ChangePassword("nobody", other))
    with pytest.raises(NotFound):
        state.apply(c.SetUserTags("nobody", ()))


# --- permissions ----------------------------------------------------------------------------


def test_set_permissions_validates_user_vhost_and_regexes():
    state = fresh()
    with pytest.raises(NotFound, match="no user 'bob'"):
        state.apply(c.SetPermissions("bob", "/", ".*", ".*", ".*"))
    with pytest.raises(NotFound, match="no vhost 'v9'"):
        state.apply(c.SetPermissions("guest", "v9", ".*", ".*", ".*"))
    with pytest.raises(PreconditionFailed, match="invalid regular expression"):
        state.apply(c.SetPermissions("guest", "/", "(", ".*", ".*"))
    assert state.permission("guest", "/").configure == ".*"
    same = state.apply(c.SetPermissions("guest", "/", ".*", ".*", ".*"))
    assert not same.changed and same.writes == ()


def test_clear_permissions():
    state = fresh()
    assert state.apply(c.ClearPermissions("guest", "/")).writes == (
        ("delete_permission", "guest", "/"),
    )
    assert not state.apply(c.ClearPermissions("guest", "/")).changed


def test_vhost_access_needs_vhost_and_permission_entry():
    state = fresh()
    state.check_vhost_access("guest", "/")
    with pytest.raises(NotAllowed) as error:
        state.check_vhost_access("guest", "nope")
    assert error.value.reply_code == 530 and error.value.connection_level
    # Texts of RabbitMQ 3.10.8, observed: a missing vhost and a refused one differ.
    assert error.value.reply_text == "vhost nope not found"
    state.apply(c.DeclareVhost("v1"))
    with pytest.raises(NotAllowed) as error:
        state.check_vhost_access("guest", "v1")
    assert error.value.reply_text == "access to vhost 'v1' refused for user 'guest'"
    # An entry that grants nothing still opens the vhost, as RabbitMQ.
    state.apply(c.SetPermissions("guest", "v1", "", "", ""))
    state.check_vhost_access("guest", "v1")


def test_resource_access_texts():
    state = fresh()
    state.apply(c.AddUser("bob", HASH))
    state.apply(c.SetPermissions("bob", "/", "^bob-", "^amq\\.default$", ""))
    state.check_resource_access("bob", "/", "configure", "queue", "bob-1")
    state.check_resource_access("bob", "/", "write", "exchange", "")
    with pytest.raises(AccessRefused) as error:
        state.check_resource_access("bob", "/", "configure", "queue", "q")
    assert error.value.reply_code == 403
    assert error.value.reply_text == ("access to queue 'q' in vhost '/' refused for user 'bob'")
    with pytest.raises(AccessRefused, match="^access to exchange 'amq.default'"):
        state.check_resource_access("bob", "/", "read", "exchange", "")
    # No entry at all for the vhost: nothing is allowed.
    assert not state.can_access("bob", "v1", "read", "queue", "bob-1")


# --- exchanges ------------------------------------------------------------------------------


def test_declare_exchange_durable_writes_transient_does_not():
    state = fresh()
    durable = state.apply(c.DeclareExchange("/", "d", "topic", durable=True))
    transient = state.apply(c.DeclareExchange("/", "t", "direct"))
    assert kinds(durable) == ["put_exchange"] and durable.created
    assert transient.writes == () and transient.created
    again = state.apply(c.DeclareExchange("/", "d", "topic", durable=True))
    assert not again.changed and not again.created and again.exchange.name == "d"


def test_declare_exchange_errors_come_from_the_router():
    state = fresh()
    state.apply(c.DeclareExchange("/", "d", "topic", durable=True))
    with pytest.raises(PreconditionFailed, match="inequivalent arg 'durable'"):
        state.apply(c.DeclareExchange("/", "d", "topic", durable=False))
    with pytest.raises(AccessRefused, match="reserved prefix"):
        state.apply(c.DeclareExchange("/", "amq.mine", "topic"))
    with pytest.raises(RoutingError) as error:
        state.apply(c.DeclareExchange("/", "x", "nonsense"))
    assert error.value.reply_code == 503


def test_delete_exchange_cascades_auto_delete_and_writes_only_durable():
    state = fresh()
    state.apply(c.DeclareExchange("/", "src", "fanout", durable=True))
    state.apply(c.DeclareExchange("/", "auto", "fanout", durable=True, auto_delete=True))
    state.apply(c.Bind("/", "auto", "src", "exchange"))
    state.apply(c.DeclareExchange("/", "tauto", "fanout", auto_delete=True))
    state.apply(c.Bind("/", "tauto", "src", "exchange"))
    outcome = state.apply(c.DeleteExchange("/", "src"))
    assert outcome.deleted_exchanges[0] == "src"
    assert set(outcome.deleted_exchanges) == {"src", "auto", "tauto"}
    assert sorted(write[2] for write in outcome.writes) == ["auto", "src"]
    assert not state.apply(c.DeleteExchange("/", "src")).changed


def test_delete_exchange_if_unused():
    state = fresh()
    state.apply(c.DeclareExchange("/", "e", "direct"))
    state.apply(c.DeclareQueue("/", "q"))
    state.apply(c.Bind("/", "e", "q"))
    with pytest.raises(PreconditionFailed, match="in use"):
        state.apply(c.DeleteExchange("/", "e", if_unused=True))


def test_exchange_limit_counts_cascaded_deletes():
    state = MetadataState(Limits(exchanges_per_vhost_max=2))
    state.apply(c.DeclareVhost("/"))
    state.apply(c.DeclareExchange("/", "a", "fanout", auto_delete=True))
    state.apply(c.DeclareExchange("/", "b", "fanout"))
    with pytest.raises(PreconditionFailed, match="exchange limit"):
        state.apply(c.DeclareExchange("/", "c", "fanout"))
    state.apply(c.DeclareQueue("/", "q"))
    state.apply(c.Bind("/", "a", "q"))
    state.apply(c.DeleteQueue("/", "q"))  # auto-deletes "a"
    state.apply(c.DeclareExchange("/", "c", "fanout"))


# --- queues ---------------------------------------------------------------------------------


def test_declare_queue_persisted_only_when_durable_and_not_exclusive():
    state = fresh()
    assert kinds(state.apply(c.DeclareQueue("/", "d", durable=True))) == ["put_queue"]
    assert state.apply(c.DeclareQueue("/", "t")).writes == ()
    exclusive = state.apply(c.DeclareQueue("/", "x", durable=True, exclusive=True, owner="c1"))
    assert exclusive.writes == () and exclusive.queue.exclusive


def test_declare_queue_refuses_a_name_no_reply_could_carry_before_any_write():
    # queue.declare-ok carries the name as a shortstr (255 bytes); a longer name is refused
    # here, before its row is written, so no durable queue exists that a reply cannot name.
    state = fresh()
    longest = "é" * 127 + "a"
    assert kinds(state.apply(c.DeclareQueue("/", longest, durable=True))) == ["put_queue"]
    with pytest.raises(PreconditionFailed, match="queue name longer than 255 bytes"):
        state.apply(c.DeclareQueue("/", "é" * 128, durable=True))
    assert set(state.queues("/")) == {longest}


def test_declare_queue_reserved_prefix_and_server_named():
    state = fresh()
    with pytest.raises(AccessRefused) as error:
        state.apply(c.DeclareQueue("/", "amq.q"))
    assert error.value.reply_text == "queue name 'amq.q' contains reserved prefix 'amq.*'"
    state.apply(c.DeclareQueue("/", "amq.gen-abc", exclusive=True, owner="c1", server_named=True))
    with pytest.raises(ValueError):
        state.apply(c.DeclareQueue("/", ""))
    with pytest.raises(ValueError):
        state.apply(c.DeclareQueue("/", "x", exclusive=True))


def test_queue_names_lose_cr_lf_as_rabbitmq_strips_them():
    state = fresh()
    state.apply(c.DeclareQueue("/", "a\r\nb"))
    assert "ab" in state.queues("/")


@pytest.mark.parametrize(
    ("declared", "redeclared", "text"),
    [
        (
            {"durable": True},
            {"durable": False},
            "inequivalent arg 'durable' for queue 'q' in vhost '/': "
            "received 'false' but current is 'true'",
        ),
        (
            {"auto_delete": False},
            {"auto_delete": True},
            "inequivalent arg 'auto_delete' for queue 'q' in vhost '/': "
            "received 'true' but current is 'false'",
        ),
        (
            {"arguments": {"x-max-length": 10}},
            {"arguments": {"x-max-length": 20}},
            "inequivalent arg 'x-max-length' for queue 'q' in vhost '/': "
            "received '20' but current is '10'",
        ),
        (
            {"arguments": {}},
            {"arguments": {"x-message-ttl": 5}},
            "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': "
            "received the value '5' of type 'signedint' but current is none",
        ),
        (
            {"arguments": {"x-queue-type": "quorum"}},
            {"arguments": {}},
            "inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': "
            "received none but current is the value 'quorum' of type 'longstr'",
        ),
        (
            {"arguments": {"x-max-length": 10}},
            {"arguments": {"x-max-length": 10.0}},
            "inequivalent arg 'x-max-length' for queue 'q' in vhost '/': "
            "received '10.0' but current is '10'",
        ),
        (
            {"arguments": {"x-dead-letter-exchange": "a"}},
            {"arguments": {"x-dead-letter-exchange": "b"}},
            "inequivalent arg 'x-dead-letter-exchange' for queue 'q' in vhost '/': "
            "received 'b' but current is 'a'",
        ),
    ],
)
def test_queue_redeclare_inequivalent(declared, redeclared, text):
    state = fresh()
    state.apply(c.DeclareQueue("/", "q", **declared))
    with pytest.raises(PreconditionFailed) as error:
        state.apply(c.DeclareQueue("/", "q", **redeclared))
    assert error.value.reply_code == 406
    assert error.value.reply_text == text


@pytest.mark.parametrize(
    ("declared", "redeclared"),
    [
        ({}, {"x-queue-type": "classic"}),
        ({"x-queue-type": "classic"}, {}),
        ({"x-max-length": 10}, {"x-max-length": 10}),
        # Same type class: RabbitMQ compares ints of any width as equal.
        ({"x-max-length": 10}, {"x-max-length": 2**40 // 2**40 * 10}),
        # Only the declarable arguments take part in equivalence.
        ({"x-custom": 1}, {"x-custom": 2}),
        ({"x-queue-type": b"quorum"}, {"x-queue-type": "quorum"}),
    ],
)
def test_queue_redeclare_equivalent(declared, redeclared):
    state = fresh()
    state.apply(c.DeclareQueue("/", "q", arguments=declared))
    outcome = state.apply(c.DeclareQueue("/", "q", arguments=redeclared))
    assert not outcome.changed and outcome.queue.arguments == declared


def test_exclusive_queue_strict_on_declare_lax_on_use():
    state = fresh()
    state.apply(c.DeclareQueue("/", "x", exclusive=True, owner="c1"))
    state.apply(c.DeclareQueue("/", "x", exclusive=True, owner="c1"))
    # RabbitMQ 3.10.8, observed: durable is ignored for an exclusive queue, so this is equal.
    same = state.apply(c.DeclareQueue("/", "x", durable=True, exclusive=True, owner="c1"))
    assert not same.changed and not same.queue.durable
    for command in (
        c.DeclareQueue("/", "x", exclusive=True, owner="c2"),
        c.DeclareQueue("/", "x", owner="c1"),  # same connection, exclusive flag differs
        c.DeclareQueue("/", "x"),
    ):
        with pytest.raises(ResourceLocked) as error:
            state.apply(command)
        assert error.value.reply_code == 405
        assert error.value.reply_text.startswith(
            "cannot obtain exclusive access to locked queue 'x' in vhost '/'. It could be"
        )
    assert state.lookup_queue("/", "x", "c1").exclusive_owner == "c1"
    with pytest.raises(ResourceLocked):
        state.lookup_queue("/", "x", "c2")
    state.apply(c.DeclareQueue("/", "shared"))
    assert state.lookup_queue("/", "shared", "c2").name == "shared"
    with pytest.raises(ResourceLocked):
        # A non-exclusive queue redeclared as exclusive: owner none vs c1, strict check.
        state.apply(c.DeclareQueue("/", "shared", exclusive=True, owner="c1"))
    with pytest.raises(NotFound) as error:
        state.lookup_queue("/", "missing", None)
    assert error.value.reply_text == "no queue 'missing' in vhost '/'"
    assert [q.name for q in state.queues_owned_by("c1")] == ["x"]
    state.apply(c.DeclareVhost("v1"))
    state.apply(c.DeclareQueue("v1", "y", exclusive=True, owner="c1"))
    assert sorted(q.name for q in state.queues_owned_by("c1")) == ["x", "y"]
    state.apply(c.DeleteQueue("/", "x"))
    assert [q.name for q in state.queues_owned_by("c1")] == ["y"]
    state.apply(c.DeleteVhost("v1"))
    assert state.queues_owned_by("c1") == [] and state.queues_owned_by("c2") == []


def test_delete_queue_drops_bindings_and_auto_delete_sources():
    state = fresh()
    state.apply(c.DeclareQueue("/", "q", durable=True))
    state.apply(c.DeclareExchange("/", "ad", "direct", durable=True, auto_delete=True))
    state.apply(c.Bind("/", "ad", "q", routing_key="k"))
    state.apply(c.Bind("/", "amq.direct", "q", routing_key="k"))
    outcome = state.apply(c.DeleteQueue("/", "q"))
    assert outcome.deleted_exchanges == ("ad",)
    assert outcome.writes == (("delete_queue", "/", "q"), ("delete_exchange", "/", "ad"))
    assert state.bindings("/") == []
    assert state.router("/").route("amq.direct", "k") == frozenset()
    assert not state.apply(c.DeleteQueue("/", "q")).changed


def test_delete_transient_queue_writes_nothing():
    state = fresh()
    state.apply(c.DeclareQueue("/", "amq.gen-1", exclusive=True, owner="c", server_named=True))
    state.apply(c.Bind("/", "amq.topic", "amq.gen-1", routing_key="#"))
    assert state.apply(c.DeleteQueue("/", "amq.gen-1")).writes == ()


def test_queue_limit():
    state = MetadataState(Limits(queues_per_vhost_max=1))
    state.apply(c.DeclareVhost("/"))
    state.apply(c.DeclareQueue("/", "a"))
    state.apply(c.DeclareQueue("/", "a"))
    with pytest.raises(PreconditionFailed, match="queue limit in vhost '/' \\(1\\) is reached"):
        state.apply(c.DeclareQueue("/", "b"))


# --- bindings -------------------------------------------------------------------------------


def test_binding_durable_only_when_both_ends_are():
    state = fresh()
    state.apply(c.DeclareExchange("/", "de", "direct", durable=True))
    state.apply(c.DeclareExchange("/", "te", "direct"))
    state.apply(c.DeclareQueue("/", "dq", durable=True))
    state.apply(c.DeclareQueue("/", "tq"))
    state.apply(c.DeclareQueue("/", "xq", durable=True, exclusive=True, owner="c"))
    assert kinds(state.apply(c.Bind("/", "de", "dq", routing_key="k"))) == ["put_binding"]
    assert state.apply(c.Bind("/", "de", "tq")).writes == ()
    assert state.apply(c.Bind("/", "te", "dq")).writes == ()
    assert state.apply(c.Bind("/", "de", "xq")).writes == ()
    assert kinds(state.apply(c.Bind("/", "amq.direct", "de", "exchange"))) == ["put_binding"]
    assert state.apply(c.Bind("/", "de", "te", "exchange")).writes == ()
    again = state.apply(c.Bind("/", "de", "dq", routing_key="k"))
    assert not again.changed and again.writes == ()
    assert state.router("/").route("de", "k") == frozenset({"dq"})


def test_unbind_durable_binding_and_auto_delete_source():
    state = fresh()
    state.apply(c.DeclareExchange("/", "ad", "topic", durable=True, auto_delete=True))
    state.apply(c.DeclareQueue("/", "q", durable=True))
    state.apply(c.Bind("/", "ad", "q", routing_key="a.*", arguments={"x": 1}))
    assert not state.apply(c.Unbind("/", "ad", "q", routing_key="a.*")).changed
    outcome = state.apply(c.Unbind("/", "ad", "q", routing_key="a.*", arguments={"x": 1}))
    assert kinds(outcome) == ["delete_binding", "delete_exchange"]
    assert outcome.deleted_exchanges == ("ad",)
    assert state.router("/").get("ad") is None


def test_bind_errors_come_from_the_router():
    state = fresh()
    with pytest.raises(RoutingError) as error:
        state.apply(c.Bind("/", "nope", "q"))
    assert error.value.reply_code == 404
    state.apply(c.DeclareExchange("/", "e", "direct"))
    with pytest.raises(RoutingError, match="no queue 'q' in vhost '/'"):
        state.apply(c.Bind("/", "e", "q"))
    with pytest.raises(ValueError):
        state.apply(c.Bind("/", "e", "q", "topic"))


def test_unknown_command_is_a_type_error():
    with pytest.raises(TypeError):
        fresh().apply(object())


# --- snapshots ------------------------------------------------------------------------------


def test_snapshot_round_trip_keeps_transient_and_exclusive_entities():
    state = fresh()
    state.apply(c.DeclareVhost("v1", "d", ("t",)))
    state.apply(c.DeclareExchange("v1", "h", "headers", arguments={"alternate-exchange": "z"}))
    state.apply(c.DeclareQueue("v1", "amq.gen-1", exclusive=True, owner="c1", server_named=True))
    state.apply(
        c.Bind("v1", "h", "amq.gen-1", arguments={"x-match": "any", "k": b"\x00v", "n": 1.5})
    )
    state.apply(c.DeclareQueue("/", "q", durable=True, arguments={"x-max-length": 3}))
    snapshot = state.snapshot()
    copy = MetadataState.from_snapshot(snapshot)
    assert copy.snapshot() == snapshot
    assert copy.queue("v1", "amq.gen-1").exclusive_owner == "c1"
    assert copy.router("v1").route("h", "", {"k": b"\x00v"}) == frozenset({"amq.gen-1"})


@pytest.mark.parametrize("data", [b"", b"{}", b"[1]", b'{"format": 1}', b"\xff"])
def test_from_snapshot_refuses_garbage(data):
    with pytest.raises(ValueError):
        MetadataState.from_snapshot(data)


# --- random command sequences ---------------------------------------------------------------

VHOSTS = ("/", "v1")
QUEUES = ("q1", "q2", "q3")
EXCHANGES = ("e1", "e2", "e3")
SOURCES = EXCHANGES + ("amq.direct", "amq.fanout")
OWNERS = (None, "c1", "c2")
ARGUMENTS = st.sampled_from([{}, {"x-max-length": 5}, {"x-queue-type": "classic"}, {"k": b"v"}])

command_strategy = st.one_of(
    st.builds(c.DeclareVhost, st.sampled_from(VHOSTS)),
    st.builds(c.DeleteVhost, st.sampled_from(VHOSTS)),
    st.builds(
        c.SetPermissions,
        st.just("guest"),
        st.sampled_from(VHOSTS),
        st.sampled_from([".*", "", "^q"]),
        st.just(".*"),
        st.just(".*"),
    ),
    st.builds(c.ClearPermissions, st.just("guest"), st.sampled_from(VHOSTS)),
    st.builds(
        c.SetPolicy,
        st.sampled_from(VHOSTS),
        st.sampled_from(["p1", "p2"]),
        st.sampled_from([".*", "^q1$", "("]),
        st.sampled_from([{"max-length": 1}, {"message-ttl": 5, "expires": 9}, {"bad": 1}]),
        st.sampled_from([0, 1, 2.5]),
    ),
    st.builds(c.ClearPolicy, st.sampled_from(VHOSTS), st.sampled_from(["p1", "p2"])),
    st.builds(
        c.DeclareExchange,
        st.sampled_from(VHOSTS),
        st.sampled_from(EXCHANGES),
        st.sampled_from(["direct", "fanout", "topic", "headers"]),
        st.booleans(),
        st.booleans(),
    ),
    st.builds(c.DeleteExchange, st.sampled_from(VHOSTS), st.sampled_from(EXCHANGES)),
    st.builds(
        lambda vhost, name, durable, auto_delete, arguments, owner: c.DeclareQueue(
            vhost, name, durable, owner is not None, auto_delete, arguments, owner
        ),
        st.sampled_from(VHOSTS),
        st.sampled_from(QUEUES),
        st.booleans(),
        st.booleans(),
        ARGUMENTS,
        st.sampled_from(OWNERS),
    ),
    st.builds(c.DeleteQueue, st.sampled_from(VHOSTS), st.sampled_from(QUEUES)),
    st.builds(
        c.Bind,
        st.sampled_from(VHOSTS),
        st.sampled_from(SOURCES),
        st.sampled_from(QUEUES + EXCHANGES),
        st.sampled_from(["queue", "exchange"]),
        st.sampled_from(["", "a", "a.*"]),
    ),
    st.builds(
        c.Unbind,
        st.sampled_from(VHOSTS),
        st.sampled_from(SOURCES),
        st.sampled_from(QUEUES + EXCHANGES),
        st.sampled_from(["queue", "exchange"]),
        st.sampled_from(["", "a", "a.*"]),
    ),
)


def apply_quietly(state: MetadataState, command) -> bool:
    try:
        state.apply(command)
    except (RoutingError, ValueError):
        return False
    return True


@settings(max_examples=200)
@given(st.lists(command_strategy, max_size=40))
def test_random_commands_refusals_change_nothing_and_snapshots_round_trip(commands):
    state = fresh()
    for command in commands:
        before = state.snapshot()
        if not apply_quietly(state, command):
            assert state.snapshot() == before, command
    snapshot = state.snapshot()
    assert MetadataState.from_snapshot(snapshot).snapshot() == snapshot
    # Replaying the same commands on another replica gives the same bytes: determinism.
    replica = fresh()
    for command in commands:
        apply_quietly(replica, command)
    assert replica.snapshot() == snapshot
    # The owner index agrees with a scan of every queue.
    for owner in ("c1", "c2"):
        scanned = sorted((q[0], q[1]) for q in json.loads(snapshot)["queues"] if q[5] == owner)
        assert sorted((q.vhost, q.name) for q in state.queues_owned_by(owner)) == scanned
    # Every binding the state holds has both ends present.
    document = json.loads(snapshot)
    queues = {(q[0], q[1]) for q in document["queues"]}
    for vhost, source, kind, destination, _, _ in document["bindings"]:
        assert state.router(vhost).get(source) is not None
        if kind == "queue":
            assert (vhost, destination) in queues
        else:
            assert state.router(vhost).get(destination) is not None
