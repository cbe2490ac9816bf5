"""How a study runs: the ``sweep`` command and its workers, one trial and its bookkeeping, the study's storage, and
the objective that trains a trial."""
