"""Stage 1, data: public corpora -> cached token ids (:mod:`.corpus`), and the algorithmic
tasks made on the fly (:mod:`.tasks`)."""
