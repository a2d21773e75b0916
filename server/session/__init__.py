"""The AMQP 0-9-1 adapter: a connection (`connection.py`) turns each channel method into a
call of the broker core, and its channels (`channel.py`) are the consumers queues deliver to."""
