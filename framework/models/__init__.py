"""Layer 2, models: the denoiser and tokenizer protocols (:mod:`.protocol`), the built-in tiny
denoiser (:mod:`.tiny`), its saved-folder format (:mod:`.saved`), the Hugging Face adapters
(:mod:`.hub_adapters`, :mod:`.hub_loading`) and :func:`.zoo.load_model`, which resolves and loads
every kind of model name. Imports core, engine and tasks (same layer)."""
