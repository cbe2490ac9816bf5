"""What a study is: the study file's schema, its checks, its grid, its control and ladder, the identity stored with
it, and :func:`sweeps.spec.study.load_study`, which reads, merges and validates it."""
