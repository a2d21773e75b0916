"""`warren users ...` / `warren vhosts ...` against a data dir, as a subprocess and in-process,
including a running store noticing what the CLI changed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from warrenmq.server import admin_cli, cli
from warrenmq.server.metadata.store import MetadataStore


def admin(data_dir: Path, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "warrenmq.server.admin_cli", *argv, "--data-dir", str(data_dir)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_users_and_vhosts_round_trip_through_the_cli(tmp_path):
    listed = admin(tmp_path, "users", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == [{"name": "guest", "tags": ["administrator"]}]
    added = admin(tmp_path, "users", "add", "bob", "pw", "--tags", "monitoring,management")
    assert added.returncode == 0, added.stderr
    assert admin(tmp_path, "users", "add", "carol", stdin="from-stdin\n").returncode == 0
    assert admin(tmp_path, "vhosts", "add", "v1", "--description", "first").returncode == 0
    granted = admin(tmp_path, "users", "set-permissions", "bob", "--vhost", "v1", "^bob", ".*", "")
    assert granted.returncode == 0, granted.stderr

    users = json.loads(admin(tmp_path, "users", "list", "--json").stdout)
    assert [u["name"] for u in users] == ["bob", "carol", "guest"]
    assert users[0]["tags"] == ["monitoring", "management"]
    vhosts = json.loads(admin(tmp_path, "vhosts", "list", "--json").stdout)
    assert [(v["name"], v["description"]) for v in vhosts] == [
        ("/", "Default virtual host"),
        ("v1", "first"),
    ]
    permissions = json.loads(
        admin(tmp_path, "users", "list-permissions", "--vhost", "v1", "--json").stdout
    )
    assert permissions == [
        {"user": "bob", "vhost": "v1", "configure": "^bob", "write": ".*", "read": ""}
    ]

    async def check_passwords():
        store = await MetadataStore.open(admin_cli.metadata_path(tmp_path))
        try:
            assert await store.authenticate("bob", "pw") is not None
            assert await store.authenticate("carol", "from-stdin") is not None
        finally:
            await store.close()

    asyncio.run(check_passwords())

    assert admin(tmp_path, "users", "clear-permissions", "bob", "--vhost", "v1").returncode == 0
    assert admin(tmp_path, "users", "delete", "carol").returncode == 0
    assert admin(tmp_path, "vhosts", "delete", "v1").returncode == 0
    users = json.loads(admin(tmp_path, "users", "list", "--json").stdout)
    assert [u["name"] for u in users] == ["bob", "guest"]
    text = admin(tmp_path, "users", "list").stdout.splitlines()
    assert text == ["user\ttags", "bob\t[monitoring, management]", "guest\t[administrator]"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("users", "add", "guest", "pw"), "Error: user 'guest' already exists"),
        (("users", "delete", "nobody"), "Error: no user 'nobody'"),
        (("users", "set-permissions", "guest", "(", ".*", ".*"), "invalid regular expression"),
        (("users", "set-permissions", "guest", "-p", "nope", ".*", ".*", ".*"), "no vhost 'nope'"),
        (("vhosts", "delete", "/"), "cannot delete the default vhost"),
        (("vhosts", "delete", "nope"), "Error: no vhost 'nope'"),
        (("users", "add", "dave", ""), "blank password"),
    ],
)
def test_errors_exit_1_with_a_message(tmp_path, argv, message):
    result = admin(tmp_path, *argv)
    assert result.returncode == 1
    assert message in result.stderr


def test_in_process_run_and_running_store_notices(tmp_path, capsys):
    async def scenario():
        broker = await MetadataStore.open(admin_cli.metadata_path(tmp_path))
        try:
            # The CLI runs in its own process while the broker's store stays open.
            result = admin(tmp_path, "users", "add", "erin", "pw")
            assert result.returncode == 0, result.stderr
            assert "erin" not in broker.state.users
            await broker.sync_external_changes()
            assert "erin" in broker.state.users
            assert await broker.authenticate("erin", "pw") is not None
        finally:
            await broker.close()

    asyncio.run(scenario())
    assert admin_cli.run(["vhosts", "add", "v9", "--data-dir", str(tmp_path)]) == 0
    assert 'Added vhost "v9".' in capsys.readouterr().out


def test_warren_entry_point_when_wired(tmp_path):
    if "warrenmq.server.admin_cli" not in cli.COMMAND_MODULES:
        pytest.skip("warrenmq.server.admin_cli is not yet listed in cli.COMMAND_MODULES")
    warren = Path(sys.executable).with_name("warren")
    result = subprocess.run(
        [str(warren), "users", "list", "--json", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)[0]["name"] == "guest"


# --- warren policies ------------------------------------------------------------------------


def test_policies_set_list_and_clear_through_the_cli(tmp_path):
    assert admin(tmp_path, "vhosts", "add", "v1").returncode == 0
    set_ = admin(tmp_path, "policies", "set", "ttl", "^q\\.", '{"message-ttl": 5000}')
    assert set_.returncode == 0, set_.stderr
    assert set_.stdout == 'Set policy "ttl" in vhost "/".\n'
    assert (
        admin(
            tmp_path,
            "policies",
            "set",
            "limits",
            ".*",
            '{"max-length": 10, "dead-letter-exchange": "dlx"}',
            "--apply-to",
            "quorum_queues",
            "--priority",
            "-2",
            "--vhost",
            "v1",
        ).returncode
        == 0
    )
    assert (
        admin(
            tmp_path,
            "policies",
            "set",
            "top",
            "^a",
            '{"expires": 9}',
            "-p",
            "v1",
            "--priority",
            "3",
        ).returncode
        == 0
    )

    listed = json.loads(admin(tmp_path, "policies", "list", "--json").stdout)
    assert listed == [
        {
            "vhost": "/",
            "name": "ttl",
            "pattern": "^q\\.",
            "apply-to": "all",
            "definition": {"message-ttl": 5000},
            "priority": 0,
        },
        {
            "vhost": "v1",
            "name": "limits",
            "pattern": ".*",
            "apply-to": "quorum_queues",
            "definition": {"dead-letter-exchange": "dlx", "max-length": 10},
            "priority": -2,
        },
        {
            "vhost": "v1",
            "name": "top",
            "pattern": "^a",
            "apply-to": "all",
            "definition": {"expires": 9},
            "priority": 3,
        },
    ]
    assert admin(tmp_path, "policies", "list", "--vhost", "v1").stdout.splitlines() == [
        "vhost\tname\tpattern\tapply-to\tdefinition\tpriority",
        'v1\tlimits\t.*\tquorum_queues\t{"dead-letter-exchange":"dlx","max-length":10}\t-2',
        'v1\ttop\t^a\tall\t{"expires":9}\t3',
    ]

    cleared = admin(tmp_path, "policies", "clear", "limits", "--vhost", "v1")
    assert cleared.returncode == 0 and cleared.stdout == 'Cleared policy "limits" in vhost "v1".\n'
    assert [
        p["name"] for p in json.loads(admin(tmp_path, "policies", "list", "--json").stdout)
    ] == [
        "ttl",
        "top",
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ("policies", "set", "p", ".*", '{"max-length": "abc"}'),
            'Error: Validation failed\n\n<<"abc">> is not a valid maximum length\n',
        ),
        (
            ("policies", "set", "p", "(", '{"nope": 1}', "--apply-to", "bogus"),
            "Error: Validation failed\n\n"
            '[{<<"nope">>,1}] are not recognised policy settings\n'
            "apply-to 'bogus' unrecognised; should be one of: 'queues', 'classic_queues',  "
            "'quorum_queues', 'streams', 'exchanges', or 'all'\n"
            'pattern should be regular expression but is invalid: {"missing ), unterminated '
            'subpattern",0}\n',
        ),
        (("policies", "set", "p", ".*", "{}"), "Error: Validation failed\n\nno policy provided\n"),
        (
            ("policies", "set", "p", ".*", "{not json"),
            "Error: Could not parse JSON document: Expecting property name enclosed in double "
            "quotes: line 1 column 2 (char 1)\n",
        ),
        (
            ("policies", "set", "p", ".*", '{"max-length": NaN}'),
            "Error: Could not parse JSON document: NaN is not JSON\n",
        ),
        (
            ("policies", "set", "p", ".*", "[1]"),
            "Error: Validation failed\n\ndefinition must be a dictionary: [1]\n",
        ),
        (
            ("policies", "set", "p", ".*", '{"max-length": 1}', "-p", "nope"),
            "Error: no vhost 'nope'\n",
        ),
        (("policies", "clear", "nope"), "Error: Parameter does not exist\n"),
        (("policies", "list", "--vhost", "nope"), "Error: no vhost 'nope'\n"),
    ],
)
def test_policy_errors_exit_1_with_rabbitmqs_text(tmp_path, argv, message):
    result = admin(tmp_path, *argv)
    assert (result.returncode, result.stderr, result.stdout) == (1, message, "")


def test_a_priority_that_is_no_integer_is_a_usage_error(tmp_path):
    result = admin(tmp_path, "policies", "set", "p", ".*", '{"max-length": 1}', "--priority", "x")
    assert result.returncode == 2
    assert "argument --priority: invalid int value: 'x'" in result.stderr
    assert "Traceback" not in result.stderr


def test_limits_set_list_and_clear_through_the_cli(tmp_path):
    assert admin(tmp_path, "vhosts", "add", "v1").returncode == 0
    set_ = admin(tmp_path, "vhosts", "set-limits", "v1", '{"max-queues": 3, "max-connections": -1}')
    assert set_.returncode == 0, set_.stderr
    assert set_.stdout == 'Set the limits of vhost "v1".\n'
    assert admin(tmp_path, "users", "set-limits", "guest", '{"max-channels": 8}').returncode == 0
    listed = admin(tmp_path, "vhosts", "limits", "--json")
    assert json.loads(listed.stdout) == [
        {"vhost": "v1", "value": {"max-connections": -1, "max-queues": 3}}
    ]
    assert admin(tmp_path, "users", "limits").stdout == 'user\tlimits\nguest\t{"max-channels":8}\n'
    cleared = admin(tmp_path, "vhosts", "clear-limits", "v1")
    assert cleared.stdout == 'Cleared the limits of vhost "v1".\n'
    assert json.loads(admin(tmp_path, "vhosts", "limits", "--json").stdout) == []


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ("vhosts", "set-limits", "/", '{"max-channels": 1}'),
            'Error: Validation failed\n\nUnrecognised terms [{<<"max-channels">>,1}] in '
            "vhost-limits\n",
        ),
        (("users", "set-limits", "nobody", '{"max-channels": 1}'), "Error: no user 'nobody'\n"),
        (("vhosts", "set-limits", "/", "{"), "Error: Could not parse JSON document"),
    ],
)
def test_limit_errors_exit_1_with_rabbitmqs_text(tmp_path, argv, message):
    done = admin(tmp_path, *argv)
    assert done.returncode == 1
    assert done.stderr.startswith(message)
