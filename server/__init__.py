"""The broker process: networking, vhosts, queue and stream engines, CLI, HTTP API."""
