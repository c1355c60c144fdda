"""Tuning logs: the record types, the JSON-lines codec, the checked TVM JSON reader, the writer and loader,
the database of logs and the best record of a task (docs/log_format.md)."""
