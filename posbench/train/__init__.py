"""Stage 4, training: the run config finished and typed once (:mod:`.configure`), the loop
(:mod:`.loop`), what a run trains on and how it is scored
(:mod:`.workload`: the language-model ladder or an algorithmic task, one interface),
optimizer and schedule (:mod:`.optim`), branching a run off a longer one (:mod:`.branch`) and
the metrics logger (:mod:`.logger`). The trainer evaluates its model when it finishes, so it
imports the evaluation stage."""
