"""Layer 1, the decoding engine: the loop (:mod:`.loop`), its options (:mod:`.config`), the per-step
features (:mod:`.features`), the controller and scorer contracts (:mod:`.controller`, :mod:`.scorer`,
:mod:`.selection`, :mod:`.controller_io`), the one way to nest controllers (:mod:`.nesting`),
lookahead (:mod:`.lookahead`) and the evaluation of a strategy on examples (:mod:`.evaluate`).
Imports only :mod:`adaptive_decoding.framework.core`."""
