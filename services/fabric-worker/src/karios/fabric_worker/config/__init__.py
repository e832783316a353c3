"""The fabric configuration (pure rules, plan, switch render, VTEP pool, ack gate) and its store."""
