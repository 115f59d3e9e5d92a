"""The command lines. Each is run at its documented path (`python -m instrumentation.record_cli`,
`.decode_cli`, `.ring`, `.regenerate`), a shim that calls main() here: flash (one traced
FlashAttention run), decode (one traced decode step), ring (a traced ring over several ranks),
regenerate (everything in data/)."""
