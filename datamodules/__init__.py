"""Data layer: corpora, tokenizers and Lightning data modules (see each module's docstring).

Submodules are imported directly (``from datamodules.language_model import MLMDataModule``) so
that importing one does not pull in datasets and Lightning for the others.
"""
