"""Sweeps: a YAML grid (spec) -> one Optuna study (study) -> worker processes (runner, worker)
-> results tables and the live board (report); ``cli`` is ``sandbox sweep``."""
