"""Operator tools: the `timer-service` command, the reads behind status/list/describe, the DLQ, the
web console. The service never imports them."""
