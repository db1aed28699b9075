"""Stage 3, evaluation: a trained model -> results rows. The perplexity ladder
(:mod:`.ladder`), the passkey probe (:mod:`.passkey`), per-token NLL files
(:mod:`.token_nll`) and the results schema every later stage reads (:mod:`.results`)."""
