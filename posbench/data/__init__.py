"""Stage 1, data: public corpora -> cached token ids (:mod:`.corpus`) and training windows of
them (:mod:`.windows`), the algorithmic tasks made on the fly (:mod:`.tasks`), randomized
positions (:mod:`.positions`)."""
