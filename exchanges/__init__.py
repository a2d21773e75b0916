"""Routing: exchange types and bindings, as pure data structures."""
