"""What a study says: the ``report`` command, the numbers it finds once (statistics, findings), and one module per
section of the report, each with its words, tables and figure (power check, comparisons, context gain, efficiency,
a ladder's scale section)."""
