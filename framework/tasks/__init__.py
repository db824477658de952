"""Layer 2, tasks: the task contract and registry (:mod:`.base`: a task declares its vocabulary,
training recipe, built-in model name and attention structure on its class), one module per task
family (:mod:`.arithmetic`, :mod:`.sorting`, :mod:`.sudoku`, :mod:`.pairs`, :mod:`.text`), the
vocabularies and their tokenizer (:mod:`.vocab`) and prompt files (:mod:`.prompts`). Imports core
and engine only."""
