"""What a study says: the ``report`` command, the numbers it finds (statistics, findings, efficiency, the ladder's
scale section), the words that phrase them and the figures that draw them."""
