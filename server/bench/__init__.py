"""`warren bench publish|e2e|memory`: an AMQP load generator for any broker (see `loadgen`)."""
