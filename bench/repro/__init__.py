"""Reproductions of the errors RocketMQ users hit, run against real local clusters (`python -m bench repro
<name>`). Each module has `add_arguments(parser)` and `run(args) -> int` (0 = every check passed) and ends
with a PASS/FAIL summary (report.Checklist)."""
