#!/usr/bin/env bash
# A private reference RabbitMQ for the compat suite, for scripts and CI that want one broker
# for several runs (pytest starts its own when WARREN_REFERENCE_URL is unset):
#
#   url=$(scripts/rabbitmq_reference.sh start)     # prints amqp://guest:guest@127.0.0.1:PORT/%2F
#   scripts/rabbitmq_reference.sh start --tls DIR  # also amqps (DIR: `warren tls generate DIR`),
#                                                  # its amqps:// URL on a second line
#   WARREN_REFERENCE_URL=$url .venv/bin/pytest compat_tests
#   scripts/rabbitmq_reference.sh stop
#
# The node's name, ports and directory are kept in $WARREN_REFERENCE_STATE (default
# $TMPDIR/warren-rabbitmq-reference.json) between start and stop; with that file present, the
# suite may also seed users on the node and restart it, as it does with a node of its own.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
if [ -x "$root/.venv/bin/python" ] && [ -z "${PYTHON:-}" ]; then
	python="$root/.venv/bin/python"
fi
case "${1:-}" in
start | stop)
	exec "$python" "$root/compat_tests/rabbitmq_reference.py" "$@"
	;;
*)
	echo "usage: $0 start [--tls DIR] | stop" >&2
	exit 2
	;;
esac
