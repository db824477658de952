"""Layer 2, tasks: the task contract and registry (:mod:`.base`), one module per task family
(:mod:`.arithmetic`, :mod:`.sorting`, :mod:`.sudoku`, :mod:`.pairs`, :mod:`.text`), their shared
vocabulary (:mod:`.vocab`) and prompt files (:mod:`.prompts`). Imports core and engine only."""
