"""Passwords out of everything the project prints or writes (foundation/redact.py): the password of every URL is
masked, and nothing else."""

from __future__ import annotations

import pytest

from foundation.redact import redact


@pytest.mark.parametrize(
    "text, masked",
    [
        (
            "postgresql+psycopg2://lab:s3cr%40t@db.example:5432/optuna",
            "postgresql+psycopg2://lab:***@db.example:5432/optuna",
        ),
        ("postgresql://lab:p@ss@host/db", "postgresql://lab:***@host/db"),  # a raw "@" in the password
        ("mysql://lab:pw@host/db?charset=utf8&password=pw2", "mysql://lab:***@host/db?charset=utf8&password=***"),
        ("redis://:pw@host:6379/0", "redis://:***@host:6379/0"),
        ("cannot open 'postgresql:/lab:pw@host/db'", "cannot open 'postgresql:/lab:***@host/db'"),  # one slash
        ("postgresql://lab@host/db", "postgresql://lab@host/db"),  # no password: unchanged
        ("runs/study_cpu/journal.log", "runs/study_cpu/journal.log"),
        (
            "model.attention.options.k: must be in [1, 32], got x:y@z",
            "model.attention.options.k: must be in [1, 32], got x:y@z",
        ),
    ],
)
def test_redact_masks_the_password_of_every_url_and_nothing_else(text, masked):
    assert redact(text) == masked
