"""Contract tests: every preset tool against its provider's documented requests and answers."""
