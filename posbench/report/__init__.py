"""Stage 5, report: results rows from many run dirs -> tables (:mod:`.tables`,
:mod:`.tasks`) and figures (:mod:`.figures`, :mod:`.learned_bias`)."""
