"""posbench: train short, test long. A benchmark for length extrapolation of position encodings.

The package is laid out as the pipeline runs, one stage a folder; data flows one way and no
module imports one of a later stage (``tests/test_structure.py`` enforces the order):

==========  ==================================================================================
base        :mod:`.errors`, :mod:`.config` (typed run config, torch-free), :mod:`.intervals`
            (95% intervals, pure statistics) and :mod:`.runs` (run dirs, locks, processes)
data        :mod:`.data`: corpora -> cached token ids; algorithmic tasks
model       :mod:`.encodings` (the hook interface and registry; the training-free extensions
            that act on the encodings at evaluation) and :mod:`.model` (the language model,
            attention kernels, loss, logit scaling, config -> model, memory preflight, Hugging
            Face models behind the same interface, and the conformance checks every encoding
            passes, imported as :mod:`.testing`)
eval        :mod:`.eval`: the perplexity ladder, probes, per-token NLL, the results schema
train       :mod:`.train`: the loop, optimizer, branching, logger; it evaluates its model when
            it finishes, so it comes after eval (as a trainer holds its validator)
report      :mod:`.report`: tables and figures from many run dirs
app         :mod:`.cli`, :mod:`.bench`, :mod:`.convert`: the commands, which call the stages;
            :mod:`.testing` re-exports the conformance checks for plugin authors
==========  ==================================================================================
"""

__version__ = "0.1.0"
