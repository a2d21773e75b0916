"""Sans-I/O AMQP 0-9-1: frame codec, methods, connection and channel state machines."""
