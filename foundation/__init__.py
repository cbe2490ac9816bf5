"""The ground floor: what every package of linformer-lab may import, importing none of them.

* :mod:`foundation.errors`: :class:`~foundation.errors.ConfigError`, the one user-facing error (one line, exit 2);
* :mod:`foundation.configfile`: YAML files with ``defaults`` bases, ``key=value`` overrides and their merge onto
  a structured (typed) schema, every failure as one line (an unknown key says where it belongs);
* :mod:`foundation.atomic`: write-sync-rename files, JSON, CSV text and figures;
* :mod:`foundation.checked`: files read back with a check (JSON, a run's config, rebuildable caches);
* :mod:`foundation.confined`: files of a run or study folder written without following a link, never outside it;
* :mod:`foundation.lock`: one owner per run directory and per study (an advisory lock held for a process's life);
* :mod:`foundation.rundir`: the run-directory layout and the one ``init_from`` resolver;
* :mod:`foundation.checkpoint`: checkpoint reading (weights only, integrity checked) and atomic saving;
* :mod:`foundation.redact`: passwords out of everything printed or written.
"""
